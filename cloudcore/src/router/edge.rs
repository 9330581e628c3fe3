//! Router messages from edges (group `user`, handed over by cloudhub):
//!
//! | message | what the router does |
//! |---|---|
//! | answer to a call (`parent_msg_id` set; the servicebus's `upload` with an `HTTPResponse`, or its error answer without operation) | to the waiting REST request, if the call went to this node |
//! | eventbus `upload` (source `bus`, resource = the MQTT topic) | POST of the payload to the rest target of the rule naming this node and topic |
//! | servicebus `upload` (source `servicebus`, resource = the target URL) | POST to the rule's rest target; the answer's body goes back to the edge as the `response` |
//!
//! An edge reaches only what rules name for its own node; everything else is dropped and
//! counted. Answers are handed over at once; uploads wait in a queue of [`UPLOAD_QUEUE`] for
//! one of `target_concurrency` target calls, and when that queue is full an upload is dropped
//! (and counted as a failure of its rule) rather than queued without bound.

use super::Shared;
use super::calls::Delivery;
use super::metrics::Outcome;
use super::rules::{Route, Target};
use crate::cloudhub::{BudgetTicket, RouterMessage};
use bytes::Bytes;
use kubeedge_shared::content::content_bytes;
use kubeedge_shared::operation::source;
use kubeedge_shared::servicebus::decode_bytes_content;
use kubeedge_shared::{Message, Operation};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Bytes read from a rest target's answer (KubeEdge's `MaxRespBodyLength`, 1 MiB).
pub const MAX_TARGET_RESPONSE: usize = 1 << 20;
/// Uploads waiting for a target call, at most.
pub const UPLOAD_QUEUE: usize = 8192;

/// An upload on its way to a rest target.
struct Upload {
    route: Arc<Route>,
    node: String,
    body: Bytes,
    /// The servicebus upload to answer, if it is one.
    answer_to: Option<Message>,
    /// Its bytes of the router's budget, given back once the call is done.
    held: BudgetTicket,
}

/// What an edge's router message is.
#[derive(Debug, PartialEq, Eq)]
pub enum FromEdge<'a> {
    Answer { call: &'a str },
    EventBusUpload { topic: &'a str },
    ServiceBusUpload { target_url: &'a str },
    Other,
}

pub fn classify(msg: &Message) -> FromEdge<'_> {
    if !msg.header.parent_id.is_empty() {
        return FromEdge::Answer {
            call: &msg.header.parent_id,
        };
    }
    match (msg.route.source.as_str(), &msg.route.operation) {
        (source::EVENTBUS, Operation::Upload) if !msg.route.resource.is_empty() => {
            FromEdge::EventBusUpload {
                topic: &msg.route.resource,
            }
        }
        (source::SERVICEBUS, Operation::Upload) if !msg.route.resource.is_empty() => {
            FromEdge::ServiceBusUpload {
                target_url: &msg.route.resource,
            }
        }
        _ => FromEdge::Other,
    }
}

pub(crate) async fn run(
    shared: Arc<Shared>,
    mut rx: mpsc::Receiver<RouterMessage>,
    shutdown: CancellationToken,
) {
    let (uploads, queue) = mpsc::channel(UPLOAD_QUEUE);
    tokio::spawn(call_targets(shared.clone(), queue, shutdown.clone()));
    loop {
        let m = tokio::select! {
            _ = shutdown.cancelled() => return,
            m = rx.recv() => match m { Some(m) => m, None => return },
        };
        handle(&shared, &uploads, m);
    }
}

/// Starts each queued upload's target call once one of `target_concurrency` is free.
async fn call_targets(
    shared: Arc<Shared>,
    mut queue: mpsc::Receiver<Upload>,
    shutdown: CancellationToken,
) {
    loop {
        let upload = tokio::select! {
            _ = shutdown.cancelled() => return,
            u = queue.recv() => match u { Some(u) => u, None => return },
        };
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = shared.targets.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => return },
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            call_target(&shared, upload).await;
            drop(permit);
        });
    }
}

fn handle(
    shared: &Arc<Shared>,
    uploads: &mpsc::Sender<Upload>,
    RouterMessage {
        node,
        message,
        held,
    }: RouterMessage,
) {
    let metrics = &shared.metrics;
    match classify(&message) {
        FromEdge::Answer { call } => {
            let call = call.to_string();
            let outcome = match shared.calls.answer(&node, &call, message, held) {
                Delivery::Delivered => Outcome::Ok,
                Delivery::Unknown => Outcome::UnknownCall,
                Delivery::WrongNode => {
                    tracing::debug!(%node, %call, "an edge answered a call sent to another node; dropped");
                    Outcome::WrongNode
                }
            };
            metrics.edge("reply", outcome);
        }
        FromEdge::EventBusUpload { topic } => {
            let Some(route) = shared.table.current().match_eventbus(&node, topic) else {
                tracing::debug!(%node, topic, "eventbus upload matches no rule for this node; dropped");
                metrics.edge("eventbus_upload", Outcome::NoRule);
                return;
            };
            let payload = Bytes::from(content_bytes(&message.content));
            queue_upload(
                shared,
                uploads,
                Upload {
                    route,
                    node,
                    body: payload,
                    answer_to: None,
                    held,
                },
            );
        }
        FromEdge::ServiceBusUpload { target_url } => {
            let Some(route) = shared.table.current().match_servicebus(&node, target_url) else {
                tracing::debug!(%node, target_url, "servicebus upload for a URL no rule allows this node; dropped");
                metrics.edge("servicebus_upload", Outcome::NoRule);
                return;
            };
            // The edge sends the application's request as Go `[]byte` (base64 text).
            let body = decode_bytes_content(&message.content)
                .unwrap_or_else(|| content_bytes(&message.content));
            queue_upload(
                shared,
                uploads,
                Upload {
                    route,
                    node,
                    body: Bytes::from(body),
                    answer_to: Some(message),
                    held,
                },
            );
        }
        FromEdge::Other => {
            tracing::debug!(%node, source = %message.route.source, operation = %message.route.operation,
                "router message of no known kind from edge; dropped");
            metrics.edge("other", Outcome::Malformed);
        }
    }
}

fn queue_upload(shared: &Shared, uploads: &mpsc::Sender<Upload>, upload: Upload) {
    let kind = if upload.answer_to.is_some() {
        "servicebus_upload"
    } else {
        "eventbus_upload"
    };
    match uploads.try_send(upload) {
        Ok(()) => shared.metrics.edge(kind, Outcome::Ok),
        Err(e) => {
            let upload = match e {
                mpsc::error::TrySendError::Full(u) | mpsc::error::TrySendError::Closed(u) => u,
            };
            shared.metrics.edge(kind, Outcome::Busy);
            shared.tally.failure(
                &upload.route,
                "too many messages waiting for the rest target: message dropped",
            );
        }
    }
}

/// POSTs the upload to its route's rest target; a servicebus upload gets the target's answer.
async fn call_target(shared: &Shared, upload: Upload) {
    let Upload {
        route,
        node,
        body,
        answer_to,
        held: _held,
    } = upload;
    let Target::Rest { url } = &route.target else {
        return;
    };
    let label = route.kind().label();
    let content_type = answer_to.as_ref().map(|_| "application/json");
    let result = shared
        .http
        .post(
            url,
            &node,
            content_type,
            body,
            shared.settings.rest_timeout,
            MAX_TARGET_RESPONSE,
        )
        .await;
    let answer = match result {
        Ok(reply) if reply.status.is_success() => {
            shared.metrics.target(label, Outcome::Ok);
            shared.tally.success(&route);
            Ok(reply.body)
        }
        Ok(reply) => {
            shared.metrics.target(label, Outcome::TargetError);
            let e = format!("rest target {url} answered {}", reply.status);
            shared.tally.failure(&route, &e);
            // The edge application still gets what the endpoint said, as in KubeEdge.
            Ok(reply.body)
        }
        Err(e) => {
            shared.metrics.target(label, Outcome::TargetError);
            let e = format!("rest target {url}: {e}");
            tracing::debug!(%node, rule = %route.name, error = %e, "rest target call failed");
            shared.tally.failure(&route, &e);
            Err(e)
        }
    };
    if let Some(upload) = answer_to {
        let reply = match answer {
            Ok(body) => Message::response_to(
                &upload,
                serde_json::Value::String(String::from_utf8_lossy(&body).into_owned()),
            ),
            Err(e) => Message::error_to(&upload, e),
        };
        if let Err(e) = shared.hub.send(&node, reply) {
            tracing::debug!(%node, error = %e, "servicebus answer not sent to the edge");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::Group;
    use serde_json::json;

    #[test]
    fn edge_messages_are_classified_as_kubeedge_sends_them() {
        let upload = Message::new(
            "bus",
            Group::User,
            Operation::Upload,
            "default/t",
            json!("x"),
        );
        assert_eq!(
            classify(&upload),
            FromEdge::EventBusUpload { topic: "default/t" }
        );
        let app = Message::new(
            "servicebus",
            Group::User,
            Operation::Upload,
            "http://c/api",
            json!("e30="),
        );
        assert_eq!(
            classify(&app),
            FromEdge::ServiceBusUpload {
                target_url: "http://c/api"
            }
        );
        let answer = Message::new("servicebus", Group::User, Operation::Upload, "", json!({}))
            .with_parent("call-1");
        assert_eq!(classify(&answer), FromEdge::Answer { call: "call-1" });
        // KubeEdge's error answer carries neither operation nor resource.
        let mut err = answer.clone();
        err.route.operation = Operation::Empty;
        assert_eq!(classify(&err), FromEdge::Answer { call: "call-1" });
        let other = Message::new("bus", Group::User, Operation::Publish, "t", json!(null));
        assert_eq!(classify(&other), FromEdge::Other);
    }
}

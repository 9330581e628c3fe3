//! The servicebus's local server (`modules.serviceBus.server:port`, 127.0.0.1:9060) for edge
//! applications, KubeEdge's API: `POST /` with `{"method","targetURL","payload"}` → the cloud
//! router's servicebus → rest rule for that URL → `{"code","msg","body"}` (always HTTP 200).
//!
//! Only URLs a rule allows this node (`target_urls`, KubeEdge's check) are sent; the request
//! is bounded in size and the wait for the cloud by `timeout`. It runs while at least one URL is
//! allowed, as KubeEdge's does.

use super::config::ServiceBusConfig;
use crate::edgehub::CloudLink;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use kubeedge_shared::content::content_bytes;
use kubeedge_shared::operation::source;
use kubeedge_shared::servicebus::{UploadRequest, UploadResponse, bytes_content};
use kubeedge_shared::{Group, Message, Operation};
use std::collections::BTreeSet;
use std::convert::Infallible;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// The URLs this node's applications may reach (mirror of `target_urls`).
pub type Allowed = Arc<RwLock<BTreeSet<String>>>;

pub async fn serve<L: CloudLink>(
    listener: TcpListener,
    config: Arc<ServiceBusConfig>,
    allowed: Allowed,
    link: L,
    stop: CancellationToken,
) {
    loop {
        let (tcp, _) = tokio::select! {
            _ = stop.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "servicebus: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (config, allowed, link, stop) =
            (config.clone(), allowed.clone(), link.clone(), stop.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let (config, allowed, link) = (config.clone(), allowed.clone(), link.clone());
                async move { Ok::<_, Infallible>(handle(&config, &allowed, &link, req).await) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(30))
                .serve_connection(TokioIo::new(tcp), svc);
            tokio::select! {
                _ = stop.cancelled() => {}
                _ = conn => {}
            }
        });
    }
}

fn answer(code: u16, msg: impl Into<String>, body: String) -> Response<Full<Bytes>> {
    let r = UploadResponse {
        code,
        msg: msg.into(),
        body,
    };
    let mut resp = Response::new(Full::new(Bytes::from(
        serde_json::to_vec(&r).unwrap_or_default(),
    )));
    *resp.status_mut() = StatusCode::OK;
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}

async fn handle<L: CloudLink>(
    config: &ServiceBusConfig,
    allowed: &Allowed,
    link: &L,
    req: Request<Incoming>,
) -> Response<Full<Bytes>> {
    let body = match Limited::new(req.into_body(), config.max_body)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return answer(
                400,
                "can't read data from body of the http's request",
                String::new(),
            );
        }
    };
    let Ok(request) = serde_json::from_slice::<UploadRequest>(&body) else {
        return answer(400, "invalid params", String::new());
    };
    let permitted = allowed
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&request.target_url);
    if !permitted {
        return answer(
            400,
            format!(
                "url {} is not allowed and please make a rule for this url in the cloud",
                request.target_url
            ),
            String::new(),
        );
    }
    let msg = Message::new(
        source::SERVICEBUS,
        Group::User,
        Operation::Upload,
        request.target_url,
        bytes_content(&body),
    );
    match link.request(msg, config.upload_timeout).await {
        Err(e) => answer(400, e.to_string(), String::new()),
        Ok(reply) if reply.route.operation == Operation::Error => answer(
            500,
            String::from_utf8_lossy(&content_bytes(&reply.content)).into_owned(),
            String::new(),
        ),
        Ok(reply) => answer(
            200,
            "receive response from cloud successfully",
            String::from_utf8_lossy(&content_bytes(&reply.content)).into_owned(),
        ),
    }
}

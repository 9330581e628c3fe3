//! ServiceBus (`modules.serviceBus`, KubeEdge's `edge/pkg/servicebus`; devices reference §7):
//! the HTTP side of the cloud router on this node. Off by default, as in KubeEdge.
//!
//! - **Calls** (rest → servicebus rules; `source: router_servicebus`, operation = the HTTP
//!   method, resource `<port>:<path>`): the local server `127.0.0.1:<port>` is called and its
//!   answer sent back as `upload` with `parent_msg_id` = the call (`call.rs`). At most
//!   `max_calls` run at once; more are answered `503` at once, never queued.
//! - **Allowed URLs** (servicebus → rest rules; operations `start` / `stop`, resource = a cloud
//!   URL): kept in `target_urls`; while there is one, the local server for applications runs
//!   (`server.rs`, `127.0.0.1:9060`).
//!
//! Messages arrive from metamanager (group `user`, source `router_servicebus`).

pub(crate) mod call;
pub(crate) mod config;
pub(crate) mod metrics;
pub(crate) mod server;
pub(crate) mod target_urls;

pub use config::ServiceBusConfig;
pub use metrics::ServiceBusMetrics;

use crate::edgehub::CloudLink;
use crate::metamanager::store::{MetaStore, StoreError};
use call::CallFailure;
use kubeedge_shared::operation::source;
use kubeedge_shared::servicebus::HttpResponse;
use kubeedge_shared::{Group, Message, Operation};
use server::Allowed;
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

#[derive(Debug, thiserror::Error)]
pub enum ServiceBusError {
    #[error("servicebus target URLs (target_urls): {0}")]
    Store(#[from] StoreError),
}

/// The running servicebus.
pub struct ServiceBus {
    tx: mpsc::Sender<Message>,
    metrics: ServiceBusMetrics,
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl ServiceBus {
    /// Loads the allowed URLs (starting the local server when there are some) and handles the
    /// router's messages sent to [`ServiceBus::sender`].
    pub async fn start<L: CloudLink>(
        config: ServiceBusConfig,
        store: MetaStore,
        link: L,
    ) -> Result<ServiceBus, ServiceBusError> {
        target_urls::create(&store).await?;
        let urls = target_urls::load(&store).await?;
        let metrics = ServiceBusMetrics::default();
        metrics.allowed_urls.set(urls.len() as i64);
        let (tx, rx) = mpsc::channel(256);
        let cancel = CancellationToken::new();
        let mut bus = Bus {
            calls: Arc::new(Semaphore::new(config.max_calls.max(1))),
            config: Arc::new(config),
            allowed: Arc::new(std::sync::RwLock::new(urls.into_iter().collect())),
            server: None,
            store,
            link,
            metrics: metrics.clone(),
            cancel: cancel.clone(),
        };
        bus.server_as_needed().await;
        let task = tokio::spawn(bus.run(rx));
        Ok(ServiceBus {
            tx,
            metrics,
            cancel,
            task,
        })
    }

    /// Where edgehub hands the router's messages (group `user` from `router_servicebus`).
    pub fn sender(&self) -> mpsc::Sender<Message> {
        self.tx.clone()
    }

    pub fn metrics(&self) -> &ServiceBusMetrics {
        &self.metrics
    }

    pub async fn shutdown(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
}

struct Bus<L> {
    config: Arc<ServiceBusConfig>,
    allowed: Allowed,
    /// Stops the local server, while it runs.
    server: Option<CancellationToken>,
    store: MetaStore,
    link: L,
    calls: Arc<Semaphore>,
    metrics: ServiceBusMetrics,
    cancel: CancellationToken,
}

impl<L: CloudLink> Bus<L> {
    async fn run(mut self, mut rx: mpsc::Receiver<Message>) {
        loop {
            let msg = tokio::select! {
                _ = self.cancel.cancelled() => break,
                m = rx.recv() => match m { Some(m) => m, None => break },
            };
            self.handle(msg).await;
        }
        if let Some(s) = self.server.take() {
            s.cancel();
        }
    }

    async fn handle(&mut self, msg: Message) {
        if msg.route.source != source::ROUTER_SERVICEBUS {
            tracing::debug!(source = %msg.route.source, "servicebus: message not from the router; dropped");
            return;
        }
        match msg.route.operation {
            Operation::Start | Operation::Stop => self.allow(&msg).await,
            _ => self.spawn_call(msg),
        }
    }

    /// `start` / `stop`: a URL this node's applications may (no longer) reach.
    async fn allow(&mut self, msg: &Message) {
        let url = msg.route.resource.as_str();
        if url.is_empty() {
            return;
        }
        let start = msg.route.operation == Operation::Start;
        let stored = if start {
            target_urls::insert(&self.store, url).await
        } else {
            target_urls::delete(&self.store, url).await
        };
        if let Err(e) = stored {
            tracing::warn!(url, error = %e, "servicebus: target URL not stored");
        }
        let n = {
            let mut allowed = self.allowed.write().unwrap_or_else(|e| e.into_inner());
            if start {
                allowed.insert(url.to_string());
            } else {
                allowed.remove(url);
            }
            allowed.len()
        };
        self.metrics.allowed_urls.set(n as i64);
        tracing::info!(url, allowed = start, "servicebus: target URL updated");
        self.server_as_needed().await;
    }

    /// Runs the local server while some URL is allowed.
    async fn server_as_needed(&mut self) {
        let wanted = !self
            .allowed
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_empty();
        match (&self.server, wanted) {
            (None, true) => match tokio::net::TcpListener::bind(self.config.listen).await {
                Ok(listener) => {
                    tracing::info!(addr = %self.config.listen, "servicebus: serving edge applications");
                    let stop = self.cancel.child_token();
                    tokio::spawn(server::serve(
                        listener,
                        self.config.clone(),
                        self.allowed.clone(),
                        self.link.clone(),
                        stop.clone(),
                    ));
                    self.server = Some(stop);
                }
                Err(e) => tracing::error!(addr = %self.config.listen, error = %e,
                    "servicebus: cannot listen for edge applications (modules.serviceBus); tried again with the next target URL"),
            },
            (Some(stop), false) => {
                stop.cancel();
                self.server = None;
                tracing::info!("servicebus: no target URL left; local server stopped");
            }
            _ => {}
        }
    }

    fn spawn_call(&self, msg: Message) {
        let Ok(permit) = self.calls.clone().try_acquire_owned() else {
            self.metrics.call("busy");
            let answer = HttpResponse::edge_error(503, "servicebus: too many calls in flight");
            let link = self.link.clone();
            tokio::spawn(async move { send_answer(&link, &msg, Err(answer)).await });
            return;
        };
        let (config, link, metrics) =
            (self.config.clone(), self.link.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let result = match call::plan(&msg) {
                Ok((target, request)) => {
                    call::call(&config, &target, request, &msg.route.operation).await
                }
                Err(e) => Err(e),
            };
            metrics.call(match &result {
                Ok(_) => "ok",
                Err(CallFailure { status: 400, .. }) => "bad_request",
                Err(CallFailure { status: 404, .. }) => "unreachable",
                Err(_) => "too_large",
            });
            let result = result.map_err(|f| HttpResponse::edge_error(f.status, f.text));
            send_answer(&link, &msg, result).await;
        });
    }
}

/// The answer to a call: `upload` with the `HTTPResponse`; an error answer as KubeEdge's
/// (no operation, no resource).
async fn send_answer<L: CloudLink>(
    link: &L,
    call: &Message,
    result: Result<HttpResponse, HttpResponse>,
) {
    let (answer, operation) = match result {
        Ok(a) => (a, Operation::Upload),
        Err(a) => (a, Operation::Empty),
    };
    let mut msg = Message::new(
        source::SERVICEBUS,
        Group::User,
        operation,
        "",
        serde_json::to_value(&answer).unwrap_or_default(),
    )
    .with_parent(call.id());
    msg.route.resource.clear();
    if let Err(e) = link.send(msg).await {
        tracing::debug!(call = %call.id(), error = %e, "servicebus answer not sent to the cloud");
    }
}

#[cfg(test)]
mod tests;

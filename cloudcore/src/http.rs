//! `/metrics` (OpenMetrics), `/healthz` and `/readyz`.

use crate::metrics::{OPENMETRICS_CONTENT_TYPE, render};
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Readiness: set once listeners are up and informers have synced.
#[derive(Clone, Default)]
pub struct Readiness(Arc<ReadyInner>);

#[derive(Default)]
struct ReadyInner {
    ready: AtomicBool,
    /// For a part made by [`Readiness::parts`]: the parts still unready and the whole.
    whole: Option<(Arc<AtomicUsize>, Readiness)>,
}

impl Readiness {
    pub fn set_ready(&self) {
        if self.0.ready.swap(true, Ordering::AcqRel) {
            return;
        }
        if let Some((left, whole)) = &self.0.whole
            && left.fetch_sub(1, Ordering::AcqRel) == 1
        {
            whole.set_ready();
        }
    }

    pub fn is_ready(&self) -> bool {
        self.0.ready.load(Ordering::Acquire)
    }

    /// Splits readiness between `n` independent components: this becomes ready once every
    /// returned part has been set ready.
    pub fn parts(&self, n: usize) -> Vec<Readiness> {
        if n == 0 {
            self.set_ready();
        }
        let left = Arc::new(AtomicUsize::new(n));
        (0..n)
            .map(|_| {
                Readiness(Arc::new(ReadyInner {
                    ready: AtomicBool::new(false),
                    whole: Some((left.clone(), self.clone())),
                }))
            })
            .collect()
    }
}

#[derive(Clone)]
struct AppState {
    registry: Arc<Registry>,
    ready: Readiness,
}

pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    ready: Readiness,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<SocketAddr> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { registry, ready });
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} for metrics/health: {e}"))?;
    let local = listener.local_addr()?;
    tracing::info!(%local, "serving /metrics, /healthz, /readyz");
    tokio::spawn(async move {
        let r = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "metrics server failed");
        }
    });
    Ok(local)
}

async fn metrics(State(s): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
        render(&s.registry),
    )
}

async fn readyz(State(s): State<AppState>) -> impl IntoResponse {
    if s.ready.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

#[cfg(test)]
mod tests {
    use super::Readiness;

    #[test]
    fn ready_once_every_part_is() {
        let whole = Readiness::default();
        let parts = whole.parts(2);
        parts[0].set_ready();
        parts[0].set_ready();
        assert!(!whole.is_ready(), "one part twice is still one part");
        parts[1].set_ready();
        assert!(whole.is_ready());
    }
}

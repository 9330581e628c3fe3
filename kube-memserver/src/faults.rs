//! Control-plane faults on demand (tests and the soak): the answers an overloaded or failing
//! apiserver gives, and an outage in which it cannot be reached at all. Each behaves as the
//! real kube-apiserver does from a client's side (APISERVER.md "Faults").

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use std::sync::Mutex;
use tokio::sync::watch;

use super::handlers::{Body, error_response, full};
use super::status::ApiError;

/// What every request (but health checks) is answered with while a failure is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// 429 as the max-in-flight and priority-and-fairness filters answer it: plain text
    /// "Too many requests, please try again later." with `Retry-After` (seconds).
    TooManyRequests { retry_after_seconds: u32 },
    /// 500 `InternalError`, as a storage failure surfaces ("etcdserver: leader changed").
    Internal,
    /// 503 `ServiceUnavailable`.
    Unavailable,
}

impl Failure {
    pub fn response(self) -> Response<Body> {
        match self {
            Failure::TooManyRequests {
                retry_after_seconds,
            } => {
                let mut r = Response::new(full(Bytes::from_static(
                    b"Too many requests, please try again later.\n",
                )));
                *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let h = r.headers_mut();
                h.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                h.insert(
                    "X-Content-Type-Options",
                    HeaderValue::from_static("nosniff"),
                );
                h.insert(header::RETRY_AFTER, HeaderValue::from(retry_after_seconds));
                r
            }
            Failure::Internal => error_response(&ApiError::internal("etcdserver: leader changed")),
            Failure::Unavailable => error_response(&ApiError::service_unavailable(
                "the server is currently unable to handle the request",
            )),
        }
    }
}

#[derive(Default)]
pub struct Faults {
    failure: Mutex<Option<Failure>>,
    /// `true` during an outage: connections are dropped and new ones closed at once.
    outage: OutageFlag,
}

struct OutageFlag(watch::Sender<bool>);

impl Default for OutageFlag {
    fn default() -> Self {
        OutageFlag(watch::channel(false).0)
    }
}

impl Faults {
    pub fn failure(&self) -> Option<Failure> {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set_failure(&self, f: Option<Failure>) {
        *self.failure.lock().unwrap_or_else(|e| e.into_inner()) = f;
    }

    pub fn set_outage(&self, on: bool) {
        self.outage.0.send_replace(on);
    }

    pub fn in_outage(&self) -> bool {
        *self.outage.0.borrow()
    }

    /// Resolves when an outage is on (at once if it is now): the connection must end.
    pub async fn outage_started(&self) {
        let mut rx = self.outage.0.subscribe();
        let _ = rx.wait_for(|on| *on).await;
    }
}

//! HTTP calls the router makes: rest targets (cloud endpoints of eventbus → rest and
//! servicebus → rest rules: `POST`, header `NodeName`, as KubeEdge's rest provider) and
//! requests forwarded to the replica holding a node's connection. One pooled client; HTTPS
//! verified against the system's roots; every call bounded in time and in the bytes read back.

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use std::time::Duration;

/// The answer of a called endpoint.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Request(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the answer is larger than {0} bytes")]
    TooLarge(usize),
}

#[derive(Clone)]
pub struct HttpClient {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
}

impl HttpClient {
    pub fn new() -> Self {
        let builder = hyper_rustls::HttpsConnectorBuilder::new();
        let builder = match builder
            .with_provider_and_native_roots(rustls::crypto::ring::default_provider())
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "no system CA certificates: https rest targets will fail");
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(
                    rustls::ClientConfig::builder_with_provider(
                        rustls::crypto::ring::default_provider().into(),
                    )
                    .with_safe_default_protocol_versions()
                    .map(|b| {
                        b.with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth()
                    })
                    .unwrap_or_else(|_| {
                        // ring's provider supports the default versions; unreachable.
                        rustls::ClientConfig::builder()
                            .with_root_certificates(rustls::RootCertStore::empty())
                            .with_no_client_auth()
                    }),
                )
            }
        };
        let connector = builder.https_or_http().enable_http1().build();
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(32)
            .build(connector);
        HttpClient { client }
    }

    /// Sends `req` and reads at most `max_body` bytes of the answer, all within `timeout`.
    pub async fn call(
        &self,
        req: Request<Full<Bytes>>,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Reply, CallError> {
        let call = async {
            let resp = self
                .client
                .request(req)
                .await
                .map_err(|e| CallError::Request(error_chain(&e)))?;
            let (parts, body) = resp.into_parts();
            let body = Limited::new(body, max_body)
                .collect()
                .await
                .map_err(|_| CallError::TooLarge(max_body))?
                .to_bytes();
            Ok(Reply {
                status: parts.status,
                headers: parts.headers,
                body,
            })
        };
        tokio::time::timeout(timeout, call)
            .await
            .map_err(|_| CallError::Timeout(timeout))?
    }

    /// KubeEdge's rest target call: `POST <url>` with the body and `NodeName: <node>`.
    pub async fn post(
        &self,
        url: &http::Uri,
        node: &str,
        content_type: Option<&str>,
        body: Bytes,
        timeout: Duration,
        max_body: usize,
    ) -> Result<Reply, CallError> {
        let mut req = Request::builder()
            .method(Method::POST)
            .uri(url.clone())
            .header("NodeName", node);
        if let Some(ct) = content_type {
            req = req.header(http::header::CONTENT_TYPE, ct);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| CallError::Request(e.to_string()))?;
        self.call(req, timeout, max_body).await
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

/// An error and its causes, `a: b: c`.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

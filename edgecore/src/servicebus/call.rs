//! A call from the router (rest → servicebus rules) to an HTTP server on this node: operation
//! = the method, resource `<port>:<path>`, content KubeEdge's `HTTPRequest`. The server is
//! called at `http://127.0.0.1:<port><path>` — a resource naming anything else is refused —
//! and its answer (status, headers, body) goes back as KubeEdge's `HTTPResponse`.
//!
//! Errors are answered as KubeEdge's servicebus answers them (`Server: kubeedge-edgecore`):
//! `400` for a bad resource or content, `404 error to call service` when the server cannot be
//! reached or does not answer within the call time-out, `500` for an answer over the body
//! limit (KubeEdge cuts it silently).

use super::config::ServiceBusConfig;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use kubeedge_shared::servicebus::{
    HeaderMap, HttpRequest, HttpResponse, ServiceCall, canonical_header_name, is_hop_by_hop,
};
use kubeedge_shared::{Message, Operation};
use serde_json::Value;

/// Why a call failed, as the servicebus answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallFailure {
    pub status: u16,
    pub text: String,
}

impl CallFailure {
    fn new(status: u16, text: impl Into<String>) -> Self {
        CallFailure {
            status,
            text: text.into(),
        }
    }
}

/// The call a router message asks for.
pub fn plan(msg: &Message) -> Result<(ServiceCall, HttpRequest), CallFailure> {
    let call = ServiceCall::parse(&msg.route.resource)
        .map_err(|e| CallFailure::new(400, e.to_string()))?;
    let request: HttpRequest = match &msg.content {
        Value::String(s) => serde_json::from_str(s),
        v => serde_json::from_value(v.clone()),
    }
    .map_err(|_| CallFailure::new(400, "error to parse http request"))?;
    Ok((call, request))
}

/// Calls the local server; its answer, or why there is none.
pub async fn call(
    config: &ServiceBusConfig,
    target: &ServiceCall,
    request: HttpRequest,
    operation: &Operation,
) -> Result<HttpResponse, CallFailure> {
    let method = if request.method.is_empty() {
        operation.as_str().to_string()
    } else {
        request.method.clone()
    };
    let method = http::Method::from_bytes(method.as_bytes())
        .map_err(|_| CallFailure::new(400, "error to parse http request"))?;
    let authority = format!("127.0.0.1:{}", target.port);
    let mut req = Request::builder()
        .method(method)
        .uri(&target.path)
        .header(http::header::HOST, &authority);
    for (name, values) in &request.header {
        if is_hop_by_hop(name) {
            continue;
        }
        let Ok(name) = HeaderName::from_bytes(name.as_bytes()) else {
            continue;
        };
        for v in values {
            if let Ok(v) = HeaderValue::from_str(v) {
                req = req.header(name.clone(), v);
            }
        }
    }
    if !request.header.contains_key("Accept") {
        req = req.header(http::header::ACCEPT, "*/*");
    }
    let req = req
        .body(Full::new(Bytes::from(request.body)))
        .map_err(|_| CallFailure::new(400, "error to parse http request"))?;
    let call_err = |e: &dyn std::fmt::Display| {
        tracing::debug!(%authority, error = %e, "servicebus: calling the local server failed");
        CallFailure::new(404, "error to call service")
    };
    let exchange = async {
        let tcp = tokio::net::TcpStream::connect(&authority)
            .await
            .map_err(|e| call_err(&e))?;
        let _ = tcp.set_nodelay(true);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| call_err(&e))?;
        let driver = tokio::spawn(conn);
        let resp = sender.send_request(req).await.map_err(|e| call_err(&e))?;
        let (parts, body) = resp.into_parts();
        let body = Limited::new(body, config.max_body).collect().await;
        driver.abort();
        let body = body
            .map_err(|e| {
                let why = if e.is::<http_body_util::LengthLimitError>() {
                    "response body too large".to_string()
                } else {
                    e.to_string()
                };
                CallFailure::new(500, format!("error to receive response, err: {why}"))
            })?
            .to_bytes();
        let mut header = HeaderMap::new();
        for (name, value) in &parts.headers {
            if is_hop_by_hop(name.as_str()) {
                continue;
            }
            header
                .entry(canonical_header_name(name.as_str()))
                .or_default()
                .push(String::from_utf8_lossy(value.as_bytes()).into_owned());
        }
        Ok(HttpResponse {
            header,
            status_code: parts.status.as_u16(),
            body: body.to_vec(),
        })
    };
    tokio::time::timeout(config.call_timeout, exchange)
        .await
        .map_err(|_| call_err(&format!("no answer within {:?}", config.call_timeout)))?
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeedge_shared::Group;
    use kubeedge_shared::operation::source;
    use serde_json::json;

    fn msg(resource: &str, content: Value) -> Message {
        Message::new(
            source::ROUTER_SERVICEBUS,
            Group::User,
            Operation::from("GET"),
            resource,
            content,
        )
    }

    #[test]
    fn calls_are_planned_from_kubeedge_shapes() {
        let req =
            json!({"header": {"Accept": ["text/plain"]}, "body": "", "method": "GET", "url": ""});
        let (call, r) = plan(&msg("8080:/hello", req.clone())).unwrap();
        assert_eq!(call.url(), "http://127.0.0.1:8080/hello");
        assert_eq!(r.header["Accept"], vec!["text/plain"]);
        assert!(plan(&msg("8080:/hello", json!(req.to_string()))).is_ok());
        let bad = plan(&msg("8080", req.clone())).unwrap_err();
        assert_eq!(
            (bad.status, bad.text.as_str()),
            (400, "the format of resource 8080 is incorrect")
        );
        assert_eq!(plan(&msg("80:@evil/", req)).unwrap_err().status, 400);
        assert_eq!(
            plan(&msg("80:/", json!({"body": "!!"}))).unwrap_err().text,
            "error to parse http request"
        );
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_404_as_in_kubeedge() {
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = free.local_addr().unwrap().port();
        drop(free);
        let target = ServiceCall {
            port,
            path: "/".into(),
        };
        let r = call(
            &ServiceBusConfig::default(),
            &target,
            HttpRequest::default(),
            &Operation::from("GET"),
        )
        .await;
        assert_eq!(
            r.unwrap_err(),
            CallFailure::new(404, "error to call service")
        );
    }
}

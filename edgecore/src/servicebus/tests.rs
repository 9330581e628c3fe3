//! The servicebus with a fake cloud link: calls of a local HTTP server, KubeEdge's error
//! answers, and the local server for applications following `start`/`stop`.

use super::*;
use crate::edgehub::{HubError, LinkEvent};
use kubeedge_shared::servicebus::{HttpRequest, UploadResponse, decode_bytes_content};
use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::broadcast;

type Answerer = Box<dyn Fn(&Message) -> Message + Send + Sync>;

#[derive(Clone)]
struct FakeLink {
    sent: mpsc::UnboundedSender<Message>,
    answer: Arc<Mutex<Option<Answerer>>>,
    events: broadcast::Sender<LinkEvent>,
}

impl CloudLink for FakeLink {
    fn is_connected(&self) -> bool {
        true
    }

    async fn send(&self, msg: Message) -> Result<(), HubError> {
        let _ = self.sent.send(msg);
        Ok(())
    }

    async fn request(&self, msg: Message, _timeout: Duration) -> Result<Message, HubError> {
        let _ = self.sent.send(msg.clone());
        match self.answer.lock().unwrap().as_ref() {
            Some(f) => Ok(f(&msg)),
            None => Err(HubError::Timeout(Duration::from_millis(1))),
        }
    }

    fn subscribe(&self) -> broadcast::Receiver<LinkEvent> {
        self.events.subscribe()
    }
}

fn link() -> (FakeLink, mpsc::UnboundedReceiver<Message>) {
    let (sent, rx) = mpsc::unbounded_channel();
    (
        FakeLink {
            sent,
            answer: Arc::default(),
            events: broadcast::channel(4).0,
        },
        rx,
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// A local HTTP server that answers every request `201` with its request line as the body.
async fn app() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 4096];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let line = head.lines().next().unwrap_or_default().to_string();
                let resp = format!(
                    "HTTP/1.1 201 Created\r\nX-App: yes\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}",
                    line.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    port
}

async fn bus(
    config: ServiceBusConfig,
) -> (
    ServiceBus,
    FakeLink,
    mpsc::UnboundedReceiver<Message>,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let store = MetaStore::open(dir.path().join("edgecore.db"))
        .await
        .unwrap();
    let (link, rx) = link();
    let sb = ServiceBus::start(config, store, link.clone())
        .await
        .unwrap();
    (sb, link, rx, dir)
}

fn router(op: &str, resource: &str, content: serde_json::Value) -> Message {
    Message::new(
        source::ROUTER_SERVICEBUS,
        Group::User,
        Operation::from(op),
        resource,
        content,
    )
}

async fn next(rx: &mut mpsc::UnboundedReceiver<Message>) -> Message {
    tokio::time::timeout(Duration::from_secs(5), rx.recv())
        .await
        .expect("a message to the cloud")
        .unwrap()
}

#[tokio::test]
async fn a_call_reaches_the_local_server_and_its_answer_goes_back() {
    let port = app().await;
    let (sb, _link, mut rx, _dir) = bus(ServiceBusConfig::default()).await;
    let req = HttpRequest {
        method: "PUT".into(),
        body: b"x".to_vec(),
        ..HttpRequest::default()
    };
    let call = router(
        "PUT",
        &format!("{port}:/items/1?full=true"),
        serde_json::to_value(&req).unwrap(),
    );
    sb.sender().send(call.clone()).await.unwrap();
    let answer = next(&mut rx).await;
    assert_eq!(answer.parent_id(), call.id());
    assert_eq!(
        (
            answer.route.source.as_str(),
            &answer.route.group,
            &answer.route.operation,
            answer.route.resource.as_str()
        ),
        ("servicebus", &Group::User, &Operation::Upload, "")
    );
    let r: HttpResponse = serde_json::from_value(answer.content).unwrap();
    assert_eq!(r.status_code, 201);
    assert_eq!(r.header["X-App"], vec!["yes"]);
    assert_eq!(r.body, b"PUT /items/1?full=true HTTP/1.1");
    sb.shutdown().await;
}

#[tokio::test]
async fn failures_are_answered_in_kubeedges_error_shape() {
    let (sb, _link, mut rx, _dir) = bus(ServiceBusConfig::default()).await;
    let dead = free_port();
    for (resource, status, text) in [
        (format!("{dead}:/"), 404, "error to call service"),
        (
            "80:@evil.example/".to_string(),
            400,
            "resource 80:@evil.example/: the path must start with / and hold only URL characters",
        ),
    ] {
        let call = router("GET", &resource, json!({"method": "GET"}));
        sb.sender().send(call.clone()).await.unwrap();
        let answer = next(&mut rx).await;
        assert_eq!(answer.parent_id(), call.id());
        assert!(answer.route.operation.is_empty() && answer.route.resource.is_empty());
        let r: HttpResponse = serde_json::from_value(answer.content).unwrap();
        assert_eq!(r.status_code, status, "{resource}");
        assert_eq!(r.header["Server"], vec!["kubeedge-edgecore"]);
        assert_eq!(String::from_utf8_lossy(&r.body), text);
    }
    sb.shutdown().await;
}

async fn post(port: u16, body: &str) -> Option<UploadResponse> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .ok()?;
    let req = format!(
        "POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.ok()?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.ok()?;
    let text = String::from_utf8_lossy(&out);
    let (_, json) = text.split_once("\r\n\r\n")?;
    serde_json::from_str(json).ok()
}

#[tokio::test]
async fn applications_reach_only_allowed_urls_while_some_are_allowed() {
    let port = free_port();
    let config = ServiceBusConfig {
        listen: ([127, 0, 0, 1], port).into(),
        ..ServiceBusConfig::default()
    };
    let (sb, link, mut rx, _dir) = bus(config).await;
    assert!(
        post(port, "{}").await.is_none(),
        "no server without a target URL"
    );
    *link.answer.lock().unwrap() = Some(Box::new(|m: &Message| {
        Message::response_to(m, json!("pong from the cloud"))
    }));
    sb.sender()
        .send(router("start", "http://cloud/api", serde_json::Value::Null))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let request = r#"{"method":"POST","targetURL":"http://cloud/api","payload":{"t":21}}"#;
    let ok = loop {
        if let Some(r) = post(port, request).await {
            break r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "server never came up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (ok.code, ok.msg.as_str(), ok.body.as_str()),
        (
            200,
            "receive response from cloud successfully",
            "pong from the cloud"
        )
    );
    let upload = next(&mut rx).await;
    assert_eq!(
        (
            upload.route.source.as_str(),
            &upload.route.operation,
            upload.route.resource.as_str()
        ),
        ("servicebus", &Operation::Upload, "http://cloud/api")
    );
    assert_eq!(
        decode_bytes_content(&upload.content).unwrap(),
        request.as_bytes()
    );
    let refused = post(port, r#"{"targetURL":"http://elsewhere/"}"#)
        .await
        .unwrap();
    assert_eq!(
        (refused.code, refused.msg.as_str()),
        (
            400,
            "url http://elsewhere/ is not allowed and please make a rule for this url in the cloud"
        )
    );
    assert_eq!(post(port, "not json").await.unwrap().msg, "invalid params");
    sb.sender()
        .send(router("stop", "http://cloud/api", serde_json::Value::Null))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while post(port, request).await.is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "server still up after the last stop"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(sb.metrics().allowed_urls.get(), 0);
    sb.shutdown().await;
}

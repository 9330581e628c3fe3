//! Entry points of the fuzz targets (`e2e/fuzz`, run by `scripts/fuzz.sh`): each takes bytes
//! that a peer or a file could hand this crate, drives the decoders they reach and checks
//! what must hold for every input (no panic; a decoded value encodes back to itself). The fuzz
//! package only calls these; the unit tests below replay its corpora and every input that once
//! failed, so a regression shows in `cargo test` without a fuzzer.

use crate::application::{AppKey, Application, watch_sync_apps};
use crate::codec::FrameCodec;
use crate::content::{ObjectResp, StatusError, content_json, parse_query_reply};
use crate::inventory::Inventory;
use crate::resource::{ResourcePath, resource_type_of};
use crate::selectors::{Filter, parse_fields, parse_labels};
use crate::servicebus::ServiceCall;
use crate::stream::http::{decode_chunked, parse_response_head};
use crate::stream::ws::{WsEvent, WsReader};
use crate::stream::{Connector, RelayConnect, RelayStatus, TunnelMessage, parse_query};
use crate::{names, token, topic};
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

/// Splits fuzz input into at most `n` parts at NUL bytes (the last part keeps the rest).
pub fn parts(data: &[u8], n: usize) -> Vec<&[u8]> {
    data.splitn(n, |b| *b == 0).collect()
}

/// Text of fuzz input (invalid UTF-8 replaced, as a lossy reader would).
pub fn text(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

/// Runs a future over in-memory input to completion: such a future never waits, so a pending
/// poll means a reader waits on bytes that cannot come (a bug of its own).
pub fn run_ready<F: Future>(fut: F) -> F::Output {
    let mut fut = pin!(fut);
    let mut cx = Context::from_waker(Waker::noop());
    match fut.as_mut().poll(&mut cx) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("a future over in-memory input is pending"),
    }
}

/// A cloudhub/edgehub frame: the beehive message and the content shapes read out of it.
pub fn beehive_frame(data: &[u8]) {
    let codec = FrameCodec::new(1 << 20);
    let Ok(msg) = codec.decode(data) else {
        return;
    };
    let _ = (msg.operation().as_str(), msg.group().as_str());
    let _ = (msg.resource_type(), msg.object_uid(), msg.is_delete());
    let _ = msg.requires_ack();
    if let Ok(path) = msg.resource_path() {
        assert_eq!(ResourcePath::parse(&path.to_wire()).as_ref(), Ok(&path));
    }
    let content = &msg.content;
    let _ = StatusError::from_content(content);
    let _ = ObjectResp::from_content(content);
    let _ = content_json(content);
    let _ = parse_query_reply(content);
    let _ = crate::servicebus::decode_bytes_content(content);
    if Inventory::is_inventory(&msg) {
        let _ = Inventory::from_message(&msg);
    }
    if Application::is_request(&msg) {
        let _ = Application::from_message(&msg);
    }
    let _ = watch_sync_apps(&msg);
    let _ = ServiceCall::parse(msg.resource());
    // What was decoded encodes to a frame that decodes to the same message.
    let again = codec.encode(&msg).expect("a decoded message encodes");
    let back = codec
        .decode(again.as_bytes())
        .expect("an encoded message decodes");
    assert_eq!(back, msg);
}

/// The stream tunnel's frames (RFC 6455 as the tunnel reads it), its messages and what they
/// carry: connectors, relay requests, the runtime's HTTP answer.
pub fn tunnel(data: &[u8]) {
    let mut reader = WsReader::new(data, 64 * 1024);
    let mut messages = 0;
    while let Ok(Some(event)) = run_ready(reader.next()) {
        if let WsEvent::Data { payload, .. } = event {
            tunnel_message(&payload);
            messages += 1;
        }
    }
    if messages == 0 {
        tunnel_message(data);
    }
}

fn tunnel_message(data: &[u8]) {
    if let Ok(m) = TunnelMessage::decode(data) {
        let again = TunnelMessage::decode(&m.encode()).expect("an encoded message decodes");
        assert_eq!(again, m);
        let _ = serde_json::from_slice::<Connector>(&m.data);
        let _ = serde_json::from_slice::<RelayConnect>(&m.data);
        let _ = serde_json::from_slice::<RelayStatus>(&m.data);
    }
    if let Ok(Some((head, used))) = parse_response_head(data) {
        assert!(used <= data.len());
        let _ = head.header("content-length");
        let _ = decode_chunked(&data[used..]);
    }
    let _ = decode_chunked(data);
    let _ = parse_query(&text(data));
}

/// Resource strings, MetaServer keys, servicebus resources, MQTT topics and node names.
pub fn resource_path(data: &[u8]) {
    let s = text(data);
    if let Ok(path) = ResourcePath::parse(&s) {
        assert_eq!(ResourcePath::parse(&path.to_wire()), Ok(path));
    }
    let _ = resource_type_of(&s);
    if let Ok(key) = AppKey::parse(&s) {
        assert_eq!(AppKey::parse(&key.to_key()), Ok(key));
    }
    if let Ok(call) = ServiceCall::parse(&s) {
        let _ = (call.resource(), call.url());
    }
    let _ = names::validate_node_name(&s);
    let (filter, name) = s.split_once('\n').unwrap_or((&s, ""));
    if topic::valid_filter(filter) && topic::valid_topic(name) {
        let _ = topic::matches(filter, name);
    }
}

/// `labelSelector` and `fieldSelector` values, matched against an object.
pub fn selectors(data: &[u8]) {
    let p = parts(data, 2);
    let labels = text(p[0]);
    let fields = p.get(1).map(|f| text(f));
    let _ = parse_labels(&labels);
    if let Some(f) = &fields {
        let _ = parse_fields(f);
    }
    if let Ok(filter) = Filter::parse(Some(&labels), fields.as_deref()) {
        let pod = serde_json::json!({
            "metadata": {"name": "web-1", "namespace": "default",
                         "labels": {"app": "web", "tier": "", "a.b/c": "d"}},
            "spec": {"nodeName": "edge-1"},
            "status": {"phase": "Running"},
        });
        let _ = filter.matches(&pod);
        let _ = filter.exact_field("spec.nodeName");
    }
}

/// A join token and its JWT (signature, claims, expiry): also JWTs the harness signs itself
/// from fuzzed header and claims, so that the claims are read past the signature check.
pub fn join_token(data: &[u8]) {
    const KEY: &[u8] = b"fuzz key";
    let s = text(data);
    if let Ok((_hash, jwt)) = token::split(&s) {
        let _ = token::verify_jwt(jwt, KEY, 1_700_000_000);
    }
    let _ = token::verify_jwt(&s, KEY, 1_700_000_000);
    let _ = token::jwt_expiry(&s);
    let p = parts(data, 2);
    if let [header, claims] = p.as_slice() {
        use base64::Engine as _;
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header),
            URL_SAFE_NO_PAD.encode(claims)
        );
        use hmac::Mac as _;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(KEY).expect("any key length");
        mac.update(input.as_bytes());
        let sig = mac.finalize().into_bytes();
        let jwt = format!("{input}.{}", URL_SAFE_NO_PAD.encode(sig));
        let _ = token::verify_jwt(&jwt, KEY, 1_700_000_000);
        let _ = token::jwt_expiry(&jwt);
    }
}

/// Replays a target's corpus and its regression inputs (`e2e/fuzz/{corpus,regressions}/<target>`)
/// through `run`: the unit tests of every crate with fuzz targets call it.
pub fn replay(target: &str, run: fn(&[u8])) {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../e2e/fuzz");
    let mut seen = 0;
    for dir in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir).join(target)) else {
            continue;
        };
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).expect("a corpus file is readable");
            run(&data);
            seen += 1;
        }
    }
    assert!(
        seen > 0,
        "no corpus for fuzz target {target} in {}",
        root.display()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn beehive_frame_corpus_replays() {
        replay("beehive_frame", beehive_frame);
    }

    #[test]
    fn tunnel_corpus_replays() {
        replay("tunnel", tunnel);
    }

    #[test]
    fn resource_path_corpus_replays() {
        replay("resource_path", resource_path);
    }

    #[test]
    fn selectors_corpus_replays() {
        replay("selectors", selectors);
    }

    #[test]
    fn join_token_corpus_replays() {
        replay("join_token", join_token);
    }
}

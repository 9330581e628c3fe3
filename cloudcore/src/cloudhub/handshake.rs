//! Validation of the WebSocket upgrade request: node identity from the `node_id` header,
//! bound to the client certificate, `ConnectionUse: msg`, and gorilla's Origin rule.

use super::Capabilities;
use http::StatusCode;
use kubeedge_shared::constants::{
    CAPABILITY_CLOUD_LEASE, CAPABILITY_INVENTORY, CAPABILITY_PING_KEEPALIVE, CONNECTION_USE_MSG,
    HEADER_CAPABILITIES, HEADER_CONNECTION_USE, HEADER_NODE_ID, HEADER_PROJECT_ID, LEGACY_EDGE_CN,
    NODE_CN_PREFIX, capability_parts,
};
use kubeedge_shared::names::valid_node_name;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request};

#[derive(Debug, Clone)]
pub(super) struct Accepted {
    pub node: String,
    pub project_id: Option<String>,
    pub capabilities: Capabilities,
    pub legacy_cn: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    /// Metric label.
    pub reason: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(status: StatusCode, reason: &'static str, message: impl Into<String>) -> Self {
        Refusal {
            status,
            reason,
            message: message.into(),
        }
    }

    pub fn into_response(self) -> ErrorResponse {
        let mut resp = ErrorResponse::new(Some(self.message));
        *resp.status_mut() = self.status;
        resp
    }
}

fn header<'a>(req: &'a Request, name: &str) -> Option<&'a str> {
    // http::HeaderMap lookups are case-insensitive, as Go's canonicalised names require.
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

pub(super) fn check_request(
    req: &Request,
    peer_cn: Option<&str>,
    allow_legacy_cn: bool,
) -> Result<Accepted, Refusal> {
    let node = header(req, HEADER_NODE_ID).unwrap_or_default();
    if node.is_empty() {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "missing_node_id",
            "missing node_id header: set it to the edge node name",
        ));
    }
    if !valid_node_name(node) {
        return Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            "invalid_node_id",
            format!("node_id {node:?} is not a valid Kubernetes node name"),
        ));
    }
    match header(req, HEADER_CONNECTION_USE) {
        Some(CONNECTION_USE_MSG) => {}
        other => {
            return Err(Refusal::new(
                StatusCode::BAD_REQUEST,
                "connection_use",
                format!("ConnectionUse must be \"msg\" on this port, got {other:?}"),
            ));
        }
    }
    if let Some(origin) = header(req, "origin") {
        let origin_host = origin.split_once("://").map_or(origin, |(_, h)| h);
        let origin_host = origin_host.split('/').next().unwrap_or_default();
        if Some(origin_host) != header(req, "host") {
            return Err(Refusal::new(
                StatusCode::FORBIDDEN,
                "origin",
                "cross-origin WebSocket request refused",
            ));
        }
    }
    let legacy_cn = certificate_identity(peer_cn, node, allow_legacy_cn)?;
    let tokens: Vec<(&str, Option<&str>)> = header(req, HEADER_CAPABILITIES)
        .map(|v| v.split(',').map(capability_parts).collect())
        .unwrap_or_default();
    let asked = |capability: &str| tokens.iter().find(|(name, _)| *name == capability);
    let capabilities = Capabilities {
        inventory_resync: asked(CAPABILITY_INVENTORY).is_some(),
        ping_keepalive: asked(CAPABILITY_PING_KEEPALIVE).is_some(),
        // Only with a usable duration (a lease shorter than 4 s could not be renewed on
        // time at the edge's pace).
        cloud_lease: asked(CAPABILITY_CLOUD_LEASE)
            .and_then(|(_, v)| (*v)?.parse::<u32>().ok())
            .filter(|secs| (4..=3600).contains(secs)),
    };
    Ok(Accepted {
        node: node.to_string(),
        project_id: header(req, HEADER_PROJECT_ID).map(str::to_string),
        capabilities,
        legacy_cn,
    })
}

/// Whether the client certificate's CN belongs to `node` (`system:node:<node>`, or the
/// shared legacy CN when allowed; `Ok(true)` for that one). The stream tunnel checks the same.
pub(crate) fn certificate_identity(
    peer_cn: Option<&str>,
    node: &str,
    allow_legacy_cn: bool,
) -> Result<bool, Refusal> {
    let expected_cn = format!("{NODE_CN_PREFIX}{node}");
    match peer_cn {
        Some(cn) if cn == expected_cn => Ok(false),
        Some(LEGACY_EDGE_CN) if allow_legacy_cn => Ok(true),
        Some(LEGACY_EDGE_CN) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "legacy_cn",
            format!(
                "certificate CN {LEGACY_EDGE_CN:?} is shared by all KubeEdge ≤ v1.15 edges and is not accepted; \
                     rejoin the node for a per-node certificate or enable modules.cloudHub.allowLegacyCertificates"
            ),
        )),
        Some(cn) => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "identity_mismatch",
            format!(
                "certificate CN {cn:?} does not belong to node {node:?} (expected {expected_cn:?})"
            ),
        )),
        None => Err(Refusal::new(
            StatusCode::FORBIDDEN,
            "no_certificate",
            "a client certificate is required",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> Request {
        let mut b = Request::builder().uri("/e632/edge-1/events");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap()
    }

    const GO_HEADERS: [(&str, &str); 3] = [
        ("Node_id", "edge-1"),
        ("Project_id", "e632"),
        ("Connectionuse", "msg"),
    ];

    #[test]
    fn go_canonicalised_headers_are_found() {
        let a = check_request(&req(&GO_HEADERS), Some("system:node:edge-1"), false).unwrap();
        assert_eq!(a.node, "edge-1");
        assert_eq!(a.project_id.as_deref(), Some("e632"));
        assert!(!a.capabilities.inventory_resync);
    }

    #[test]
    fn certificate_for_another_node_is_refused() {
        let e = check_request(&req(&GO_HEADERS), Some("system:node:edge-2"), false).unwrap_err();
        assert_eq!(e.status, StatusCode::FORBIDDEN);
        assert_eq!(e.reason, "identity_mismatch");
    }

    #[test]
    fn legacy_cn_only_when_allowed() {
        assert!(check_request(&req(&GO_HEADERS), Some("kubeedge.io"), false).is_err());
        assert!(
            check_request(&req(&GO_HEADERS), Some("kubeedge.io"), true)
                .unwrap()
                .legacy_cn
        );
    }

    #[test]
    fn bad_headers_are_refused() {
        let no_use = req(&[("node_id", "edge-1")]);
        assert_eq!(
            check_request(&no_use, Some("system:node:edge-1"), false)
                .unwrap_err()
                .reason,
            "connection_use"
        );
        let bad_name = req(&[("node_id", "../x"), ("ConnectionUse", "msg")]);
        assert_eq!(
            check_request(&bad_name, None, false).unwrap_err().reason,
            "invalid_node_id"
        );
        let origin = req(&[
            ("node_id", "edge-1"),
            ("ConnectionUse", "msg"),
            ("Host", "a:1"),
            ("Origin", "https://b:1"),
        ]);
        assert_eq!(
            check_request(&origin, Some("system:node:edge-1"), false)
                .unwrap_err()
                .reason,
            "origin"
        );
    }

    #[test]
    fn capability_header_is_read() {
        let mut h = GO_HEADERS.to_vec();
        h.push((
            "X-KubeEdge-RS-Capabilities",
            "inventory-resync, ping-keepalive,cloud-lease=40,future-thing",
        ));
        let a = check_request(&req(&h), Some("system:node:edge-1"), false).unwrap();
        assert!(a.capabilities.inventory_resync);
        assert!(a.capabilities.ping_keepalive);
        assert_eq!(a.capabilities.cloud_lease, Some(40));
        for unusable in [
            "cloud-lease",
            "cloud-lease=x",
            "cloud-lease=1",
            "cloud-lease=-5",
        ] {
            let mut h = GO_HEADERS.to_vec();
            h.push(("X-KubeEdge-RS-Capabilities", unusable));
            let a = check_request(&req(&h), Some("system:node:edge-1"), false).unwrap();
            assert_eq!(a.capabilities.cloud_lease, None, "{unusable}");
        }
    }
}

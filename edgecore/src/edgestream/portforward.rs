//! PORT_FORWARD_CONNECT: `GET|POST /portForward/{ns}/{pod}[/{uid}]` as the kubelet serves it
//! (`kubectl port-forward`). The CRI `PortForward` call for the pod's ready sandbox gives a
//! URL on the runtime's streaming server, which speaks the kubelet's port-forward protocol
//! itself (SPDY streams with `streamType`, `port` and `requestID` headers, data to
//! `localhost:port` in the sandbox's network namespace); the original upgrade request goes
//! there and bytes are relayed both ways, exactly as for exec (see [`super::exec`]).
//!
//! The ports travel in the SPDY stream headers. A `port` query parameter (what the apiserver
//! sends when the client names ports in the URL, comma-separated) is checked as the kubelet
//! checks it for WebSocket requests (`NewV4Options`, same messages): each a number in
//! 1–65535, else 400. Stricter than the kubelet, which ignores the parameter for SPDY
//! requests: a bad port is a clear error rather than silently unused. (A WebSocket request
//! without it is refused by the runtime's streaming server, which runs the same check.)

use super::exec::{Refusal, Upgrade};
use super::sender::TunnelSender;
use kubeedge_edged::cri::api;
use kubeedge_edged::cri::runtime::{Runtime, pod_selector};
use kubeedge_shared::stream::{Connector, parse_query};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The kubelet's query parameter for ports (`api.PortHeader`).
pub const PARAM_PORT: &str = "port";

/// What a port-forward request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortForwardRequest {
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    /// Ports named in the query (empty for SPDY clients, whose ports come per stream).
    pub ports: Vec<u16>,
}

impl PortForwardRequest {
    pub fn parse(path: &str, raw_query: &str) -> Result<Self, Refusal> {
        let not_found = || Refusal(404, "404 page not found".into());
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (ns, pod, uid) = match parts.as_slice() {
            ["portForward", ns, pod] => (*ns, *pod, None),
            ["portForward", ns, pod, uid] => (*ns, *pod, Some(uid.to_string())),
            _ => return Err(not_found()),
        };
        if ns.is_empty() || pod.is_empty() {
            return Err(not_found());
        }
        let mut ports = Vec::new();
        for (_, value) in parse_query(raw_query)
            .iter()
            .filter(|(k, _)| k == PARAM_PORT)
        {
            if value.is_empty() {
                return Err(Refusal(
                    400,
                    format!("query parameter {PARAM_PORT:?} cannot be empty"),
                ));
            }
            for p in value.split(',') {
                ports.push(parse_port(value, p)?);
            }
        }
        Ok(PortForwardRequest {
            namespace: ns.into(),
            pod: pod.into(),
            uid: uid.filter(|u| !u.is_empty()),
            ports,
        })
    }
}

/// One port `p` of the parameter `value` as the kubelet reads it (`strconv.ParseUint(p, 10,
/// 16)`, then `> 0`), with its messages.
fn parse_port(value: &str, p: &str) -> Result<u16, Refusal> {
    let syntax = !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    match p.parse::<u16>() {
        Ok(0) => Err(Refusal(400, format!("port {value:?} must be > 0"))),
        Ok(n) => Ok(n),
        Err(_) => Err(Refusal(
            400,
            format!(
                "unable to parse {value:?} as a port: strconv.ParseUint: parsing {p:?}: {}",
                if syntax {
                    "value out of range"
                } else {
                    "invalid syntax"
                }
            ),
        )),
    }
}

/// The ready sandbox of the pod (the newest, should several exist).
async fn ready_sandbox(runtime: &Runtime, r: &PortForwardRequest) -> Result<String, Refusal> {
    let all = runtime
        .list_sandboxes(pod_selector(&r.namespace, &r.pod, r.uid.as_deref()))
        .await
        .map_err(|e| Refusal(500, format!("listing sandboxes of pod {}: {e}", r.pod)))?;
    if all.is_empty() {
        return Err(Refusal(404, "pod does not exist".into()));
    }
    all.into_iter()
        .filter(|s| s.state() == api::PodSandboxState::SandboxReady)
        .max_by_key(|s| s.created_at)
        .map(|s| s.id)
        .ok_or_else(|| Refusal(500, format!("pod {} has no ready sandbox", r.pod)))
}

async fn streaming_url(runtime: &Runtime, r: &PortForwardRequest) -> Result<String, Refusal> {
    let sandbox = ready_sandbox(runtime, r).await?;
    let ports = r.ports.iter().map(|p| i32::from(*p)).collect();
    runtime.port_forward(&sandbox, ports).await.map_err(|e| {
        let status = if e.is_not_found() { 404 } else { 500 };
        Refusal(status, e.to_string())
    })
}

/// Serves one port-forward connection; `data` carries the cloud's DATA for it.
pub async fn serve(
    id: u64,
    connector: Connector,
    runtime: Runtime,
    tunnel: TunnelSender,
    data: mpsc::Receiver<Vec<u8>>,
    cancel: CancellationToken,
) {
    let url = async {
        let req = PortForwardRequest::parse(&connector.url.path, &connector.url.raw_query)?;
        streaming_url(&runtime, &req).await
    };
    let conn = Upgrade {
        what: "port-forward",
        id,
        connector: &connector,
        tunnel: &tunnel,
        cancel: &cancel,
    };
    conn.serve(url, data).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_apiserver_s_port_forward_request_is_understood() {
        // What every apiserver sends for `kubectl port-forward` (no ports in the URL).
        let r = PortForwardRequest::parse("/portForward/ns/web", "").unwrap();
        assert_eq!(
            r,
            PortForwardRequest {
                namespace: "ns".into(),
                pod: "web".into(),
                uid: None,
                ports: vec![],
            }
        );
        // `?ports=8080&ports=9090` at the apiserver becomes `port=8080,9090`.
        let r = PortForwardRequest::parse("/portForward/ns/web/u-1", "port=8080%2C9090").unwrap();
        assert_eq!(r.uid.as_deref(), Some("u-1"));
        assert_eq!(r.ports, [8080, 9090]);
        let r = PortForwardRequest::parse("/portForward/ns/web", "port=1&port=65535").unwrap();
        assert_eq!(r.ports, [1, 65535]);
    }

    #[test]
    fn bad_ports_and_paths_are_refused() {
        for q in [
            "port=0",
            "port=65536",
            "port=-1",
            "port=http",
            "port=80,",
            "port=",
        ] {
            let e = PortForwardRequest::parse("/portForward/ns/web", q).unwrap_err();
            assert_eq!(e.0, 400, "{q}: {e:?}");
        }
        let msg = |q| {
            PortForwardRequest::parse("/portForward/ns/web", q)
                .unwrap_err()
                .1
        };
        assert_eq!(
            msg("port=70000"),
            "unable to parse \"70000\" as a port: strconv.ParseUint: parsing \"70000\": value out of range"
        );
        assert_eq!(
            msg("port=80%2Cx"),
            "unable to parse \"80,x\" as a port: strconv.ParseUint: parsing \"x\": invalid syntax"
        );
        assert_eq!(msg("port="), "query parameter \"port\" cannot be empty");
        assert_eq!(msg("port=0"), "port \"0\" must be > 0");
        for p in [
            "/portForward/ns",
            "/portForward//web",
            "/portforward/ns/web",
            "/portForward/a/b/c/d",
            "/exec/ns/web/c",
        ] {
            assert_eq!(PortForwardRequest::parse(p, "").unwrap_err().0, 404, "{p}");
        }
    }
}

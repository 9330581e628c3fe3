//! EXEC_CONNECT / ATTACH_CONNECT: `GET|POST /exec/{ns}/{pod}[/{uid}]/{container}?command=…`
//! (and `/attach/…`) as the kubelet serves them: the CRI `Exec`/`Attach` call for the pod's
//! running container gives a URL on the runtime's streaming server; the original upgrade
//! request (method, headers) goes there and from then on bytes are relayed both ways as
//! DATA frames, the runtime's raw HTTP answer (`101 Switching Protocols` head included)
//! first, as KubeEdge's edge relays edged's. REMOVE_CONNECT from the cloud or the end of
//! the runtime's connection ends it. Errors are sent as the kubelet's HTTP error response.

use super::sender::TunnelSender;
use kubeedge_edged::cri::api;
use kubeedge_edged::cri::runtime::{LABEL_CONTAINER_NAME, Runtime, pod_selector};
use kubeedge_shared::stream::http::request_head;
use kubeedge_shared::stream::{Connector, parse_query};
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// How long connecting to the runtime's streaming server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// The kubelet's default `streamingConnectionIdleTimeout`: a stream silent this long ends.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// The kubelet's query parameter names (`ExecStdinParam`… in Kubernetes' core API).
pub const PARAM_STDIN: &str = "input";
pub const PARAM_STDOUT: &str = "output";
pub const PARAM_STDERR: &str = "error";
pub const PARAM_TTY: &str = "tty";
pub const PARAM_COMMAND: &str = "command";

/// Exec or attach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Exec,
    Attach,
}

/// What the request asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRequest {
    pub kind: Kind,
    pub namespace: String,
    pub pod: String,
    pub uid: Option<String>,
    pub container: String,
    pub command: Vec<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// A kubelet-like error answer: status and text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal(pub u16, pub String);

impl StreamRequest {
    /// Parses the kubelet path and query as the kubelet's stream server reads them: what every
    /// apiserver sends (`streamParams` in the apiserver's pod registry, 1.26–1.34 alike) is
    /// `command=<arg>` once per argument and the flags `input`, `output`, `error`, `tty` set
    /// to `1` — not kubectl's `stdin=true&stdout=true…`, which the apiserver turns into those.
    /// A flag counts only when it is `1` (`req.FormValue(…) == "1"`); `error` is dropped with
    /// `tty`.
    pub fn parse(path: &str, raw_query: &str) -> Result<Self, Refusal> {
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (kind, rest) = match parts.split_first() {
            Some((&"exec", rest)) => (Kind::Exec, rest),
            Some((&"attach", rest)) => (Kind::Attach, rest),
            _ => return Err(Refusal(404, "404 page not found".into())),
        };
        let (ns, pod, uid, container) = match rest {
            [ns, pod, c] => (*ns, *pod, None, *c),
            [ns, pod, uid, c] => (*ns, *pod, Some(uid.to_string()), *c),
            _ => return Err(Refusal(404, "404 page not found".into())),
        };
        if ns.is_empty() || pod.is_empty() || container.is_empty() {
            return Err(Refusal(404, "404 page not found".into()));
        }
        let query = parse_query(raw_query);
        // Go's `FormValue`: the first value of the key.
        let flag = |name: &str| {
            query
                .iter()
                .find(|(k, _)| k == name)
                .is_some_and(|(_, v)| v == "1")
        };
        let tty = flag(PARAM_TTY);
        let req = StreamRequest {
            kind,
            namespace: ns.into(),
            pod: pod.into(),
            uid: uid.filter(|u| !u.is_empty()),
            container: container.into(),
            command: query
                .iter()
                .filter(|(k, _)| k == PARAM_COMMAND)
                .map(|(_, v)| v.clone())
                .collect(),
            stdin: flag(PARAM_STDIN),
            stdout: flag(PARAM_STDOUT),
            // With a TTY, stderr is merged into stdout (the kubelet drops the flag).
            stderr: flag(PARAM_STDERR) && !tty,
            tty,
        };
        if !req.stdin && !req.stdout && !req.stderr {
            return Err(Refusal(
                400,
                "you must specify at least 1 of stdin, stdout, stderr".into(),
            ));
        }
        if kind == Kind::Exec && req.command.is_empty() {
            return Err(Refusal(
                400,
                "you must specify at least one command for the container".into(),
            ));
        }
        Ok(req)
    }
}

/// The raw HTTP response the kubelet would write for an error.
pub fn error_response(r: &Refusal) -> Vec<u8> {
    let reason = http::StatusCode::from_u16(r.0)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Error");
    let body = format!("{}\n", r.1);
    format!(
        "HTTP/1.1 {} {reason}\r\nContent-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: {}\r\n\r\n{body}",
        r.0,
        body.len()
    )
    .into_bytes()
}

/// The running container the request names (the newest, if restarts left several).
async fn running_container(runtime: &Runtime, r: &StreamRequest) -> Result<String, Refusal> {
    let all = runtime
        .list_containers(pod_selector(&r.namespace, &r.pod, r.uid.as_deref()))
        .await
        .map_err(|e| Refusal(500, format!("listing containers of pod {}: {e}", r.pod)))?;
    if all.is_empty() {
        return Err(Refusal(404, "pod does not exist".into()));
    }
    all.into_iter()
        .filter(|c| {
            c.labels.get(LABEL_CONTAINER_NAME) == Some(&r.container)
                && c.state() == api::ContainerState::ContainerRunning
        })
        .max_by_key(|c| c.created_at)
        .map(|c| c.id)
        .ok_or_else(|| Refusal(500, format!("container not found ({:?})", r.container)))
}

/// Asks the runtime for the streaming URL.
async fn streaming_url(runtime: &Runtime, r: &StreamRequest) -> Result<String, Refusal> {
    let id = running_container(runtime, r).await?;
    let res = match r.kind {
        Kind::Exec => {
            runtime
                .exec(api::ExecRequest {
                    container_id: id,
                    cmd: r.command.clone(),
                    tty: r.tty,
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr,
                })
                .await
        }
        Kind::Attach => {
            runtime
                .attach(api::AttachRequest {
                    container_id: id,
                    stdin: r.stdin,
                    tty: r.tty,
                    stdout: r.stdout,
                    stderr: r.stderr,
                })
                .await
        }
    };
    res.map_err(|e| {
        let status = if e.is_not_found() { 404 } else { 500 };
        Refusal(status, e.to_string())
    })
}

/// `host:port` and path (with query) of an `http://` URL.
pub fn split_url(url: &str) -> Option<(String, String)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    (!host.is_empty()).then(|| (host.to_string(), path.to_string()))
}

/// Connects to the streaming server and sends the upgrade request.
async fn dial(c: &Connector, url: &str) -> Result<tokio::net::TcpStream, Refusal> {
    let (host, target) = split_url(url).ok_or_else(|| {
        Refusal(
            500,
            format!("the runtime's streaming URL {url:?} is not http://"),
        )
    })?;
    let fail = |e: String| Refusal(500, format!("connecting to {url}: {e}"));
    let mut tcp = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(&host))
        .await
        .map_err(|_| fail("timed out".into()))?
        .map_err(|e| fail(e.to_string()))?;
    let _ = tcp.set_nodelay(true);
    let headers = c
        .header
        .iter()
        .flatten()
        .flat_map(|(k, vs)| vs.iter().map(move |v| (k.as_str(), v.as_str())));
    let method = c
        .method
        .as_deref()
        .filter(|m| !m.is_empty())
        .unwrap_or("GET");
    tcp.write_all(&request_head(method, &target, &host, headers))
        .await
        .map_err(|e| fail(e.to_string()))?;
    Ok(tcp)
}

/// Serves one exec/attach connection; `data` carries the cloud's DATA for it.
pub async fn serve(
    id: u64,
    connector: Connector,
    runtime: Runtime,
    tunnel: TunnelSender,
    data: mpsc::Receiver<Vec<u8>>,
    cancel: CancellationToken,
) {
    let url = async {
        let req = StreamRequest::parse(&connector.url.path, &connector.url.raw_query)?;
        streaming_url(&runtime, &req).await
    };
    let conn = Upgrade {
        what: "exec/attach",
        id,
        connector: &connector,
        tunnel: &tunnel,
        cancel: &cancel,
    };
    conn.serve(url, data).await;
}

/// One upgrade connection relayed to the runtime's streaming server (exec, attach,
/// port-forward): what it is for the logs, its tunnel connection and its request.
pub(super) struct Upgrade<'a> {
    pub what: &'static str,
    pub id: u64,
    pub connector: &'a Connector,
    pub tunnel: &'a TunnelSender,
    pub cancel: &'a CancellationToken,
}

impl Upgrade<'_> {
    /// Once `url` gives the streaming URL, sends the request there and relays both ways;
    /// a refusal goes back as the kubelet's HTTP error. Ends the tunnel connection.
    pub async fn serve(
        &self,
        url: impl std::future::Future<Output = Result<String, Refusal>>,
        data: mpsc::Receiver<Vec<u8>>,
    ) {
        let (id, what, path) = (self.id, self.what, &self.connector.url.path);
        let started = async { dial(self.connector, &url.await?).await };
        let tcp = tokio::select! {
            _ = self.cancel.cancelled() => None,
            r = started => match r {
                Ok(tcp) => Some(tcp),
                Err(refusal) => {
                    tracing::info!(id, %path, status = refusal.0, error = %refusal.1, "{what} request refused");
                    self.tunnel.data(id, error_response(&refusal), self.cancel).await;
                    None
                }
            },
        };
        if let Some(tcp) = tcp {
            tracing::debug!(id, %path, "{what} stream opened");
            self.relay(tcp, data).await;
            tracing::debug!(id, "{what} stream ended");
        }
        self.tunnel.finish(id, self.cancel).await;
    }

    /// Relays the runtime's connection and the tunnel connection until either ends, the
    /// stream idles for [`IDLE_TIMEOUT`] or the connection is cancelled (both directions at
    /// once, see [`kubeedge_shared::stream::pump`]).
    async fn relay(&self, tcp: tokio::net::TcpStream, mut data: mpsc::Receiver<Vec<u8>>) {
        let (id, cancel) = (self.id, self.cancel);
        let moved = std::sync::atomic::AtomicU64::new(0);
        let pump = kubeedge_shared::stream::pump::duplex(
            tcp,
            Vec::new(),
            &mut data,
            |chunk| {
                let tunnel = self.tunnel.clone();
                let cancel = cancel.clone();
                async move { tunnel.data(id, chunk, &cancel).await }
            },
            IDLE_TIMEOUT,
            &moved,
        );
        tokio::select! {
            _ = cancel.cancelled() => {}
            why = pump => {
                if why == kubeedge_shared::stream::pump::Ended::Idle {
                    tracing::info!(id, "{} stream idle for {IDLE_TIMEOUT:?}; closing it", self.what);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a real kube-apiserver (1.26–1.34) sends to a kubelet for `kubectl exec -i -t pod
    /// -- sh -c 'echo a&b'`: `url.Values.Encode()` of `streamParams`, keys sorted.
    const APISERVER_EXEC_QUERY: &str =
        "command=sh&command=-c&command=echo+a%26b&error=1&input=1&output=1&tty=1";

    #[test]
    fn the_apiserver_s_exec_request_is_understood() {
        let r = StreamRequest::parse("/exec/ns/web/main", APISERVER_EXEC_QUERY).unwrap();
        assert_eq!(r.kind, Kind::Exec);
        assert_eq!((r.namespace.as_str(), r.pod.as_str()), ("ns", "web"));
        assert_eq!((r.uid.as_deref(), r.container.as_str()), (None, "main"));
        assert_eq!(r.command, ["sh", "-c", "echo a&b"]);
        assert!(
            r.stdin && r.stdout && !r.stderr && r.tty,
            "a TTY merges stderr"
        );
        // Without a TTY, as `kubectl exec pod -- ls`.
        let r = StreamRequest::parse("/exec/ns/web/main", "command=ls&error=1&output=1").unwrap();
        assert!(!r.stdin && r.stdout && r.stderr && !r.tty);
        // `kubectl attach -i` (no command) and the uid form of the path.
        let a =
            StreamRequest::parse("/attach/ns/web/u-1/main", "error=1&input=1&output=1").unwrap();
        assert_eq!((a.kind, a.uid.as_deref()), (Kind::Attach, Some("u-1")));
        assert!(a.stdin && a.stdout && a.stderr && !a.tty);
    }

    #[test]
    fn flags_count_only_as_the_kubelet_reads_them() {
        // kubectl's own names never reach a kubelet; the kubelet ignores them, and so do we.
        let e = StreamRequest::parse("/exec/ns/web/main", "command=ls&stdout=true&stderr=true")
            .unwrap_err();
        assert_eq!(
            e,
            Refusal(
                400,
                "you must specify at least 1 of stdin, stdout, stderr".into()
            )
        );
        // Only `1` is true (`FormValue(…) == "1"`); the first value counts.
        assert!(StreamRequest::parse("/exec/ns/web/main", "command=ls&output=true").is_err());
        assert!(StreamRequest::parse("/exec/ns/web/main", "command=ls&output=0&output=1").is_err());
        assert_eq!(
            StreamRequest::parse("/exec/ns/web/main", "error=1")
                .unwrap_err()
                .0,
            400,
            "exec needs a command"
        );
        for p in [
            "/exec/ns/web",
            "/exec/ns//c",
            "/containerLogs/ns/p/c",
            "/exec/a/b/c/d/e",
        ] {
            assert_eq!(
                StreamRequest::parse(p, "output=1&command=x").unwrap_err().0,
                404,
                "{p}"
            );
        }
    }

    #[test]
    fn errors_are_http_responses() {
        let raw = error_response(&Refusal(500, "container not found (\"x\")".into()));
        let (head, used) = kubeedge_shared::stream::http::parse_response_head(&raw)
            .unwrap()
            .unwrap();
        assert_eq!(
            (head.status, head.reason.as_str()),
            (500, "Internal Server Error")
        );
        assert_eq!(&raw[used..], b"container not found (\"x\")\n");
        assert_eq!(head.header("content-length"), Some("26"));
    }

    #[test]
    fn streaming_urls() {
        assert_eq!(
            split_url("http://127.0.0.1:3456/exec/AbC"),
            Some(("127.0.0.1:3456".into(), "/exec/AbC".into()))
        );
        assert_eq!(
            split_url("http://[::1]:1"),
            Some(("[::1]:1".into(), "/".into()))
        );
        assert_eq!(split_url("https://x/y"), None);
        assert_eq!(split_url("http:///y"), None);
    }
}

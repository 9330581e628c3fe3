//! METRIC_CONNECT: the kubelet's `/stats/summary`, `/metrics/resource` and `/metrics` for
//! this node. KubeEdge's edge (`EdgedMetricsConnection`) GETs the URL from edged's server and
//! sends the response **body only**, line by line with `\n` after each line (the status
//! line and headers never cross the tunnel; the cloud has already answered 200), then
//! REMOVE_CONNECT. The body is produced in-process here and sent the same way, several
//! lines per DATA frame.

use super::sender::TunnelSender;
use kubeedge_edged::stats::StatsProvider;
use kubeedge_edged::stats::resource;
use kubeedge_shared::stream::{self, Connector};
use std::sync::Arc;
use tokio_util::sync::CancellationToken;

/// Bytes per DATA frame (whole lines where they fit).
const CHUNK: usize = 32 * 1024;

/// What the kubelet answers on `path` (`None`: its 404 text).
pub async fn body(stats: &StatsProvider, path: &str, raw_query: &str) -> Option<Vec<u8>> {
    match path.trim_end_matches('/') {
        "/stats/summary" => {
            let only = stream::parse_query(raw_query)
                .iter()
                .any(|(k, v)| k == "only_cpu_and_memory" && v == "true");
            let summary = stats.snapshot().await.to_summary(only);
            serde_json::to_vec(&summary).ok()
        }
        "/metrics/resource" => Some(resource::render(&stats.snapshot().await).into_bytes()),
        "/metrics" => {
            let mut text = resource::render_kubelet(&stats.snapshot().await);
            stats.status_reports().render(&mut text);
            Some(text.into_bytes())
        }
        _ => None,
    }
}

/// `body` as KubeEdge's edge sends it: every line ends with `\n`, cut into DATA-sized
/// pieces at line ends (a longer line is cut where it must).
pub fn frames(body: &[u8]) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = Vec::new();
    let mut cur = Vec::new();
    let lines = body.strip_suffix(b"\n").unwrap_or(body);
    if body.is_empty() {
        return out;
    }
    for line in lines.split(|b| *b == b'\n') {
        if !cur.is_empty() && cur.len() + line.len() + 1 > CHUNK {
            out.push(std::mem::take(&mut cur));
        }
        cur.extend_from_slice(line);
        cur.push(b'\n');
        while cur.len() > CHUNK {
            let rest = cur.split_off(CHUNK);
            out.push(std::mem::replace(&mut cur, rest));
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

pub async fn serve(
    id: u64,
    connector: Connector,
    stats: Arc<StatsProvider>,
    tunnel: TunnelSender,
    cancel: CancellationToken,
) {
    let path = connector.url.path.clone();
    let answer = tokio::select! {
        _ = cancel.cancelled() => return,
        b = body(&stats, &path, &connector.url.raw_query) => b,
    };
    let body = answer.unwrap_or_else(|| {
        tracing::info!(id, %path, "metrics request for an unsupported path");
        b"404 page not found\n".to_vec()
    });
    tracing::debug!(id, %path, bytes = body.len(), "metrics answered");
    for chunk in frames(&body) {
        if !tunnel.data(id, chunk, &cancel).await {
            return;
        }
    }
    tunnel.finish(id, &cancel).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_go_line_by_line_with_a_final_newline() {
        assert_eq!(frames(b"{\"a\":1}"), vec![b"{\"a\":1}\n".to_vec()]);
        assert_eq!(frames(b"a\nb\n"), vec![b"a\nb\n".to_vec()]);
        assert!(frames(b"").is_empty());
        // Many lines share frames, and no frame ends inside a line that fits.
        let body: Vec<u8> = (0..10_000)
            .flat_map(|i| format!("metric_{i} 1\n").into_bytes())
            .collect();
        let f = frames(&body);
        assert!(f.len() > 1 && f.iter().all(|c| c.len() <= CHUNK && c.ends_with(b"\n")));
        assert_eq!(f.concat(), body);
        // A line longer than a frame is cut.
        let long = vec![b'x'; CHUNK * 2 + 5];
        let f = frames(&long);
        assert_eq!(f.len(), 3);
        assert_eq!(f.concat().len(), long.len() + 1);
    }
}

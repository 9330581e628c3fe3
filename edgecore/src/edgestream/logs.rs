//! LOGS_CONNECT: `GET /containerLogs/{ns}/{pod}/{container}?…` answered from the container's
//! CRI log file (the newest container of that name, or the one before it with `previous`),
//! as DATA frames; `follow` keeps reading as the file grows (and across rotation) until the
//! container stops or the cloud sends REMOVE_CONNECT. Errors are sent as text, as the
//! kubelet's HTTP error body would be through KubeEdge's tunnel.

use super::crilog::{Decoder, LogOptions, tail_start};
use super::sender::TunnelSender;
use kubeedge_edged::cri::api;
use kubeedge_edged::cri::runtime::{
    LABEL_CONTAINER_NAME, LABEL_POD_NAME, LABEL_POD_NAMESPACE, Runtime,
};
use kubeedge_shared::stream::Connector;
use std::collections::HashMap;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tokio_util::sync::CancellationToken;

/// Bytes per DATA frame.
const CHUNK: usize = 32 * 1024;
/// How often a followed log is checked for growth.
const POLL: Duration = Duration::from_millis(200);
/// How often a followed container is checked for still running.
const STATE_CHECK: Duration = Duration::from_secs(1);

pub async fn serve(
    id: u64,
    connector: Connector,
    runtime: Runtime,
    tunnel: TunnelSender,
    cancel: CancellationToken,
) {
    let out = Out {
        id,
        tunnel: &tunnel,
        cancel: &cancel,
    };
    if let Err(msg) = stream_logs(&connector, &runtime, &out).await {
        tracing::info!(id, path = %connector.url.path, error = %msg, "container logs request failed");
        out.data(format!("{msg}\n").into_bytes()).await;
    }
    tunnel.finish(id, &cancel).await;
}

struct Out<'a> {
    id: u64,
    tunnel: &'a TunnelSender,
    cancel: &'a CancellationToken,
}

impl Out<'_> {
    /// Sends `data` as DATA frames; false once the connection is gone.
    async fn data(&self, data: Vec<u8>) -> bool {
        for chunk in data.chunks(CHUNK) {
            if !self.tunnel.data(self.id, chunk.to_vec(), self.cancel).await {
                return false;
            }
        }
        true
    }
}

/// The parts of `/containerLogs/{ns}/{pod}/{container}`.
pub fn parse_path(path: &str) -> Option<(String, String, String)> {
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    match parts.as_slice() {
        ["containerLogs", ns, pod, c] if !ns.is_empty() && !pod.is_empty() && !c.is_empty() => {
            Some((ns.to_string(), pod.to_string(), c.to_string()))
        }
        _ => None,
    }
}

async fn find_container(
    runtime: &Runtime,
    ns: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<String, String> {
    let selector = HashMap::from([
        (LABEL_POD_NAMESPACE.to_string(), ns.to_string()),
        (LABEL_POD_NAME.to_string(), pod.to_string()),
        (LABEL_CONTAINER_NAME.to_string(), container.to_string()),
    ]);
    let mut found = runtime
        .list_containers(selector)
        .await
        .map_err(|e| format!("listing containers of pod {ns}/{pod}: {e}"))?;
    found.sort_by_key(|c| std::cmp::Reverse(c.created_at));
    let pick = if previous {
        found.get(1)
    } else {
        found.first()
    };
    match pick {
        Some(c) => Ok(c.id.clone()),
        None if previous => Err(format!(
            "previous terminated container \"{container}\" in pod \"{pod}\" not found"
        )),
        None => Err(format!(
            "container \"{container}\" in pod \"{pod}\" is waiting to start: no container has been created on this node yet"
        )),
    }
}

async fn stream_logs(c: &Connector, runtime: &Runtime, out: &Out<'_>) -> Result<(), String> {
    let (ns, pod, container) =
        parse_path(&c.url.path).ok_or_else(|| format!("unsupported path {}", c.url.path))?;
    let opts = LogOptions::from_query(&c.url.raw_query, SystemTime::now())?;
    let id = find_container(runtime, &ns, &pod, &container, opts.previous).await?;
    let status = runtime
        .container_status(&id)
        .await
        .map_err(|e| format!("container status of {container}: {e}"))?
        .ok_or_else(|| format!("container \"{container}\" in pod \"{pod}\" is gone"))?;
    if status.log_path.is_empty() {
        return Err(format!(
            "container \"{container}\" in pod \"{pod}\" has no log file"
        ));
    }
    let path = PathBuf::from(&status.log_path);
    let follow = opts.follow && !opts.previous;
    let tail = opts.tail_lines;
    let mut decoder = Decoder::new(opts);
    let mut file = open(&path)?;
    if let Some(n) = tail {
        let content = read_tail(&mut file, n, CHUNK as u64)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        let mut buf = Vec::new();
        decoder.feed(&content, &mut buf);
        if !out.data(buf).await || decoder.exhausted() {
            return Ok(());
        }
    } else if !drain(&path, &mut file, &mut decoder, out).await? {
        return Ok(());
    }
    if !follow {
        return Ok(());
    }
    follow_file(&path, file, &id, runtime, &mut decoder, out).await
}

/// The last `n` lines of `file`, read backwards from its end in growing windows (memory
/// follows the lines asked for, not the file: containerLogMaxSize may be 0, no rotation);
/// leaves the file positioned at the end it read to.
fn read_tail(file: &mut std::fs::File, n: usize, first_window: u64) -> std::io::Result<Vec<u8>> {
    let end = file.seek(SeekFrom::End(0))?;
    let mut window = first_window.max(1);
    loop {
        let start = end.saturating_sub(window);
        file.seek(SeekFrom::Start(start))?;
        let mut content = Vec::new();
        file.by_ref().take(end - start).read_to_end(&mut content)?;
        let from = tail_start(&content, n);
        // With fewer than `n` line ends in the window its first line may be cut: widen it.
        if start == 0 || from > 0 || n == 0 {
            content.drain(..from);
            return Ok(content);
        }
        window = window.saturating_mul(2);
    }
}

/// Sends what `file` holds from its position to its end, chunk by chunk; false when the
/// connection is gone or `limitBytes` is reached.
async fn drain(
    path: &Path,
    file: &mut std::fs::File,
    decoder: &mut Decoder,
    out: &Out<'_>,
) -> Result<bool, String> {
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n == 0 {
            return Ok(true);
        }
        let mut buf = Vec::new();
        decoder.feed(&chunk[..n], &mut buf);
        if !out.data(buf).await || decoder.exhausted() {
            return Ok(false);
        }
    }
}

/// How long a rotated file may keep growing after the reader moved on.
const SETTLE_MAX: Duration = Duration::from_secs(5);
/// How long a rotated file must stay unchanged when its writers cannot be checked.
const SETTLE_QUIET: Duration = Duration::from_millis(500);
const SETTLE_POLL: Duration = Duration::from_millis(20);

/// Reads a rotated `file` to its real end: containerd's old logger writes what it buffered
/// after the new file exists and only then closes the old one. Waits while the file is
/// still open for writing (or, where that cannot be checked, until it stayed unchanged for
/// [`SETTLE_QUIET`]), at most [`SETTLE_MAX`]. False when the connection is gone.
async fn finish(
    path: &Path,
    file: &mut std::fs::File,
    decoder: &mut Decoder,
    out: &Out<'_>,
) -> Result<bool, String> {
    let start = tokio::time::Instant::now();
    let mut quiet_since = start;
    loop {
        let before = file.stream_position().unwrap_or(0);
        if !drain(path, file, decoder, out).await? {
            return Ok(false);
        }
        let now = tokio::time::Instant::now();
        if file.stream_position().unwrap_or(0) != before {
            quiet_since = now;
        }
        let settled = match open_for_writing(file) {
            Some(writing) => !writing,
            None => now.duration_since(quiet_since) >= SETTLE_QUIET,
        };
        if settled || now.duration_since(start) >= SETTLE_MAX {
            // One last read: the writer may have closed right after its last write.
            return drain(path, file, decoder, out).await;
        }
        tokio::select! {
            _ = out.cancel.cancelled() => return Ok(false),
            _ = tokio::time::sleep(SETTLE_POLL) => {}
        }
    }
}

/// Whether any process holds `file` open for writing, from whether a read lease can be
/// taken (Linux grants one only then); None where leases are not allowed (not the file's
/// owner, leases disabled).
fn open_for_writing(file: &std::fs::File) -> Option<bool> {
    use std::os::fd::AsRawFd;
    let fd = file.as_raw_fd();
    // SAFETY: fcntl on a descriptor this function borrows; F_SETLEASE takes an int.
    let rc = unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_RDLCK) };
    if rc == 0 {
        // SAFETY: as above; releases the lease just taken.
        unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) };
        return Some(false);
    }
    match std::io::Error::last_os_error().raw_os_error() {
        Some(libc::EAGAIN) => Some(true),
        _ => None,
    }
}

/// Rotated files of `log` newer than the one with inode `old` (all of them when it was
/// already removed: the oldest go first), except the current file's inode `current`.
fn rotated_after(log: &Path, old: u64, current: u64) -> Vec<PathBuf> {
    let files: Vec<(PathBuf, u64)> = kubeedge_edged::logs::rotated_files(log)
        .into_iter()
        .filter_map(|p| {
            let ino = std::fs::metadata(&p).ok()?.ino();
            Some((p, ino))
        })
        .collect();
    let from = files
        .iter()
        .position(|(_, ino)| *ino == old)
        .map_or(0, |i| i + 1);
    files
        .into_iter()
        .skip(from)
        .filter(|(_, ino)| *ino != current && *ino != old)
        .map(|(p, _)| p)
        .collect()
}

fn open(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::open(path).map_err(|e| format!("opening {}: {e}", path.display()))
}

async fn follow_file(
    path: &Path,
    mut file: std::fs::File,
    id: &str,
    runtime: &Runtime,
    decoder: &mut Decoder,
    out: &Out<'_>,
) -> Result<(), String> {
    let mut last_check = tokio::time::Instant::now();
    let mut running = true;
    let mut chunk = vec![0u8; CHUNK];
    loop {
        let n = file
            .read(&mut chunk)
            .map_err(|e| format!("reading {}: {e}", path.display()))?;
        if n > 0 {
            let mut buf = Vec::new();
            decoder.feed(&chunk[..n], &mut buf);
            if !out.data(buf).await || decoder.exhausted() {
                return Ok(());
            }
            continue;
        }
        // At the end of the file: rotated (a new file at the path), stopped, or idle.
        // Truncation is judged against what was read, not the open file's size: the runtime
        // appends between two stat calls, and the file at the path then looks shorter.
        let read_to = file.stream_position().unwrap_or(0);
        let rotated = match (std::fs::metadata(path), file.metadata()) {
            (Ok(now), Ok(ours)) => {
                (now.ino() != ours.ino() || now.len() < read_to).then_some((ours.ino(), now.ino()))
            }
            _ => None,
        };
        if let Some((old_ino, new_ino)) = rotated
            && let Ok(mut f) = std::fs::File::open(path)
        {
            // Lines the runtime's old logger still holds land in the old file after the
            // new one exists: finish it, then any file rotated after it that this reader
            // never saw (it fell behind by more than one rotation), then the new file.
            if !finish(path, &mut file, decoder, out).await? {
                return Ok(());
            }
            if old_ino != new_ino {
                for p in rotated_after(path, old_ino, new_ino) {
                    let Ok(mut g) = std::fs::File::open(&p) else {
                        continue;
                    };
                    if !finish(&p, &mut g, decoder, out).await? {
                        return Ok(());
                    }
                }
            }
            if f.seek(SeekFrom::Start(0)).is_ok() {
                file = f;
                continue;
            }
        }
        if !running {
            return Ok(());
        }
        tokio::select! {
            _ = out.cancel.cancelled() => return Ok(()),
            _ = tokio::time::sleep(POLL) => {}
        }
        if last_check.elapsed() >= STATE_CHECK {
            last_check = tokio::time::Instant::now();
            running = matches!(
                runtime.container_status(id).await,
                Ok(Some(s)) if s.state() == api::ContainerState::ContainerRunning
            );
            // One more read after the container stopped picks up its last lines.
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_reads_back_only_as_far_as_needed() {
        let dir = std::env::temp_dir().join(format!("edgestream-tail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("0.log");
        let lines: Vec<String> = (0..500).map(|i| format!("line {i:03}\n")).collect();
        std::fs::write(&path, lines.concat()).unwrap();
        for (n, window) in [
            (3usize, 4u64),
            (3, 1 << 20),
            (120, 16),
            (500, 7),
            (900, 5),
            (0, 4),
        ] {
            let mut f = std::fs::File::open(&path).unwrap();
            let got = read_tail(&mut f, n, window).unwrap();
            let want = lines[lines.len().saturating_sub(n)..].concat();
            assert_eq!(
                String::from_utf8(got).unwrap(),
                want,
                "n={n} window={window}"
            );
            assert_eq!(
                f.stream_position().unwrap(),
                500 * 9,
                "positioned at the end"
            );
        }
        std::fs::write(&path, "no newline at the end").unwrap();
        let mut f = std::fs::File::open(&path).unwrap();
        assert_eq!(read_tail(&mut f, 1, 4).unwrap(), b"no newline at the end");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rotated_files_left_to_read_and_their_writers() {
        let tmp = tempfile::tempdir().unwrap();
        let log = tmp.path().join("0.log");
        let ino = |p: &Path| std::fs::metadata(p).unwrap().ino();
        for s in [
            "20240101-000000.1",
            "20240101-000000.2",
            "20240101-000000.3",
        ] {
            std::fs::write(tmp.path().join(format!("0.log.{s}")), s).unwrap();
        }
        std::fs::write(&log, "current").unwrap();
        let first = tmp.path().join("0.log.20240101-000000.1");
        let names = |v: Vec<PathBuf>| -> Vec<String> {
            v.iter()
                .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
                .collect()
        };
        assert_eq!(
            names(rotated_after(&log, ino(&first), ino(&log))),
            ["0.log.20240101-000000.2", "0.log.20240101-000000.3"]
        );
        let last = tmp.path().join("0.log.20240101-000000.3");
        assert!(rotated_after(&log, ino(&last), ino(&log)).is_empty());
        // The file being read was removed already: every rotated file is newer.
        assert_eq!(rotated_after(&log, u64::MAX, ino(&log)).len(), 3);

        let writer = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
        let reader = std::fs::File::open(&log).unwrap();
        // Leases need the file's owner (or CAP_LEASE): None is allowed, a wrong answer not.
        if let Some(open) = open_for_writing(&reader) {
            assert!(open, "a writer holds the file");
            drop(writer);
            assert_eq!(open_for_writing(&reader), Some(false), "the writer is gone");
        }
    }

    #[test]
    fn paths() {
        assert_eq!(
            parse_path("/containerLogs/ns/p/c"),
            Some(("ns".into(), "p".into(), "c".into()))
        );
        assert_eq!(parse_path("/containerLogs/ns/p"), None);
        assert_eq!(parse_path("/containerLogs/ns//c"), None);
        assert_eq!(parse_path("/exec/ns/p/c"), None);
    }
}

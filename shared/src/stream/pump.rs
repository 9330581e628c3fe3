//! Moving bytes between a local stream and one tunnel connection, both directions at once.
//!
//! Each direction is its own loop, polled together: a write that waits (the local side not
//! reading yet) never stops the other direction. With one loop that awaits writes inside
//! its `select!`, two peers that both send more than their buffers hold — an echo, a
//! port-forward, a relayed upload — each wait for the other to read, and the connection
//! stalls until a watchdog drops it.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;

/// Why a pump ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The local stream reached its end or failed.
    Local,
    /// The tunnel side ended the connection (its channel closed) or writing locally failed.
    Remote,
    /// The tunnel could not take more (closed).
    TunnelClosed,
    /// Nothing moved either way for the idle limit.
    Idle,
}

impl Ended {
    pub fn as_str(self) -> &'static str {
        match self {
            Ended::Local => "local side ended",
            Ended::Remote => "remote side ended",
            Ended::TunnelClosed => "tunnel closed",
            Ended::Idle => "idle",
        }
    }
}

/// Bytes per message read from the local stream.
pub const CHUNK: usize = 32 * 1024;

/// Pumps until either side ends or nothing moves for `idle`: `first` then what arrives on
/// `from_tunnel` is written to `io`; what `io` yields is handed to `to_tunnel` (false: the
/// tunnel is gone). Counts bytes in `moved` (both directions).
pub async fn duplex<S, F, Fut>(
    io: S,
    first: Vec<u8>,
    from_tunnel: &mut mpsc::Receiver<Vec<u8>>,
    mut to_tunnel: F,
    idle: Duration,
    moved: &AtomicU64,
) -> Ended
where
    S: AsyncRead + AsyncWrite + Unpin,
    F: FnMut(Vec<u8>) -> Fut,
    Fut: Future<Output = bool>,
{
    let start = Instant::now();
    // Milliseconds since `start` of the last byte moved.
    let last = AtomicU64::new(0);
    let touch = |n: usize| {
        moved.fetch_add(n as u64, Ordering::Relaxed);
        last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
    };
    let (mut r, mut w) = tokio::io::split(io);
    let inbound = async {
        if !first.is_empty() && w.write_all(&first).await.is_err() {
            return Ended::Remote;
        }
        while let Some(chunk) = from_tunnel.recv().await {
            touch(chunk.len());
            if w.write_all(&chunk).await.is_err() {
                return Ended::Remote;
            }
        }
        let _ = w.shutdown().await;
        Ended::Remote
    };
    let outbound = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            match r.read(&mut buf).await {
                Ok(0) | Err(_) => return Ended::Local,
                Ok(n) => {
                    touch(n);
                    if !to_tunnel(buf[..n].to_vec()).await {
                        return Ended::TunnelClosed;
                    }
                }
            }
        }
    };
    let watchdog = async {
        let tick = (idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(5));
        loop {
            tokio::time::sleep(tick).await;
            let since = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
            if Duration::from_millis(since) >= idle {
                return Ended::Idle;
            }
        }
    };
    tokio::select! {
        e = inbound => e,
        e = outbound => e,
        e = watchdog => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn both_directions_move_at_once_beyond_every_buffer() {
        // The local side is an echo of 8 MB: it writes back while we still write to it, so a
        // single-loop pump would stall with both sides' buffers full.
        let (local, mut peer) = tokio::io::duplex(64 * 1024);
        let echo = tokio::spawn(async move {
            let (mut r, mut w) = tokio::io::split(&mut peer);
            tokio::io::copy(&mut r, &mut w).await.unwrap_or(0)
        });
        let (to_local, mut from_tunnel) = mpsc::channel::<Vec<u8>>(4);
        let (back_tx, mut back_rx) = mpsc::channel::<Vec<u8>>(4);
        let total = 8 << 20;
        let sender = tokio::spawn(async move {
            let chunk = vec![5u8; 64 * 1024];
            let mut sent = 0;
            while sent < total {
                to_local.send(chunk.clone()).await.unwrap();
                sent += chunk.len();
            }
            // The tunnel side stays open (closing it ends the connection).
            to_local
        });
        let receiver = tokio::spawn(async move {
            let mut got = 0;
            while got < total {
                got += back_rx.recv().await.unwrap().len();
            }
            got
        });
        let moved = AtomicU64::new(0);
        let pump = duplex(
            local,
            Vec::new(),
            &mut from_tunnel,
            |c| {
                let tx = back_tx.clone();
                async move { tx.send(c).await.is_ok() }
            },
            Duration::from_secs(5),
            &moved,
        );
        let received = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::select! {
                e = pump => panic!("the pump ended early: {e:?}"),
                r = receiver => r.unwrap(),
            }
        })
        .await
        .expect("no stall");
        assert_eq!(received, total);
        drop(sender.await.unwrap());
        assert!(moved.load(Ordering::Relaxed) >= 2 * total as u64);
        drop(echo);
    }

    #[tokio::test]
    async fn an_idle_connection_ends_and_a_closed_tunnel_side_ends_it() {
        let (local, _peer) = tokio::io::duplex(1024);
        let (_tx, mut rx) = mpsc::channel::<Vec<u8>>(1);
        let moved = AtomicU64::new(0);
        let e = duplex(
            local,
            Vec::new(),
            &mut rx,
            |_| async { true },
            Duration::from_millis(50),
            &moved,
        )
        .await;
        assert_eq!(e, Ended::Idle);
        let (local, _peer) = tokio::io::duplex(1024);
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(1);
        drop(tx);
        let e = duplex(
            local,
            b"first".to_vec(),
            &mut rx,
            |_| async { true },
            Duration::from_secs(5),
            &moved,
        )
        .await;
        assert_eq!(e, Ended::Remote);
    }
}

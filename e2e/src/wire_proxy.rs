//! A TCP pass-through that counts what crosses it on the wire (`kubeedge_shared::wire`: payload
//! with TLS and all, plus IP/TCP headers of every segment, pure ACKs included), measured on
//! the sockets facing the dialling client — the link a client such as an edge is billed for.
//! Used by `bench-idle` between edgecore and cloudhub, and between cloudcore and the API
//! server.

use kubeedge_shared::wire::{self, Counts, Flow};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;

/// Bytes through a [`CountingProxy`] since it started, per direction.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WireTotals {
    /// From the dialling client to the upstream.
    pub to_upstream: u64,
    /// From the upstream back to the client.
    pub to_client: u64,
    /// Of those, the payload (TLS records as sent) and the segments.
    pub to_upstream_flow: Flow,
    pub to_client_flow: Flow,
    pub connections: u64,
}

impl WireTotals {
    pub fn since(&self, earlier: &WireTotals) -> WireTotals {
        WireTotals {
            to_upstream: self.to_upstream.saturating_sub(earlier.to_upstream),
            to_client: self.to_client.saturating_sub(earlier.to_client),
            to_upstream_flow: self
                .to_upstream_flow
                .saturating_sub(earlier.to_upstream_flow),
            to_client_flow: self.to_client_flow.saturating_sub(earlier.to_client_flow),
            connections: self.connections.saturating_sub(earlier.connections),
        }
    }

    fn add(&mut self, c: &Counts) {
        // The client-facing socket receives what goes upstream and sends what comes back.
        self.to_upstream += c.received_bytes();
        self.to_client += c.sent_bytes();
        self.to_upstream_flow += c.received;
        self.to_client_flow += c.sent;
    }
}

#[derive(Default)]
struct Ledger {
    /// Counts of connections that ended.
    closed: WireTotals,
    /// Open client-facing sockets (their counts are read when asked).
    open: Vec<(u64, Arc<TcpStream>)>,
    next: u64,
}

pub struct CountingProxy {
    pub addr: SocketAddr,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
    refuse: Arc<std::sync::atomic::AtomicBool>,
}

impl CountingProxy {
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<CountingProxy> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let ledger = Arc::new(Mutex::new(Ledger::default()));
        let stop = CancellationToken::new();
        let refuse = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (l, s, r) = (ledger.clone(), stop.clone(), refuse.clone());
        tokio::spawn(async move {
            loop {
                let (client, _) = tokio::select! {
                    _ = s.cancelled() => break,
                    r = listener.accept() => match r { Ok(c) => c, Err(_) => continue },
                };
                if r.load(std::sync::atomic::Ordering::SeqCst) {
                    drop(client);
                    continue;
                }
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                // As the peers set it on their own sockets: no Nagle delays added here.
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                tokio::spawn(relay(client, server, l.clone(), s.clone()));
            }
        });
        Ok(CountingProxy {
            addr,
            ledger,
            stop,
            refuse,
        })
    }

    /// While on, new connections are closed at once; open ones keep flowing (a peer that
    /// restarts cannot come back).
    pub fn refuse_new(&self, on: bool) {
        self.refuse.store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Everything so far: closed connections and the open ones as of now.
    pub fn totals(&self) -> WireTotals {
        let ledger = self.ledger.lock().unwrap_or_else(|e| e.into_inner());
        let mut t = ledger.closed;
        for (_, s) in &ledger.open {
            if let Some(c) = wire::counts(&**s) {
                t.add(&c);
            }
        }
        t.connections += ledger.open.len() as u64;
        t
    }
}

impl Drop for CountingProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    ledger: Arc<Mutex<Ledger>>,
    stop: CancellationToken,
) {
    let client = Arc::new(client);
    let id = {
        let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
        l.next += 1;
        let id = l.next;
        l.open.push((id, client.clone()));
        id
    };
    let server = Arc::new(server);
    // Each direction on its own: a read that waits never holds up the other way.
    let copy = |from: Arc<TcpStream>, to: Arc<TcpStream>| async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            if from.readable().await.is_err() {
                return;
            }
            let n = match from.try_read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                Err(_) => return,
            };
            let mut rest = &buf[..n];
            while !rest.is_empty() {
                if to.writable().await.is_err() {
                    return;
                }
                match to.try_write(rest) {
                    Ok(w) => rest = &rest[w..],
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(_) => return,
                }
            }
        }
    };
    tokio::select! {
        _ = stop.cancelled() => {}
        _ = copy(client.clone(), server.clone()) => {}
        _ = copy(server.clone(), client.clone()) => {}
    }
    let mut l = ledger.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = wire::counts(&*client) {
        l.closed.add(&c);
    }
    l.closed.connections += 1;
    l.open.retain(|(i, _)| *i != id);
    // Dropping the last references closes both sockets.
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn bytes_through_the_proxy_are_counted_per_direction() {
        let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let proxy = CountingProxy::start(upstream.local_addr().unwrap())
            .await
            .unwrap();
        let mut client = TcpStream::connect(proxy.addr).await.unwrap();
        let (mut server, _) = upstream.accept().await.unwrap();
        client.write_all(&[1u8; 3000]).await.unwrap();
        let mut buf = vec![0u8; 3000];
        server.read_exact(&mut buf).await.unwrap();
        server.write_all(&[2u8; 100]).await.unwrap();
        client.read_exact(&mut buf[..100]).await.unwrap();
        let t = proxy.totals();
        assert_eq!(t.to_upstream_flow.payload, 3000, "{t:?}");
        assert_eq!(t.to_client_flow.payload, 100, "{t:?}");
        assert!(t.to_upstream > 3000 && t.to_client > 100, "{t:?}");
        assert_eq!(t.connections, 1);
        drop(client);
        drop(server);
        // Closed connections keep their counts.
        for _ in 0..100 {
            if proxy.ledger.lock().unwrap().open.is_empty() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let after = proxy.totals();
        assert!(after.to_upstream_flow.payload >= 3000, "{after:?}");
        assert_eq!(after.connections, 1);
    }
}

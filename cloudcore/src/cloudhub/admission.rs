//! Admission of edge handshakes: a bounded number at a time, a bounded share per address.
//!
//! When thousands of edges dial at once (cloudcore restarted, a network came back), starting
//! every TLS handshake at once shares the CPU among all of them: each then takes longer than
//! the edge's and cloudhub's time-outs, both give up, the edges redial and the work is done
//! again — a congestion collapse in which almost no edge gets through (seen with 16,000 edges
//! per replica on two cores). With admission the handshakes past the limit wait in the accept
//! path, holding a socket and nothing else, and every admitted one finishes in milliseconds.
//!
//! A slot is only taken once the peer has sent its first bytes (its ClientHello), so a silent
//! connection never holds one, and an admitted handshake has its own short deadline
//! ([`super::HubConfig::admitted_handshake_timeout`]), so a peer that starts and stalls holds
//! its slot that long at most. One address holds at most a quarter of the slots, so a few
//! stalling peers cannot take them all (edges behind one NAT still get a quarter).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The share of the slots one address may hold at once: `max(1, slots / PEER_SHARE)`.
const PEER_SHARE: usize = 4;

pub(crate) struct Admission {
    slots: Arc<Semaphore>,
    per_peer: usize,
    /// Per address: its share, and how many connections hold or await a place in it.
    peers: Mutex<HashMap<IpAddr, (Arc<Semaphore>, usize)>>,
}

/// A handshake's place in the limits, given back on drop.
pub(crate) struct Admitted {
    _slot: Option<OwnedSemaphorePermit>,
    _peer: PeerShare,
}

/// One connection's claim on its address's share (held or awaited); the address's entry goes
/// with its last claim.
struct PeerShare {
    admission: Arc<Admission>,
    ip: IpAddr,
    permit: Option<OwnedSemaphorePermit>,
}

impl Drop for PeerShare {
    fn drop(&mut self) {
        self.permit.take();
        let mut peers = self.admission.lock_peers();
        if let Some((_, claims)) = peers.get_mut(&self.ip) {
            *claims = claims.saturating_sub(1);
            if *claims == 0 {
                peers.remove(&self.ip);
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(slots: usize) -> Arc<Self> {
        let slots = slots.max(1);
        Arc::new(Admission {
            slots: Arc::new(Semaphore::new(slots)),
            per_peer: (slots / PEER_SHARE).max(1),
            peers: Mutex::new(HashMap::new()),
        })
    }

    fn lock_peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, (Arc<Semaphore>, usize)>> {
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits (in arrival order) until `ip` is below its share and a slot is free.
    pub(crate) async fn admit(self: &Arc<Self>, ip: IpAddr) -> Admitted {
        let sem = {
            let mut peers = self.lock_peers();
            let (sem, claims) = peers
                .entry(ip)
                .or_insert_with(|| (Arc::new(Semaphore::new(self.per_peer)), 0));
            *claims += 1;
            sem.clone()
        };
        // Made before the first wait: a connection that gives up waiting drops its claim.
        let mut share = PeerShare {
            admission: self.clone(),
            ip,
            permit: None,
        };
        // The semaphores are never closed, so acquiring cannot fail.
        share.permit = sem.acquire_owned().await.ok();
        let slot = self.slots.clone().acquire_owned().await.ok();
        Admitted {
            _slot: slot,
            _peer: share,
        }
    }

    /// Slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.slots.available_permits()
    }

    /// Addresses holding or awaiting a place.
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.lock_peers().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    async fn pending<F: std::future::Future>(f: F) -> bool {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .is_err()
    }

    #[tokio::test]
    async fn at_most_the_slots_are_held_at_once_and_a_release_admits_the_next() {
        let a = Admission::new(8);
        let mut held = Vec::new();
        for k in 0..8 {
            // Two per address: the share is 8 / 4.
            held.push(a.admit(ip(k / 2)).await);
        }
        assert_eq!(a.free(), 0);
        assert!(pending(a.admit(ip(100))).await, "a ninth handshake started");
        held.pop();
        let next = tokio::time::timeout(Duration::from_secs(1), a.admit(ip(100))).await;
        assert!(next.is_ok(), "a released slot was not given to the next");
    }

    #[tokio::test]
    async fn one_address_holds_at_most_its_share_while_others_get_in() {
        let a = Admission::new(8);
        let mine = [a.admit(ip(1)).await, a.admit(ip(1)).await];
        assert!(
            pending(a.admit(ip(1))).await,
            "an address got more than its share"
        );
        let other = tokio::time::timeout(Duration::from_secs(1), a.admit(ip(2))).await;
        assert!(other.is_ok(), "another address waited behind a full share");
        assert_eq!(a.free(), 5);
        drop(mine);
        drop(other);
        assert_eq!(a.free(), 8);
    }

    #[tokio::test]
    async fn addresses_are_forgotten_when_their_last_connection_goes_also_while_waiting() {
        let a = Admission::new(4);
        let first = a.admit(ip(1)).await;
        // A second connection from the same address gives up while waiting (its deadline).
        assert!(pending(a.admit(ip(1))).await);
        assert_eq!(a.addresses(), 1);
        drop(first);
        assert_eq!(a.addresses(), 0, "a gone address is still remembered");
        assert_eq!(a.free(), 4);
        // And it may come back.
        let again = tokio::time::timeout(Duration::from_secs(1), a.admit(ip(1))).await;
        assert!(again.is_ok());
    }
}

//! Admission of edge handshakes: a bounded number at a time, a bounded share per address,
//! newest first.
//!
//! When thousands of edges dial at once (cloudcore restarted, a network came back), starting
//! every TLS handshake at once shares the CPU among all of them: each then takes longer than
//! the edge's and cloudhub's time-outs, both give up, the edges redial and the work is done
//! again — a congestion collapse in which almost no edge gets through (seen with 16,000 edges
//! per replica on two cores). With admission the handshakes past the limit wait in the accept
//! path, holding a socket and nothing else, and every admitted one finishes quickly.
//!
//! The newest waiting connection is admitted first. Under overload the oldest waiters are the
//! ones whose edge has given up or soon will (an edge waits 30 s for its handshake, counted
//! from its dial, which may have been a while before cloudhub accepted it): serving them in
//! arrival order spends the CPU on handshakes nobody is waiting for any more, while serving
//! the newest completes handshakes the edge still wants; the old ones time out (cloudhub's
//! [`super::HubConfig::handshake_timeout`] includes the wait) and redial later, fresh. While
//! the slots keep up, nobody waits and the order does not matter.
//!
//! A slot is only taken once the peer has sent its first bytes (its ClientHello), so a silent
//! connection never holds one, and an admitted handshake has its own short deadline
//! ([`super::HubConfig::admitted_handshake_timeout`]), so a peer that starts and stalls holds
//! its slot that long at most. One address (an IPv6 /64) holds at most a quarter of the
//! slots, so one stalling host cannot take them all (edges behind one NAT still get a
//! quarter); hosts with many addresses can, for 10 s at a time, which delays edges but does
//! not turn them away.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

/// The share of the slots one address may hold at once: `max(1, slots / PEER_SHARE)`.
const PEER_SHARE: usize = 4;

pub(crate) struct Admission {
    slots: usize,
    per_peer: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    held: usize,
    /// Slots held per address (addresses holding none are not kept).
    by_peer: HashMap<IpAddr, usize>,
    /// In arrival order; the newest is last.
    waiting: Vec<Waiter>,
    /// `waiting.len()` after the last sweep of given-up waiters.
    swept_len: usize,
}

struct Waiter {
    ip: IpAddr,
    tx: oneshot::Sender<Admitted>,
}

/// A handshake's slot, given back (to the newest waiter that may take it) on drop.
pub(crate) struct Admitted {
    admission: Arc<Admission>,
    ip: IpAddr,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        self.admission.release(self.ip);
    }
}

/// The address a share is counted for: an IPv6 host has a /64 to pick from, so its /64 is
/// one address; an IPv4-mapped IPv6 address is its IPv4 one.
fn share_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(
                u128::from(v6) & !((1u128 << 64) - 1),
            )),
        },
    }
}

impl State {
    fn may_take(&self, ip: &IpAddr, slots: usize, per_peer: usize) -> bool {
        self.held < slots && self.by_peer.get(ip).copied().unwrap_or(0) < per_peer
    }

    fn take(&mut self, ip: IpAddr) {
        self.held += 1;
        *self.by_peer.entry(ip).or_insert(0) += 1;
    }

    fn give_back(&mut self, ip: IpAddr) {
        self.held = self.held.saturating_sub(1);
        if let Some(n) = self.by_peer.get_mut(&ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.by_peer.remove(&ip);
            }
        }
    }
}

impl Admission {
    pub(crate) fn new(slots: usize) -> Arc<Self> {
        let slots = slots.max(1);
        Arc::new(Admission {
            slots,
            per_peer: (slots / PEER_SHARE).max(1),
            state: Mutex::new(State::default()),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until `ip` is below its share and a slot is free (newest waiter first). A
    /// connection that gives up waiting (its deadline) simply drops the future.
    pub(crate) async fn admit(self: &Arc<Self>, ip: IpAddr) -> Admitted {
        let ip = share_key(ip);
        let rx = {
            let mut s = self.lock();
            if s.may_take(&ip, self.slots, self.per_peer) {
                s.take(ip);
                return Admitted {
                    admission: self.clone(),
                    ip,
                };
            }
            let (tx, rx) = oneshot::channel();
            s.waiting.push(Waiter { ip, tx });
            // Waiters that gave up stay until a release passes them or a sweep: sweep when
            // the list doubled since the last one, so it stays within twice the live waiters.
            if s.waiting.len() >= 2 * s.swept_len.max(64) {
                s.waiting.retain(|w| !w.tx.is_closed());
                s.swept_len = s.waiting.len();
            }
            rx
        };
        match rx.await {
            Ok(admitted) => admitted,
            // Never happens (a waiter is only dropped from the list once given a slot or
            // found closed); wait again rather than run without a slot.
            Err(_) => Box::pin(self.admit(ip)).await,
        }
    }

    /// Gives `ip`'s slot back and hands it to the newest waiter that may take one.
    fn release(self: &Arc<Self>, ip: IpAddr) {
        let next = {
            let mut s = self.lock();
            s.give_back(ip);
            let mut chosen = None;
            let mut k = s.waiting.len();
            while k > 0 && s.held < self.slots {
                k -= 1;
                if s.waiting[k].tx.is_closed() {
                    s.waiting.remove(k);
                    continue;
                }
                let peer = s.waiting[k].ip;
                if s.may_take(&peer, self.slots, self.per_peer) {
                    let w = s.waiting.remove(k);
                    s.take(w.ip);
                    chosen = Some(w);
                    break;
                }
            }
            if s.waiting.len() < s.swept_len {
                s.swept_len = s.waiting.len();
            }
            chosen
        };
        // Outside the lock: a waiter that gave up meanwhile drops the slot, which releases
        // it again (to the next waiter).
        if let Some(w) = next {
            let _ = w.tx.send(Admitted {
                admission: self.clone(),
                ip: w.ip,
            });
        }
    }

    /// Slots free now.
    #[cfg(test)]
    fn free(&self) -> usize {
        self.slots - self.lock().held
    }

    /// Addresses holding a slot.
    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.lock().by_peer.len()
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
        assert_eq!(a.addresses(), 0, "a gone address is still remembered");
    }

    #[tokio::test]
    async fn the_newest_waiter_is_admitted_first_and_given_up_waiters_are_skipped() {
        let a = Admission::new(1);
        let first = a.admit(ip(1)).await;
        let (older, newer, gone) = (a.clone(), a.clone(), a.clone());
        let older = tokio::spawn(async move { older.admit(ip(2)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let newer = tokio::spawn(async move { newer.admit(ip(3)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        // The newest of all gives up (its deadline) before a slot frees.
        assert!(pending(gone.admit(ip(4))).await);
        drop(first);
        let newer = tokio::time::timeout(Duration::from_secs(1), newer)
            .await
            .expect("the newest live waiter was admitted")
            .unwrap();
        assert!(!older.is_finished(), "the older waiter went first");
        drop(newer);
        let older = tokio::time::timeout(Duration::from_secs(1), older).await;
        assert!(older.is_ok(), "the older waiter was not admitted after");
    }

    #[tokio::test]
    async fn a_waiter_that_left_does_not_keep_the_slot() {
        let a = Admission::new(1);
        let first = a.admit(ip(1)).await;
        let waiter = a.clone();
        let left = tokio::spawn(async move { waiter.admit(ip(2)).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        left.abort();
        let _ = left.await;
        drop(first);
        assert_eq!(a.free(), 1, "the slot was lost with the waiter that left");
        let again = tokio::time::timeout(Duration::from_secs(1), a.admit(ip(3))).await;
        assert!(again.is_ok());
    }

    #[tokio::test]
    async fn an_ipv6_64_is_one_address_and_a_mapped_ipv4_is_its_ipv4() {
        let a = Admission::new(4); // one per address
        let v6 = |s: &str| IpAddr::V6(s.parse().unwrap());
        let _one = a.admit(v6("2001:db8:1:2::1")).await;
        assert!(
            pending(a.admit(v6("2001:db8:1:2:ffff::9"))).await,
            "another address of the same /64 got a second slot"
        );
        let other = tokio::time::timeout(Duration::from_secs(1), a.admit(v6("2001:db8:1:3::1")));
        assert!(other.await.is_ok());
        let _v4 = a.admit(IpAddr::from([192, 0, 2, 1])).await;
        assert!(pending(a.admit(v6("::ffff:192.0.2.1"))).await);
    }

    #[tokio::test]
    async fn waiters_that_gave_up_do_not_pile_up() {
        let a = Admission::new(1);
        let _held = a.admit(ip(1)).await;
        for _ in 0..1000 {
            assert!(pending_now(a.admit(ip(2))).await);
        }
        assert!(a.lock().waiting.len() <= 128, "{}", a.lock().waiting.len());
    }

    /// Polls `f` once: true when it did not finish.
    async fn pending_now<F: std::future::Future>(f: F) -> bool {
        let mut f = std::pin::pin!(f);
        futures_util::poll!(f.as_mut()).is_pending()
    }
}

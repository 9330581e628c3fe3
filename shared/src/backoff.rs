//! The one exponential back-off of both binaries: a first delay that doubles after every
//! failure up to a cap, and starts again after a success; optionally jittered (each delay drawn
//! from [d/2, d], so that many peers failing together do not retry together).
//!
//! Used by every retry loop of both binaries (the edge's cloud link, watches and lists, the
//! apiserver calls of the REST targets, ObjectSync writes, ACK retries after their linear
//! start, certificate bootstrap and rotation, the MetaServer's registrations and serving
//! certificate, node registration, the runtime wait, refused pod statuses). Not used for two
//! schedules that are not back-offs: the kubelet's per-container crash-loop delays (edged,
//! keyed by container, with expiry and kubelet's constants) and leader election's retry period
//! with client-go's 1.2 jitter factor.

use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
    jitter: bool,
}

impl Backoff {
    /// Delays `initial`, 2·`initial`, 4·`initial`… up to `max`.
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.min(max);
        Backoff {
            initial,
            max,
            next: initial,
            jitter: false,
        }
    }

    /// Each delay drawn uniformly from [d/2, d].
    pub fn jittered(mut self) -> Backoff {
        self.jitter = true;
        self
    }

    /// The delay to wait now; the next one is twice as long (up to the cap).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = self.next.saturating_mul(2).min(self.max);
        if self.jitter { jitter(d) } else { d }
    }

    /// What [`Backoff::next_delay`] returns next (before jitter).
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// The delay after `failures` failures in a row, for callers that count them per key
    /// (the first delay after one failure).
    pub fn delay_after(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(31);
        let d = self.initial.saturating_mul(1u32 << exp).min(self.max);
        if self.jitter { jitter(d) } else { d }
    }

    /// After a success: the next delay is the first one again.
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

fn jitter(d: Duration) -> Duration {
    use rand::Rng;
    let lo = d / 2;
    let span = d.saturating_sub(lo).as_millis() as u64;
    lo + Duration::from_millis(rand::rng().random_range(0..=span))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_start_again_after_a_reset() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(500));
        let got: Vec<u128> = (0..5).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(got, [100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(100));
        assert_eq!(b.peek(), Duration::from_millis(200));
        let mut capped = Backoff::new(Duration::from_secs(9), Duration::from_secs(2));
        assert_eq!(
            capped.next_delay(),
            Duration::from_secs(2),
            "a first delay over the cap"
        );
    }

    #[test]
    fn jittered_delays_stay_between_half_and_whole() {
        for _ in 0..100 {
            let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30)).jittered();
            let d0 = b.next_delay();
            assert!(d0 >= Duration::from_millis(500) && d0 <= Duration::from_secs(1));
            for _ in 0..10 {
                b.next_delay();
            }
            let big = b.next_delay();
            assert!(big >= Duration::from_secs(15) && big <= Duration::from_secs(30));
        }
    }
}

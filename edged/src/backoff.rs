//! The kubelet's restart back-off (`flowcontrol.Backoff`): the first failure restarts at
//! once; each further failure within the window waits twice as long as the one before, up to
//! a maximum; a key quiet for twice the maximum starts over.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: SystemTime,
}

fn since(later: SystemTime, earlier: SystemTime) -> Duration {
    later.duration_since(earlier).unwrap_or(Duration::ZERO)
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial: initial.max(Duration::from_millis(1)),
            max: max.max(initial),
            entries: HashMap::new(),
        }
    }

    fn expired(&self, e: &Entry, event: SystemTime) -> bool {
        since(event, e.last_update) > self.max * 2
    }

    /// If `key` failed at `event` and must still wait at `now`, how long.
    pub fn remaining(&self, key: &str, event: SystemTime, now: SystemTime) -> Option<Duration> {
        let e = self.entries.get(key)?;
        if self.expired(e, event) {
            return None;
        }
        let waited = since(now, event);
        (waited < e.delay).then(|| e.delay - waited)
    }

    /// Records a restart (after a failure at `event`); the next failure waits longer.
    pub fn next(&mut self, key: &str, event: SystemTime, now: SystemTime) {
        let delay = match self.entries.get(key) {
            Some(e) if !self.expired(e, event) => (e.delay * 2).min(self.max),
            _ => self.initial,
        };
        self.entries.insert(
            key.to_string(),
            Entry {
                delay,
                last_update: now,
            },
        );
    }

    /// The delay the next failure of `key` will wait.
    pub fn delay(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.delay)
    }

    /// Drops keys quiet for twice the maximum.
    #[cfg(test)]
    pub fn gc(&mut self, now: SystemTime) {
        let max = self.max;
        self.entries
            .retain(|_, e| since(now, e.last_update) <= max * 2);
    }

    pub fn forget(&mut self, key: &str) {
        self.entries.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::UNIX_EPOCH;

    fn at(s: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(1_000_000 + s)
    }

    #[test]
    fn doubles_from_the_initial_delay_up_to_the_maximum() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        // First crash: no back-off.
        assert_eq!(b.remaining("c", at(0), at(0)), None);
        b.next("c", at(0), at(0));
        assert_eq!(b.delay("c"), Some(Duration::from_secs(10)));
        // Second crash at 1 s: wait 10 s from the crash.
        assert_eq!(b.remaining("c", at(1), at(4)), Some(Duration::from_secs(7)));
        assert_eq!(b.remaining("c", at(1), at(11)), None);
        let mut delays = Vec::new();
        for t in 11..19 {
            b.next("c", at(t), at(t));
            delays.push(b.delay("c").unwrap().as_secs());
        }
        assert_eq!(delays, [20, 40, 80, 160, 300, 300, 300, 300]);
    }

    #[test]
    fn a_quiet_key_starts_over() {
        let mut b = Backoff::new(Duration::from_secs(10), Duration::from_secs(300));
        b.next("c", at(0), at(0));
        b.next("c", at(1), at(1));
        assert_eq!(b.delay("c"), Some(Duration::from_secs(20)));
        // Ran fine for more than 10 minutes, then crashed.
        assert_eq!(b.remaining("c", at(700), at(700)), None);
        b.next("c", at(700), at(700));
        assert_eq!(b.delay("c"), Some(Duration::from_secs(10)));
        b.gc(at(2000));
        assert_eq!(b.delay("c"), None);
    }
}

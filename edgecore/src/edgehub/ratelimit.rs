//! Token bucket for upstream messages (`messageQPS` / `messageBurst`).

use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

pub struct TokenBucket {
    state: Mutex<(f64, Instant)>,
    rate: f64,
    burst: f64,
}

impl TokenBucket {
    /// `qps` tokens per second, at most `burst` saved up. A `qps` of 0 disables limiting.
    pub fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        TokenBucket {
            state: Mutex::new((burst, Instant::now())),
            rate: f64::from(qps),
            burst,
        }
    }

    /// How long to wait before one token is available; takes it (possibly going into debt,
    /// so that concurrent callers queue fairly).
    fn reserve(&self) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = *st;
        let refilled =
            (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(self.burst);
        let left = refilled - 1.0;
        *st = (left, now);
        if left >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-left / self.rate)
        }
    }

    pub async fn acquire(&self) {
        let wait = self.reserve();
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }

    /// Takes a token only while half the burst (rounded down) is left afterwards; otherwise
    /// returns how long until that is the case (taking nothing). Traffic that can wait (events)
    /// uses this, so it never delays the requests whose latency matters.
    fn reserve_spare(&self) -> Duration {
        if self.rate <= 0.0 {
            return Duration::ZERO;
        }
        let keep = (self.burst / 2.0).floor();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        let (tokens, last) = *st;
        let refilled =
            (tokens + now.duration_since(last).as_secs_f64() * self.rate).min(self.burst);
        if refilled - 1.0 >= keep {
            *st = (refilled - 1.0, now);
            Duration::ZERO
        } else {
            *st = (refilled, now);
            Duration::from_secs_f64((keep + 1.0 - refilled) / self.rate)
        }
    }

    /// Waits until a token can be taken that leaves half the burst to [`Self::acquire`].
    pub async fn acquire_spare(&self) {
        loop {
            let wait = self.reserve_spare();
            if wait.is_zero() {
                return;
            }
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let b = TokenBucket::new(10, 3);
        let start = Instant::now();
        for _ in 0..3 {
            b.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(1), "burst is free");
        b.acquire().await;
        b.acquire().await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(190) && waited <= Duration::from_millis(210),
            "{waited:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn spare_tokens_leave_half_the_burst_to_others() {
        let b = TokenBucket::new(10, 6);
        let start = Instant::now();
        // 6 tokens, 3 kept back: three spare ones at once.
        for _ in 0..3 {
            b.acquire_spare().await;
        }
        assert!(start.elapsed() < Duration::from_millis(1));
        // The kept ones still go to ordinary requests at once…
        b.acquire().await;
        b.acquire().await;
        assert!(start.elapsed() < Duration::from_millis(1));
        // …and a spare one now waits until 4 tokens are there again (300 ms at 10/s).
        b.acquire_spare().await;
        let waited = start.elapsed();
        assert!(
            waited >= Duration::from_millis(290) && waited <= Duration::from_millis(310),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn zero_qps_disables() {
        let b = TokenBucket::new(0, 0);
        for _ in 0..1000 {
            b.acquire().await;
        }
    }
}

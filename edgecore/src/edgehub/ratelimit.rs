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

    #[tokio::test]
    async fn zero_qps_disables() {
        let b = TokenBucket::new(0, 0);
        for _ in 0..1000 {
            b.acquire().await;
        }
    }
}

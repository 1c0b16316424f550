//! Client-side rate limit on API writes: a token bucket with `qps` and
//! `burst`, the semantics of client-go's default limiter (kube-scheduler's
//! defaults are 50 QPS, burst 100). kube-rs has no client-side limiter, and
//! this one is a dozen lines over tokio's clock, so no crate for it.

use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;

/// A token bucket; `qps <= 0` means unlimited.
#[derive(Debug)]
pub struct Limiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl Limiter {
    /// A bucket that starts full.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Limiter {
            qps,
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Waits for a token.
    pub async fn acquire(&self) {
        if self.qps <= 0.0 {
            return;
        }
        let wait = {
            let mut s = self.state.lock().await;
            let now = Instant::now();
            let refill = now.duration_since(s.1).as_secs_f64() * self.qps;
            s.0 = (s.0 + refill).min(self.burst);
            s.1 = now;
            s.0 -= 1.0;
            if s.0 >= 0.0 {
                None
            } else {
                Some(Duration::from_secs_f64(-s.0 / self.qps))
            }
        };
        if let Some(w) = wait {
            tokio::time::sleep(w).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn burst_then_qps() {
        let l = Limiter::new(10.0, 5);
        let t0 = Instant::now();
        for _ in 0..5 {
            l.acquire().await;
        }
        assert!(t0.elapsed() < Duration::from_millis(1));
        for _ in 0..10 {
            l.acquire().await;
        }
        let e = t0.elapsed().as_secs_f64();
        assert!((0.95..1.1).contains(&e), "{e}");
        let u = Limiter::new(0.0, 1);
        for _ in 0..1000 {
            u.acquire().await;
        }
        assert!(t0.elapsed().as_secs_f64() < 1.1);
    }
}

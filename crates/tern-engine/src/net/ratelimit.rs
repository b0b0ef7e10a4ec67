//! A token bucket shared by all data streams of one side (`--bwlimit`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimit {
    bytes_per_sec: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimit {
    pub fn new(bytes_per_sec: u64) -> Self {
        // A zero rate would wait forever (and a division by it is infinite): callers mean "no
        // limit" by None, so this is a caller's bug; keep it harmless anyway.
        debug_assert!(bytes_per_sec > 0, "a zero rate limit");
        let bytes_per_sec = bytes_per_sec.max(1);
        Self { bytes_per_sec: bytes_per_sec as f64, state: Mutex::new((0.0, Instant::now())) }
    }

    /// Takes `n` bytes of budget, sleeping until they are available. Burst is capped at 100 ms.
    pub fn take(&self, n: usize) {
        let wait = {
            let mut s = self.state.lock().unwrap();
            let now = Instant::now();
            let burst = self.bytes_per_sec * 0.1;
            s.0 = (s.0 + now.duration_since(s.1).as_secs_f64() * self.bytes_per_sec).min(burst);
            s.1 = now;
            s.0 -= n as f64;
            // Bounded: no single wait longer than a minute, whatever the arithmetic says.
            if s.0 < 0.0 { Duration::from_secs_f64((-s.0 / self.bytes_per_sec).min(60.0)) } else { Duration::ZERO }
        };
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
    }
}

//! When to add data streams: a controller without I/O, fed with the time and the bytes the
//! sockets delivered, that answers when to look again and whether to open more streams.
//!
//! It adds streams while each addition still raises delivered throughput by at least 10 %.
//! The signal is what the kernel says the sockets delivered (`TCP_INFO`), not bytes written: new
//! streams bring new socket buffers, which fill at once and would look like a gain. It waits for
//! slow start to settle before judging, adds half as many streams again per step, and stops at
//! the first step that does not pay; on a path that is already full, extra streams only add
//! queueing and losses. The driver (`tern-engine`'s session) owns the clock, the sockets and the
//! opening of streams; this type only decides.

use std::time::Duration;

/// Each step must raise the delivered rate by this factor to be kept going.
const GAIN: f64 = 1.10;
/// A slow-start sample, and how many of them at most before judging anyway.
const SAMPLE: Duration = Duration::from_secs(1);
const MAX_SLOW_START_SAMPLES: u32 = 6;
/// New streams get this long to start before their effect is measured, over `MEASURE`.
const WARM_UP: Duration = Duration::from_secs(1);
const MEASURE: Duration = Duration::from_secs(2);
/// New streams start cold (slow start, and losses while they push into a full queue): they pay
/// off only if enough transfer is left to warm them up and then use them.
const MIN_SECONDS_LEFT: f64 = 8.0;

/// What the driver does next.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RampAction {
    /// Sample again at this time.
    WaitUntil(Duration),
    /// Open this many more streams now, then call [`Ramp::opened`].
    Open(u32),
    /// The ramp is over; no more samples are needed.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    /// Waiting for slow start to settle: `samples` taken, the last window's rate.
    SlowStart {
        samples: u32,
    },
    /// Streams were just added; measuring starts at `measure_from`.
    WarmingUp {
        measure_from: Duration,
    },
    /// Measuring the added streams' effect from (`since`, bytes then).
    Measuring,
    Done,
}

/// The stream ramp of one session.
#[derive(Debug, Clone)]
pub struct Ramp {
    phase: Phase,
    streams: u32,
    max: u32,
    /// Start of the current window: (time, delivered bytes then).
    window: (Duration, u64),
    /// The rate to beat (bytes/s), from the last window that counted.
    rate: f64,
}

impl Ramp {
    /// A ramp starting with `streams` open at `now`, never beyond `max`.
    pub fn new(now: Duration, delivered: u64, streams: u32, max: u32) -> Self {
        let phase = if streams == 0 || streams >= max { Phase::Done } else { Phase::SlowStart { samples: 0 } };
        Self { phase, streams, max, window: (now, delivered), rate: 0.0 }
    }

    /// Streams the ramp has asked for so far, with the initial ones.
    pub fn streams(&self) -> u32 {
        self.streams
    }

    /// When the driver should call [`Ramp::sample`] next (`None`: never again).
    pub fn poll_timeout(&self) -> Option<Duration> {
        match self.phase {
            Phase::SlowStart { .. } => Some(self.window.0 + SAMPLE),
            Phase::WarmingUp { measure_from } => Some(measure_from),
            Phase::Measuring => Some(self.window.0 + MEASURE),
            Phase::Done => None,
        }
    }

    /// The sockets have delivered `delivered` bytes in all by `now`; `bytes_left` of the
    /// transfer remain. Call it at (or after) [`Ramp::poll_timeout`].
    pub fn sample(&mut self, now: Duration, delivered: u64, bytes_left: u64) -> RampAction {
        let Some(due) = self.poll_timeout() else { return RampAction::Done };
        if now < due {
            return RampAction::WaitUntil(due);
        }
        let rate = || {
            let secs = now.saturating_sub(self.window.0).as_secs_f64().max(1e-3);
            delivered.saturating_sub(self.window.1) as f64 / secs
        };
        match self.phase {
            Phase::SlowStart { samples } => {
                let next = rate();
                // Settled once a window no longer grows by the gain (or after enough windows).
                let settled = samples > 0 && next < self.rate * GAIN || samples + 1 >= MAX_SLOW_START_SAMPLES;
                self.rate = next;
                self.window = (now, delivered);
                if settled {
                    return self.step(now, bytes_left);
                }
                self.phase = Phase::SlowStart { samples: samples + 1 };
            }
            Phase::WarmingUp { .. } => {
                self.window = (now, delivered);
                self.phase = Phase::Measuring;
            }
            Phase::Measuring => {
                let next = rate();
                if next < self.rate * GAIN {
                    self.phase = Phase::Done;
                    return RampAction::Done;
                }
                self.rate = next;
                self.window = (now, delivered);
                return self.step(now, bytes_left);
            }
            Phase::Done => return RampAction::Done,
        }
        self.poll_timeout().map_or(RampAction::Done, RampAction::WaitUntil)
    }

    /// Decides whether to add streams after a window that counted.
    fn step(&mut self, now: Duration, bytes_left: u64) -> RampAction {
        if self.streams >= self.max || (bytes_left as f64) <= self.rate * MIN_SECONDS_LEFT {
            self.phase = Phase::Done;
            return RampAction::Done;
        }
        let extra = (self.streams / 2).max(2).min(self.max - self.streams);
        self.streams += extra;
        self.phase = Phase::WarmingUp { measure_from: now + WARM_UP };
        RampAction::Open(extra)
    }

    /// The driver opened `n` of the streams asked for (fewer: the peer refused the rest, and the
    /// ramp ends after this step).
    pub fn opened(&mut self, asked: u32, n: u32) {
        self.streams -= asked.saturating_sub(n);
        if n < asked {
            self.max = self.streams;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path the ramp is driven against with a virtual clock: each stream delivers at most
    /// `per_stream` bytes/s (its window over the RTT), the path at most `capacity`, and a new
    /// stream ramps up linearly over `slow_start`.
    struct Path {
        per_stream: f64,
        capacity: f64,
        slow_start: Duration,
        opened_at: Vec<Duration>,
        delivered: f64,
        now: Duration,
    }

    impl Path {
        fn new(per_stream: f64, capacity: f64, streams: u32) -> Self {
            Self { per_stream, capacity, slow_start: Duration::from_millis(1500), opened_at: vec![Duration::ZERO; streams as usize], delivered: 0.0, now: Duration::ZERO }
        }
        fn rate_at(&self, t: Duration) -> f64 {
            let sum: f64 = self.opened_at.iter().map(|&o| self.per_stream * (t.saturating_sub(o).as_secs_f64() / self.slow_start.as_secs_f64()).min(1.0)).sum();
            sum.min(self.capacity)
        }
        fn advance(&mut self, to: Duration) {
            let step = Duration::from_millis(10);
            while self.now < to {
                self.delivered += self.rate_at(self.now) * step.as_secs_f64();
                self.now += step;
            }
        }
    }

    /// Runs a ramp to its end on `path` with `total` bytes to move; returns the streams asked
    /// for and when the ramp ended.
    fn drive(path: &mut Path, max: u32, total: f64) -> (u32, Duration) {
        let start = path.opened_at.len() as u32;
        let mut ramp = Ramp::new(Duration::ZERO, 0, start, max);
        for _ in 0..1000 {
            let Some(due) = ramp.poll_timeout() else { return (ramp.streams(), path.now) };
            path.advance(due);
            let left = (total - path.delivered).max(0.0) as u64;
            match ramp.sample(path.now, path.delivered as u64, left) {
                RampAction::Open(n) => {
                    for _ in 0..n {
                        path.opened_at.push(path.now);
                    }
                    ramp.opened(n, n);
                    assert!(ramp.streams() <= max, "the ramp went past its maximum");
                }
                RampAction::WaitUntil(t) => assert!(t > path.now, "a wait that does not advance the clock"),
                RampAction::Done => return (ramp.streams(), path.now),
            }
        }
        panic!("the ramp never ended");
    }

    const GB: f64 = 1e9;

    #[test]
    fn adds_streams_until_the_path_is_full_then_stops() {
        // 4 MiB windows over 68 ms: ~60 MB/s per stream on a 1.2 GB/s path.
        let mut path = Path::new(60e6, 1.2e9, 4);
        let (streams, ended) = drive(&mut path, 64, 100.0 * GB);
        assert!((20..=40).contains(&streams), "{streams} streams for a path that needs 20");
        assert!(ended < Duration::from_secs(30), "ramp took {ended:?}");
    }

    #[test]
    fn a_full_path_gets_no_extra_streams_beyond_one_step() {
        let mut path = Path::new(500e6, 1.0e9, 4);
        let (streams, _) = drive(&mut path, 64, 100.0 * GB);
        // One step is tried and does not pay: no further one.
        assert!(streams <= 6, "{streams}");
    }

    #[test]
    fn a_short_transfer_opens_nothing() {
        // 0.5 GB at 240 MB/s: about 2 s left after slow start, below 8 s of warm-up worth.
        let mut path = Path::new(60e6, 1.2e9, 4);
        let (streams, _) = drive(&mut path, 64, 0.5 * GB);
        assert_eq!(streams, 4);
    }

    #[test]
    fn never_beyond_the_maximum_and_stops_when_the_peer_refuses() {
        let mut path = Path::new(10e6, 10e9, 2);
        let (streams, _) = drive(&mut path, 7, 1000.0 * GB);
        assert_eq!(streams, 7);
        let mut ramp = Ramp::new(Duration::ZERO, 0, 4, 64);
        let mut now = Duration::ZERO;
        let mut delivered = 0;
        loop {
            now += SAMPLE;
            delivered += 100_000_000 * (now.as_secs().min(3));
            if let RampAction::Open(n) = ramp.sample(now, delivered, u64::MAX) {
                ramp.opened(n, 1);
                break;
            }
        }
        assert_eq!(ramp.streams(), 5);
        assert_eq!(ramp.max, 5, "refused streams end the ramp at what is open");
    }

    #[test]
    fn waits_for_slow_start_before_judging() {
        let mut ramp = Ramp::new(Duration::ZERO, 0, 4, 64);
        // Rate doubling every second: still slow start, no decision.
        let mut delivered = 0u64;
        for s in 1..=4u64 {
            delivered += 1_000_000 << s;
            let a = ramp.sample(Duration::from_secs(s), delivered, u64::MAX);
            assert!(matches!(a, RampAction::WaitUntil(_)), "second {s}: {a:?}");
        }
        // An early call is answered with the time it is due.
        assert_eq!(ramp.sample(Duration::from_millis(4500), delivered, u64::MAX), RampAction::WaitUntil(Duration::from_secs(5)));
        // Flat: settled, and enough left, so a step.
        delivered += 1_000_000 << 4;
        assert_eq!(ramp.sample(Duration::from_secs(5), delivered, u64::MAX), RampAction::Open(2));
    }

    #[test]
    fn no_streams_or_already_at_the_maximum_is_done_at_once() {
        assert_eq!(Ramp::new(Duration::ZERO, 0, 0, 8).poll_timeout(), None);
        assert_eq!(Ramp::new(Duration::ZERO, 0, 8, 8).poll_timeout(), None);
    }
}

//! An open-loop schedule: event `i` of a run is due at a fixed interval
//! after the run's start, whatever happened to the events before it. The
//! lag workloads pace their appends with it and count each event's lag
//! from its scheduled time.

use std::time::{Duration, Instant, SystemTime};

/// When each event of a run is due.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    start: Instant,
    /// `start` on the wall clock, which the lag stamps use (comparable
    /// across processes).
    wall_start: SystemTime,
    interval: Duration,
}

impl Schedule {
    /// `rate` events a second, starting 50 ms from now (time to set up the
    /// first call).
    pub(crate) fn at(rate: f64) -> Self {
        let lead = Duration::from_millis(50);
        Schedule {
            start: Instant::now() + lead,
            wall_start: SystemTime::now() + lead,
            interval: Duration::from_secs_f64(1.0 / rate),
        }
    }

    /// Sleeps (the OS's sleep: tens of microseconds late, not tokio's
    /// millisecond timer) until event `i` is due; returns at once when it
    /// is already late.
    pub(crate) fn wait_for(&self, i: u64) {
        let due = self.start + self.interval.mul_f64(i as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }

    /// When event `i` is due, on the wall clock.
    pub(crate) fn wall(&self, i: u64) -> SystemTime {
        self.wall_start + self.interval.mul_f64(i as f64)
    }

    /// The rate `events` achieved if the last of them was done now.
    pub(crate) fn achieved(&self, events: u64) -> f64 {
        events as f64 / self.start.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_due_one_interval_apart_on_the_wall_clock() {
        let s = Schedule::at(1000.0);
        assert_eq!(
            s.wall(3).duration_since(s.wall(1)).unwrap(),
            Duration::from_millis(2)
        );
        assert_eq!(s.wall(0), s.wall_start);
    }
}

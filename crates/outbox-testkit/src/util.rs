//! Small helpers shared by the checks.

use outbox_core::StreamId;

/// A stream id from a literal (panics on an invalid one: test code only).
pub fn sid(s: &str) -> StreamId {
    StreamId::new(s).expect("valid stream id")
}

/// `n` stream ids `prefix-000`, `prefix-001`, ...
pub fn stream_ids(prefix: &str, n: usize) -> Vec<StreamId> {
    (0..n).map(|i| sid(&format!("{prefix}-{i:03}"))).collect()
}

/// A seed for randomized tests: `OUTBOX_TEST_SEED` if set, else from the
/// clock. Always printed, so a failure can be replayed.
#[derive(Clone, Copy, Debug)]
pub struct Seed(pub u64);

impl Seed {
    /// Picks and prints a seed for `test`.
    pub fn pick(test: &str) -> Seed {
        let seed = std::env::var("OUTBOX_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(42)
            });
        eprintln!("{test}: seed {seed} (rerun with OUTBOX_TEST_SEED={seed})");
        Seed(seed)
    }

    /// A small deterministic generator (splitmix64) from this seed.
    pub fn rng(self) -> Rng {
        Rng(self.0)
    }
}

/// splitmix64: tiny, deterministic, good enough for test schedules.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

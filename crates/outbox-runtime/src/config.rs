//! Runtime configuration: a builder with documented defaults, or the environment.

use std::time::Duration;

use outbox_core::{Error, ModeFlags, Result, RetryPolicy, WorkerId};

/// Defines each variable once: `NAME = "default", "meaning";` becomes the
/// associated constant `Config::NAME` (whose value is its own name) and a row
/// of [`ENV_VARS`]. `cargo xtask tidy` reads these lines as text.
macro_rules! env_vars {
    ($($name:ident = $default:literal, $meaning:literal;)*) => {
        /// The names of the environment variables [`Config::from_env`] reads
        /// (their defaults and meanings are in [`ENV_VARS`]).
        impl Config {
            $(
                #[doc = concat!("`", stringify!($name), "` (default `", $default, "`): ", $meaning, ".")]
                pub const $name: &'static str = stringify!($name);
            )*
        }

        /// Every environment variable the runtime reads, as `(name, default,
        /// meaning)`; the meaning is one line of Markdown.
        ///
        /// This is the one definition of these variables: [`Config::from_lookup`]
        /// reads them through the `Config::OUTBOX_*` constants, and the
        /// configuration table of the repository's README is generated from this
        /// table (with the `outbox` command's variables and the tests') by
        /// `cargo xtask tidy --fix`; `cargo xtask tidy` fails when they differ.
        pub const ENV_VARS: &[(&str, &str, &str)] = &[$((Config::$name, $default, $meaning)),*];
    };
}

// One line per variable, kept in this shape (`cargo xtask tidy` parses it).
#[rustfmt::skip]
env_vars! {
    OUTBOX_ENABLED = "false", "appends enqueue an outbox row per event";
    OUTBOX_WORKER_ENABLED = "false", "run the apply worker (needs `OUTBOX_ENABLED`)";
    OUTBOX_INLINE_APPLY = "true", "the append call may apply projections; `false` with `OUTBOX_ENABLED` and no worker is the producer-only mode (appends only)";
    OUTBOX_SHADOW_WORKER_ENABLED = "false", "run the shadow worker (needs `OUTBOX_ENABLED`; the apply worker wins if both are set)";
    OUTBOX_POLL_INTERVAL_MS = "2000", "how long an idle worker waits before polling again (appends in the same process wake it at once)";
    OUTBOX_BATCH_SIZE = "64", "rows claimed and applied per projection transaction";
    OUTBOX_LEASE_TTL_MS = "30000", "stream lease duration; renewed at a third of it";
    OUTBOX_STORE_DEADLINE_MS = "<a third of the lease TTL>", "how long one store call of the runtime may take before it is abandoned as a temporary error (its transaction rolls back); must be below `OUTBOX_LEASE_TTL_MS` and, with partition leasing, below three heartbeat intervals (at least 1 s), where the default is a third of that when it is shorter";
    OUTBOX_RETRY_BASE_MS = "1000", "delay after the first failure; doubles per failure";
    OUTBOX_RETRY_CAP_MS = "300000", "the longest retry delay (5 min)";
    OUTBOX_DEAD_LETTER_THRESHOLD = "8", "consecutive failures that park a row as dead";
    OUTBOX_WAKE_ON_APPEND = "true", "wake the worker on an in-process append instead of waiting for the poll";
    OUTBOX_LEASING = "true", "divide the work among live workers by partition (ADR 0022): each worker leases the partitions the registry's live workers assign it and claims only inside them; `false` competes for every stream with stream leases (one worker, or tools beside the workers)";
    OUTBOX_REPAIR_ON_START = "true", "catch up streams whose projections are behind the journal at start-up";
    OUTBOX_HEARTBEAT_INTERVAL_MS = "5000", "how often a worker refreshes its registry entry and gauges";
    OUTBOX_REGISTRY_RETENTION_MS = "86400000", "how long an expired worker registry entry is kept before a running worker prunes it (1 day; pruned at start and every 60 heartbeats)";
    OUTBOX_RUN_RETENTION_MS = "2592000000", "how long a finished replay or rebuild run is kept before a running worker prunes it (30 days; pruned with the registry)";
    OUTBOX_STREAMS_PER_PASS = "64", "streams one worker pass takes up at most (the due streams are read again before each)";
    OUTBOX_BATCHES_PER_STREAM = "16", "batches a pass applies to one stream before it moves on to the next (fairness)";
    OUTBOX_SWEEP_ROWS = "512", "rows one sweep claims across many due streams (at most `OUTBOX_BATCH_SIZE` of each, at most `OUTBOX_STREAMS_PER_PASS` streams) and applies in one projection transaction; 0 turns sweeps off (one stream at a time)";
    OUTBOX_RUN_TTL_MS = "60000", "how long a replay or rebuild run's claim lasts without progress; a killed run blocks new runs on its projection until then, or until its owner's worker registry entry expires (three heartbeat intervals), whichever is first";
    OUTBOX_START_RETRY_MS = "300000", "how long start-up (connecting, migrating, projection setup, start-up repair, the first heartbeat) keeps retrying while the database is unavailable (a temporary error), 100 ms doubling to 5 s between attempts; then it fails with one line (0: try once)";
    OUTBOX_WORKER_ID = "<host>-<pid>-<random>", "the worker's id (the owner on its leases)";
}

/// Runtime configuration. Build it with [`Config::default`] and the `with_*`
/// setters, or read it with [`Config::from_env`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Config {
    /// The three mode flags.
    pub flags: ModeFlags,
    /// Idle wait between polls (default 2 s).
    pub poll_interval: Duration,
    /// Rows per claim and per projection transaction (default 64).
    pub batch_size: usize,
    /// Stream lease TTL (default 30 s).
    pub lease_ttl: Duration,
    /// The deadline of each store call the runtime makes (worker, heartbeat,
    /// repair, inline apply, replay); `None` (the default) means a third of
    /// [`Config::lease_ttl`]. Read it with [`Config::store_deadline`].
    pub store_deadline: Option<Duration>,
    /// Backoff and dead-letter threshold (default 1 s doubling to 5 min, dead after 8).
    pub retry: RetryPolicy,
    /// Wake the worker on in-process appends (default true).
    pub wake_on_append: bool,
    /// Run gap repair when workers start (default true).
    pub repair_on_start: bool,
    /// Partition leasing (default true): a running worker leases the
    /// partitions assigned to it among the live workers and claims only
    /// inside them (ADR 0022); `false` competes for every stream.
    pub leasing: bool,
    /// Heartbeat interval (default 5 s).
    pub heartbeat_interval: Duration,
    /// How long an expired worker registry entry is kept before the
    /// heartbeat prunes it (default 1 day).
    pub registry_retention: Duration,
    /// How long a finished replay or rebuild run is kept before the
    /// heartbeat prunes it (default 30 days).
    pub run_retention: Duration,
    /// How long a replay or rebuild run's claim lasts between progress
    /// updates (default 60 s): a run whose process died blocks new runs on
    /// its projection at most this long (less once the process's worker
    /// registry entry has expired: the next admission reclaims the run).
    pub run_ttl: Duration,
    /// How long start-up keeps retrying temporary database errors
    /// (default 5 min; zero tries once): projection setup in
    /// [`OutboxBuilder::build`](crate::OutboxBuilder::build), start-up repair
    /// and the first heartbeat in [`Outbox::start`](crate::Outbox::start),
    /// and the `outbox work` command's connecting and migrating. See
    /// [`retry_while_unavailable`](crate::retry_while_unavailable).
    pub start_retry: Duration,
    /// The worker id; generated when `None`.
    pub worker_id: Option<WorkerId>,
    /// Streams one pass takes up at most (default 64); the due streams are
    /// read again before each of them.
    pub streams_per_pass: usize,
    /// Batches applied for one stream before moving on, for fairness (default 16).
    pub batches_per_stream: usize,
    /// Rows one sweep takes across many due streams (default 512; 0: no
    /// sweeps). A sweep leases up to [`Config::streams_per_pass`] due
    /// streams and claims up to [`Config::batch_size`] rows of each in one
    /// journal commit, applies them all in one projection transaction, and
    /// completes and releases them in one more commit: three commits for
    /// many streams instead of three per stream. A stream whose run the
    /// sweep cannot apply together (a failure, a retried or unfinished
    /// row, a projection behind) is drained on its own, as without sweeps.
    pub sweep_rows: usize,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            flags: ModeFlags::default(),
            poll_interval: Duration::from_secs(2),
            batch_size: 64,
            lease_ttl: Duration::from_secs(30),
            store_deadline: None,
            retry: RetryPolicy::default(),
            wake_on_append: true,
            repair_on_start: true,
            leasing: true,
            heartbeat_interval: Duration::from_secs(5),
            registry_retention: Duration::from_secs(24 * 3600),
            run_retention: Duration::from_secs(30 * 24 * 3600),
            run_ttl: Duration::from_secs(60),
            start_retry: Duration::from_secs(300),
            worker_id: None,
            streams_per_pass: 64,
            batches_per_stream: 16,
            sweep_rows: 512,
        }
    }
}

macro_rules! setter {
    ($(#[$doc:meta])* $name:ident, $field:ident: $ty:ty) => {
        $(#[$doc])*
        pub fn $name(mut self, value: $ty) -> Self {
            self.$field = value;
            self
        }
    };
}

impl Config {
    setter!(
        /// Sets the mode flags.
        with_flags, flags: ModeFlags
    );
    setter!(
        /// Sets the idle poll interval.
        with_poll_interval, poll_interval: Duration
    );
    setter!(
        /// Sets the batch size.
        with_batch_size, batch_size: usize
    );
    setter!(
        /// Sets the lease TTL.
        with_lease_ttl, lease_ttl: Duration
    );
    setter!(
        /// Sets the retry policy.
        with_retry, retry: RetryPolicy
    );
    setter!(
        /// Turns wake-on-append on or off.
        with_wake_on_append, wake_on_append: bool
    );
    setter!(
        /// Turns start-up gap repair on or off.
        with_repair_on_start, repair_on_start: bool
    );
    setter!(
        /// Turns partition leasing on or off ([`Config::leasing`]).
        with_leasing, leasing: bool
    );
    setter!(
        /// Sets the heartbeat interval.
        with_heartbeat_interval, heartbeat_interval: Duration
    );
    setter!(
        /// Sets how long expired worker registry entries are kept.
        with_registry_retention, registry_retention: Duration
    );
    setter!(
        /// Sets how long finished replay and rebuild runs are kept.
        with_run_retention, run_retention: Duration
    );
    setter!(
        /// Sets how long a replay or rebuild run's claim lasts between progress updates.
        with_run_ttl, run_ttl: Duration
    );
    setter!(
        /// Sets how long start-up keeps retrying temporary database errors.
        with_start_retry, start_retry: Duration
    );
    setter!(
        /// Sets due streams fetched per pass.
        with_streams_per_pass, streams_per_pass: usize
    );
    setter!(
        /// Sets batches per stream per pass.
        with_batches_per_stream, batches_per_stream: usize
    );
    setter!(
        /// Sets the rows one sweep takes across streams (0: no sweeps).
        with_sweep_rows, sweep_rows: usize
    );

    /// Sets the deadline of each store call (it must stay below the lease TTL).
    pub fn with_store_deadline(mut self, deadline: Duration) -> Self {
        self.store_deadline = Some(deadline);
        self
    }

    /// The deadline of each store call the runtime makes: the configured
    /// one, or a third of the lease TTL. Under partition leasing, when that
    /// is not below the partition lease TTL (three heartbeat intervals, at
    /// least 1 s: a short heartbeat), the default is a third of that TTL
    /// instead, so a shorter `OUTBOX_HEARTBEAT_INTERVAL_MS` alone is never
    /// refused. A call that takes longer is dropped (its transaction rolls
    /// back) and reported as a temporary [`Error::Storage`], so a hung
    /// connection cannot hold a worker past its lease.
    pub fn store_deadline(&self) -> Duration {
        self.store_deadline.unwrap_or_else(|| match self.lease_ttl / 3 {
            d if self.leasing && d >= self.partition_ttl() => self.partition_ttl() / 3,
            d => d,
        })
    }

    /// How long a partition lease lasts (and holds the streams a claim
    /// took in it): three heartbeat intervals, at least 1 s.
    fn partition_ttl(&self) -> Duration {
        heartbeat_ttl(self.heartbeat_interval)
    }

    /// Sets the worker id.
    pub fn with_worker_id(mut self, id: WorkerId) -> Self {
        self.worker_id = Some(id);
        self
    }

    /// Shorthand: outbox on, apply worker on.
    pub fn apply_worker() -> Self {
        Self::default().with_flags(ModeFlags {
            outbox: true,
            apply_worker: true,
            shadow_worker: false,
            inline_apply: true,
        })
    }

    /// Shorthand: the producer-only mode (outbox on, no worker, no inline
    /// apply): the process only appends.
    pub fn producer_only() -> Self {
        Self::default().with_flags(ModeFlags {
            outbox: true,
            apply_worker: false,
            shadow_worker: false,
            inline_apply: false,
        })
    }

    /// Checks the values, the mode flags among them (a worker without the
    /// outbox is refused here, not first at build); [`Outbox::builder`](crate::Outbox::builder) calls this.
    pub fn validate(&self) -> Result<()> {
        outbox_core::select_mode(self.flags)?;
        // Each bound names the variable that sets it (a builder's value is
        // the same setting).
        let in_range = |name: &str, var: &str, v: Duration, lo: Duration, hi: Duration| {
            if v < lo || v > hi {
                Err(Error::Config(format!(
                    "{var}: {name} must be between {lo:?} and {hi:?}, got {v:?}"
                )))
            } else {
                Ok(())
            }
        };
        in_range(
            "poll interval",
            Self::OUTBOX_POLL_INTERVAL_MS,
            self.poll_interval,
            Duration::from_millis(1),
            Duration::from_secs(3600),
        )?;
        in_range(
            "lease ttl",
            Self::OUTBOX_LEASE_TTL_MS,
            self.lease_ttl,
            Duration::from_millis(100),
            Duration::from_secs(3600),
        )?;
        if let Some(d) = self.store_deadline {
            in_range(
                "store deadline",
                Self::OUTBOX_STORE_DEADLINE_MS,
                d,
                Duration::from_millis(10),
                Duration::from_secs(3600),
            )?;
            if d >= self.lease_ttl {
                return Err(Error::Config(format!(
                    "store deadline ({}) must be below the lease ttl ({}): {d:?} >= {:?}",
                    Self::OUTBOX_STORE_DEADLINE_MS,
                    Self::OUTBOX_LEASE_TTL_MS,
                    self.lease_ttl
                )));
            }
        }
        in_range(
            "heartbeat interval",
            Self::OUTBOX_HEARTBEAT_INTERVAL_MS,
            self.heartbeat_interval,
            Duration::from_millis(10),
            Duration::from_secs(3600),
        )?;
        // Under partition leasing a claim holds its streams for the
        // partition lease TTL (three heartbeats): a store call must end well
        // within it, or a slow pass's streams fall due again.
        let partition_ttl = self.partition_ttl();
        // (Only a configured deadline can fail this: the default fits.)
        if self.leasing && self.store_deadline() >= partition_ttl {
            return Err(Error::Config(format!(
                "with partition leasing ({}) the store deadline ({:?}, {}) must be below \
                 the partition lease ttl ({partition_ttl:?}: three heartbeat intervals, {}, at least 1 s); \
                 raise the heartbeat interval or lower the store deadline",
                Self::OUTBOX_LEASING,
                self.store_deadline(),
                Self::OUTBOX_STORE_DEADLINE_MS,
                Self::OUTBOX_HEARTBEAT_INTERVAL_MS
            )));
        }
        in_range(
            "run ttl",
            Self::OUTBOX_RUN_TTL_MS,
            self.run_ttl,
            Duration::from_secs(1),
            Duration::from_secs(24 * 3600),
        )?;
        in_range(
            "start retry",
            Self::OUTBOX_START_RETRY_MS,
            self.start_retry,
            Duration::ZERO,
            Duration::from_secs(24 * 3600),
        )?;
        in_range(
            "registry retention",
            Self::OUTBOX_REGISTRY_RETENTION_MS,
            self.registry_retention,
            Duration::ZERO,
            Duration::from_secs(365 * 24 * 3600),
        )?;
        in_range(
            "run retention",
            Self::OUTBOX_RUN_RETENTION_MS,
            self.run_retention,
            Duration::ZERO,
            Duration::from_secs(10 * 365 * 24 * 3600),
        )?;
        for (name, var, v) in [
            ("batch size", Self::OUTBOX_BATCH_SIZE, self.batch_size),
            (
                "streams per pass",
                Self::OUTBOX_STREAMS_PER_PASS,
                self.streams_per_pass,
            ),
            (
                "batches per stream",
                Self::OUTBOX_BATCHES_PER_STREAM,
                self.batches_per_stream,
            ),
        ] {
            if v == 0 || v > 10_000 {
                return Err(Error::Config(format!(
                    "{var}: {name} must be between 1 and 10000, got {v}"
                )));
            }
        }
        if self.sweep_rows > 10_000 {
            return Err(Error::Config(format!(
                "{}: sweep rows must be between 0 and 10000, got {}",
                Self::OUTBOX_SWEEP_ROWS,
                self.sweep_rows
            )));
        }
        Ok(())
    }

    /// Reads the configuration from the process environment (see [`ENV_VARS`]).
    pub fn from_env() -> Result<Self> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the configuration through `lookup` (the environment, a map in
    /// tests). Unset variables keep their defaults; an invalid value is an
    /// error naming the variable and the value.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut c = Config::default();
        let get = |k: &str| lookup(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let flag = |k: &str, default: bool| -> Result<bool> {
            match get(k) {
                None => Ok(default),
                Some(v) => match v.to_ascii_lowercase().as_str() {
                    "1" | "true" | "yes" | "on" => Ok(true),
                    "0" | "false" | "no" | "off" => Ok(false),
                    _ => Err(Error::Config(format!(
                        "{k}={v:?} is not a boolean (use true or false)"
                    ))),
                },
            }
        };
        let number = |k: &str| -> Result<Option<u64>> {
            get(k)
                .map(|v| {
                    v.parse::<u64>()
                        .map_err(|_| Error::Config(format!("{k}={v:?} is not a non-negative integer")))
                })
                .transpose()
        };
        let ms = |k: &str| -> Result<Option<Duration>> { Ok(number(k)?.map(Duration::from_millis)) };
        c.flags = ModeFlags {
            outbox: flag(Self::OUTBOX_ENABLED, false)?,
            apply_worker: flag(Self::OUTBOX_WORKER_ENABLED, false)?,
            shadow_worker: flag(Self::OUTBOX_SHADOW_WORKER_ENABLED, false)?,
            inline_apply: flag(Self::OUTBOX_INLINE_APPLY, true)?,
        };
        c.wake_on_append = flag(Self::OUTBOX_WAKE_ON_APPEND, true)?;
        c.repair_on_start = flag(Self::OUTBOX_REPAIR_ON_START, true)?;
        c.leasing = flag(Self::OUTBOX_LEASING, true)?;
        if let Some(v) = ms(Self::OUTBOX_POLL_INTERVAL_MS)? {
            c.poll_interval = v;
        }
        if let Some(v) = number(Self::OUTBOX_BATCH_SIZE)? {
            c.batch_size = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = number(Self::OUTBOX_STREAMS_PER_PASS)? {
            c.streams_per_pass = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = number(Self::OUTBOX_BATCHES_PER_STREAM)? {
            c.batches_per_stream = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = number(Self::OUTBOX_SWEEP_ROWS)? {
            c.sweep_rows = usize::try_from(v).unwrap_or(usize::MAX);
        }
        if let Some(v) = ms(Self::OUTBOX_LEASE_TTL_MS)? {
            c.lease_ttl = v;
        }
        if let Some(v) = ms(Self::OUTBOX_STORE_DEADLINE_MS)? {
            c.store_deadline = Some(v);
        }
        if let Some(v) = ms(Self::OUTBOX_RUN_TTL_MS)? {
            c.run_ttl = v;
        }
        if let Some(v) = ms(Self::OUTBOX_START_RETRY_MS)? {
            c.start_retry = v;
        }
        if let Some(v) = ms(Self::OUTBOX_HEARTBEAT_INTERVAL_MS)? {
            c.heartbeat_interval = v;
        }
        if let Some(v) = ms(Self::OUTBOX_REGISTRY_RETENTION_MS)? {
            c.registry_retention = v;
        }
        if let Some(v) = ms(Self::OUTBOX_RUN_RETENTION_MS)? {
            c.run_retention = v;
        }
        let base = ms(Self::OUTBOX_RETRY_BASE_MS)?.unwrap_or(c.retry.base());
        let cap = ms(Self::OUTBOX_RETRY_CAP_MS)?.unwrap_or(c.retry.cap());
        let threshold = match number(Self::OUTBOX_DEAD_LETTER_THRESHOLD)? {
            Some(v) => u32::try_from(v).map_err(|_| {
                Error::Config(format!(
                    "{}={v} is out of range",
                    Self::OUTBOX_DEAD_LETTER_THRESHOLD
                ))
            })?,
            None => c.retry.dead_letter_after(),
        };
        c.retry = RetryPolicy::new(base, cap, threshold).map_err(|e| {
            Error::Config(format!(
                "{} / {} / {}: {}",
                Self::OUTBOX_RETRY_BASE_MS,
                Self::OUTBOX_RETRY_CAP_MS,
                Self::OUTBOX_DEAD_LETTER_THRESHOLD,
                e.to_string().trim_start_matches("configuration error: ")
            ))
        })?;
        if let Some(v) = get(Self::OUTBOX_WORKER_ID) {
            c.worker_id = Some(
                WorkerId::new(&v)
                    .map_err(|e| Error::Config(format!("{}={v:?}: {e}", Self::OUTBOX_WORKER_ID)))?,
            );
        }
        // Every message of `validate` names the variables it is about.
        c.validate()?;
        Ok(c)
    }
}

/// How long a registry entry lives without a new beat: three heartbeat
/// intervals, at least 1 s. Here, beside the interval it derives from, for
/// the worker registry (running.rs), the partition leases and replays.
pub(crate) fn heartbeat_ttl(interval: Duration) -> Duration {
    (interval * 3).max(Duration::from_secs(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> Result<Config> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Config::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_match_the_documented_table() {
        let c = env(&[]).unwrap();
        assert_eq!(c.poll_interval, Duration::from_secs(2));
        assert_eq!(c.batch_size, 64);
        assert_eq!(c.retry, RetryPolicy::default());
        assert!(c.wake_on_append && c.repair_on_start);
        assert_eq!(c.flags, ModeFlags::default());
        assert_eq!(
            c.store_deadline(),
            Duration::from_secs(10),
            "a third of the lease ttl"
        );
        let short = env(&[("OUTBOX_LEASE_TTL_MS", "1500")]).unwrap();
        assert_eq!(
            short.store_deadline(),
            Duration::from_millis(500),
            "follows the lease ttl"
        );
        for (name, default, _) in ENV_VARS {
            assert!(name.starts_with("OUTBOX_") && !default.is_empty());
        }
    }

    #[test]
    fn documented_defaults_are_the_defaults() {
        // Setting every variable to its documented default changes nothing
        // (the worker id's and the store deadline's defaults are
        // descriptions, not values).
        let documented: Vec<(&str, &str)> = ENV_VARS
            .iter()
            .filter(|(name, _, _)| {
                ![Config::OUTBOX_WORKER_ID, Config::OUTBOX_STORE_DEADLINE_MS].contains(name)
            })
            .map(|(name, default, _)| (*name, *default))
            .collect();
        assert_eq!(documented.len(), ENV_VARS.len() - 2);
        assert_eq!(
            format!("{:?}", env(&documented).unwrap()),
            format!("{:?}", Config::default())
        );
    }

    #[test]
    fn a_short_heartbeat_alone_gets_a_store_deadline_that_fits_it() {
        // The default stays a third of the lease TTL wherever that fits.
        let c = env(&[]).unwrap();
        assert_eq!(c.store_deadline(), Duration::from_secs(10));
        let c = env(&[("OUTBOX_HEARTBEAT_INTERVAL_MS", "4000")]).unwrap();
        assert_eq!(c.store_deadline(), Duration::from_secs(10));
        // A 1 s heartbeat: partition leases of 3 s, so a 1 s deadline.
        let c = env(&[("OUTBOX_HEARTBEAT_INTERVAL_MS", "1000")]).unwrap();
        assert_eq!(c.store_deadline(), Duration::from_secs(1));
        // 100 ms: the partition lease TTL's floor of 1 s.
        let c = env(&[("OUTBOX_HEARTBEAT_INTERVAL_MS", "100")]).unwrap();
        assert_eq!(c.store_deadline(), Duration::from_secs(1) / 3);
        // Without partition leasing the heartbeat bounds nothing.
        let c = env(&[
            ("OUTBOX_HEARTBEAT_INTERVAL_MS", "100"),
            ("OUTBOX_LEASING", "false"),
        ])
        .unwrap();
        assert_eq!(c.store_deadline(), Duration::from_secs(10));
        // A configured deadline that does not fit is still refused.
        let msg = env(&[
            ("OUTBOX_HEARTBEAT_INTERVAL_MS", "1000"),
            ("OUTBOX_STORE_DEADLINE_MS", "5000"),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            msg.contains(
                "the store deadline (5s, OUTBOX_STORE_DEADLINE_MS) must be below the partition lease ttl (3s"
            ),
            "{msg}"
        );
        assert!(!msg.contains('\n'), "one line: {msg}");
    }

    #[test]
    fn inconsistent_mode_flags_are_refused_when_read() {
        let msg = env(&[("OUTBOX_WORKER_ENABLED", "true")]).unwrap_err().to_string();
        assert!(
            msg.contains("OUTBOX_WORKER_ENABLED is set but OUTBOX_ENABLED is not"),
            "{msg}"
        );
        let msg = env(&[("OUTBOX_INLINE_APPLY", "false")]).unwrap_err().to_string();
        assert!(msg.contains("OUTBOX_INLINE_APPLY is false"), "{msg}");
        env(&[("OUTBOX_ENABLED", "true"), ("OUTBOX_WORKER_ENABLED", "true")]).unwrap();
    }

    #[test]
    fn every_variable_is_read() {
        let read = std::cell::RefCell::new(Vec::new());
        Config::from_lookup(|k| {
            read.borrow_mut().push(k.to_owned());
            None
        })
        .unwrap();
        let read = read.into_inner();
        for (name, _, _) in ENV_VARS {
            assert!(read.iter().any(|k| k == name), "{name} is listed but never read");
        }
        assert_eq!(read.len(), ENV_VARS.len(), "read: {read:?}");
    }

    #[test]
    fn values_are_read() {
        let c = env(&[
            ("OUTBOX_ENABLED", "true"),
            ("OUTBOX_WORKER_ENABLED", "1"),
            ("OUTBOX_BATCH_SIZE", "10"),
            ("OUTBOX_POLL_INTERVAL_MS", "50"),
            ("OUTBOX_DEAD_LETTER_THRESHOLD", "3"),
            ("OUTBOX_RETRY_CAP_MS", "60000"),
            ("OUTBOX_WORKER_ID", "w-1"),
            ("OUTBOX_REGISTRY_RETENTION_MS", "60000"),
            ("OUTBOX_RUN_RETENTION_MS", "120000"),
            ("OUTBOX_STREAMS_PER_PASS", "8"),
            ("OUTBOX_RUN_TTL_MS", "5000"),
            ("OUTBOX_BATCHES_PER_STREAM", "2"),
            ("OUTBOX_SWEEP_ROWS", "0"),
            ("OUTBOX_STORE_DEADLINE_MS", "2500"),
            ("OUTBOX_START_RETRY_MS", "0"),
        ])
        .unwrap();
        assert_eq!(c.start_retry, Duration::ZERO);
        assert_eq!(c.store_deadline(), Duration::from_millis(2500));
        assert_eq!(
            (c.streams_per_pass, c.batches_per_stream, c.sweep_rows),
            (8, 2, 0)
        );
        assert_eq!(c.run_ttl, Duration::from_secs(5));
        assert_eq!(c.registry_retention, Duration::from_secs(60));
        assert_eq!(c.run_retention, Duration::from_secs(120));
        assert!(c.flags.outbox && c.flags.apply_worker && !c.flags.shadow_worker);
        assert_eq!(c.batch_size, 10);
        assert_eq!(c.poll_interval, Duration::from_millis(50));
        assert_eq!(c.retry.dead_letter_after(), 3);
        assert_eq!(c.retry.cap(), Duration::from_secs(60));
        assert_eq!(c.worker_id.unwrap().as_str(), "w-1");
    }

    #[test]
    fn invalid_values_name_the_variable_and_value() {
        for (k, v, want) in [
            (
                "OUTBOX_ENABLED",
                "maybe",
                "OUTBOX_ENABLED=\"maybe\" is not a boolean",
            ),
            (
                "OUTBOX_BATCH_SIZE",
                "abc",
                "OUTBOX_BATCH_SIZE=\"abc\" is not a non-negative integer",
            ),
            (
                "OUTBOX_BATCH_SIZE",
                "0",
                "OUTBOX_BATCH_SIZE: batch size must be between 1 and 10000, got 0",
            ),
            ("OUTBOX_POLL_INTERVAL_MS", "-5", "OUTBOX_POLL_INTERVAL_MS=\"-5\""),
            (
                "OUTBOX_POLL_INTERVAL_MS",
                "0",
                "OUTBOX_POLL_INTERVAL_MS: poll interval must be between 1ms",
            ),
            (
                "OUTBOX_LEASE_TTL_MS",
                "50",
                "OUTBOX_LEASE_TTL_MS: lease ttl must be between 100ms",
            ),
            (
                "OUTBOX_HEARTBEAT_INTERVAL_MS",
                "5",
                "OUTBOX_HEARTBEAT_INTERVAL_MS: heartbeat interval must be between 10ms",
            ),
            (
                "OUTBOX_START_RETRY_MS",
                "86400001",
                "OUTBOX_START_RETRY_MS: start retry must be between",
            ),
            (
                "OUTBOX_REGISTRY_RETENTION_MS",
                "31536000001",
                "OUTBOX_REGISTRY_RETENTION_MS: registry retention must be between",
            ),
            (
                "OUTBOX_DEAD_LETTER_THRESHOLD",
                "0",
                "dead-letter threshold must be between 1",
            ),
            ("OUTBOX_RETRY_CAP_MS", "10", "retry cap"),
            (
                "OUTBOX_RUN_TTL_MS",
                "999",
                "OUTBOX_RUN_TTL_MS: run ttl must be between 1s and 86400s, got 999ms",
            ),
            (
                "OUTBOX_RUN_TTL_MS",
                "1.5",
                "OUTBOX_RUN_TTL_MS=\"1.5\" is not a non-negative integer",
            ),
            (
                "OUTBOX_STREAMS_PER_PASS",
                "0",
                "OUTBOX_STREAMS_PER_PASS: streams per pass must be between 1 and 10000, got 0",
            ),
            (
                "OUTBOX_BATCHES_PER_STREAM",
                "10001",
                "OUTBOX_BATCHES_PER_STREAM: batches per stream must be between 1 and 10000, got 10001",
            ),
            (
                "OUTBOX_BATCHES_PER_STREAM",
                "x",
                "OUTBOX_BATCHES_PER_STREAM=\"x\" is not a non-negative integer",
            ),
            (
                "OUTBOX_SWEEP_ROWS",
                "10001",
                "OUTBOX_SWEEP_ROWS: sweep rows must be between 0 and 10000, got 10001",
            ),
            ("OUTBOX_WORKER_ID", "bad\u{7}id", "OUTBOX_WORKER_ID"),
            (
                "OUTBOX_STORE_DEADLINE_MS",
                "30000",
                "store deadline (OUTBOX_STORE_DEADLINE_MS) must be below the lease ttl (OUTBOX_LEASE_TTL_MS): 30s >= 30s",
            ),
            (
                "OUTBOX_STORE_DEADLINE_MS",
                "5",
                "OUTBOX_STORE_DEADLINE_MS: store deadline must be between 10ms and 3600s, got 5ms",
            ),
        ] {
            let msg = env(&[(k, v)]).unwrap_err().to_string();
            assert!(msg.contains(want), "{k}={v}: {msg}");
            assert!(!msg.contains('\n'), "one line: {msg}");
        }
    }
}

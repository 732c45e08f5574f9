//! How a store connects: the schema, the pool, notifications.

use std::time::Duration;

use outbox_core::{Error, Result};

/// Checks a schema, table or column name for use in SQL text:
/// `^[a-z_][a-z0-9_]{0,62}$` (lowercase, so it never needs quoting and means
/// the same quoted or not). Anything else is [`Error::InvalidInput`].
/// Identifiers cannot be bound as parameters, so every identifier that reaches
/// SQL text passes this first.
pub fn validate_identifier(name: &str) -> Result<&str> {
    let mut chars = name.chars();
    let ok = match chars.next() {
        Some(c) if c.is_ascii_lowercase() || c == '_' => {
            name.len() <= 63 && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        }
        _ => false,
    };
    if ok {
        Ok(name)
    } else {
        Err(Error::invalid(format_args!(
            "{name:?} is not a valid postgres identifier (lowercase letters, digits and underscores, \
             at most 63, not starting with a digit)"
        )))
    }
}

/// How [`PgJournal`](crate::PgJournal) and
/// [`PgProjectionStore`](crate::PgProjectionStore) use their database.
///
/// ```
/// use std::time::Duration;
/// use outbox_postgres::PgOptions;
///
/// let options = PgOptions::default()
///     .with_schema("billing_outbox")
///     .with_max_connections(8)
///     .with_acquire_timeout(Duration::from_secs(5))
///     .with_notify(false);
/// assert_eq!(options.schema, "billing_outbox");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PgOptions {
    /// The schema holding the store's tables (created if missing), set as the
    /// connections' `search_path`, so projection tables created through the
    /// apply transaction land there too. Must pass [`validate_identifier`].
    /// Default `outbox`.
    pub schema: String,
    /// The pool's largest number of connections. Default 10.
    pub max_connections: u32,
    /// Connections of a journal's pool that appends never take: at most
    /// `max_connections - reserved_connections` appends hold a connection
    /// at once (the others wait their turn for one of those), so the
    /// runtime's own calls (claims, completions, heartbeats, registry
    /// reads) always find one free, and a burst of appends cannot hold the
    /// worker or the heartbeat back behind it. Default 2. Appends always
    /// keep one connection: in a pool of two or fewer, they may take all but
    /// one, or the only one. Ignored by the projection store.
    pub reserved_connections: u32,
    /// The most appends that hold a connection at once (within the
    /// connections `reserved_connections` leaves them). Default 2. Appends
    /// that find every one of these busy queue, and the next free one
    /// appends the queue in one statement and one commit (ADR 0042), so
    /// fewer of them means larger groups and less server CPU per event;
    /// more of them means more statements in flight. On the bench's 2-core
    /// machine with a durable server, 2 instead of 8 halved the lag p50 at
    /// 2,000 single appends/s and cut its p99 by a quarter to a half, for
    /// about 15% less throughput once the server is saturated (ADR 0042).
    /// Keep at least 2 so that an append waiting on a stream lock (another
    /// transaction's `append_in`) does not hold every other append back.
    pub append_connections: u32,
    /// How long a call waits for a pooled connection before failing with a
    /// temporary error (for an append, its turn among the appends and the
    /// connection together). Default 30 s.
    pub acquire_timeout: Duration,
    /// Whether appends that enqueued outbox rows wake listeners with a
    /// `pg_notify` on the schema's channel (for
    /// [`PgJournal::wake_source`](crate::PgJournal::wake_source)). Default
    /// `true`. `append` sends it after its commit, coalesced with other
    /// appends' (one notification at a time per journal, off the commit
    /// path); `append_in` inside the caller's transaction, delivered at its
    /// commit. Turn it off when no worker listens.
    pub notify: bool,
    /// Apply pending migrations when connecting. Default `true`; inspection
    /// tools turn it off, so a schema of an older version is refused
    /// ([`Error::SchemaTooOld`](outbox_core::Error::SchemaTooOld)) instead of
    /// upgraded behind its application's back.
    pub migrate: bool,
    /// Whether the pool's connections start with `plan_cache_mode =
    /// force_generic_plan`, so each prepared statement is planned once per
    /// connection instead of on every execution. Default `true`. Postgres
    /// otherwise re-plans the adapter's array-bound statements (checkpoint
    /// compare-and-set, checkpoint locks) on every call, because their
    /// generic plan's estimate of an array's length looks worse than the
    /// one-row custom plan; the planning cost more than their execution, and
    /// the drain ran 10-20% faster with it off (issue 11). The setting is the
    /// session's, so it also covers your own statements inside an apply
    /// transaction; turn it off if one of them needs plans fitted to its
    /// values.
    pub generic_plans: bool,
    /// The journal's partitioning (ADR 0022): the count asked for, the
    /// partitioner, and whether to repartition a journal stored with
    /// another. Ignored by the projection store. Default: the journal's
    /// stored count (16 for a new journal) by CRC-32, never repartitioning.
    pub partitions: outbox_core::PartitionOptions,
    /// Whether the schema's clock is the test clock (see
    /// [`PgOptions::with_test_clock`]); never in a production build.
    pub(crate) test_clock: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions {
            schema: "outbox".to_owned(),
            max_connections: 10,
            reserved_connections: 2,
            append_connections: 2,
            acquire_timeout: Duration::from_secs(30),
            notify: true,
            migrate: true,
            generic_plans: true,
            partitions: outbox_core::PartitionOptions::default(),
            test_clock: false,
        }
    }
}

impl PgOptions {
    /// Asks for `count` partitions (see [`PgOptions::partitions`]).
    pub fn with_partitions(mut self, count: u16) -> Self {
        self.partitions.count = Some(count);
        self
    }

    /// Sets the partitioner (an application keying by tenant, say).
    pub fn with_partitioner(mut self, partitioner: std::sync::Arc<dyn outbox_core::Partitioner>) -> Self {
        self.partitions.partitioner = partitioner;
        self
    }

    /// Repartitions a journal stored with another partitioning instead of
    /// refusing it (only while no partition lease is held).
    pub fn with_repartition(mut self, repartition: bool) -> Self {
        self.partitions.repartition = repartition;
        self
    }

    /// Sets [`PgOptions::generic_plans`].
    pub fn with_generic_plans(mut self, generic_plans: bool) -> Self {
        self.generic_plans = generic_plans;
        self
    }

    /// Sets [`PgOptions::migrate`].
    pub fn with_migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// The largest accepted [`PgOptions::max_connections`].
    pub const MAX_CONNECTIONS: u32 = 1_000;

    /// Test support (feature `test-util`): the schema's clock becomes the
    /// database's plus an offset stored in the schema, which
    /// [`PgJournal::advance_clock_for_tests`](crate::PgJournal::advance_clock_for_tests)
    /// and [`PgProjectionStore::advance_clock_for_tests`](crate::PgProjectionStore::advance_clock_for_tests)
    /// move for every instance and process on the schema. Opening a store
    /// with it replaces the schema's clock offset function (ADR 0006), so
    /// use it on test schemas only. A store opened without it never reads
    /// the offset.
    #[cfg(feature = "test-util")]
    pub fn with_test_clock(mut self) -> Self {
        self.test_clock = true;
        self
    }

    /// Sets [`PgOptions::schema`].
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// Sets [`PgOptions::max_connections`].
    pub fn with_max_connections(mut self, n: u32) -> Self {
        self.max_connections = n;
        self
    }

    /// Sets [`PgOptions::reserved_connections`].
    pub fn with_reserved_connections(mut self, n: u32) -> Self {
        self.reserved_connections = n;
        self
    }

    /// Sets [`PgOptions::append_connections`].
    pub fn with_append_connections(mut self, n: u32) -> Self {
        self.append_connections = n;
        self
    }

    /// How many appends may hold a connection at once: `append_connections`
    /// within the pool less the reserved connections, at least one.
    pub(crate) fn append_turns(&self) -> u32 {
        self.max_connections
            .saturating_sub(self.reserved_connections)
            .min(self.append_connections)
            .max(1)
    }

    /// Sets [`PgOptions::acquire_timeout`].
    pub fn with_acquire_timeout(mut self, timeout: Duration) -> Self {
        self.acquire_timeout = timeout;
        self
    }

    /// Sets [`PgOptions::notify`].
    pub fn with_notify(mut self, notify: bool) -> Self {
        self.notify = notify;
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        validate_identifier(&self.schema).map_err(|e| Error::Config(format!("schema: {e}")))?;
        if self.schema.starts_with("pg_") {
            return Err(Error::Config(format!(
                "schema {:?}: names starting with pg_ are reserved by postgres",
                self.schema
            )));
        }
        if self.max_connections == 0 || self.max_connections > Self::MAX_CONNECTIONS {
            return Err(Error::Config(format!(
                "postgres max connections must be between 1 and {}, got {}",
                Self::MAX_CONNECTIONS,
                self.max_connections
            )));
        }
        if self.append_connections == 0 || self.append_connections > Self::MAX_CONNECTIONS {
            return Err(Error::Config(format!(
                "postgres append connections must be between 1 and {}, got {}",
                Self::MAX_CONNECTIONS,
                self.append_connections
            )));
        }
        if self.acquire_timeout < Duration::from_millis(1) || self.acquire_timeout > Duration::from_secs(3600)
        {
            return Err(Error::Config(format!(
                "postgres acquire timeout {:?} is outside 1ms..=1h",
                self.acquire_timeout
            )));
        }
        Ok(())
    }

    /// The LISTEN/NOTIFY channel of the schema: `<schema>_wake`, or for long
    /// schema names a prefix and a hash (channel names are at most 63 bytes).
    pub(crate) fn channel(&self) -> String {
        channel_of(&self.schema)
    }
}

pub(crate) fn channel_of(schema: &str) -> String {
    if schema.len() <= 58 {
        format!("{schema}_wake")
    } else {
        // FNV-1a: stable across builds and platforms.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in schema.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{}_{h:016x}_wake", &schema[..40])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identifiers() {
        for ok in ["outbox", "_x", "a1_b2", &"a".repeat(63)] {
            assert!(validate_identifier(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1a",
            "Outbox",
            "a-b",
            "a b",
            "a\"b",
            "é",
            &"a".repeat(64),
            "a;drop",
        ] {
            assert!(validate_identifier(bad).is_err(), "{bad}");
        }
        assert!(PgOptions::default().with_schema("pg_x").validate().is_err());
        assert!(PgOptions::default().with_max_connections(0).validate().is_err());
        assert!(
            PgOptions::default()
                .with_append_connections(0)
                .validate()
                .is_err()
        );
        // Appends always keep one connection.
        for max in [1, 2, 3] {
            let small = PgOptions::default().with_max_connections(max);
            assert!(small.validate().is_ok());
            assert_eq!(small.append_turns(), 1, "a pool of {max}");
        }
        assert_eq!(PgOptions::default().append_turns(), 2);
        let wide = PgOptions::default().with_append_connections(64);
        assert_eq!(wide.append_turns(), 8, "within the pool less the reserved");
        let none = wide.with_reserved_connections(0);
        assert_eq!(none.append_turns(), 10);
    }

    #[test]
    fn channels_fit() {
        assert_eq!(channel_of("outbox"), "outbox_wake");
        let long = "a".repeat(63);
        let c = channel_of(&long);
        assert!(c.len() <= 63, "{c}");
        assert_ne!(c, channel_of(&"a".repeat(62)));
    }
}

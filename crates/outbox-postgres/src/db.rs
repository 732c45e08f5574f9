//! Connecting, migrations, the database clock and error mapping.

use std::fmt;
use std::str::FromStr;

use outbox_core::{Error, Location, Result};
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions};
use sqlx::{AssertSqlSafe, Postgres, Transaction};

use crate::PgOptions;

/// The journal's clock in integer milliseconds since the Unix epoch, as an
/// SQL expression: the database's `statement_timestamp()` (one value for the
/// whole statement, like SQLite's 'now'; it advances with every statement)
/// plus the schema's clock offset: a constant 0 the planner folds in, unless
/// a store opened the schema with the test clock ([`install_test_clock`]).
macro_rules! jnow {
    () => {
        "(floor(extract(epoch from statement_timestamp()) * 1000)::bigint + outbox_journal_clock_offset_ms())"
    };
}
pub(crate) use jnow;

/// The projection store's clock; see [`jnow!`].
macro_rules! pnow {
    () => {
        "(floor(extract(epoch from statement_timestamp()) * 1000)::bigint + outbox_projection_clock_offset_ms())"
    };
}
pub(crate) use pnow;

pub(crate) use outbox_sql::Role;

/// What a role means in a Postgres schema: its tables and migrations.
pub(crate) trait RoleSchema {
    fn meta_table(self) -> &'static str;
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    fn clock_offset_function(self) -> &'static str;
    fn migrations_table(self) -> &'static str;
    fn migrator(self) -> Migrator;
}

impl RoleSchema for Role {
    /// The role's clock offset function (ADR 0006: 0 but in a test clock's
    /// schema).
    fn clock_offset_function(self) -> &'static str {
        match self {
            Role::Journal => "outbox_journal_clock_offset_ms",
            Role::Projection => "outbox_projection_clock_offset_ms",
        }
    }

    /// The role's meta table (role marker, test clock offset).
    fn meta_table(self) -> &'static str {
        match self {
            Role::Journal => "outbox_journal_meta",
            Role::Projection => "outbox_projection_meta",
        }
    }

    /// The role's migrations table: not sqlx's default `_sqlx_migrations`, so
    /// an application's own migrations in the same schema do not collide,
    /// and one per role, so both stores may share a schema.
    fn migrations_table(self) -> &'static str {
        match self {
            Role::Journal => "_outbox_journal_migrations",
            Role::Projection => "_outbox_projection_migrations",
        }
    }

    fn migrator(self) -> Migrator {
        let mut m = match self {
            Role::Journal => sqlx::migrate!("migrations/journal"),
            Role::Projection => sqlx::migrate!("migrations/projection"),
        };
        m.dangerous_set_table_name(self.migrations_table());
        // No session-level advisory lock: we migrate inside our own
        // transaction under pg_advisory_xact_lock.
        m.set_locking(false);
        m
    }
}

/// Whether a SQLSTATE means "retry later": the database is shutting down,
/// restarting, out of a resource, or this transaction lost a conflict. The
/// rows of the table in the crate docs ("Errors: temporary or permanent").
fn temporary_sqlstate(code: &str) -> bool {
    let class = code.get(..2).unwrap_or("");
    matches!(class, "08" | "40" | "53")
        || matches!(
            code,
            "55P03" // lock_not_available (lock_timeout, NOWAIT)
                | "57014" // query_canceled (statement_timeout)
                | "57P01" // admin_shutdown (pg_terminate_backend, smart/fast shutdown)
                | "57P02" // crash_shutdown (another backend crashed; immediate stop)
                | "57P03" // cannot_connect_now (starting up, recovering, shutting down)
                | "57P05" // idle_session_timeout
        )
}

/// Whether a driver error is temporary: the one classification of this
/// adapter, used by connecting, migrating and every statement (through
/// [`storage`] and [`migrate_error`]). Decided by the error's kind and
/// SQLSTATE, never by its text; the crate docs have the table.
pub(crate) fn is_temporary(e: &sqlx::Error) -> bool {
    use sqlx::Error as E;
    match e {
        // Connection refused, reset, broken pipe, unexpected EOF, a missing
        // socket file while the server is down: the connection is gone.
        E::Io(_) => true,
        // A connection that ended mid-message (the server went away).
        E::Protocol(_) => true,
        // No connection within the acquire timeout (all busy, or the server
        // does not accept any), and the driver's background worker dying.
        E::PoolTimedOut | E::WorkerCrashed => true,
        E::Database(d) => d.code().is_some_and(|c| temporary_sqlstate(&c)),
        E::Migrate(m) => match m.as_ref() {
            sqlx::migrate::MigrateError::Execute(inner)
            | sqlx::migrate::MigrateError::ExecuteMigration(inner, _) => is_temporary(inner),
            _ => false,
        },
        // Permanent: our own pool was closed (the store is shutting down),
        // configuration and TLS setup, decoding and encoding, a missing row or
        // column or type (a schema the build does not match), bad arguments.
        E::PoolClosed
        | E::Configuration(_)
        | E::Tls(_)
        | E::InvalidArgument(_)
        | E::RowNotFound
        | E::TypeNotFound { .. }
        | E::ColumnIndexOutOfBounds { .. }
        | E::ColumnNotFound(_)
        | E::ColumnDecode { .. }
        | E::Encode(_)
        | E::Decode(_)
        | E::AnyDriverError(_)
        | E::InvalidSavePointStatement
        | E::BeginFailed => false,
        _ => false,
    }
}

/// Maps a driver error to a storage error that names what was being done and
/// keeps the driver error as the source; temporary as [`is_temporary`] says.
/// Postgres error messages carry no connection secrets.
pub(crate) fn storage(context: impl fmt::Display, e: sqlx::Error) -> Error {
    let message = format!("{context}: {}", shown(&e));
    if is_temporary(&e) {
        Error::temporary(message, e)
    } else {
        Error::storage(message, e)
    }
}

/// A driver error as one line for people: a server error is its message
/// and SQLSTATE (sqlx's own text adds "at line N", the line of the
/// server's C source that raised it, which reads as a line of ours).
pub(crate) fn shown(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(d) => match d.code() {
            Some(code) => format!("{} (SQLSTATE {code})", d.message()),
            None => d.message().to_owned(),
        },
        other => other.to_string(),
    }
}

/// Maps a `sqlx` migration failure: a database error inside it (a
/// connection reset while migrating, an admin shutdown, a busy file) is
/// classified by [`storage`] like any statement's; a failure of the
/// migration files themselves (checksum mismatch, a missing or dirty
/// version) is a permanent storage error.
pub(crate) fn migrate_error(context: impl fmt::Display, e: sqlx::migrate::MigrateError) -> Error {
    match e {
        sqlx::migrate::MigrateError::Execute(db) | sqlx::migrate::MigrateError::ExecuteMigration(db, _) => {
            storage(context, db)
        }
        other => Error::Storage {
            message: format!("{context}: {other}"),
            temporary: false,
            source: Some(Box::new(other)),
        },
    }
}

/// A connection target shown without credentials: `user@host:port/db` or
/// `user@socket-dir/db`.
pub(crate) fn redacted(o: &PgConnectOptions) -> String {
    let db = o.get_database().unwrap_or("(default)");
    match o.get_socket() {
        Some(dir) => format!("postgres {}@{}/{db}", o.get_username(), dir.display()),
        None => format!(
            "postgres {}@{}:{}/{db}",
            o.get_username(),
            o.get_host(),
            o.get_port()
        ),
    }
}

/// Parses a `postgres://` URL. The error never repeats the URL (it may hold a
/// password).
pub(crate) fn parse_url(url: &str) -> Result<PgConnectOptions> {
    if !matches!(Location::parse(url), Ok(Location::Postgres(_))) {
        return Err(Error::invalid(
            "a postgres url must start with postgres:// or postgresql://",
        ));
    }
    PgConnectOptions::from_str(url).map_err(|e| {
        // sqlx's parse errors describe the bad part, not the whole URL; keep
        // only the kind of failure to be safe.
        let kind = match e {
            sqlx::Error::Configuration(_) => "malformed connection url",
            _ => "unusable connection url",
        };
        Error::invalid(format_args!("{kind} (url not shown; it may contain a password)"))
    })
}

/// An open schema: a pool whose connections all use it as `search_path`.
#[derive(Debug)]
pub(crate) struct Db {
    pub(crate) pool: PgPool,
    pub(crate) schema: String,
    pub(crate) channel: String,
    pub(crate) notify: bool,
    pub(crate) shown: String,
    pub(crate) connect: PgConnectOptions,
    /// Whether opening applies pending migrations ([`PgOptions::migrate`]).
    pub(crate) migrate: bool,
    /// Whether the schema's clock is the test clock
    /// (`PgOptions::with_test_clock`, feature `test-util`).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) test_clock: bool,
    /// Sends the appends' wake-ups after they commit (`notify`).
    pub(crate) notifier: std::sync::Arc<crate::notifier::Notifier>,
    /// One permit per connection appends may hold
    /// ([`PgOptions::append_connections`], within the pool less
    /// [`PgOptions::reserved_connections`]).
    pub(crate) append_slots: std::sync::Arc<tokio::sync::Semaphore>,
    /// Appends queued for a turn, appended in groups (`group`).
    pub(crate) appends: crate::group::Queue,
    /// How long a call waits for a connection (and an append for its slot).
    pub(crate) acquire_timeout: std::time::Duration,
}

impl Drop for Db {
    fn drop(&mut self) {
        self.notifier.close();
    }
}

impl Db {
    /// Opens a pool on `schema` (creating nothing yet).
    pub(crate) fn pool(connect: PgConnectOptions, options: &PgOptions) -> Result<Db> {
        options.validate()?;
        let shown = format!("{} schema {}", redacted(&connect), options.schema);
        let mut connect = connect
            .options([("search_path", options.schema.as_str())])
            .application_name("outbox");
        if options.generic_plans {
            connect = connect.options([("plan_cache_mode", "force_generic_plan")]);
        }
        let pool = PgPoolOptions::new()
            .max_connections(options.max_connections)
            .min_connections(0)
            .acquire_timeout(options.acquire_timeout)
            // No ping per acquire (a round trip per call): a connection that
            // died idle fails its first statement with a temporary error and
            // is discarded, and the caller's retry gets a fresh one.
            .test_before_acquire(false)
            .connect_lazy_with(connect.clone());
        Ok(Db {
            pool,
            schema: options.schema.clone(),
            channel: options.channel(),
            notify: options.notify,
            shown,
            connect,
            migrate: options.migrate,
            test_clock: options.test_clock,
            notifier: Default::default(),
            append_slots: std::sync::Arc::new(tokio::sync::Semaphore::new(options.append_turns() as usize)),
            appends: Default::default(),
            acquire_timeout: options.acquire_timeout,
        })
    }

    /// Checks and migrates the schema for `role` in one transaction under a
    /// transaction-scoped advisory lock (so concurrent openers serialize and
    /// nothing leaks behind a pooler). A newer schema or one holding the other
    /// role's marker in its own table is refused before anything is written.
    pub(crate) async fn migrate(&self, role: Role) -> Result<()> {
        let shown = &self.shown;
        let err = |e| storage(format_args!("migrating the {role} tables in {shown}"), e);
        let migrator = role.migrator();
        let newest = migrator.iter().map(|m| m.version).max().unwrap_or(0);
        let mut tx = self
            .pool
            .begin()
            .await
            .map_err(|e| storage(format_args!("connecting to {shown}"), e))?;
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('outbox.migrate.' || $1, 0))")
            .bind(&self.schema)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        // 1. Read-only checks first: a refused schema is left as it was.
        let found: (Option<String>, Option<String>) =
            sqlx::query_as("SELECT to_regclass($1)::text, to_regclass($2)::text")
                .bind(format!("{}.{}", self.schema, role.migrations_table()))
                .bind(format!("{}.{}", self.schema, role.meta_table()))
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
        let version: Option<i64> = if found.0.is_some() {
            sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT MAX(version) FROM {}.{}",
                self.schema,
                role.migrations_table()
            )))
            .fetch_one(&mut *tx)
            .await
            .map_err(err)?
        } else {
            None
        };
        let marker: Option<String> = if found.1.is_some() {
            sqlx::query_scalar(AssertSqlSafe(format!(
                "SELECT value FROM {}.{} WHERE key = 'role'",
                self.schema,
                role.meta_table()
            )))
            .fetch_optional(&mut *tx)
            .await
            .map_err(err)?
        } else {
            None
        };
        if let Some(v) = version
            && v > newest
        {
            return Err(Error::SchemaTooNew {
                database: format!("{role} tables in {shown}"),
                found: v,
                supported: newest,
            });
        }
        let current = version.unwrap_or(0);
        if !self.migrate && current < newest {
            return Err(Error::SchemaTooOld {
                database: format!("{role} tables in {shown}"),
                found: current,
                supported: newest,
            });
        }
        match (&marker, version) {
            (Some(r), _) if r != role.as_str() => {
                return Err(Error::invalid(format_args!(
                    "{shown}: {} is marked as {r:?}, not {role}; refusing to use it",
                    role.meta_table()
                )));
            }
            (None, Some(_)) => {
                return Err(Error::invalid(format_args!(
                    "{shown} has outbox {role} migrations but no role marker; refusing to use it"
                )));
            }
            _ => {}
        }
        // Without `migrate` the schema is current (checked above): no write
        // (a test clock aside).
        if !self.migrate {
            self.install_test_clock(&mut tx, role).await.map_err(err)?;
            return tx.commit().await.map_err(err);
        }
        // 2. Create the schema if missing (only then: CREATE needs a privilege
        //    an existing schema's user may lack), migrate, mark the role.
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(&self.schema)
                .fetch_one(&mut *tx)
                .await
                .map_err(err)?;
        if !exists {
            // The name passed validate_identifier: lowercase, no quoting needed.
            sqlx::query(AssertSqlSafe(format!("CREATE SCHEMA {}", self.schema)))
                .execute(&mut *tx)
                .await
                .map_err(err)?;
        }
        migrator
            .run_direct(None, &mut *tx, false)
            .await
            .map_err(|e| migrate_error(format_args!("migrating the {role} tables in {shown}"), e))?;
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {}.{} (key, value) VALUES ('role', $1) ON CONFLICT (key) DO NOTHING",
            self.schema,
            role.meta_table()
        )))
        .bind(role.as_str())
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        self.install_test_clock(&mut tx, role).await.map_err(err)?;
        tx.commit().await.map_err(err)
    }

    /// In a store opened with the test clock (feature `test-util`), replaces
    /// the role's clock offset function in the schema (0 as migrated) by one
    /// that reads the offset `advance_clock_for_tests` stores in the role's
    /// meta table. Under the migration's lock, so concurrent openers do not
    /// replace it at once. Nothing otherwise.
    #[cfg_attr(not(feature = "test-util"), allow(clippy::unused_async))]
    async fn install_test_clock(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        role: Role,
    ) -> sqlx::Result<()> {
        #[cfg(feature = "test-util")]
        if self.test_clock {
            // Both names are fixed or passed validate_identifier.
            sqlx::query(AssertSqlSafe(format!(
                "CREATE OR REPLACE FUNCTION {schema}.{function}() RETURNS bigint LANGUAGE sql STABLE AS \
                 $$ SELECT COALESCE((SELECT value::bigint FROM {schema}.{meta} \
                 WHERE key = 'test_clock_offset_ms'), 0) $$",
                schema = self.schema,
                function = role.clock_offset_function(),
                meta = role.meta_table(),
            )))
            .execute(&mut **tx)
            .await?;
        }
        #[cfg(not(feature = "test-util"))]
        let _ = (tx, role);
        Ok(())
    }

    /// A transaction on a pooled connection.
    pub(crate) async fn begin(&self) -> Result<Transaction<'static, Postgres>> {
        self.pool
            .begin()
            .await
            .map_err(|e| storage(format_args!("starting a transaction on {}", self.shown), e))
    }

    /// A transaction whose commit does not wait for its WAL to be flushed
    /// (`synchronous_commit` off for it alone), for the workers' bookkeeping
    /// (ADR 0027). The setting goes with the `BEGIN`, in one simple query:
    /// no round trip of its own.
    pub(crate) async fn begin_relaxed(&self) -> Result<Transaction<'static, Postgres>> {
        self.pool
            .begin_with("BEGIN; SET LOCAL synchronous_commit TO off")
            .await
            .map_err(|e| storage(format_args!("starting a transaction on {}", self.shown), e))
    }

    /// Moves the role's clock forward by `ms` (tests only).
    #[cfg(feature = "test-util")]
    pub(crate) async fn advance_clock(&self, role: Role, ms: i64) -> Result<()> {
        if !self.test_clock {
            return Err(Error::Config(format!(
                "{} was opened without the test clock: open it with `PgOptions::with_test_clock()` to move its clock",
                self.shown
            )));
        }
        sqlx::query(AssertSqlSafe(format!(
            "INSERT INTO {t} (key, value) VALUES ('test_clock_offset_ms', $1::bigint::text) \
             ON CONFLICT (key) DO UPDATE SET value = ({t}.value::bigint + $1::bigint)::text",
            t = role.meta_table()
        )))
        .bind(ms)
        .execute(&self.pool)
        .await
        .map(|_| ())
        .map_err(|e| storage("advancing the test clock", e))
    }

    pub(crate) fn context(&self, what: &str) -> String {
        format!("{what} on {}", self.shown)
    }

    pub(crate) async fn close(&self) {
        self.notifier.close();
        self.pool.close().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_lost_while_migrating_is_temporary() {
        let reset = || sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        let e = migrate_error("migrating", sqlx::migrate::MigrateError::Execute(reset()));
        assert!(e.is_temporary(), "{e}");
        let e = migrate_error(
            "migrating",
            sqlx::migrate::MigrateError::ExecuteMigration(reset(), 1),
        );
        assert!(e.is_temporary(), "{e}");
        let e = migrate_error("migrating", sqlx::migrate::MigrateError::VersionMissing(3));
        assert!(!e.is_temporary(), "a missing migration is permanent: {e}");
    }
}

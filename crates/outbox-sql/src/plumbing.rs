//! Boilerplate both adapters need around their driver, written once.

use outbox_core::{DigestBuilder, DigestValue};

use crate::{Row, Value};

/// Which database a file or schema holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Events, outbox rows, leases, the worker registry.
    Journal,
    /// Checkpoints, watermarks, runs, projection documents and tables.
    Projection,
}

impl Role {
    /// `journal` or `projection`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Journal => "journal",
            Role::Projection => "projection",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Feeds a table's rows into a digest: `table(name)`, then each row (the
/// usual body of an adapter's `digest_table`).
pub fn digest_rows(out: &mut DigestBuilder, table: &str, rows: &[Row]) {
    out.table(table);
    for row in rows {
        digest_row(out, row);
    }
}

/// Feeds one row into a digest, each value by its kind.
pub fn digest_row(out: &mut DigestBuilder, row: &Row) {
    let values: Vec<DigestValue<'_>> = row
        .0
        .iter()
        .map(|v| match v {
            Value::Null => DigestValue::Null,
            Value::Int(i) => DigestValue::Int(*i),
            Value::Bool(b) => DigestValue::Int(i64::from(*b)),
            Value::Real(r) => DigestValue::Real(*r),
            Value::Text(t) => DigestValue::Text(t),
            Value::Bytes(b) => DigestValue::Blob(b),
        })
        .collect();
    out.row(&values);
}

/// Binds shared [`Arg`](crate::Arg)s to a `sqlx` query, in order. Expands in
/// the adapter, whose `sqlx` driver types implement the encodings.
#[macro_export]
macro_rules! bind_args {
    ($query:expr, $args:expr) => {{
        let mut q = $query;
        for a in $args {
            q = match *a {
                $crate::Arg::Int(v) => q.bind(v),
                $crate::Arg::OptInt(v) => q.bind(v),
                $crate::Arg::Text(t) => q.bind(t.to_owned()),
                $crate::Arg::OptText(t) => q.bind(t.map(str::to_owned)),
                $crate::Arg::Bool(b) => q.bind(b),
            };
        }
        q
    }};
}

/// Declares an adapter's projection transaction handle `$name` over a
/// `sqlx` transaction of `$db` whose connection is `$conn`: `new`,
/// `dialect`, `commit`, `conn`, `Debug`, and `Deref`/`DerefMut` to the
/// connection (for hand-written SQL). Doc attributes go on the struct.
#[macro_export]
macro_rules! transaction_handle {
    ($(#[$meta:meta])* $name:ident, $db:ty, $conn:ty) => {
        $(#[$meta])*
        pub struct $name {
            tx: ::sqlx::Transaction<'static, $db>,
            dialect: ::std::sync::Arc<$crate::Dialect>,
            /// State the adapter's guard keeps for the transaction.
            guard: Option<i64>,
            /// Document writes not yet sent (single-writer dialects only).
            pub(crate) views: $crate::ViewWrites,
            /// The live generations resolved when the transaction began.
            pub(crate) generations: ::std::sync::Arc<::outbox_core::spi::GenerationMap>,
        }

        impl $name {
            pub(crate) fn new(tx: ::sqlx::Transaction<'static, $db>, dialect: ::std::sync::Arc<$crate::Dialect>) -> Self {
                $name {
                    tx,
                    dialect,
                    guard: None,
                    views: $crate::ViewWrites::default(),
                    generations: ::std::sync::Arc::default(),
                }
            }

            /// Resolves the live generations for this transaction: from
            /// `cache` (`Some`), or read now.
            pub(crate) async fn resolve_generations(
                &mut self,
                cache: Option<&$crate::generations::GenerationCache>,
            ) -> ::outbox_core::Result<()> {
                let dialect = self.dialect();
                self.generations = match cache {
                    Some(cache) => cache.get(&dialect, self).await?,
                    None => $crate::generations::load_map(&dialect, self).await?,
                };
                Ok(())
            }

            /// Writes out the pending document writes (see [`ViewWrites`]($crate::ViewWrites)).
            pub(crate) async fn flush_views(&mut self) -> ::outbox_core::Result<()> {
                if self.views.is_empty() {
                    return Ok(());
                }
                let mut views = ::std::mem::take(&mut self.views);
                let dialect = self.dialect();
                let flushed = views.flush(&dialect, self).await;
                // Keep what it learnt (document hashes, digest changes).
                self.views = views;
                flushed
            }

            /// The shared statements' dialect.
            pub(crate) fn dialect(&self) -> ::std::sync::Arc<$crate::Dialect> {
                ::std::sync::Arc::clone(&self.dialect)
            }

            /// Writes out the pending documents and the running digest
            /// changes (one statement per projection changed), then commits;
            /// `err` maps the commit's own error.
            pub(crate) async fn commit(
                mut self,
                err: impl FnOnce(::sqlx::Error) -> ::outbox_core::Error,
            ) -> ::outbox_core::Result<()> {
                self.flush_views().await?;
                let mut views = ::std::mem::take(&mut self.views);
                let dialect = self.dialect();
                views.flush_digests(&dialect, &mut self).await?;
                self.tx.commit().await.map_err(err)
            }

            /// The connection, inside the store's transaction.
            pub fn conn(&mut self) -> &mut $conn {
                &mut self.tx
            }
        }

        impl ::std::fmt::Debug for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(stringify!($name))
            }
        }

        impl ::std::ops::Deref for $name {
            type Target = $conn;
            fn deref(&self) -> &$conn {
                &self.tx
            }
        }

        impl ::std::ops::DerefMut for $name {
            fn deref_mut(&mut self) -> &mut $conn {
                &mut self.tx
            }
        }
    };
}

/// Implements [`Conn`](crate::Conn) for `$ty` (anything that derefs mutably
/// to the driver connection through `$conn`) by calling the adapter's
/// `crate::sql::execute` and `crate::sql::fetch` (each adapter defines both
/// over its driver connection; the paths resolve in the adapter).
// `crate::` deliberately names the adapter that invokes the macro: each
// adapter defines `sql::{execute, fetch, to_row}` and `db::storage`.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! impl_conn {
    ($ty:ty, |$this:ident| $conn:expr) => {
        #[::outbox_core::async_trait]
        impl $crate::Conn for $ty {
            async fn execute(
                &mut self,
                what: &str,
                sql: &str,
                args: &[$crate::Arg<'_>],
            ) -> ::outbox_core::Result<u64> {
                let $this = self;
                crate::sql::execute($conn, what, sql, args).await
            }

            async fn fetch(
                &mut self,
                what: &str,
                sql: &str,
                args: &[$crate::Arg<'_>],
            ) -> ::outbox_core::Result<Vec<$crate::Row>> {
                let $this = self;
                crate::sql::fetch($conn, what, sql, args).await
            }
        }
    };
}

/// Defines the adapter's `execute` and `fetch` over its driver connection
/// `$conn`: bind the shared arguments, run, map errors with the adapter's
/// `crate::db::storage`, and convert rows with its `crate::sql::to_row`.
// `crate::` deliberately names the adapter that invokes the macro: each
// adapter defines `sql::{execute, fetch, to_row}` and `db::storage`.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! driver_io {
    ($conn:ty) => {
        /// Binds `args` to `sql`, runs it and returns the rows it changed.
        pub(crate) async fn execute(
            conn: &mut $conn,
            what: &str,
            sql: &str,
            args: &[$crate::Arg<'_>],
        ) -> ::outbox_core::Result<u64> {
            let q = $crate::bind_args!(::sqlx::query(::sqlx::AssertSqlSafe(sql.to_owned())), args);
            q.execute(conn)
                .await
                .map(|r| r.rows_affected())
                .map_err(|e| crate::db::storage(what, e))
        }

        /// Binds `args` to `sql`, runs it and returns its rows.
        pub(crate) async fn fetch(
            conn: &mut $conn,
            what: &str,
            sql: &str,
            args: &[$crate::Arg<'_>],
        ) -> ::outbox_core::Result<Vec<$crate::Row>> {
            let q = $crate::bind_args!(::sqlx::query(::sqlx::AssertSqlSafe(sql.to_owned())), args);
            let rows = q
                .fetch_all(conn)
                .await
                .map_err(|e| crate::db::storage(what, e))?;
            rows.iter()
                .map(|r| crate::sql::to_row(r).map_err(|e| crate::db::storage(what, e)))
                .collect()
        }
    };
}

/// Declares an adapter's `WriteTx` (a `sqlx` transaction of `$db`) and
/// `ReadConn` (a pooled connection) as [`Tx`](crate::Tx) and
/// [`Conn`](crate::Conn), over the adapter's `crate::sql::{execute, fetch}`
/// and `crate::db::storage` error mapping.
// `crate::` deliberately names the adapter that invokes the macro: each
// adapter defines `sql::{execute, fetch, to_row}` and `db::storage`.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! driver_conns {
    ($db:ty) => {
        /// A write transaction.
        pub(crate) struct WriteTx(pub(crate) ::sqlx::Transaction<'static, $db>);

        /// A connection from the pool.
        pub(crate) struct ReadConn(pub(crate) ::sqlx::pool::PoolConnection<$db>);

        $crate::impl_conn!(WriteTx, |this| &mut this.0);
        $crate::impl_conn!(ReadConn, |this| &mut this.0);

        #[::outbox_core::async_trait]
        impl $crate::Tx for WriteTx {
            async fn commit(self: Box<Self>, what: &str) -> ::outbox_core::Result<()> {
                self.0
                    .commit()
                    .await
                    .map_err(|e| crate::db::storage(what, e))
            }
        }
    };
}

/// Maps a `sqlx` migration failure: a database error inside it (a
/// connection reset while migrating, an admin shutdown, a busy file) is
/// classified by the adapter's `crate::db::storage` like any statement's; a
/// failure of the migration files themselves (checksum mismatch, a missing or
/// dirty version) is a permanent storage error.
// `crate::` deliberately names the adapter that invokes the macro.
#[allow(clippy::crate_in_macro_def)]
#[macro_export]
macro_rules! migrate_error {
    ($context:expr, $e:expr) => {
        match $e {
            ::sqlx::migrate::MigrateError::Execute(db)
            | ::sqlx::migrate::MigrateError::ExecuteMigration(db, _) => crate::db::storage($context, db),
            other => ::outbox_core::Error::Storage {
                message: format!("{}: {other}", $context),
                temporary: false,
                source: Some(Box::new(other)),
            },
        }
    };
}

//! [`RunStore`](outbox_core::RunStore) on the projection database: the
//! `outbox_runs` table, through the shared statements of [`outbox_sql::runs`].

outbox_sql::impl_run_store!(crate::SqliteProjectionStore, db);

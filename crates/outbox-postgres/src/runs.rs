//! [`RunStore`](outbox_core::RunStore) on the projection database: the
//! `outbox_runs` table, through the shared statements of [`outbox_sql::runs`]
//! with the projection role's clock (one active run per projection is
//! enforced by the partial unique index `outbox_runs_active`).

outbox_sql::impl_run_store!(crate::PgProjectionStore, sql);

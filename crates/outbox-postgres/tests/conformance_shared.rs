//! The shared conformance suite against Postgres, with the journal and the
//! projections in ONE schema sharing one pool (`PgProjectionStore::sharing`).

mod common;

use common::PgHarness;

outbox_testkit::conformance_tests!(PgHarness::shared());

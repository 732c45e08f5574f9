//! The shared conformance suite against Postgres, with the journal and the
//! projections in two schemas with their own pools (as in two databases).

mod common;

use common::PgHarness;

outbox_testkit::conformance_tests!(PgHarness::default());

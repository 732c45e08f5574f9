//! The shared conformance suite against Postgres, with the journal and the
//! projections in ONE schema sharing one pool (`PgProjectionStore::sharing`).

mod common;

use common::PgHarness;

// Each test returns at once when the Postgres tests are skipped (no server
// outside CI; the binary says so in one line).
outbox_testkit::conformance_tests!(match PgHarness::shared() {
    Some(harness) => harness,
    None => return,
});

//! The shared conformance suite against Postgres, with the journal and the
//! projections in two schemas with their own pools (as in two databases).

mod common;

use common::PgHarness;

// Each test returns at once when the Postgres tests are skipped (no server
// outside CI; the binary says so in one line).
outbox_testkit::conformance_tests!(match PgHarness::two_schemas() {
    Some(harness) => harness,
    None => return,
});

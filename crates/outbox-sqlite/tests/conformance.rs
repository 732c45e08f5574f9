//! The shared conformance suite, run against the SQLite adapters.

mod common;

use common::SqliteHarness;

outbox_testkit::conformance_tests!(SqliteHarness);

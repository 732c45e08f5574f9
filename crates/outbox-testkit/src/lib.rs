#![doc = include_str!("../README.md")]

pub mod checks;
mod drain;
mod harness;
pub mod nats;
pub mod oracle;
pub mod pg;
mod util;

pub use drain::{DrainStats, drain};
pub use harness::{Fixture, Harness, HeldAppend, TxOf, one};
pub use oracle::{
    Expected, Faults, OracleProjection, OracleState, OracleStream, add, audit, check_history,
    oracle_registry, read_state, value_of,
};
pub use util::{Seed, sid, stream_ids};

/// Expands every conformance check into a named `#[tokio::test]`.
///
/// ```ignore
/// // crates/outbox-foo/tests/conformance.rs
/// outbox_testkit::conformance_tests!(my_adapter::FooHarness::default());
/// ```
///
/// The calling crate needs `tokio` (with `macros` and `rt-multi-thread`) as a
/// dev-dependency. Each test builds the harness with the given expression and
/// runs one check from [`checks`] against it.
#[macro_export]
macro_rules! conformance_tests {
    ($harness:expr) => {
        $crate::for_each_check!($crate::__expand_check, $harness);
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __expand_check {
    ($harness:expr; $($name:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let harness = $harness;
                $crate::checks::$name(&harness).await;
            }
        )*
    };
}

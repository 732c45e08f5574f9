//! The column lists that statements of several modules select (the shared
//! statements of journal.rs and dialect.rs, the adapters' hot statements),
//! as macros that expand to literals so `concat!` builds `&'static str`
//! statements from them. A leaf: it imports nothing.

/// The columns of an outbox row, in the order
/// [`decode_row`](crate::journal::decode_row) reads them, as a literal (for
/// `concat!` in the adapters' hot statements).
#[macro_export]
macro_rules! outbox_row_columns {
    () => {
        "stream, seq, event_type, status, attempt_count, next_attempt_at, last_error, updated_at, first_failed_at, \
         alone"
    };
}

/// The columns of an event, in the order
/// [`decode_event`](crate::journal::decode_event) reads them, as a literal.
#[macro_export]
macro_rules! event_columns {
    () => {
        "global_position, stream, seq, event_type, intent, payload, payload_hash, recorded_at, \
         correlation_id, causation_id"
    };
}

//! The append's statements, shared by the engine's append (`journal.rs`)
//! and the append inside a caller's transaction (`append_in.rs`).

/// A stream's version (its last seq; the column is named `head`), if it
/// has events.
pub(crate) const READ_VERSION: &str = "SELECT head FROM streams WHERE stream = ?1";

/// One event.
pub(crate) const INSERT_EVENT: &str = "INSERT INTO events (stream, seq, event_type, intent, payload, \
     payload_hash, recorded_at, correlation_id, causation_id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)";

/// One event's outbox row, pending and due at `?4` (the append's time), in
/// partition `?5`.
pub(crate) const INSERT_ROW: &str = "INSERT INTO outbox (stream, seq, event_type, status, attempt_count, \
     next_attempt_at, last_error, updated_at, partition_no) VALUES (?1, ?2, ?3, 'pending', 0, ?4, NULL, ?4, ?5)";

/// The stream's outbox head: new rows are behind any existing ones, so an
/// existing head stays.
pub(crate) const INSERT_HEAD: &str = "INSERT INTO outbox_heads (stream, head_seq, due_at, partition_no) \
     VALUES (?1, ?2, ?3, ?4) ON CONFLICT (stream) DO NOTHING";

/// The stream's new version.
pub(crate) const UPSERT_STREAM: &str = "INSERT INTO streams (stream, head) VALUES (?1, ?2) \
     ON CONFLICT (stream) DO UPDATE SET head = excluded.head";

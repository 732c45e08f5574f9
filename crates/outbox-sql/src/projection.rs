//! The projection database's cold paths (filled in as they move here).

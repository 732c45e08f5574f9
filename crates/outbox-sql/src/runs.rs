//! The projection database's replay runs (`RunStore`), shared.

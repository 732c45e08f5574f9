//! Identifiers: streams, seqs, event types, projections, workers and
//! partitions.
//!
//! This module holds the types and what cannot fail; the checking
//! constructors and conversions, which return `Error`, are in `validate.rs`.
//! `Error`'s variants carry `StreamId` and `Seq`, so keeping what names
//! `Error` out of this module keeps `error` and `id` from importing each
//! other (`cargo xtask tidy` refuses module cycles).

use std::fmt;

use serde::{Deserialize, Serialize};

mod validate;

/// The longest identifier (stream id, event type, projection name, owner) accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// What the identifier is, as its validation errors name it.
            const KIND: &'static str = $kind;

            /// The identifier as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl From<$name> for String {
            fn from(value: $name) -> String {
                value.0
            }
        }
    };
}

string_id!(
    /// Identifies one stream: the unit of ordering (the source documents'
    /// campaign). Seqs are contiguous per stream and every projection applies a
    /// stream's events in seq order.
    StreamId,
    "stream id"
);
string_id!(
    /// The name of an event type, registered with an [`Intent`](crate::Intent)
    /// in the [`EventTypeRegistry`](crate::EventTypeRegistry).
    EventType,
    "event type"
);
string_id!(
    /// The name of a projection. Checkpoints are kept per (projection, stream).
    ProjectionName,
    "projection name"
);
string_id!(
    /// The name of a sink (a publisher beside the projections, ADR 0023).
    /// Delivery checkpoints are kept per (sink, stream).
    SinkName,
    "sink name"
);
string_id!(
    /// Identifies one worker instance; the owner recorded on a stream lease.
    /// Must be unique per running worker (host, pid and a random suffix is the
    /// runtime's choice).
    WorkerId,
    "worker id"
);

/// A position in one stream: 1 for the first event, then 2, 3, ... with no holes.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "u64", into = "u64")]
pub struct Seq(u64);

impl Seq {
    /// The first seq of every stream.
    pub const FIRST: Seq = Seq(1);
    /// The largest seq any adapter stores (SQL adapters use signed 64-bit columns).
    pub const MAX: Seq = Seq(i64::MAX as u64);

    /// The seq as a number.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// The following seq.
    ///
    /// # Panics
    /// Never in practice: a stream would need `i64::MAX` events.
    pub fn next(self) -> Seq {
        Seq(self.0 + 1)
    }

    /// The seq as an `i64`, for SQL binds. Always lossless.
    pub const fn as_i64(self) -> i64 {
        self.0 as i64
    }
}

impl From<Seq> for u64 {
    fn from(value: Seq) -> u64 {
        value.0
    }
}

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// One partition of a journal: `0 .. count`, shown as `p00`, `p01`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct Partition(u16);

impl Partition {
    /// Partition number `n`.
    pub const fn new(n: u16) -> Self {
        Partition(n)
    }

    /// Its number.
    pub const fn get(self) -> u16 {
        self.0
    }

    /// Every partition of a journal with `count` partitions, in order.
    pub fn all(count: u16) -> impl Iterator<Item = Partition> {
        (0..count).map(Partition)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{:02}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_through_serde_and_validate() {
        let id = StreamId::new("s").unwrap();
        let json = serde_json::to_string(&id).unwrap();
        assert_eq!(json, "\"s\"");
        assert_eq!(serde_json::from_str::<StreamId>(&json).unwrap(), id);
        assert!(serde_json::from_str::<StreamId>("\"\"").is_err());
        assert!(serde_json::from_str::<Seq>("0").is_err());
    }
}

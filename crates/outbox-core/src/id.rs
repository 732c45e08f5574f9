//! Identifiers: streams, seqs, event types, projections, workers and
//! partitions.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Error, Result};

/// The longest identifier (stream id, event type, projection name, owner) accepted, in bytes.
pub const MAX_ID_LEN: usize = 255;

fn validate_id(kind: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(format_args!("{kind} must not be empty")));
    }
    if value.len() > MAX_ID_LEN {
        return Err(Error::invalid(format_args!(
            "{kind} is {} bytes long; at most {MAX_ID_LEN} are allowed",
            value.len()
        )));
    }
    if value.chars().any(char::is_control) {
        return Err(Error::invalid(format_args!(
            "{kind} {value:?} contains a control character"
        )));
    }
    if value.trim() != value {
        return Err(Error::invalid(format_args!(
            "{kind} {value:?} has leading or trailing whitespace"
        )));
    }
    Ok(())
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $kind:literal) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            /// Validates and wraps `value`: non-empty, at most [`MAX_ID_LEN`]
            /// bytes, no control characters, no surrounding whitespace.
            pub fn new(value: impl Into<String>) -> Result<Self> {
                let value = value.into();
                validate_id($kind, &value)?;
                Ok(Self(value))
            }

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

        impl TryFrom<String> for $name {
            type Error = Error;
            fn try_from(value: String) -> Result<Self> {
                Self::new(value)
            }
        }

        impl TryFrom<&str> for $name {
            type Error = Error;
            fn try_from(value: &str) -> Result<Self> {
                Self::new(value)
            }
        }

        impl std::str::FromStr for $name {
            type Err = Error;
            fn from_str(value: &str) -> Result<Self> {
                Self::new(value)
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

    /// Wraps `value`, which must be in `1..=Seq::MAX`.
    pub fn new(value: u64) -> Result<Self> {
        if value == 0 || value > Self::MAX.0 {
            return Err(Error::invalid(format_args!(
                "seq {value} is out of range (seqs start at 1 and fit in a signed 64-bit integer)"
            )));
        }
        Ok(Seq(value))
    }

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

impl TryFrom<u64> for Seq {
    type Error = Error;
    fn try_from(value: u64) -> Result<Self> {
        Seq::new(value)
    }
}

impl TryFrom<i64> for Seq {
    type Error = Error;
    fn try_from(value: i64) -> Result<Self> {
        u64::try_from(value)
            .map_err(|_| Error::invalid(format_args!("seq {value} is negative")))
            .and_then(Seq::new)
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

impl std::str::FromStr for Seq {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let n: u64 = s
            .parse()
            .map_err(|_| Error::invalid(format_args!("seq {s:?} is not a positive integer")))?;
        Seq::new(n)
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

    /// `InvalidInput` unless the partition exists in a journal of `count`.
    pub fn check(self, count: u16) -> Result<Partition> {
        if self.0 >= count {
            return Err(Error::invalid(format!(
                "partition {self} does not exist: the journal has {count} partitions (p00 to {})",
                Partition(count.saturating_sub(1))
            )));
        }
        Ok(self)
    }
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "p{:02}", self.0)
    }
}

impl FromStr for Partition {
    type Err = Error;

    /// `p07` or `7`.
    fn from_str(s: &str) -> Result<Self> {
        let digits = s.strip_prefix('p').unwrap_or(s);
        digits.parse::<u16>().map(Partition).map_err(|_| {
            Error::invalid(format!(
                "`{s}` is not a partition (expected p00, p01, ... or a number)"
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_reject_malformed_values() {
        for bad in ["", " a", "a ", "a\nb", "\u{7f}"] {
            assert!(StreamId::new(bad).is_err(), "{bad:?} accepted");
        }
        assert!(StreamId::new("x".repeat(MAX_ID_LEN)).is_ok());
        assert!(StreamId::new("x".repeat(MAX_ID_LEN + 1)).is_err());
        assert_eq!(StreamId::new("campaign-1").unwrap().as_str(), "campaign-1");
    }

    #[test]
    fn seq_range_is_enforced() {
        assert!(Seq::new(0).is_err());
        assert!(Seq::new(u64::MAX).is_err());
        assert_eq!(Seq::new(1).unwrap(), Seq::FIRST);
        assert_eq!(
            Seq::try_from(-1i64).unwrap_err().to_string(),
            "invalid input: seq -1 is negative"
        );
        assert_eq!("7".parse::<Seq>().unwrap().get(), 7);
        assert!("x".parse::<Seq>().is_err());
    }

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

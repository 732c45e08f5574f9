//! The ids' checking constructors and fallible conversions: everything about
//! the ids that returns [`Error`]. They live apart from the types (id.rs)
//! because `Error`'s variants carry `StreamId` and `Seq`: with them there,
//! `error` and `id` would import each other.

use std::str::FromStr;

use super::{EventType, MAX_ID_LEN, Partition, ProjectionName, Seq, SinkName, StreamId, WorkerId};
use crate::{Error, Result};

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

macro_rules! checked_string_id {
    ($($name:ident),+) => {$(
        impl $name {
            /// Validates and wraps `value`: non-empty, at most [`MAX_ID_LEN`]
            /// bytes, no control characters, no surrounding whitespace.
            pub fn new(value: impl Into<String>) -> Result<Self> {
                let value = value.into();
                validate_id(Self::KIND, &value)?;
                Ok(Self(value))
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

        impl FromStr for $name {
            type Err = Error;
            fn from_str(value: &str) -> Result<Self> {
                Self::new(value)
            }
        }
    )+};
}

checked_string_id!(StreamId, EventType, ProjectionName, SinkName, WorkerId);

impl Seq {
    /// Wraps `value`, which must be in `1..=Seq::MAX`.
    pub fn new(value: u64) -> Result<Self> {
        if value == 0 || value > Self::MAX.0 {
            return Err(Error::invalid(format_args!(
                "seq {value} is out of range (seqs start at 1 and fit in a signed 64-bit integer)"
            )));
        }
        Ok(Seq(value))
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

impl FromStr for Seq {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        let n: u64 = s
            .parse()
            .map_err(|_| Error::invalid(format_args!("seq {s:?} is not a positive integer")))?;
        Seq::new(n)
    }
}

impl Partition {
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

    /// The messages are part of the contract (operators read them, tests
    /// of other crates compare them): one of each kind, word for word.
    #[test]
    fn messages_name_the_kind_and_the_rule() {
        let message = |r: Result<ProjectionName>| r.unwrap_err().to_string();
        assert_eq!(
            message(ProjectionName::new("")),
            "invalid input: projection name must not be empty"
        );
        assert_eq!(
            WorkerId::new("a\tb").unwrap_err().to_string(),
            "invalid input: worker id \"a\\tb\" contains a control character"
        );
        assert_eq!(
            " e".parse::<EventType>().unwrap_err().to_string(),
            "invalid input: event type \" e\" has leading or trailing whitespace"
        );
        assert_eq!(
            SinkName::try_from("x".repeat(MAX_ID_LEN + 1))
                .unwrap_err()
                .to_string(),
            "invalid input: sink name is 256 bytes long; at most 255 are allowed"
        );
        assert_eq!(
            Partition::new(4).check(4).unwrap_err().to_string(),
            "invalid input: partition p04 does not exist: the journal has 4 partitions (p00 to p03)"
        );
        assert_eq!(
            "q1".parse::<Partition>().unwrap_err().to_string(),
            "invalid input: `q1` is not a partition (expected p00, p01, ... or a number)"
        );
        assert_eq!("p07".parse::<Partition>().unwrap(), Partition::new(7));
    }
}

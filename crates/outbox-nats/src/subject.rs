//! Which NATS subject an event is published on.

use outbox_core::{Error, Event, Result};

/// How events map to subjects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subjects {
    /// Every event on one subject.
    Fixed(String),
    /// `PREFIX.<event type>`, the event type's characters that a subject
    /// cannot hold (space, `*`, `>`, control characters) replaced by `_`;
    /// its dots separate subject tokens, so a stream captures
    /// `PREFIX.>`.
    ByEventType(String),
}

impl Subjects {
    /// `InvalidInput` unless the fixed subject or prefix is a valid literal
    /// subject: tokens of printable characters without space, `*` or `>`,
    /// separated by single dots.
    pub fn validate(&self) -> Result<()> {
        let s = match self {
            Subjects::Fixed(s) | Subjects::ByEventType(s) => s,
        };
        let bad = s.is_empty()
            || s.split('.').any(|t| {
                t.is_empty()
                    || t.chars()
                        .any(|c| c.is_whitespace() || c.is_control() || c == '*' || c == '>')
            });
        if bad {
            return Err(Error::invalid(format!(
                "`{s}` is not a NATS subject (dot-separated tokens without spaces, `*` or `>`)"
            )));
        }
        Ok(())
    }

    /// The subject of `event`.
    pub fn of(&self, event: &Event) -> String {
        match self {
            Subjects::Fixed(s) => s.clone(),
            Subjects::ByEventType(prefix) => {
                let tokens: Vec<String> = event
                    .event_type
                    .as_str()
                    .split('.')
                    .map(|t| {
                        let t: String = t
                            .chars()
                            .map(|c| {
                                if c.is_whitespace() || c.is_control() || c == '*' || c == '>' {
                                    '_'
                                } else {
                                    c
                                }
                            })
                            .collect();
                        if t.is_empty() { "_".to_owned() } else { t }
                    })
                    .collect();
                format!("{prefix}.{}", tokens.join("."))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use outbox_core::{EventType, Intent, Metadata, PayloadHash, Seq, StreamId, Timestamp};

    fn event(t: &str) -> Event {
        Event {
            stream: StreamId::new("s").unwrap(),
            seq: Seq::new(1).unwrap(),
            global_position: 1,
            event_type: EventType::new(t).unwrap(),
            intent: Intent::Apply,
            payload_hash: PayloadHash::of(b""),
            decoded: Default::default(),
            payload: Vec::new(),
            metadata: Metadata {
                recorded_at: Timestamp::from_millis(0),
                correlation_id: None,
                causation_id: None,
            },
        }
    }

    #[test]
    fn subjects_by_event_type_are_valid_literals() {
        let s = Subjects::ByEventType("outbox".into());
        assert_eq!(s.of(&event("dice.rolled")), "outbox.dice.rolled");
        assert_eq!(s.of(&event("a b*c>..d")), "outbox.a_b_c_._.d");
        assert_eq!(Subjects::Fixed("x.y".into()).of(&event("z")), "x.y");
    }

    #[test]
    fn bad_subjects_are_refused() {
        for bad in ["", "a..b", "a.*", "a >", ".a"] {
            assert!(Subjects::Fixed(bad.into()).validate().is_err(), "{bad:?}");
        }
        assert!(Subjects::ByEventType("outbox.events".into()).validate().is_ok());
    }
}

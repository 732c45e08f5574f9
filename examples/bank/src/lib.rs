#![doc = include_str!("../README.md")]

use std::sync::{Arc, OnceLock};

use outbox_core::typed::{DomainEvent, EventKind, TypedViewProjection, json, typed};
use outbox_core::{
    AppendRequest, BoxError, Event, EventTypeRegistry, ExpectedVersion, MAX_PAGE, ProjectionName, StreamId,
    ViewProjection, ViewReader, ViewStore, ViewTx, async_trait,
};
use outbox_runtime::{JournalBackend, OutboxBuilder, ProjectionBackend};
use serde::{Deserialize, Serialize};

/// Event type: an account was opened (applied).
pub const ACCOUNT_OPENED: &str = "account_opened";
/// Event type: money was paid in (applied).
pub const DEPOSITED: &str = "deposited";
/// Event type: money was paid out (applied).
pub const WITHDRAWN: &str = "withdrawn";
/// Event type: someone looked at the statement (audit-only: kept in the
/// journal, never projected).
pub const STATEMENT_VIEWED: &str = "statement_viewed";

/// The `balances` projection's name.
pub const BALANCES: &str = "balances";
/// The `daily_totals` projection's name.
pub const DAILY_TOTALS: &str = "daily_totals";
/// The table of `balances`: one [`Account`] per account stream.
pub const ACCOUNTS_TABLE: &str = "accounts";
/// The table of `daily_totals`: one [`DayTotals`] per (day, account), keyed
/// `<day>/<account>`.
pub const DAYS_TABLE: &str = "days";

fn registry() -> &'static EventTypeRegistry {
    static TYPES: OnceLock<EventTypeRegistry> = OnceLock::new();
    TYPES.get_or_init(|| EventTypeRegistry::of::<BankEvent>().expect("the bank's event type names are valid"))
}

/// The bank's event types with their intents, derived from [`BankEvent`]'s
/// kinds (the binary and [`register`] use it).
pub fn event_types() -> EventTypeRegistry {
    registry().clone()
}

/// What happens to an account. Each account is one stream; the event's
/// fields are its JSON payload (the type is the event type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BankEvent {
    /// `account_opened`: `{"owner": ..}`.
    AccountOpened {
        /// Who holds the account.
        owner: String,
    },
    /// `deposited`: `{"cents": .., "day": "YYYY-MM-DD"}`.
    Deposited {
        /// The amount, in cents (positive).
        cents: i64,
        /// The booking day, `YYYY-MM-DD`.
        day: String,
    },
    /// `withdrawn`: `{"cents": .., "day": "YYYY-MM-DD"}`.
    Withdrawn {
        /// The amount, in cents (positive).
        cents: i64,
        /// The booking day, `YYYY-MM-DD`.
        day: String,
    },
    /// `statement_viewed` (audit-only): `{"by": ..}`.
    StatementViewed {
        /// Who looked.
        by: String,
    },
}

#[derive(Serialize, Deserialize)]
struct Opened {
    owner: String,
}

#[derive(Serialize, Deserialize)]
struct Movement {
    cents: i64,
    day: String,
}

#[derive(Serialize, Deserialize)]
struct Viewed {
    by: String,
}

/// Checks what every path checks: owners are not blank, amounts are
/// positive, days are `YYYY-MM-DD`.
fn check(e: &BankEvent) -> Result<(), String> {
    match e {
        BankEvent::AccountOpened { owner } if owner.trim().is_empty() => {
            Err("the owner of an account must not be blank".into())
        }
        BankEvent::Deposited { cents, day } | BankEvent::Withdrawn { cents, day } => {
            if *cents <= 0 {
                return Err(format!(
                    "an amount must be a positive number of cents, got {cents}"
                ));
            }
            let b = day.as_bytes();
            let shape = b.len() == 10
                && b.iter().enumerate().all(|(i, c)| {
                    if i == 4 || i == 7 {
                        *c == b'-'
                    } else {
                        c.is_ascii_digit()
                    }
                });
            if !shape {
                return Err(format!("a booking day must be YYYY-MM-DD, got {day:?}"));
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

impl BankEvent {
    /// The event type this event is recorded as.
    pub fn event_type(&self) -> &'static str {
        self.kind().name
    }
}

/// The bank's events as typed values: appended with
/// `outbox.append_typed(..)` (or [`DomainEvent::to_new_event`]), read back
/// by the projections decoded ([`typed`]). Encoding a blank owner, a
/// non-positive amount or a malformed day is refused (on the request path,
/// before it reaches the journal); decoding checks the same. (An overdraft
/// cannot be judged here; the `balances` projection refuses it when it
/// applies the event.)
impl DomainEvent for BankEvent {
    const KINDS: &'static [EventKind] = &[
        EventKind::apply(ACCOUNT_OPENED),
        EventKind::apply(DEPOSITED),
        EventKind::apply(WITHDRAWN),
        EventKind::audit_only(STATEMENT_VIEWED),
    ];

    fn kind(&self) -> EventKind {
        Self::KINDS[match self {
            BankEvent::AccountOpened { .. } => 0,
            BankEvent::Deposited { .. } => 1,
            BankEvent::Withdrawn { .. } => 2,
            BankEvent::StatementViewed { .. } => 3,
        }]
    }

    fn encode(&self) -> Result<Vec<u8>, BoxError> {
        check(self)?;
        match self {
            BankEvent::AccountOpened { owner } => json::encode(&Opened { owner: owner.clone() }),
            BankEvent::Deposited { cents, day } | BankEvent::Withdrawn { cents, day } => {
                json::encode(&Movement {
                    cents: *cents,
                    day: day.clone(),
                })
            }
            BankEvent::StatementViewed { by } => json::encode(&Viewed { by: by.clone() }),
        }
    }

    fn decode(event_type: &str, payload: &[u8]) -> Result<Self, BoxError> {
        let decoded = match event_type {
            ACCOUNT_OPENED => {
                let p: Opened = json::decode(payload)?;
                BankEvent::AccountOpened { owner: p.owner }
            }
            DEPOSITED => {
                let p: Movement = json::decode(payload)?;
                BankEvent::Deposited {
                    cents: p.cents,
                    day: p.day,
                }
            }
            WITHDRAWN => {
                let p: Movement = json::decode(payload)?;
                BankEvent::Withdrawn {
                    cents: p.cents,
                    day: p.day,
                }
            }
            STATEMENT_VIEWED => {
                let p: Viewed = json::decode(payload)?;
                BankEvent::StatementViewed { by: p.by }
            }
            other => return Err(format!("the bank has no event type {other:?}").into()),
        };
        check(&decoded)?;
        Ok(decoded)
    }
}

/// An account as `balances` keeps it (table [`ACCOUNTS_TABLE`], keyed by the
/// account's stream id).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Account {
    /// Who holds it.
    pub owner: String,
    /// The balance, in cents (negative only within an overdraft limit).
    pub balance_cents: i64,
    /// The seq of the last event applied to it.
    pub last_seq: u64,
}

/// One account's movements on one day, as `daily_totals` keeps them (table
/// [`DAYS_TABLE`], keyed `<day>/<account>`), or a whole day's sum from
/// [`day_totals`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DayTotals {
    /// Paid in, in cents.
    pub deposited_cents: i64,
    /// Paid out, in cents.
    pub withdrawn_cents: i64,
    /// Deposits counted.
    pub deposits: u64,
    /// Withdrawals counted.
    pub withdrawals: u64,
}

fn add(total: i64, cents: i64, what: &str) -> Result<i64, BoxError> {
    total
        .checked_add(cents)
        .ok_or_else(|| format!("{what} overflows").into())
}

/// Cents as a decimal amount, for messages.
fn money(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    let c = cents.unsigned_abs();
    format!("{sign}{}.{:02}", c / 100, c % 100)
}

fn projection_name(name: &str) -> ProjectionName {
    ProjectionName::new(name).expect("the bank's projection names are valid")
}

/// `balances`: one [`Account`] document per account.
///
/// Opening an account twice, moving money on an account never opened, and
/// a withdrawal that would take the balance below minus the overdraft limit
/// (0 unless [`Balances::with_overdraft_limit`]) are applier errors: the
/// apply transaction rolls back (no document, no checkpoint moves) and the
/// outbox row is retried, then dead-lettered, blocking only its account.
#[derive(Clone, Debug)]
pub struct Balances {
    name: ProjectionName,
    overdraft_limit_cents: i64,
}

impl Default for Balances {
    fn default() -> Self {
        Self::new()
    }
}

impl Balances {
    /// The projection, with no overdraft allowed.
    pub fn new() -> Self {
        Balances {
            name: projection_name(BALANCES),
            overdraft_limit_cents: 0,
        }
    }

    /// Allows balances down to `-cents` (the "fix" an operator deploys
    /// before requeueing a dead-lettered withdrawal). Negative limits count
    /// as 0.
    pub fn with_overdraft_limit(mut self, cents: i64) -> Self {
        self.overdraft_limit_cents = cents.max(0);
        self
    }
}

#[async_trait]
impl TypedViewProjection<BankEvent> for Balances {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event, value: &BankEvent) -> Result<(), BoxError> {
        let account = event.stream.as_str();
        let existing: Option<Account> = view.get(ACCOUNTS_TABLE, account).await?;
        let mut doc = match (value.clone(), existing) {
            (BankEvent::AccountOpened { owner }, None) => Account {
                owner,
                ..Account::default()
            },
            (BankEvent::AccountOpened { .. }, Some(_)) => {
                return Err(format!("{account}/{}: the account is already open", event.seq).into());
            }
            (BankEvent::StatementViewed { .. }, _) => return Ok(()), // audit-only: never applied
            (_, None) => {
                return Err(format!(
                    "{} {account}/{}: the account was never opened",
                    event.event_type, event.seq
                )
                .into());
            }
            (BankEvent::Deposited { cents, .. }, Some(mut a)) => {
                a.balance_cents = add(a.balance_cents, cents, "the balance")?;
                a
            }
            (BankEvent::Withdrawn { cents, .. }, Some(mut a)) => {
                let after = add(a.balance_cents, -cents, "the balance")?;
                if after < -self.overdraft_limit_cents {
                    return Err(format!(
                        "insufficient funds on {account}/{}: withdrawing {} from a balance of {} \
                         would leave {} (overdraft limit {})",
                        event.seq,
                        money(cents),
                        money(a.balance_cents),
                        money(after),
                        money(self.overdraft_limit_cents)
                    )
                    .into());
                }
                a.balance_cents = after;
                a
            }
        };
        doc.last_seq = event.seq.get();
        view.put(ACCOUNTS_TABLE, account, &doc).await?;
        Ok(())
    }
}

/// `daily_totals`: money in and out per booking day and account.
///
/// Each document is written by one account's events only (the key is
/// `<day>/<account>`), so workers applying different accounts at the same
/// time never write the same document; [`day_totals`] sums a day at read
/// time.
#[derive(Clone, Debug)]
pub struct DailyTotals {
    name: ProjectionName,
}

impl Default for DailyTotals {
    fn default() -> Self {
        Self::new()
    }
}

impl DailyTotals {
    /// The projection.
    pub fn new() -> Self {
        DailyTotals {
            name: projection_name(DAILY_TOTALS),
        }
    }
}

/// The `daily_totals` key of `account` on `day`.
fn day_key(day: &str, account: &str) -> String {
    format!("{day}/{account}")
}

#[async_trait]
impl TypedViewProjection<BankEvent> for DailyTotals {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event, value: &BankEvent) -> Result<(), BoxError> {
        let (cents, day, deposit) = match value.clone() {
            BankEvent::Deposited { cents, day } => (cents, day, true),
            BankEvent::Withdrawn { cents, day } => (cents, day, false),
            BankEvent::AccountOpened { .. } | BankEvent::StatementViewed { .. } => return Ok(()),
        };
        let key = day_key(&day, event.stream.as_str());
        let mut t: DayTotals = view.get(DAYS_TABLE, &key).await?.unwrap_or_default();
        if deposit {
            t.deposited_cents = add(t.deposited_cents, cents, "the day's deposits")?;
            t.deposits += 1;
        } else {
            t.withdrawn_cents = add(t.withdrawn_cents, cents, "the day's withdrawals")?;
            t.withdrawals += 1;
        }
        view.put(DAYS_TABLE, &key, &t).await?;
        Ok(())
    }
}

/// The bank's projections, in rebuild order: [`Balances`] (no overdraft)
/// and [`DailyTotals`].
pub fn projections() -> Vec<Arc<dyn ViewProjection>> {
    vec![
        Arc::new(typed(Balances::new())),
        Arc::new(typed(DailyTotals::new())),
    ]
}

/// The bank as the `outbox` command sees it: `bank`, its event types and
/// its projections. The `bank` binary is `outbox_cli::run(app())`.
pub fn app() -> outbox_cli::App {
    projections().into_iter().fold(
        outbox_cli::App::new("bank")
            .about("The example bank on the transactional projection-apply outbox")
            .event_types(event_types()),
        outbox_cli::App::view_arc,
    )
}

/// Registers the bank's event types and projections on a runtime builder,
/// for an application that embeds the runtime (any backend).
pub fn register<J: JournalBackend, P: ProjectionBackend>(
    builder: OutboxBuilder<J, P>,
) -> OutboxBuilder<J, P> {
    projections()
        .into_iter()
        .fold(builder.event_types(event_types()), OutboxBuilder::view_arc)
}

/// The account `account` as `balances` holds it in `store`, or `None`.
pub async fn account<S: ViewStore + ?Sized>(
    store: &S,
    account: &str,
) -> outbox_core::Result<Option<Account>> {
    ViewReader::new(store, projection_name(BALANCES))
        .get(ACCOUNTS_TABLE, account)
        .await
}

/// Every account of `balances` in `store`, in bytewise order of the
/// account's stream id.
pub async fn accounts<S: ViewStore + ?Sized>(store: &S) -> outbox_core::Result<Vec<(String, Account)>> {
    let reader = ViewReader::new(store, projection_name(BALANCES));
    let mut out: Vec<(String, Account)> = Vec::new();
    loop {
        let after = out.last().map(|(k, _)| k.clone());
        let page = reader.scan(ACCOUNTS_TABLE, after.as_deref(), MAX_PAGE).await?;
        let full = page.len() == MAX_PAGE;
        out.extend(page);
        if !full {
            return Ok(out);
        }
    }
}

/// The sum of every account's movements on `day` (`YYYY-MM-DD`) as
/// `daily_totals` holds them in `store`.
pub async fn day_totals<S: ViewStore + ?Sized>(store: &S, day: &str) -> outbox_core::Result<DayTotals> {
    let reader = ViewReader::new(store, projection_name(DAILY_TOTALS));
    let prefix = format!("{day}/");
    let mut sum = DayTotals::default();
    let mut after = prefix.clone();
    loop {
        let page: Vec<(String, DayTotals)> = reader.scan(DAYS_TABLE, Some(&after), MAX_PAGE).await?;
        let full = page.len() == MAX_PAGE;
        for (key, t) in page {
            if !key.starts_with(&prefix) {
                return Ok(sum);
            }
            sum.deposited_cents = sum.deposited_cents.saturating_add(t.deposited_cents);
            sum.withdrawn_cents = sum.withdrawn_cents.saturating_add(t.withdrawn_cents);
            sum.deposits += t.deposits;
            sum.withdrawals += t.withdrawals;
            after = key;
        }
        if !full {
            return Ok(sum);
        }
    }
}

/// A small business day for a fresh journal, as append requests: three
/// accounts, twelve events (two of them audit-only), in four appends.
///
/// | account | events | balance | last seq |
/// |---|---|---|---|
/// | `account-alice` | opened, +100.00, viewed; then -25.00, +12.00 | 87.00 | 5 |
/// | `account-bob` | opened, +50.00, -40.00, -5.00 | 5.00 | 4 |
/// | `account-carol` | opened, +200.00, viewed | 200.00 | 2 |
///
/// `2026-03-02`: 150.00 in (2 deposits), 25.00 out (1 withdrawal).
/// `2026-03-03`: 212.00 in (2), 45.00 out (2).
pub fn sample() -> outbox_core::Result<Vec<AppendRequest>> {
    let opened = |owner: &str| BankEvent::AccountOpened { owner: owner.into() };
    let deposited = |cents, day: &str| BankEvent::Deposited {
        cents,
        day: day.into(),
    };
    let withdrawn = |cents, day: &str| BankEvent::Withdrawn {
        cents,
        day: day.into(),
    };
    let viewed = |by: &str| BankEvent::StatementViewed { by: by.into() };
    let appends = [
        (
            "account-alice",
            ExpectedVersion::NoStream,
            vec![opened("Alice"), deposited(10_000, "2026-03-02"), viewed("alice")],
        ),
        (
            "account-bob",
            ExpectedVersion::NoStream,
            vec![
                opened("Bob"),
                deposited(5_000, "2026-03-02"),
                withdrawn(4_000, "2026-03-03"),
                withdrawn(500, "2026-03-03"),
            ],
        ),
        (
            "account-carol",
            ExpectedVersion::NoStream,
            vec![
                opened("Carol"),
                deposited(20_000, "2026-03-03"),
                viewed("auditor"),
            ],
        ),
        (
            "account-alice",
            ExpectedVersion::Exact(3),
            vec![withdrawn(2_500, "2026-03-02"), deposited(1_200, "2026-03-03")],
        ),
    ];
    appends
        .into_iter()
        .map(|(stream, expected, events)| {
            let events = events
                .iter()
                .map(BankEvent::to_new_event)
                .collect::<outbox_core::Result<Vec<_>>>()?;
            Ok(AppendRequest::new(StreamId::new(stream)?, expected, events))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_event_type_is_registered_with_its_intent() {
        use outbox_core::Intent;
        let types = event_types();
        let names: Vec<(&str, Intent)> = types.iter().map(|(t, i)| (t.as_str(), i)).collect();
        assert_eq!(
            names,
            [
                (ACCOUNT_OPENED, Intent::Apply),
                (DEPOSITED, Intent::Apply),
                (STATEMENT_VIEWED, Intent::AuditOnly),
                (WITHDRAWN, Intent::Apply),
            ]
        );
    }

    #[test]
    fn invalid_events_are_refused_before_the_journal() {
        let refused = |e: BankEvent| e.to_new_event().unwrap_err().to_string();
        assert!(refused(BankEvent::AccountOpened { owner: " ".into() }).contains("blank"));
        for cents in [0, -5] {
            let e = BankEvent::Deposited {
                cents,
                day: "2026-03-02".into(),
            };
            assert!(refused(e).contains("positive"));
        }
        for day in ["2026-3-2", "2026/03/02", "", "2026-03-02x", "２０２６-03-02"] {
            let e = BankEvent::Withdrawn {
                cents: 1,
                day: day.into(),
            };
            assert!(refused(e).contains("YYYY-MM-DD"), "{day:?}");
        }
    }

    #[test]
    fn payloads_are_plain_json() {
        let e = BankEvent::Deposited {
            cents: 1_250,
            day: "2026-03-02".into(),
        }
        .to_new_event()
        .unwrap();
        assert_eq!(e.event_type.as_str(), DEPOSITED);
        assert_eq!(e.payload, br#"{"cents":1250,"day":"2026-03-02"}"#);
    }

    #[test]
    fn money_is_shown_in_units() {
        assert_eq!(money(0), "0.00");
        assert_eq!(money(5), "0.05");
        assert_eq!(money(-12_345), "-123.45");
        assert_eq!(money(i64::MIN), "-92233720368547758.08");
    }

    #[test]
    fn the_sample_is_a_valid_batch() {
        let sample = sample().unwrap();
        let events: usize = sample.iter().map(|r| r.events.len()).sum();
        assert_eq!((sample.len(), events), (4, 12));
    }
}

//! The demo domain: a tabletop campaign.
//!
//! Events: `campaign_created`, `player_joined`, `character_created`,
//! `dice_rolled`, `scene_changed` (applied) and `chat_message` (audit-only:
//! kept in the journal, never projected). Projections, each its own tables
//! in the projection database:
//! - `campaign_summary`: one row per campaign (name, scene, counts);
//! - `roster`: players and characters per campaign;
//! - `character_tally`: rolls, total and natural 20s per character.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use outbox_core::{
    BoxError, DigestBuilder, Event, EventTypeRegistry, Projection, ProjectionName, async_trait,
};
use serde::{Deserialize, Serialize};
use sqlx::{PgConnection, SqliteConnection};

/// Every event type of the domain with its intent.
pub fn event_types() -> EventTypeRegistry {
    let mut r = EventTypeRegistry::new();
    for t in [
        "campaign_created",
        "player_joined",
        "character_created",
        "dice_rolled",
        "scene_changed",
    ] {
        r.apply(t).expect("valid name");
    }
    r.audit_only("chat_message").expect("valid name");
    r
}

/// The payload of every demo event (fields unused by a type are absent).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Payload {
    /// Campaign name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Player.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub player: Option<String>,
    /// Character.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub character: Option<String>,
    /// Die sides.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sides: Option<i64>,
    /// Roll result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub result: Option<i64>,
    /// Scene.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub scene: Option<String>,
    /// Chat text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// Demo fault injection: the tally projection fails this many times on the event.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub glitch: Option<u32>,
    /// Demo fault injection: the tally projection fails until the fix is deployed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cursed: Option<bool>,
}

fn payload(e: &Event) -> Result<Payload, BoxError> {
    serde_json::from_slice(&e.payload)
        .map_err(|err| format!("{} {}/{}: bad payload: {err}", e.event_type, e.stream, e.seq).into())
}

fn field<'a>(v: &'a Option<String>, what: &str, e: &Event) -> Result<&'a str, BoxError> {
    v.as_deref()
        .ok_or_else(|| format!("{} {}/{} has no {what}", e.event_type, e.stream, e.seq).into())
}

/// The demo's fault switch: "the fix is deployed" once set.
#[derive(Clone, Debug, Default)]
pub struct Faults {
    fixed: Arc<AtomicBool>,
    glitches: Arc<Mutex<HashMap<(String, u64), u32>>>,
}

impl Faults {
    /// Deploys the fix: cursed events apply and glitches stop from now on
    /// (the glitch counts live in one process, so without this every new
    /// process, a rebuild for one, would meet each glitch again).
    pub fn deploy_fix(&self) {
        self.fixed.store(true, Ordering::SeqCst);
    }

    fn check(&self, e: &Event, p: &Payload) -> Result<(), BoxError> {
        if self.fixed.load(Ordering::SeqCst) {
            return Ok(());
        }
        if p.cursed == Some(true) {
            return Err(format!(
                "cursed die on {}/{}: the tally cannot count it (bug #42)",
                e.stream, e.seq
            )
            .into());
        }
        if let Some(n) = p.glitch {
            let mut g = self.glitches.lock().map_err(|_| "glitch table poisoned")?;
            let seen = g.entry((e.stream.to_string(), e.seq.get())).or_insert(0);
            if *seen < n {
                *seen += 1;
                return Err(format!("transient glitch {}/{n} on {}/{}", *seen, e.stream, e.seq).into());
            }
        }
        Ok(())
    }
}

/// Declares a projection struct and implements [`Projection`] for both
/// connection types. `apply` runs the same statements on both (sqlx binds
/// `$N` placeholders on SQLite too); only the DDL differs.
macro_rules! demo_projection {
    (
        $ty:ident, $name:literal, [$($table:literal),+],
        sqlite: [$($sqlite_ddl:literal),+],
        postgres: [$($pg_ddl:literal),+],
        apply: $apply:ident
    ) => {
        #[doc = concat!("The `", $name, "` projection (SQLite and Postgres).")]
        pub struct $ty {
            name: ProjectionName,
            faults: Faults,
        }

        impl $ty {
            /// The projection with the demo's fault switch.
            pub fn new(faults: Faults) -> Self {
                $ty { name: ProjectionName::new($name).expect("valid name"), faults }
            }
        }

        demo_projection!(@impl $ty, SqliteConnection, outbox_sqlite::digest_table, [$($table),+], [$($sqlite_ddl),+], $apply);
        demo_projection!(@impl $ty, PgConnection, outbox_postgres::digest_table, [$($table),+], [$($pg_ddl),+], $apply);
    };
    (@impl $ty:ident, $conn:ty, $digest:path, [$($table:literal),+], [$($ddl:literal),+], $apply:ident) => {
        #[async_trait]
        impl Projection<$conn> for $ty {
            fn name(&self) -> &ProjectionName {
                &self.name
            }
            async fn setup(&self, tx: &mut $conn) -> Result<(), BoxError> {
                $(sqlx::query($ddl).execute(&mut *tx).await?;)+
                Ok(())
            }
            async fn apply(&self, tx: &mut $conn, e: &Event) -> Result<(), BoxError> {
                let p = payload(e)?;
                $apply!(self, tx, e, &p)
            }
            async fn reset(&self, tx: &mut $conn) -> Result<(), BoxError> {
                $(sqlx::query(concat!("DELETE FROM ", $table)).execute(&mut *tx).await?;)+
                Ok(())
            }
            async fn digest(&self, tx: &mut $conn, out: &mut DigestBuilder) -> Result<(), BoxError> {
                $($digest(tx, $table, out).await?;)+
                Ok(())
            }
        }
    };
}

/// `campaign_summary`'s apply, the same statements on either connection.
macro_rules! campaign_apply {
    ($self:ident, $tx:ident, $e:ident, $p:expr) => {{
        let (e, p) = ($e, $p);
        let c = e.stream.as_str();
        let seq = e.seq.as_i64();
        let sql = match e.event_type.as_str() {
            "campaign_created" => {
                sqlx::query("INSERT INTO demo_campaigns (campaign, name, last_seq) VALUES ($1, $2, $3)")
                    .bind(c)
                    .bind(field(&p.name, "name", e)?)
                    .bind(seq)
                    .execute(&mut *$tx)
                    .await?;
                return Ok(());
            }
            "player_joined" => {
                "UPDATE demo_campaigns SET players = players + 1, last_seq = $2 WHERE campaign = $1"
            }
            "character_created" => {
                "UPDATE demo_campaigns SET characters = characters + 1, last_seq = $2 WHERE campaign = $1"
            }
            "dice_rolled" => "UPDATE demo_campaigns SET rolls = rolls + 1, last_seq = $2 WHERE campaign = $1",
            "scene_changed" => {
                sqlx::query("UPDATE demo_campaigns SET scene = $3, last_seq = $2 WHERE campaign = $1")
                    .bind(c)
                    .bind(seq)
                    .bind(field(&p.scene, "scene", e)?)
                    .execute(&mut *$tx)
                    .await?;
                return Ok(());
            }
            other => return Err(format!("campaign_summary does not know event type {other}").into()),
        };
        let done = sqlx::query(sql).bind(c).bind(seq).execute(&mut *$tx).await?;
        if done.rows_affected() != 1 {
            return Err(format!("{} on {c}/{seq} before campaign_created", e.event_type).into());
        }
        let _ = &$self.faults;
        Ok(())
    }};
}

/// `roster`'s apply.
macro_rules! roster_apply {
    ($self:ident, $tx:ident, $e:ident, $p:expr) => {{
        let (e, p) = ($e, $p);
        let c = e.stream.as_str();
        match e.event_type.as_str() {
            "player_joined" => {
                sqlx::query("INSERT INTO demo_players (campaign, player, joined_seq) VALUES ($1, $2, $3)")
                    .bind(c)
                    .bind(field(&p.player, "player", e)?)
                    .bind(e.seq.as_i64())
                    .execute(&mut *$tx)
                    .await?;
            }
            "character_created" => {
                sqlx::query(
                    "INSERT INTO demo_characters (campaign, \"character\", player) VALUES ($1, $2, $3)",
                )
                .bind(c)
                .bind(field(&p.character, "character", e)?)
                .bind(field(&p.player, "player", e)?)
                .execute(&mut *$tx)
                .await?;
            }
            _ => {}
        }
        let _ = &$self.faults;
        Ok(())
    }};
}

/// `character_tally`'s apply.
macro_rules! tally_apply {
    ($self:ident, $tx:ident, $e:ident, $p:expr) => {{
        let (e, p) = ($e, $p);
        if e.event_type.as_str() != "dice_rolled" {
            return Ok(());
        }
        $self.faults.check(e, p)?;
        let result = p.result.ok_or("dice_rolled has no result")?;
        let sides = p.sides.ok_or("dice_rolled has no sides")?;
        sqlx::query(
            "INSERT INTO demo_tally AS t (campaign, \"character\", rolls, total, natural_20s) \
             VALUES ($1, $2, 1, $3, $4) ON CONFLICT (campaign, \"character\") DO UPDATE SET \
             rolls = t.rolls + 1, total = t.total + excluded.total, \
             natural_20s = t.natural_20s + excluded.natural_20s",
        )
        .bind(e.stream.as_str())
        .bind(field(&p.character, "character", e)?)
        .bind(result)
        .bind(i64::from(sides == 20 && result == 20))
        .execute(&mut *$tx)
        .await?;
        Ok(())
    }};
}

demo_projection!(CampaignSummary, "campaign_summary", ["demo_campaigns"],
    sqlite: [
        "CREATE TABLE IF NOT EXISTS demo_campaigns (campaign TEXT PRIMARY KEY, name TEXT NOT NULL, scene TEXT, \
         players INTEGER NOT NULL DEFAULT 0, characters INTEGER NOT NULL DEFAULT 0, rolls INTEGER NOT NULL DEFAULT 0, \
         last_seq INTEGER NOT NULL) WITHOUT ROWID"
    ],
    postgres: [
        "CREATE TABLE IF NOT EXISTS demo_campaigns (campaign text COLLATE \"C\" PRIMARY KEY, name text NOT NULL, \
         scene text, players bigint NOT NULL DEFAULT 0, characters bigint NOT NULL DEFAULT 0, \
         rolls bigint NOT NULL DEFAULT 0, last_seq bigint NOT NULL)"
    ],
    apply: campaign_apply
);

demo_projection!(Roster, "roster", ["demo_players", "demo_characters"],
    sqlite: [
        "CREATE TABLE IF NOT EXISTS demo_players (campaign TEXT NOT NULL, player TEXT NOT NULL, joined_seq INTEGER NOT NULL, \
         PRIMARY KEY (campaign, player)) WITHOUT ROWID",
        "CREATE TABLE IF NOT EXISTS demo_characters (campaign TEXT NOT NULL, character TEXT NOT NULL, player TEXT NOT NULL, \
         PRIMARY KEY (campaign, character)) WITHOUT ROWID"
    ],
    postgres: [
        "CREATE TABLE IF NOT EXISTS demo_players (campaign text COLLATE \"C\" NOT NULL, player text COLLATE \"C\" NOT NULL, \
         joined_seq bigint NOT NULL, PRIMARY KEY (campaign, player))",
        "CREATE TABLE IF NOT EXISTS demo_characters (campaign text COLLATE \"C\" NOT NULL, \
         \"character\" text COLLATE \"C\" NOT NULL, player text COLLATE \"C\" NOT NULL, PRIMARY KEY (campaign, \"character\"))"
    ],
    apply: roster_apply
);

demo_projection!(CharacterTally, "character_tally", ["demo_tally"],
    sqlite: [
        "CREATE TABLE IF NOT EXISTS demo_tally (campaign TEXT NOT NULL, character TEXT NOT NULL, rolls INTEGER NOT NULL, \
         total INTEGER NOT NULL, natural_20s INTEGER NOT NULL, PRIMARY KEY (campaign, character)) WITHOUT ROWID"
    ],
    postgres: [
        "CREATE TABLE IF NOT EXISTS demo_tally (campaign text COLLATE \"C\" NOT NULL, \"character\" text COLLATE \"C\" NOT NULL, \
         rolls bigint NOT NULL, total bigint NOT NULL, natural_20s bigint NOT NULL, PRIMARY KEY (campaign, \"character\"))"
    ],
    apply: tally_apply
);

/// The three projections, in rebuild order, sharing one fault switch, for
/// either connection type (`SqliteConnection` or `PgConnection`).
pub fn projections<Tx>(faults: &Faults) -> Vec<Arc<dyn Projection<Tx>>>
where
    Tx: Send + 'static,
    CampaignSummary: Projection<Tx>,
    Roster: Projection<Tx>,
    CharacterTally: Projection<Tx>,
{
    vec![
        Arc::new(CampaignSummary::new(faults.clone())),
        Arc::new(Roster::new(faults.clone())),
        Arc::new(CharacterTally::new(faults.clone())),
    ]
}

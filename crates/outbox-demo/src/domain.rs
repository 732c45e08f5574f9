//! The demo domain: a tabletop campaign.
//!
//! Events: `campaign_created`, `player_joined`, `character_created`,
//! `dice_rolled`, `scene_changed` (applied) and `chat_message` (audit-only:
//! kept in the journal, never projected). Three backend-neutral projections
//! (the same code on memory, SQLite and Postgres):
//! - `campaign_summary`: table `campaigns`, one document per campaign (name,
//!   scene, counts);
//! - `roster`: tables `players` and `characters`, keyed `campaign/name`;
//! - `character_tally`: table `tally`, rolls, total and natural 20s per
//!   `campaign/character`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use outbox_core::typed::{DomainEvent, EventKind, TypedViewProjection, json, typed};
use outbox_core::{BoxError, Event, EventTypeRegistry, ProjectionName, ViewProjection, ViewTx, async_trait};
use serde::{Deserialize, Serialize};

/// Every event type of the domain with its intent, from [`DemoEvent`]'s kinds.
pub fn event_types() -> EventTypeRegistry {
    EventTypeRegistry::of::<DemoEvent>().expect("valid names")
}

/// The demo's events as typed values ([`DomainEvent`]): appended with their
/// type and intent, decoded once per event for every projection. Their
/// payload is a [`Payload`] with the variant's fields (the JSON the demo
/// has always written).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DemoEvent {
    /// `campaign_created`.
    CampaignCreated {
        /// The campaign's name.
        name: String,
    },
    /// `player_joined`.
    PlayerJoined {
        /// The player.
        player: String,
    },
    /// `character_created`.
    CharacterCreated {
        /// The character.
        character: String,
        /// Who plays it.
        player: String,
    },
    /// `dice_rolled`.
    DiceRolled {
        /// Who rolled.
        character: String,
        /// The die's sides.
        sides: i64,
        /// The result.
        result: i64,
        /// Demo fault injection: `character_tally` fails this many times on it.
        glitch: Option<u32>,
        /// Demo fault injection: `character_tally` fails until the fix is deployed.
        cursed: bool,
    },
    /// `scene_changed`.
    SceneChanged {
        /// The new scene.
        scene: String,
    },
    /// `chat_message` (audit-only: kept in the journal, never projected).
    ChatMessage {
        /// Who spoke.
        player: Option<String>,
        /// What was said.
        text: String,
    },
}

impl DomainEvent for DemoEvent {
    const KINDS: &'static [EventKind] = &[
        EventKind::apply("campaign_created"),
        EventKind::apply("player_joined"),
        EventKind::apply("character_created"),
        EventKind::apply("dice_rolled"),
        EventKind::apply("scene_changed"),
        EventKind::audit_only("chat_message"),
    ];

    fn kind(&self) -> EventKind {
        Self::KINDS[match self {
            DemoEvent::CampaignCreated { .. } => 0,
            DemoEvent::PlayerJoined { .. } => 1,
            DemoEvent::CharacterCreated { .. } => 2,
            DemoEvent::DiceRolled { .. } => 3,
            DemoEvent::SceneChanged { .. } => 4,
            DemoEvent::ChatMessage { .. } => 5,
        }]
    }

    fn encode(&self) -> Result<Vec<u8>, BoxError> {
        let p = match self.clone() {
            DemoEvent::CampaignCreated { name } => Payload {
                name: Some(name),
                ..Payload::default()
            },
            DemoEvent::PlayerJoined { player } => Payload {
                player: Some(player),
                ..Payload::default()
            },
            DemoEvent::CharacterCreated { character, player } => Payload {
                character: Some(character),
                player: Some(player),
                ..Payload::default()
            },
            DemoEvent::DiceRolled {
                character,
                sides,
                result,
                glitch,
                cursed,
            } => Payload {
                character: Some(character),
                sides: Some(sides),
                result: Some(result),
                glitch,
                cursed: cursed.then_some(true),
                ..Payload::default()
            },
            DemoEvent::SceneChanged { scene } => Payload {
                scene: Some(scene),
                ..Payload::default()
            },
            DemoEvent::ChatMessage { player, text } => Payload {
                player,
                text: Some(text),
                ..Payload::default()
            },
        };
        json::encode(&p)
    }

    fn decode(event_type: &str, payload: &[u8]) -> Result<Self, BoxError> {
        let p: Payload = json::decode(payload)?;
        let need = |v: Option<String>, what: &str| v.ok_or_else(|| format!("{event_type} has no {what}"));
        Ok(match event_type {
            "campaign_created" => DemoEvent::CampaignCreated {
                name: need(p.name, "name")?,
            },
            "player_joined" => DemoEvent::PlayerJoined {
                player: need(p.player, "player")?,
            },
            "character_created" => DemoEvent::CharacterCreated {
                character: need(p.character, "character")?,
                player: need(p.player, "player")?,
            },
            "dice_rolled" => DemoEvent::DiceRolled {
                character: need(p.character, "character")?,
                sides: p.sides.ok_or("dice_rolled has no sides")?,
                result: p.result.ok_or("dice_rolled has no result")?,
                glitch: p.glitch,
                cursed: p.cursed == Some(true),
            },
            "scene_changed" => DemoEvent::SceneChanged {
                scene: need(p.scene, "scene")?,
            },
            "chat_message" => DemoEvent::ChatMessage {
                player: p.player,
                text: need(p.text, "text")?,
            },
            other => return Err(format!("the demo has no event type {other}").into()),
        })
    }
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

    fn check(&self, e: &Event, glitch: Option<u32>, cursed: bool) -> Result<(), BoxError> {
        if self.fixed.load(Ordering::SeqCst) {
            return Ok(());
        }
        if cursed {
            return Err(format!(
                "cursed die on {}/{}: the tally cannot count it (bug #42)",
                e.stream, e.seq
            )
            .into());
        }
        if let Some(n) = glitch {
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

/// A campaign as `campaign_summary` keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Campaign {
    /// Its name.
    pub name: String,
    /// The current scene.
    pub scene: Option<String>,
    /// Players joined.
    pub players: u64,
    /// Characters created.
    pub characters: u64,
    /// Dice rolled.
    pub rolls: u64,
    /// The last seq applied.
    pub last_seq: u64,
}

/// A player as `roster` keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Player {
    /// The seq of `player_joined`.
    pub joined_seq: u64,
}

/// A character as `roster` keeps it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Character {
    /// Who plays it.
    pub player: String,
}

/// A character's rolls as `character_tally` keeps them.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    /// Dice rolled.
    pub rolls: u64,
    /// Their sum.
    pub total: i64,
    /// Natural 20s on a d20.
    pub natural_20s: u64,
    /// The highest roll: kept by version 2 of `character_tally` only (the
    /// demo's candidate), absent from version 1's documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub highest: Option<i64>,
}

fn name(n: &str) -> ProjectionName {
    ProjectionName::new(n).expect("valid projection name")
}

/// `campaign_summary`: one document per campaign.
pub struct CampaignSummary(ProjectionName);

#[async_trait]
impl TypedViewProjection<DemoEvent> for CampaignSummary {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event, value: &DemoEvent) -> Result<(), BoxError> {
        let c = e.stream.as_str();
        if let DemoEvent::CampaignCreated { name } = value {
            let campaign = Campaign {
                name: name.clone(),
                last_seq: e.seq.get(),
                ..Campaign::default()
            };
            view.put("campaigns", c, &campaign).await?;
            return Ok(());
        }
        let mut campaign: Campaign = view
            .get("campaigns", c)
            .await?
            .ok_or_else(|| format!("{} on {c}/{} before campaign_created", e.event_type, e.seq))?;
        match value {
            DemoEvent::PlayerJoined { .. } => campaign.players += 1,
            DemoEvent::CharacterCreated { .. } => campaign.characters += 1,
            DemoEvent::DiceRolled { .. } => campaign.rolls += 1,
            DemoEvent::SceneChanged { scene } => campaign.scene = Some(scene.clone()),
            other => {
                return Err(format!("campaign_summary does not apply {}", other.kind().name).into());
            }
        }
        campaign.last_seq = e.seq.get();
        view.put("campaigns", c, &campaign).await?;
        Ok(())
    }
}

/// `roster`: players and characters per campaign.
pub struct Roster(ProjectionName);

#[async_trait]
impl TypedViewProjection<DemoEvent> for Roster {
    fn name(&self) -> &ProjectionName {
        &self.0
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event, value: &DemoEvent) -> Result<(), BoxError> {
        let c = e.stream.as_str();
        match value {
            DemoEvent::PlayerJoined { player } => {
                let key = format!("{c}/{player}");
                let player = Player {
                    joined_seq: e.seq.get(),
                };
                view.put("players", &key, &player).await?;
            }
            DemoEvent::CharacterCreated { character, player } => {
                let key = format!("{c}/{character}");
                let character = Character {
                    player: player.clone(),
                };
                view.put("characters", &key, &character).await?;
            }
            _ => {}
        }
        Ok(())
    }
}

/// `character_tally`: rolls per character. The projection the demo's
/// injected faults hit.
pub struct CharacterTally {
    name: ProjectionName,
    faults: Faults,
    /// Version 2 also keeps each character's highest roll.
    version: u32,
}

impl CharacterTally {
    /// Version 2, the demo's candidate: it also keeps each character's
    /// highest roll (`outbox-demo shadow diff --projection character_tally`
    /// shows where it differs; `promote --force` makes it live).
    pub fn v2(faults: &Faults) -> Self {
        CharacterTally {
            name: name("character_tally"),
            faults: faults.clone(),
            version: 2,
        }
    }
}

#[async_trait]
impl TypedViewProjection<DemoEvent> for CharacterTally {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    fn version(&self) -> u32 {
        self.version
    }

    async fn apply(&self, view: &mut ViewTx<'_>, e: &Event, value: &DemoEvent) -> Result<(), BoxError> {
        let DemoEvent::DiceRolled {
            character,
            sides,
            result,
            glitch,
            cursed,
        } = value
        else {
            return Ok(());
        };
        self.faults.check(e, *glitch, *cursed)?;
        let (sides, result) = (*sides, *result);
        let key = format!("{}/{character}", e.stream);
        let keeps_highest = self.version >= 2;
        view.update("tally", &key, |t: &mut Tally| {
            t.rolls += 1;
            t.total += result;
            t.natural_20s += u64::from(sides == 20 && result == 20);
            if keeps_highest {
                t.highest = Some(t.highest.map_or(result, |h| h.max(result)));
            }
        })
        .await?;
        Ok(())
    }
}

/// The three projections, in rebuild order, sharing one fault switch.
pub fn projections(faults: &Faults) -> Vec<Arc<dyn ViewProjection>> {
    vec![
        Arc::new(typed(CampaignSummary(name("campaign_summary")))),
        Arc::new(typed(Roster(name("roster")))),
        Arc::new(typed(CharacterTally {
            name: name("character_tally"),
            faults: faults.clone(),
            version: 1,
        })),
    ]
}

/// The demo application as the `outbox` command sees it, with `faults`:
/// its three projections, and version 2 of `character_tally` as a
/// candidate (ADR 0021).
pub fn app(faults: &Faults) -> outbox_cli::App {
    projections(faults)
        .into_iter()
        .fold(
            outbox_cli::App::new("outbox-demo")
                .about("The outbox demo: a tabletop campaign on the transactional projection-apply outbox")
                .event_types(event_types()),
            outbox_cli::App::view_arc,
        )
        .candidate(typed(CharacterTally::v2(faults)))
}

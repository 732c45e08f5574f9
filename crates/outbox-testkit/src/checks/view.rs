//! [`ViewStorage`](outbox_core::spi::ViewStorage) and [`ViewStore`] contract
//! checks: the documents of backend-neutral projections, written through
//! [`ViewTx`] inside `ProjectionStore::apply` and read back with
//! [`ViewReader`].
//!
//! Every check drives a [`Scripted`] view projection: before an apply the
//! check plans, per event, the document operations the projection performs
//! (put, get, delete, scan, fail); the projection records what its reads
//! returned so the check can inspect them after the apply.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use outbox_core::spi::ViewStorage;
use outbox_core::{
    ApplyOutcome, BoxError, DigestBuilder, DigestValue, Error, Event, MAX_PAGE, MAX_VIEW_KEY_LEN,
    MAX_VIEW_TABLE_LEN, MAX_VIEW_VALUE_LEN, Projection, ProjectionName, ProjectionStore, RunningDigest,
    StreamId, ViewDigest, ViewProjection, ViewReader, ViewStore, ViewTx, view_projection,
};
use serde::{Deserialize, Serialize};

use super::support::recorded;
use crate::{Fixture, Harness, TxOf, add, one, sid};

/// The document the checks store: a serde struct with text (non-ASCII and
/// characters JSON escapes), a signed number and a list.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct Doc {
    name: String,
    n: i64,
    tags: Vec<String>,
}

fn doc(name: &str, n: i64) -> Doc {
    Doc {
        name: name.to_owned(),
        n,
        tags: vec![format!("{name}-tag"), "é \"q\" \\ /".to_owned()],
    }
}

/// One document operation the scripted projection performs.
#[derive(Clone, Debug)]
enum Op {
    Put(String, String, Doc),
    /// A JSON string document (to size documents exactly).
    PutText(String, String, String),
    /// A value `serde_json` cannot serialize (a map with non-string keys).
    PutUnencodable(String, String),
    Get(String, String),
    Delete(String, String),
    Scan(String, Option<String>, usize),
    Fail,
}

fn put(table: &str, key: &str, d: Doc) -> Op {
    Op::Put(table.to_owned(), key.to_owned(), d)
}

fn get(table: &str, key: &str) -> Op {
    Op::Get(table.to_owned(), key.to_owned())
}

fn del(table: &str, key: &str) -> Op {
    Op::Delete(table.to_owned(), key.to_owned())
}

fn scan(table: &str, after: Option<&str>, limit: usize) -> Op {
    Op::Scan(table.to_owned(), after.map(str::to_owned), limit)
}

/// What one read of the scripted projection returned.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Seen {
    Got(Option<Doc>),
    Deleted(bool),
    Scanned(Vec<(String, Doc)>),
}

type Plans = Arc<Mutex<HashMap<(String, u64), Vec<Op>>>>;

/// A view projection that performs, for each event, the operations planned
/// for its (stream, seq), and records what its reads returned.
#[derive(Clone)]
struct Scripted {
    name: ProjectionName,
    plans: Plans,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Scripted {
    fn new(name: &str) -> Self {
        Scripted {
            name: ProjectionName::new(name).expect("valid projection name"),
            plans: Plans::default(),
            seen: Arc::default(),
        }
    }

    /// Plans `ops` for `event` (replacing an earlier plan).
    fn plan(&self, event: &Event, ops: Vec<Op>) {
        self.plans
            .lock()
            .expect("plans lock")
            .insert((event.stream.to_string(), event.seq.get()), ops);
    }

    fn take_seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.seen.lock().expect("seen lock"))
    }

    fn shared<Tx: ViewStorage + 'static>(&self) -> Arc<dyn Projection<Tx>> {
        view_projection(Arc::new(self.clone()))
    }

    fn reader<'a, S: ViewStore>(&self, store: &'a S) -> ViewReader<'a, S> {
        ViewReader::new(store, self.name.clone())
    }
}

#[async_trait]
impl ViewProjection for Scripted {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
        let ops = self
            .plans
            .lock()
            .expect("plans lock")
            .get(&(event.stream.to_string(), event.seq.get()))
            .cloned()
            .unwrap_or_default();
        for op in ops {
            let seen = match op {
                Op::Put(t, k, d) => {
                    view.put(&t, &k, &d).await?;
                    None
                }
                Op::PutText(t, k, s) => {
                    view.put(&t, &k, &s).await?;
                    None
                }
                Op::PutUnencodable(t, k) => {
                    let bad: BTreeMap<Vec<u8>, u8> = BTreeMap::from([(vec![1, 2], 3)]);
                    view.put(&t, &k, &bad).await?;
                    None
                }
                Op::Get(t, k) => Some(Seen::Got(view.get(&t, &k).await?)),
                Op::Delete(t, k) => Some(Seen::Deleted(view.delete(&t, &k).await?)),
                Op::Scan(t, after, limit) => {
                    Some(Seen::Scanned(view.scan(&t, after.as_deref(), limit).await?))
                }
                Op::Fail => return Err(format!("scripted failure at {}/{}", event.stream, event.seq).into()),
            };
            if let Some(s) = seen {
                self.seen.lock().expect("seen lock").push(s);
            }
        }
        Ok(())
    }
}

/// A scripted view projection called `name`, set up in the fixture's
/// projection store, and the same as a projection of that store.
async fn scripted<H: Harness>(f: &Fixture<H>, name: &str) -> (Scripted, Arc<dyn Projection<TxOf<H>>>) {
    let s = Scripted::new(name);
    let p = s.shared();
    f.projections.setup(&one(p.clone())).await.expect("setup");
    (s, p)
}

/// Appends one event per step to `stream` and returns the recorded events.
async fn events<H: Harness>(f: &Fixture<H>, stream: &StreamId, steps: usize) -> Vec<Event> {
    recorded(&f.journal, stream, (0..steps).map(|_| add(0)).collect()).await
}

/// Plans `steps[i]` for `events[i]` and applies the events in ONE
/// `ProjectionStore::apply` call: what the reads returned, or the apply's error.
async fn run<H: Harness>(
    f: &Fixture<H>,
    s: &Scripted,
    p: &Arc<dyn Projection<TxOf<H>>>,
    events: &[Event],
    steps: Vec<Vec<Op>>,
) -> Result<Vec<Seen>, Error> {
    assert_eq!(events.len(), steps.len(), "one step per event");
    for (e, ops) in events.iter().zip(steps) {
        s.plan(e, ops);
    }
    s.take_seen();
    match f
        .projections
        .apply(&events[0].stream, events, &one(p.clone()))
        .await?
    {
        ApplyOutcome::Applied(_) => Ok(s.take_seen()),
        ApplyOutcome::Gap(g) => panic!("the checks never offer a gap, got {g:?}"),
    }
}

/// Appends one event per step to `stream` and [`run`]s them.
async fn step<H: Harness>(
    f: &Fixture<H>,
    s: &Scripted,
    p: &Arc<dyn Projection<TxOf<H>>>,
    stream: &str,
    steps: Vec<Vec<Op>>,
) -> Result<Vec<Seen>, Error> {
    let evs = events(f, &sid(stream), steps.len()).await;
    run(f, s, p, &evs, steps).await
}

/// Every committed document of one table, read through [`ViewReader`] in
/// pages of `page`.
async fn table_docs<S: ViewStore>(r: &ViewReader<'_, S>, table: &str, page: usize) -> Vec<(String, Doc)> {
    let mut out: Vec<(String, Doc)> = Vec::new();
    loop {
        let after = out.last().map(|(k, _)| k.clone());
        let got: Vec<(String, Doc)> = r
            .scan(table, after.as_deref(), page)
            .await
            .unwrap_or_else(|e| panic!("scan of {table} after {after:?}: {e}"));
        assert!(
            got.len() <= page,
            "scan returned {} rows for limit {page}",
            got.len()
        );
        let done = got.len() < page;
        out.extend(got);
        if done {
            return out;
        }
    }
}

/// Asserts that `r` is an `Error::Apply` whose source is an `Error::InvalidInput`.
fn assert_invalid_apply(r: Result<Vec<Seen>, Error>, what: &str) {
    match r {
        Err(Error::Apply { source, .. }) => match source.downcast_ref::<Error>() {
            Some(Error::InvalidInput(_)) => {}
            other => panic!("{what}: the applier's error should be InvalidInput, got {other:?} ({source})"),
        },
        other => panic!("{what}: the apply should fail with Error::Apply, got {other:?}"),
    }
}

/// `view_put`/`view_get` (and `ViewStore::view_get`): a serde struct put in
/// an apply reads back equal inside the transaction and after the commit,
/// stored as `serde_json`'s text byte for byte; a missing key, table or
/// projection is `None`.
pub async fn view_put_then_get_round_trips_a_document<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let d = doc("alpha", -7);
    let seen = step(
        &f,
        &s,
        &p,
        "s",
        vec![vec![
            get("docs", "k"),
            put("docs", "k", d.clone()),
            get("docs", "k"),
            get("docs", "other"),
        ]],
    )
    .await
    .expect("apply");
    assert_eq!(
        seen,
        [Seen::Got(None), Seen::Got(Some(d.clone())), Seen::Got(None)],
        "inside the transaction: missing, then the put document, and another key missing"
    );
    let r = s.reader(&f.projections);
    assert_eq!(
        r.get::<Doc>("docs", "k").await.unwrap(),
        Some(d.clone()),
        "committed"
    );
    assert_eq!(
        r.get::<Doc>("docs", "missing").await.unwrap(),
        None,
        "missing key"
    );
    assert_eq!(r.get::<Doc>("nodocs", "k").await.unwrap(), None, "missing table");
    let other = ViewReader::new(&f.projections, ProjectionName::new("nobody").unwrap());
    assert_eq!(
        other.get::<Doc>("docs", "k").await.unwrap(),
        None,
        "missing projection"
    );
    let raw = f.projections.view_get(&s.name, "docs", "k").await.unwrap();
    assert_eq!(
        raw.as_deref(),
        Some(r#"{"name":"alpha","n":-7,"tags":["alpha-tag","é \"q\" \\ /"]}"#),
        "the stored text is serde_json's, byte for byte"
    );
}

/// `view_put` replaces; `view_delete` returns whether the document existed
/// (true, then false, inside one transaction and across transactions).
pub async fn view_put_replaces_and_delete_reports_existence<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let (v1, v2) = (doc("one", 1), doc("two", 2));
    let seen = step(
        &f,
        &s,
        &p,
        "s",
        vec![vec![
            put("t", "k", v1.clone()),
            put("t", "k", v2.clone()),
            get("t", "k"),
            put("t", "gone", v1.clone()),
        ]],
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [Seen::Got(Some(v2.clone()))],
        "the second put replaced the first"
    );
    let r = s.reader(&f.projections);
    assert_eq!(r.get::<Doc>("t", "k").await.unwrap(), Some(v2.clone()));
    assert_eq!(
        table_docs(&r, "t", 10).await.len(),
        2,
        "a replace adds no document"
    );
    let seen = step(
        &f,
        &s,
        &p,
        "s",
        vec![
            vec![del("t", "gone"), del("t", "gone"), get("t", "gone")],
            vec![del("t", "gone"), del("t", "never"), del("u", "k")],
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [
            Seen::Deleted(true),
            Seen::Deleted(false),
            Seen::Got(None),
            Seen::Deleted(false),
            Seen::Deleted(false),
            Seen::Deleted(false),
        ],
        "delete: true once, then false (same event, next event, never-written key, other table)"
    );
    assert_eq!(
        r.get::<Doc>("t", "gone").await.unwrap(),
        None,
        "the delete committed"
    );
    assert_eq!(
        r.get::<Doc>("t", "k").await.unwrap(),
        Some(v2),
        "the other document stays"
    );
    let seen = step(&f, &s, &p, "s", vec![vec![del("t", "k")]]).await.unwrap();
    assert_eq!(
        seen,
        [Seen::Deleted(true)],
        "a committed document deletes in a later transaction"
    );
    assert!(table_docs(&r, "t", 10).await.is_empty());
}

/// The keys [`view_scan_is_bytewise_ordered_and_pages`] writes: case,
/// digits, separators, precomposed and decomposed accents, 3- and 4-byte
/// UTF-8 (whose UTF-16 order differs), DEL and the longest key.
fn tricky_keys() -> Vec<String> {
    let mut keys: Vec<String> = [
        "a", "B", "b", "a/b", "é", "e\u{301}", "10", "9", "Z", "a b", "ab", "a-", "~", "日本", "\u{ff61}",
        "😀", "a\u{7f}", "A",
    ]
    .iter()
    .map(|k| (*k).to_owned())
    .collect();
    keys.push("k".repeat(MAX_VIEW_KEY_LEN));
    keys
}

/// `view_scan` (and `ViewStore::view_scan`): one table's documents in
/// bytewise key order, strictly after `after` (present or not), at most
/// `limit`; paging with the last key returns every document exactly once.
/// Other tables and projections are not included.
pub async fn view_scan_is_bytewise_ordered_and_pages<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let (qs, q) = scripted(&f, "q").await;
    let keys = tricky_keys();
    let puts: Vec<Op> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| put("t", k, doc(&format!("d{i}"), i as i64)))
        .collect();
    // Documents a scan of p's table `t` must not include: other tables (one
    // whose name `t` prefixes) and another projection's table `t`.
    let noise = vec![
        put("s", "a", doc("noise", 0)),
        put("u", "0", doc("noise", 0)),
        put("t_", "b", doc("noise", 0)),
    ];
    let evs = events(&f, &sid("s"), 2).await;
    run(&f, &s, &p, &evs, vec![noise, puts]).await.unwrap();
    run(
        &f,
        &qs,
        &q,
        &evs[..1],
        vec![vec![put("t", "a", doc("q", 0)), put("t", "0", doc("q", 0))]],
    )
    .await
    .unwrap();

    let mut want: Vec<(String, Doc)> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| (k.clone(), doc(&format!("d{i}"), i as i64)))
        .collect();
    want.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    let r = s.reader(&f.projections);
    let all: Vec<(String, Doc)> = r.scan("t", None, MAX_PAGE).await.unwrap();
    let order = |v: &[(String, Doc)]| v.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>();
    assert_eq!(order(&all), order(&want), "scan is in bytewise (UTF-8) key order");
    assert_eq!(all, want, "with every document");
    for page in [1, 2, 3, 7] {
        assert_eq!(
            table_docs(&r, "t", page).await,
            want,
            "paging by {page} returns everything exactly once"
        );
    }
    let limited: Vec<(String, Doc)> = r.scan("t", None, 4).await.unwrap();
    assert_eq!(limited, want[..4], "limit");
    for i in [0, 5, want.len() - 1] {
        let after: Vec<(String, Doc)> = r.scan("t", Some(&want[i].0), MAX_PAGE).await.unwrap();
        assert_eq!(after, want[i + 1..], "strictly after {:?}", want[i].0);
    }
    let absent: Vec<(String, Doc)> = r.scan("t", Some("a0"), MAX_PAGE).await.unwrap();
    let first = want
        .iter()
        .position(|(k, _)| k.as_bytes() > b"a0".as_slice())
        .unwrap();
    assert_eq!(absent, want[first..], "after a key that is not stored");
    assert!(
        r.scan::<Doc>("t", Some("\u{10ffff}"), 10)
            .await
            .unwrap()
            .is_empty(),
        "after the end"
    );
    assert!(
        r.scan::<Doc>("v", None, 10).await.unwrap().is_empty(),
        "an empty table"
    );
    let seen = step(
        &f,
        &s,
        &p,
        "s",
        vec![vec![scan("t", None, MAX_PAGE), scan("t", Some(&want[2].0), 3)]],
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [Seen::Scanned(want.clone()), Seen::Scanned(want[3..6].to_vec())],
        "the transaction's scan orders and limits the same way"
    );
}

/// Documents are keyed by (projection, table, key): two projections writing
/// the same table and key, and one projection writing the same key in two
/// tables, never see, replace or delete each other's documents.
pub async fn view_documents_are_namespaced_by_projection_and_table<H: Harness>(h: &H) {
    let f = h.open().await;
    let (ps, p) = scripted(&f, "p").await;
    let (qs, q) = scripted(&f, "q").await;
    let st = sid("s");
    let evs = events(&f, &st, 2).await;
    run(
        &f,
        &ps,
        &p,
        &evs[..1],
        vec![vec![put("t", "k", doc("p-t", 1)), put("u", "k", doc("p-u", 2))]],
    )
    .await
    .unwrap();
    let seen = run(
        &f,
        &qs,
        &q,
        &evs[..1],
        vec![vec![
            get("t", "k"),
            put("t", "k", doc("q-t", 3)),
            scan("u", None, 10),
        ]],
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [Seen::Got(None), Seen::Scanned(vec![])],
        "q does not see p's documents inside its transaction"
    );
    let (pr, qr) = (ps.reader(&f.projections), qs.reader(&f.projections));
    assert_eq!(
        pr.get::<Doc>("t", "k").await.unwrap(),
        Some(doc("p-t", 1)),
        "q's put did not replace p's"
    );
    assert_eq!(
        pr.get::<Doc>("u", "k").await.unwrap(),
        Some(doc("p-u", 2)),
        "same key, other table"
    );
    assert_eq!(qr.get::<Doc>("t", "k").await.unwrap(), Some(doc("q-t", 3)));
    assert_eq!(qr.get::<Doc>("u", "k").await.unwrap(), None);
    let seen = run(&f, &qs, &q, &evs[1..], vec![vec![del("u", "k"), del("t", "k")]])
        .await
        .unwrap();
    assert_eq!(
        seen,
        [Seen::Deleted(false), Seen::Deleted(true)],
        "q deletes only its own"
    );
    assert_eq!(
        pr.get::<Doc>("t", "k").await.unwrap(),
        Some(doc("p-t", 1)),
        "p's document survives q's delete"
    );
    assert_eq!(pr.get::<Doc>("u", "k").await.unwrap(), Some(doc("p-u", 2)));
    let seen = run(&f, &ps, &p, &evs[1..], vec![vec![del("t", "k"), get("u", "k")]])
        .await
        .unwrap();
    assert_eq!(
        seen,
        [Seen::Deleted(true), Seen::Got(Some(doc("p-u", 2)))],
        "deleting t/k leaves u/k"
    );
}

/// Reads inside the apply transaction see its earlier writes, of the same
/// event and of earlier events of the run, before anything is committed.
pub async fn view_tx_reads_its_own_uncommitted_writes<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    step(
        &f,
        &s,
        &p,
        "s",
        vec![vec![put("t", "a", doc("a", 1)), put("t", "c", doc("c", 3))]],
    )
    .await
    .unwrap();
    let seen = step(
        &f,
        &s,
        &p,
        "s",
        vec![
            vec![put("t", "b", doc("b", 2)), del("t", "c"), scan("t", None, 10)],
            vec![
                get("t", "b"),
                get("t", "c"),
                put("t", "a", doc("a", 10)),
                scan("t", None, 10),
            ],
        ],
    )
    .await
    .unwrap();
    assert_eq!(
        seen,
        [
            Seen::Deleted(true),
            Seen::Scanned(vec![("a".into(), doc("a", 1)), ("b".into(), doc("b", 2))]),
            Seen::Got(Some(doc("b", 2))),
            Seen::Got(None),
            Seen::Scanned(vec![("a".into(), doc("a", 10)), ("b".into(), doc("b", 2))]),
        ],
        "puts, replaces and deletes are visible to later reads of the same transaction"
    );
}

/// One long run: more document writes than any adapter keeps in memory
/// (1,500 puts in one transaction), interleaved with deletes of documents
/// written earlier in the same transaction, deletes of committed ones,
/// repeated deletes and puts after a delete. Every read in the transaction
/// sees the writes before it, and what commits is exactly the last write of
/// each key.
pub async fn view_long_runs_commit_the_last_write_of_each_key<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    step(
        &f,
        &s,
        &p,
        "s",
        vec![vec![
            put("t", "old-1", doc("o1", 1)),
            put("t", "old-2", doc("o2", 2)),
        ]],
    )
    .await
    .unwrap();
    let key = |i: usize| format!("k{i:04}");
    let first: Vec<Op> = (0..1_500)
        .map(|i| put("t", &key(i), doc("v1", i as i64)))
        .collect();
    let second = vec![
        del("t", &key(3)),
        del("t", &key(3)),
        get("t", &key(3)),
        put("t", &key(3), doc("back", 3)),
        get("t", &key(3)),
        del("t", "old-1"),
        del("t", "old-1"),
        get("t", "old-1"),
        put("t", &key(1_499), doc("v2", 1_499)),
        get("t", &key(1_499)),
        del("t", "never-written"),
    ];
    let third = vec![
        del("t", &key(7)),
        scan("t", Some(&key(5)), 3),
        put("t", "old-2", doc("o2-new", 22)),
    ];
    let seen = step(&f, &s, &p, "s", vec![first, second, third]).await.unwrap();
    assert_eq!(
        seen,
        [
            Seen::Deleted(true),
            Seen::Deleted(false),
            Seen::Got(None),
            Seen::Got(Some(doc("back", 3))),
            Seen::Deleted(true),
            Seen::Deleted(false),
            Seen::Got(None),
            Seen::Got(Some(doc("v2", 1_499))),
            Seen::Deleted(false),
            Seen::Deleted(true),
            Seen::Scanned(vec![
                (key(6), doc("v1", 6)),
                (key(8), doc("v1", 8)),
                (key(9), doc("v1", 9)),
            ]),
        ],
        "reads inside the run see every earlier write of the run"
    );
    let committed = table_docs(&s.reader(&f.projections), "t", 400).await;
    let mut want: Vec<(String, Doc)> = (0..1_500)
        .filter(|i| *i != 7)
        .map(|i| {
            let d = match i {
                3 => doc("back", 3),
                1_499 => doc("v2", 1_499),
                _ => doc("v1", i as i64),
            };
            (key(i), d)
        })
        .collect();
    want.push(("old-2".into(), doc("o2-new", 22)));
    want.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(committed.len(), want.len(), "documents committed");
    assert!(
        committed == want,
        "the committed documents are the last write of each key"
    );
}

/// A failing applier rolls back every document write of the transaction
/// (puts, replaces and deletes, of earlier events of the run too) and the
/// checkpoint; what an earlier apply committed stays.
pub async fn view_failed_apply_rolls_back_documents_and_checkpoint<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let st = sid("s");
    let evs = events(&f, &st, 3).await;
    run(
        &f,
        &s,
        &p,
        &evs[..1],
        vec![vec![
            put("t", "keep", doc("v1", 1)),
            put("t", "doomed", doc("d", 0)),
        ]],
    )
    .await
    .unwrap();
    let r = s.reader(&f.projections);
    let before = table_docs(&r, "t", 100).await;
    let failing = vec![
        vec![
            put("t", "new", doc("new", 2)),
            put("t", "keep", doc("v2", 2)),
            del("t", "doomed"),
        ],
        vec![put("u", "x", doc("x", 3)), Op::Fail],
    ];
    match run(
        &f,
        &s,
        &p,
        &evs,
        vec![vec![], failing[0].clone(), failing[1].clone()],
    )
    .await
    {
        Err(Error::Apply { projection, seq, .. }) => {
            assert_eq!(
                (projection.as_str(), seq.get()),
                ("p", 3),
                "names the failing event"
            )
        }
        other => panic!("a failing applier is Error::Apply, got {other:?}"),
    }
    assert_eq!(
        table_docs(&r, "t", 100).await,
        before,
        "put, replace and delete of seq 2 rolled back"
    );
    assert!(
        table_docs(&r, "u", 100).await.is_empty(),
        "seq 3's put before the failure rolled back"
    );
    assert_eq!(
        f.projections.checkpoint(&s.name, &st).await.unwrap(),
        1,
        "the checkpoint did not move"
    );
    let mut retry = failing;
    retry[1].pop();
    run(&f, &s, &p, &evs[1..], retry)
        .await
        .expect("the retry commits");
    assert_eq!(
        table_docs(&r, "t", 100).await,
        [
            ("keep".to_owned(), doc("v2", 2)),
            ("new".to_owned(), doc("new", 2))
        ],
    );
    assert_eq!(r.get::<Doc>("u", "x").await.unwrap(), Some(doc("x", 3)));
    assert_eq!(f.projections.checkpoint(&s.name, &st).await.unwrap(), 3);
}

/// `reset` (`view_clear` plus the checkpoints) removes every document of the
/// projection, in every table, and its checkpoints, and leaves another
/// projection's documents and checkpoints; the events then apply again.
pub async fn view_reset_clears_documents_of_one_projection<H: Harness>(h: &H) {
    let f = h.open().await;
    let (ps, p) = scripted(&f, "p").await;
    let (qs, q) = scripted(&f, "q").await;
    let (a, b) = (sid("a"), sid("b"));
    let ea = events(&f, &a, 1).await;
    let eb = events(&f, &b, 1).await;
    let writes = vec![
        put("t", "k", doc("t", 1)),
        put("u", "k", doc("u", 2)),
        put("u", "l", doc("u", 3)),
    ];
    for (sc, pr) in [(&ps, &p), (&qs, &q)] {
        run(&f, sc, pr, &ea, vec![writes.clone()]).await.unwrap();
        run(&f, sc, pr, &eb, vec![vec![put("v", "k", doc("v", 4))]])
            .await
            .unwrap();
    }
    let qr = qs.reader(&f.projections);
    let q_before = [
        table_docs(&qr, "t", 10).await,
        table_docs(&qr, "u", 10).await,
        table_docs(&qr, "v", 10).await,
    ];
    f.projections.reset(&*p).await.expect("reset");
    let pr = ps.reader(&f.projections);
    for t in ["t", "u", "v"] {
        assert!(
            table_docs(&pr, t, 10).await.is_empty(),
            "reset removed p's table {t}"
        );
    }
    assert_eq!(
        f.projections.checkpoint(&ps.name, &a).await.unwrap(),
        0,
        "checkpoints cleared"
    );
    assert_eq!(
        f.projections.checkpoint(&ps.name, &b).await.unwrap(),
        0,
        "on every stream"
    );
    let q_after = [
        table_docs(&qr, "t", 10).await,
        table_docs(&qr, "u", 10).await,
        table_docs(&qr, "v", 10).await,
    ];
    assert_eq!(q_after, q_before, "q's documents untouched");
    assert_eq!(q_after.iter().map(Vec::len).sum::<usize>(), 4);
    assert_eq!(f.projections.checkpoint(&qs.name, &a).await.unwrap(), 1);
    let seen = run(&f, &ps, &p, &ea, vec![vec![get("t", "k")]]).await.unwrap();
    assert_eq!(
        seen,
        [Seen::Got(None)],
        "after the reset the event applies again, on empty tables"
    );
}

/// `digest` of a view projection: equal on two fresh stores given the same
/// events, whatever order the documents were written in (and a document
/// written then deleted leaves no trace); different when one document
/// changes; equal again once it is changed back.
pub async fn view_digest_tracks_documents_not_write_order<H: Harness>(h: &H) {
    let f1 = h.open().await;
    let f2 = h.open().await;
    let (s1, p1) = scripted(&f1, "p").await;
    let (s2, p2) = scripted(&f2, "p").await;
    assert_eq!(
        f1.projections.digest(&*p1).await.unwrap(),
        f2.projections.digest(&*p2).await.unwrap(),
        "two empty view projections"
    );
    let st = sid("s");
    let e1 = events(&f1, &st, 2).await;
    let e2 = events(&f2, &st, 2).await;
    let (a, b, c) = (doc("a", 1), doc("b", 2), doc("c", 3));
    run(
        &f1,
        &s1,
        &p1,
        &e1,
        vec![
            vec![put("t", "k1", a.clone()), put("t", "k2", b.clone())],
            vec![put("u", "k1", c.clone())],
        ],
    )
    .await
    .unwrap();
    run(
        &f2,
        &s2,
        &p2,
        &e2,
        vec![
            vec![
                put("u", "k1", c.clone()),
                put("t", "tmp", a.clone()),
                put("t", "k2", doc("old", 0)),
            ],
            vec![
                put("t", "k2", b.clone()),
                del("t", "tmp"),
                put("t", "k1", a.clone()),
            ],
        ],
    )
    .await
    .unwrap();
    let d1 = f1.projections.digest(&*p1).await.unwrap();
    assert_eq!(
        d1,
        f2.projections.digest(&*p2).await.unwrap(),
        "same documents, other write order: same digest"
    );
    let more = events(&f1, &st, 2).await;
    run(
        &f1,
        &s1,
        &p1,
        &more[..1],
        vec![vec![put("t", "k2", doc("b", 20))]],
    )
    .await
    .unwrap();
    let changed = f1.projections.digest(&*p1).await.unwrap();
    assert_ne!(changed, d1, "a changed document changes the digest");
    let more2 = events(&f2, &st, 1).await;
    run(&f2, &s2, &p2, &more2, vec![vec![]]).await.unwrap();
    assert_ne!(
        f2.projections.digest(&*p2).await.unwrap(),
        changed,
        "same checkpoints, one document differs: different digests"
    );
    run(&f1, &s1, &p1, &more[1..], vec![vec![put("t", "k2", b)]])
        .await
        .unwrap();
    let more3 = events(&f2, &st, 1).await;
    run(&f2, &s2, &p2, &more3, vec![vec![]]).await.unwrap();
    assert_eq!(
        f1.projections.digest(&*p1).await.unwrap(),
        f2.projections.digest(&*p2).await.unwrap(),
        "changed back: equal again"
    );
}

/// An invalid table name or key, an oversized or unserializable document is
/// `InvalidInput` from the `ViewTx`; passed on with `?` it fails the apply
/// (`Error::Apply` whose source is that `InvalidInput`) and nothing of the
/// transaction commits. The limits are exact: the longest valid table, key
/// and document are accepted. `ViewReader` refuses the same names and a
/// zero limit with `InvalidInput`.
pub async fn view_invalid_names_keys_and_documents_write_nothing<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let long_table = "t".repeat(MAX_VIEW_TABLE_LEN + 1);
    let long_key = "k".repeat(MAX_VIEW_KEY_LEN + 1);
    // A JSON string of n characters is n + 2 bytes of text.
    let oversized = "x".repeat(MAX_VIEW_VALUE_LEN - 1);
    let bad: Vec<(&str, Op)> = vec![
        ("an empty table", put("", "k", doc("x", 0))),
        ("a table starting with a digit", put("1t", "k", doc("x", 0))),
        ("a table with a dash", put("a-b", "k", doc("x", 0))),
        ("a non-ASCII table", put("tä", "k", doc("x", 0))),
        ("a table one byte too long", put(&long_table, "k", doc("x", 0))),
        ("an empty key", put("t", "", doc("x", 0))),
        ("a key with NUL", put("t", "a\0b", doc("x", 0))),
        ("a key one byte too long", put("t", &long_key, doc("x", 0))),
        ("a get of a bad key", get("t", "")),
        ("a delete in a bad table", del("_t", "k")),
        ("a scan of a bad table", scan("t t", None, 1)),
        ("a scan with limit 0", scan("t", None, 0)),
        (
            "a document one byte too large",
            Op::PutText("t".into(), "big".into(), oversized),
        ),
        (
            "an unserializable document",
            Op::PutUnencodable("t".into(), "k".into()),
        ),
    ];
    let r = s.reader(&f.projections);
    for (i, (what, op)) in bad.into_iter().enumerate() {
        let st = sid(&format!("s{i:02}"));
        let evs = events(&f, &st, 1).await;
        let res = run(&f, &s, &p, &evs, vec![vec![put("t", "before", doc("x", 1)), op]]).await;
        assert_invalid_apply(res, what);
        assert!(
            table_docs(&r, "t", 10).await.is_empty(),
            "{what}: nothing committed"
        );
        assert_eq!(
            f.projections.checkpoint(&s.name, &st).await.unwrap(),
            0,
            "{what}: checkpoint unchanged"
        );
    }
    let max_table = "t".repeat(MAX_VIEW_TABLE_LEN);
    let max_key = "k".repeat(MAX_VIEW_KEY_LEN);
    let largest = "x".repeat(MAX_VIEW_VALUE_LEN - 2);
    let edges = vec![
        put(&max_table, &max_key, doc("edge", 1)),
        Op::PutText("t".into(), "big".into(), largest.clone()),
    ];
    step(&f, &s, &p, "edges", vec![edges])
        .await
        .expect("the longest table, key and document are valid");
    assert_eq!(
        r.get::<Doc>(&max_table, &max_key).await.unwrap(),
        Some(doc("edge", 1))
    );
    assert_eq!(
        r.get::<String>("t", "big").await.unwrap().map(|s| s.len()),
        Some(largest.len())
    );
    for (what, e) in [
        ("get of a bad table", r.get::<Doc>("1t", "k").await.err()),
        ("get of a bad key", r.get::<Doc>("t", "a\0b").await.err()),
        ("scan of a bad table", r.scan::<Doc>("a-b", None, 1).await.err()),
        ("scan with limit 0", r.scan::<Doc>("t", None, 0).await.err()),
    ] {
        assert!(
            matches!(e, Some(Error::InvalidInput(_))),
            "ViewReader {what}: {e:?}"
        );
    }
}

/// `view_rows` pages through every table of the projection in (table, key)
/// order: the digest of 1,500 documents over 3 tables (more than one page of
/// `digest_view`, with a page boundary inside a table whose keys the next
/// table repeats) equals the digest built by hand from `ViewStore` scans
/// with the framing every adapter uses (`view:<table>`, rows (key, JSON
/// text), then `checkpoints`, rows (stream, seq)).
pub async fn view_digest_pages_through_every_table<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let tables: [(&str, usize); 3] = [("alpha", 300), ("beta", 900), ("gamma", 300)];
    let st = sid("s");
    let evs = events(&f, &st, tables.len()).await;
    let steps: Vec<Vec<Op>> = tables
        .iter()
        .map(|(t, n)| {
            (0..*n)
                .rev()
                .map(|i| put(t, &format!("k{i:04}"), doc(&format!("{t}{i}"), i as i64)))
                .collect()
        })
        .collect();
    run(&f, &s, &p, &evs, steps).await.expect("apply 1,500 documents");
    let other = sid("o");
    let eo = events(&f, &other, 1).await;
    run(
        &f,
        &s,
        &p,
        &eo,
        vec![vec![put("beta", "k0450", doc("replaced", -1))]],
    )
    .await
    .unwrap();

    let mut want = DigestBuilder::new();
    let mut total = 0;
    for (t, n) in tables {
        want.table(&format!("view:{t}"));
        let mut after: Option<String> = None;
        let mut rows = 0;
        loop {
            let page = f
                .projections
                .view_scan(&s.name, t, after.as_deref(), 250)
                .await
                .unwrap();
            for (k, v) in &page {
                want.row(&[DigestValue::Text(k), DigestValue::Text(v)]);
            }
            rows += page.len();
            match page.last() {
                Some((k, _)) if page.len() == 250 => after = Some(k.clone()),
                _ => break,
            }
        }
        assert_eq!(rows, n, "table {t} holds its {n} documents");
        total += rows;
    }
    assert_eq!(total, 1_500);
    want.table("checkpoints");
    for stream in [&other, &st] {
        let cp = f.projections.checkpoint(&s.name, stream).await.unwrap();
        want.row(&[DigestValue::Text(stream.as_str()), DigestValue::Int(cp as i64)]);
    }
    assert_eq!(
        f.projections.digest(&*p).await.unwrap(),
        want.finish(),
        "the digest covers every document once, in (table, key) order, across pages"
    );
}

// ---------------------------------------------------------------------------
// Running digests (ADR 0019)
// ---------------------------------------------------------------------------

/// The recorded running digest of `name` beside a scan's; panics unless they
/// are equal. Returns the recorded one.
async fn assert_running_matches<S: ViewStore>(store: &S, name: &ProjectionName, when: &str) -> ViewDigest {
    let check = store
        .verify_view_digest(name)
        .await
        .unwrap_or_else(|e| panic!("{when}: verify_view_digest: {e}"));
    assert!(
        check.matches(),
        "{when}: the running digest equals a full scan: {}",
        check.mismatch().unwrap_or_default()
    );
    check.recorded
}

/// The running digest `view_digests` lists for `name`, if any.
async fn listed<S: ViewStore>(store: &S, name: &ProjectionName) -> Option<ViewDigest> {
    let all = store.view_digests().await.expect("view_digests");
    let mut names: Vec<&ProjectionName> = all.iter().map(|d| &d.projection).collect();
    let sorted = {
        let mut s = names.clone();
        s.sort();
        s
    };
    assert_eq!(names, sorted, "view_digests is ordered by projection name");
    names.dedup();
    assert_eq!(names.len(), all.len(), "one running digest per projection");
    all.into_iter().find(|d| &d.projection == name)
}

/// `view_put`, `view_delete` and `view_clear` keep the running digest exact
/// in the apply's transaction: after inserts, overwrites (with a read first
/// and blind), deletes of present and missing documents, a delete and a put
/// of one key in one transaction, and a reset, the recorded digest equals a
/// scan's, `view_digests` lists it with its count and the last event applied
/// by the last transaction that changed it (a transaction that changes
/// nothing records nothing), and another projection's is untouched.
pub async fn view_running_digest_follows_puts_overwrites_deletes_and_clear<H: Harness>(h: &H) {
    let f = h.open().await;
    let (ps, p) = scripted(&f, "p").await;
    let (qs, q) = scripted(&f, "q").await;
    assert_eq!(
        listed(&f.projections, &ps.name).await,
        None,
        "no documents: no running digest"
    );
    let empty = assert_running_matches(&f.projections, &ps.name, "before any write").await;
    assert_eq!(empty.digest, Some(RunningDigest::EMPTY));
    step(
        &f,
        &ps,
        &p,
        "a",
        vec![
            vec![put("t", "k1", doc("one", 1)), put("t", "k2", doc("two", 2))],
            vec![
                put("u", "k1", doc("u", 3)),
                get("t", "k1"),
                put("t", "k1", doc("one'", 11)),
            ],
        ],
    )
    .await
    .unwrap();
    let d = assert_running_matches(&f.projections, &ps.name, "after inserts and overwrites").await;
    assert_eq!(d.documents, 3, "three documents");
    assert_eq!(
        d.last_event.as_ref().map(|(s, q)| (s.as_str(), q.get())),
        Some(("a", 2)),
        "the last event that changed the documents"
    );
    assert_eq!(
        listed(&f.projections, &ps.name).await.as_ref(),
        Some(&d),
        "view_digests lists it"
    );
    step(
        &f,
        &ps,
        &p,
        "b",
        vec![
            vec![put("t", "k2", doc("blind", 22)), del("t", "missing")],
            vec![del("u", "k1"), put("u", "k1", doc("again", 4)), del("t", "k1")],
            vec![put("t", "k3", doc("three", 3)), del("t", "k3"), get("t", "k2")],
            vec![],
        ],
    )
    .await
    .unwrap();
    let d = assert_running_matches(&f.projections, &ps.name, "after deletes and re-puts").await;
    assert_eq!(d.documents, 2, "t/k2 and u/k1 are left");
    assert_eq!(
        d.last_event.as_ref().map(|(s, q)| (s.as_str(), q.get())),
        Some(("b", 4)),
        "the last event applied by the last transaction that changed the documents"
    );
    step(
        &f,
        &ps,
        &p,
        "b",
        vec![vec![
            put("t", "k2", doc("blind", 22)),
            put("t", "new", doc("n", 0)),
            del("t", "new"),
        ]],
    )
    .await
    .unwrap();
    assert_eq!(
        assert_running_matches(
            &f.projections,
            &ps.name,
            "after a transaction that changed nothing"
        )
        .await,
        d,
        "a transaction whose writes change nothing leaves the record as it was"
    );
    step(&f, &qs, &q, "qa", vec![vec![put("t", "k1", doc("q", 1))]])
        .await
        .unwrap();
    let q_before = assert_running_matches(&f.projections, &qs.name, "q").await;
    f.projections.reset(&*p).await.expect("reset");
    let after_reset = assert_running_matches(&f.projections, &ps.name, "after reset").await;
    assert_eq!(after_reset.digest, Some(RunningDigest::EMPTY), "reset empties it");
    assert_eq!(
        (after_reset.documents, after_reset.last_event.as_ref()),
        (0, None),
        "with no documents and no last event"
    );
    assert_eq!(
        listed(&f.projections, &ps.name).await.as_ref(),
        Some(&after_reset),
        "view_digests lists it as verify reads it"
    );
    assert_eq!(
        assert_running_matches(&f.projections, &qs.name, "q after p's reset").await,
        q_before,
        "another projection's running digest is untouched"
    );
    step(&f, &ps, &p, "c", vec![vec![put("t", "k1", doc("fresh", 5))]])
        .await
        .unwrap();
    let d = assert_running_matches(&f.projections, &ps.name, "writes after a reset").await;
    assert_eq!(d.documents, 1);
}

/// The running digest's change commits or rolls back with the apply: a
/// failing apply (and a failing `apply_runs` over two streams) leaves the
/// recorded digest exactly as it was.
pub async fn view_running_digest_rolls_back_with_a_failed_apply<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    step(
        &f,
        &s,
        &p,
        "a",
        vec![vec![
            put("t", "keep", doc("v1", 1)),
            put("t", "doomed", doc("d", 0)),
        ]],
    )
    .await
    .unwrap();
    let before = assert_running_matches(&f.projections, &s.name, "before").await;
    let failed = step(
        &f,
        &s,
        &p,
        "a",
        vec![
            vec![
                put("t", "new", doc("new", 2)),
                put("t", "keep", doc("v2", 2)),
                del("t", "doomed"),
            ],
            vec![scan("t", None, 10), put("u", "x", doc("x", 3)), Op::Fail],
        ],
    )
    .await;
    assert!(
        matches!(failed, Err(Error::Apply { .. })),
        "the apply fails: {failed:?}"
    );
    let after = assert_running_matches(&f.projections, &s.name, "after a failed apply").await;
    assert_eq!(
        after, before,
        "a rolled-back apply leaves the running digest as it was"
    );
    let (b, c) = (sid("b"), sid("c"));
    let eb = events(&f, &b, 1).await;
    let ec = events(&f, &c, 1).await;
    s.plan(&eb[0], vec![put("t", "keep", doc("v3", 3)), del("t", "doomed")]);
    s.plan(&ec[0], vec![put("t", "c", doc("c", 4)), Op::Fail]);
    let r = f.projections.apply_runs(&[&eb, &ec], &one(p.clone())).await;
    assert!(matches!(r, Err(Error::Apply { .. })), "apply_runs fails: {r:?}");
    let after = assert_running_matches(&f.projections, &s.name, "after a failed apply_runs").await;
    assert_eq!(
        after, before,
        "a rolled-back apply_runs leaves the running digest as it was"
    );
}

/// Randomized histories (seeded, printed): several streams apply batches of
/// puts (blind and after a read), overwrites, deletes, reads and scans of a
/// small key space, one stream at a time or several in one `apply_runs`,
/// some batches failing and rolling back, a reset now and then. After every
/// batch the running digest equals a full scan's, and after the history it
/// equals the running digest of the documents the history should have left.
pub async fn view_running_digest_equals_a_scan_after_randomized_histories<H: Harness>(h: &H) {
    let seed = crate::Seed::pick("view_running_digest_equals_a_scan_after_randomized_histories");
    let mut rng = seed.rng();
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    // The model: what the committed documents should be.
    let mut model: BTreeMap<(String, String), Doc> = BTreeMap::new();
    let mut generation = 0;
    for round in 0..60 {
        if rng.below(25) == 0 {
            f.projections.reset(&*p).await.expect("reset");
            model.clear();
            // Reset streams start over: fresh names keep their seqs at 1.
            generation += 1;
            let d = assert_running_matches(&f.projections, &s.name, "after a reset").await;
            assert_eq!(
                d.digest,
                Some(RunningDigest::EMPTY),
                "seed {}: reset empties it",
                seed.0
            );
            continue;
        }
        let streams = 1 + rng.below(3) as usize;
        let fail = rng.below(6) == 0;
        let mut runs: Vec<Vec<Event>> = Vec::new();
        let mut next = model.clone();
        let mut picked = Vec::new();
        while picked.len() < streams {
            let st = format!("g{generation}-s{}", rng.below(4));
            if !picked.contains(&st) {
                picked.push(st);
            }
        }
        for (i, st) in picked.iter().enumerate() {
            let evs = events(&f, &sid(st), 1 + rng.below(3) as usize).await;
            for (j, e) in evs.iter().enumerate() {
                let mut ops = Vec::new();
                for _ in 0..rng.below(5) {
                    let table = ["t", "u"][rng.below(2) as usize].to_owned();
                    let key = format!("k{}", rng.below(6));
                    let slot = (table.clone(), key.clone());
                    match rng.below(6) {
                        0 | 1 => {
                            let d = doc(&format!("{round}-{i}-{j}"), rng.below(1000) as i64);
                            ops.push(put(&table, &key, d.clone()));
                            next.insert(slot, d);
                        }
                        2 => {
                            let d = doc(&format!("upd-{round}"), rng.below(1000) as i64);
                            ops.push(get(&table, &key));
                            ops.push(put(&table, &key, d.clone()));
                            next.insert(slot, d);
                        }
                        3 => {
                            ops.push(del(&table, &key));
                            next.remove(&slot);
                        }
                        4 => ops.push(get(&table, &key)),
                        _ => ops.push(scan(&table, None, 3)),
                    }
                }
                if fail && i == picked.len() - 1 && j == evs.len() - 1 {
                    ops.push(Op::Fail);
                }
                s.plan(e, ops);
            }
            runs.push(evs);
        }
        let refs: Vec<&[Event]> = runs.iter().map(Vec::as_slice).collect();
        let r = if refs.len() == 1 {
            f.projections
                .apply(&refs[0][0].stream, refs[0], &one(p.clone()))
                .await
                .map(|o| vec![o])
        } else {
            f.projections.apply_runs(&refs, &one(p.clone())).await
        };
        match r {
            Ok(outcomes) if !fail => {
                assert!(
                    outcomes.iter().all(|o| matches!(o, ApplyOutcome::Applied(_))),
                    "seed {}: round {round} applies: {outcomes:?}",
                    seed.0
                );
                model = next;
            }
            Err(Error::Apply { .. }) if fail => {
                // Rolled back: the failed events are retried with no writes,
                // so the streams stay contiguous.
                for e in runs.iter().flatten() {
                    s.plan(e, Vec::new());
                }
                let again = if refs.len() == 1 {
                    f.projections
                        .apply(&refs[0][0].stream, refs[0], &one(p.clone()))
                        .await
                        .map(|o| vec![o])
                } else {
                    f.projections.apply_runs(&refs, &one(p.clone())).await
                };
                assert!(
                    again.is_ok(),
                    "seed {}: round {round} re-apply: {again:?}",
                    seed.0
                );
            }
            other => panic!("seed {}: round {round} (fail={fail}): {other:?}", seed.0),
        }
        s.take_seen();
        let when = format!("seed {}: round {round}", seed.0);
        let d = assert_running_matches(&f.projections, &s.name, &when).await;
        assert_eq!(d.documents, model.len() as i64, "{when}: document count");
    }
    let rows: Vec<(String, String, String)> = model
        .iter()
        .map(|((t, k), d)| (t.clone(), k.clone(), serde_json::to_string(d).expect("json")))
        .collect();
    let want = RunningDigest::of_rows(rows.iter().map(|(t, k, v)| (t.as_str(), k.as_str(), v.as_str())));
    let got = assert_running_matches(&f.projections, &s.name, "at the end").await;
    assert_eq!(
        got.digest,
        Some(want),
        "seed {}: the running digest is the model's documents' (rerun with OUTBOX_TEST_SEED={})",
        seed.0,
        seed.0
    );
}

/// Concurrent applies of different streams (from two store instances) that
/// write, overwrite and delete the same documents, blind and after a read,
/// keep the running digest exact: it equals a scan's afterwards. (Stores
/// that serialize applies pass trivially; Postgres runs them at once.)
pub async fn view_running_digest_stays_exact_under_concurrent_applies<H: Harness>(h: &H) {
    let f = h.open().await;
    let (s, p) = scripted(&f, "p").await;
    let x = Arc::new(h.reopen_projections(&f.ctx).await);
    let y = Arc::new(h.reopen_projections(&f.ctx).await);
    for round in 0..6 {
        let mut tasks = Vec::new();
        for i in 0..6 {
            let st = sid(&format!("r{round}-s{i}"));
            let evs = events(&f, &st, 2).await;
            let key = format!("k{}", (i + round) % 3);
            let ops = match i % 3 {
                0 => vec![put("t", &key, doc(&format!("blind{i}"), i))],
                1 => vec![get("t", &key), put("t", &key, doc(&format!("read{i}"), i))],
                _ => vec![del("t", &key), put("t", "other", doc(&format!("o{i}"), i))],
            };
            s.plan(&evs[0], ops);
            s.plan(
                &evs[1],
                vec![put("t", &format!("own{i}"), doc("own", i)), del("t", "k1")],
            );
            let store = if i % 2 == 0 { x.clone() } else { y.clone() };
            let p = one(p.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    match store.apply(&st, &evs, &p).await {
                        Ok(o) => return o,
                        Err(e) if e.is_temporary() => continue,
                        Err(e) => panic!("concurrent apply of {st}: {e}"),
                    }
                }
            }));
        }
        for t in tasks {
            let o = t.await.expect("apply task");
            assert!(matches!(o, ApplyOutcome::Applied(_)), "{o:?}");
        }
        s.take_seen();
        assert_running_matches(&f.projections, &s.name, &format!("round {round}")).await;
    }
}

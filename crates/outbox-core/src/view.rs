//! Backend-neutral projections: named tables of JSON documents.
//!
//! A [`ViewProjection`] is written once and runs unchanged on every adapter
//! (memory, SQLite, Postgres). Its `apply` reads and writes documents through
//! a [`ViewTx`]: `get`, `put`, `delete` and `scan` of serde values in named
//! tables, inside the store's apply transaction, so exactly-once is the same
//! checkpoint compare-and-set as for any projection. Reset (rebuild) and
//! digests come for free: the rows are the adapter's, namespaced by the
//! projection's name. Applications read the documents back with
//! [`ViewReader`].
//!
//! Values are stored as the JSON text `serde_json` produces, keys compare
//! bytewise on every backend, so equal states have byte-identical digests
//! whichever adapter holds them.

use std::sync::Arc;

use async_trait::async_trait;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::ViewStore;
use crate::tx::{ViewRow, ViewStorage};
use crate::{
    BoxError, DigestBuilder, DigestValue, Error, Event, MAX_PAGE, Projection, ProjectionName, Result,
};

/// The longest table name, in bytes.
pub const MAX_VIEW_TABLE_LEN: usize = 63;
/// The longest document key, in bytes.
pub const MAX_VIEW_KEY_LEN: usize = 512;
/// The largest document, in bytes of JSON text.
pub const MAX_VIEW_VALUE_LEN: usize = 1 << 20;

/// A projection written once for every backend.
///
/// # Contract
/// - `apply` is called at most once per (projection, stream, seq) that
///   commits, inside the store's apply transaction: everything it writes
///   through the [`ViewTx`] commits or rolls back with the checkpoint.
/// - `apply` must be deterministic in the event and the documents it reads
///   (every path, inline, worker, catch-up or rebuild, must reach the same
///   documents; the digest checks it).
/// - It sees only its own tables: the documents are namespaced by
///   [`ViewProjection::name`].
/// - Streams are applied concurrently (on Postgres, by several workers). A
///   document read with [`ViewTx::get`] (or [`ViewTx::update`]) is locked
///   until the transaction ends, so updating one document from many streams
///   loses nothing; [`ViewTx::scan`] locks nothing, so do not write a
///   document computed from a scan of documents other streams also write.
/// - A returned error (or a [`ViewTx`] error passed on with `?`) rolls the
///   whole apply transaction back and the outbox row is retried by the policy.
///
/// ```
/// use outbox_core::{async_trait, BoxError, Event, ProjectionName, ViewProjection, ViewTx};
///
/// /// Counts events per stream.
/// struct Counts(ProjectionName);
///
/// #[async_trait]
/// impl ViewProjection for Counts {
///     fn name(&self) -> &ProjectionName {
///         &self.0
///     }
///
///     async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError> {
///         view.update("counts", event.stream.as_str(), |n: &mut u64| *n += 1).await?;
///         Ok(())
///     }
/// }
/// ```
#[async_trait]
pub trait ViewProjection: Send + Sync + 'static {
    /// The projection's name; checkpoints and documents are kept under it
    /// (under its live generation's storage name once it has more than one,
    /// ADR 0021).
    fn name(&self) -> &ProjectionName;

    /// The version of this projection's code: 1 unless overridden. A
    /// generation records the version that built it, and a candidate
    /// version ([`view_projection_with_candidate`]) must differ from the
    /// live code's; raise it when the code's output changes.
    fn version(&self) -> u32 {
        1
    }

    /// Applies one event (never an [`Intent::AuditOnly`](crate::Intent) one).
    async fn apply(&self, view: &mut ViewTx<'_>, event: &Event) -> Result<(), BoxError>;
}

/// Checks a view table name: an ASCII letter, then up to 62 ASCII letters,
/// digits or underscores. Anything else is [`Error::InvalidInput`].
pub fn validate_view_table(table: &str) -> Result<&str> {
    let mut chars = table.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic())
        && table.len() <= MAX_VIEW_TABLE_LEN
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(table)
    } else {
        Err(Error::invalid(format_args!(
            "view table {table:?} is not a valid name (an ASCII letter, then letters, digits or underscores, at most {MAX_VIEW_TABLE_LEN})"
        )))
    }
}

/// Checks a document key: 1 to [`MAX_VIEW_KEY_LEN`] bytes, no NUL (which
/// Postgres text cannot hold). Anything else is [`Error::InvalidInput`].
pub fn validate_view_key(key: &str) -> Result<&str> {
    if key.is_empty() || key.len() > MAX_VIEW_KEY_LEN || key.contains('\0') {
        let shown: String = key.chars().take(64).collect();
        return Err(Error::invalid(format_args!(
            "view key {shown:?} is not valid (1 to {MAX_VIEW_KEY_LEN} bytes, no NUL)"
        )));
    }
    Ok(key)
}

fn encode<T: Serialize + ?Sized>(table: &str, key: &str, value: &T) -> Result<String> {
    let text = serde_json::to_string(value).map_err(|e| {
        Error::invalid(format_args!(
            "view document {table}/{key} cannot be serialized: {e}"
        ))
    })?;
    if text.len() > MAX_VIEW_VALUE_LEN {
        return Err(Error::invalid(format_args!(
            "view document {table}/{key} is {} bytes of JSON, more than the {MAX_VIEW_VALUE_LEN} allowed",
            text.len()
        )));
    }
    Ok(text)
}

fn decode<T: DeserializeOwned>(projection: &ProjectionName, table: &str, key: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| {
        Error::invalid(format_args!(
            "view document {table}/{key} of projection `{projection}` does not decode as the requested type: {e}"
        ))
    })
}

/// The documents of one projection inside its apply transaction.
///
/// Every method validates the table name ([`validate_view_table`]), the key
/// ([`validate_view_key`]) and the document size before touching the store;
/// an invalid one is [`Error::InvalidInput`] and changes nothing.
pub struct ViewTx<'a> {
    storage: &'a mut dyn ViewStorage,
    projection: &'a ProjectionName,
}

impl<'a> ViewTx<'a> {
    /// The documents of `projection` through an adapter's transaction handle.
    pub fn new(storage: &'a mut dyn ViewStorage, projection: &'a ProjectionName) -> Self {
        ViewTx { storage, projection }
    }

    /// The projection whose documents these are.
    pub fn projection(&self) -> &ProjectionName {
        self.projection
    }

    /// The document at `key` of `table`, or `None`.
    pub async fn get<T: DeserializeOwned>(&mut self, table: &str, key: &str) -> Result<Option<T>> {
        validate_view_table(table)?;
        validate_view_key(key)?;
        match self.storage.view_get(self.projection, table, key).await? {
            Some(text) => decode(self.projection, table, key, &text).map(Some),
            None => Ok(None),
        }
    }

    /// Sets the document at `key` of `table` (inserting or replacing it).
    pub async fn put<T: Serialize + Sync + ?Sized>(
        &mut self,
        table: &str,
        key: &str,
        value: &T,
    ) -> Result<()> {
        validate_view_table(table)?;
        validate_view_key(key)?;
        let text = encode(table, key, value)?;
        self.storage.view_put(self.projection, table, key, &text).await
    }

    /// Removes the document at `key` of `table`; returns whether it existed.
    pub async fn delete(&mut self, table: &str, key: &str) -> Result<bool> {
        validate_view_table(table)?;
        validate_view_key(key)?;
        self.storage.view_delete(self.projection, table, key).await
    }

    /// Reads the document at `key` (or `T::default()`), lets `f` change it,
    /// writes it back and returns it.
    pub async fn update<T, F>(&mut self, table: &str, key: &str, f: F) -> Result<T>
    where
        T: Serialize + DeserializeOwned + Default + Sync,
        F: FnOnce(&mut T) + Send,
    {
        let mut doc: T = self.get(table, key).await?.unwrap_or_default();
        f(&mut doc);
        self.put(table, key, &doc).await?;
        Ok(doc)
    }

    /// Up to `limit` documents of `table` whose key is strictly after
    /// `after` (itself a valid key), in bytewise key order. `limit` is 1 to
    /// [`MAX_PAGE`].
    pub async fn scan<T: DeserializeOwned>(
        &mut self,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, T)>> {
        validate_view_table(table)?;
        if let Some(after) = after {
            validate_view_key(after)?;
        }
        let limit = crate::spi::validate_limit(limit, MAX_PAGE)?;
        let rows = self
            .storage
            .view_scan(self.projection, table, after, limit)
            .await?;
        rows.into_iter()
            .map(|(k, text)| decode(self.projection, table, &k, &text).map(|v| (k, v)))
            .collect()
    }
}

/// Reads a projection's documents outside any apply, from a store that
/// implements [`ViewStore`]: the application's query side.
///
/// Each call is one read; two calls may see different commits.
pub struct ViewReader<'a, S: ?Sized> {
    store: &'a S,
    projection: ProjectionName,
}

impl<'a, S: ViewStore + ?Sized> ViewReader<'a, S> {
    /// The documents of `projection` in `store`.
    pub fn new(store: &'a S, projection: ProjectionName) -> Self {
        ViewReader { store, projection }
    }

    /// The document at `key` of `table`, or `None`.
    pub async fn get<T: DeserializeOwned>(&self, table: &str, key: &str) -> Result<Option<T>> {
        validate_view_table(table)?;
        validate_view_key(key)?;
        match self.store.view_get(&self.projection, table, key).await? {
            Some(text) => decode(&self.projection, table, key, &text).map(Some),
            None => Ok(None),
        }
    }

    /// Up to `limit` documents of `table` whose key is strictly after
    /// `after` (itself a valid key), in bytewise key order. `limit` is 1 to
    /// [`MAX_PAGE`].
    pub async fn scan<T: DeserializeOwned>(
        &self,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, T)>> {
        validate_view_table(table)?;
        if let Some(after) = after {
            validate_view_key(after)?;
        }
        let limit = crate::spi::validate_limit(limit, MAX_PAGE)?;
        let rows = self
            .store
            .view_scan(&self.projection, table, after, limit)
            .await?;
        rows.into_iter()
            .map(|(k, text)| decode(&self.projection, table, &k, &text).map(|v| (k, v)))
            .collect()
    }
}

/// A [`ViewProjection`] as a [`Projection`] of any store whose transaction
/// handle implements [`ViewStorage`] (every adapter's does). It applies to
/// the projection's live generation (ADR 0021).
pub fn view_projection<Tx: ViewStorage + 'static>(view: Arc<dyn ViewProjection>) -> Arc<dyn Projection<Tx>> {
    Arc::new(Viewed {
        name: view.name().clone(),
        main: view,
        candidate: None,
    })
}

/// The [`ViewProjection`] that `projection` applies, when `projection` is
/// the plain wrapper [`view_projection`] made of it (not a pair with a
/// candidate, nor a generation's copy): how the runtime knows a view
/// registered as a projection, and keeps its view reads and blue/green
/// rebuilds.
pub fn view_of<Tx: Send>(projection: &dyn Projection<Tx>) -> Option<Arc<dyn ViewProjection>> {
    let viewed = projection.as_any()?.downcast_ref::<Viewed>()?;
    (viewed.candidate.is_none() && &viewed.name == viewed.main.name()).then(|| Arc::clone(&viewed.main))
}

/// `main` with a candidate version of it (ADR 0021): the candidate is
/// applied instead of `main` wherever the projection's live generation was
/// built by the candidate's version, that is after `outbox promote` made the
/// candidate's generation live; `main` everywhere else.
///
/// # Errors
/// `InvalidInput` when the two have different names or the same version.
pub fn view_projection_with_candidate<Tx: ViewStorage + 'static>(
    main: Arc<dyn ViewProjection>,
    candidate: Arc<dyn ViewProjection>,
) -> Result<Arc<dyn Projection<Tx>>> {
    if main.name() != candidate.name() {
        return Err(Error::invalid(format_args!(
            "candidate `{}` is not a version of projection `{}`: the names differ",
            candidate.name(),
            main.name()
        )));
    }
    if main.version() == candidate.version() {
        return Err(Error::invalid(format_args!(
            "the candidate of projection `{}` has the live code's version {}: give it another `version()`",
            main.name(),
            main.version()
        )));
    }
    Ok(Arc::new(Viewed {
        name: main.name().clone(),
        main,
        candidate: Some(candidate),
    }))
}

/// `view` applied to the generation stored under `storage` (see
/// [`generation_storage`](crate::generation_storage)), whatever generation
/// is live: how a generation is built beside the live one.
pub fn generation_projection<Tx: ViewStorage + 'static>(
    view: Arc<dyn ViewProjection>,
    storage: ProjectionName,
) -> Arc<dyn Projection<Tx>> {
    Arc::new(Viewed {
        name: storage,
        main: view,
        candidate: None,
    })
}

/// The rows read per page when digesting or dumping a view.
const DIGEST_PAGE: usize = 1000;

struct Viewed {
    /// What the checkpoints are kept under: the projection's name (its live
    /// generation), or one generation's storage name.
    name: ProjectionName,
    main: Arc<dyn ViewProjection>,
    candidate: Option<Arc<dyn ViewProjection>>,
}

impl Viewed {
    /// The code for the live generation this transaction resolved.
    fn code(&self, generations: &crate::spi::GenerationMap) -> &Arc<dyn ViewProjection> {
        match (generations.live(&self.name), &self.candidate) {
            (Some(live), Some(c)) if live.version == c.version() => c,
            _ => &self.main,
        }
    }
}

#[async_trait]
impl<Tx: ViewStorage + 'static> Projection<Tx> for Viewed {
    fn name(&self) -> &ProjectionName {
        &self.name
    }

    /// A view projection only reaches the transaction through `ViewTx`.
    fn documents_only(&self) -> bool {
        true
    }

    fn as_any(&self) -> Option<&dyn std::any::Any> {
        Some(self)
    }

    async fn apply(&self, tx: &mut Tx, event: &Event) -> Result<(), BoxError> {
        if tx.generations().is_empty() {
            tx.view_applying(&self.name, &event.stream, event.seq);
            let mut view = ViewTx::new(tx, &self.name);
            return self.main.apply(&mut view, event).await;
        }
        let code = Arc::clone(self.code(tx.generations()));
        let storage = tx.generations().storage(&self.name).clone();
        tx.view_applying(&storage, &event.stream, event.seq);
        let mut view = ViewTx::new(tx, &storage);
        code.apply(&mut view, event).await
    }

    async fn reset(&self, tx: &mut Tx) -> Result<(), BoxError> {
        let storage = tx.generations().storage(&self.name).clone();
        tx.view_clear(&storage).await?;
        Ok(())
    }

    async fn digest(&self, tx: &mut Tx, out: &mut DigestBuilder) -> Result<(), BoxError> {
        let storage = tx.generations().storage(&self.name).clone();
        digest_view(tx, &storage, out).await?;
        Ok(())
    }
}

/// Feeds every document of `projection` into `out`, ordered by (table, key):
/// each table starts with `table("view:<name>")`, each document is the row
/// (key, JSON text). Pages through the store, so memory stays flat.
pub async fn digest_view(
    tx: &mut (dyn ViewStorage + '_),
    projection: &ProjectionName,
    out: &mut DigestBuilder,
) -> Result<()> {
    let mut after: Option<(String, String)> = None;
    let mut current: Option<String> = None;
    loop {
        let page = tx
            .view_rows(
                projection,
                after.as_ref().map(|(t, k)| (t.as_str(), k.as_str())),
                DIGEST_PAGE,
            )
            .await?;
        let full = page.len() == DIGEST_PAGE;
        for ViewRow { table, key, value } in page {
            if current.as_deref() != Some(table.as_str()) {
                out.table(&format!("view:{table}"));
                current = Some(table.clone());
            }
            out.row(&[DigestValue::Text(&key), DigestValue::Text(&value)]);
            after = Some((table, key));
        }
        if !full {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names() {
        assert!(validate_view_table("accounts").is_ok());
        assert!(validate_view_table("a_1").is_ok());
        for bad in ["", "1a", "_a", "a-b", "a b", "ä", &"a".repeat(64)] {
            assert!(validate_view_table(bad).is_err(), "{bad:?} accepted");
        }
        assert!(validate_view_table(&"a".repeat(63)).is_ok());
    }

    #[test]
    fn keys() {
        assert!(validate_view_key("campaign-7/player 3").is_ok());
        assert!(validate_view_key("é").is_ok());
        assert!(validate_view_key("").is_err());
        assert!(validate_view_key("a\0b").is_err());
        assert!(validate_view_key(&"k".repeat(MAX_VIEW_KEY_LEN)).is_ok());
        assert!(validate_view_key(&"k".repeat(MAX_VIEW_KEY_LEN + 1)).is_err());
    }

    #[test]
    fn scans_refuse_an_invalid_after_key() {
        let p = ProjectionName::new("p").unwrap();
        struct Nothing;
        impl ViewStore for Nothing {
            async fn view_get(&self, _: &ProjectionName, _: &str, _: &str) -> Result<Option<String>> {
                Ok(None)
            }
            async fn view_scan(
                &self,
                _: &ProjectionName,
                _: &str,
                _: Option<&str>,
                _: usize,
            ) -> Result<Vec<(String, String)>> {
                Ok(Vec::new())
            }
            async fn view_digests(&self) -> Result<Vec<crate::ViewDigest>> {
                Ok(Vec::new())
            }
            async fn verify_view_digest(&self, p: &ProjectionName) -> Result<crate::ViewDigestCheck> {
                Ok(crate::ViewDigestCheck {
                    recorded: crate::ViewDigest::empty(p),
                    scanned: crate::RunningDigest::EMPTY,
                })
            }
        }
        let reader = ViewReader::new(&Nothing, p);
        let scan = reader.scan::<u64>("t", Some("a\0b"), 10);
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut scan = std::pin::pin!(scan);
        let std::task::Poll::Ready(r) = scan.as_mut().poll(&mut cx) else {
            panic!("nothing waits")
        };
        assert!(matches!(r, Err(Error::InvalidInput(_))), "{r:?}");
    }

    #[test]
    fn oversized_documents_are_refused() {
        let big = "x".repeat(MAX_VIEW_VALUE_LEN);
        let err = encode("t", "k", &big).unwrap_err();
        assert!(err.to_string().contains("more than"), "{err}");
        assert_eq!(encode("t", "k", &7u32).unwrap(), "7");
    }
}

//! A throwaway document store for comparing two versions of a view
//! projection on one stream at a time ([`crate::Outbox::shadow_diff`]):
//! nothing it holds reaches a database.

use std::collections::BTreeMap;
use std::ops::Bound;

use outbox_core::spi::{ViewRow, ViewStorage};
use outbox_core::{ProjectionName, Result, Seq, StreamId, async_trait};

/// The documents of one projection, by (table, key), in memory.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Scratch {
    pub(crate) docs: BTreeMap<(String, String), String>,
}

#[async_trait]
impl ViewStorage for Scratch {
    fn view_applying(&mut self, _: &ProjectionName, _: &StreamId, _: Seq) {}

    async fn view_get(&mut self, _: &ProjectionName, table: &str, key: &str) -> Result<Option<String>> {
        Ok(self.docs.get(&(table.to_owned(), key.to_owned())).cloned())
    }

    async fn view_put(&mut self, _: &ProjectionName, table: &str, key: &str, value: &str) -> Result<()> {
        self.docs
            .insert((table.to_owned(), key.to_owned()), value.to_owned());
        Ok(())
    }

    async fn view_delete(&mut self, _: &ProjectionName, table: &str, key: &str) -> Result<bool> {
        Ok(self.docs.remove(&(table.to_owned(), key.to_owned())).is_some())
    }

    async fn view_scan(
        &mut self,
        _: &ProjectionName,
        table: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Vec<(String, String)>> {
        let start = match after {
            Some(a) => Bound::Excluded((table.to_owned(), a.to_owned())),
            None => Bound::Included((table.to_owned(), String::new())),
        };
        Ok(self
            .docs
            .range((start, Bound::Unbounded))
            .take_while(|((t, _), _)| t == table)
            .take(limit)
            .map(|((_, k), v)| (k.clone(), v.clone()))
            .collect())
    }

    async fn view_rows(
        &mut self,
        _: &ProjectionName,
        after: Option<(&str, &str)>,
        limit: usize,
    ) -> Result<Vec<ViewRow>> {
        let start = match after {
            Some((t, k)) => Bound::Excluded((t.to_owned(), k.to_owned())),
            None => Bound::Unbounded,
        };
        Ok(self
            .docs
            .range((start, Bound::Unbounded))
            .take(limit)
            .map(|((table, key), value)| ViewRow {
                table: table.clone(),
                key: key.clone(),
                value: value.clone(),
            })
            .collect())
    }

    async fn view_clear(&mut self, _: &ProjectionName) -> Result<u64> {
        let n = self.docs.len() as u64;
        self.docs.clear();
        Ok(n)
    }
}

/// Where two scratch stores differ: the first document in (table, key)
/// order, both versions of it, and how many documents differ.
#[derive(Debug, Default)]
pub(crate) struct Difference {
    pub(crate) table: String,
    pub(crate) key: String,
    pub(crate) left: Option<String>,
    pub(crate) right: Option<String>,
    pub(crate) documents: u64,
}

/// The documents on which `a` and `b` differ, `None` when they agree.
pub(crate) fn first_difference(a: &Scratch, b: &Scratch) -> Option<Difference> {
    let mut out: Option<Difference> = None;
    let keys: std::collections::BTreeSet<&(String, String)> = a.docs.keys().chain(b.docs.keys()).collect();
    for k in keys {
        let (x, y) = (a.docs.get(k), b.docs.get(k));
        if x != y {
            let d = out.get_or_insert_with(|| Difference {
                table: k.0.clone(),
                key: k.1.clone(),
                left: x.cloned(),
                right: y.cloned(),
                documents: 0,
            });
            d.documents += 1;
        }
    }
    out
}

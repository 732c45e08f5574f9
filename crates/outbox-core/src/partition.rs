//! Partitions: the journal's streams divided into a fixed number of groups,
//! so live workers can divide the work by leasing whole partitions instead of
//! competing for every stream.
//!
//! Every outbox row (and every stream's head) carries the partition of its
//! stream, computed at append by the journal's [`Partitioning`]: a count and
//! a [`Partitioner`] (CRC-32 of the stream id by default; an application may
//! key by tenant instead). The count and the partitioner's name are stored
//! with the journal at its first open; a journal opened with another count or
//! partitioner is refused unless it is asked to repartition.
//!
//! A worker derives the partitions it should own from the live workers
//! ([`assigned_to`], rendezvous hashing over the sorted worker ids, so a
//! worker joining or leaving moves only the partitions it wins or held),
//! brings its partition leases to that set ([`PartitionStore::sync_partitions`])
//! and claims due rows inside them ([`PartitionStore::claim_partitioned`]).
//! Operations on the rows it claimed are fenced by the partition lease's
//! epoch ([`Lease::partition`](crate::Lease::partition)); the checkpoint
//! compare-and-set stays the safety net (ADR 0022).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::{
    ClaimedRun, Error, Lease, OutboxRow, Partition, Result, StreamId, SweepLimits, Timestamp, WorkerId,
};

/// The partition count of a journal opened without one on first use.
///
/// Chosen by measurement (ADR 0022): a worker's claim costs a seek per
/// partition it holds, so one worker drains 16 partitions at about the rate
/// of 4 and clearly faster than 64; while several workers share out 16
/// partitions unevenly (rendezvous hashing: with 4 workers the busiest
/// typically holds 6), so a deployment of more than a few workers raises
/// the count (`OUTBOX_PARTITIONS`) at its first start.
pub const DEFAULT_PARTITIONS: u16 = 16;

/// The largest partition count.
pub const MAX_PARTITIONS: u16 = 1024;

/// Decides a stream's partition. Must be a pure function of the stream id
/// and the count, and return a number below the count (a larger one is
/// reduced modulo the count).
///
/// The name is stored with the journal: a journal opened with a partitioner
/// of another name is refused, since the streams already enqueued carry the
/// old partitioner's partitions.
pub trait Partitioner: Send + Sync + fmt::Debug {
    /// A stable name for this partitioner (`crc32` for the default).
    fn name(&self) -> &str;

    /// The partition of `stream` among `count` (`count >= 1`).
    fn partition(&self, stream: &StreamId, count: u16) -> u16;
}

/// The default partitioner: CRC-32 (IEEE) of the stream id's bytes modulo
/// the count, the same on every platform and in every language.
#[derive(Clone, Copy, Debug, Default)]
pub struct Crc32Partitioner;

impl Partitioner for Crc32Partitioner {
    fn name(&self) -> &str {
        "crc32"
    }

    fn partition(&self, stream: &StreamId, count: u16) -> u16 {
        (crc32(stream.as_str().as_bytes()) % u32::from(count.max(1))) as u16
    }
}

/// CRC-32 (IEEE 802.3, reflected, the checksum of zlib and Ethernet).
pub fn crc32(bytes: &[u8]) -> u32 {
    const TABLE: [u32; 256] = {
        let mut table = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xEDB8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            table[i] = c;
            i += 1;
        }
        table
    };
    let mut crc = !0u32;
    for &b in bytes {
        crc = TABLE[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    !crc
}

/// How a journal divides its streams: a count and a partitioner.
#[derive(Clone, Debug)]
pub struct Partitioning {
    count: u16,
    partitioner: Arc<dyn Partitioner>,
}

impl Default for Partitioning {
    /// [`DEFAULT_PARTITIONS`] partitions by CRC-32.
    fn default() -> Self {
        Partitioning {
            count: DEFAULT_PARTITIONS,
            partitioner: Arc::new(Crc32Partitioner),
        }
    }
}

impl Partitioning {
    /// `count` partitions by `partitioner`. `InvalidInput` unless
    /// `1 <= count <=` [`MAX_PARTITIONS`], or if the partitioner's name is
    /// empty, longer than 64 bytes or not plain ASCII.
    pub fn new(count: u16, partitioner: Arc<dyn Partitioner>) -> Result<Self> {
        validate_partition_count(count)?;
        let name = partitioner.name();
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
        {
            return Err(Error::invalid(format!(
                "partitioner name `{name}` must be 1 to 64 ASCII letters, digits or - _ . :"
            )));
        }
        Ok(Partitioning { count, partitioner })
    }

    /// `count` partitions by CRC-32.
    pub fn crc32(count: u16) -> Result<Self> {
        Self::new(count, Arc::new(Crc32Partitioner))
    }

    /// The partition count.
    pub fn count(&self) -> u16 {
        self.count
    }

    /// The partitioner's name.
    pub fn partitioner_name(&self) -> &str {
        self.partitioner.name()
    }

    /// The partition of `stream`.
    pub fn of(&self, stream: &StreamId) -> Partition {
        Partition::new(self.partitioner.partition(stream, self.count) % self.count)
    }

    /// `InvalidInput` naming both sides when a journal stored with
    /// `stored_count` partitions by `stored_name` is opened with this one;
    /// the way out is named in the message.
    pub fn check_stored(&self, stored_count: u16, stored_name: &str) -> Result<()> {
        if stored_count == self.count && stored_name == self.partitioner_name() {
            return Ok(());
        }
        Err(Error::invalid(format!(
            "the journal is divided into {stored_count} partitions by `{stored_name}`, \
             not {} by `{}`: repartition it with the workers stopped \
             (`outbox partitions resize --count {} --yes`), or open it with its own partitioning",
            self.count,
            self.partitioner_name(),
            self.count
        )))
    }
}

/// How an adapter opens a journal's partitioning: the count asked for (none:
/// the journal's stored count, or [`DEFAULT_PARTITIONS`] for a journal that
/// has none), the partitioner, and whether a journal stored with another
/// partitioning is repartitioned (only while no partition lease is held)
/// rather than refused. Equal when count, partitioner name and the flag are.
#[derive(Clone, Debug)]
pub struct PartitionOptions {
    /// The partition count asked for.
    pub count: Option<u16>,
    /// The partitioner ([`Crc32Partitioner`] by default).
    pub partitioner: Arc<dyn Partitioner>,
    /// Rewrite a journal stored with another partitioning.
    pub repartition: bool,
}

impl Default for PartitionOptions {
    fn default() -> Self {
        PartitionOptions {
            count: None,
            partitioner: Arc::new(Crc32Partitioner),
            repartition: false,
        }
    }
}

impl PartialEq for PartitionOptions {
    fn eq(&self, other: &Self) -> bool {
        self.count == other.count
            && self.partitioner.name() == other.partitioner.name()
            && self.repartition == other.repartition
    }
}

impl Eq for PartitionOptions {}

/// `InvalidInput` unless `1 <= count <=` [`MAX_PARTITIONS`].
pub fn validate_partition_count(count: u16) -> Result<u16> {
    if count == 0 || count > MAX_PARTITIONS {
        return Err(Error::invalid(format!(
            "a partition count of {count} is out of range (1 to {MAX_PARTITIONS})"
        )));
    }
    Ok(count)
}

/// A worker's lease on a whole partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionLease {
    /// The partition.
    pub partition: Partition,
    /// The holder.
    pub owner: WorkerId,
    /// Grows on every change of owner; never decreases.
    pub epoch: u64,
    /// When the lease expires, by the store's clock.
    pub expires_at: Timestamp,
}

/// What [`PartitionStore::sync_partitions`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PartitionSync {
    /// The leases the owner holds now (renewed or acquired), by partition.
    pub held: Vec<PartitionLease>,
    /// Partitions newly acquired (free, released or expired before).
    pub acquired: Vec<Partition>,
    /// Partitions the owner held and gave up (not wanted any more).
    pub released: Vec<Partition>,
    /// Wanted partitions another owner still holds (until it releases
    /// them or its lease expires).
    pub waiting: Vec<Partition>,
}

/// One partition as `outbox partitions` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PartitionStatus {
    /// The partition.
    pub partition: Partition,
    /// The last owner (kept on an expired lease; none once released or
    /// never leased).
    pub owner: Option<WorkerId>,
    /// The lease's epoch (0 when never leased).
    pub epoch: u64,
    /// When the lease expires (or expired), if it was ever leased.
    pub expires_at: Option<Timestamp>,
    /// Whether an owner holds it now (set and unexpired by the store's clock).
    pub held: bool,
    /// Streams with outbox rows in it.
    pub streams: u64,
    /// Its outbox rows.
    pub rows: u64,
    /// Its rows that are due now (pending or failed, due time passed).
    pub due_rows: u64,
}

/// The rendezvous weight of (`worker`, `partition`): 64-bit FNV-1a of the
/// worker id, mixed with the partition by SplitMix64's finalizer.
fn weight(worker: &WorkerId, partition: Partition) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in worker.as_str().as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut z = h ^ u64::from(partition.get()).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The owner of each of `count` partitions among `workers` (rendezvous
/// hashing: each partition goes to the worker with the highest weight for
/// it, ties to the smaller id). Every worker computing this from the same
/// list gets the same answer, and a worker joining or leaving moves only
/// the partitions it wins or held. Empty when `workers` is.
pub fn assign(workers: &[WorkerId], count: u16) -> Vec<(Partition, WorkerId)> {
    let mut sorted: Vec<&WorkerId> = workers.iter().collect();
    sorted.sort();
    sorted.dedup();
    if sorted.is_empty() {
        return Vec::new();
    }
    Partition::all(count)
        .map(|p| {
            let mut best = sorted[0];
            let mut best_w = weight(best, p);
            for w in &sorted[1..] {
                let wt = weight(w, p);
                if wt > best_w {
                    best = w;
                    best_w = wt;
                }
            }
            (p, best.clone())
        })
        .collect()
}

/// The partitions [`assign`] gives `me` among `workers` (`me` is counted
/// whether or not it is in the list).
pub fn assigned_to(me: &WorkerId, workers: &[WorkerId], count: u16) -> Vec<Partition> {
    let mut all = workers.to_vec();
    all.push(me.clone());
    assign(&all, count)
        .into_iter()
        .filter(|(_, w)| w == me)
        .map(|(p, _)| p)
        .collect()
}

/// Partition leases and claims inside them (the journal side of partition
/// leasing).
///
/// # Contract
/// - `partitioning` is the journal's, fixed while the store is open.
/// - `sync_partitions(owner, wanted, ttl)` runs ONE transaction. Every
///   partition in `wanted` must exist (else `InvalidInput`, nothing
///   changes); duplicates count once. A wanted partition the owner holds
///   (unexpired) is renewed to `now + ttl`, same epoch; a wanted partition
///   that is free, released or expired is acquired (epoch + 1, `now + ttl`);
///   a wanted partition another owner holds unexpired is left alone
///   (`waiting`). Every other partition the owner holds is released (owner
///   cleared, expiry `now`, epoch kept). `held` lists the owner's leases
///   afterwards, by partition. A `ttl` outside the lease TTL range is
///   `InvalidInput`.
/// - `claim_partitioned(owner, ttl, limits)` runs ONE transaction: reads
///   the unexpired partition leases of `owner` (it does not renew them;
///   `sync_partitions` does), then takes up to `limits.streams` streams
///   with a due head in those partitions,
///   oldest due first, skipping streams whose stream lease another owner
///   holds unexpired, and claims each one's head run exactly as
///   [`OutboxQueue::claim`](crate::OutboxQueue::claim) does (at most
///   `limits.per_stream` rows each, `limits.rows` in all; a stream with
///   nothing claimable is left out). It writes no stream lease: each run
///   comes with a [`Lease`] whose `partition` is set, whose `epoch` is the
///   partition lease's, and whose `expires_at` is `now + ttl`: the claimed
///   stream is held out of the due streams until then (it is in flight):
///   claims do not take it again before its pass ends, and a takeover
///   after its holder died finds it due. `claim` under such a lease holds
///   the stream likewise.
/// - A head applied alone (`alone`, or found `processing`) is claimed as
///   [`OutboxQueue::claim`](crate::OutboxQueue::claim) claims it: by
///   itself, a run of one row (ADR 0029).
/// - `claim_and_load_partitioned` takes what `claim_partitioned` takes; a
///   run's `events`, when `Some`, are what
///   [`EventJournal::read_runs`](crate::EventJournal::read_runs) returns
///   for its rows (read with the claim or right after its commit); an
///   adapter may leave any run unread (`None`).
/// - A lease with `partition` set is current while its partition's lease
///   has the same owner and epoch and has not expired. `claim` and `fail`
///   of [`OutboxQueue`](crate::OutboxQueue) and `renew` of
///   [`LeaseStore`](crate::LeaseStore) require that (else `LeaseLost`;
///   `finish` then abandons and releases nothing);
///   `renew` extends the partition lease and the stream's hold; `release`
///   leaves the partition held, returns `false`, and (while the lease is
///   current) ends the stream's hold: the stream is due again by its rows.
/// - Stream leases and partition leases exclude each other: `acquire` (and
///   the calls built on it) refuses a stream whose head lies in a partition
///   another owner holds unexpired, and `due_streams` omits the streams of
///   partitions anyone holds unexpired.
/// - `partitions` reports every partition `0 .. count` in order.
/// - Epochs never decrease for a partition, including across release.
pub trait PartitionStore: Send + Sync {
    /// The journal's partitioning.
    fn partitioning(&self) -> &Partitioning;

    /// Brings `owner`'s partition leases to `wanted`.
    fn sync_partitions(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        ttl: Duration,
    ) -> impl Future<Output = Result<PartitionSync>> + Send;

    /// Claims due runs inside `owner`'s partitions.
    fn claim_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> impl Future<Output = Result<Vec<(Lease, Vec<OutboxRow>)>>> + Send;

    /// [`claim_partitioned`](PartitionStore::claim_partitioned), with each
    /// run's events read by the same call where the adapter can
    /// (see [`OutboxQueue::take`](crate::OutboxQueue::take)).
    /// The default reads none.
    fn claim_and_load_partitioned(
        &self,
        owner: &WorkerId,
        ttl: Duration,
        limits: SweepLimits,
    ) -> impl Future<Output = Result<Vec<ClaimedRun>>> + Send {
        async move {
            self.claim_partitioned(owner, ttl, limits)
                .await
                .map(ClaimedRun::unloaded)
        }
    }

    /// Every partition's lease and rows.
    fn partitions(&self) -> impl Future<Output = Result<Vec<PartitionStatus>>> + Send;
}

/// Handing partitions over from a live worker the assignment no longer
/// gives them to, when a worker joins (issue 43, "fair start"; ADR 0022).
/// An optional capability (ADR 0035): a journal without it hands nothing
/// over, and a joining worker waits for the holders to release its share at
/// their next look at the registry, as before.
///
/// # Contract
/// - `sync_partitions_taking(owner, wanted, from, ttl)` is
///   [`sync_partitions`](PartitionStore::sync_partitions) in ONE
///   transaction, except that a wanted partition held unexpired by an owner
///   listed in `from` (never `owner` itself) is acquired as a free one is:
///   epoch + 1, `now + ttl`, listed in `acquired`. The old holder's claims,
///   fails and renewals under it are then `LeaseLost`, as after an expiry;
///   its completions stand. A partition another owner holds is still
///   `waiting`.
/// - The caller names in `from` only workers that would release the
///   partition themselves (live workers of its mode, which compute the same
///   assignment): it is the release they are about to make, made sooner.
pub trait PartitionHandover: PartitionStore {
    /// Brings `owner`'s partition leases to `wanted`, taking the wanted
    /// partitions that a worker in `from` holds. The default hands nothing
    /// over ([`sync_partitions`](PartitionStore::sync_partitions)).
    fn sync_partitions_taking(
        &self,
        owner: &WorkerId,
        wanted: &[Partition],
        from: &[WorkerId],
        ttl: Duration,
    ) -> impl Future<Output = Result<PartitionSync>> + Send {
        let _ = from;
        self.sync_partitions(owner, wanted, ttl)
    }
}

/// `InvalidInput` for a wanted partition outside the journal, else the
/// wanted set sorted and without duplicates.
pub fn validate_wanted(wanted: &[Partition], count: u16) -> Result<Vec<Partition>> {
    let mut out = wanted
        .iter()
        .map(|p| p.check(count))
        .collect::<Result<Vec<_>>>()?;
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(s: &str) -> WorkerId {
        WorkerId::new(s).unwrap()
    }

    #[test]
    fn crc32_matches_the_standard_check_value() {
        assert_eq!(crc32(b"123456789"), 0xCBF4_3926);
        assert_eq!(crc32(b""), 0);
    }

    #[test]
    fn partitions_display_and_parse() {
        assert_eq!(Partition::new(7).to_string(), "p07");
        assert_eq!(Partition::new(123).to_string(), "p123");
        assert_eq!("p07".parse::<Partition>().unwrap(), Partition::new(7));
        assert_eq!("12".parse::<Partition>().unwrap(), Partition::new(12));
        assert!("px".parse::<Partition>().is_err());
        assert!(Partition::new(16).check(16).is_err());
        assert!(Partition::new(15).check(16).is_ok());
    }

    #[test]
    fn partitioning_is_checked() {
        assert!(Partitioning::crc32(0).is_err());
        assert!(Partitioning::crc32(MAX_PARTITIONS + 1).is_err());
        let p = Partitioning::crc32(16).unwrap();
        let s = StreamId::new("character-42").unwrap();
        assert_eq!(p.of(&s).get(), (crc32(b"character-42") % 16) as u16);
        let err = p.check_stored(32, "crc32").unwrap_err().to_string();
        assert!(err.contains("32 partitions") && err.contains("not 16"), "{err}");
        assert!(p.check_stored(16, "crc32").is_ok());
        assert!(p.check_stored(16, "tenant").is_err());
    }

    #[test]
    fn assignment_covers_every_partition_once_and_agrees_everywhere() {
        let workers = [w("c"), w("a"), w("b")];
        let a = assign(&workers, 16);
        assert_eq!(a.len(), 16);
        let mut reversed = workers.to_vec();
        reversed.reverse();
        assert_eq!(assign(&reversed, 16), a, "order of the list must not matter");
        let mine: usize = workers.iter().map(|me| assigned_to(me, &workers, 16).len()).sum();
        assert_eq!(mine, 16);
        assert!(assign(&[], 16).is_empty());
    }

    #[test]
    fn a_joining_worker_moves_only_the_partitions_it_wins() {
        let before = [w("w1"), w("w2"), w("w3")];
        let after = [w("w1"), w("w2"), w("w3"), w("w4")];
        let (a, b) = (assign(&before, 64), assign(&after, 64));
        for ((p, old), (_, new)) in a.iter().zip(&b) {
            assert!(
                new == old || new.as_str() == "w4",
                "{p} moved from {old} to {new}"
            );
        }
        assert!(b.iter().any(|(_, o)| o.as_str() == "w4"));
    }
}

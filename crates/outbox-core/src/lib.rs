#![doc = include_str!("../README.md")]

mod apply;
mod consumer;
mod error;
mod event;
mod generation;
mod id;
mod live;
mod location;
mod outbox;
mod partition;
mod policy;
mod ports;
mod projection;
mod run;
mod running;
mod sink;
mod skip;
pub mod spi;
mod stored;
mod time;
mod tx;
pub mod typed;
mod view;

pub use consumer::{
    ApplyError, ConsumerInfo, ConsumerKind, ConsumerRegistry, MAX_CODE_VERSION_LEN, OnError,
    validate_code_version,
};
pub use error::{BoxError, Error, Result};
pub use event::{
    AppendOptions, AppendRequest, Appended, Event, EventTypeRegistry, ExpectedVersion, Intent, Metadata,
    NewEvent, NewMetadata, PayloadHash, StreamVersion,
};
pub use generation::{
    GenerationInfo, GenerationStore, MAX_GENERATION, StoredGeneration, StreamBehind, SwapCheck, SwapOutcome,
    generation_storage, split_generation, validate_generation_base,
};
pub use id::{EventType, MAX_ID_LEN, Partition, ProjectionName, Seq, SinkName, StreamId, WorkerId};
pub use location::Location;
pub use outbox::{
    ClaimedRun, ENDED_WITHOUT_RESULT, FailureOutcome, Lease, MAX_ERROR_LEN, MAX_LEASE_TTL, MAX_PAGE,
    MIN_LEASE_TTL, OutboxRow, OutboxStatus, OutboxSummary, StreamEnd, SweepLimits, Take, UNFINISHED_ATTEMPT,
};
pub use partition::{
    Crc32Partitioner, DEFAULT_PARTITIONS, MAX_PARTITIONS, PartitionHandover, PartitionLease,
    PartitionOptions, PartitionStatus, PartitionStore, PartitionSync, Partitioner, Partitioning, assign,
    assigned_to, crc32, validate_partition_count,
};
pub use policy::{FailureDecision, Mode, ModeFlags, ModeSelection, RetryPolicy, select_mode};
pub use ports::{
    ActivityCounts, ActivityLog, ActivitySeries, DeadLetters, EventJournal, LeaseAdmin, LeaseEntry,
    LeaseStore, MAX_ACTIVITY_MINUTES, MINUTE_MS, MinuteActivity, OutboxInspector, OutboxQueue,
    OutboxQueueExt, ProjectionStore, RunStore, ViewStore, WakeSource, WatermarkStore, WorkerInfo,
    WorkerRegistry, validate_activity_minutes,
};
pub use projection::{
    ApplyOutcome, ApplyReport, CheckpointGap, Digest, DigestBuilder, DigestValue, FailedEvent, Projection,
    StreamLag, Watermark,
};
pub use run::{RunBounds, RunEnd, RunKind, RunProgress, RunRecord, RunState};
pub use running::{DocumentHash, RUNNING_DIGEST_LANES, RunningDigest, ViewDigest, ViewDigestCheck};
pub use sink::{
    EventTypeFilter, FeedPage, PROJECTION_CONSUMER_PREFIX, Published, Sink, SinkFeed, SinkStatus, SinkStore,
    SinkStream, SinkSummary, consumer_projection, message_id, projection_consumer,
};
pub use skip::{SkippedEvent, SkippedEvents};
pub use time::{Clock, ManualClock, SystemClock, Timestamp};
pub use view::{
    MAX_VIEW_KEY_LEN, MAX_VIEW_TABLE_LEN, MAX_VIEW_VALUE_LEN, ViewProjection, ViewReader, ViewTx,
    generation_projection, validate_view_key, validate_view_table, view_of, view_projection,
    view_projection_with_candidate,
};

/// Re-exported so adapters and users implement [`Projection`] with the same macro.
pub use async_trait::async_trait;

/// What an application's code names most, in one import:
/// `use outbox_core::prelude::*;`. The port traits are here so their
/// methods can be called on any store (`journal.read_stream(..)`,
/// `journal.summary()`, `store.digest(..)`) without importing each trait;
/// the types are the ones an event, a projection and a test name.
pub mod prelude {
    pub use crate::typed::{DomainEvent, EventKind, TypedViewProjection, json, typed};
    pub use crate::{
        ApplyError, BoxError, ConsumerRegistry, DeadLetters, Error, Event, EventJournal, EventType,
        EventTypeRegistry, ExpectedVersion, GenerationStore, Intent, LeaseAdmin, ManualClock, NewEvent,
        NewMetadata, OnError, OutboxInspector, Projection, ProjectionName, ProjectionStore, Result, RunStore,
        Seq, SinkStore, SkippedEvents, StreamId, ViewProjection, ViewReader, ViewStore, ViewTx,
        WatermarkStore, async_trait,
    };
}

//! Every metric the agent exports, declared once: name, type, unit, labels and
//! help text. The metric reference in docs/metrics.md, the dashboards and the
//! alert rules are checked against this list.

use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusRecorder};

/// Prometheus metric type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of the catalogue.
#[derive(Debug, Clone, Copy)]
pub struct MetricDef {
    /// Prometheus name (OTLP uses the same with dots).
    pub name: &'static str,
    pub kind: Kind,
    pub unit: Option<Unit>,
    /// Label names, in the order they are attached.
    pub labels: &'static [&'static str],
    /// Histogram bucket boundaries.
    pub buckets: Option<&'static [f64]>,
    pub help: &'static str,
}

/// The families published in snapshots (whole sets of series replaced each
/// cycle, `telemetry::snapshot`) rather than through the recorder, by name
/// prefix: a kind that publishes snapshots adds its prefix here, so that the
/// OTLP push observes its families.
pub const SNAPSHOT_PREFIXES: &[&str] = &["kafka_", "queue_"];

/// Buckets of the latency histograms, in seconds: 5 ms to 1 h.
pub const LATENCY_BUCKETS: &[f64] = &[
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
    1800.0, 3600.0,
];
/// Buckets of the attempts histogram (the retry distribution), as SPEC §3.1 fixes them.
pub const ATTEMPT_BUCKETS: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 15.0, 20.0];
/// Buckets of the agent's own poll duration.
pub const POLL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

macro_rules! names {
    ($($konst:ident = $name:literal;)*) => {
        $(#[doc = concat!("`", $name, "`")] pub const $konst: &str = $name;)*
    };
}

names! {
    INBOX_RECEIVED = "inbox_messages_received_total";
    INBOX_DELIVERIES = "inbox_deliveries_total";
    INBOX_DUPLICATES = "inbox_duplicate_deliveries_total";
    INBOX_COMPLETED = "inbox_messages_completed_total";
    INBOX_ATTEMPT_FAILURES = "inbox_attempt_failures_total";
    INBOX_DEAD_LETTERS = "inbox_dead_letters_total";
    INBOX_DEAD_LETTER_REPLAYS = "inbox_dead_letter_replays_total";
    INBOX_DEAD_LETTERS_AFTER_REPLAY = "inbox_dead_letters_after_replay_total";
    INBOX_PERMANENT_RETRIES = "inbox_permanent_error_retries_total";
    INBOX_PROCESSING_DURATION = "inbox_processing_duration_seconds";
    INBOX_END_TO_END = "inbox_end_to_end_latency_seconds";
    INBOX_ATTEMPTS = "inbox_delivery_attempts";
    INBOX_DURATION_QUANTILE = "inbox_processing_duration_quantile_seconds";
    INBOX_BACKLOG = "inbox_backlog_messages";
    INBOX_OLDEST_AGE = "inbox_oldest_unprocessed_age_seconds";
    INBOX_STUCK = "inbox_stuck_messages";
    INBOX_VERSION_GAPS = "inbox_version_gaps";
    INBOX_OLDEST_GAP_AGE = "inbox_oldest_version_gap_age_seconds";
    INBOX_OUT_OF_ORDER_ARRIVALS = "inbox_out_of_order_arrivals_total";
    INBOX_OUT_OF_ORDER_COMPLETIONS = "inbox_out_of_order_completions_total";
    INBOX_PARKED = "inbox_parked_messages";
    INBOX_PARKED_KEYS = "inbox_parked_keys";
    INBOX_OLDEST_PARKED_AGE = "inbox_oldest_parked_age_seconds";
    ORDERING_KEYS_EVICTED = "inboxwatch_ordering_keys_evicted_total";
    OUTBOX_BACKLOG = "outbox_backlog_messages";
    OUTBOX_OLDEST_AGE = "outbox_oldest_unpublished_age_seconds";
    OUTBOX_PUBLISHED = "outbox_messages_published_total";
    OUTBOX_PUBLISH_DELAY = "outbox_publish_delay_seconds";
    SOURCE_UP = "inboxwatch_source_up";
    SOURCE_INFO = "inboxwatch_source_info";
    POLL_DURATION = "inboxwatch_poll_duration_seconds";
    POLL_ERRORS = "inboxwatch_poll_errors_total";
    ROWS_READ = "inboxwatch_rows_read_total";
    ROWS_REJECTED = "inboxwatch_rows_rejected_total";
    SOURCE_DEGRADED = "inboxwatch_source_degraded";
    SOURCE_LEADER = "inboxwatch_source_leader";
    COUNTING_GAPS = "inboxwatch_counting_gaps_total";
    COUNTING_GAP_SECONDS = "inboxwatch_counting_gap_seconds_total";
    SPANS_EXPORTED = "inboxwatch_spans_exported_total";
    SPANS_DROPPED = "inboxwatch_spans_dropped_total";
    BUILD_INFO = "inboxwatch_build_info";
    OBJECTIVE_OLDEST_AGE = "inboxwatch_objective_oldest_age_seconds";
    OBJECTIVE_P95 = "inboxwatch_objective_p95_seconds";
    KAFKA_LAG_MESSAGES = "kafka_consumer_group_lag_messages";
    KAFKA_LAG_SECONDS = "kafka_consumer_group_lag_seconds";
    KAFKA_COMMITTED_OFFSET = "kafka_consumer_group_committed_offset";
    KAFKA_UNCOMMITTED_PARTITIONS = "kafka_consumer_group_uncommitted_partitions";
    KAFKA_HIGH_WATERMARK = "kafka_topic_partition_high_watermark";
    KAFKA_LAST_COMMIT_AGE = "kafka_consumer_group_last_commit_age_seconds";
    KAFKA_GROUP_STATUS = "kafka_consumer_group_status";
    KAFKA_GROUP_MEMBERS = "kafka_consumer_group_members";
    KAFKA_GROUP_INFO = "kafka_consumer_group_info";
    KAFKA_DEAD_LETTERS = "kafka_dead_letter_messages_total";
    KAFKA_RETRIES = "kafka_retry_messages_total";
    KAFKA_RECORD_READS = "inboxwatch_kafka_record_reads_total";
    KAFKA_FUTURE_TIMESTAMPS = "inboxwatch_kafka_future_timestamps_total";
    KAFKA_PARTITIONS_UNAVAILABLE = "inboxwatch_kafka_partitions_unavailable";
    KAFKA_CYCLE_RETRIES = "inboxwatch_kafka_retries_total";
    KAFKA_SHARDS = "inboxwatch_kafka_shards";
    QUEUE_MESSAGES = "queue_messages";
    QUEUE_PUBLISHED = "queue_messages_published_total";
    QUEUE_REDELIVERIES = "queue_redeliveries_total";
    QUEUE_LAG_MESSAGES = "queue_consumer_lag_messages";
    QUEUE_LAG_SECONDS = "queue_consumer_lag_seconds";
    QUEUE_UNACKED = "queue_consumer_unacked_messages";
    QUEUE_OLDEST_UNACKED_AGE = "queue_consumer_oldest_unacked_age_seconds";
    QUEUE_REDELIVERED = "queue_consumer_redelivered_messages";
    QUEUE_REDELIVERED_SCAN_CUT = "queue_consumer_redelivered_scan_cut";
    QUEUE_CONSUMERS = "queue_consumer_consumers";
    QUEUE_CONSUMER_STATUS = "queue_consumer_status";
    QUEUE_CONSUMER_INFO = "queue_consumer_info";
    QUEUE_DEAD_LETTERS = "queue_dead_letters_total";
}

const SE: &[&str] = &["source", "event_type"];
const S: &[&str] = &["source"];
const SEC: &[&str] = &["source", "event_type", "error_class"];
const SC: &[&str] = &["source", "error_class"];
const CGTP: &[&str] = &["cluster", "group", "topic", "partition"];
const SBQ: &[&str] = &["source", "broker", "queue"];
const SBQC: &[&str] = &["source", "broker", "queue", "consumer"];

const fn def(
    name: &'static str,
    kind: Kind,
    unit: Option<Unit>,
    labels: &'static [&'static str],
    help: &'static str,
) -> MetricDef {
    let buckets = match kind {
        Kind::Histogram => Some(LATENCY_BUCKETS),
        _ => None,
    };
    MetricDef {
        name,
        kind,
        unit,
        labels,
        buckets,
        help,
    }
}

/// The catalogue, in the order of the metric reference (docs/metrics.md).
pub static CATALOGUE: &[MetricDef] = &[
    def(
        INBOX_RECEIVED,
        Kind::Counter,
        Some(Unit::Count),
        SE,
        "New event ids seen in the inbox table.",
    ),
    def(
        INBOX_DELIVERIES,
        Kind::Counter,
        Some(Unit::Count),
        SE,
        "Deliveries seen, first deliveries plus duplicates.",
    ),
    def(
        INBOX_DUPLICATES,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "event_type", "phase"],
        "Idempotency hits: deliveries of an event id that was already recorded, by phase (in_flight: not finished yet; after_completion: delivered again after it finished, an ack the broker never got).",
    ),
    def(
        INBOX_COMPLETED,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "event_type", "outcome"],
        "Events that reached a final state, by outcome (succeeded or dead_lettered).",
    ),
    def(
        INBOX_ATTEMPT_FAILURES,
        Kind::Counter,
        Some(Unit::Count),
        SEC,
        "Failed attempts, each counted once when a row shows it (retried or not), by the error class of the row's last_error when counted.",
    ),
    def(
        INBOX_DEAD_LETTERS,
        Kind::Counter,
        Some(Unit::Count),
        SEC,
        "Events dead-lettered, by the error class of their last_error (sums to inbox_messages_completed_total{outcome=\"dead_lettered\"}).",
    ),
    def(
        INBOX_DEAD_LETTER_REPLAYS,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Replays `inboxwatch dead-letters replay` recorded in the source's audit table since the agent's start (read with the agent's own connection; absent when the audit table cannot be read).",
    ),
    def(
        INBOX_DEAD_LETTERS_AFTER_REPLAY,
        Kind::Counter,
        Some(Unit::Count),
        SC,
        "Replayed events dead-lettered again, once per replay, by the error class they died with this time (the fix did not work: stop replaying).",
    ),
    def(
        INBOX_PERMANENT_RETRIES,
        Kind::Counter,
        Some(Unit::Count),
        SEC,
        "Attempts started after a failure of a non-retryable error class: retries spent on errors no retry fixes.",
    ),
    def(
        INBOX_PROCESSING_DURATION,
        Kind::Histogram,
        Some(Unit::Seconds),
        SE,
        "Processing time of the final attempt (started_at to finished_at), once per completed event.",
    ),
    def(
        INBOX_END_TO_END,
        Kind::Histogram,
        Some(Unit::Seconds),
        SE,
        "Time from first receipt to completion (received_at to finished_at), once per completed event.",
    ),
    MetricDef {
        buckets: Some(ATTEMPT_BUCKETS),
        ..def(
            INBOX_ATTEMPTS,
            Kind::Histogram,
            Some(Unit::Count),
            SE,
            "Attempts an event needed, observed at completion (the retry distribution).",
        )
    },
    def(
        INBOX_DURATION_QUANTILE,
        Kind::Gauge,
        Some(Unit::Seconds),
        &["source", "event_type", "quantile"],
        "Processing time quantiles over the sliding window, from a sketch with at most 0.5 % relative error.",
    ),
    def(
        INBOX_BACKLOG,
        Kind::Gauge,
        Some(Unit::Count),
        &["source", "event_type", "status"],
        "Unfinished rows by status (pending, processing, failed).",
    ),
    def(
        INBOX_OLDEST_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        SE,
        "Age of the oldest unfinished row, on the database's clock; 0 when there is none.",
    ),
    def(
        INBOX_STUCK,
        Kind::Gauge,
        Some(Unit::Count),
        SE,
        "Rows in processing for longer than the source's stuck_after.",
    ),
    def(
        INBOX_VERSION_GAPS,
        Kind::Gauge,
        Some(Unit::Count),
        S,
        "Ordering keys where a later version has arrived while an earlier one has not (between the lowest and highest version seen).",
    ),
    def(
        INBOX_OLDEST_GAP_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        S,
        "Age of the earliest arrival among the versions waiting above a gap, on the database's clock; 0 when there is no gap.",
    ),
    def(
        INBOX_OUT_OF_ORDER_ARRIVALS,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Events that arrived with a version lower than one already received for their ordering key.",
    ),
    def(
        INBOX_OUT_OF_ORDER_COMPLETIONS,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Events that succeeded after a higher version of their ordering key had succeeded: an old event may have overwritten newer state.",
    ),
    def(
        INBOX_PARKED,
        Kind::Gauge,
        Some(Unit::Count),
        S,
        "Rows with a status meaning parked: moved aside to be replayed, neither finished nor backlog.",
    ),
    def(
        INBOX_PARKED_KEYS,
        Kind::Gauge,
        Some(Unit::Count),
        S,
        "Distinct ordering keys among the parked rows.",
    ),
    def(
        INBOX_OLDEST_PARKED_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        S,
        "Age of the oldest parked row (from its received_at), on the database's clock; 0 when there is none.",
    ),
    def(
        ORDERING_KEYS_EVICTED,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Ordering keys the agent forgot to stay within ordering_keys_limit (the least recently seen first).",
    ),
    def(
        OUTBOX_BACKLOG,
        Kind::Gauge,
        Some(Unit::Count),
        SE,
        "Outbox rows not yet published.",
    ),
    def(
        OUTBOX_OLDEST_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        SE,
        "Age of the oldest unpublished outbox row; 0 when there is none.",
    ),
    def(
        OUTBOX_PUBLISHED,
        Kind::Counter,
        Some(Unit::Count),
        SE,
        "Outbox rows seen published.",
    ),
    def(
        OUTBOX_PUBLISH_DELAY,
        Kind::Histogram,
        Some(Unit::Seconds),
        SE,
        "Time from creation to publication of an outbox row (created_at to published_at).",
    ),
    def(
        SOURCE_UP,
        Kind::Gauge,
        None,
        S,
        "1 when the source's last poll succeeded, 0 when it failed; 0 too from the moment an agent takes the source (a start or a handover) until its first poll of that term succeeds.",
    ),
    def(
        SOURCE_INFO,
        Kind::Gauge,
        None,
        &["source", "kind", "owner", "service"],
        "Always 1, one per configured source: its kind, owner (\"\" without one) and service, for joins (group_left(owner)).",
    ),
    MetricDef {
        buckets: Some(POLL_BUCKETS),
        ..def(
            POLL_DURATION,
            Kind::Histogram,
            Some(Unit::Seconds),
            S,
            "Duration of one poll of a source, successful or not.",
        )
    },
    def(
        POLL_ERRORS,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "kind"],
        "Failed polls, by kind of failure (connect, schema, query, timeout).",
    ),
    def(
        ROWS_READ,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Rows read from the watched table, re-reads of the overlap window included.",
    ),
    def(
        ROWS_REJECTED,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "reason"],
        "Rows that could not be used as they are, by reason (null_time, unknown_status, finish_before_start, last_error_too_long, bad_traceparent: the span is sent without its link, time_out_of_range, implausible_count, null_cursor).",
    ),
    def(
        SOURCE_DEGRADED,
        Kind::Gauge,
        None,
        &["source", "reason"],
        "1 for the reason that makes most rows of the source unusable: more than half of the rows read in the last 5 minutes (at least 10) were rejected, most of them for this reason (null_time, unknown_status, finish_before_start, time_out_of_range, implausible_count, null_cursor); 0 otherwise.",
    ),
    def(
        SOURCE_LEADER,
        Kind::Gauge,
        None,
        S,
        "1 when this agent owns the source and exports it, 0 when it stands by.",
    ),
    def(
        COUNTING_GAPS,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "reason"],
        "Times this agent began counting a source afresh where counts may have been lost before it (reason handover: it took over from another agent; reason advisories: a NATS source did not listen to JetStream's max-delivery and terminated advisories for a while, its connection down or its poll failed).",
    ),
    def(
        COUNTING_GAP_SECONDS,
        Kind::Counter,
        Some(Unit::Seconds),
        S,
        "Length of the periods in which nobody may have counted the source, as far as this agent can tell (a lower bound, in whole seconds rounded up).",
    ),
    def(
        SPANS_EXPORTED,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Spans the OTLP collector accepted.",
    ),
    def(
        SPANS_DROPPED,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Spans dropped: the export queue was full or the collector did not accept them.",
    ),
    def(
        BUILD_INFO,
        Kind::Gauge,
        None,
        &["version"],
        "Always 1; the version label says which build runs.",
    ),
    def(
        OBJECTIVE_OLDEST_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        S,
        "The source's configured objective for the oldest unprocessed age.",
    ),
    def(
        OBJECTIVE_P95,
        Kind::Gauge,
        Some(Unit::Seconds),
        S,
        "The source's configured objective for the 95th percentile of processing time.",
    ),
    def(
        KAFKA_RECORD_READS,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Kafka fetches of the record at a committed offset, made to read its timestamp (lag seconds); an unchanged offset is not read again.",
    ),
    def(
        KAFKA_FUTURE_TIMESTAMPS,
        Kind::Counter,
        Some(Unit::Count),
        S,
        "Records at a committed offset whose timestamp was later than the agent's clock when read (producer clock skew), each counted once; their lag seconds are 0.",
    ),
    def(
        KAFKA_PARTITIONS_UNAVAILABLE,
        Kind::Gauge,
        Some(Unit::Count),
        S,
        "Watched partitions without a high watermark in the last cycle: no leader, or the leader did not answer even after fresh metadata. Their lag series are left out until they are back.",
    ),
    def(
        KAFKA_SHARDS,
        Kind::Gauge,
        Some(Unit::Count),
        S,
        "Shards of a Kafka source split over the agents (`shards`) that this agent exports: the consumer groups whose id hashes into them (FNV-1a mod the shard count), and, with shard 0, the topic series. Absent where the source is not split; summed over the agents it is the shard count.",
    ),
    def(
        KAFKA_CYCLE_RETRIES,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "reason"],
        "Groups and partitions asked again within a Kafka cycle, by reason: coordinator (NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS, …: asked after a fresh FindCoordinator), leader (NOT_LEADER_OR_FOLLOWER, LEADER_NOT_AVAILABLE, …: after fresh metadata), connection (the broker did not answer).",
    ),
    def(
        KAFKA_LAG_MESSAGES,
        Kind::Gauge,
        Some(Unit::Count),
        CGTP,
        "High watermark minus committed offset, never negative (summed over partitions with granularity = \"topic\").",
    ),
    def(
        KAFKA_LAG_SECONDS,
        Kind::Gauge,
        Some(Unit::Seconds),
        CGTP,
        "Age of the oldest unconsumed record: now minus the timestamp of the record at the committed offset, read from the broker; 0 when lag is 0 (the maximum over partitions with granularity = \"topic\").",
    ),
    def(
        KAFKA_COMMITTED_OFFSET,
        Kind::Gauge,
        Some(Unit::Count),
        CGTP,
        "The group's committed offset (summed over partitions with granularity = \"topic\"). Partitions without a commit have no sample.",
    ),
    def(
        KAFKA_UNCOMMITTED_PARTITIONS,
        Kind::Gauge,
        Some(Unit::Count),
        &["cluster", "group", "topic"],
        "Partitions of a topic the group consumes (it has committed on another partition of it, or is assigned it) on which it has never committed.",
    ),
    def(
        KAFKA_HIGH_WATERMARK,
        Kind::Gauge,
        Some(Unit::Count),
        &["cluster", "topic", "partition"],
        "Offset of the next record to be written (summed over partitions with granularity = \"topic\").",
    ),
    def(
        KAFKA_LAST_COMMIT_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        &["cluster", "group"],
        "Time since any of the group's committed offsets last moved, as observed by the agent (counted from the agent's start).",
    ),
    def(
        KAFKA_GROUP_STATUS,
        Kind::Gauge,
        Some(Unit::Count),
        &["cluster", "group", "status"],
        "1 on the group's current status (ok, warn, stall, stop, rewind, error), 0 on the others; rules in docs/kafka.md, \"Group status\".",
    ),
    def(
        KAFKA_GROUP_MEMBERS,
        Kind::Gauge,
        Some(Unit::Count),
        &["cluster", "group"],
        "Members of the consumer group, as the group coordinator describes it.",
    ),
    def(
        KAFKA_GROUP_INFO,
        Kind::Gauge,
        None,
        &["cluster", "group", "owner", "protocol"],
        "Always 1, one per watched consumer group: its owner ([[sources.owners]], else the source's owner, else \"\"), for joins, and its group protocol (classic, or consumer: KIP-848).",
    ),
    def(
        KAFKA_DEAD_LETTERS,
        Kind::Counter,
        Some(Unit::Count),
        &["cluster", "topic"],
        "Records appended to dead-letter topics (dead_letter_topics pattern), from the growth of their high watermarks.",
    ),
    def(
        KAFKA_RETRIES,
        Kind::Counter,
        Some(Unit::Count),
        &["cluster", "topic", "tier"],
        "Records appended to retry topics (retry_topics pattern), by the tier its `tier` group extracts.",
    ),
    def(
        QUEUE_MESSAGES,
        Kind::Gauge,
        Some(Unit::Count),
        SBQ,
        "Messages the broker holds in the stream or queue (NATS state.messages, Redis XLEN, RabbitMQ messages: a stream's offsets held).",
    ),
    def(
        QUEUE_PUBLISHED,
        Kind::Counter,
        Some(Unit::Count),
        SBQ,
        "Messages appended to the stream or queue since the agent began watching it, from the growth of the broker's own count (NATS last sequence, Redis entries-added, RabbitMQ message_stats.publish or a stream's last offset + 1); a count that falls (a stream recreated, the broker's statistics reset) counts its new value as growth, and the total carries on.",
    ),
    def(
        QUEUE_REDELIVERIES,
        Kind::Counter,
        Some(Unit::Count),
        SBQ,
        "Redeliveries of the queue's messages since the agent began watching it, from the growth of the broker's count (RabbitMQ message_stats.redeliver).",
    ),
    def(
        QUEUE_LAG_MESSAGES,
        Kind::Gauge,
        Some(Unit::Count),
        SBQC,
        "Messages the consumer has not been delivered yet (NATS num_pending, Redis the group's lag, RabbitMQ messages_ready, or a stream's last offset less the consumer's stored offset).",
    ),
    def(
        QUEUE_LAG_SECONDS,
        Kind::Gauge,
        Some(Unit::Seconds),
        SBQC,
        "Age of the oldest message the consumer has not been delivered, on the broker's clock (0 when its lag is 0); absent where the broker keeps no time for it, never estimated.",
    ),
    def(
        QUEUE_UNACKED,
        Kind::Gauge,
        Some(Unit::Count),
        SBQC,
        "Messages delivered to the consumer and not acknowledged yet (NATS num_ack_pending, Redis the group's pending entries, RabbitMQ messages_unacknowledged); absent for a consumer that does not acknowledge.",
    ),
    def(
        QUEUE_OLDEST_UNACKED_AGE,
        Kind::Gauge,
        Some(Unit::Seconds),
        SBQC,
        "Age of the oldest message delivered to the consumer and not acknowledged yet, on the broker's clock (0 when none is).",
    ),
    def(
        QUEUE_REDELIVERED,
        Kind::Gauge,
        Some(Unit::Count),
        SBQC,
        "Messages awaiting acknowledgement that were delivered more than once (NATS num_redelivered, Redis pending entries with a delivery count above 1).",
    ),
    def(
        QUEUE_REDELIVERED_SCAN_CUT,
        Kind::Gauge,
        Some(Unit::Count),
        SBQC,
        "1 when the bounded scan of the consumer's pending entries stopped at its limit, so queue_consumer_redelivered_messages counts only the entries scanned; 0 otherwise.",
    ),
    def(
        QUEUE_CONSUMERS,
        Kind::Gauge,
        Some(Unit::Count),
        SBQC,
        "Consumers attached: NATS waiting pull requests or a bound push subscriber, the Redis group's consumers, RabbitMQ the queue's consumers, or the subscriptions attached to a stream.",
    ),
    def(
        QUEUE_CONSUMER_STATUS,
        Kind::Gauge,
        Some(Unit::Count),
        &["source", "broker", "queue", "consumer", "status"],
        "1 on the consumer's current status (ok, warn, stall, stop, rewind, error), 0 on the others: the rules of Kafka's group status over what it has acknowledged and what it has not (docs/queues.md, \"Consumer status\").",
    ),
    def(
        QUEUE_CONSUMER_INFO,
        Kind::Gauge,
        None,
        &["source", "broker", "queue", "consumer", "owner"],
        "Always 1, one per watched consumer: its owner (the source's owner, else \"\"), for joins.",
    ),
    def(
        QUEUE_DEAD_LETTERS,
        Kind::Counter,
        Some(Unit::Count),
        &["source", "broker", "queue", "consumer", "reason"],
        "Messages the consumer's broker gave up on, by reason: max_deliveries and terminated (NATS advisories, counted while the agent listens), dead_letter_stream (growth of a configured Redis dead-letter stream), dead_letter_queue (RabbitMQ publishes into the queue's dead-letter target).",
    ),
];

/// Looks a metric up by name.
pub fn find(name: &str) -> Option<&'static MetricDef> {
    CATALOGUE.iter().find(|m| m.name == name)
}

/// Registers HELP text and units for every metric with the installed recorder.
pub fn describe() {
    for m in CATALOGUE {
        let unit = m.unit.unwrap_or(Unit::Count);
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, unit, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, unit, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, unit, m.help),
        }
    }
}

/// A Prometheus recorder with the catalogue's histogram buckets.
pub fn catalogue_recorder() -> PrometheusRecorder {
    prometheus_builder().build_recorder()
}

/// A Prometheus exporter builder with the catalogue's histogram buckets.
pub fn prometheus_builder() -> PrometheusBuilder {
    let mut builder = PrometheusBuilder::new();
    for m in CATALOGUE {
        if let Some(buckets) = m.buckets {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(m.name.to_string()), buckets)
                .expect("catalogue buckets are non-empty");
        }
    }
    builder
}

/// The metric reference as a Markdown table (`inboxwatch metrics`), the same
/// table docs/metrics.md carries.
pub fn markdown() -> String {
    let mut out = String::from("| name | type | labels | meaning |\n|---|---|---|---|\n");
    for m in CATALOGUE {
        let labels: Vec<String> = m.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            m.name,
            m.kind.as_str(),
            labels.join(", "),
            m.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_follow_prometheus_conventions() {
        let mut seen = HashSet::new();
        for m in CATALOGUE {
            assert!(seen.insert(m.name), "{} declared twice", m.name);
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}",
                m.name
            );
            if m.unit == Some(Unit::Seconds) {
                let stem = m.name.strip_suffix("_total").unwrap_or(m.name);
                assert!(stem.ends_with("_seconds"), "{} is in seconds", m.name);
            }
            assert!(!m.help.is_empty());
        }
    }

    /// Guards the metric reference in docs/metrics.md: it must be the catalogue's table.
    #[test]
    fn metrics_page_lists_every_metric_of_the_catalogue() {
        let page = include_str!("../../docs/metrics.md");
        assert!(
            page.contains(&markdown()),
            "docs/metrics.md's metric reference differs from the catalogue; paste the output of `inboxwatch metrics`"
        );
    }
}

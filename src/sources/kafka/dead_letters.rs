//! The latest records of a Kafka source's dead-letter topics, for
//! `dead-letters` and the dead-letter page: read like a consumer with no
//! group (no JoinGroup, no OffsetCommit, nothing the broker keeps).
//!
//! 1. `Metadata`: the topics matching `topics` and `dead_letter_topics`, and
//!    their partitions' leaders;
//! 2. per leader, `ListOffsets` twice: the log start (earliest) and the last
//!    stable offset (latest, `read_committed`);
//! 3. per leader, a `Fetch` (`read_committed`, no session) from
//!    `max(log start, last stable − per_partition)` of every partition, at
//!    most [`PARTITION_BYTES`] per partition and [`RESPONSE_BYTES`] per
//!    response, again from where the answer ended for a partition it did
//!    not bring to the end (some brokers answer with one batch per
//!    partition), at most [`MAX_ROUNDS`] fetches;
//! 4. the record batches decoded ([`decode_partition`]): records of aborted
//!    transactions and control records left out; the newest first, at most
//!    `total`.
//!
//! What a record says of its failure is read from the headers Spring Kafka's
//! `DeadLetterPublishingRecoverer` and Kafka Connect's error reporter write
//! ([`ORIGINAL_TOPIC_HEADERS`], …) into the record's own fields.
//!
//! `read_committed` because a dead-letter publisher inside a transaction
//! (Spring Kafka's transactional listener containers) writes records that an
//! abort discards: those were never dead letters, and the consumers of the
//! topic never see them. A record of a transaction still open is not listed
//! until it commits.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::{
    FetchRequest, ListOffsetsRequest, MetadataRequest, fetch_request::FetchPartition,
};
use kafka_protocol::records::{Record, RecordBatchDecoder};

use super::client::{Connection, Connector, KafkaError, error_name};
use super::config::KafkaSpec;
use crate::sources::kind::{DeadPartitionProblem, DeadRecord, DeadRecords, VALUE_PREFIX};

/// Bytes fetched per partition: the last few records of a dead-letter topic
/// fit unless one batch is larger.
pub const PARTITION_BYTES: i32 = 64 * 1024;
/// Bytes fetched per response (per leader broker).
pub const RESPONSE_BYTES: i32 = 1024 * 1024;
/// Fetches per leader in one read: enough for a broker that answers with
/// one batch per partition and the default `--per-partition`.
const MAX_ROUNDS: usize = 16;
/// Bytes of a v2 batch header, from the base offset to the record count.
const HEADER: usize = 61;
/// The compression codecs a batch may use that the agent decodes (the
/// `kafka-protocol` features enabled in Cargo.toml).
const CODECS: &str = "none, gzip, snappy, lz4 and zstd";

/// `read_committed`.
const READ_COMMITTED: i8 = 1;

/// Headers that name the topic a dead letter came from: Spring Kafka's
/// `DeadLetterPublishingRecoverer`, then Kafka Connect's error reporter.
pub const ORIGINAL_TOPIC_HEADERS: &[&str] = &["kafka_dlt-original-topic", "__connect.errors.topic"];
/// Headers that name the exception's class.
pub const EXCEPTION_CLASS_HEADERS: &[&str] = &[
    "kafka_dlt-exception-fqcn",
    "__connect.errors.exception.class.name",
];
/// Headers that hold the exception's message.
pub const EXCEPTION_MESSAGE_HEADERS: &[&str] = &[
    "kafka_dlt-exception-message",
    "__connect.errors.exception.message",
];

/// The value of header `name` (its last, if repeated).
pub fn header<'a>(headers: &'a [(String, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    headers
        .iter()
        .rev()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_slice())
}

/// The first of `names` the headers carry, as text (invalid UTF-8 replaced).
pub fn first_header(headers: &[(String, Vec<u8>)], names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|n| header(headers, n))
        .map(|v| String::from_utf8_lossy(v).into_owned())
}

/// The latest records of `spec`'s dead-letter topics: from each partition,
/// those among its last `per_partition` offsets; at most `total` in all,
/// newest first (by timestamp). Bounded by the source's `timeout` for the
/// whole read. An error only when no broker answers the metadata request;
/// a partition that cannot be read is a problem listed with the records.
pub async fn dead_letter_records(
    spec: &KafkaSpec,
    per_partition: usize,
    total: usize,
) -> Result<DeadRecords, String> {
    let limit = spec.timeout;
    match tokio::time::timeout(limit, read(spec, per_partition, total)).await {
        Ok(r) => r,
        Err(_) => Err(format!(
            "reading the dead-letter topics took longer than the source's timeout ({})",
            humantime::format_duration(limit)
        )),
    }
}

async fn read(spec: &KafkaSpec, per_partition: usize, total: usize) -> Result<DeadRecords, String> {
    let connector = Connector::new(
        spec.client_id.clone(),
        spec.security.clone(),
        spec.timeout.min(Duration::from_secs(10)),
    );
    let mut boot = connector
        .connect_any(&spec.brokers)
        .await
        .map_err(|e| e.to_string())?;
    let meta = boot
        .send(&MetadataRequest::default().with_topics(None))
        .await
        .map_err(|e| e.to_string())?;
    let brokers: HashMap<i32, String> = meta
        .brokers
        .iter()
        .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
        .collect();
    let mut out = DeadRecords::default();
    let mut by_leader: BTreeMap<i32, BTreeMap<String, Vec<i32>>> = BTreeMap::new();
    for t in &meta.topics {
        let Some(name) = &t.name else { continue };
        let name = name.as_str();
        if t.is_internal
            || t.error_code != 0
            || !spec.topics.matches(name)
            || !spec.dead_letter_topics.is_match(name)
        {
            continue;
        }
        for p in &t.partitions {
            if p.leader_id.0 < 0 {
                out.problems
                    .push(problem(name, p.partition_index, "no leader"));
                continue;
            }
            by_leader
                .entry(p.leader_id.0)
                .or_default()
                .entry(name.to_string())
                .or_default()
                .push(p.partition_index);
        }
    }
    if per_partition > 0 && total > 0 {
        for (leader, topics) in &by_leader {
            let fail = |out: &mut DeadRecords, message: String| {
                for (t, ps) in topics {
                    for p in ps {
                        out.problems.push(problem(t, *p, &message));
                    }
                }
            };
            let Some(addr) = brokers.get(leader) else {
                fail(&mut out, format!("leader {leader} is not in the metadata"));
                continue;
            };
            let mut other;
            let conn = if addr == boot.addr() {
                &mut boot
            } else {
                match connector.connect(addr).await {
                    Ok(c) => {
                        other = c;
                        &mut other
                    }
                    Err(e) => {
                        fail(&mut out, e.to_string());
                        continue;
                    }
                }
            };
            if let Err(e) = read_leader(conn, topics, per_partition, &mut out).await {
                fail(&mut out, e.to_string());
            }
        }
    }
    newest_first(&mut out.records, total);
    out.problems.sort_by(|a, b| {
        (&a.topic, a.partition, &a.message).cmp(&(&b.topic, b.partition, &b.message))
    });
    Ok(out)
}

/// Sorts newest first (by timestamp, then topic, partition and offset, the
/// higher offset first) and keeps at most `total`.
fn newest_first(records: &mut Vec<DeadRecord>, total: usize) {
    records.sort_by(|a, b| {
        b.timestamp
            .cmp(&a.timestamp)
            .then_with(|| a.topic.cmp(&b.topic))
            .then_with(|| a.partition.cmp(&b.partition))
            .then_with(|| b.offset.cmp(&a.offset))
    });
    records.truncate(total);
}

fn problem(topic: &str, partition: i32, message: &str) -> DeadPartitionProblem {
    DeadPartitionProblem {
        topic: topic.to_string(),
        partition,
        message: message.to_string(),
    }
}

/// One partition to fetch: its offsets `next..end`.
struct Span {
    topic: String,
    partition: i32,
    /// Where the next fetch starts.
    next: i64,
    end: i64,
    /// Bytes of batches read so far.
    used: usize,
}

/// The offsets, fetch and decoding of the partitions one broker leads.
async fn read_leader(
    conn: &mut Connection,
    topics: &BTreeMap<String, Vec<i32>>,
    per_partition: usize,
    out: &mut DeadRecords,
) -> Result<(), KafkaError> {
    let starts = offsets(conn, topics, -2, 0).await?;
    // Versions before 2 have no isolation level: the high watermark then.
    let isolation = if conn.version::<ListOffsetsRequest>()? >= 2 {
        READ_COMMITTED
    } else {
        0
    };
    let ends = offsets(conn, topics, -1, isolation).await?;
    let mut spans = Vec::new();
    for (t, ps) in topics {
        for &p in ps {
            let key = (t.clone(), p);
            let (start, end) = match (starts.get(&key), ends.get(&key)) {
                (Some(Ok(s)), Some(Ok(e))) => (*s, *e),
                (Some(Err(m)), _) | (_, Some(Err(m))) => {
                    out.problems.push(problem(t, p, m));
                    continue;
                }
                _ => {
                    out.problems
                        .push(problem(t, p, "the broker gave no offsets for it"));
                    continue;
                }
            };
            let from = start.max(end.saturating_sub(per_partition as i64));
            if from < end {
                spans.push(Span {
                    topic: t.clone(),
                    partition: p,
                    next: from,
                    end,
                    used: 0,
                });
            }
        }
    }
    // Some brokers answer with one batch per partition: fetch again from
    // where the last answer ended, within the bytes per partition.
    for _ in 0..MAX_ROUNDS {
        if spans.is_empty() {
            break;
        }
        let resp = conn.send(&fetch_request(&spans)).await?;
        if resp.error_code != 0 {
            return Err(KafkaError::Protocol(format!(
                "Fetch failed: {}",
                error_name(resp.error_code)
            )));
        }
        let mut answers = HashMap::new();
        for t in resp.responses {
            for p in t.partitions {
                answers.insert((t.topic.0.to_string(), p.partition_index), p);
            }
        }
        let mut again = Vec::new();
        for mut span in spans {
            let (t, p) = (span.topic.as_str(), span.partition);
            let Some(answer) = answers.remove(&(t.to_string(), p)) else {
                out.problems
                    .push(problem(t, p, "the broker did not answer the fetch for it"));
                continue;
            };
            if answer.error_code != 0 {
                out.problems
                    .push(problem(t, p, &error_name(answer.error_code)));
                continue;
            }
            let aborted = aborted_transactions(&answer);
            let data = answer.records.unwrap_or_default();
            let d = decode_partition(t, p, &data, span.next, span.end, &aborted);
            out.records.extend(d.records);
            if let Some(m) = d.trouble {
                out.problems.push(problem(t, p, &m));
            }
            span.used += d.used;
            if d.next >= span.end {
                continue;
            }
            if let Some(size) = d.cut {
                if span.used + size > PARTITION_BYTES as usize {
                    out.problems.push(problem(
                        t,
                        p,
                        &format!(
                            "the records from offset {} on are more than the {} KiB read per partition",
                            d.next,
                            PARTITION_BYTES / 1024
                        ),
                    ));
                    continue;
                }
            } else if d.next <= span.next {
                // Nothing more below the end (compaction, markers).
                continue;
            }
            span.next = d.next;
            again.push(span);
        }
        spans = again;
    }
    for span in spans {
        out.problems.push(problem(
            &span.topic,
            span.partition,
            &format!(
                "still short of offset {} after {MAX_ROUNDS} fetches, at offset {}",
                span.end, span.next
            ),
        ));
    }
    Ok(())
}

/// Offsets at `timestamp` (-1 latest, -2 earliest) of every partition of
/// `topics`: per (topic, partition), the offset or the broker's error.
async fn offsets(
    conn: &mut Connection,
    topics: &BTreeMap<String, Vec<i32>>,
    timestamp: i64,
    isolation: i8,
) -> Result<HashMap<(String, i32), Result<i64, String>>, KafkaError> {
    let req = super::fetch::list_offsets(topics, timestamp).with_isolation_level(isolation);
    let resp = conn.send(&req).await?;
    let mut out = HashMap::new();
    for t in resp.topics {
        for p in t.partitions {
            let r = if p.error_code != 0 {
                Err(format!("ListOffsets: {}", error_name(p.error_code)))
            } else if p.offset < 0 {
                Err(format!("ListOffsets gave offset {}", p.offset))
            } else {
                Ok(p.offset)
            };
            out.insert((t.name.0.to_string(), p.partition_index), r);
        }
    }
    Ok(out)
}

fn fetch_request(spans: &[Span]) -> FetchRequest {
    let mut by_topic: BTreeMap<&str, Vec<FetchPartition>> = BTreeMap::new();
    for s in spans {
        by_topic.entry(&s.topic).or_default().push(
            FetchPartition::default()
                .with_partition(s.partition)
                .with_fetch_offset(s.next)
                .with_partition_max_bytes(PARTITION_BYTES - s.used as i32)
                .with_current_leader_epoch(-1)
                .with_log_start_offset(-1),
        );
    }
    // No fetch session: the broker keeps nothing of this read.
    super::fetch::fetch_topics(by_topic, RESPONSE_BYTES, READ_COMMITTED)
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// What one partition's fetched bytes hold.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoded<R = DeadRecord> {
    /// The data records with `from <= offset < end`, oldest first.
    pub records: Vec<R>,
    /// What kept some records of the complete batches from being read: a
    /// codec the agent does not decode, an older message format, a corrupt
    /// batch.
    pub trouble: Option<String>,
    /// Where the next fetch starts: past the last complete batch.
    pub next: i64,
    /// Bytes of the complete batches.
    pub used: usize,
    /// The full size of a batch the fetch size cut off, after them.
    pub cut: Option<usize>,
}

/// Decodes one partition's fetched bytes (record batches, message format
/// v2) fetched from `from`. `aborted` is the fetch response's aborted
/// transactions, (producer id, first offset): their records are left out,
/// as a `read_committed` consumer leaves them out; so are control records
/// (transaction markers).
pub fn decode_partition(
    topic: &str,
    partition: i32,
    data: &Bytes,
    from: i64,
    end: i64,
    aborted: &[(i64, i64)],
) -> Decoded {
    decode_records(data, from, end, aborted, |r, timestamp| {
        dead_record(topic, partition, r, timestamp)
    })
}

/// A decoded record as `dead-letters` lists it.
fn dead_record(topic: &str, partition: i32, r: Record, timestamp: i64) -> DeadRecord {
    let value_len = r.value.as_ref().map(|v| v.len());
    let value_prefix = r
        .value
        .as_ref()
        .map(|v| v[..v.len().min(VALUE_PREFIX)].to_vec())
        .unwrap_or_default();
    let headers: Vec<(String, Vec<u8>)> = r
        .headers
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.map(|v| v.to_vec()).unwrap_or_default()))
        .collect();
    DeadRecord {
        topic: topic.to_string(),
        partition,
        offset: r.offset,
        timestamp,
        key: r.key.map(|k| k.to_vec()),
        original_topic: first_header(&headers, ORIGINAL_TOPIC_HEADERS),
        exception_class: first_header(&headers, EXCEPTION_CLASS_HEADERS),
        exception_message: first_header(&headers, EXCEPTION_MESSAGE_HEADERS),
        headers,
        value_prefix,
        value_len,
    }
}

/// The aborted transactions a partition's Fetch answer lists: (producer
/// id, first offset), as [`decode_records`] takes them.
pub fn aborted_transactions(answer: &PartitionData) -> Vec<(i64, i64)> {
    answer
        .aborted_transactions
        .as_deref()
        .unwrap_or_default()
        .iter()
        .map(|a| (a.producer_id.0, a.first_offset))
        .collect()
}

/// [`decode_partition`], each data record made into an `R` by `make` from
/// the whole record and its timestamp (the batch's, for LogAppendTime).
pub fn decode_records<R>(
    data: &Bytes,
    from: i64,
    end: i64,
    aborted: &[(i64, i64)],
    mut make: impl FnMut(Record, i64) -> R,
) -> Decoded<R> {
    let b = &data[..];
    let mut aborted = aborted.to_vec();
    aborted.sort_by_key(|&(_, first)| first);
    let mut next_aborted = 0;
    let mut aborting: HashSet<i64> = HashSet::new();
    let mut out = Decoded {
        records: Vec::new(),
        trouble: None,
        next: from,
        used: 0,
        cut: None,
    };
    let mut pos = 0usize;
    while b.len() - pos >= 12 {
        let base = i64_at(b, pos);
        if base >= end {
            out.next = out.next.max(end);
            break;
        }
        let len = i32_at(b, pos + 8);
        if len < 0 {
            out.trouble = Some(format!(
                "the record batch at offset {base} has a negative length"
            ));
            break;
        }
        let size = 12 + len as usize;
        if b.len() - pos < size {
            // The fetch size cut it (the broker sends whole batches
            // otherwise).
            out.cut = Some(size);
            break;
        }
        if size < HEADER {
            out.trouble = Some(format!("the record batch at offset {base} is too short"));
            break;
        }
        pos += size;
        out.used = pos;
        let at = pos - size;
        let last = base + i32_at(b, at + 23) as i64;
        out.next = out.next.max(last + 1);
        let magic = b[at + 16] as i8;
        if magic != 2 {
            out.trouble = Some(format!(
                "message format v{magic} at offset {base} is not supported (Kafka 0.11+ record batches only)"
            ));
            continue;
        }
        let attributes = i16::from_be_bytes([b[at + 21], b[at + 22]]);
        let max_timestamp = i64_at(b, at + 35);
        let producer = i64_at(b, at + 43);
        let log_append = attributes & 0x08 != 0;
        let transactional = attributes & 0x10 != 0;
        let control = attributes & 0x20 != 0;
        let codec = attributes & 0x07;
        while next_aborted < aborted.len() && aborted[next_aborted].1 <= last {
            aborting.insert(aborted[next_aborted].0);
            next_aborted += 1;
        }
        if control {
            // A marker ends the producer's transaction: an aborted one's
            // records are behind it.
            aborting.remove(&producer);
            continue;
        }
        if (transactional && aborting.contains(&producer)) || last < from {
            continue;
        }
        if codec > 4 {
            out.trouble = Some(format!(
                "the record batch at offset {base} uses compression codec {codec}, which inboxwatch does not decode (it decodes {CODECS})"
            ));
            continue;
        }
        let mut batch = data.slice(at..pos);
        let set = match RecordBatchDecoder::decode(&mut batch) {
            Ok(set) => set,
            Err(e) => {
                out.trouble = Some(format!(
                    "cannot decode the record batch at offset {base}: {e}"
                ));
                continue;
            }
        };
        for r in set.records {
            if r.control || r.offset < from || r.offset >= end {
                continue;
            }
            // The broker stamps a LogAppendTime batch as a whole, in its
            // header.
            let timestamp = if log_append {
                max_timestamp
            } else {
                r.timestamp
            };
            out.records.push(make(r, timestamp));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::protocol::StrBytes;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(offset: i64, key: Option<&str>, headers: &[(&str, Option<&[u8]>)]) -> Record {
        Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: offset as i32,
            timestamp: 1_000 + offset,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: Some(Bytes::from(format!("value {offset}"))),
            headers: headers
                .iter()
                .map(|(k, v)| {
                    (
                        StrBytes::from_string(k.to_string()),
                        v.map(Bytes::copy_from_slice),
                    )
                })
                .collect(),
            delete_horizon: false,
        }
    }

    fn batch(records: &[Record], compression: Compression) -> BytesMut {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf
    }

    fn offsets(rs: &[DeadRecord]) -> Vec<i64> {
        rs.iter().map(|r| r.offset).collect()
    }

    #[test]
    fn decodes_keys_headers_and_values_of_plain_and_compressed_batches() {
        let spring: &[(&str, Option<&[u8]>)] = &[
            ("kafka_dlt-original-topic", Some(b"orders")),
            (
                "kafka_dlt-exception-fqcn",
                Some(b"java.lang.IllegalStateException"),
            ),
            ("kafka_dlt-exception-message", Some(b"no such order")),
            ("empty", None),
        ];
        let mut buf = BytesMut::new();
        for (i, compression) in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ]
        .into_iter()
        .enumerate()
        {
            let o = 2 * i as i64;
            buf.extend_from_slice(&batch(
                &[record(o, Some("k"), spring), record(o + 1, None, &[])],
                compression,
            ));
        }
        let data = buf.freeze();
        let Decoded {
            records: rs,
            trouble,
            ..
        } = decode_partition("orders.DLQ", 3, &data, 0, 10, &[]);
        assert_eq!(trouble, None);
        assert_eq!(offsets(&rs), (0..10).collect::<Vec<_>>());
        for r in &rs {
            assert_eq!((r.topic.as_str(), r.partition), ("orders.DLQ", 3));
            assert_eq!(r.timestamp, 1_000 + r.offset);
            let v = format!("value {}", r.offset);
            assert_eq!(r.value_prefix, v.as_bytes());
            assert_eq!(r.value_len, Some(v.len()));
            if r.offset % 2 == 0 {
                assert_eq!(r.key.as_deref(), Some(&b"k"[..]));
                assert_eq!(
                    r.headers,
                    vec![
                        ("kafka_dlt-original-topic".to_string(), b"orders".to_vec()),
                        (
                            "kafka_dlt-exception-fqcn".to_string(),
                            b"java.lang.IllegalStateException".to_vec()
                        ),
                        (
                            "kafka_dlt-exception-message".to_string(),
                            b"no such order".to_vec()
                        ),
                        ("empty".to_string(), Vec::new()),
                    ]
                );
                assert_eq!(r.original_topic.as_deref(), Some("orders"));
                assert_eq!(
                    r.exception_class.as_deref(),
                    Some("java.lang.IllegalStateException")
                );
                assert_eq!(r.exception_message.as_deref(), Some("no such order"));
            } else {
                assert_eq!(r.key, None);
                assert!(r.headers.is_empty());
                assert_eq!(r.original_topic, None);
            }
        }
        // Only `from..end`, though the batches hold more.
        let Decoded { records: rs, .. } = decode_partition("t", 0, &data, 3, 7, &[]);
        assert_eq!(offsets(&rs), vec![3, 4, 5, 6]);
    }

    #[test]
    fn values_are_cut_to_their_prefix_and_null_values_have_no_length() {
        let mut big = record(0, None, &[]);
        big.value = Some(Bytes::from(vec![7u8; 1000]));
        let mut tombstone = record(1, Some("gone"), &[]);
        tombstone.value = None;
        let data = batch(&[big, tombstone], Compression::None).freeze();
        let Decoded {
            records: rs,
            trouble,
            ..
        } = decode_partition("t", 0, &data, 0, 2, &[]);
        assert_eq!(trouble, None);
        assert_eq!(rs[0].value_prefix, vec![7u8; VALUE_PREFIX]);
        assert_eq!(rs[0].value_len, Some(1000));
        assert_eq!(rs[1].value_prefix, Vec::<u8>::new());
        assert_eq!(rs[1].value_len, None);
    }

    #[test]
    fn an_unknown_codec_or_a_cut_batch_is_reported_and_the_rest_still_read() {
        let good = batch(&[record(0, None, &[])], Compression::None);
        let mut bad = batch(&[record(1, None, &[])], Compression::None);
        // Codec 6 does not exist; the header alone says so (no CRC check).
        bad[22] |= 0x06;
        let later = batch(&[record(2, None, &[])], Compression::Gzip);
        let mut buf = good.clone();
        buf.extend_from_slice(&bad);
        buf.extend_from_slice(&later);
        let data = buf.freeze();
        let Decoded {
            records: rs,
            trouble,
            ..
        } = decode_partition("t", 0, &data, 0, 3, &[]);
        assert_eq!(offsets(&rs), vec![0, 2]);
        assert_eq!(
            trouble.as_deref(),
            Some(
                "the record batch at offset 1 uses compression codec 6, which inboxwatch does not decode (it decodes none, gzip, snappy, lz4 and zstd)"
            )
        );
        // Cut by the fetch size: what came before it is still listed, and
        // the next fetch starts at the cut batch.
        let cut = data.slice(..data.len() - 3);
        let d = decode_partition("t", 0, &cut, 0, 3, &[]);
        assert_eq!(offsets(&d.records), vec![0]);
        assert_eq!((d.next, d.used), (2, good.len() + bad.len()));
        assert_eq!(d.cut, Some(later.len()));
        // A corrupt batch (its CRC fails).
        let mut corrupt = good.clone();
        let n = corrupt.len();
        corrupt[n - 1] ^= 0xff;
        let Decoded {
            records: rs,
            trouble,
            ..
        } = decode_partition("t", 0, &corrupt.freeze(), 0, 1, &[]);
        assert!(rs.is_empty());
        assert!(
            trouble
                .as_deref()
                .is_some_and(|t| t.starts_with("cannot decode the record batch at offset 0: ")),
            "{trouble:?}"
        );
    }

    #[test]
    fn aborted_transactions_and_control_records_are_left_out() {
        let txn = |offset: i64, producer: i64| {
            let mut r = record(offset, None, &[]);
            r.transactional = true;
            r.producer_id = producer;
            r.producer_epoch = 0;
            r
        };
        let marker = |offset: i64, producer: i64| {
            let mut r = txn(offset, producer);
            r.control = true;
            r.key = Some(Bytes::from_static(&[0, 0, 0, 0]));
            r.value = Some(Bytes::from_static(&[0, 0, 0, 0, 0, 0]));
            r
        };
        let mut buf = BytesMut::new();
        // Producer 7 aborts offsets 0-1 (marker at 2); producer 8 commits 3
        // (marker at 4); 5 is outside any transaction.
        buf.extend_from_slice(&batch(&[txn(0, 7), txn(1, 7)], Compression::None));
        buf.extend_from_slice(&batch(&[marker(2, 7)], Compression::None));
        buf.extend_from_slice(&batch(&[txn(3, 8)], Compression::None));
        buf.extend_from_slice(&batch(&[marker(4, 8)], Compression::None));
        buf.extend_from_slice(&batch(&[record(5, None, &[])], Compression::None));
        let data = buf.freeze();
        let Decoded {
            records: rs,
            trouble,
            ..
        } = decode_partition("t", 0, &data, 0, 6, &[(7, 0)]);
        assert_eq!(trouble, None);
        assert_eq!(offsets(&rs), vec![3, 5]);
        // Without the abort, producer 7's records count.
        let Decoded { records: rs, .. } = decode_partition("t", 0, &data, 0, 6, &[]);
        assert_eq!(offsets(&rs), vec![0, 1, 3, 5]);
    }

    #[test]
    fn log_append_time_batches_take_the_header_timestamp() {
        let mut rs = vec![record(0, None, &[]), record(1, None, &[])];
        rs[1].timestamp = 9_999;
        let mut buf = batch(&rs, Compression::None);
        // Set the LogAppendTime bit as a broker does; recompute the CRC
        // (over attributes to the end).
        buf[22] |= 0x08;
        let crc = crc32c::crc32c(&buf[21..]);
        buf[17..21].copy_from_slice(&crc.to_be_bytes());
        let Decoded {
            records: got,
            trouble,
            ..
        } = decode_partition("t", 0, &buf.freeze(), 0, 2, &[]);
        assert_eq!(trouble, None);
        assert_eq!(
            got.iter().map(|r| r.timestamp).collect::<Vec<_>>(),
            vec![9_999, 9_999]
        );
    }

    #[test]
    fn newest_first_by_timestamp_then_offset_and_bounded() {
        let r = |topic: &str, partition: i32, offset: i64, timestamp: i64| DeadRecord {
            topic: topic.into(),
            partition,
            offset,
            timestamp,
            key: None,
            headers: Vec::new(),
            value_prefix: Vec::new(),
            value_len: Some(0),
            original_topic: None,
            exception_class: None,
            exception_message: None,
        };
        let mut v = vec![
            r("a", 0, 1, 10),
            r("a", 0, 2, 30),
            r("b", 1, 7, 20),
            r("a", 1, 5, 30),
            r("a", 0, 3, 30),
        ];
        newest_first(&mut v, 4);
        let got: Vec<(&str, i32, i64)> = v
            .iter()
            .map(|r| (r.topic.as_str(), r.partition, r.offset))
            .collect();
        assert_eq!(
            got,
            vec![("a", 0, 3), ("a", 0, 2), ("a", 1, 5), ("b", 1, 7)]
        );
    }

    #[test]
    fn kafka_connect_headers_are_read_too() {
        let connect: &[(&str, Option<&[u8]>)] = &[
            ("__connect.errors.topic", Some(b"payments")),
            (
                "__connect.errors.exception.class.name",
                Some(b"org.apache.kafka.connect.errors.DataException"),
            ),
            ("__connect.errors.exception.message", Some(b"bad json")),
        ];
        let data = batch(&[record(0, None, connect)], Compression::None).freeze();
        let Decoded { records: rs, .. } = decode_partition("t", 0, &data, 0, 1, &[]);
        assert_eq!(rs[0].original_topic.as_deref(), Some("payments"));
        assert_eq!(
            rs[0].exception_class.as_deref(),
            Some("org.apache.kafka.connect.errors.DataException")
        );
        assert_eq!(rs[0].exception_message.as_deref(), Some("bad json"));
        assert_eq!(header(&rs[0].headers, "nope"), None);
    }
}

//! Finds the timestamp of the first record at or after an offset in the raw
//! `records` bytes of a fetch response (record batches, message format v2).

use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

/// Bytes of a v2 batch header, from the base offset to the record count.
const HEADER: usize = 61;

/// What the fetched bytes say about the first record at or after the target.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The record, its offset and its timestamp (milliseconds since the epoch:
    /// the producer's CreateTime, or the broker's LogAppendTime when the
    /// topic uses it).
    Record { offset: i64, timestamp_ms: i64 },
    /// The batch holding it was cut off by the fetch size: fetch again with
    /// at least this many bytes.
    NeedBytes(usize),
    /// No data record at or after the target in these bytes (only control or
    /// earlier records): fetch again from `next`.
    Nothing { next: i64 },
}

fn i64_at(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn i32_at(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Looks for the first data record with offset >= `target`.
pub fn first_at_or_after(records: &Bytes, target: i64) -> Result<Found, String> {
    let b = &records[..];
    let mut pos = 0usize;
    let mut next = target;
    while b.len() - pos >= 12 {
        let base = i64_at(b, pos);
        let len = i32_at(b, pos + 8);
        if len < 0 {
            return Err(format!("record batch with negative length {len}"));
        }
        let total = 12 + len as usize;
        let complete = b.len() - pos >= total;
        if b.len() - pos < HEADER {
            // Not even a header: the fetch size cut it.
            return Ok(Found::NeedBytes(total));
        }
        let magic = b[pos + 16] as i8;
        if magic != 2 {
            return Err(format!(
                "message format v{magic} at offset {base} is not supported (Kafka 0.11+ record batches only)"
            ));
        }
        let attributes = i16::from_be_bytes([b[pos + 21], b[pos + 22]]);
        let last = base + i32_at(b, pos + 23) as i64;
        let max_timestamp = i64_at(b, pos + 35);
        let log_append = attributes & 0x08 != 0;
        let control = attributes & 0x20 != 0;
        if last < target || control {
            next = next.max(last + 1);
            if !complete {
                return Ok(Found::Nothing { next });
            }
            pos += total;
            continue;
        }
        if log_append {
            // The broker stamped every record of the batch with the same
            // time: the header alone answers, cut off or not.
            return Ok(Found::Record {
                offset: target.max(base),
                timestamp_ms: max_timestamp,
            });
        }
        if !complete {
            return Ok(Found::NeedBytes(total));
        }
        let mut slice = records.slice(pos..pos + total);
        let set = RecordBatchDecoder::decode(&mut slice)
            .map_err(|e| format!("cannot decode the record batch at offset {base}: {e}"))?;
        if let Some(r) = set
            .records
            .iter()
            .find(|r| r.offset >= target && !r.control)
        {
            return Ok(Found::Record {
                offset: r.offset,
                timestamp_ms: r.timestamp,
            });
        }
        next = next.max(last + 1);
        pos += total;
    }
    Ok(Found::Nothing { next })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(offset: i64, ts: i64, ty: TimestampType) -> Record {
        Record {
            transactional: false,
            control: false,
            partition_leader_epoch: 0,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: ty,
            offset,
            sequence: offset as i32,
            timestamp: ts,
            key: None,
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
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

    #[test]
    fn finds_the_record_inside_a_batch_and_across_batches() {
        let a: Vec<Record> = (10..15)
            .map(|o| record(o, 1_000 + o, TimestampType::Creation))
            .collect();
        let b: Vec<Record> = (15..18)
            .map(|o| record(o, 2_000 + o, TimestampType::Creation))
            .collect();
        let mut buf = batch(&a, Compression::None);
        buf.extend_from_slice(&batch(&b, Compression::Gzip));
        let bytes = buf.freeze();
        for target in 10..18 {
            let want = if target < 15 { 1_000 } else { 2_000 } + target;
            assert_eq!(
                first_at_or_after(&bytes, target).unwrap(),
                Found::Record {
                    offset: target,
                    timestamp_ms: want
                },
                "target {target}"
            );
        }
        // Compaction removed offsets: the next available record answers.
        assert_eq!(
            first_at_or_after(&bytes, 3).unwrap(),
            Found::Record {
                offset: 10,
                timestamp_ms: 1_010
            }
        );
        assert_eq!(
            first_at_or_after(&bytes, 18).unwrap(),
            Found::Nothing { next: 18 }
        );
        // A cut batch asks for its full size.
        let cut = bytes.slice(..bytes.len() - 5);
        let Found::NeedBytes(n) = first_at_or_after(&cut, 16).unwrap() else {
            panic!("expected NeedBytes")
        };
        assert_eq!(n, bytes.len() - batch(&a, Compression::None).len());
    }

    #[test]
    fn log_append_time_uses_the_batch_timestamp() {
        let mut rs: Vec<Record> = (0..3)
            .map(|o| record(o, 5_000 + o, TimestampType::LogAppend))
            .collect();
        rs[2].timestamp = 9_999;
        let mut buf = batch(&rs, Compression::None);
        // The encoder writes CreateTime batches; set the LogAppendTime bit
        // (attributes bit 3) as a broker with LogAppendTime does. Only the
        // header is read for such a batch, so its CRC is not checked.
        buf[22] |= 0x08;
        let bytes = buf.freeze();
        assert_eq!(
            first_at_or_after(&bytes, 1).unwrap(),
            Found::Record {
                offset: 1,
                timestamp_ms: 9_999
            }
        );
    }

    #[test]
    fn control_batches_are_skipped() {
        let mut ctl = record(0, 1, TimestampType::Creation);
        ctl.control = true;
        ctl.transactional = true;
        ctl.key = Some(Bytes::from_static(&[0, 0, 0, 0]));
        let mut buf = batch(&[ctl], Compression::None);
        buf.extend_from_slice(&batch(
            &[record(1, 77, TimestampType::Creation)],
            Compression::None,
        ));
        let bytes = buf.freeze();
        assert_eq!(
            first_at_or_after(&bytes, 0).unwrap(),
            Found::Record {
                offset: 1,
                timestamp_ms: 77
            }
        );
    }
}

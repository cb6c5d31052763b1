//! The dead-letter topics a kind may list: the latest records themselves
//! (not rows of a table), newest first, read without joining a consumer
//! group. The kind reads what the records say of their failure (the topic
//! they came from, the exception) from its own conventions, so that the
//! pages and `dead-letters` show the fields without knowing them.

use super::Answer;

/// The latest records of a source's dead-letter topics.
pub trait DeadLetterTopics: Sync {
    /// At most `per_partition` per partition and `total` in all, newest
    /// first, read without a consumer group.
    fn dead_letter_records(
        &self,
        per_partition: usize,
        total: usize,
    ) -> Answer<'_, Result<DeadRecords, String>>;
}

/// Bytes of a dead-letter record's value that [`DeadRecord`] keeps.
pub const VALUE_PREFIX: usize = 256;

/// One record of a dead-letter topic, as `dead-letters` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadRecord {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    /// Milliseconds since the epoch: the producer's CreateTime, or the
    /// broker's LogAppendTime when the topic uses it.
    pub timestamp: i64,
    /// `None`: a null key.
    pub key: Option<Vec<u8>>,
    /// In the record's order; a null header value is empty. A key the
    /// record repeats appears once, with its last value.
    pub headers: Vec<(String, Vec<u8>)>,
    /// The first [`VALUE_PREFIX`] bytes of the value.
    pub value_prefix: Vec<u8>,
    /// Bytes of the whole value; `None`: a null value (a tombstone).
    pub value_len: Option<usize>,
    /// The topic the failed record came from, as the record says (invalid
    /// UTF-8 replaced).
    pub original_topic: Option<String>,
    /// The class of the exception that dead-lettered it.
    pub exception_class: Option<String>,
    /// The exception's message.
    pub exception_message: Option<String>,
}

/// A partition of a dead-letter topic whose latest records could not be
/// read (its leader did not answer, a batch used an unknown compression
/// codec or was larger than the read allows, …); its other partitions are
/// still listed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPartitionProblem {
    pub topic: String,
    pub partition: i32,
    pub message: String,
}

/// The latest records of a source's dead-letter topics, newest first, and
/// the partitions that could not be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeadRecords {
    pub records: Vec<DeadRecord>,
    pub problems: Vec<DeadPartitionProblem>,
}

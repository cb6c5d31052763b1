//! What a row's status means (`Status`: pending, processing, succeeded,
//! failed, dead, parked) and the words one table uses for each
//! (`StatusMap`): what the settings, the status rules and the events log
//! all speak of, so it sits below them.

/// What a status word means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Status {
    Pending,
    Processing,
    Succeeded,
    Failed,
    Dead,
    /// Moved aside with its key's later versions, to be replayed: neither
    /// finished nor unfinished (not in the backlog).
    Parked,
}

impl Status {
    /// The meanings in the order of the config keys.
    pub const ALL: [Status; 6] = [
        Status::Pending,
        Status::Processing,
        Status::Succeeded,
        Status::Failed,
        Status::Dead,
        Status::Parked,
    ];

    /// The config key / label value of this meaning.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Pending => "pending",
            Status::Processing => "processing",
            Status::Succeeded => "succeeded",
            Status::Failed => "failed",
            Status::Dead => "dead",
            Status::Parked => "parked",
        }
    }

    /// The meaning a config key or a rule's SQL names.
    pub fn from_name(name: &str) -> Option<Status> {
        Status::ALL.into_iter().find(|s| s.as_str() == name)
    }

    /// Succeeded or dead-lettered: the event is done.
    pub fn is_terminal(self) -> bool {
        matches!(self, Status::Succeeded | Status::Dead)
    }
}

/// The status words of one table, in the order of their meanings (pending,
/// processing, succeeded, failed, dead) and, within one, as configured — so
/// generated SQL lists them in the same order as the recommended indexes.
#[derive(Debug, Clone)]
pub struct StatusMap {
    words: Vec<(String, Status)>,
}

impl StatusMap {
    /// The map of these words, each with its meaning, in that order.
    pub fn new(words: Vec<(String, Status)>) -> StatusMap {
        StatusMap { words }
    }

    /// What a word means, if the table's map knows it.
    pub fn classify(&self, word: &str) -> Option<Status> {
        self.words.iter().find(|(w, _)| w == word).map(|(_, s)| *s)
    }

    /// The words that mean `status`.
    pub fn words_for(&self, status: Status) -> Vec<&str> {
        self.words
            .iter()
            .filter(|(_, s)| *s == status)
            .map(|(w, _)| w.as_str())
            .collect()
    }

    /// The words of every unfinished meaning: pending, then processing, then failed.
    pub fn unfinished_words(&self) -> Vec<&str> {
        [Status::Pending, Status::Processing, Status::Failed]
            .into_iter()
            .flat_map(|s| self.words_for(s))
            .collect()
    }
}

impl Default for StatusMap {
    /// Each meaning's own name, except `parked`: a table parks only if its
    /// map says with which word.
    fn default() -> Self {
        StatusMap {
            words: Status::ALL
                .iter()
                .filter(|s| **s != Status::Parked)
                .map(|s| (s.as_str().to_string(), *s))
                .collect(),
        }
    }
}

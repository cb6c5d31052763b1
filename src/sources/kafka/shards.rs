//! A Kafka source split over agents (`shards = N` or `"auto"`): its consumer
//! groups fall into shards by a stable hash of the group id, and the leader of
//! the source's election group (`election.rs`) gives each agent present its
//! shards in the SyncGroup round, as a Kafka consumer group's leader assigns
//! partitions. An agent exports the groups of its shards; the holder of shard
//! 0 also exports the topic series (high watermarks, unavailable partitions,
//! dead-letter and retry topics), so that each series has one exporter.
//!
//! An assignment lasts one generation of the election group: when an agent
//! comes or goes, every member stops exporting before it rejoins (the
//! coordinator answers a join only once every member has rejoined or timed
//! out), so a shard is never exported by two agents at once.

use std::sync::{Arc, Mutex};

/// Most shards a source may be split into.
pub const MAX_SHARDS: u32 = 256;

/// How a source's consumer groups are split over the agents (`shards`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shards {
    /// One agent reads every group (the default, `shards = 1`).
    One,
    /// `shards = N` (2 ≤ N ≤ [`MAX_SHARDS`]): N shards, spread over the agents
    /// present; an agent beyond the N-th stands by.
    Fixed(u32),
    /// `shards = "auto"`: as many shards as agents present, one each.
    Auto,
}

impl Shards {
    /// The election group's protocol name: agents configured differently
    /// cannot share a group (the coordinator refuses the join,
    /// INCONSISTENT_GROUP_PROTOCOL), instead of reading overlapping shares.
    pub fn protocol(self) -> String {
        match self {
            Shards::One => "leader".into(),
            Shards::Fixed(n) => format!("shards-{n}"),
            Shards::Auto => "shards-auto".into(),
        }
    }

    pub fn is_split(self) -> bool {
        self != Shards::One
    }
}

/// The shard of consumer group `group` among `of`: FNV-1a (32 bits) of its
/// UTF-8 bytes, modulo `of`. Stable across agents, versions and restarts.
pub fn shard_of(group: &str, of: u32) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in group.as_bytes() {
        h ^= u32::from(*b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % of.max(1)
}

/// The shards one agent holds in one generation of the election group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// This agent's shards, ascending.
    pub mine: Vec<u32>,
    /// Shards in all.
    pub of: u32,
}

impl Assignment {
    /// Whether this agent exports consumer group `group`.
    pub fn owns_group(&self, group: &str) -> bool {
        self.mine.binary_search(&shard_of(group, self.of)).is_ok()
    }

    /// Whether this agent exports the topic series (it holds shard 0).
    pub fn owns_topics(&self) -> bool {
        self.mine.first() == Some(&0)
    }

    /// "shards 0, 2 of 4".
    pub fn describe(&self) -> String {
        let mine: Vec<String> = self.mine.iter().map(u32::to_string).collect();
        match mine.len() {
            0 => format!("no shard of {}", self.of),
            1 => format!("shard {} of {}", mine[0], self.of),
            _ => format!("shards {} of {}", mine.join(", "), self.of),
        }
    }

    /// The assignment as the leader sends it in SyncGroup: `of` and the
    /// shards, as big-endian u32s after a version (0) u16.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(6 + 4 * self.mine.len());
        out.extend_from_slice(&0u16.to_be_bytes());
        out.extend_from_slice(&self.of.to_be_bytes());
        for s in &self.mine {
            out.extend_from_slice(&s.to_be_bytes());
        }
        out
    }

    /// Reads [`Assignment::encode`]'s bytes; `None` for anything else (a
    /// leader of another version, or none: an empty or null assignment).
    pub fn decode(bytes: &[u8]) -> Option<Assignment> {
        let (version, rest) = bytes.split_first_chunk::<2>()?;
        if u16::from_be_bytes(*version) != 0 {
            return None;
        }
        let (of, mut rest) = rest.split_first_chunk::<4>()?;
        let of = u32::from_be_bytes(*of);
        if of == 0 || of > MAX_SHARDS || rest.len() % 4 != 0 {
            return None;
        }
        let mut mine = Vec::with_capacity(rest.len() / 4);
        while let Some((s, tail)) = rest.split_first_chunk::<4>() {
            let s = u32::from_be_bytes(*s);
            if s >= of {
                return None;
            }
            mine.push(s);
            rest = tail;
        }
        mine.sort_unstable();
        mine.dedup();
        Some(Assignment { mine, of })
    }
}

/// What the leader gives each member, in the order of `members` (their ids,
/// as the coordinator listed them): the members sorted by id, shard `s` to
/// the `s mod m`-th. With `Auto` each of the m members gets one of m shards.
pub fn assign(members: &[&str], shards: Shards) -> Vec<Assignment> {
    let m = members.len() as u32;
    let of = match shards {
        Shards::One => 1,
        Shards::Fixed(n) => n,
        Shards::Auto => m.max(1),
    };
    let mut order: Vec<usize> = (0..members.len()).collect();
    order.sort_by_key(|&i| members[i]);
    let mut out = vec![
        Assignment {
            mine: Vec::new(),
            of
        };
        members.len()
    ];
    if m == 0 {
        return out;
    }
    for s in 0..of {
        out[order[(s % m) as usize]].mine.push(s);
    }
    out
}

/// The assignment of the current generation, shared by the election (which
/// sets it after each round and clears it before rejoining) and the source
/// it decides (which reads it when an ownership term starts).
#[derive(Debug, Clone, Default)]
pub struct Slot(Arc<Mutex<Option<Assignment>>>);

impl Slot {
    pub fn get(&self) -> Option<Assignment> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, a: Option<Assignment>) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = a;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_is_fnv1a_and_spreads_groups_evenly() {
        // FNV-1a 32's published test vectors.
        assert_eq!(shard_of("", u32::MAX), 0x811c_9dc5);
        assert_eq!(shard_of("a", u32::MAX), 0xe40c_292c);
        assert_eq!(shard_of("foobar", u32::MAX), 0xbf9c_f968);
        let mut per = [0usize; 3];
        for i in 0..3000 {
            per[shard_of(&format!("group-{i}"), 3) as usize] += 1;
        }
        for n in per {
            assert!((900..=1100).contains(&n), "groups per shard {per:?}");
        }
    }

    #[test]
    fn every_shard_goes_to_exactly_one_member_and_the_counts_differ_by_one_at_most() {
        for (members, shards) in [
            (vec!["c", "a", "b"], Shards::Fixed(8)),
            (vec!["a"], Shards::Fixed(4)),
            (vec!["a", "b", "c", "d", "e"], Shards::Fixed(3)),
            (vec!["b", "a"], Shards::Auto),
        ] {
            let out = assign(&members, shards);
            let of = out[0].of;
            let mut all: Vec<u32> = out.iter().flat_map(|a| a.mine.clone()).collect();
            all.sort_unstable();
            assert_eq!(all, (0..of).collect::<Vec<_>>(), "{members:?} {shards:?}");
            let counts: Vec<usize> = out.iter().map(|a| a.mine.len()).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{members:?} {shards:?}: {counts:?}");
        }
        // Sorted by id, whatever the coordinator's order.
        let out = assign(&["b", "a"], Shards::Auto);
        assert_eq!(out[1].mine, vec![0]);
        assert_eq!(out[0].mine, vec![1]);
        assert!(out[1].owns_topics() && !out[0].owns_topics());
    }

    #[test]
    fn an_assignment_reads_back_and_anything_else_is_none() {
        let a = Assignment {
            mine: vec![0, 5],
            of: 6,
        };
        assert_eq!(Assignment::decode(&a.encode()), Some(a.clone()));
        assert_eq!(a.describe(), "shards 0, 5 of 6");
        assert_eq!(Assignment::decode(&[]), None);
        assert_eq!(Assignment::decode(&[0, 1, 0, 0, 0, 2]), None, "version 1");
        assert_eq!(Assignment::decode(&[0, 0, 0, 0, 0, 0]), None, "of 0");
        assert_eq!(
            Assignment::decode(&[0, 0, 0, 0, 0, 2, 0, 0, 0, 2]),
            None,
            "shard 2 of 2"
        );
        let groups: Vec<String> = (0..100).map(|i| format!("g{i}")).collect();
        let halves = assign(&["x", "y"], Shards::Fixed(2));
        for g in &groups {
            assert_eq!(
                halves.iter().filter(|a| a.owns_group(g)).count(),
                1,
                "group {g}"
            );
        }
    }
}

//! Write-time prediction of a directory class, and its score
//! (docs/caching.md, "Predicting a write's class").
//!
//! A directory class knows a file's blocks only once the file system has
//! committed the metadata naming them — for ext4, the journal commit after
//! the allocation, seconds after the data itself reached the block device.
//! Acting only then caches everything first (the class cannot keep other
//! data out) or nothing of a new file (it cannot take the class's data in).
//! The predictor answers at write time instead, from where the file
//! system's allocator puts data. ext4 places a file's data in its inode's
//! (flexible) block group or the groups after it, and a directory's inodes
//! near its parent's, so a directory tree's files share groups; within a
//! group, a file grows from its own last extent. The limit, measured
//! (docs/caching.md): ext4 gives files over 64 KiB their data by stream
//! allocation, from where the last large allocation ended, so large files
//! written at the same time share groups whatever their directories, and
//! there the verdict is near chance. Classes use it only when asked
//! (`IoClass::predict`).
//!
//! Owned state: the class's known extents and the blocks in use at the last
//! refresh (`Allocation`), per-group byte counts of the class and of the
//! rest, and the guesses not yet checked. A write's verdict, in order:
//! 1. a block the class's files hold: the class (known);
//! 2. a block in use by anything else: not the class (known);
//! 3. a block free at the last refresh (being allocated now): the verdict
//!    of its group — the class if ≥ 80 % of the group's bytes in use are
//!    the class's, not if ≤ 20 %; in a mixed group, the owner of the
//!    nearest block in use below it in the group (a growing file's last
//!    extent); in a group with nothing in use, that of the nearest group
//!    below that has something (the allocator moves on to the next group
//!    when one is full); with nothing below, not the class.
//!
//! Every guess (case 3) is kept until a later refresh names its blocks (or
//! `AGE_MAX` refreshes pass: the file was deleted first), then scored
//! against what the metadata says (`Outcome`). Invariants: each guessed
//! byte is scored once, when resolved (a block written twice is two
//! guesses); the counts only grow.

use std::collections::VecDeque;
use std::sync::Arc;

/// What the file system holds in use at one moment, and its group
/// geometry (from `sluice_ext4::Layout`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Allocation {
    /// Byte ranges (sorted, disjoint) of every block in use but the file
    /// system's fixed metadata (bitmaps, inode tables).
    pub allocated: Vec<(u64, u64)>,
    /// Byte where group 0 starts.
    pub first_byte: u64,
    /// Bytes per block group (> 0).
    pub group_bytes: u64,
}

/// How the class's bytes and everyone else's were judged at write time
/// (bytes, each counted once the metadata named it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Outcome {
    /// The class's bytes admitted as the class when written (known or
    /// guessed right).
    pub class_in_time_bytes: u64,
    /// The class's bytes guessed to be another's when written.
    pub class_missed_bytes: u64,
    /// Other bytes kept out of the class when written.
    pub other_kept_out_bytes: u64,
    /// Other bytes guessed to be the class's when written.
    pub other_admitted_bytes: u64,
    /// Guessed bytes no refresh named before `AGE_MAX` refreshes (freed
    /// first, or never committed).
    pub unresolved_bytes: u64,
}

/// Refreshes a guess waits for the metadata naming its blocks.
const AGE_MAX: u32 = 60;
/// Most guesses kept (the oldest are dropped as unresolved beyond).
const GUESSES_MAX: usize = 1 << 20;

#[derive(Clone, Copy, Debug)]
struct Guess {
    start: u64,
    end: u64,
    class: bool,
    age: u32,
}

/// One directory class's predictor (module doc).
#[derive(Clone, Debug, Default)]
pub(super) struct Predictor {
    class: Arc<Vec<(u64, u64)>>,
    alloc: Allocation,
    /// Groups with any byte in use: (group, the class's bytes, others'),
    /// sorted by group.
    groups: Vec<(u64, u64, u64)>,
    guesses: VecDeque<Guess>,
    outcome: Outcome,
}

/// Bytes of [a, b) inside `ranges` (sorted, disjoint).
fn overlap(ranges: &[(u64, u64)], a: u64, b: u64) -> u64 {
    let mut i = ranges.partition_point(|&(_, end)| end <= a);
    let mut n = 0;
    while i < ranges.len() && ranges[i].0 < b {
        n += ranges[i].1.min(b) - ranges[i].0.max(a);
        i += 1;
    }
    n
}

/// Whether byte `o` is inside `ranges` (sorted, disjoint).
pub(super) fn contains(ranges: &[(u64, u64)], o: u64) -> bool {
    let i = ranges.partition_point(|&(_, end)| end <= o);
    i < ranges.len() && ranges[i].0 <= o
}

impl Predictor {
    /// A predictor knowing the class's extents and the file system's blocks
    /// in use now.
    pub(super) fn new(class: Arc<Vec<(u64, u64)>>, alloc: Allocation) -> Predictor {
        let mut p = Predictor::default();
        p.refresh(class, alloc);
        p
    }

    /// What the metadata says now: score the guesses it names, and return
    /// the byte ranges guessed to be the class's that are another's (their
    /// cached copies should leave the class).
    pub(super) fn refresh(&mut self, class: Arc<Vec<(u64, u64)>>, alloc: Allocation) -> Vec<(u64, u64)> {
        assert!(alloc.group_bytes > 0, "a block group has bytes");
        assert!(alloc.allocated.windows(2).all(|w| w[0].1 <= w[1].0), "blocks in use are sorted and disjoint");
        let mut counts: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
        let group_of = |o: u64| o.saturating_sub(alloc.first_byte) / alloc.group_bytes;
        let mut split = |ranges: &[(u64, u64)], class: bool| {
            for &(mut a, b) in ranges {
                while a < b {
                    let g = group_of(a);
                    let end = (alloc.first_byte + (g + 1) * alloc.group_bytes).min(b);
                    let e = counts.entry(g).or_default();
                    if class {
                        e.0 += end - a;
                    } else {
                        e.1 += end - a;
                    }
                    a = end;
                }
            }
        };
        split(&alloc.allocated, false);
        split(&class, true);
        // Blocks in use counted as others' minus the class's (which are in
        // use too).
        self.groups = counts.into_iter().map(|(g, (c, all))| (g, c, all.saturating_sub(c))).collect();
        self.class = class;
        self.alloc = alloc;
        let mut wrong = Vec::new();
        let mut kept = VecDeque::with_capacity(self.guesses.len());
        while let Some(mut g) = self.guesses.pop_front() {
            let len = g.end - g.start;
            let mine = overlap(&self.class, g.start, g.end);
            let theirs = overlap(&self.alloc.allocated, g.start, g.end).saturating_sub(mine);
            g.age += 1;
            if mine + theirs < len && g.age < AGE_MAX {
                kept.push_back(g);
                continue;
            }
            let o = &mut self.outcome;
            if g.class {
                o.class_in_time_bytes += mine;
                o.other_admitted_bytes += theirs;
                if theirs > 0 {
                    wrong.push((g.start, g.end));
                }
            } else {
                o.class_missed_bytes += mine;
                o.other_kept_out_bytes += theirs;
            }
            o.unresolved_bytes += len - mine - theirs;
        }
        self.guesses = kept;
        wrong
    }

    /// Whether a write of [start, start + len) is the class's (module doc),
    /// recorded to be scored.
    pub(super) fn judge(&mut self, start: u64, len: u64) -> bool {
        if contains(&self.class, start) {
            self.outcome.class_in_time_bytes += len;
            return true;
        }
        if contains(&self.alloc.allocated, start) {
            self.outcome.other_kept_out_bytes += len;
            return false;
        }
        let class = self.guess(start);
        let end = start + len;
        match self.guesses.back_mut() {
            Some(g) if g.end == start && g.class == class && g.age == 0 => g.end = end,
            _ => {
                if self.guesses.len() >= GUESSES_MAX {
                    let old = self.guesses.pop_front().expect("full");
                    self.outcome.unresolved_bytes += old.end - old.start;
                }
                self.guesses.push_back(Guess { start, end, class, age: 0 });
            }
        }
        class
    }

    /// The guess for a block free at the last refresh (module doc, case 3).
    fn guess(&self, o: u64) -> bool {
        let a = &self.alloc;
        let g = o.saturating_sub(a.first_byte) / a.group_bytes;
        let i = self.groups.partition_point(|&(grp, ..)| grp < g);
        match self.groups.get(i) {
            Some(&(grp, c, x)) if grp == g => {
                if c * 5 >= (c + x) * 4 {
                    return true;
                }
                if c * 5 <= c + x {
                    return false;
                }
                // Mixed: the owner of the nearest block in use below.
                let group_start = a.first_byte + g * a.group_bytes;
                let j = a.allocated.partition_point(|&(s, _)| s < o);
                match j.checked_sub(1).map(|j| a.allocated[j]) {
                    Some((_, end)) if end > group_start => contains(&self.class, end - 1),
                    _ => c >= x,
                }
            }
            _ => match i.checked_sub(1).map(|i| self.groups[i]) {
                Some((_, c, x)) => c >= x,
                None => false,
            },
        }
    }

    /// Whether the byte at `o` is in use by another than the class, as the
    /// last refresh read the file system.
    pub(super) fn known_other(&self, o: u64) -> bool {
        contains(&self.alloc.allocated, o) && !contains(&self.class, o)
    }

    /// The score so far.
    pub(super) fn outcome(&self) -> Outcome {
        self.outcome
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const G: u64 = 128 << 20;
    const M: u64 = 1 << 20;

    fn alloc(ranges: &[(u64, u64)]) -> Allocation {
        Allocation { allocated: ranges.to_vec(), first_byte: 0, group_bytes: G }
    }

    /// Known blocks are judged by the metadata; a free block by its group:
    /// a group of the class's, a group of others', a mixed group by the
    /// nearest block below, an empty group by the nearest group below.
    #[test]
    fn a_free_block_is_judged_by_where_the_allocator_puts_data() {
        // Group 0: others' only. Group 1: the class's only. Group 3: mixed,
        // the class's file at 10-20 MiB, another's at 40-50 MiB.
        let class = Arc::new(vec![(G + 5 * M, G + 9 * M), (3 * G + 10 * M, 3 * G + 20 * M)]);
        let used = alloc(&[
            (0, 8 * M),
            (G + 5 * M, G + 9 * M),
            (3 * G + 10 * M, 3 * G + 20 * M),
            (3 * G + 40 * M, 3 * G + 50 * M),
        ]);
        let mut p = Predictor::new(class, used);
        assert!(p.judge(G + 6 * M, 4096), "known: the class's file");
        assert!(!p.judge(M, 4096), "known: another's");
        assert!(p.judge(G + 60 * M, 4096), "free in the class's group");
        assert!(!p.judge(50 * M, 4096), "free in others' group");
        assert!(p.judge(3 * G + 25 * M, 4096), "mixed group, the class's file just below");
        assert!(!p.judge(3 * G + 55 * M, 4096), "mixed group, another's file just below");
        assert!(p.judge(2 * G + 7 * M, 4096), "empty group after the class's");
        assert!(!p.judge(G - 4096, 4096), "free in group 0, others'");
        let empty = Predictor::new(Arc::new(Vec::new()), alloc(&[]));
        assert!(!empty.guess(5 * G), "nothing known: not the class");
    }

    /// Guesses are scored once a refresh names their blocks: right and wrong
    /// both ways, the wrong admissions returned; a guess never named is
    /// unresolved after `AGE_MAX` refreshes; bytes are counted once.
    #[test]
    fn guesses_are_scored_against_the_metadata_that_names_them() {
        let class = Arc::new(vec![(G, G + M)]);
        let mut p = Predictor::new(class.clone(), alloc(&[(0, M), (G, G + M)]));
        // Two class guesses in the class's group (sequential: one guess),
        // one other guess in group 0, one class guess never named.
        assert!(p.judge(G + 2 * M, 4096));
        assert!(p.judge(G + 2 * M + 4096, 4096));
        assert!(!p.judge(2 * M, 8192));
        assert!(p.judge(G + 90 * M, 4096));
        assert_eq!(p.guesses.len(), 3, "a sequential guess is extended");
        // The next refresh: the first write was the class's; of the second,
        // half is another file's; the other guess is another's too.
        let class2 = Arc::new(vec![(G, G + M), (G + 2 * M, G + 2 * M + 4096)]);
        let used2 = alloc(&[(0, M), (2 * M, 2 * M + 8192), (G, G + M), (G + 2 * M, G + 2 * M + 8192)]);
        let wrong = p.refresh(class2.clone(), used2.clone());
        assert_eq!(wrong, vec![(G + 2 * M, G + 2 * M + 8192)], "the admission that was partly wrong");
        let o = p.outcome();
        assert_eq!(
            (o.class_in_time_bytes, o.other_admitted_bytes, o.other_kept_out_bytes, o.class_missed_bytes),
            (4096, 4096, 8192, 0)
        );
        for _ in 0..AGE_MAX {
            assert!(p.refresh(class2.clone(), used2.clone()).is_empty());
        }
        assert_eq!(p.outcome().unresolved_bytes, 4096, "never named");
        assert!(p.guesses.is_empty());
        let before = p.outcome();
        p.refresh(class2, used2);
        assert_eq!(p.outcome(), before, "each byte counted once");
    }

    #[test]
    fn overlap_counts_the_bytes_inside() {
        let r = [(10, 20), (30, 40)];
        assert_eq!(
            (overlap(&r, 0, 100), overlap(&r, 15, 35), overlap(&r, 20, 30), overlap(&r, 39, 41)),
            (20, 10, 0, 1)
        );
    }
}

//! I/O classes of an in-place volume: which requests the cache takes, and
//! how much of the log each kind may hold (Open CAS's I/O classification).
//!
//! A class is a rule — a byte range of the volume, request size bounds, a
//! direction — and an allocation share: the fraction of the log's blocks
//! its cached blocks may hold (0: never cached; 1: no limit). The first
//! class whose rule matches a request is its class; a request no class
//! matches is class 0, "unclassified", with no limit. A write of a class at
//! share 0 goes home past the log (and drops cached copies); one whose class
//! is at its share goes home too, counted as that class's spill; a read of
//! a class at share 0 is not promoted. Every cached block carries its class
//! (`Chunk::class`), so each class's occupancy is exact; the counters are
//! per class (`ClassStats`).
//!
//! A directory class matches the byte ranges of a directory's files, read
//! from the ext4 metadata on the volume (`crate::ext4`) and replaced at
//! every refresh (`Engine::set_class_extents`). A file's data is written
//! before the metadata that says whose it is, so its first writes are
//! cached unclassified; each refresh re-classifies the unclassified cached
//! blocks the class now covers (lazily, before they are cleaned or
//! evicted), and counts them (`ClassStats::reclassified_bytes`): how much
//! of the class's data was recognised late.
//!
//! Given the file system's blocks in use as well (`Allocation`), a
//! directory class judges a write to a block no file is known to hold yet
//! by where the allocator puts the class's files (`predict`), so that its
//! data is taken in and others' kept out at write time, and scores each
//! guess once the metadata names the blocks (`ClassStats::prediction`). A
//! cached block guessed to be the class's that turns out another's leaves
//! the class at that refresh (`Engine::set_class_layout`).

use super::home_flight::Ahead;
use super::predict::{Allocation, Outcome, Predictor};
use super::{CleanStep, Engine, EngineError, Inner, Serialize, VolumeError, BS};

/// Which direction a class's rule takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClassDirection {
    Read,
    Write,
}

/// One I/O class of an in-place volume (module doc).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct IoClass {
    pub name: String,
    /// Requests starting in [start, end) bytes of the volume (all if None).
    pub range: Option<(u64, u64)>,
    /// Requests of at least / at most these many bytes.
    pub size_min: u64,
    pub size_max: u64,
    /// Requests of this direction only (both if None).
    pub direction: Option<ClassDirection>,
    /// Share of the log's blocks the class may hold, in [0, 1].
    pub share: f64,
    /// Pinned: the class's cached blocks are kept when their chunk is
    /// reclaimed, read or not — moved forward in the log dirty when the log
    /// has room to spare (`Engine::relog_pinned`), else written home and
    /// kept clean (`Engine::to_retain`) — up to the share of a chunk a
    /// reclaim may keep.
    pub pinned: bool,
    /// Among the blocks a reclaim could keep, those of higher priority go
    /// first (pinned ones before any).
    pub priority: u8,
    /// Requests starting in one of these byte ranges (sorted, disjoint) of
    /// the volume: a directory class's files, found by `crate::ext4` and
    /// refreshed as the file system changes (`Engine::set_class_extents`).
    #[serde(skip)]
    pub extents: Option<std::sync::Arc<Vec<(u64, u64)>>>,
    /// A directory class given the file system's blocks in use judges a
    /// write to a block no file is known to hold yet by where the
    /// allocator puts the class's files (`predict`); false: such a write
    /// is not the class's.
    pub predict: bool,
    /// Unclassified dirty cached blocks that the file system's metadata
    /// names another's (in use, not the class's) are written home
    /// promptly (`Engine::clean_others`), so that a reclaim finds them
    /// clean.
    pub clean_others: bool,
}

impl IoClass {
    /// A class that matches every request, with this share.
    pub fn new(name: &str, share: f64) -> IoClass {
        IoClass {
            name: name.into(),
            range: None,
            size_min: 0,
            size_max: u64::MAX,
            direction: None,
            share,
            pinned: false,
            priority: 0,
            extents: None,
            predict: false,
            clean_others: false,
        }
    }

    fn matches(&self, offset: u64, len: u64, dir: ClassDirection) -> bool {
        self.rule_matches(offset, len, dir) && self.in_extents(offset)
    }

    /// Whether a request matches the class's rule but its extents: size,
    /// direction and range.
    fn rule_matches(&self, offset: u64, len: u64, dir: ClassDirection) -> bool {
        (self.size_min..=self.size_max).contains(&len)
            && self.direction.is_none_or(|d| d == dir)
            && self.range.is_none_or(|(a, b)| (a..b).contains(&offset))
    }

    /// Whether the byte at `offset` is in the class's extents (all if it has
    /// none).
    fn in_extents(&self, offset: u64) -> bool {
        self.extents.as_ref().is_none_or(|e| super::predict::contains(e, offset))
    }

    /// Whether the byte at `offset` is in the class's range and extents
    /// (what lazy re-classification asks of a block already cached).
    fn covers(&self, offset: u64) -> bool {
        self.range.is_none_or(|(a, b)| (a..b).contains(&offset)) && self.in_extents(offset)
    }
}

/// What one class did (bytes), and what it holds.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct ClassStats {
    pub class: String,
    /// Bytes of the class current in the log.
    pub cached_bytes: u64,
    pub write_bytes: u64,
    pub read_bytes: u64,
    /// Writes sent past the log because the class is never cached.
    pub bypass_bytes: u64,
    /// Writes sent past the log because the class held its share.
    pub spill_bytes: u64,
    /// Writes of the class sent past the log by the sequential cutoff.
    pub cutoff_bytes: u64,
    /// Cached blocks found to be the class's only after they were written
    /// (a directory class learns a new file's blocks from metadata the file
    /// system commits after the data), and re-classified then. Of the
    /// class's cached writes, `write_bytes` − bypass − spill were
    /// recognised in time and these late.
    pub reclassified_bytes: u64,
    /// How writes were judged at write time against what the metadata
    /// later said, for a class given the file system's blocks in use
    /// (`Engine::set_class_layout`; zero otherwise).
    #[serde(flatten)]
    pub prediction: Outcome,
}

/// Whether `classes` can be a volume's (`Engine::set_io_classes`): at most
/// `CLASSES_MAX`, each with a share in [0, 1].
pub fn check_io_classes(classes: &[IoClass]) -> Result<(), EngineError> {
    if classes.len() > CLASSES_MAX || classes.iter().any(|c| !(0.0..=1.0).contains(&c.share)) {
        return Err(EngineError::Config("at most 32 I/O classes, each with a share in [0, 1]"));
    }
    Ok(())
}

/// Most classes a volume has (class ids fit a byte with "unclassified").
pub const CLASSES_MAX: usize = 32;

/// A volume's classes and their counters (`VolCache::classes`).
#[derive(Clone, Debug, Default)]
pub(super) struct Classes {
    list: Vec<IoClass>,
    /// Per class id (0: unclassified, then `list`): counters and blocks held.
    stats: Vec<ClassStats>,
    blocks: Vec<u64>,
    /// Per class of `list`: its write-time predictor, once it has been
    /// given the file system's blocks in use.
    predictors: Vec<Option<Predictor>>,
}

/// What the classes say about a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Admit {
    /// Cache it as class `id` (subject to the mode).
    Class(u8),
    /// The class is never cached.
    Bypass,
    /// The class holds its share.
    Spill,
}

impl Classes {
    pub(super) fn set(&mut self, list: Vec<IoClass>) {
        let mut blocks = std::mem::take(&mut self.blocks);
        blocks.resize(list.len() + 1, 0);
        // Blocks cached under a class that is gone stay counted as
        // unclassified until they leave the log.
        let gone: u64 = blocks.drain(list.len() + 1..).sum();
        blocks[0] += gone;
        self.stats = std::iter::once("unclassified".to_string())
            .chain(list.iter().map(|c| c.name.clone()))
            .map(|class| ClassStats { class, ..ClassStats::default() })
            .collect();
        self.blocks = blocks;
        self.predictors = vec![None; list.len()];
        self.list = list;
    }

    fn ensure(&mut self) {
        if self.stats.is_empty() {
            self.set(Vec::new());
        }
    }

    /// Occupancy counted again from the log: `held` blocks, all
    /// unclassified (`Inner::recount_classes`).
    pub(super) fn reset_counts(&mut self, held: u64) {
        self.ensure();
        self.blocks.iter_mut().for_each(|b| *b = 0);
        self.blocks[0] = held;
    }

    /// The class id of a request.
    pub(super) fn class_of(&self, offset: u64, len: u64, dir: ClassDirection) -> u8 {
        (self.list.iter().position(|c| c.matches(offset, len, dir))).map_or(0, |i| i as u8 + 1)
    }

    /// The class id of a write: as `class_of`, with a class that has a
    /// predictor judging blocks no file is known to hold yet (`predict`).
    fn class_of_write(&mut self, offset: u64, len: u64) -> u8 {
        for (i, c) in self.list.iter().enumerate() {
            let hit = c.rule_matches(offset, len, ClassDirection::Write)
                && match self.predictors.get_mut(i).and_then(|p| p.as_mut()).filter(|_| c.predict) {
                    Some(p) => p.judge(offset, len),
                    None => c.in_extents(offset),
                };
            if hit {
                return i as u8 + 1;
            }
        }
        0
    }

    /// Whether a write of `blocks` at `offset` may be cached, given the
    /// log's size in blocks; counts it.
    pub(super) fn admit_write(&mut self, offset: u64, blocks: u64, log_blocks: u64) -> Admit {
        self.ensure();
        let id = self.class_of_write(offset, blocks * BS);
        self.stats[id as usize].write_bytes += blocks * BS;
        if id == 0 {
            return Admit::Class(0);
        }
        let share = self.list[id as usize - 1].share;
        if share <= 0.0 {
            self.stats[id as usize].bypass_bytes += blocks * BS;
            Admit::Bypass
        } else if share < 1.0 && (self.blocks[id as usize] + blocks) as f64 > share * log_blocks as f64 {
            self.stats[id as usize].spill_bytes += blocks * BS;
            Admit::Spill
        } else {
            Admit::Class(id)
        }
    }

    /// A write of class `id` went past the log by the sequential cutoff.
    pub(super) fn cut_off(&mut self, id: u8, bytes: u64) {
        self.ensure();
        self.stats[id as usize].cutoff_bytes += bytes;
    }

    /// Whether a read at `offset` may be promoted; counts it.
    pub(super) fn admit_read(&mut self, offset: u64, len: u64) -> bool {
        self.ensure();
        let id = self.class_of(offset, len, ClassDirection::Read) as usize;
        self.stats[id].read_bytes += len;
        id == 0 || self.list[id - 1].share > 0.0
    }

    /// A block of class `id` entered (+1) or left (-1) the log.
    pub(super) fn count(&mut self, id: u8, entered: bool) {
        self.ensure();
        let last = self.blocks.len() - 1;
        let b = &mut self.blocks[(id as usize).min(last)];
        if entered {
            *b += 1;
        } else {
            *b -= 1;
        }
    }

    /// The volume's blocks in the log whose class is pinned: what reclaims
    /// keep at every pass of the log's head (`Inner::move_budget`).
    pub(super) fn pinned_blocks(&self) -> u64 {
        self.blocks.iter().enumerate().filter(|&(id, _)| self.rank(id as u8).0).map(|(_, &n)| n).sum()
    }

    /// The retention rank of a block of class `id`: (pinned, priority).
    pub(super) fn rank(&self, id: u8) -> (bool, u8) {
        match (id as usize).checked_sub(1).and_then(|i| self.list.get(i)) {
            Some(c) => (c.pinned, c.priority),
            None => (false, 0),
        }
    }

    pub(super) fn report(&self) -> Vec<ClassStats> {
        let mut out = self.stats.clone();
        if out.is_empty() {
            out.push(ClassStats { class: "unclassified".into(), ..ClassStats::default() });
        }
        for (s, &b) in out.iter_mut().zip(&self.blocks) {
            s.cached_bytes = b * BS;
        }
        for (s, p) in out.iter_mut().skip(1).zip(&self.predictors) {
            s.prediction = p.as_ref().map(|p| p.outcome()).unwrap_or_default();
        }
        out
    }
}

impl Inner {
    /// Count every volume's cached blocks as unclassified (after an open,
    /// which keeps no classes).
    pub(super) fn recount_classes(&mut self) {
        if !self.in_place() {
            return;
        }
        let (mut held, mut dirty) = (vec![0u64; self.vols.len()], vec![0u64; self.vols.len()]);
        for (cb, v, _) in self.log.current() {
            held[v as usize] += 1;
            dirty[v as usize] += !self.residency.is_clean(cb) as u64;
        }
        for ((vol, n), d) in self.vols.iter_mut().zip(held).zip(dirty) {
            vol.cache.recounted(n, d);
        }
    }

    /// Every in-place volume's class occupancy matches its cached blocks
    /// (`check_invariants`).
    pub(super) fn check_classes(&self) {
        if !self.in_place() {
            return;
        }
        let mut held: Vec<Vec<u64>> =
            self.vols.iter().map(|v| vec![0; v.cache.classes().blocks.len().max(1)]).collect();
        let mut dirty = vec![0u64; self.vols.len()];
        for (cb, v, _) in self.log.current() {
            held[v as usize][self.residency.class(cb) as usize] += 1;
            dirty[v as usize] += !self.residency.is_clean(cb) as u64;
        }
        for ((v, h), d) in self.vols.iter().zip(held).zip(dirty) {
            // Counted since the engine was assembled (`recount_classes`).
            if !v.cache.classes().blocks.is_empty() {
                assert_eq!(v.cache.classes().blocks, h, "volume {} class occupancy", v.name);
                assert_eq!(v.cache.dirty_blocks(), d, "volume {} dirty blocks", v.name);
            }
        }
    }

    /// Lazy re-classification: the unclassified cached blocks of volume `v`
    /// that class `id` covers now (its extents just changed) become the
    /// class's, counted as re-classified. Walks the class's extents or the
    /// log, whichever is smaller.
    pub(super) fn reclassify(&mut self, v: usize, id: u8) -> Result<(), VolumeError> {
        let cls = self.vols[v].cache.classes();
        let Some(class) = cls.list.get(id as usize - 1) else { return Ok(()) };
        let bpc = self.blocks_per_chunk();
        let log_blocks = self.log.chunk_count() as u64 * bpc;
        let vol_blocks = self.vols[v].l2p.len() as u64;
        let mut found = Vec::new();
        let ext = class.extents.clone();
        let ext_blocks = ext.as_ref().map(|e| e.iter().map(|&(a, b)| b.div_ceil(BS) - a / BS).sum::<u64>());
        match ext {
            Some(e) if ext_blocks.is_some_and(|n| n <= log_blocks) => {
                for &(a, b) in e.iter() {
                    for lba in a / BS..b.div_ceil(BS).min(vol_blocks) {
                        if let Some(cb) = self.vols[v].l2p.get(lba as usize)?.cache_block() {
                            if self.residency.class(cb) == 0 && class.covers(lba * BS) {
                                found.push(cb);
                            }
                        }
                    }
                }
            }
            _ => {
                for (cb, vol, lba) in self.log.current() {
                    if vol == v as u32 && self.residency.class(cb) == 0 && class.covers(lba * BS) {
                        found.push(cb);
                    }
                }
            }
        }
        for &cb in &found {
            self.set_class(cb, id);
        }
        let cls = self.vols[v].cache.classes_mut();
        cls.ensure();
        cls.stats[id as usize].reclassified_bytes += found.len() as u64 * BS;
        Ok(())
    }

    /// The cached blocks of volume `v` in byte ranges `wrong` that class
    /// `id` holds by a wrong guess take the class their request would have
    /// now (by what is known, not guessed).
    fn declassify(&mut self, v: usize, id: u8, wrong: &[(u64, u64)]) -> Result<(), VolumeError> {
        let vol_blocks = self.vols[v].l2p.len() as u64;
        let mut moved = Vec::new();
        for &(a, b) in wrong {
            for lba in a / BS..b.div_ceil(BS).min(vol_blocks) {
                if let Some(cb) = self.vols[v].l2p.get(lba as usize)?.cache_block() {
                    if self.residency.class(cb) == id {
                        let now = self.vols[v].cache.classes().class_of(lba * BS, BS, ClassDirection::Write);
                        moved.push((cb, now));
                    }
                }
            }
        }
        for (cb, now) in moved {
            self.set_class(cb, now);
        }
        Ok(())
    }

    /// Cache block `cb` (just logged, current) now belongs to class `id`.
    pub(super) fn set_class(&mut self, cb: u64, id: u8) {
        let (ch, i) = self.log.chunk_of(cb);
        let (v, _) = ch.owner(i);
        assert_ne!(v, u32::MAX, "only a current block has a class");
        let old = self.residency.set_class(cb, id);
        let classes = self.vols[v as usize].cache.classes_mut();
        classes.count(old, false);
        classes.count(id, true);
    }
}

impl Engine {
    /// Replace the byte ranges a class of in-place volume `volume` matches
    /// (a directory class's files, as they are now), keeping its counters
    /// and the classes of blocks already cached.
    pub fn set_class_extents(&self, volume: &str, class: &str, extents: Vec<(u64, u64)>) -> Result<(), EngineError> {
        self.set_class_layout(volume, class, extents, None)
    }

    /// `set_class_extents`, and with `alloc` (the file system's blocks in
    /// use and its groups) the class predicts the class of writes to
    /// blocks no file is known to hold yet (module doc, `predict`). The
    /// guesses this refresh shows wrong leave the class: cached blocks
    /// guessed the class's that another file holds take the class their
    /// request would have now.
    pub fn set_class_layout(
        &self,
        volume: &str,
        class: &str,
        extents: Vec<(u64, u64)>,
        alloc: Option<Allocation>,
    ) -> Result<(), EngineError> {
        if alloc.as_ref().is_some_and(|a| a.group_bytes == 0 || a.allocated.windows(2).any(|w| w[0].1 > w[1].0)) {
            return Err(EngineError::Config("an allocation has groups of some bytes and sorted, disjoint ranges"));
        }
        let mut inner = self.lock();
        let v = inner.vols.iter().position(|v| v.name == volume).ok_or_else(|| EngineError::NoVolume(volume.into()))?;
        let cls = inner.vols[v].cache.classes_mut();
        cls.ensure();
        let i = (cls.list.iter().position(|c| c.name == class))
            .ok_or(EngineError::Config("no I/O class of that name on the volume"))?;
        let extents = std::sync::Arc::new(extents);
        cls.list[i].extents = Some(extents.clone());
        let wrong = match (alloc, &mut cls.predictors[i]) {
            (Some(a), Some(p)) => p.refresh(extents, a),
            (Some(a), slot) => {
                *slot = Some(Predictor::new(extents, a));
                Vec::new()
            }
            (None, slot) => {
                *slot = None;
                Vec::new()
            }
        };
        inner.declassify(v, i as u8 + 1, &wrong).map_err(EngineError::Request)?;
        inner.reclassify(v, i as u8 + 1).map_err(EngineError::Request)
    }

    /// Change the share of the log one I/O class of in-place volume `volume`
    /// may hold, keeping its rules, counters and the blocks it holds (an
    /// operator's `sluice cache set-class`). A class over its new share
    /// spills its next writes until it is back under it. Returns the share
    /// it had.
    pub fn set_class_share(&self, volume: &str, class: &str, share: f64) -> Result<f64, EngineError> {
        if !(0.0..=1.0).contains(&share) {
            return Err(EngineError::Config("a class's share is in [0, 1]"));
        }
        let mut inner = self.lock();
        if !inner.in_place() {
            return Err(EngineError::Config("I/O classes apply to an in-place engine (layout = in-place)"));
        }
        let v = inner.vols.iter().position(|v| v.name == volume).ok_or_else(|| EngineError::NoVolume(volume.into()))?;
        let list = &mut inner.vols[v].cache.classes_mut().list;
        let c = (list.iter_mut().find(|c| c.name == class))
            .ok_or(EngineError::Config("no I/O class of that name on the volume"))?;
        Ok(std::mem::replace(&mut c.share, share))
    }

    /// Write home at most `blocks_max` unclassified dirty cached blocks of
    /// in-place volume `volume` that the file system's metadata, as a
    /// class with `clean_others` last read it, names another's than the
    /// class's: the lowest LBAs first, each chunk's in one read, homes in
    /// runs (as cleaning does). A directory refresher calls it until it
    /// cleans nothing, so that the cache holds the class's data dirty and
    /// others' clean, which a reclaim drops without a disk write.
    pub fn clean_others(&self, volume: &str, blocks_max: u64) -> Result<CleanStep, EngineError> {
        let v = {
            let inner = self.lock();
            if !inner.in_place() {
                return Err(EngineError::Config("I/O classes apply to an in-place engine (layout = in-place)"));
            }
            inner.vols.iter().position(|v| v.name == volume).ok_or_else(|| EngineError::NoVolume(volume.into()))?
        };
        // The disk writes without the engine lock when a device-queue
        // permit leaves room for them (home_flight.rs).
        let permit = self.unlocked_read_permit();
        let ahead = self
            .change(|e, inner| {
                let cls = inner.vols[v].cache.classes();
                let judges: Vec<&Predictor> = (cls.list.iter().zip(&cls.predictors))
                    .filter(|(c, _)| c.clean_others)
                    .filter_map(|(_, p)| p.as_ref())
                    .collect();
                let mut todo: Vec<(u32, u64, u64)> = Vec::new();
                if !judges.is_empty() {
                    for (cb, vol, lba) in inner.log.current() {
                        if vol == v as u32
                            && !inner.residency.is_clean(cb)
                            && inner.residency.class(cb) == 0
                            && judges.iter().any(|p| p.known_other(lba * BS))
                        {
                            todo.push((vol, lba, cb));
                        }
                    }
                }
                todo.sort_unstable_by_key(|t| t.1);
                todo.truncate(blocks_max.max(1) as usize);
                todo.sort_unstable_by_key(|t| t.2);
                Ok((e.clean_ahead(inner, &todo, permit.is_some())?, inner.dirty_blocks().0))
            })
            .map_err(EngineError::Request)?;
        let (n, dirty) = match ahead {
            (Ahead::Done(n), dirty) => (n, dirty),
            (Ahead::Unlocked(job, step), _) => {
                let (r, inner) = self.complete_unlocked(job, step, permit);
                (r.map_err(EngineError::Request)?, inner.dirty_blocks().0)
            }
        };
        Ok(CleanStep { cleaned_bytes: n * BS, dirty_bytes: dirty * BS })
    }

    /// The I/O classes of in-place volume `name`, as set.
    pub fn io_classes(&self, name: &str) -> Result<Vec<IoClass>, EngineError> {
        let inner = self.lock();
        let v = inner.vols.iter().position(|v| v.name == name).ok_or_else(|| EngineError::NoVolume(name.into()))?;
        Ok(inner.vols[v].cache.classes().list.clone())
    }

    /// Set the I/O classes of in-place volume `name` (at most `CLASSES_MAX`;
    /// shares in [0, 1]); their counters start afresh.
    pub fn set_io_classes(&self, name: &str, classes: Vec<IoClass>) -> Result<(), EngineError> {
        check_io_classes(&classes)?;
        let mut inner = self.lock();
        if !inner.in_place() {
            return Err(EngineError::Config("I/O classes apply to an in-place engine (layout = in-place)"));
        }
        let v = inner.vols.iter().position(|v| v.name == name).ok_or_else(|| EngineError::NoVolume(name.into()))?;
        // Blocks cached under the old classes count as unclassified now.
        let blocks: Vec<u64> = inner.log.current().filter(|&(_, vol, _)| vol == v as u32).map(|(cb, ..)| cb).collect();
        for cb in blocks {
            inner.residency.set_class(cb, 0);
        }
        let held: u64 = inner.vols[v].cache.classes().blocks.iter().sum();
        let cls = inner.vols[v].cache.classes_mut();
        cls.set(classes);
        cls.blocks.iter_mut().for_each(|b| *b = 0);
        cls.blocks[0] = held;
        Ok(())
    }
}

//! The seeded scheduler of `SimOptions::concurrent` (`sluice sim
//! --concurrent`): writes and trims staged on the engine's concurrent path
//! (`StagedWrite`) and advanced one step at a time, in an order drawn from
//! the seed, with the model told what each step made possible.
//!
//! Owns the staged tasks and their bookkeeping: which blocks (and
//! versions) each reserved record carries, so that a publish or a crash
//! says which versions a block may read as. Invariant: a version is in a
//! block's `unpublished` list exactly while the record carrying it is
//! reserved and not published (until the crash that follows, for a write
//! that failed). Split from crashsim.rs, which drives the rest (operations,
//! crashes, reopens, checks).

use super::*;

/// Most staged writes under way at once (`SimOptions::concurrent`).
pub(super) const TASKS_MAX: usize = 4;

/// A staged write the scheduler advances (`SimOptions::concurrent`).
pub(super) struct Task {
    pub(super) vol: usize,
    pub(super) staged: crate::StagedWrite,
    /// The batch's blocks in order, (LBA, version): records take them
    /// front to back as they are reserved.
    blocks: Vec<(u64, u64)>,
    reserved: usize,
    /// Each reserved record's blocks (record number → range of `blocks`).
    records: std::collections::HashMap<usize, std::ops::Range<usize>>,
}

impl Sim {
    /// Stage a write of fresh versions (`SimOptions::concurrent`).
    pub(super) fn stage(&mut self, op: usize, v: usize, writes: Vec<(u64, u64)>, fua: bool) -> Result<bool, String> {
        let mut data = Vec::with_capacity(writes.len());
        let mut blocks = Vec::new();
        for &(lba, len) in &writes {
            let (d, versions) = new_versions(&mut self.version, v, lba, len);
            blocks.extend(versions.iter().enumerate().map(|(i, &ver)| (lba + i as u64, ver)));
            data.push((lba * BS as u64, d));
        }
        let batch: Vec<(u64, &[u8])> = data.iter().map(|(at, d)| (*at, &d[..])).collect();
        let staged = match self.world.volumes[v].stage_write(&batch, fua) {
            Ok(Some(s)) => s,
            Ok(None) => return Err(self.fail(op, "stage_write: not staged".into())),
            Err(e) => return Err(self.fail(op, format!("stage_write: {e}"))),
        };
        let records = Default::default();
        self.report.staged_writes += 1;
        self.tasks.push(Task { vol: v, staged, blocks, reserved: 0, records });
        Ok(true)
    }

    /// Stage a trim (`SimOptions::concurrent`, with bands): its blocks
    /// take version 0 (zeros) part by part as its records are reserved.
    pub(super) fn stage_trim(&mut self, op: usize, v: usize, lba: u64, len: u64) -> Result<bool, String> {
        let staged = match self.world.volumes[v].stage_trim(lba * BS as u64, len * BS as u64) {
            Ok(Some(s)) => s,
            Ok(None) => return Err(self.fail(op, "stage_trim: not staged".into())),
            Err(e) => return Err(self.fail(op, format!("stage_trim: {e}"))),
        };
        self.report.staged_trims += 1;
        let (blocks, records) = (Vec::new(), Default::default());
        self.tasks.push(Task { vol: v, staged, blocks, reserved: 0, records });
        Ok(true)
    }

    /// One step of one staged write, both drawn from the seed. A write's
    /// flush waits until no record of any write is in flight (it takes
    /// the drained lock). Ok(false) on an injected device error, as `run`.
    pub(super) fn step_task(&mut self, op: usize) -> Result<bool, String> {
        let choices: Vec<(usize, crate::WriteStep)> = (self.tasks.iter().enumerate())
            .flat_map(|(i, t)| t.staged.steps().into_iter().map(move |s| (i, s)))
            .collect();
        if choices.is_empty() {
            return Err(self.fail(op, "staged writes under way, none can take a step".into()));
        }
        let (i, s) = choices[self.rng.below(choices.len() as u64) as usize];
        let r = self.tasks[i].staged.step(s);
        if std::env::var("SIMTRACE").is_ok() {
            eprintln!("op {op} task {i} vol {} {s:?} -> {r:?} blocks {:?}", self.tasks[i].vol, self.tasks[i].blocks);
        }
        self.report.steps += 1;
        self.report.busy_steps += usize::from(r == Ok(crate::Stepped::Busy));
        let t = &mut self.tasks[i];
        let v = t.vol;
        match r {
            Ok(crate::Stepped::Reserved { record, blocks }) => {
                let range = t.reserved..t.reserved + blocks;
                t.reserved += blocks;
                for &(lba, ver) in &t.blocks[range.clone()] {
                    let m = &mut self.model[v][lba as usize];
                    m.put(ver);
                    m.unpublished.push(ver);
                }
                t.records.insert(record, range);
            }
            // A trim's part: its blocks read as zeros from now on, and
            // until its record (if any) is published may still read as
            // before.
            Ok(crate::Stepped::TrimReserved { record, first, end }) => {
                for lba in first..end {
                    self.model[v][lba as usize].put(0);
                }
                // The blocks the record unmaps (those the map held) may
                // read as before until it is published; the rest were
                // unmapped already.
                if let Some(record) = record {
                    let lbas = t.staged.trim_record_lbas(record).to_vec();
                    let range = t.blocks.len()..t.blocks.len() + lbas.len();
                    for &lba in &lbas {
                        self.model[v][lba as usize].unpublished.push(0);
                        t.blocks.push((lba, 0));
                    }
                    t.records.insert(record, range);
                }
            }
            Ok(crate::Stepped::Published { record }) => {
                for &(lba, ver) in &t.blocks[t.records[&record].clone()] {
                    // (One of a trim's zeros: others may be unpublished.)
                    let u = &mut self.model[v][lba as usize].unpublished;
                    if let Some(i) = u.iter().position(|&x| x == ver) {
                        u.remove(i);
                    }
                }
            }
            // A flush round done since every record of the write was
            // published: as a FLUSH.
            Ok(crate::Stepped::Flushed) => self.model.iter_mut().flatten().for_each(BlockModel::make_durable),
            Ok(crate::Stepped::Busy | crate::Stepped::Written { .. }) => {}
            // The write is over; its unpublished versions stay possible
            // (until the crash that follows).
            Err(e) => {
                self.tasks.swap_remove(i);
                return self.outcome(op, Err(e));
            }
        }
        if self.tasks[i].staged.steps().is_empty() {
            self.tasks.swap_remove(i);
        }
        Ok(true)
    }

    /// Take steps until no staged write is left (in an order drawn from the
    /// seed). Ok(false) if one failed with an injected device error.
    pub(super) fn settle(&mut self, op: usize) -> Result<bool, String> {
        let mut steps = 0;
        while !self.tasks.is_empty() {
            if !self.step_task(op)? {
                return Ok(false);
            }
            steps += 1;
            if steps > 100_000 {
                return Err(self.fail(op, "staged writes never finish".into()));
            }
        }
        Ok(true)
    }

    /// Power is about to go: staged writes end where they are (settled
    /// first before a clean shutdown, which drains them).
    /// Returns whether the shutdown may go on (not if a write failed on
    /// the way, or at-rest damage may fail one: then power just goes).
    pub(super) fn end_tasks(&mut self, op: usize, shutdown: bool) -> Result<bool, String> {
        self.report.crashes_in_flight += usize::from(self.tasks.iter().any(|t| t.staged.in_flight()));
        let shutdown = shutdown && (self.tasks.is_empty() || (!self.latent_flip && self.settle(op)?));
        self.tasks.clear();
        self.model.iter_mut().flatten().for_each(|m| m.unpublished.clear());
        Ok(shutdown)
    }
}

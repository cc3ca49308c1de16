//! ZNS SSD emulation (WD Ultrastar DC ZN540-like): the NVMe Zoned Namespace
//! command set's zone rules, plus per-die timing.
//!
//! What it owns:
//! - **Zone state machine** (NVMe ZNS 1.1; QEMU hw/nvme and NVMeVirt as
//!   executable references). States Empty, Implicitly/Explicitly Open, Closed,
//!   Full, Read-Only, Offline; active = open + closed, bounded by `max_open` and
//!   `max_active`. Writes start at the write pointer and end within the zone
//!   capacity; writing an Empty or Closed zone opens it implicitly; at the open
//!   limit the oldest implicitly open zone is closed to make room (QEMU's
//!   auto-transition; the spec lets the controller close implicitly opened zones
//!   only); a write pointer reaching the capacity makes the zone Full. Zone
//!   append writes at the write pointer and returns the byte offset written.
//!   Open / Close / Finish / Reset follow the spec's transitions; every other
//!   transition is `InvalidStateTransition`. Reset discards the zone's data on
//!   the backend and counts one erase.
//! - **Checks before changes.** Every request is validated completely before any
//!   state changes, in QEMU's order (append fields, zone state, write pointer,
//!   boundary, resources), so a rejected request changes nothing.
//! - **Where the sources leave room** we chose: closing an open zone whose write
//!   pointer is still at its start returns it to Empty (the spec's rule for an
//!   explicitly opened, unwritten zone, as null_blk does; QEMU leaves it Closed);
//!   Open of an explicitly open zone, Close of a closed one, Finish of a full one
//!   and Reset of an empty one succeed and change nothing (QEMU, NVMeVirt); an
//!   explicit Open may also auto-close an implicitly open zone (QEMU); a read
//!   spanning zones needs RAZB (`read_across_zones`, off as in QEMU's default);
//!   a Full zone reports its write pointer as start + size (Linux's convention).
//! - **Timing.** NVMeVirt's ZN540 model: 8 channels × 4 dies of TLC; a zone is
//!   striped over all 32 dies in 96 KiB one-shot program units — unit `u` of
//!   zone `z` lives on die `(z + u) mod 32`, die `d` on channel `d mod 8` (so
//!   consecutive units use different channels, and zones written together start
//!   on different dies). A write crosses PCIe into a per-zone write buffer and
//!   completes there (the drive has power-loss protection); each unit, once
//!   full, crosses its channel and programs its die (561 µs). The buffer holds
//!   `zone_write_buffer_bytes`; a write that would overflow it waits for the
//!   oldest programs to finish — that is how NAND back-pressure reaches the
//!   host. Finish programs a partly filled last unit (padding). Reads of
//!   programmed data pay firmware + page read on the die (behind any program:
//!   no program suspend is modelled) + channel + PCIe, per 32 KiB page; data
//!   still in the buffer costs firmware + PCIe; data beyond the write pointer is
//!   zeros and touches no NAND. Erase is not timed (the drive erases lazily,
//!   NVMeVirt's ZN540 erase latency is 0) but a reset waits for the zone's
//!   pending programs. Dies, channels and PCIe are booked as busy intervals
//!   with backfill (`Bookings`), not `emulate::Timelines`: a unit waiting for
//!   its zone's buffer is booked in the future, and a single free-at time would
//!   make every other zone queue behind it.
//!
//! Invariants (asserted where they change; `check_invariants` recounts them):
//! `open_count` / `active_count` equal the number of
//! zones in open / open-or-closed states and never exceed the limits;
//! `implicit_open` lists exactly the implicitly open zones, oldest first;
//! `written_bytes ≤ capacity`; an open or closed zone has `written_bytes <
//! capacity`. The backend must read zeros at construction (a fresh
//! `MemoryDevice` or a null device): with resets discarding, bytes at or beyond
//! a zone's write pointer then always read as zeros.
//!
//! Media counters: internal WAF is 1 — `media_program_bytes` grows by the bytes
//! written (padding at Finish is not counted), `media_read_bytes` by the bytes of
//! written data read (reads beyond the write pointer touch no media).
//!
//! Sources: NVMe ZNS Command Set 1.1; QEMU hw/nvme/ctrl.c (nvme_check_zone_write,
//! nvme_zrm_*, auto-transition); NVMeVirt ssd_config.h `WD_ZN540` (8 ch × 4 LUN,
//! 32 KiB page, 96 KiB one-shot, program 561 µs, read 50 µs (4 KiB) / 58 µs,
//! channel 450 MB/s, PCIe 3050 MB/s, firmware read 20/13 µs, write-buffer
//! firmware 5.6 µs + 0.6 µs per 4 KiB, zone write buffer 10 one-shot pages); WD
//! ZN540 geometry: zone size 2 GiB, capacity 1077 MiB, 14 open = 14 active.

use crate::clock::ClockRef;
use crate::device::{
    BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoOp, IoRequest, ZoneAction, ZoneDesc, ZoneError, ZoneLimits,
    ZoneState,
};
use crate::emulate::{transfer_ns, BackendAction, Bookings, Emulated, MediaModel, Service};
use serde::Serialize;
use std::collections::VecDeque;

const KIB: u64 = 1024;
const MIB: u64 = 1024 * KIB;
const GIB: u64 = 1024 * MIB;

/// Zones of `ZnsProfile::zn540()`: 3542 × 1077 MiB ≈ 4.0 TB writable (a 4 TB
/// ZN540; the drive's exact zone count is not in our sources).
pub const ZN540_ZONE_COUNT: u64 = 3542;

/// Geometry, limits and timing of a ZNS SSD. Times in ns, rates in bytes/s.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ZnsProfile {
    pub name: String,
    /// Distance between zone starts (a power of two on real drives; not required here).
    pub zone_size_bytes: u64,
    /// Writable bytes of each zone (≤ size); [start + capacity, start + size) reads zeros, never writable.
    pub zone_capacity_bytes: u64,
    pub zone_count: u64,
    /// 0 = no limit.
    pub max_open: u32,
    /// 0 = no limit.
    pub max_active: u32,
    /// ZASL in bytes.
    pub zone_append_max_bytes: u64,
    pub block_bytes: u64,
    /// RAZB (Read Across Zone Boundaries, optional in the spec). When false a read
    /// spanning two zones fails with `BoundaryError` (QEMU's default).
    pub read_across_zones: bool,
    pub queue_depth_max: usize,
    pub channels: u32,
    pub dies_per_channel: u32,
    /// NAND page: the read granularity.
    pub flash_page_bytes: u64,
    /// One-shot program unit (TLC: three pages on one word line), the striping unit.
    pub program_unit_bytes: u64,
    pub program_ns: u64,
    /// Die time of a page read of at most one block.
    pub read_block_ns: u64,
    /// Die time of a full page read.
    pub read_page_ns: u64,
    pub channel_bytes_per_s: u64,
    pub pcie_bytes_per_s: u64,
    /// Firmware time of a read of one block / of a larger read.
    pub fw_read_block_ns: u64,
    pub fw_read_ns: u64,
    /// Firmware time to take a write into the buffer: fixed + per block.
    pub fw_write_ns: u64,
    pub fw_write_per_block_ns: u64,
    /// Per-zone write buffer; at least one program unit.
    pub zone_write_buffer_bytes: u64,
    /// Firmware time of a zone management command.
    pub zone_mgmt_ns: u64,
}

impl ZnsProfile {
    /// A 4 TB WD ZN540: `ZN540_ZONE_COUNT` zones of 2 GiB with 1077 MiB capacity.
    /// Its address space is 7.4 TB: use a null backend.
    pub fn zn540() -> ZnsProfile {
        Self::zn540_scaled(ZN540_ZONE_COUNT)
    }

    /// ZN540 geometry and timing with `zone_count` zones (same zone size and capacity).
    pub fn zn540_scaled(zone_count: u64) -> ZnsProfile {
        ZnsProfile {
            name: "zns-zn540".to_string(),
            zone_size_bytes: 2 * GIB,
            zone_capacity_bytes: 1077 * MIB,
            zone_count,
            max_open: 14,
            max_active: 14,
            zone_append_max_bytes: 128 * KIB,
            block_bytes: 4096,
            read_across_zones: false,
            queue_depth_max: 1024,
            channels: 8,
            dies_per_channel: 4,
            flash_page_bytes: 32 * KIB,
            program_unit_bytes: 96 * KIB,
            program_ns: 561_000,
            read_block_ns: 50_000,
            read_page_ns: 58_000,
            channel_bytes_per_s: 450_000_000,
            pcie_bytes_per_s: 3_050_000_000,
            fw_read_block_ns: 20_000,
            fw_read_ns: 13_000,
            fw_write_ns: 5_600,
            fw_write_per_block_ns: 600,
            zone_write_buffer_bytes: 10 * 96 * KIB,
            zone_mgmt_ns: 10_000,
        }
    }

    /// ZN540 timing and limits with zones `shrink`× smaller (size and
    /// capacity alike, capacity rounded down to 4 KiB): for scaled-down
    /// experiments, which need as many zones per volume as the full drive
    /// has, not zones as large.
    pub fn zn540_small_zones(zone_count: u64, shrink: u64) -> ZnsProfile {
        let mut p = Self::zn540_scaled(zone_count);
        p.zone_size_bytes /= shrink;
        p.zone_capacity_bytes = p.zone_capacity_bytes / shrink / 4096 * 4096;
        p
    }

    /// A small device for rule tests: 8 zones of 64 KiB (48 KiB capacity), 3 open,
    /// 4 active, 16 KiB append limit, 16 KiB program units on 2 × 2 dies.
    pub fn tiny() -> ZnsProfile {
        ZnsProfile {
            name: "zns-tiny".to_string(),
            zone_size_bytes: 64 * KIB,
            zone_capacity_bytes: 48 * KIB,
            zone_count: 8,
            max_open: 3,
            max_active: 4,
            zone_append_max_bytes: 16 * KIB,
            channels: 2,
            dies_per_channel: 2,
            flash_page_bytes: 8 * KIB,
            program_unit_bytes: 16 * KIB,
            zone_write_buffer_bytes: 32 * KIB,
            ..Self::zn540_scaled(8)
        }
    }

    /// Address space: zone count × zone size.
    pub fn capacity_bytes(&self) -> u64 {
        self.zone_count * self.zone_size_bytes
    }

    fn dies(&self) -> u64 {
        self.channels as u64 * self.dies_per_channel as u64
    }

    fn validate(&self) {
        let bs = self.block_bytes;
        assert!(bs > 0 && bs.is_power_of_two(), "block size must be a power of two");
        assert!(self.zone_count > 0 && self.zone_count <= u32::MAX as u64, "zone count out of range");
        assert!(
            self.zone_size_bytes.is_multiple_of(bs) && self.zone_capacity_bytes.is_multiple_of(bs),
            "zone geometry not in blocks"
        );
        assert!(
            self.zone_capacity_bytes > 0 && self.zone_capacity_bytes <= self.zone_size_bytes,
            "zone capacity must be in (0, size]"
        );
        assert!(self.zone_append_max_bytes >= bs && self.zone_append_max_bytes.is_multiple_of(bs), "bad append limit");
        assert!(self.max_active == 0 || self.max_open <= self.max_active, "open limit above active limit");
        assert!(self.dies() > 0, "no dies");
        assert!(
            self.flash_page_bytes.is_multiple_of(bs) && self.program_unit_bytes.is_multiple_of(self.flash_page_bytes)
        );
        assert!(self.zone_write_buffer_bytes >= self.program_unit_bytes, "buffer below one program unit");
        assert!(self.channel_bytes_per_s > 0 && self.pcie_bytes_per_s > 0 && self.queue_depth_max > 0);
    }
}

/// One zone's condition. Zone-relative byte counts.
#[derive(Clone, Debug)]
struct Zone {
    state: ZoneState,
    /// Write pointer − zone start: bytes written since the last reset.
    written_bytes: u64,
    /// Program units handed to NAND (full units, plus a padded last one after Finish).
    units_programmed: u64,
    /// The last programs handed to NAND (at most one buffer's worth): (unit, end ns), in unit order.
    programs: VecDeque<(u64, u64)>,
    /// Latest end among older programs, dropped from `programs`.
    programs_floor_ns: u64,
}

impl Zone {
    fn empty() -> Zone {
        Zone {
            state: ZoneState::Empty,
            written_bytes: 0,
            units_programmed: 0,
            programs: VecDeque::new(),
            programs_floor_ns: 0,
        }
    }

    fn is_open(&self) -> bool {
        matches!(self.state, ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen)
    }

    fn is_active(&self) -> bool {
        self.is_open() || self.state == ZoneState::Closed
    }

    /// When every program of this zone handed to NAND so far is done.
    fn programs_done_ns(&self) -> u64 {
        self.programs.iter().map(|&(_, end)| end).fold(self.programs_floor_ns, u64::max)
    }

    /// When unit `unit` can enter a buffer of `buffer_units` units: once every unit
    /// at least `buffer_units` older is programmed and has left the buffer.
    fn buffer_slot_free_ns(&self, unit: u64, buffer_units: u64) -> u64 {
        let Some(limit) = unit.checked_sub(buffer_units) else { return 0 };
        debug_assert!(self.programs.front().is_none_or(|&(u, _)| u <= limit + 1), "needed program already dropped");
        self.programs.iter().filter(|&&(u, _)| u <= limit).map(|&(_, end)| end).fold(self.programs_floor_ns, u64::max)
    }
}

/// Resources a transition into an open state takes, decided before anything changes.
#[derive(Clone, Copy, Debug, Default)]
struct OpenPlan {
    takes_active: bool,
    takes_open: bool,
    /// Implicitly open zone to close first, to free an open slot.
    victim: Option<usize>,
}

/// The ZNS rules and costs; wrap it with `zns_device`.
#[derive(Clone)]
pub struct ZnsModel {
    profile: ZnsProfile,
    zones: Vec<Zone>,
    open_count: u32,
    active_count: u32,
    /// Implicitly open zones, oldest first: the front is the auto-close victim.
    implicit_open: VecDeque<usize>,
    dies: Vec<Bookings>,
    channels: Vec<Bookings>,
    pcie: Bookings,
    /// Latest completion of an accepted write (flush waits for it).
    last_write_done_ns: u64,
}

impl ZnsModel {
    pub fn new(profile: ZnsProfile) -> ZnsModel {
        profile.validate();
        ZnsModel {
            zones: (0..profile.zone_count).map(|_| Zone::empty()).collect(),
            open_count: 0,
            active_count: 0,
            implicit_open: VecDeque::new(),
            dies: vec![Bookings::default(); profile.dies() as usize],
            channels: vec![Bookings::default(); profile.channels as usize],
            pcie: Bookings::default(),
            last_write_done_ns: 0,
            profile,
        }
    }

    pub fn profile(&self) -> &ZnsProfile {
        &self.profile
    }

    /// The `DeviceInfo` of a device built on this model.
    pub fn device_info(&self) -> DeviceInfo {
        let p = &self.profile;
        DeviceInfo {
            name: p.name.clone(),
            capacity_bytes: p.capacity_bytes(),
            block_bytes: p.block_bytes,
            queue_depth_max: p.queue_depth_max,
            optimal_write_bytes: p.block_bytes,
            zoned: true,
        }
    }

    pub fn open_zones(&self) -> u32 {
        self.open_count
    }

    pub fn active_zones(&self) -> u32 {
        self.active_count
    }

    /// The descriptor of zone `zone_idx`.
    pub fn zone(&self, zone_idx: u64) -> ZoneDesc {
        let z = &self.zones[zone_idx as usize];
        let start = zone_idx * self.profile.zone_size_bytes;
        // Linux (nvme zns.c) reports a Full zone's write pointer as start + size: it is not valid there.
        let write_pointer = match z.state {
            ZoneState::Full => start + self.profile.zone_size_bytes,
            _ => start + z.written_bytes,
        };
        ZoneDesc {
            start,
            size_bytes: self.profile.zone_size_bytes,
            capacity_bytes: self.profile.zone_capacity_bytes,
            write_pointer,
            state: z.state,
        }
    }

    /// Fault injection: the medium turns zone `zone_idx` Read-Only or Offline (the
    /// drive does this on its own, no command does). The zone stops being active.
    pub fn set_zone_condition(&mut self, zone_idx: u64, state: ZoneState) {
        assert!(matches!(state, ZoneState::ReadOnly | ZoneState::Offline), "only the medium's own conditions");
        let zi = zone_idx as usize;
        self.release(zi);
        self.zones[zi].state = state;
    }

    /// Power loss and restart: every open zone is closed (Empty if nothing
    /// was written to it), as a drive reports its zones after a power cycle;
    /// write pointers and Full, Empty, Read-Only and Offline zones stay.
    /// What the zones hold is the backend's business (a crash simulation
    /// pairs this with the backend's durable image).
    pub fn power_cycle(&mut self) {
        for zi in 0..self.zones.len() {
            if self.zones[zi].is_open() {
                self.close(zi);
            }
        }
        debug_assert_eq!(self.open_count, 0);
    }

    /// Check every counting invariant (O(zones); tests call it after each step).
    pub fn check_invariants(&self) {
        let open = self.zones.iter().filter(|z| z.is_open()).count() as u32;
        let active = self.zones.iter().filter(|z| z.is_active()).count() as u32;
        assert_eq!(open, self.open_count, "open count drifted");
        assert_eq!(active, self.active_count, "active count drifted");
        let p = &self.profile;
        assert!(p.max_open == 0 || open <= p.max_open, "open limit exceeded");
        assert!(p.max_active == 0 || active <= p.max_active, "active limit exceeded");
        let implicit: Vec<usize> =
            (0..self.zones.len()).filter(|&i| self.zones[i].state == ZoneState::ImplicitlyOpen).collect();
        let mut listed: Vec<usize> = self.implicit_open.iter().copied().collect();
        listed.sort_unstable();
        assert_eq!(implicit, listed, "implicit-open list drifted");
        for z in &self.zones {
            assert!(z.written_bytes <= p.zone_capacity_bytes, "write pointer beyond capacity");
            if z.is_active() {
                assert!(z.written_bytes < p.zone_capacity_bytes, "an active zone is full");
            }
            if z.state == ZoneState::Empty {
                assert_eq!(z.written_bytes, 0, "empty zone with data");
            }
        }
    }

    fn zone_index(&self, offset: u64) -> usize {
        let zi = (offset / self.profile.zone_size_bytes) as usize;
        assert!(zi < self.zones.len(), "offset beyond the zones (range checks run first)");
        zi
    }

    fn zone_start(&self, zi: usize) -> u64 {
        zi as u64 * self.profile.zone_size_bytes
    }

    /// Resources for moving zone `zi` (Empty, Closed or open) into an open state.
    fn plan_open(&self, zi: usize) -> Result<OpenPlan, ZoneError> {
        let p = &self.profile;
        let (takes_active, takes_open) = match self.zones[zi].state {
            ZoneState::Empty => (true, true),
            ZoneState::Closed => (false, true),
            ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen => (false, false),
            s => unreachable!("plan_open from {s:?}: callers reject it first"),
        };
        if takes_active && p.max_active != 0 && self.active_count >= p.max_active {
            return Err(ZoneError::TooManyActive);
        }
        let mut victim = None;
        if takes_open && p.max_open != 0 && self.open_count >= p.max_open {
            // Closing an implicitly open zone keeps it active, so it frees an open slot only.
            victim = Some(*self.implicit_open.front().ok_or(ZoneError::TooManyOpen)?);
        }
        Ok(OpenPlan { takes_active, takes_open, victim })
    }

    /// Carry out a checked plan: zone `zi` ends in `target` (an open state), or stays
    /// in its open state when a write finds it already open.
    fn apply_open(&mut self, zi: usize, plan: OpenPlan, target: ZoneState) {
        if let Some(v) = plan.victim {
            assert_eq!(self.zones[v].state, ZoneState::ImplicitlyOpen, "auto-close victim not implicitly open");
            self.close(v);
        }
        if plan.takes_active {
            self.active_count += 1;
        }
        if plan.takes_open {
            self.open_count += 1;
        }
        let from = self.zones[zi].state;
        let to = match (from, target) {
            (ZoneState::ExplicitlyOpen, _) => ZoneState::ExplicitlyOpen,
            (ZoneState::ImplicitlyOpen, ZoneState::ImplicitlyOpen) => ZoneState::ImplicitlyOpen,
            (_, t) => t,
        };
        if from == ZoneState::ImplicitlyOpen && to != ZoneState::ImplicitlyOpen {
            self.forget_implicit(zi);
        }
        if from != ZoneState::ImplicitlyOpen && to == ZoneState::ImplicitlyOpen {
            self.implicit_open.push_back(zi);
        }
        self.zones[zi].state = to;
        let p = &self.profile;
        assert!(p.max_open == 0 || self.open_count <= p.max_open, "open limit exceeded");
        assert!(p.max_active == 0 || self.active_count <= p.max_active, "active limit exceeded");
    }

    fn forget_implicit(&mut self, zi: usize) {
        let pos = self.implicit_open.iter().position(|&z| z == zi).expect("implicitly open zone is listed");
        self.implicit_open.remove(pos);
    }

    /// Give back the open / active slots zone `zi` holds.
    fn release(&mut self, zi: usize) {
        let z = &self.zones[zi];
        if z.is_open() {
            self.open_count = self.open_count.checked_sub(1).expect("open count underflow");
        }
        if z.is_active() {
            self.active_count = self.active_count.checked_sub(1).expect("active count underflow");
        }
        if z.state == ZoneState::ImplicitlyOpen {
            self.forget_implicit(zi);
        }
    }

    /// Close an open zone: Closed, or Empty when nothing was written (the spec's
    /// rule for an explicitly opened zone whose write pointer is at its start).
    fn close(&mut self, zi: usize) {
        assert!(self.zones[zi].is_open(), "close of a zone that is not open");
        self.release(zi);
        if self.zones[zi].written_bytes == 0 {
            self.zones[zi].state = ZoneState::Empty;
        } else {
            self.zones[zi].state = ZoneState::Closed;
            self.active_count += 1;
        }
    }

    fn make_full(&mut self, zi: usize) {
        self.release(zi);
        self.zones[zi].state = ZoneState::Full;
    }

    fn reset_zone(&mut self, zi: usize) {
        self.release(zi);
        self.zones[zi] = Zone::empty();
    }

    /// Die and channel of program unit `unit` of zone `zi`: the zone's units stripe
    /// over all dies from die `zi mod dies`; die `d` hangs on channel `d mod channels`.
    fn die_of(p: &ZnsProfile, zi: usize, unit: u64) -> (usize, usize) {
        let die = (zi as u64 + unit) % p.dies();
        (die as usize, (die % p.channels as u64) as usize)
    }

    /// Hand program unit `unit` of zone `zi` to NAND once its data is buffered at `ready_ns`.
    fn program_unit(&mut self, zi: usize, unit: u64, ready_ns: u64) {
        let p = &self.profile;
        let (die, ch) = Self::die_of(p, zi, unit);
        let xfer_ns = transfer_ns(p.program_unit_bytes, p.channel_bytes_per_s);
        let program_ns = p.program_ns;
        let xfer_end = self.channels[ch].book(ready_ns, xfer_ns);
        let end = self.dies[die].book(xfer_end, program_ns);
        let buffer_units = p.zone_write_buffer_bytes / p.program_unit_bytes;
        let z = &mut self.zones[zi];
        assert_eq!(z.units_programmed, unit, "units are programmed in order");
        z.units_programmed = unit + 1;
        z.programs.push_back((unit, end));
        while z.programs.len() as u64 > buffer_units {
            let (_, old_end) = z.programs.pop_front().expect("non-empty");
            z.programs_floor_ns = z.programs_floor_ns.max(old_end);
        }
    }

    /// Time a write of `len` bytes at zone-relative `at` of zone `zi` (already accepted).
    ///
    /// The data crosses PCIe at once; each program unit enters the zone buffer when
    /// both its data has arrived and a buffer slot is free, and is programmed once
    /// full. The write completes when its last unit is in the buffer.
    fn time_write(&mut self, zi: usize, at: u64, len: u64, now_ns: u64) -> u64 {
        let p = &self.profile;
        let unit = p.program_unit_bytes;
        let buffer_units = p.zone_write_buffer_bytes / unit;
        let fw_ns = p.fw_write_ns + p.fw_write_per_block_ns * (len / p.block_bytes);
        let data_in_ns = self.pcie.book(now_ns, transfer_ns(len, p.pcie_bytes_per_s));
        let end = at + len;
        for u in self.zones[zi].units_programmed..end / unit {
            let ready_ns = data_in_ns.max(self.zones[zi].buffer_slot_free_ns(u, buffer_units));
            self.program_unit(zi, u, ready_ns);
        }
        let last_unit = (end - 1) / unit;
        data_in_ns.max(self.zones[zi].buffer_slot_free_ns(last_unit, buffer_units)) + fw_ns
    }

    /// Time a read (already accepted); returns (completion, bytes of written data read).
    fn time_read(&mut self, offset: u64, len: u64, now_ns: u64) -> (u64, u64) {
        let p = &self.profile;
        let ready_ns = now_ns + if len <= p.block_bytes { p.fw_read_block_ns } else { p.fw_read_ns };
        let mut done_ns = ready_ns;
        let mut stored_bytes = 0;
        let (mut pos, end) = (offset, offset + len);
        while pos < end {
            let zi = (pos / p.zone_size_bytes) as usize;
            let zone_start = zi as u64 * p.zone_size_bytes;
            let in_zone = pos - zone_start;
            let z = &self.zones[zi];
            let written = z.written_bytes;
            let on_nand = (z.units_programmed * p.program_unit_bytes).min(written);
            let piece_end = if in_zone >= written {
                end.min(zone_start + p.zone_size_bytes)
            } else if in_zone >= on_nand {
                end.min(zone_start + written)
            } else {
                let page_end = (in_zone / p.flash_page_bytes + 1) * p.flash_page_bytes;
                end.min(zone_start + page_end.min(on_nand))
            };
            let n = piece_end - pos;
            let pcie_ns = transfer_ns(n, p.pcie_bytes_per_s);
            if in_zone < on_nand {
                let (die, ch) = Self::die_of(p, zi, in_zone / p.program_unit_bytes);
                let nand_ns = if n <= p.block_bytes { p.read_block_ns } else { p.read_page_ns };
                let read_end = self.dies[die].book(ready_ns, nand_ns);
                let xfer_end = self.channels[ch].book(read_end, transfer_ns(n, p.channel_bytes_per_s));
                done_ns = done_ns.max(self.pcie.book(xfer_end, pcie_ns));
            } else {
                done_ns = done_ns.max(self.pcie.book(ready_ns, pcie_ns));
            }
            if in_zone < written {
                stored_bytes += n;
            }
            pos = piece_end;
        }
        (done_ns, stored_bytes)
    }

    fn read(&mut self, req: &IoRequest, now_ns: u64, media: &mut DeviceStats) -> Result<Service, DeviceError> {
        let first = self.zone_index(req.offset);
        let last = self.zone_index(req.offset + req.len - 1);
        if self.zones[first].state == ZoneState::Offline {
            return Err(ZoneError::ZoneIsOffline.into());
        }
        if last != first && !self.profile.read_across_zones {
            return Err(ZoneError::BoundaryError.into());
        }
        if self.zones[first..=last].iter().any(|z| z.state == ZoneState::Offline) {
            return Err(ZoneError::ZoneIsOffline.into());
        }
        let (done_ns, stored_bytes) = self.time_read(req.offset, req.len, now_ns);
        media.media_read_bytes += stored_bytes;
        Ok(Service { done_ns, value: None, backend: BackendAction::Forward })
    }

    /// Write or zone append. On success the request is a write at the write pointer.
    fn write(
        &mut self,
        req: &mut IoRequest,
        now_ns: u64,
        media: &mut DeviceStats,
        append: bool,
    ) -> Result<Service, DeviceError> {
        let p = &self.profile;
        let zi = self.zone_index(req.offset);
        let zone_start = self.zone_start(zi);
        if append {
            // ZNS: the append's ZSLBA must be the zone's lowest LBA (QEMU: Invalid Field).
            if req.offset != zone_start {
                return Err(ZoneError::NotZoneStart.into());
            }
            if req.len > p.zone_append_max_bytes {
                return Err(ZoneError::AppendTooLarge.into());
            }
        }
        let z = &self.zones[zi];
        match z.state {
            ZoneState::Full => return Err(ZoneError::ZoneIsFull.into()),
            ZoneState::ReadOnly => return Err(ZoneError::ZoneIsReadOnly.into()),
            ZoneState::Offline => return Err(ZoneError::ZoneIsOffline.into()),
            _ => {}
        }
        let wp = zone_start + z.written_bytes;
        let offset = if append { wp } else { req.offset };
        if offset != wp {
            return Err(ZoneError::InvalidWrite.into());
        }
        if z.written_bytes + req.len > p.zone_capacity_bytes {
            return Err(ZoneError::BoundaryError.into());
        }
        let plan = self.plan_open(zi)?;
        // Accepted: from here on, state changes.
        self.apply_open(zi, plan, ZoneState::ImplicitlyOpen);
        let at = self.zones[zi].written_bytes;
        let done_ns = self.time_write(zi, at, req.len, now_ns);
        self.zones[zi].written_bytes += req.len;
        if self.zones[zi].written_bytes == self.profile.zone_capacity_bytes {
            self.make_full(zi);
        }
        self.last_write_done_ns = self.last_write_done_ns.max(done_ns);
        media.media_program_bytes += req.len;
        req.offset = offset;
        req.op = IoOp::Write;
        Ok(Service { done_ns, value: append.then_some(offset), backend: BackendAction::Forward })
    }

    fn manage(
        &mut self,
        action: ZoneAction,
        offset: u64,
        now_ns: u64,
        media: &mut DeviceStats,
    ) -> Result<Service, DeviceError> {
        if !offset.is_multiple_of(self.profile.zone_size_bytes) {
            return Err(ZoneError::NotZoneStart.into());
        }
        let zi = self.zone_index(offset);
        let mut done_ns = now_ns + self.profile.zone_mgmt_ns;
        let mut backend = BackendAction::Nothing;
        use ZoneState::*;
        match (action, self.zones[zi].state) {
            (ZoneAction::Open, Empty | Closed | ImplicitlyOpen) => {
                let plan = self.plan_open(zi)?;
                self.apply_open(zi, plan, ExplicitlyOpen);
            }
            (ZoneAction::Open, ExplicitlyOpen) | (ZoneAction::Close, Closed) | (ZoneAction::Finish, Full) => {}
            (ZoneAction::Reset, Empty) => {}
            (ZoneAction::Close, ImplicitlyOpen | ExplicitlyOpen) => self.close(zi),
            (ZoneAction::Finish, Empty | ImplicitlyOpen | ExplicitlyOpen | Closed) => {
                // Program the partly filled last unit (padded), then the zone is Full.
                let z = &self.zones[zi];
                let p = &self.profile;
                if z.written_bytes > z.units_programmed * p.program_unit_bytes {
                    let unit = z.units_programmed;
                    let ready_ns =
                        now_ns.max(z.buffer_slot_free_ns(unit, p.zone_write_buffer_bytes / p.program_unit_bytes));
                    self.program_unit(zi, unit, ready_ns);
                }
                self.make_full(zi);
            }
            (ZoneAction::Reset, ImplicitlyOpen | ExplicitlyOpen | Closed | Full) => {
                done_ns = done_ns.max(self.zones[zi].programs_done_ns());
                self.reset_zone(zi);
                media.erases += 1;
                backend = BackendAction::Discard { offset, len: self.profile.zone_size_bytes };
            }
            _ => return Err(ZoneError::InvalidStateTransition.into()),
        }
        Ok(Service { done_ns, value: None, backend })
    }
}

impl MediaModel for ZnsModel {
    fn service(&mut self, req: &mut IoRequest, now_ns: u64, media: &mut DeviceStats) -> Result<Service, DeviceError> {
        for b in self.dies.iter_mut().chain(self.channels.iter_mut()).chain(std::iter::once(&mut self.pcie)) {
            b.forget_before(now_ns);
        }
        match req.op {
            IoOp::Read => self.read(req, now_ns, media),
            IoOp::Write => self.write(req, now_ns, media, false),
            IoOp::ZoneAppend => self.write(req, now_ns, media, true),
            IoOp::Zone(action) => self.manage(action, req.offset, now_ns, media),
            // Writes complete into the power-loss-protected buffer, so a flush only
            // waits for the writes accepted before it.
            IoOp::Flush => Ok(Service {
                done_ns: now_ns.max(self.last_write_done_ns),
                value: None,
                backend: BackendAction::Forward,
            }),
            // Space in a zone is reclaimed only by Reset: a deallocate inside a
            // sequential zone frees nothing and would break "written data reads
            // back below the write pointer". Linux exposes no discard for ZNS
            // namespaces either, so accepting it would only mislead the caller.
            IoOp::Discard => Err(DeviceError::Unsupported(IoOp::Discard)),
        }
    }

    fn zone_limits(&self) -> Option<ZoneLimits> {
        let p = &self.profile;
        Some(ZoneLimits {
            zone_size_bytes: p.zone_size_bytes,
            zone_capacity_bytes: p.zone_capacity_bytes,
            zone_count: p.zone_count,
            max_open: p.max_open,
            max_active: p.max_active,
            zone_append_max_bytes: p.zone_append_max_bytes,
        })
    }

    fn report_zones(&self, from: u64, max: usize) -> Vec<ZoneDesc> {
        let first = from / self.profile.zone_size_bytes;
        (first..self.profile.zone_count).take(max).map(|zi| self.zone(zi)).collect()
    }
}

/// A ZNS SSD of `profile` over `backend` (which must read zeros and hold at least
/// `profile.capacity_bytes()`), timed by `clock`.
pub fn zns_device(profile: ZnsProfile, backend: Box<dyn BlockDevice>, clock: ClockRef) -> Emulated<ZnsModel> {
    let model = ZnsModel::new(profile);
    Emulated::new(model.device_info(), model, backend, clock)
}

#[cfg(test)]
#[path = "zns_tests.rs"]
mod tests;

//! Tests of `zns`, kept apart so the module itself stays readable.

use super::*;
use crate::buf::IoBuf;
use crate::clock::VirtualClock;
use crate::device::{read_at, sync_io, IoCompletion};
use crate::memory::MemoryDevice;
use crate::testutil::{run_queue, span_ns};

const BS: u64 = 4096;

fn tiny_with(model: ZnsModel) -> Emulated<ZnsModel> {
    let cap = model.profile().capacity_bytes();
    Emulated::new(model.device_info(), model, Box::new(MemoryDevice::new(cap, BS)), VirtualClock::new())
}

fn tiny() -> Emulated<ZnsModel> {
    tiny_with(ZnsModel::new(ZnsProfile::tiny()))
}

fn zstart(zi: u64) -> u64 {
    zi * ZnsProfile::tiny().zone_size_bytes
}

fn run(dev: &Emulated<ZnsModel>, req: IoRequest) -> Result<u64, DeviceError> {
    sync_io(dev, req).result
}

fn write(dev: &Emulated<ZnsModel>, offset: u64, blocks: u64, byte: u8) -> Result<u64, DeviceError> {
    run(dev, IoRequest::write(offset, IoBuf::from_slice(&vec![byte; (blocks * BS) as usize]), 0))
}

fn append(dev: &Emulated<ZnsModel>, zone_start: u64, blocks: u64, byte: u8) -> Result<u64, DeviceError> {
    run(dev, IoRequest::zone_append(zone_start, IoBuf::from_slice(&vec![byte; (blocks * BS) as usize]), 0))
}

fn mgmt(dev: &Emulated<ZnsModel>, action: ZoneAction, offset: u64) -> Result<u64, DeviceError> {
    run(dev, IoRequest::zone(action, offset, 0))
}

fn zerr(e: ZoneError) -> Result<u64, DeviceError> {
    Err(DeviceError::Zone(e))
}

fn zone(dev: &Emulated<ZnsModel>, zi: u64) -> ZoneDesc {
    dev.with_model(|m| m.zone(zi))
}

fn state(dev: &Emulated<ZnsModel>, zi: u64) -> ZoneState {
    zone(dev, zi).state
}

/// Zones, open and active counts, media program / read bytes, erases.
type Snapshot = (Vec<ZoneDesc>, u32, u32, u64, u64, u64);

/// Everything a rejected command must leave alone.
fn snapshot(dev: &Emulated<ZnsModel>) -> Snapshot {
    let s = dev.stats();
    let (zones, open, active) = dev.with_model(|m| (m.report_zones(0, usize::MAX), m.open_zones(), m.active_zones()));
    (zones, open, active, s.media_program_bytes, s.media_read_bytes, s.erases)
}

#[test]
fn writes_start_at_the_write_pointer() {
    let d = tiny();
    assert_eq!(write(&d, BS, 1, 1), zerr(ZoneError::InvalidWrite));
    assert_eq!(write(&d, 0, 2, 7), Ok(2 * BS));
    assert_eq!(zone(&d, 0).write_pointer, 2 * BS);
    assert_eq!(state(&d, 0), ZoneState::ImplicitlyOpen);
    assert_eq!(write(&d, 0, 1, 1), zerr(ZoneError::InvalidWrite), "rewriting below the write pointer");
    assert_eq!(write(&d, 3 * BS, 1, 1), zerr(ZoneError::InvalidWrite), "a gap above it");
    assert_eq!(write(&d, 2 * BS, 1, 8), Ok(BS));
    let got = read_at(&d, 0, 3 * BS as usize).unwrap();
    assert!(got[..2 * BS as usize].iter().all(|&b| b == 7) && got[2 * BS as usize..].iter().all(|&b| b == 8));
    let s = d.stats();
    assert_eq!((s.media_program_bytes, s.host_write_bytes, s.errors), (3 * BS, 3 * BS, 3));
    assert_eq!(s.device_waf(), 1.0);
}

#[test]
fn writes_end_within_the_zone_capacity() {
    let d = tiny();
    let cap_blocks = ZnsProfile::tiny().zone_capacity_bytes / BS;
    assert_eq!(write(&d, 0, cap_blocks + 1, 1), zerr(ZoneError::BoundaryError));
    assert_eq!(state(&d, 0), ZoneState::Empty, "a rejected write opens nothing");
    assert_eq!(write(&d, 0, cap_blocks - 1, 1), Ok((cap_blocks - 1) * BS));
    assert_eq!(write(&d, (cap_blocks - 1) * BS, 2, 1), zerr(ZoneError::BoundaryError));
    assert_eq!(write(&d, (cap_blocks - 1) * BS, 1, 1), Ok(BS));
    assert_eq!(state(&d, 0), ZoneState::Full, "reaching the capacity fills the zone");
    assert_eq!(zone(&d, 0).write_pointer, zstart(1), "a full zone reports start + size, as Linux does");
    assert_eq!(d.with_model(|m| (m.open_zones(), m.active_zones())), (0, 0), "full releases its slots");
    // Zone size == capacity: a write may still not run into the next zone.
    let p = ZnsProfile { zone_capacity_bytes: 64 * KIB, ..ZnsProfile::tiny() };
    let d = tiny_with(ZnsModel::new(p));
    write(&d, 0, 15, 1).unwrap();
    assert_eq!(write(&d, 15 * BS, 2, 1), zerr(ZoneError::BoundaryError));
    assert_eq!(state(&d, 1), ZoneState::Empty);
}

#[test]
fn full_read_only_and_offline_zones_reject_writes_with_their_status() {
    let mut m = ZnsModel::new(ZnsProfile::tiny());
    m.set_zone_condition(1, ZoneState::ReadOnly);
    m.set_zone_condition(2, ZoneState::Offline);
    let d = tiny_with(m);
    mgmt(&d, ZoneAction::Finish, 0).unwrap();
    assert_eq!(write(&d, 0, 1, 1), zerr(ZoneError::ZoneIsFull));
    assert_eq!(append(&d, 0, 1, 1), zerr(ZoneError::ZoneIsFull));
    assert_eq!(write(&d, zstart(1), 1, 1), zerr(ZoneError::ZoneIsReadOnly));
    assert_eq!(append(&d, zstart(1), 1, 1), zerr(ZoneError::ZoneIsReadOnly));
    assert_eq!(write(&d, zstart(2), 1, 1), zerr(ZoneError::ZoneIsOffline));
    // Reads: every state but Offline.
    assert!(read_at(&d, 0, BS as usize).is_ok());
    assert!(read_at(&d, zstart(1), BS as usize).is_ok());
    assert_eq!(read_at(&d, zstart(2), BS as usize).unwrap_err(), DeviceError::Zone(ZoneError::ZoneIsOffline));
    assert_eq!(d.stats().media_program_bytes, 0);
}

#[test]
fn implicit_open_auto_closes_the_oldest_implicitly_open_zone() {
    let d = tiny(); // 3 open, 4 active
    for zi in 0..3 {
        write(&d, zstart(zi), 1, 1).unwrap();
    }
    assert_eq!(d.with_model(|m| (m.open_zones(), m.active_zones())), (3, 3));
    // A fourth implicit open closes zone 0 (the oldest) to make room.
    write(&d, zstart(3), 1, 1).unwrap();
    assert_eq!(state(&d, 0), ZoneState::Closed);
    assert_eq!(state(&d, 3), ZoneState::ImplicitlyOpen);
    assert_eq!(d.with_model(|m| (m.open_zones(), m.active_zones())), (3, 4));
    // Active limit: a fifth zone cannot become active, and nothing was closed for it.
    let before = snapshot(&d);
    assert_eq!(write(&d, zstart(4), 1, 1), zerr(ZoneError::TooManyActive));
    assert_eq!(mgmt(&d, ZoneAction::Open, zstart(4)), zerr(ZoneError::TooManyActive));
    assert_eq!(snapshot(&d), before);
    // Writing the closed zone reopens it, closing the next oldest (zone 1).
    write(&d, zstart(0) + BS, 1, 1).unwrap();
    assert_eq!((state(&d, 0), state(&d, 1)), (ZoneState::ImplicitlyOpen, ZoneState::Closed));
    d.with_model(|m| m.check_invariants());
}

#[test]
fn explicitly_open_zones_are_never_auto_closed() {
    let d = tiny();
    for zi in 0..3 {
        mgmt(&d, ZoneAction::Open, zstart(zi)).unwrap();
    }
    mgmt(&d, ZoneAction::Finish, zstart(3)).unwrap(); // unrelated
    let before = snapshot(&d);
    assert_eq!(write(&d, zstart(4), 1, 1), zerr(ZoneError::TooManyOpen));
    assert_eq!(mgmt(&d, ZoneAction::Open, zstart(4)), zerr(ZoneError::TooManyOpen));
    assert_eq!(snapshot(&d), before);
    // Once one is closed (empty → Empty again) there is room.
    mgmt(&d, ZoneAction::Close, zstart(0)).unwrap();
    assert_eq!(state(&d, 0), ZoneState::Empty);
    write(&d, zstart(4), 1, 1).unwrap();
    // An explicit open may also auto-close an implicitly open zone.
    assert_eq!(d.with_model(|m| m.open_zones()), 3);
    mgmt(&d, ZoneAction::Open, zstart(5)).unwrap();
    assert_eq!((state(&d, 4), state(&d, 5)), (ZoneState::Closed, ZoneState::ExplicitlyOpen));
    d.with_model(|m| m.check_invariants());
}

#[test]
fn zone_append_lands_at_the_write_pointer_and_returns_its_offset() {
    let d = tiny();
    let z = zstart(2);
    assert_eq!(append(&d, z, 2, 1), Ok(z));
    assert_eq!(append(&d, z, 3, 2), Ok(z + 2 * BS));
    let c = sync_io(&d, IoRequest::zone_append(z, IoBuf::from_slice(&vec![3; BS as usize]), 0));
    assert_eq!(c.result, Ok(z + 5 * BS));
    // The completion names the op the caller submitted; its value is the offset written.
    assert_eq!(c.op, IoOp::ZoneAppend);
    assert_eq!(zone(&d, 2).write_pointer, z + 6 * BS);
    let got = read_at(&d, z, 6 * BS as usize).unwrap();
    let want: Vec<u8> = [1u8, 1, 2, 2, 2, 3].iter().flat_map(|&b| vec![b; BS as usize]).collect();
    assert_eq!(&got[..], &want[..]);
    let before = snapshot(&d);
    assert_eq!(append(&d, z + BS, 1, 1), zerr(ZoneError::NotZoneStart));
    assert_eq!(append(&d, z, 5, 1), zerr(ZoneError::AppendTooLarge), "16 KiB limit");
    append(&d, z, 4, 1).unwrap();
    assert_eq!(append(&d, z, 3, 1), zerr(ZoneError::BoundaryError), "two blocks of room left");
    assert_eq!(append(&d, z, 2, 1), Ok(z + 10 * BS));
    assert_eq!(state(&d, 2), ZoneState::Full);
    assert_eq!(append(&d, z, 1, 1), zerr(ZoneError::ZoneIsFull));
    assert_eq!(before.3 + 6 * BS, d.stats().media_program_bytes);
    assert_eq!(d.stats().host_write_bytes, 12 * BS);
}

/// Put zone 0 of a fresh tiny device in `s`.
fn device_with_zone0_in(s: ZoneState) -> Emulated<ZnsModel> {
    let mut m = ZnsModel::new(ZnsProfile::tiny());
    if matches!(s, ZoneState::ReadOnly | ZoneState::Offline) {
        m.set_zone_condition(0, s);
    }
    let d = tiny_with(m);
    match s {
        ZoneState::ImplicitlyOpen => write(&d, 0, 1, 1).map(drop).unwrap(),
        ZoneState::ExplicitlyOpen => {
            mgmt(&d, ZoneAction::Open, 0).unwrap();
            write(&d, 0, 1, 1).unwrap();
        }
        ZoneState::Closed => {
            write(&d, 0, 1, 1).unwrap();
            mgmt(&d, ZoneAction::Close, 0).unwrap();
        }
        ZoneState::Full => mgmt(&d, ZoneAction::Finish, 0).map(drop).unwrap(),
        _ => {}
    }
    assert_eq!(state(&d, 0), s);
    d
}

#[test]
fn zone_management_state_transition_table() {
    use ZoneAction::*;
    use ZoneState::*;
    let bad = Err(ZoneError::InvalidStateTransition);
    #[rustfmt::skip]
    let table: [(ZoneState, [Result<ZoneState, ZoneError>; 4]); 7] = [
        //               Open                 Close          Finish     Reset
        (Empty,          [Ok(ExplicitlyOpen), bad,           Ok(Full),  Ok(Empty)]),
        (ImplicitlyOpen, [Ok(ExplicitlyOpen), Ok(Closed),    Ok(Full),  Ok(Empty)]),
        (ExplicitlyOpen, [Ok(ExplicitlyOpen), Ok(Closed),    Ok(Full),  Ok(Empty)]),
        (Closed,         [Ok(ExplicitlyOpen), Ok(Closed),    Ok(Full),  Ok(Empty)]),
        (Full,           [bad,                bad,           Ok(Full),  Ok(Empty)]),
        (ReadOnly,       [bad,                bad,           bad,       bad]),
        (Offline,        [bad,                bad,           bad,       bad]),
    ];
    for (from, row) in table {
        for (action, want) in [Open, Close, Finish, Reset].into_iter().zip(row) {
            let d = device_with_zone0_in(from);
            let before = snapshot(&d);
            let got = mgmt(&d, action, 0);
            match want {
                Ok(to) => {
                    assert_eq!(got, Ok(0), "{from:?} {action:?}");
                    assert_eq!(state(&d, 0), to, "{from:?} {action:?}");
                }
                Err(e) => {
                    assert_eq!(got, zerr(e), "{from:?} {action:?}");
                    assert_eq!(snapshot(&d), before, "{from:?} {action:?} changed something");
                }
            }
            d.with_model(|m| m.check_invariants());
        }
    }
    // Closing an explicitly opened zone with nothing written returns it to Empty.
    let d = tiny();
    mgmt(&d, Open, 0).unwrap();
    mgmt(&d, Close, 0).unwrap();
    assert_eq!(state(&d, 0), Empty);
    assert_eq!(d.with_model(|m| m.active_zones()), 0);
    // Management needs a zone start.
    assert_eq!(mgmt(&d, Open, BS), zerr(ZoneError::NotZoneStart));
    assert_eq!(mgmt(&d, Reset, zstart(1) + BS), zerr(ZoneError::NotZoneStart));
}

#[test]
fn reset_discards_data_and_counts_one_erase() {
    let d = tiny();
    write(&d, 0, 3, 9).unwrap();
    mgmt(&d, ZoneAction::Reset, 0).unwrap();
    let z = zone(&d, 0);
    assert_eq!((z.state, z.write_pointer), (ZoneState::Empty, 0));
    assert!(read_at(&d, 0, 3 * BS as usize).unwrap().iter().all(|&b| b == 0));
    assert_eq!(d.stats().erases, 1);
    mgmt(&d, ZoneAction::Reset, 0).unwrap();
    assert_eq!(d.stats().erases, 1, "resetting an empty zone erases nothing");
    write(&d, 0, 1, 5).unwrap();
    assert_eq!(read_at(&d, 0, BS as usize).unwrap()[0], 5);
    mgmt(&d, ZoneAction::Finish, 0).unwrap();
    mgmt(&d, ZoneAction::Reset, 0).unwrap();
    assert_eq!(d.stats().erases, 2);
}

#[test]
fn reads_beyond_the_write_pointer_are_zeros_and_cost_no_media() {
    let d = tiny();
    write(&d, 0, 2, 0xAB).unwrap();
    let got = read_at(&d, 0, 16 * BS as usize).unwrap(); // the whole zone, past the capacity too
    assert!(got[..2 * BS as usize].iter().all(|&b| b == 0xAB));
    assert!(got[2 * BS as usize..].iter().all(|&b| b == 0));
    assert_eq!(d.stats().media_read_bytes, 2 * BS, "only written data comes from the media");
    mgmt(&d, ZoneAction::Finish, 0).unwrap();
    assert!(read_at(&d, 4 * BS, BS as usize).unwrap().iter().all(|&b| b == 0), "finish pads with zeros");
}

#[test]
fn reads_across_zones_need_razb() {
    let d = tiny();
    assert_eq!(read_at(&d, zstart(1) - BS, 2 * BS as usize).unwrap_err(), DeviceError::Zone(ZoneError::BoundaryError));
    let d = tiny_with(ZnsModel::new(ZnsProfile { read_across_zones: true, ..ZnsProfile::tiny() }));
    write(&d, zstart(1), 1, 4).unwrap();
    let got = read_at(&d, zstart(1) - BS, 2 * BS as usize).unwrap();
    assert!(got[..BS as usize].iter().all(|&b| b == 0) && got[BS as usize..].iter().all(|&b| b == 4));
    let mut m = ZnsModel::new(ZnsProfile { read_across_zones: true, ..ZnsProfile::tiny() });
    m.set_zone_condition(2, ZoneState::Offline);
    let d = tiny_with(m);
    assert_eq!(read_at(&d, zstart(2) - BS, 2 * BS as usize).unwrap_err(), DeviceError::Zone(ZoneError::ZoneIsOffline));
}

#[test]
fn discard_is_unsupported_and_flush_waits_for_writes() {
    let d = tiny();
    write(&d, 0, 1, 1).unwrap();
    assert_eq!(run(&d, IoRequest::discard(0, BS, 0)), Err(DeviceError::Unsupported(IoOp::Discard)));
    assert_eq!(zone(&d, 0).write_pointer, BS);
    let buf = IoBuf::from_slice(&vec![1; 8 * BS as usize]);
    d.submit(IoRequest::write(BS, buf, 1));
    d.submit(IoRequest::flush(2));
    let mut out: Vec<IoCompletion> = Vec::new();
    while out.len() < 2 {
        d.reap(1, &mut out);
    }
    assert_eq!(out.iter().map(|c| c.user_data).collect::<Vec<_>>(), vec![1, 2]);
    assert!(out[1].completed_ns >= out[0].completed_ns);
    assert!(out.iter().all(|c| c.result.is_ok()));
}

#[test]
fn reports_zones_and_limits() {
    let d = tiny();
    let zd = d.as_zoned().expect("zoned");
    let l = zd.zone_limits();
    assert_eq!((l.zone_size_bytes, l.zone_capacity_bytes, l.zone_count), (64 * KIB, 48 * KIB, 8));
    assert_eq!((l.max_open, l.max_active, l.zone_append_max_bytes), (3, 4, 16 * KIB));
    write(&d, zstart(1), 2, 1).unwrap();
    let r = zd.report_zones(zstart(1) + BS, 3);
    assert_eq!(r.len(), 3);
    assert_eq!(
        (r[0].start, r[0].write_pointer, r[0].state),
        (zstart(1), zstart(1) + 2 * BS, ZoneState::ImplicitlyOpen)
    );
    assert_eq!((r[1].start, r[1].state), (zstart(2), ZoneState::Empty));
    assert_eq!(zd.report_zones(zstart(7), 10).len(), 1);
    assert!(zd.report_zones(zstart(8), 10).is_empty());
    assert!(d.info().zoned);
    let full = ZnsProfile::zn540();
    assert_eq!(full.capacity_bytes(), ZN540_ZONE_COUNT * 2 * GIB);
    assert!((full.zone_count * full.zone_capacity_bytes) as f64 / 1e12 > 3.99);
}

// ---- randomized comparison against a plain reference state machine ----

struct Xorshift(u64);
impl Xorshift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The ZNS rules written as plainly as possible, blocks as units.
struct Reference {
    state: Vec<ZoneState>,
    wp: Vec<u64>,
    /// Implicitly opened zones in the order they opened.
    implicit: Vec<usize>,
    data: Vec<u8>,
    program_bytes: u64,
    read_bytes: u64,
    erases: u64,
}

const SIZE: u64 = 16;
const CAP: u64 = 12;
const MAX_OPEN: usize = 3;
const MAX_ACTIVE: usize = 4;
const APPEND_MAX: u64 = 4;

impl Reference {
    fn new(zones: usize) -> Reference {
        Reference {
            state: vec![ZoneState::Empty; zones],
            wp: vec![0; zones],
            implicit: Vec::new(),
            data: vec![0; zones * (SIZE * BS) as usize],
            program_bytes: 0,
            read_bytes: 0,
            erases: 0,
        }
    }
    fn is_open(&self, z: usize) -> bool {
        matches!(self.state[z], ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen)
    }
    fn open_count(&self) -> usize {
        (0..self.state.len()).filter(|&z| self.is_open(z)).count()
    }
    fn active_count(&self) -> usize {
        (0..self.state.len()).filter(|&z| self.is_open(z) || self.state[z] == ZoneState::Closed).count()
    }
    fn set(&mut self, z: usize, s: ZoneState) {
        self.implicit.retain(|&x| x != z);
        if s == ZoneState::ImplicitlyOpen {
            self.implicit.push(z);
        }
        self.state[z] = s;
    }
    fn close(&mut self, z: usize) {
        let s = if self.wp[z] == 0 { ZoneState::Empty } else { ZoneState::Closed };
        self.set(z, s);
    }
    /// Make zone `z` (Empty or Closed) open as `to`, or say why not.
    fn open(&mut self, z: usize, to: ZoneState) -> Result<(), ZoneError> {
        if self.state[z] == ZoneState::Empty && self.active_count() >= MAX_ACTIVE {
            return Err(ZoneError::TooManyActive);
        }
        if self.open_count() >= MAX_OPEN {
            let Some(&victim) = self.implicit.first() else { return Err(ZoneError::TooManyOpen) };
            self.close(victim);
        }
        self.set(z, to);
        Ok(())
    }
    fn write(&mut self, offset: u64, blocks: u64, byte: u8, append: bool) -> Result<u64, ZoneError> {
        let z = (offset / (SIZE * BS)) as usize;
        let start = z as u64 * SIZE * BS;
        if append && offset != start {
            return Err(ZoneError::NotZoneStart);
        }
        if append && blocks > APPEND_MAX {
            return Err(ZoneError::AppendTooLarge);
        }
        match self.state[z] {
            ZoneState::Full => return Err(ZoneError::ZoneIsFull),
            ZoneState::ReadOnly => return Err(ZoneError::ZoneIsReadOnly),
            ZoneState::Offline => return Err(ZoneError::ZoneIsOffline),
            _ => {}
        }
        let at = if append { start + self.wp[z] * BS } else { offset };
        if at != start + self.wp[z] * BS {
            return Err(ZoneError::InvalidWrite);
        }
        if self.wp[z] + blocks > CAP {
            return Err(ZoneError::BoundaryError);
        }
        if matches!(self.state[z], ZoneState::Empty | ZoneState::Closed) {
            self.open(z, ZoneState::ImplicitlyOpen)?;
        }
        self.data[at as usize..(at + blocks * BS) as usize].fill(byte);
        self.wp[z] += blocks;
        self.program_bytes += blocks * BS;
        if self.wp[z] == CAP {
            self.set(z, ZoneState::Full);
        }
        Ok(if append { at } else { blocks * BS })
    }
    fn manage(&mut self, action: ZoneAction, offset: u64) -> Result<u64, ZoneError> {
        if !offset.is_multiple_of(SIZE * BS) {
            return Err(ZoneError::NotZoneStart);
        }
        let z = (offset / (SIZE * BS)) as usize;
        let s = self.state[z];
        let bad = Err(ZoneError::InvalidStateTransition);
        match action {
            ZoneAction::Open => match s {
                ZoneState::Empty | ZoneState::Closed => self.open(z, ZoneState::ExplicitlyOpen)?,
                ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen => self.set(z, ZoneState::ExplicitlyOpen),
                _ => return bad,
            },
            ZoneAction::Close => match s {
                ZoneState::ImplicitlyOpen | ZoneState::ExplicitlyOpen => self.close(z),
                ZoneState::Closed => {}
                _ => return bad,
            },
            ZoneAction::Finish => match s {
                ZoneState::ReadOnly | ZoneState::Offline => return bad,
                _ => self.set(z, ZoneState::Full),
            },
            ZoneAction::Reset => match s {
                ZoneState::ReadOnly | ZoneState::Offline => return bad,
                ZoneState::Empty => {}
                _ => {
                    self.set(z, ZoneState::Empty);
                    self.wp[z] = 0;
                    self.erases += 1;
                    self.data[offset as usize..(offset + SIZE * BS) as usize].fill(0);
                }
            },
        }
        Ok(0)
    }
    fn read(&mut self, offset: u64, blocks: u64) -> Result<u64, ZoneError> {
        let first = offset / (SIZE * BS);
        let last = (offset + blocks * BS - 1) / (SIZE * BS);
        if self.state[first as usize] == ZoneState::Offline {
            return Err(ZoneError::ZoneIsOffline);
        }
        if first != last {
            return Err(ZoneError::BoundaryError);
        }
        let in_zone = offset / BS - first * SIZE;
        self.read_bytes += (self.wp[first as usize].min(in_zone + blocks).saturating_sub(in_zone)) * BS;
        Ok(blocks * BS)
    }
    fn desc(&self, z: usize) -> (ZoneState, u64) {
        let start = z as u64 * SIZE * BS;
        match self.state[z] {
            ZoneState::Full => (ZoneState::Full, start + SIZE * BS),
            s => (s, start + self.wp[z] * BS),
        }
    }
}

#[test]
fn randomized_commands_match_the_reference_state_machine() {
    for seed in [0x9E3779B97F4A7C15u64, 7, 12345, 0xDEADBEEF] {
        let mut rng = Xorshift(seed);
        let mut m = ZnsModel::new(ZnsProfile::tiny());
        m.set_zone_condition(6, ZoneState::ReadOnly);
        m.set_zone_condition(7, ZoneState::Offline);
        let d = tiny_with(m);
        let zones = 8usize;
        let mut r = Reference::new(zones);
        r.state[6] = ZoneState::ReadOnly;
        r.state[7] = ZoneState::Offline;
        let (mut accepted, mut rejected) = (0, 0);
        for step in 0..4000u64 {
            let z = rng.below(zones as u64);
            let start = z * SIZE * BS;
            let byte = (step % 251 + 1) as u8;
            let before = snapshot(&d);
            let (got, want) = match rng.below(13) {
                0..=2 => {
                    let wp = r.wp[z as usize];
                    let n = 1 + rng.below(5);
                    (write(&d, start + wp * BS, n, byte), r.write(start + wp * BS, n, byte, false))
                }
                3 => {
                    let at = start + rng.below(SIZE) * BS;
                    (write(&d, at, 1, byte), r.write(at, 1, byte, false))
                }
                4 if z + 1 < zones as u64 => {
                    let at = start + (SIZE - 1) * BS;
                    (write(&d, at, 2, byte), r.write(at, 2, byte, false))
                }
                5 | 4 => {
                    let n = 1 + rng.below(APPEND_MAX + 2);
                    let at = if rng.below(8) == 0 { start + BS } else { start };
                    (append(&d, at, n, byte), r.write(at, n, byte, true))
                }
                6..=9 => {
                    let action = [ZoneAction::Open, ZoneAction::Close, ZoneAction::Finish, ZoneAction::Reset]
                        [rng.below(4) as usize];
                    let at = if rng.below(10) == 0 { start + BS } else { start };
                    (mgmt(&d, action, at), r.manage(action, at))
                }
                10 | 11 => {
                    let at = start + rng.below(SIZE) * BS;
                    let n = (1 + rng.below(6)).min((zones as u64 * SIZE) - at / BS);
                    let c = sync_io(&d, IoRequest::read(at, (n * BS) as usize, 0));
                    let want = r.read(at, n);
                    if c.result.is_ok() {
                        assert_eq!(&c.buf[..], &r.data[at as usize..(at + n * BS) as usize], "seed {seed} step {step}");
                    }
                    (c.result, want)
                }
                _ => (run(&d, IoRequest::flush(0)), Ok(0)),
            };
            assert_eq!(got, want.map_err(DeviceError::Zone), "seed {seed} step {step}");
            if got.is_ok() {
                accepted += 1;
            } else {
                rejected += 1;
                assert_eq!(snapshot(&d), before, "seed {seed} step {step}: a rejected command changed state");
            }
            let zones_now = d.with_model(|m| {
                m.check_invariants();
                m.report_zones(0, zones)
            });
            for (i, zd) in zones_now.iter().enumerate() {
                assert_eq!((zd.state, zd.write_pointer), r.desc(i), "seed {seed} step {step} zone {i}");
            }
            let s = d.stats();
            assert_eq!(
                (s.media_program_bytes, s.media_read_bytes, s.erases),
                (r.program_bytes, r.read_bytes, r.erases)
            );
        }
        assert!(accepted > 1000 && rejected > 500, "both kinds exercised: {accepted} / {rejected}");
    }
}

// ---- timing ----

fn gb_per_s(bytes: u64, out: &[IoCompletion]) -> f64 {
    bytes as f64 / span_ns(out) as f64
}

fn zn540_null(zones: u64) -> Emulated<ZnsModel> {
    zn540_null_with(ZnsProfile::zn540_scaled(zones))
}

/// ZN540 timing with 96 MiB of capacity per zone: steady state shows long before 1077 MiB.
fn zn540_short(zones: u64) -> Emulated<ZnsModel> {
    zn540_null_with(ZnsProfile { zone_capacity_bytes: 96 * MIB, ..ZnsProfile::zn540_scaled(zones) })
}

fn zn540_null_with(p: ZnsProfile) -> Emulated<ZnsModel> {
    let cap = p.capacity_bytes();
    zns_device(p, Box::new(MemoryDevice::null(cap, BS)), VirtualClock::new())
}

/// Sequential 128 KiB writes filling `zones` zones together at queue depth `qd`.
fn fill_zones(d: &Emulated<ZnsModel>, zones: u64, qd: usize) -> f64 {
    let p = d.with_model(|m| m.profile().clone());
    let io = 128 * KIB;
    let mut wp: Vec<u64> = (0..zones).map(|z| z * p.zone_size_bytes).collect();
    let mut i = 0;
    let out = run_queue(d, qd, || {
        for _ in 0..zones {
            let z = (i % zones) as usize;
            i += 1;
            let room = (z as u64 * p.zone_size_bytes + p.zone_capacity_bytes) - wp[z];
            if room > 0 {
                let len = io.min(room);
                let r = IoRequest::write(wp[z], IoBuf::zeroed(len as usize), 0);
                wp[z] += len;
                return Some(r);
            }
        }
        None
    });
    let bytes = zones * p.zone_capacity_bytes;
    assert_eq!(d.stats().media_program_bytes, bytes);
    gb_per_s(bytes, &out)
}

#[test]
fn zn540_write_bandwidth() {
    let one = fill_zones(&zn540_short(4), 1, 16);
    println!("zn540 sequential 128 KiB writes, one zone, QD16: {one:.2} GB/s");
    // Bound by the 960 KiB zone buffer: ten 96 KiB units, each ~0.78 ms from channel to programmed.
    assert!((1.0..1.5).contains(&one), "{one}");
    let d = zn540_short(8);
    let many = fill_zones(&d, 8, 64);
    println!("zn540 sequential 128 KiB writes, 8 zones, QD64: {many:.2} GB/s");
    assert!((2.8..3.06).contains(&many), "PCIe-bound near 3.05 GB/s: {many}");
    d.with_model(|m| m.check_invariants());
    assert!(d.with_model(|m| (0..8).all(|z| m.zone(z).state == ZoneState::Full)));
}

#[test]
fn zn540_read_latency_and_bandwidth() {
    let d = zn540_short(4);
    let p = d.with_model(|m| m.profile().clone());
    fill_zones(&d, 1, 16);
    // QD1 random 4 KiB reads of programmed data.
    let mut rng = Xorshift(99);
    let blocks = p.zone_capacity_bytes / BS;
    let mut lat = Vec::new();
    for _ in 0..200 {
        let c = sync_io(&d, IoRequest::read(rng.below(blocks) * BS, BS as usize, 0));
        c.result.unwrap();
        lat.push(c.completed_ns - c.submitted_ns);
    }
    let avg_us = lat.iter().sum::<u64>() as f64 / lat.len() as f64 / 1000.0;
    println!("zn540 QD1 4 KiB read latency: {avg_us:.1} µs");
    assert!((60.0..90.0).contains(&avg_us), "{avg_us}");
    // Sequential 128 KiB reads at QD32: NAND pages on 32 dies, bounded by channels / PCIe.
    let mut at = 0;
    let out = run_queue(&d, 32, || {
        (at < p.zone_capacity_bytes).then(|| {
            at += 128 * KIB;
            IoRequest::read(at - 128 * KIB, 128 * KIB as usize, 0)
        })
    });
    let gbs = gb_per_s(p.zone_capacity_bytes, &out);
    println!("zn540 sequential 128 KiB reads, QD32: {gbs:.2} GB/s");
    assert!((2.5..3.06).contains(&gbs), "{gbs}");
}

#[test]
fn zn540_full_profile_keeps_zone_state_small() {
    let d = zn540_null(ZN540_ZONE_COUNT);
    let last = (ZN540_ZONE_COUNT - 1) * 2 * GIB;
    run(&d, IoRequest::write(last, IoBuf::zeroed(BS as usize), 0)).unwrap();
    assert_eq!(zone(&d, ZN540_ZONE_COUNT - 1).write_pointer, last + BS);
    assert_eq!(d.info().capacity_bytes, ZN540_ZONE_COUNT * 2 * GIB);
}

/// After a power cycle every open zone is Closed (or Empty if nothing was
/// written to it), still active, its write pointer where it was; Full and
/// Empty zones stay; writes continue at the write pointers.
#[test]
fn a_power_cycle_closes_open_zones_and_keeps_write_pointers() {
    let dev = tiny();
    write(&dev, zstart(0), 2, 1).unwrap(); // implicitly open
    mgmt(&dev, ZoneAction::Open, zstart(1)).unwrap(); // explicitly open, empty
    write(&dev, zstart(2), 12, 2).unwrap(); // 48 KiB: full
    assert_eq!(state(&dev, 2), ZoneState::Full);
    let mut m = dev.with_model(|m| m.clone());
    m.power_cycle();
    m.check_invariants();
    assert_eq!((m.open_zones(), m.active_zones()), (0, 1));
    assert_eq!(m.zone(0).state, ZoneState::Closed);
    assert_eq!(m.zone(0).write_pointer, zstart(0) + 2 * BS);
    assert_eq!(m.zone(1).state, ZoneState::Empty);
    assert_eq!(m.zone(2).state, ZoneState::Full);
    let dev = tiny_with(m);
    assert!(write(&dev, zstart(0), 1, 3).is_err(), "a write off the write pointer");
    write(&dev, zstart(0) + 2 * BS, 1, 3).unwrap();
    assert_eq!(state(&dev, 0), ZoneState::ImplicitlyOpen);
}

//! `Volume`: what the frontends (NBD server, Rust API) see of Sluice — a block
//! device of 4 KiB blocks with read, write (optionally FUA), trim, write
//! zeroes, flush and allocation status.
//!
//! Invariants every implementation keeps: offsets and lengths are multiples
//! of `block_bytes()` and inside `size_bytes()` or the call fails with a typed
//! error and changes nothing; a read returns what the last completed write,
//! trim or write-zeroes left there (zeros if never written); after `flush`
//! returns, every write that completed before it survives a crash; a FUA
//! write is durable when it returns.
//!
//! Calls are synchronous and `&self`: a frontend may call from many threads.
//!
//! Its own crate so that a frontend depends on this and not on the engine;
//! `report` (rate-limited operator messages) is shared the same way.

pub mod report;

use serde::Serialize;
use sluice_media::{DeviceError, IoBuf};

/// The data of one write, in a buffer the volume handed out
/// (`Volume::write_buffer`) so that `write_owned` can store it without
/// copying it again: the engine's buffer keeps a block free in front of the
/// data for the log record's header. A frontend reads a request's payload
/// straight into `data_mut`.
pub struct WriteBuf {
    buf: IoBuf,
    head: usize,
    len: usize,
}

impl WriteBuf {
    /// A buffer of `len` bytes with no room in front (any volume accepts it).
    pub fn plain(len: usize) -> WriteBuf {
        WriteBuf { buf: IoBuf::zeroed(len), head: 0, len }
    }

    /// `len` bytes of data after `head` bytes of room, in `buf` (whose
    /// length must be at least `head + len`; its contents are undefined
    /// until written).
    pub fn with_head(mut buf: IoBuf, head: usize, len: usize) -> WriteBuf {
        buf.set_len(head + len);
        WriteBuf { buf, head, len }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Bytes of room in front of the data.
    pub fn head(&self) -> usize {
        self.head
    }

    pub fn data(&self) -> &[u8] {
        &self.buf[self.head..self.head + self.len]
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.head..self.head + self.len]
    }

    /// The whole buffer, room included.
    pub fn into_inner(self) -> IoBuf {
        self.buf
    }
}

/// Errors a volume returns; each maps to one NBD/errno answer.
///
/// A device error keeps its type (and errno) all the way to the protocol
/// reply: a host filesystem that fills up is ENOSPC to the client, not EIO.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum VolumeError {
    #[error("offset {offset} or length {len} not a multiple of the {block_bytes}-byte block")]
    Misaligned { offset: u64, len: u64, block_bytes: u64 },
    #[error("range {offset}+{len} beyond the volume size {size_bytes}")]
    OutOfRange { offset: u64, len: u64, size_bytes: u64 },
    #[error("no space left on the capacity device")]
    NoSpace,
    #[error("volume is read-only")]
    ReadOnly,
    /// A device failed a request: the device's own error, errno and all.
    #[error("device: {0}")]
    Io(DeviceError),
    /// Engine metadata on a device does not check (a segment header GC
    /// read, say): damage the read path cannot work around.
    #[error("damaged metadata on the {device} device at byte {offset}: {what}")]
    Damaged { device: &'static str, offset: u64, what: Damage },
    /// An earlier device error stopped all changes; reopening recovers.
    #[error("the engine stopped after a device error; restart it to recover from the devices")]
    Stopped,
    /// An earlier write found the file system (or quota) holding a device
    /// full: every change fails with ENOSPC until a restart, after room was
    /// made, recovers from the devices.
    #[error("the engine stopped: the file system holding a device is full; make room, then restart it to recover")]
    StoppedFull,
    #[error("data checksum mismatch at volume byte {offset} (stored on the {device} device at byte {device_offset})")]
    Corrupt { offset: u64, device: &'static str, device_offset: u64 },
}

impl VolumeError {
    /// The errno an NBD server answers with.
    pub fn errno(&self) -> i32 {
        match self {
            VolumeError::Misaligned { .. } => 22, // EINVAL
            VolumeError::OutOfRange { .. } => 22, // EINVAL (NBD: ENOSPC for writes past the end)
            VolumeError::NoSpace => 28,           // ENOSPC
            VolumeError::ReadOnly => 1,           // EPERM
            // The device's own errno where it is one a client can act on
            // (a full host filesystem stays ENOSPC), else EIO.
            VolumeError::Io(DeviceError::Io { errno }) if [28, 122].contains(errno) => 28, // ENOSPC (EDQUOT too)
            VolumeError::Io(_) | VolumeError::Corrupt { .. } => 5,                         // EIO
            VolumeError::StoppedFull => 28,
            VolumeError::Damaged { .. } | VolumeError::Stopped => 5,
        }
    }
}

/// What engine metadata a [`VolumeError::Damaged`] found damaged.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Damage {
    /// A page of a paged L2P read back from the cache device does not match
    /// the checksum kept for it.
    #[error("L2P page {page} does not match its checksum")]
    MapPage { page: u64 },
    /// A capacity band's segment header does not decode.
    #[error("band {band} segment header: {cause}")]
    SegmentHeader { band: u32, cause: HeaderError },
    /// A segment header names a volume the engine does not have.
    #[error("band {band} segment at block {block}: volume {volume} unknown")]
    SegmentVolume { band: u32, block: u64, volume: u32 },
    /// A segment claims more blocks than GC reads of a band at once.
    #[error("band {band} segment larger than a GC window")]
    SegmentTooLarge { band: u32 },
    /// Blocks of a log chunk the map still points at follow no readable
    /// record header (a header damaged at rest since the engine opened).
    #[error("log chunk {chunk}: {blocks} current blocks follow no readable record header")]
    UnreadHeaders { chunk: u32, blocks: u32 },
}

/// Why a block is not a valid header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    #[error("no record magic")]
    NoMagic,
    #[error("unsupported format version {0}")]
    Version(u16),
    #[error("header checksum mismatch")]
    Checksum,
    #[error("malformed header")]
    Malformed,
    #[error("a record of another engine (tag {0:#010x})")]
    OtherEngine(u32),
}

impl HeaderError {
    /// The block carries the record magic and this format, but its content
    /// does not check: what a torn write or corruption leaves, not a block
    /// that was never a record.
    pub fn looks_like_a_record(&self) -> bool {
        matches!(self, HeaderError::Checksum | HeaderError::Malformed)
    }
}

/// A run of blocks with one allocation state (for NBD `base:allocation`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Extent {
    pub len: u64,
    /// False for never-written or trimmed blocks (they read as zeros).
    pub allocated: bool,
}

pub trait Volume: Send + Sync {
    fn name(&self) -> &str;
    fn size_bytes(&self) -> u64;
    fn block_bytes(&self) -> u64 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), VolumeError>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), VolumeError>;
    /// Deallocate: later reads return zeros.
    fn trim(&self, offset: u64, len: u64) -> Result<(), VolumeError>;
    /// Make the range read as zeros (may deallocate).
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), VolumeError>;
    fn flush(&self) -> Result<(), VolumeError>;
    /// Allocation status of [offset, offset+len): consecutive extents covering it.
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, VolumeError>;
    /// Several writes as one request (group commit), as if applied in order.
    /// Every range is checked before anything is written; on an error the
    /// caller must assume any subset was written. The default writes them
    /// one by one.
    fn write_batch(&self, writes: &[(u64, &[u8])], fua: bool) -> Result<(), VolumeError> {
        for &(offset, data) in writes {
            check(self, offset, data.len() as u64)?;
        }
        for &(offset, data) in writes {
            self.write(offset, data, fua)?;
        }
        Ok(())
    }
    /// A buffer for the data of a `len`-byte write, to be filled and passed
    /// to `write_owned`. The default has no room in front.
    fn write_buffer(&self, len: usize) -> WriteBuf {
        WriteBuf::plain(len)
    }
    /// `write` of data in a buffer from `write_buffer`, which the volume may
    /// store without another copy. The default is `write`.
    fn write_owned(&self, offset: u64, data: WriteBuf, fua: bool) -> Result<(), VolumeError> {
        self.write(offset, data.data(), fua)
    }
}

/// The shared range check.
pub fn check<V: Volume + ?Sized>(v: &V, offset: u64, len: u64) -> Result<(), VolumeError> {
    let bs = v.block_bytes();
    if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
        return Err(VolumeError::Misaligned { offset, len, block_bytes: bs });
    }
    match offset.checked_add(len) {
        Some(end) if end <= v.size_bytes() => Ok(()),
        _ => Err(VolumeError::OutOfRange { offset, len, size_bytes: v.size_bytes() }),
    }
}

impl From<DeviceError> for VolumeError {
    fn from(e: DeviceError) -> VolumeError {
        VolumeError::Io(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_errors_keep_their_errno_where_a_client_can_act_on_it() {
        let enospc = VolumeError::Io(DeviceError::Io { errno: 28 });
        assert_eq!(enospc.errno(), 28);
        assert!(enospc.to_string().contains("No space left on device (os error 28)"), "{enospc}");
        assert_eq!(VolumeError::Io(DeviceError::Io { errno: 122 }).errno(), 28, "EDQUOT is no space too");
        assert_eq!(VolumeError::Io(DeviceError::Io { errno: 5 }).errno(), 5);
        assert_eq!(VolumeError::Io(DeviceError::Injected).errno(), 5);
        assert_eq!(VolumeError::Stopped.errno(), 5);
        assert_eq!(VolumeError::StoppedFull.errno(), 28);
        assert_eq!(VolumeError::NoSpace.errno(), 28);
    }
}

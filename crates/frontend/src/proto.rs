//! The NBD wire format (fixed newstyle handshake, simple and structured
//! replies) as pure encode/decode functions: no I/O, no state.
//!
//! Owns: every magic number, option/reply/command code and flag the server
//! speaks, and the byte layout of each message. Every decoder takes `&[u8]`
//! and returns `Result<_, ProtoError>`: malformed input (bad magic, truncated
//! data, lengths beyond a maximum, unknown codes, inconsistent inner lengths,
//! bad strings) is a typed error, never a panic, so the decoders are safe to
//! fuzz. Encoders build whole messages into one `Vec<u8>` so the server can
//! send each reply with a single write.
//!
//! Both directions are here (client → server and server → client) so the
//! tests and a future Rust client can speak the protocol byte-exactly and so
//! every message round-trips. All integers are big-endian (network order) as
//! the NBD spec (`proto.md` of the NBD project) requires.

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBD_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: server greeting's second magic and every option request's magic.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flags (server → client).
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flags (client → server).
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const FLAG_SEND_DF: u16 = 1 << 7;
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const FLAG_SEND_CACHE: u16 = 1 << 10;
pub const FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const CMD_FLAG_DF: u16 = 1 << 2;
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flags and chunk types.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) + 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) + 2;

/// Option reply types.
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
pub const REP_ERR_PLATFORM: u32 = (1 << 31) + 4;
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = (1 << 31) + 8;
pub const REP_ERR_TOO_BIG: u32 = (1 << 31) + 9;

/// `NBD_INFO_*` types inside `NBD_REP_INFO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// `base:allocation` status flags.
pub const STATE_HOLE: u32 = 1 << 0;
pub const STATE_ZERO: u32 = 1 << 1;

/// The one metadata context this server offers.
pub const META_BASE_ALLOCATION: &str = "base:allocation";

/// NBD error values (the `error` field of replies).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const ENOMEM: u32 = 12;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;
pub const ESHUTDOWN: u32 = 108;

/// Longest string (export name, query, message) the spec allows.
pub const STRING_BYTES_MAX: usize = 4096;
/// Largest option payload accepted; larger is treated as a denial of service.
pub const OPTION_DATA_BYTES_MAX: u32 = 64 * 1024;

pub const GREETING_BYTES: usize = 18;
pub const OPTION_HEADER_BYTES: usize = 16;
pub const OPTION_REPLY_HEADER_BYTES: usize = 20;
pub const REQUEST_HEADER_BYTES: usize = 28;
pub const SIMPLE_REPLY_BYTES: usize = 16;
pub const STRUCTURED_HEADER_BYTES: usize = 20;
/// Size + flags + 124 zero bytes sent after `NBD_OPT_EXPORT_NAME`.
pub const EXPORT_NAME_REPLY_ZEROES: usize = 124;

/// Malformed protocol input, one variant per way it can be wrong.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    #[error("truncated {what}: need {need} bytes, have {have}")]
    Truncated { what: &'static str, need: usize, have: usize },
    #[error("bad {what} magic {got:#x}")]
    BadMagic { what: &'static str, got: u64 },
    #[error("unknown option {0}")]
    UnknownOption(u32),
    #[error("unknown command {0}")]
    UnknownCommand(u16),
    #[error("unknown client flags {0:#x}")]
    UnknownClientFlags(u32),
    #[error("{what} length {len} beyond the maximum {max}")]
    TooLong { what: &'static str, len: u64, max: u64 },
    #[error("{what}: inner length {inner} does not fit the {outer} bytes available")]
    LengthMismatch { what: &'static str, inner: u64, outer: u64 },
    #[error("{what} carries {len} unexpected trailing bytes")]
    TrailingBytes { what: &'static str, len: usize },
    #[error("{what} is not valid UTF-8 or contains NUL")]
    BadString { what: &'static str },
    #[error("command flags {flags:#x} not valid for {command:?}")]
    BadFlags { command: Command, flags: u16 },
    #[error("unknown reply type {0}")]
    UnknownReplyType(u16),
}

/// A little cursor over `&[u8]`: every read is bounds-checked.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        let have = self.buf.len() - self.pos;
        if n > have {
            return Err(ProtoError::Truncated { what: self.what, need: self.pos + n, have: self.buf.len() });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn u16(&mut self) -> Result<u16, ProtoError> {
        let b = self.take(2)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, ProtoError> {
        let b = self.take(4)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, ProtoError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn rest(&mut self) -> &'a [u8] {
        let s = &self.buf[self.pos..];
        self.pos = self.buf.len();
        s
    }
    /// A string of `len` bytes, validated (UTF-8, no NUL, ≤ 4096 bytes).
    fn string(&mut self, len: u64, what: &'static str) -> Result<String, ProtoError> {
        let avail = self.remaining() as u64;
        if len > avail {
            return Err(ProtoError::LengthMismatch { what, inner: len, outer: avail });
        }
        if len > STRING_BYTES_MAX as u64 {
            return Err(ProtoError::TooLong { what, len, max: STRING_BYTES_MAX as u64 });
        }
        decode_string(self.take(len as usize)?, what)
    }
    fn finish(&self) -> Result<(), ProtoError> {
        match self.remaining() {
            0 => Ok(()),
            len => Err(ProtoError::TrailingBytes { what: self.what, len }),
        }
    }
}

fn decode_string(b: &[u8], what: &'static str) -> Result<String, ProtoError> {
    if b.contains(&0) {
        return Err(ProtoError::BadString { what });
    }
    std::str::from_utf8(b).map(str::to_owned).map_err(|_| ProtoError::BadString { what })
}

fn put_string_u32(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

mod handshake;
mod transmission;

pub use handshake::*;
pub use transmission::*;

#[cfg(test)]
mod tests;

//! Transmission-phase messages: request headers, simple replies and
//! structured reply chunks.

use super::*;

/// Command types (`NBD_CMD_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    Read = 0,
    Write = 1,
    Disc = 2,
    Flush = 3,
    Trim = 4,
    Cache = 5,
    WriteZeroes = 6,
    BlockStatus = 7,
}

impl Command {
    pub fn from_u16(v: u16) -> Result<Self, ProtoError> {
        Ok(match v {
            0 => Command::Read,
            1 => Command::Write,
            2 => Command::Disc,
            3 => Command::Flush,
            4 => Command::Trim,
            5 => Command::Cache,
            6 => Command::WriteZeroes,
            7 => Command::BlockStatus,
            other => return Err(ProtoError::UnknownCommand(other)),
        })
    }

    /// Command flags the spec documents for this command (FUA is valid on
    /// every command; DF needs structured replies).
    pub fn valid_flags(self, structured: bool) -> u16 {
        CMD_FLAG_FUA
            | match self {
                Command::Read if structured => CMD_FLAG_DF,
                Command::WriteZeroes => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
                Command::BlockStatus => CMD_FLAG_REQ_ONE,
                _ => 0,
            }
    }
}

/// A request header exactly as sent: the command is kept raw so that an
/// unknown command can still be answered (with `EINVAL`) by its cookie.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    /// Decodes 28 bytes; the only possible failures are truncation and a bad
    /// magic, after which the stream cannot be trusted.
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b, "request header");
        let m = r.u32()?;
        if m != REQUEST_MAGIC {
            return Err(ProtoError::BadMagic { what: "request", got: m as u64 });
        }
        let h = RequestHeader { flags: r.u16()?, command: r.u16()?, cookie: r.u64()?, offset: r.u64()?, len: r.u32()? };
        r.finish()?;
        Ok(h)
    }

    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut b = [0u8; REQUEST_HEADER_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.command.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }

    pub fn command(&self) -> Result<Command, ProtoError> {
        Command::from_u16(self.command)
    }

    /// Checks the command is known and carries only flags documented for it.
    pub fn validate(&self, structured: bool) -> Result<Command, ProtoError> {
        let command = self.command()?;
        if self.flags & !command.valid_flags(structured) != 0 {
            return Err(ProtoError::BadFlags { command, flags: self.flags });
        }
        Ok(command)
    }

    /// Bytes of payload that follow this header on the wire.
    pub fn payload_len(&self) -> u32 {
        if self.command == Command::Write as u16 {
            self.len
        } else {
            0
        }
    }
}

/// A simple reply header (the read data, if any, follows it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimpleReply {
    pub error: u32,
    pub cookie: u64,
}

impl SimpleReply {
    pub fn encode(&self) -> [u8; SIMPLE_REPLY_BYTES] {
        let mut b = [0u8; SIMPLE_REPLY_BYTES];
        self.encode_into(&mut b);
        b
    }

    /// Writes the header into the first 16 bytes of `b` (which must hold them).
    pub fn encode_into(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b[4..8].copy_from_slice(&self.error.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
    }

    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b, "simple reply");
        let m = r.u32()?;
        if m != SIMPLE_REPLY_MAGIC {
            return Err(ProtoError::BadMagic { what: "simple reply", got: m as u64 });
        }
        let rep = SimpleReply { error: r.u32()?, cookie: r.u64()? };
        r.finish()?;
        Ok(rep)
    }
}

/// A structured reply chunk header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub chunk_type: u16,
    pub cookie: u64,
    pub len: u32,
}

impl ChunkHeader {
    pub fn encode_into(&self, b: &mut [u8]) {
        b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.chunk_type.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..20].copy_from_slice(&self.len.to_be_bytes());
    }

    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b, "structured reply header");
        let m = r.u32()?;
        if m != STRUCTURED_REPLY_MAGIC {
            return Err(ProtoError::BadMagic { what: "structured reply", got: m as u64 });
        }
        let h = ChunkHeader { flags: r.u16()?, chunk_type: r.u16()?, cookie: r.u64()?, len: r.u32()? };
        r.finish()?;
        Ok(h)
    }

    pub fn is_done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }
}

/// Bytes of header before the data in an `OFFSET_DATA` chunk.
pub const OFFSET_DATA_PREFIX_BYTES: usize = STRUCTURED_HEADER_BYTES + 8;

/// Writes the header of a final `OFFSET_DATA` chunk carrying `data_len`
/// bytes read at `offset` into `b[..OFFSET_DATA_PREFIX_BYTES]`; the caller
/// puts the data right after it, so a read reply is one buffer.
pub fn encode_offset_data_prefix(b: &mut [u8], cookie: u64, offset: u64, data_len: u32, done: bool) {
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    ChunkHeader { flags, chunk_type: REPLY_TYPE_OFFSET_DATA, cookie, len: data_len + 8 }.encode_into(b);
    b[20..28].copy_from_slice(&offset.to_be_bytes());
}

/// A structured reply chunk with its payload decoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Chunk {
    None,
    OffsetData {
        offset: u64,
        data: Vec<u8>,
    },
    OffsetHole {
        offset: u64,
        len: u32,
    },
    /// Descriptors are (length, status flags).
    BlockStatus {
        context_id: u32,
        descriptors: Vec<(u32, u32)>,
    },
    Error {
        error: u32,
        message: String,
    },
    ErrorOffset {
        error: u32,
        message: String,
        offset: u64,
    },
}

impl Chunk {
    pub fn chunk_type(&self) -> u16 {
        match self {
            Chunk::None => REPLY_TYPE_NONE,
            Chunk::OffsetData { .. } => REPLY_TYPE_OFFSET_DATA,
            Chunk::OffsetHole { .. } => REPLY_TYPE_OFFSET_HOLE,
            Chunk::BlockStatus { .. } => REPLY_TYPE_BLOCK_STATUS,
            Chunk::Error { .. } => REPLY_TYPE_ERROR,
            Chunk::ErrorOffset { .. } => REPLY_TYPE_ERROR_OFFSET,
        }
    }

    /// Header and payload as one message. Error messages longer than the
    /// 4096-byte string limit are cut (at a char boundary).
    pub fn encode(&self, cookie: u64, done: bool) -> Vec<u8> {
        let mut p = Vec::new();
        match self {
            Chunk::None => {}
            Chunk::OffsetData { offset, data } => {
                p.extend_from_slice(&offset.to_be_bytes());
                p.extend_from_slice(data);
            }
            Chunk::OffsetHole { offset, len } => {
                p.extend_from_slice(&offset.to_be_bytes());
                p.extend_from_slice(&len.to_be_bytes());
            }
            Chunk::BlockStatus { context_id, descriptors } => {
                p.extend_from_slice(&context_id.to_be_bytes());
                for (len, flags) in descriptors {
                    p.extend_from_slice(&len.to_be_bytes());
                    p.extend_from_slice(&flags.to_be_bytes());
                }
            }
            Chunk::Error { error, message } | Chunk::ErrorOffset { error, message, .. } => {
                let msg = truncate_str(message, STRING_BYTES_MAX);
                p.extend_from_slice(&error.to_be_bytes());
                p.extend_from_slice(&(msg.len() as u16).to_be_bytes());
                p.extend_from_slice(msg.as_bytes());
                if let Chunk::ErrorOffset { offset, .. } = self {
                    p.extend_from_slice(&offset.to_be_bytes());
                }
            }
        }
        let mut b = vec![0u8; STRUCTURED_HEADER_BYTES];
        let flags = if done { REPLY_FLAG_DONE } else { 0 };
        ChunkHeader { flags, chunk_type: self.chunk_type(), cookie, len: p.len() as u32 }.encode_into(&mut b);
        b.extend_from_slice(&p);
        b
    }

    /// Decodes a chunk's payload given its header, checking each type's
    /// length rules from the spec.
    pub fn decode(header: &ChunkHeader, p: &[u8]) -> Result<Self, ProtoError> {
        if p.len() != header.len as usize {
            return Err(ProtoError::LengthMismatch {
                what: "structured reply",
                inner: header.len as u64,
                outer: p.len() as u64,
            });
        }
        let mut r = Reader::new(p, "structured reply payload");
        let chunk = match header.chunk_type {
            REPLY_TYPE_NONE => Chunk::None,
            REPLY_TYPE_OFFSET_DATA => {
                let offset = r.u64()?;
                if r.remaining() == 0 {
                    return Err(ProtoError::Truncated { what: "offset data", need: 9, have: 8 });
                }
                Chunk::OffsetData { offset, data: r.rest().to_vec() }
            }
            REPLY_TYPE_OFFSET_HOLE => Chunk::OffsetHole { offset: r.u64()?, len: r.u32()? },
            REPLY_TYPE_BLOCK_STATUS => {
                let context_id = r.u32()?;
                if r.remaining() == 0 || !r.remaining().is_multiple_of(8) {
                    return Err(ProtoError::LengthMismatch {
                        what: "block status descriptors",
                        inner: r.remaining() as u64,
                        outer: 8,
                    });
                }
                let mut descriptors = Vec::with_capacity(r.remaining() / 8);
                while r.remaining() > 0 {
                    descriptors.push((r.u32()?, r.u32()?));
                }
                Chunk::BlockStatus { context_id, descriptors }
            }
            REPLY_TYPE_ERROR | REPLY_TYPE_ERROR_OFFSET => {
                let error = r.u32()?;
                let mlen = r.u16()? as u64;
                let message = r.string(mlen, "error message")?;
                if header.chunk_type == REPLY_TYPE_ERROR {
                    Chunk::Error { error, message }
                } else {
                    Chunk::ErrorOffset { error, message, offset: r.u64()? }
                }
            }
            other => return Err(ProtoError::UnknownReplyType(other)),
        };
        r.finish()?;
        Ok(chunk)
    }
}

fn truncate_str(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

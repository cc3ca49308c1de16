//! Handshake-phase messages: greeting, client flags, option requests and
//! option replies (including `NBD_REP_INFO` payloads).

use super::*;

/// The server's first 18 bytes: `NBDMAGIC`, `IHAVEOPT`, handshake flags.
pub fn encode_greeting(handshake_flags: u16) -> [u8; GREETING_BYTES] {
    let mut b = [0u8; GREETING_BYTES];
    b[0..8].copy_from_slice(&NBD_MAGIC.to_be_bytes());
    b[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    b[16..18].copy_from_slice(&handshake_flags.to_be_bytes());
    b
}

/// Decodes the greeting; returns the handshake flags.
pub fn decode_greeting(b: &[u8]) -> Result<u16, ProtoError> {
    let mut r = Reader::new(b, "greeting");
    let m = r.u64()?;
    if m != NBD_MAGIC {
        return Err(ProtoError::BadMagic { what: "greeting", got: m });
    }
    let m = r.u64()?;
    if m != IHAVEOPT {
        return Err(ProtoError::BadMagic { what: "greeting", got: m });
    }
    let flags = r.u16()?;
    r.finish()?;
    Ok(flags)
}

/// Decodes the client's 32-bit flags; unknown bits (or bits the server did
/// not offer in `offered`) are an error: the spec says drop the connection.
pub fn decode_client_flags(b: &[u8], offered: u16) -> Result<u32, ProtoError> {
    let mut r = Reader::new(b, "client flags");
    let flags = r.u32()?;
    r.finish()?;
    let allowed = FLAG_C_FIXED_NEWSTYLE | if offered & FLAG_NO_ZEROES != 0 { FLAG_C_NO_ZEROES } else { 0 };
    if flags & !allowed != 0 {
        return Err(ProtoError::UnknownClientFlags(flags));
    }
    Ok(flags)
}

/// Option codes (`NBD_OPT_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OptionCode {
    ExportName = 1,
    Abort = 2,
    List = 3,
    StartTls = 5,
    Info = 6,
    Go = 7,
    StructuredReply = 8,
    ListMetaContext = 9,
    SetMetaContext = 10,
    ExtendedHeaders = 11,
}

impl OptionCode {
    pub fn from_u32(v: u32) -> Result<Self, ProtoError> {
        Ok(match v {
            1 => OptionCode::ExportName,
            2 => OptionCode::Abort,
            3 => OptionCode::List,
            5 => OptionCode::StartTls,
            6 => OptionCode::Info,
            7 => OptionCode::Go,
            8 => OptionCode::StructuredReply,
            9 => OptionCode::ListMetaContext,
            10 => OptionCode::SetMetaContext,
            11 => OptionCode::ExtendedHeaders,
            other => return Err(ProtoError::UnknownOption(other)),
        })
    }
}

/// The 16-byte header of an option request (the raw option code is kept so
/// an unknown option can still be answered with `NBD_REP_ERR_UNSUP`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    /// Checks magic and that the payload length is within
    /// [`OPTION_DATA_BYTES_MAX`].
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let mut r = Reader::new(b, "option header");
        let m = r.u64()?;
        if m != IHAVEOPT {
            return Err(ProtoError::BadMagic { what: "option", got: m });
        }
        let option = r.u32()?;
        let len = r.u32()?;
        r.finish()?;
        if len > OPTION_DATA_BYTES_MAX {
            return Err(ProtoError::TooLong {
                what: "option data",
                len: len as u64,
                max: OPTION_DATA_BYTES_MAX as u64,
            });
        }
        Ok(OptionHeader { option, len })
    }

    pub fn encode(&self) -> [u8; OPTION_HEADER_BYTES] {
        let mut b = [0u8; OPTION_HEADER_BYTES];
        b[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        b[8..12].copy_from_slice(&self.option.to_be_bytes());
        b[12..16].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// A parsed option request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(String),
    Abort,
    List,
    StartTls,
    /// `NBD_OPT_INFO` (`go == false`) or `NBD_OPT_GO`.
    Info {
        go: bool,
        name: String,
        requests: Vec<u16>,
    },
    StructuredReply,
    /// `NBD_OPT_LIST_META_CONTEXT` (`set == false`) or `NBD_OPT_SET_META_CONTEXT`.
    MetaContext {
        set: bool,
        export: String,
        queries: Vec<String>,
    },
    ExtendedHeaders,
}

impl ClientOption {
    /// Parses an option's payload. `option` is the raw code from the header.
    pub fn parse(option: u32, data: &[u8]) -> Result<Self, ProtoError> {
        if data.len() > OPTION_DATA_BYTES_MAX as usize {
            return Err(ProtoError::TooLong {
                what: "option data",
                len: data.len() as u64,
                max: OPTION_DATA_BYTES_MAX as u64,
            });
        }
        let code = OptionCode::from_u32(option)?;
        let no_data = |opt: ClientOption| {
            if data.is_empty() {
                Ok(opt)
            } else {
                Err(ProtoError::TrailingBytes { what: "option without data", len: data.len() })
            }
        };
        match code {
            OptionCode::ExportName => {
                let mut r = Reader::new(data, "export name");
                Ok(ClientOption::ExportName(r.string(data.len() as u64, "export name")?))
            }
            // The spec says a server SHOULD ignore data sent with ABORT.
            OptionCode::Abort => Ok(ClientOption::Abort),
            OptionCode::List => no_data(ClientOption::List),
            OptionCode::StartTls => no_data(ClientOption::StartTls),
            OptionCode::StructuredReply => no_data(ClientOption::StructuredReply),
            OptionCode::ExtendedHeaders => no_data(ClientOption::ExtendedHeaders),
            OptionCode::Info | OptionCode::Go => {
                let mut r = Reader::new(data, "info request");
                let name_len = r.u32()? as u64;
                let name = r.string(name_len, "export name")?;
                let n = r.u16()? as usize;
                if r.remaining() != n * 2 {
                    return Err(ProtoError::LengthMismatch {
                        what: "info requests",
                        inner: (n * 2) as u64,
                        outer: r.remaining() as u64,
                    });
                }
                let mut requests = Vec::with_capacity(n);
                for _ in 0..n {
                    requests.push(r.u16()?);
                }
                r.finish()?;
                Ok(ClientOption::Info { go: code == OptionCode::Go, name, requests })
            }
            OptionCode::ListMetaContext | OptionCode::SetMetaContext => {
                let mut r = Reader::new(data, "meta context request");
                let name_len = r.u32()? as u64;
                let export = r.string(name_len, "export name")?;
                let n = r.u32()? as u64;
                // Each query needs at least its 4-byte length: bound the count
                // by what the payload could hold before allocating.
                if n * 4 > r.remaining() as u64 {
                    return Err(ProtoError::LengthMismatch {
                        what: "meta context queries",
                        inner: n * 4,
                        outer: r.remaining() as u64,
                    });
                }
                let mut queries = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    let len = r.u32()? as u64;
                    queries.push(r.string(len, "meta context query")?);
                }
                r.finish()?;
                Ok(ClientOption::MetaContext { set: code == OptionCode::SetMetaContext, export, queries })
            }
        }
    }

    /// The option code and payload, as a client sends them.
    pub fn encode(&self) -> Vec<u8> {
        let (code, data) = match self {
            ClientOption::ExportName(name) => (OptionCode::ExportName, name.as_bytes().to_vec()),
            ClientOption::Abort => (OptionCode::Abort, Vec::new()),
            ClientOption::List => (OptionCode::List, Vec::new()),
            ClientOption::StartTls => (OptionCode::StartTls, Vec::new()),
            ClientOption::StructuredReply => (OptionCode::StructuredReply, Vec::new()),
            ClientOption::ExtendedHeaders => (OptionCode::ExtendedHeaders, Vec::new()),
            ClientOption::Info { go, name, requests } => {
                let mut d = Vec::new();
                put_string_u32(&mut d, name);
                d.extend_from_slice(&(requests.len() as u16).to_be_bytes());
                for q in requests {
                    d.extend_from_slice(&q.to_be_bytes());
                }
                (if *go { OptionCode::Go } else { OptionCode::Info }, d)
            }
            ClientOption::MetaContext { set, export, queries } => {
                let mut d = Vec::new();
                put_string_u32(&mut d, export);
                d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
                for q in queries {
                    put_string_u32(&mut d, q);
                }
                (if *set { OptionCode::SetMetaContext } else { OptionCode::ListMetaContext }, d)
            }
        };
        let mut out = OptionHeader { option: code as u32, len: data.len() as u32 }.encode().to_vec();
        out.extend_from_slice(&data);
        out
    }
}

/// An option reply: header plus payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub reply_type: u32,
    pub data: Vec<u8>,
}

impl OptionReply {
    pub fn encode(option: u32, reply_type: u32, data: &[u8]) -> Vec<u8> {
        let mut b = Vec::with_capacity(OPTION_REPLY_HEADER_BYTES + data.len());
        b.extend_from_slice(&OPT_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&reply_type.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        b
    }

    /// Decodes the 20-byte header; returns (option, reply type, payload length).
    pub fn decode_header(b: &[u8]) -> Result<(u32, u32, u32), ProtoError> {
        let mut r = Reader::new(b, "option reply header");
        let m = r.u64()?;
        if m != OPT_REPLY_MAGIC {
            return Err(ProtoError::BadMagic { what: "option reply", got: m });
        }
        let option = r.u32()?;
        let reply_type = r.u32()?;
        let len = r.u32()?;
        r.finish()?;
        Ok((option, reply_type, len))
    }

    /// Decodes one whole reply (header + exactly its payload).
    pub fn decode(b: &[u8]) -> Result<Self, ProtoError> {
        let hdr = b.get(..OPTION_REPLY_HEADER_BYTES).ok_or(ProtoError::Truncated {
            what: "option reply header",
            need: OPTION_REPLY_HEADER_BYTES,
            have: b.len(),
        })?;
        let (option, reply_type, len) = Self::decode_header(hdr)?;
        let data = &b[OPTION_REPLY_HEADER_BYTES..];
        if data.len() != len as usize {
            return Err(ProtoError::LengthMismatch {
                what: "option reply",
                inner: len as u64,
                outer: data.len() as u64,
            });
        }
        Ok(OptionReply { option, reply_type, data: data.to_vec() })
    }

    pub fn is_error(&self) -> bool {
        self.reply_type & (1 << 31) != 0
    }
}

/// Payload of `NBD_REP_SERVER`: name length, name, optional description.
pub fn encode_rep_server(name: &str, description: &str) -> Vec<u8> {
    let mut d = Vec::new();
    put_string_u32(&mut d, name);
    d.extend_from_slice(description.as_bytes());
    d
}

/// Parses `NBD_REP_SERVER`'s payload into (name, description).
pub fn decode_rep_server(b: &[u8]) -> Result<(String, String), ProtoError> {
    let mut r = Reader::new(b, "rep server");
    let len = r.u32()? as u64;
    let name = r.string(len, "export name")?;
    let rest = r.rest();
    Ok((name, decode_string(rest, "export description")?))
}

/// Payload of `NBD_REP_META_CONTEXT`: context id and name.
pub fn encode_rep_meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut d = id.to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d
}

pub fn decode_rep_meta_context(b: &[u8]) -> Result<(u32, String), ProtoError> {
    let mut r = Reader::new(b, "rep meta context");
    let id = r.u32()?;
    let rest = r.rest();
    if rest.len() > STRING_BYTES_MAX {
        return Err(ProtoError::TooLong {
            what: "meta context name",
            len: rest.len() as u64,
            max: STRING_BYTES_MAX as u64,
        });
    }
    Ok((id, decode_string(rest, "meta context name")?))
}

/// `NBD_REP_INFO` payloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export { size_bytes: u64, transmission_flags: u16 },
    Name(String),
    Description(String),
    BlockSize { min: u32, preferred: u32, max: u32 },
}

impl Info {
    pub fn encode(&self) -> Vec<u8> {
        let mut d = Vec::new();
        match self {
            Info::Export { size_bytes, transmission_flags } => {
                d.extend_from_slice(&INFO_EXPORT.to_be_bytes());
                d.extend_from_slice(&size_bytes.to_be_bytes());
                d.extend_from_slice(&transmission_flags.to_be_bytes());
            }
            Info::Name(s) => {
                d.extend_from_slice(&INFO_NAME.to_be_bytes());
                d.extend_from_slice(s.as_bytes());
            }
            Info::Description(s) => {
                d.extend_from_slice(&INFO_DESCRIPTION.to_be_bytes());
                d.extend_from_slice(s.as_bytes());
            }
            Info::BlockSize { min, preferred, max } => {
                d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
                d.extend_from_slice(&min.to_be_bytes());
                d.extend_from_slice(&preferred.to_be_bytes());
                d.extend_from_slice(&max.to_be_bytes());
            }
        }
        d
    }

    /// Decodes one `NBD_REP_INFO` payload; `Ok(None)` for an info type this
    /// code does not know (clients must ignore those).
    pub fn decode(b: &[u8]) -> Result<Option<Self>, ProtoError> {
        let mut r = Reader::new(b, "info reply");
        let info = match r.u16()? {
            INFO_EXPORT => {
                let size_bytes = r.u64()?;
                let transmission_flags = r.u16()?;
                Info::Export { size_bytes, transmission_flags }
            }
            INFO_NAME => {
                let n = r.remaining() as u64;
                Info::Name(r.string(n, "info name")?)
            }
            INFO_DESCRIPTION => {
                let n = r.remaining() as u64;
                Info::Description(r.string(n, "info description")?)
            }
            INFO_BLOCK_SIZE => Info::BlockSize { min: r.u32()?, preferred: r.u32()?, max: r.u32()? },
            _ => return Ok(None),
        };
        r.finish()?;
        Ok(Some(info))
    }
}

/// What the server sends after `NBD_OPT_EXPORT_NAME`: size, flags, and the
/// 124 zero bytes unless the client negotiated `NO_ZEROES`.
pub fn encode_export_name_reply(size_bytes: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut b = Vec::with_capacity(10 + EXPORT_NAME_REPLY_ZEROES);
    b.extend_from_slice(&size_bytes.to_be_bytes());
    b.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        b.resize(10 + EXPORT_NAME_REPLY_ZEROES, 0);
    }
    b
}

//! Fixed newstyle option haggling: from the greeting to the transmission
//! phase (or a soft disconnect).
//!
//! Owns: which options this server answers and how (EXPORT_NAME, ABORT,
//! LIST, INFO, GO, STRUCTURED_REPLY, LIST/SET_META_CONTEXT for
//! `base:allocation`, STARTTLS when the server has TLS; EXTENDED_HEADERS is
//! refused with `NBD_REP_ERR_UNSUP`, as is every unknown option, and the
//! session goes on).
//!
//! TLS: STARTTLS is answered with ACK, then the TLS handshake runs and the
//! haggling goes on encrypted, with everything negotiated before forgotten.
//! A TLS-required server answers any other option before TLS with
//! `NBD_REP_ERR_TLS_REQD` (EXPORT_NAME cannot carry an error: it closes the
//! connection); a second STARTTLS gets `NBD_REP_ERR_INVALID`.
//!
//! Invariants: a malformed option payload gets `NBD_REP_ERR_INVALID` and the
//! session continues; only a broken framing (bad magic, option data beyond
//! [`proto::OPTION_DATA_BYTES_MAX`]), bad client flags, an unknown export in
//! `NBD_OPT_EXPORT_NAME` (which cannot be answered with an error) or too many
//! options end the connection. Block sizes are always sent with INFO/GO. A
//! client that asked for them (`NBD_INFO_BLOCK_SIZE`) is held to them:
//! misaligned requests fail cleanly with `EINVAL`. A client that did not
//! (or used `NBD_OPT_EXPORT_NAME`) is told a minimum of 1 and served at any
//! byte offset (`subblock`), as the spec asks of servers.

use std::io::{Read, Write};
use std::sync::Arc;

use sluice_volume::Volume;

use crate::access::{ClientIdentity, Grant};
use crate::proto::{self, ClientOption, Info, OptionHeader, OptionReply, ProtoError};
use crate::shared::{log_client, ConnError, Export, Shared};
use crate::stream::{ConnReader, Stream};
use crate::subblock::WriteOrder;

/// Options one client may send before it must pick an export.
pub const HANDSHAKE_OPTIONS_MAX: usize = 256;

/// The context id this server gives `base:allocation` when selected.
pub const BASE_ALLOCATION_ID: u32 = 1;

/// What the handshake settled for the transmission phase.
pub(crate) struct Session {
    pub(crate) export: Arc<dyn Volume>,
    /// Orders this export's sub-block read-modify-writes (`subblock`).
    pub(crate) order: Arc<WriteOrder>,
    /// The client never agreed to block sizes: any offset and length.
    pub(crate) byte_granular: bool,
    /// Writes, trims and zeroes are refused (EPERM).
    pub(crate) read_only: bool,
    pub(crate) structured: bool,
    /// `Some(id)` if `base:allocation` was selected for this export.
    pub(crate) base_allocation: Option<u32>,
}

/// Transmission flags for an export, given what was negotiated and
/// granted.
pub(crate) fn transmission_flags(structured: bool, read_only: bool) -> u16 {
    let mut f = proto::FLAG_HAS_FLAGS
        | proto::FLAG_SEND_FLUSH
        | proto::FLAG_SEND_FUA
        | proto::FLAG_SEND_TRIM
        | proto::FLAG_SEND_WRITE_ZEROES
        | proto::FLAG_SEND_FAST_ZERO
        | proto::FLAG_SEND_CACHE
        | proto::FLAG_CAN_MULTI_CONN;
    if structured {
        // Reads are always answered with one content chunk.
        f |= proto::FLAG_SEND_DF;
    }
    if read_only {
        f |= proto::FLAG_READ_ONLY;
    }
    f
}

struct State {
    /// The client's address, for log lines.
    peer: String,
    /// The names of the client's verified certificate (after STARTTLS).
    client: Option<ClientIdentity>,
    structured: bool,
    no_zeroes: bool,
    /// The export and whether `base:allocation` was selected by the last
    /// NBD_OPT_SET_META_CONTEXT (None: never sent, or it failed).
    meta: Option<(String, bool)>,
}

/// Runs the handshake. `Ok(None)` is a clean client abort.
pub(crate) fn negotiate(
    reader: &mut ConnReader,
    writer: &mut Stream,
    shared: &Shared,
) -> Result<Option<Session>, ConnError> {
    writer.set_read_timeout(Some(shared.opts.handshake_timeout))?;
    let offered = proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES;
    writer.write_all(&proto::encode_greeting(offered))?;
    let mut cf = [0u8; 4];
    reader.read_exact(&mut cf)?;
    let client_flags = proto::decode_client_flags(&cf, offered)?;
    let no_zeroes = client_flags & proto::FLAG_C_NO_ZEROES != 0;
    let peer = writer.peer();
    let mut st = State { peer: peer.clone(), client: None, structured: false, no_zeroes, meta: None };
    let mut tls_active = false;

    for _ in 0..HANDSHAKE_OPTIONS_MAX {
        let mut hb = [0u8; proto::OPTION_HEADER_BYTES];
        reader.read_exact(&mut hb)?;
        let hdr = match OptionHeader::decode(&hb) {
            Ok(h) => h,
            Err(e @ ProtoError::TooLong { .. }) => {
                // Say why before closing: the payload is not read.
                let option = u32::from_be_bytes(hb[8..12].try_into().expect("4 bytes"));
                reply(writer, option, proto::REP_ERR_TOO_BIG, e.to_string().as_bytes())?;
                return Err(e.into());
            }
            Err(e) => return Err(e.into()),
        };
        let mut data = vec![0u8; hdr.len as usize];
        reader.read_exact(&mut data)?;
        let is = |c: proto::OptionCode| hdr.option == c as u32;
        if shared.opts.tls_required && !tls_active && !is(proto::OptionCode::StartTls) && !is(proto::OptionCode::Abort)
        {
            if is(proto::OptionCode::ExportName) {
                return Err(ConnError::TlsRequired);
            }
            reply(writer, hdr.option, proto::REP_ERR_TLS_REQD, b"this server requires TLS: send NBD_OPT_STARTTLS")?;
            log_client(&peer, &format!("option {} without TLS: refused (TLS required)", hdr.option));
            continue;
        }
        if is(proto::OptionCode::StartTls) && !data.is_empty() {
            reply(writer, hdr.option, proto::REP_ERR_INVALID, b"STARTTLS takes no data")?;
            continue;
        }
        if is(proto::OptionCode::StartTls) {
            match (&shared.opts.tls, tls_active) {
                (None, _) => reply(writer, hdr.option, proto::REP_ERR_UNSUP, b"TLS is not configured on this server")?,
                (Some(_), true) => reply(writer, hdr.option, proto::REP_ERR_INVALID, b"TLS is already active")?,
                (Some(cfg), false) => {
                    reply(writer, hdr.option, proto::REP_ACK, &[])?;
                    let early = reader.buffer().to_vec();
                    let tls = crate::tls::TlsStream::accept(writer.socket().clone(), &early, cfg.clone())?;
                    let client = tls.client_identity().cloned();
                    // The reader keeps `tls` itself: it holds any bytes that
                    // came after the client's Finished (clones start empty).
                    *writer = Stream::Tls(tls.try_clone()?);
                    *reader = ConnReader::new(Stream::Tls(tls), reader.capacity());
                    tls_active = true;
                    st = State { peer: peer.clone(), client, structured: false, no_zeroes, meta: None };
                }
            }
            continue;
        }
        let opt = match ClientOption::parse(hdr.option, &data) {
            Ok(o) => o,
            Err(ProtoError::UnknownOption(o)) => {
                reply(writer, o, proto::REP_ERR_UNSUP, b"unknown option")?;
                continue;
            }
            Err(e) if hdr.option == proto::OptionCode::ExportName as u32 => return Err(e.into()),
            Err(e) => {
                if hdr.option == proto::OptionCode::SetMetaContext as u32 {
                    st.meta = None;
                }
                reply(writer, hdr.option, proto::REP_ERR_INVALID, e.to_string().as_bytes())?;
                continue;
            }
        };
        if let Some(session) = handle_option(opt, hdr.option, &mut st, writer, shared)? {
            writer.set_read_timeout(None)?;
            return Ok(Some(session));
        }
        if hdr.option == proto::OptionCode::Abort as u32 {
            return Ok(None);
        }
    }
    Err(ConnError::TooManyOptions(HANDSHAKE_OPTIONS_MAX))
}

fn reply(w: &mut Stream, option: u32, reply_type: u32, data: &[u8]) -> std::io::Result<()> {
    w.write_all(&OptionReply::encode(option, reply_type, data))
}

/// Answers one option; `Some` when the transmission phase starts.
fn handle_option(
    opt: ClientOption,
    code: u32,
    st: &mut State,
    w: &mut Stream,
    shared: &Shared,
) -> Result<Option<Session>, ConnError> {
    match opt {
        ClientOption::ExportName(name) => {
            let Some(export) = shared.find_export(&name) else {
                return Err(ConnError::UnknownExport(name));
            };
            let grant = shared.grant(export.volume.name(), st.client.as_ref());
            if grant == Grant::Refused {
                // EXPORT_NAME cannot carry an error: the connection closes
                // (and the refusal is logged with it).
                let client = client_name(st);
                return Err(ConnError::Refused { export: export.volume.name().to_owned(), client });
            }
            let read_only = grant == Grant::ReadOnly;
            let flags = transmission_flags(st.structured, read_only);
            w.write_all(&proto::encode_export_name_reply(export.volume.size_bytes(), flags, st.no_zeroes))?;
            return Ok(Some(session(export, st, true, read_only)));
        }
        ClientOption::Abort => {
            // The client may already have closed: an error here is no error.
            let _ = reply(w, code, proto::REP_ACK, &[]);
        }
        ClientOption::List => {
            for v in shared.exports.iter().map(|e| &e.volume) {
                reply(w, code, proto::REP_SERVER, &proto::encode_rep_server(v.name(), &shared.opts.description))?;
            }
            reply(w, code, proto::REP_ACK, &[])?;
        }
        ClientOption::StartTls => unreachable!("STARTTLS is answered in negotiate"),
        ClientOption::ExtendedHeaders => reply(w, code, proto::REP_ERR_UNSUP, b"extended headers not supported")?,
        ClientOption::StructuredReply => {
            st.structured = true;
            reply(w, code, proto::REP_ACK, &[])?;
        }
        ClientOption::Info { go, name, requests } => {
            let Some(export) = shared.find_export(&name) else {
                let msg = format!("no export named {name:?}");
                reply(w, code, proto::REP_ERR_UNKNOWN, msg.as_bytes())?;
                log_client(&st.peer, &format!("{msg}: refused (NBD_REP_ERR_UNKNOWN)"));
                return Ok(None);
            };
            let grant = shared.grant(export.volume.name(), st.client.as_ref());
            if grant == Grant::Refused {
                let msg = format!("client {} may not use export {:?}", client_name(st), export.volume.name());
                log_client(&st.peer, &format!("{msg}: refused (NBD_REP_ERR_POLICY)"));
                reply(w, code, proto::REP_ERR_POLICY, msg.as_bytes())?;
                return Ok(None);
            }
            let read_only = grant == Grant::ReadOnly;
            let flags = transmission_flags(st.structured, read_only);
            let (min, preferred, max) = shared.block_sizes(export.volume.as_ref());
            // Not asked for: any byte offset is served, and the minimum says so.
            let byte_granular = !requests.contains(&proto::INFO_BLOCK_SIZE);
            let min = if byte_granular { 1 } else { min };
            let mut infos = vec![
                Info::Export { size_bytes: export.volume.size_bytes(), transmission_flags: flags },
                Info::BlockSize { min, preferred, max },
            ];
            if requests.contains(&proto::INFO_NAME) {
                infos.push(Info::Name(export.volume.name().to_owned()));
            }
            if requests.contains(&proto::INFO_DESCRIPTION) {
                infos.push(Info::Description(shared.opts.description.clone()));
            }
            for i in infos {
                reply(w, code, proto::REP_INFO, &i.encode())?;
            }
            reply(w, code, proto::REP_ACK, &[])?;
            if go {
                return Ok(Some(session(export, st, byte_granular, read_only)));
            }
        }
        ClientOption::MetaContext { set, export, queries } => {
            if set {
                // Whatever happens below replaces the previous selection.
                st.meta = None;
                if !st.structured {
                    reply(w, code, proto::REP_ERR_INVALID, b"negotiate structured replies first")?;
                    return Ok(None);
                }
            }
            let Some(v) = shared.find_export(&export).map(|e| &e.volume) else {
                let msg = format!("no export named {export:?}");
                reply(w, code, proto::REP_ERR_UNKNOWN, msg.as_bytes())?;
                log_client(&st.peer, &format!("{msg}: refused (NBD_REP_ERR_UNKNOWN)"));
                return Ok(None);
            };
            let matched = if set {
                queries.iter().any(|q| q == proto::META_BASE_ALLOCATION)
            } else {
                queries.is_empty() || queries.iter().any(|q| q == "base:" || q == proto::META_BASE_ALLOCATION)
            };
            if matched {
                let id = if set { BASE_ALLOCATION_ID } else { 0 };
                reply(
                    w,
                    code,
                    proto::REP_META_CONTEXT,
                    &proto::encode_rep_meta_context(id, proto::META_BASE_ALLOCATION),
                )?;
            }
            if set {
                st.meta = Some((v.name().to_owned(), matched));
            }
            reply(w, code, proto::REP_ACK, &[])?;
        }
    }
    Ok(None)
}

/// How a client is named in refusals: its certificate's names, or that it
/// has none.
fn client_name(st: &State) -> String {
    match &st.client {
        Some(c) => format!("{:?}", c.to_string()),
        None => "without a verified certificate".to_owned(),
    }
}

fn session(export: &Export, st: &State, byte_granular: bool, read_only: bool) -> Session {
    let base_allocation = match &st.meta {
        Some((name, true)) if st.structured && name == export.volume.name() => Some(BASE_ALLOCATION_ID),
        _ => None,
    };
    Session {
        export: export.volume.clone(),
        order: export.order.clone(),
        byte_granular,
        read_only,
        structured: st.structured,
        base_allocation,
    }
}

//! Fuzzes the NBD wire format as the server meets it: a client's byte
//! stream is split the way the server splits it (greeting flags, option
//! headers and payloads, then request headers and write payloads), every
//! piece goes through the same decoders, and whatever decodes must
//! re-encode to the same bytes. Reply decoders (used by our test clients)
//! get the same treatment. A panic, an out-of-bounds slice or a round trip
//! that changes a value is a finding.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_frontend::proto::{
    self, Chunk, ChunkHeader, ClientOption, Info, OptionHeader, OptionReply, RequestHeader, SimpleReply,
};

/// Takes `n` bytes off the front of `data`, or None when fewer remain.
fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, rest) = data.split_at(n);
    *data = rest;
    Some(head)
}

/// The option haggling: header, then at most `len` payload bytes, parsed.
/// Returns false when the stream would end the handshake.
fn option(data: &mut &[u8]) -> bool {
    let Some(hb) = take(data, proto::OPTION_HEADER_BYTES) else { return false };
    let Ok(hdr) = OptionHeader::decode(hb) else { return false };
    assert!(hdr.len <= proto::OPTION_DATA_BYTES_MAX);
    assert_eq!(&hdr.encode()[..], hb);
    let Some(payload) = take(data, hdr.len as usize) else { return false };
    if let Ok(opt) = ClientOption::parse(hdr.option, payload) {
        // What the server understood is what a client meant: encoding the
        // parsed option yields the same header and payload (but for ABORT,
        // whose data the spec says to ignore).
        if opt == ClientOption::Abort {
            return false;
        }
        let enc = opt.encode();
        assert_eq!(&enc[proto::OPTION_HEADER_BYTES..], payload, "{opt:?}");
        assert_eq!(OptionHeader::decode(&enc[..proto::OPTION_HEADER_BYTES]).ok(), Some(hdr));
    }
    hdr.option != proto::OptionCode::Abort as u32
}

/// The transmission phase: request headers and write payloads.
fn requests(data: &mut &[u8], structured: bool) {
    while let Some(hb) = take(data, proto::REQUEST_HEADER_BYTES) {
        let Ok(h) = RequestHeader::decode(hb) else { return };
        assert_eq!(&h.encode()[..], hb);
        if let Ok(cmd) = h.validate(structured) {
            assert_eq!(h.command().ok(), Some(cmd));
            assert_eq!(cmd.valid_flags(structured) | h.flags, cmd.valid_flags(structured));
        }
        if take(data, h.payload_len().min(1 << 16) as usize).is_none() {
            return;
        }
    }
}

/// Reply decoders: a simple reply, a structured chunk, an option reply and
/// an info payload, each re-encoded when it decodes.
fn replies(data: &[u8]) {
    if let Some(b) = data.get(..proto::SIMPLE_REPLY_BYTES) {
        if let Ok(r) = SimpleReply::decode(b) {
            assert_eq!(&r.encode()[..], b);
        }
    }
    if data.len() >= proto::STRUCTURED_HEADER_BYTES {
        let (hb, payload) = data.split_at(proto::STRUCTURED_HEADER_BYTES);
        if let Ok(h) = ChunkHeader::decode(hb) {
            if let Ok(c) = Chunk::decode(&h, payload) {
                let enc = c.encode(h.cookie, h.is_done());
                assert_eq!(&enc[proto::STRUCTURED_HEADER_BYTES..], payload, "{c:?}");
            }
        }
    }
    if let Ok(r) = OptionReply::decode(data) {
        assert_eq!(OptionReply::encode(r.option, r.reply_type, &r.data), data);
        if let Ok(Some(info)) = Info::decode(&r.data) {
            assert_eq!(info.encode(), r.data, "{info:?}");
        }
    }
    let _ = proto::decode_rep_server(data);
    let _ = proto::decode_rep_meta_context(data);
}

fuzz_target!(|input: &[u8]| {
    let Some((&selector, mut data)) = input.split_first() else { return };
    replies(data);
    let Some(cf) = take(&mut data, 4) else { return };
    let offered = proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES;
    if proto::decode_client_flags(cf, offered).is_err() {
        return;
    }
    for _ in 0..(selector % 8) {
        if !option(&mut data) {
            return;
        }
    }
    requests(&mut data, selector & 0x80 != 0);
});

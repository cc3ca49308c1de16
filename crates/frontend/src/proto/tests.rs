//! Byte-level round trips and rejection of malformed input.

use super::*;

#[test]
fn greeting_bytes_and_round_trip() {
    let g = encode_greeting(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    assert_eq!(&g[..8], b"NBDMAGIC");
    assert_eq!(&g[8..16], b"IHAVEOPT");
    assert_eq!(&g[16..], &[0, 3]);
    assert_eq!(decode_greeting(&g), Ok(3));
    let mut bad = g;
    bad[0] = b'X';
    assert!(matches!(decode_greeting(&bad), Err(ProtoError::BadMagic { .. })));
    assert!(matches!(decode_greeting(&g[..10]), Err(ProtoError::Truncated { .. })));
}

#[test]
fn client_flags_rejects_unknown_and_unoffered() {
    assert_eq!(decode_client_flags(&[0, 0, 0, 3], FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES), Ok(3));
    assert_eq!(decode_client_flags(&[0, 0, 0, 2], FLAG_FIXED_NEWSTYLE), Err(ProtoError::UnknownClientFlags(2)));
    assert_eq!(decode_client_flags(&[0, 0, 0, 4], 3), Err(ProtoError::UnknownClientFlags(4)));
    assert!(matches!(decode_client_flags(&[0, 0, 1], 3), Err(ProtoError::Truncated { .. })));
}

#[test]
fn option_header_bytes() {
    let h = OptionHeader { option: 7, len: 10 };
    let b = h.encode();
    assert_eq!(&b[..8], b"IHAVEOPT");
    assert_eq!(&b[8..], &[0, 0, 0, 7, 0, 0, 0, 10]);
    assert_eq!(OptionHeader::decode(&b), Ok(h));
    let too_long = OptionHeader { option: 7, len: OPTION_DATA_BYTES_MAX + 1 }.encode();
    assert!(matches!(OptionHeader::decode(&too_long), Err(ProtoError::TooLong { .. })));
    let mut bad = b;
    bad[3] ^= 1;
    assert!(matches!(OptionHeader::decode(&bad), Err(ProtoError::BadMagic { .. })));
}

#[test]
fn options_round_trip() {
    let opts = [
        ClientOption::ExportName("default".into()),
        ClientOption::ExportName(String::new()),
        ClientOption::Abort,
        ClientOption::List,
        ClientOption::StartTls,
        ClientOption::StructuredReply,
        ClientOption::ExtendedHeaders,
        ClientOption::Info { go: false, name: "a".into(), requests: vec![] },
        ClientOption::Info { go: true, name: "vol".into(), requests: vec![INFO_BLOCK_SIZE, INFO_NAME] },
        ClientOption::MetaContext { set: true, export: "x".into(), queries: vec![META_BASE_ALLOCATION.into()] },
        ClientOption::MetaContext { set: false, export: "".into(), queries: vec![] },
    ];
    for o in opts {
        let b = o.encode();
        let h = OptionHeader::decode(&b[..OPTION_HEADER_BYTES]).unwrap();
        assert_eq!(h.len as usize, b.len() - OPTION_HEADER_BYTES);
        assert_eq!(ClientOption::parse(h.option, &b[OPTION_HEADER_BYTES..]), Ok(o));
    }
}

#[test]
fn go_option_exact_bytes() {
    let o = ClientOption::Info { go: true, name: "ab".into(), requests: vec![3] };
    let b = o.encode();
    assert_eq!(&b[8..16], &[0, 0, 0, 7, 0, 0, 0, 10]);
    assert_eq!(&b[16..], &[0, 0, 0, 2, b'a', b'b', 0, 1, 0, 3]);
}

#[test]
fn bad_options_are_rejected() {
    assert_eq!(ClientOption::parse(4, &[]), Err(ProtoError::UnknownOption(4)));
    assert_eq!(ClientOption::parse(99, &[]), Err(ProtoError::UnknownOption(99)));
    assert!(matches!(ClientOption::parse(3, &[1]), Err(ProtoError::TrailingBytes { .. })));
    assert!(matches!(ClientOption::parse(8, &[1]), Err(ProtoError::TrailingBytes { .. })));
    // GO: name length larger than the payload.
    assert!(matches!(ClientOption::parse(7, &[0, 0, 0, 9, b'a', 0, 0]), Err(ProtoError::LengthMismatch { .. })));
    // GO: info count disagrees with the remaining bytes.
    assert!(matches!(ClientOption::parse(7, &[0, 0, 0, 1, b'a', 0, 2, 0, 1]), Err(ProtoError::LengthMismatch { .. })));
    // GO: truncated before the info count.
    assert!(matches!(ClientOption::parse(7, &[0, 0, 0, 1, b'a']), Err(ProtoError::Truncated { .. })));
    // Export name with NUL or invalid UTF-8.
    assert!(matches!(ClientOption::parse(1, b"a\0b"), Err(ProtoError::BadString { .. })));
    assert!(matches!(ClientOption::parse(1, &[0xff, 0xfe]), Err(ProtoError::BadString { .. })));
    // Export name longer than 4096 bytes.
    assert!(matches!(ClientOption::parse(1, &[b'a'; 5000]), Err(ProtoError::TooLong { .. })));
    // Meta context: a huge query count cannot allocate.
    assert!(matches!(
        ClientOption::parse(10, &[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff]),
        Err(ProtoError::LengthMismatch { .. })
    ));
    // Meta context: query length beyond the payload.
    assert!(matches!(
        ClientOption::parse(9, &[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, b'b']),
        Err(ProtoError::LengthMismatch { .. })
    ));
    // Meta context: trailing garbage.
    assert!(matches!(ClientOption::parse(9, &[0, 0, 0, 0, 0, 0, 0, 0, 7]), Err(ProtoError::TrailingBytes { .. })));
    let big = vec![0u8; OPTION_DATA_BYTES_MAX as usize + 1];
    assert!(matches!(ClientOption::parse(1, &big), Err(ProtoError::TooLong { .. })));
}

#[test]
fn option_reply_round_trip() {
    let b = OptionReply::encode(7, REP_ERR_UNKNOWN, b"nope");
    assert_eq!(&b[..8], &OPT_REPLY_MAGIC.to_be_bytes());
    let r = OptionReply::decode(&b).unwrap();
    assert_eq!(r, OptionReply { option: 7, reply_type: REP_ERR_UNKNOWN, data: b"nope".to_vec() });
    assert!(r.is_error());
    assert!(matches!(OptionReply::decode(&b[..b.len() - 1]), Err(ProtoError::LengthMismatch { .. })));
    assert!(matches!(OptionReply::decode(&b[..5]), Err(ProtoError::Truncated { .. })));
}

#[test]
fn info_round_trip() {
    let infos = [
        Info::Export { size_bytes: 1 << 40, transmission_flags: 0x0d6f },
        Info::Name("vol".into()),
        Info::Description("a volume".into()),
        Info::BlockSize { min: 4096, preferred: 4096, max: 32 << 20 },
    ];
    for i in infos {
        assert_eq!(Info::decode(&i.encode()), Ok(Some(i)));
    }
    let e = Info::Export { size_bytes: 1, transmission_flags: 1 }.encode();
    assert_eq!(e.len(), 12);
    assert!(matches!(Info::decode(&e[..11]), Err(ProtoError::Truncated { .. })));
    assert_eq!(Info::decode(&[0, 9, 1, 2]), Ok(None));
    assert_eq!(Info::BlockSize { min: 1, preferred: 2, max: 3 }.encode().len(), 14);
}

#[test]
fn rep_server_and_meta_context_round_trip() {
    let d = encode_rep_server("default", "desc");
    assert_eq!(decode_rep_server(&d), Ok(("default".into(), "desc".into())));
    assert!(decode_rep_server(&[0, 0, 0, 9, b'a']).is_err());
    let m = encode_rep_meta_context(1, META_BASE_ALLOCATION);
    assert_eq!(decode_rep_meta_context(&m), Ok((1, META_BASE_ALLOCATION.into())));
    assert!(decode_rep_meta_context(&[0, 0]).is_err());
}

#[test]
fn export_name_reply_zeroes() {
    assert_eq!(encode_export_name_reply(5, 1, false).len(), 134);
    assert_eq!(encode_export_name_reply(5, 1, true), vec![0, 0, 0, 0, 0, 0, 0, 5, 0, 1]);
}

#[test]
fn request_exact_bytes_and_round_trip() {
    let h = RequestHeader { flags: CMD_FLAG_FUA, command: 1, cookie: 0x0102030405060708, offset: 4096, len: 512 };
    let b = h.encode();
    assert_eq!(b, [0x25, 0x60, 0x95, 0x13, 0, 1, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0, 2, 0]);
    assert_eq!(RequestHeader::decode(&b), Ok(h));
    assert_eq!(h.validate(false), Ok(Command::Write));
    assert_eq!(h.payload_len(), 512);
    let mut bad = b;
    bad[0] = 0;
    assert!(matches!(RequestHeader::decode(&bad), Err(ProtoError::BadMagic { .. })));
    assert!(matches!(RequestHeader::decode(&b[..27]), Err(ProtoError::Truncated { .. })));
    assert!(matches!(RequestHeader::decode(&[b.as_slice(), &[0]].concat()), Err(ProtoError::TrailingBytes { .. })));
}

#[test]
fn request_validation() {
    let mk = |command, flags| RequestHeader { flags, command, cookie: 1, offset: 0, len: 0 };
    assert_eq!(mk(9, 0).validate(true), Err(ProtoError::UnknownCommand(9)));
    assert_eq!(mk(0, CMD_FLAG_DF).validate(true), Ok(Command::Read));
    assert!(matches!(mk(0, CMD_FLAG_DF).validate(false), Err(ProtoError::BadFlags { .. })));
    assert_eq!(mk(3, CMD_FLAG_FUA).validate(false), Ok(Command::Flush));
    assert_eq!(mk(6, CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO | CMD_FLAG_FUA).validate(false), Ok(Command::WriteZeroes));
    assert!(matches!(mk(1, CMD_FLAG_NO_HOLE).validate(true), Err(ProtoError::BadFlags { .. })));
    assert_eq!(mk(7, CMD_FLAG_REQ_ONE).validate(true), Ok(Command::BlockStatus));
    assert!(matches!(mk(5, 1 << 5).validate(true), Err(ProtoError::BadFlags { .. })));
    assert_eq!(mk(0, 0).payload_len(), 0);
}

#[test]
fn simple_reply_round_trip() {
    let r = SimpleReply { error: EINVAL, cookie: 42 };
    let b = r.encode();
    assert_eq!(&b[..8], &[0x67, 0x44, 0x66, 0x98, 0, 0, 0, 22]);
    assert_eq!(SimpleReply::decode(&b), Ok(r));
    assert!(SimpleReply::decode(&b[1..]).is_err());
}

#[test]
fn chunks_round_trip() {
    let chunks = [
        Chunk::None,
        Chunk::OffsetData { offset: 8192, data: vec![7; 100] },
        Chunk::OffsetHole { offset: 0, len: 4096 },
        Chunk::BlockStatus { context_id: 1, descriptors: vec![(4096, 0), (8192, STATE_HOLE | STATE_ZERO)] },
        Chunk::Error { error: EIO, message: "boom".into() },
        Chunk::ErrorOffset { error: EIO, message: String::new(), offset: 4096 },
    ];
    for c in chunks {
        let b = c.encode(99, true);
        let h = ChunkHeader::decode(&b[..STRUCTURED_HEADER_BYTES]).unwrap();
        assert!(h.is_done());
        assert_eq!(h.cookie, 99);
        assert_eq!(Chunk::decode(&h, &b[STRUCTURED_HEADER_BYTES..]), Ok(c));
    }
}

#[test]
fn offset_data_prefix_matches_chunk_encoding() {
    let data = vec![5u8; 64];
    let mut b = vec![0u8; OFFSET_DATA_PREFIX_BYTES + data.len()];
    encode_offset_data_prefix(&mut b, 3, 4096, data.len() as u32, true);
    b[OFFSET_DATA_PREFIX_BYTES..].copy_from_slice(&data);
    assert_eq!(b, Chunk::OffsetData { offset: 4096, data }.encode(3, true));
}

#[test]
fn bad_chunks_are_rejected() {
    let h = |chunk_type, len| ChunkHeader { flags: 1, chunk_type, cookie: 0, len };
    assert!(matches!(Chunk::decode(&h(1, 8), &[0; 8]), Err(ProtoError::Truncated { .. })));
    assert!(matches!(Chunk::decode(&h(5, 4), &[0; 4]), Err(ProtoError::LengthMismatch { .. })));
    assert!(matches!(Chunk::decode(&h(5, 10), &[0; 10]), Err(ProtoError::LengthMismatch { .. })));
    assert!(matches!(Chunk::decode(&h(0, 1), &[0]), Err(ProtoError::TrailingBytes { .. })));
    assert!(matches!(Chunk::decode(&h(77, 0), &[]), Err(ProtoError::UnknownReplyType(77))));
    assert!(matches!(Chunk::decode(&h(0, 3), &[]), Err(ProtoError::LengthMismatch { .. })));
    // Error message length beyond the payload.
    let e = [0, 0, 0, 5, 0, 9, b'x'];
    assert!(matches!(Chunk::decode(&h(REPLY_TYPE_ERROR, 7), &e), Err(ProtoError::LengthMismatch { .. })));
    let mut bad = Chunk::None.encode(0, true);
    bad[0] = 0;
    assert!(matches!(ChunkHeader::decode(&bad), Err(ProtoError::BadMagic { .. })));
}

#[test]
fn long_error_messages_are_cut_at_a_char_boundary() {
    let msg = "é".repeat(3000); // 6000 bytes
    let b = Chunk::Error { error: EIO, message: msg }.encode(0, true);
    let h = ChunkHeader::decode(&b[..STRUCTURED_HEADER_BYTES]).unwrap();
    match Chunk::decode(&h, &b[STRUCTURED_HEADER_BYTES..]).unwrap() {
        Chunk::Error { message, .. } => assert_eq!(message.len(), 4096),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn decoders_never_panic_on_prefixes_of_valid_messages() {
    let msgs: Vec<Vec<u8>> = vec![
        ClientOption::Info { go: true, name: "vol".into(), requests: vec![1, 3] }.encode(),
        ClientOption::MetaContext { set: true, export: "vol".into(), queries: vec!["base:".into()] }.encode(),
        RequestHeader { flags: 0, command: 0, cookie: 1, offset: 2, len: 3 }.encode().to_vec(),
        Chunk::BlockStatus { context_id: 1, descriptors: vec![(1, 2)] }.encode(0, true),
    ];
    for m in msgs {
        for n in 0..m.len() {
            let p = &m[..n];
            let _ = OptionHeader::decode(p);
            let _ = RequestHeader::decode(p);
            let _ = ChunkHeader::decode(p);
            let _ = OptionReply::decode(p);
            let _ = Info::decode(p);
            for code in 0..13 {
                let _ = ClientOption::parse(code, p);
                let _ = ClientOption::parse(code, p.get(OPTION_HEADER_BYTES.min(n)..).unwrap_or(&[]));
            }
            let h = ChunkHeader { flags: 0, chunk_type: REPLY_TYPE_BLOCK_STATUS, cookie: 0, len: n as u32 };
            let _ = Chunk::decode(&h, p);
        }
    }
}

#[test]
fn decoders_never_panic_on_random_bytes() {
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..20_000 {
        let len = (next() % 64) as usize;
        let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
        // Often start with a valid magic so the decoders get past it.
        match next() % 4 {
            0 if len >= 8 => b[..8].copy_from_slice(&IHAVEOPT.to_be_bytes()),
            1 if len >= 4 => b[..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes()),
            2 if len >= 4 => b[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes()),
            _ => {}
        }
        let _ = decode_greeting(&b);
        let _ = decode_client_flags(&b, 3);
        let _ = OptionHeader::decode(&b);
        let _ = OptionReply::decode(&b);
        let _ = Info::decode(&b);
        let _ = decode_rep_server(&b);
        let _ = decode_rep_meta_context(&b);
        let _ = ClientOption::parse((next() % 13) as u32, &b);
        if let Ok(h) = RequestHeader::decode(&b) {
            let _ = h.validate(next() % 2 == 0);
        }
        let _ = SimpleReply::decode(&b);
        let _ = ChunkHeader::decode(&b);
        let h = ChunkHeader { flags: 0, chunk_type: (next() % 6) as u16, cookie: 0, len: len as u32 };
        let _ = Chunk::decode(&h, &b);
        let h = ChunkHeader { flags: 0, chunk_type: REPLY_TYPE_ERROR_OFFSET, cookie: 0, len: len as u32 };
        let _ = Chunk::decode(&h, &b);
    }
}

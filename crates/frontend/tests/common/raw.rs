//! A byte-level NBD client over a raw `TcpStream`, built on the crate's own
//! `proto` encoders, for sending exactly the (mis)behaviour a test wants.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use sluice_frontend::proto::{self, Chunk, ChunkHeader, ClientOption, Info, OptionReply, RequestHeader, SimpleReply};

pub struct Raw {
    pub s: TcpStream,
}

/// One reply as the client sees it.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    Simple { error: u32, cookie: u64 },
    Chunk { cookie: u64, done: bool, chunk: Chunk },
}

impl Raw {
    /// Connects and reads the greeting; sends the client flags.
    pub fn connect(port: u16, client_flags: u32) -> Raw {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        // A header and its payload go out in two sends: no Nagle wait.
        s.set_nodelay(true).expect("nodelay");
        let mut r = Raw { s };
        let mut g = [0u8; proto::GREETING_BYTES];
        r.s.read_exact(&mut g).expect("greeting");
        let flags = proto::decode_greeting(&g).expect("valid greeting");
        assert_eq!(flags, proto::FLAG_FIXED_NEWSTYLE | proto::FLAG_NO_ZEROES);
        r.send(&client_flags.to_be_bytes());
        r
    }

    pub fn send(&mut self, b: &[u8]) {
        self.s.write_all(b).expect("send");
    }

    pub fn option(&mut self, o: &ClientOption) {
        self.send(&o.encode());
    }

    pub fn option_reply(&mut self) -> OptionReply {
        let mut h = [0u8; proto::OPTION_REPLY_HEADER_BYTES];
        self.s.read_exact(&mut h).expect("option reply header");
        let (option, reply_type, len) = OptionReply::decode_header(&h).expect("valid option reply");
        let mut data = vec![0u8; len as usize];
        self.s.read_exact(&mut data).expect("option reply data");
        OptionReply { option, reply_type, data }
    }

    /// Full handshake to transmission with GO, asking for block sizes;
    /// returns (size, flags).
    pub fn go(port: u16, export: &str, structured: bool, meta: bool) -> (Raw, u64, u16) {
        let (r, size, flags, _) = Raw::go_asking(port, export, structured, meta, &[proto::INFO_BLOCK_SIZE]);
        (r, size, flags)
    }

    /// As `go`, with the given info requests; also returns the block sizes
    /// (min, preferred, max) if the server sent them.
    pub fn go_asking(
        port: u16,
        export: &str,
        structured: bool,
        meta: bool,
        requests: &[u16],
    ) -> (Raw, u64, u16, Option<(u32, u32, u32)>) {
        let mut r = Raw::connect(port, proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES);
        if structured {
            r.option(&ClientOption::StructuredReply);
            assert_eq!(r.option_reply().reply_type, proto::REP_ACK);
        }
        if meta {
            r.option(&ClientOption::MetaContext {
                set: true,
                export: export.into(),
                queries: vec![proto::META_BASE_ALLOCATION.into()],
            });
            assert_eq!(r.option_reply().reply_type, proto::REP_META_CONTEXT);
            assert_eq!(r.option_reply().reply_type, proto::REP_ACK);
        }
        r.option(&ClientOption::Info { go: true, name: export.into(), requests: requests.to_vec() });
        let (mut size, mut flags, mut sizes) = (None, 0, None);
        loop {
            let rep = r.option_reply();
            match rep.reply_type {
                proto::REP_INFO => match Info::decode(&rep.data).expect("valid info") {
                    Some(Info::Export { size_bytes, transmission_flags }) => {
                        size = Some(size_bytes);
                        flags = transmission_flags;
                    }
                    Some(Info::BlockSize { min, preferred, max }) => sizes = Some((min, preferred, max)),
                    _ => {}
                },
                proto::REP_ACK => break,
                other => panic!("GO failed with reply type {other:#x}"),
            }
        }
        (r, size.expect("NBD_INFO_EXPORT sent"), flags, sizes)
    }

    pub fn request(&mut self, command: u16, flags: u16, cookie: u64, offset: u64, len: u32) {
        self.send(&RequestHeader { flags, command, cookie, offset, len }.encode());
    }

    /// Reads a reply; `data_len` is the payload a successful simple read reply carries.
    pub fn reply(&mut self, data_len: usize) -> (Reply, Vec<u8>) {
        let mut m = [0u8; 4];
        self.s.read_exact(&mut m).expect("reply magic");
        let magic = u32::from_be_bytes(m);
        if magic == proto::SIMPLE_REPLY_MAGIC {
            let mut rest = [0u8; proto::SIMPLE_REPLY_BYTES];
            rest[..4].copy_from_slice(&m);
            self.s.read_exact(&mut rest[4..]).expect("simple reply");
            let r = SimpleReply::decode(&rest).expect("valid simple reply");
            let mut data = Vec::new();
            if r.error == 0 && data_len > 0 {
                data = vec![0u8; data_len];
                self.s.read_exact(&mut data).expect("read data");
            }
            (Reply::Simple { error: r.error, cookie: r.cookie }, data)
        } else {
            let mut hb = [0u8; proto::STRUCTURED_HEADER_BYTES];
            hb[..4].copy_from_slice(&m);
            self.s.read_exact(&mut hb[4..]).expect("chunk header");
            let h = ChunkHeader::decode(&hb).expect("valid chunk header");
            let mut p = vec![0u8; h.len as usize];
            self.s.read_exact(&mut p).expect("chunk payload");
            let chunk = Chunk::decode(&h, &p).expect("valid chunk");
            (Reply::Chunk { cookie: h.cookie, done: h.is_done(), chunk }, Vec::new())
        }
    }

    /// The errno of a reply (0 for success), simple or structured.
    pub fn errno_of(reply: &Reply) -> u32 {
        match reply {
            Reply::Simple { error, .. } => *error,
            Reply::Chunk { chunk: Chunk::Error { error, .. } | Chunk::ErrorOffset { error, .. }, .. } => *error,
            Reply::Chunk { .. } => 0,
        }
    }

    /// True once the server has closed the connection (EOF or reset).
    pub fn closed_by_server(&mut self) -> bool {
        let mut b = [0u8; 1];
        match self.s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
        }
    }
}

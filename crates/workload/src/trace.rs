//! Replay input: a simple CSV block trace.
//!
//! Owns: the trace format, [`TraceRecord`], the streaming [`TraceReader`] and [`parse_trace`].
//!
//! Format: one record per line, `timestamp_us,op,offset,size` — timestamp in microseconds, `op` one of
//! `R`/`W`/`T`/`F` (read, write, trim, flush; case-insensitive, the words `read`/`write`/`trim`/`flush`
//! are accepted too), offset and size in bytes (decimal or `0x` hex). Fields may be padded with
//! spaces. Blank lines and lines starting with `#` are skipped. The first data line may instead be a
//! header (recognised because its first field does not start with a digit), e.g.
//! `timestamp_us,op,offset,size`.
//!
//! Invariants:
//! - Records come back in file order; timestamps are not sorted or checked for monotonicity
//!   (multi-queue traces interleave), that is the replayer's policy.
//! - `offset + size` never overflows 64 bits.
//! - Every error names its 1-based line number; after an error the reader continues with the next line,
//!   so a caller may choose to skip bad lines.
//!
//! Why: blktrace/fio iolog converters and hand-written tests all reduce easily to this minimal CSV;
//! keeping it line-oriented lets multi-gigabyte traces stream through [`TraceReader`] without loading.

use std::io::{self, BufRead};

use serde::{Deserialize, Serialize};

use crate::job::parse_uint;

/// Operation of a trace record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum TraceOp {
    Read,
    Write,
    Trim,
    Flush,
}

/// One trace line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRecord {
    pub timestamp_us: u64,
    pub op: TraceOp,
    pub offset: u64,
    pub size: u64,
}

/// The layouts a trace file may have (docs/workloads.md, "Traces").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TraceFormat {
    /// Sluice's own: `timestamp_us,op,offset,size`.
    #[default]
    Csv,
    /// MSR Cambridge (SNIA IOTTA): `Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime`,
    /// the timestamp in Windows filetime ticks (100 ns), `Type` `Read` or `Write`.
    Msr,
    /// The UCARE Heimdall cut of MSR and other traces: whitespace-separated
    /// `ts_ms devno offset size op`, `ts_ms` in (fractional) milliseconds,
    /// op 1 read, 0 write.
    Heimdall,
    /// CloudPhysics' binary vscsi traces (SNIA IOTTA), version 1 (32-byte
    /// records) or 2 (40-byte), told apart by the first record's version
    /// byte; little-endian; address in 512-byte sectors, length in bytes,
    /// timestamp in microseconds; SCSI READ/WRITE (6, 10, 12, 16) become
    /// reads and writes, SYNCHRONIZE CACHE a flush, other commands are
    /// skipped. Errors name the record (from 1), not a line.
    Vscsi,
}

impl std::str::FromStr for TraceFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "csv" => Ok(TraceFormat::Csv),
            "msr" => Ok(TraceFormat::Msr),
            "heimdall" => Ok(TraceFormat::Heimdall),
            "vscsi" => Ok(TraceFormat::Vscsi),
            _ => Err(format!("trace format {s:?}: csv, msr, heimdall or vscsi")),
        }
    }
}

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TraceLineError {
    #[error("expected 4 comma-separated fields (timestamp_us,op,offset,size), found {0}")]
    FieldCount(usize),
    #[error("bad timestamp {0:?}")]
    BadTimestamp(String),
    #[error("unknown op {0:?} (expected R, W, T, F, read, write, trim or flush)")]
    BadOp(String),
    #[error("bad offset {0:?}")]
    BadOffset(String),
    #[error("bad size {0:?}")]
    BadSize(String),
    #[error("offset {offset} + size {size} overflows 64 bits")]
    Overflow { offset: u64, size: u64 },
    #[error("expected {expected}, found {found} fields")]
    Fields { expected: &'static str, found: usize },
    #[error("not a vscsi trace: record version byte {0:#04x} (1 or 2 expected)")]
    VscsiVersion(u8),
    #[error("vscsi record cut short: {0} of its bytes")]
    VscsiTruncated(usize),
}

/// A trace error with its line number.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TraceError {
    #[error("trace line {line}: {kind}")]
    Line { line: usize, kind: TraceLineError },
    #[error("trace line {line}: read error: {source}")]
    Io {
        line: usize,
        #[source]
        source: io::Error,
    },
}

impl TraceError {
    /// 1-based line number of the error.
    pub fn line(&self) -> usize {
        match self {
            TraceError::Line { line, .. } | TraceError::Io { line, .. } => *line,
        }
    }
}

fn parse_op(s: &str) -> Result<TraceOp, TraceLineError> {
    Ok(match s.to_ascii_lowercase().as_str() {
        "r" | "read" => TraceOp::Read,
        "w" | "write" => TraceOp::Write,
        "t" | "trim" => TraceOp::Trim,
        "f" | "flush" => TraceOp::Flush,
        _ => return Err(TraceLineError::BadOp(s.into())),
    })
}

/// What a line turned out to be.
enum Line {
    Skip,
    Header,
    Record(TraceRecord),
}

/// A record from its parsed parts, checked.
fn record(timestamp_us: u64, op: TraceOp, offset: u64, size: u64) -> Result<Line, TraceLineError> {
    if offset.checked_add(size).is_none() {
        return Err(TraceLineError::Overflow { offset, size });
    }
    Ok(Line::Record(TraceRecord { timestamp_us, op, offset, size }))
}

fn parse_foreign(line: &str, format: TraceFormat, header_allowed: bool) -> Result<Line, TraceLineError> {
    let uint = |v: &str, bad: fn(String) -> TraceLineError| v.parse::<u64>().map_err(|_| bad(v.into()));
    match format {
        TraceFormat::Csv | TraceFormat::Vscsi => unreachable!("parsed by parse_line or VscsiRecords"),
        TraceFormat::Msr => {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if header_allowed && !f[0].starts_with(|c: char| c.is_ascii_digit()) {
                return Ok(Line::Header);
            }
            let [ts, _host, _disk, op, offset, size, _resp] = f.as_slice() else {
                return Err(TraceLineError::Fields {
                    expected: "7 (Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime)",
                    found: f.len(),
                });
            };
            let op = match op.to_ascii_lowercase().as_str() {
                "read" => TraceOp::Read,
                "write" => TraceOp::Write,
                _ => return Err(TraceLineError::BadOp((*op).into())),
            };
            let ticks = uint(ts, TraceLineError::BadTimestamp)?;
            record(ticks / 10, op, uint(offset, TraceLineError::BadOffset)?, uint(size, TraceLineError::BadSize)?)
        }
        TraceFormat::Heimdall => {
            let f: Vec<&str> = line.split_whitespace().collect();
            let [ts, _dev, offset, size, op] = f.as_slice() else {
                return Err(TraceLineError::Fields { expected: "5 (ts_ms devno offset size op)", found: f.len() });
            };
            let ms: f64 = ts.parse().map_err(|_| TraceLineError::BadTimestamp((*ts).into()))?;
            if !(ms.is_finite() && ms >= 0.0) {
                return Err(TraceLineError::BadTimestamp((*ts).into()));
            }
            let op = match *op {
                "1" => TraceOp::Read,
                "0" => TraceOp::Write,
                _ => return Err(TraceLineError::BadOp((*op).into())),
            };
            record(
                (ms * 1000.0).round() as u64,
                op,
                uint(offset, TraceLineError::BadOffset)?,
                uint(size, TraceLineError::BadSize)?,
            )
        }
    }
}

fn parse_line(raw: &str, format: TraceFormat, header_allowed: bool) -> Result<Line, TraceLineError> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(Line::Skip);
    }
    if format != TraceFormat::Csv {
        return parse_foreign(line, format, header_allowed);
    }
    let fields: Vec<&str> = line.split(',').map(str::trim).collect();
    if header_allowed && !fields[0].starts_with(|c: char| c.is_ascii_digit()) {
        return Ok(Line::Header);
    }
    let [ts, op, offset, size] = fields.as_slice() else {
        return Err(TraceLineError::FieldCount(fields.len()));
    };
    let timestamp_us = parse_uint(ts).map_err(|_| TraceLineError::BadTimestamp((*ts).into()))?;
    let op = parse_op(op)?;
    let offset = parse_uint(offset).map_err(|_| TraceLineError::BadOffset((*offset).into()))?;
    let size = parse_uint(size).map_err(|_| TraceLineError::BadSize((*size).into()))?;
    record(timestamp_us, op, offset, size)
}

/// Streaming reader over any [`BufRead`]; yields one item per record or bad line.
pub struct TraceReader<R> {
    source: Source<R>,
    line: usize,
    header_allowed: bool,
    format: TraceFormat,
}

enum Source<R> {
    Lines(io::Lines<R>),
    /// `TraceFormat::Vscsi`: the reader and the record size once known.
    Vscsi(R, Option<usize>),
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(reader: R) -> Self {
        Self::with_format(reader, TraceFormat::Csv)
    }

    pub fn with_format(reader: R, format: TraceFormat) -> Self {
        let source = match format {
            TraceFormat::Vscsi => Source::Vscsi(reader, None),
            _ => Source::Lines(reader.lines()),
        };
        TraceReader { source, line: 0, header_allowed: true, format }
    }
}

/// vscsi record sizes: version 1 and 2.
const VSCSI_V1: usize = 32;
const VSCSI_V2: usize = 40;

/// Read up to `buf.len()` bytes: fewer only at the end of the input.
fn read_full(r: &mut impl io::Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// One vscsi record of `size` bytes: the record, or None for a command
/// that is neither a read, a write nor a cache flush.
fn vscsi_record(b: &[u8]) -> Result<Option<TraceRecord>, TraceLineError> {
    let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
    let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8 bytes"));
    // v1: sn, len, nSG (u32), cmd, ver (u16), lbn, ts (u64);
    // v2: cmd, ver (u16), sn, len, nSG (u32), lbn, ts, rt (u64).
    let (cmd, len, lbn, ts) = if b.len() == VSCSI_V1 {
        (u16_at(12), u32_at(4), u64_at(16), u64_at(24))
    } else {
        (u16_at(0), u32_at(8), u64_at(16), u64_at(24))
    };
    let op = match cmd & 0xff {
        0x08 | 0x28 | 0xa8 | 0x88 => TraceOp::Read,
        0x0a | 0x2a | 0xaa | 0x8a => TraceOp::Write,
        0x35 | 0x91 => TraceOp::Flush,
        _ => return Ok(None),
    };
    let offset = lbn.checked_mul(512).ok_or(TraceLineError::BadOffset(format!("sector {lbn}")))?;
    let size = if op == TraceOp::Flush { 0 } else { len as u64 };
    match record(ts, op, offset, size)? {
        Line::Record(r) => Ok(Some(r)),
        _ => Ok(None),
    }
}

impl<R: BufRead> TraceReader<R> {
    fn next_vscsi(&mut self) -> Option<Result<TraceRecord, TraceError>> {
        let Source::Vscsi(reader, size) = &mut self.source else { unreachable!("vscsi source") };
        loop {
            self.line += 1;
            let line = self.line;
            let mut b = [0u8; VSCSI_V2];
            // The first record says which version: its version byte is the
            // high byte of `ver`, at offset 3 (v2) or 15 (v1).
            let want = size.unwrap_or(VSCSI_V1);
            let got = match read_full(reader, &mut b[..want]) {
                Ok(n) => n,
                Err(source) => return Some(Err(TraceError::Io { line, source })),
            };
            if got == 0 {
                return None;
            }
            if got < want {
                return Some(Err(TraceError::Line { line, kind: TraceLineError::VscsiTruncated(got) }));
            }
            let len = match *size {
                Some(n) => n,
                None => {
                    let n = match (b[3], b[15]) {
                        (2, _) => VSCSI_V2,
                        (_, 1) => VSCSI_V1,
                        (v, _) => return Some(Err(TraceError::Line { line, kind: TraceLineError::VscsiVersion(v) })),
                    };
                    *size = Some(n);
                    let more = match read_full(reader, &mut b[VSCSI_V1..n]) {
                        Ok(m) => m,
                        Err(source) => return Some(Err(TraceError::Io { line, source })),
                    };
                    if VSCSI_V1 + more < n {
                        let kind = TraceLineError::VscsiTruncated(VSCSI_V1 + more);
                        return Some(Err(TraceError::Line { line, kind }));
                    }
                    n
                }
            };
            match vscsi_record(&b[..len]) {
                Ok(Some(r)) => return Some(Ok(r)),
                Ok(None) => continue,
                Err(kind) => return Some(Err(TraceError::Line { line, kind })),
            }
        }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if matches!(self.source, Source::Vscsi(..)) {
            return self.next_vscsi();
        }
        let Source::Lines(lines) = &mut self.source else { unreachable!("line source") };
        loop {
            let raw = lines.next()?;
            self.line += 1;
            let line = self.line;
            let raw = match raw {
                Ok(r) => r,
                Err(source) => return Some(Err(TraceError::Io { line, source })),
            };
            match parse_line(&raw, self.format, self.header_allowed) {
                Ok(Line::Skip) => continue,
                Ok(Line::Header) => {
                    self.header_allowed = false;
                    continue;
                }
                Ok(Line::Record(r)) => {
                    self.header_allowed = false;
                    return Some(Ok(r));
                }
                Err(kind) => {
                    self.header_allowed = false;
                    return Some(Err(TraceError::Line { line, kind }));
                }
            }
        }
    }
}

/// Parses a whole trace held in memory; stops at the first bad line.
pub fn parse_trace(text: &str) -> Result<Vec<TraceRecord>, TraceError> {
    TraceReader::new(text.as_bytes()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vscsi records as CloudPhysics' tools write them (little-endian).
    fn vscsi_v1(cmd: u8, sectors: u64, len: u32, ts: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend(7u32.to_le_bytes()); // sn
        b.extend(len.to_le_bytes());
        b.extend(1u32.to_le_bytes()); // nSG
        b.extend((cmd as u16).to_le_bytes());
        b.extend(0x0100u16.to_le_bytes()); // version 1
        b.extend(sectors.to_le_bytes());
        b.extend(ts.to_le_bytes());
        b
    }

    fn vscsi_v2(cmd: u8, sectors: u64, len: u32, ts: u64) -> Vec<u8> {
        let mut b = Vec::new();
        b.extend((cmd as u16).to_le_bytes());
        b.extend(0x0200u16.to_le_bytes()); // version 2
        b.extend(7u32.to_le_bytes());
        b.extend(len.to_le_bytes());
        b.extend(1u32.to_le_bytes());
        b.extend(sectors.to_le_bytes());
        b.extend(ts.to_le_bytes());
        b.extend(99u64.to_le_bytes()); // response time
        b
    }

    #[test]
    fn vscsi_traces_of_both_versions_read_as_records() {
        let want = [
            TraceRecord { timestamp_us: 10, op: TraceOp::Read, offset: 9 * 512, size: 512 },
            TraceRecord { timestamp_us: 20, op: TraceOp::Write, offset: 8 * 512, size: 8192 },
            TraceRecord { timestamp_us: 40, op: TraceOp::Flush, offset: 0, size: 0 },
        ];
        for rec in [vscsi_v1 as fn(u8, u64, u32, u64) -> Vec<u8>, vscsi_v2] {
            let mut bytes = rec(0x28, 9, 512, 10);
            bytes.extend(rec(0x2a, 8, 8192, 20));
            bytes.extend(rec(0x12, 0, 36, 30)); // INQUIRY: skipped
            bytes.extend(rec(0x35, 0, 0, 40));
            let got: Vec<TraceRecord> =
                TraceReader::with_format(&bytes[..], TraceFormat::Vscsi).collect::<Result<_, _>>().unwrap();
            assert_eq!(got, want);
            // A record cut short is an error naming it (the 4th; the
            // skipped command counts).
            let cut = &bytes[..bytes.len() - 3];
            let err = TraceReader::with_format(cut, TraceFormat::Vscsi).find_map(Result::err).unwrap();
            assert!(matches!(err, TraceError::Line { line: 4, kind: TraceLineError::VscsiTruncated(_) }), "{err}");
        }
        // Not a vscsi trace at all.
        let text = b"timestamp_us,op,offset,size\n0,R,0,4096\n";
        let err = TraceReader::with_format(&text[..], TraceFormat::Vscsi).next().unwrap().unwrap_err();
        assert!(matches!(err, TraceError::Line { line: 1, kind: TraceLineError::VscsiVersion(_) }), "{err}");
        assert_eq!(TraceReader::with_format(&[][..], TraceFormat::Vscsi).count(), 0);
        assert_eq!("vscsi".parse::<TraceFormat>(), Ok(TraceFormat::Vscsi));
    }

    #[test]
    fn parses_records_header_comments_and_aliases() {
        let text = "\
# captured on a test box
timestamp_us,op,offset,size

0,R,0,4096
10, W ,4096, 8192
20,t,0x1000,4096
30,F,0,0
40,read,8192,512
  50,WRITE,0,4096
";
        let recs = parse_trace(text).unwrap();
        assert_eq!(
            recs,
            vec![
                TraceRecord { timestamp_us: 0, op: TraceOp::Read, offset: 0, size: 4096 },
                TraceRecord { timestamp_us: 10, op: TraceOp::Write, offset: 4096, size: 8192 },
                TraceRecord { timestamp_us: 20, op: TraceOp::Trim, offset: 4096, size: 4096 },
                TraceRecord { timestamp_us: 30, op: TraceOp::Flush, offset: 0, size: 0 },
                TraceRecord { timestamp_us: 40, op: TraceOp::Read, offset: 8192, size: 512 },
                TraceRecord { timestamp_us: 50, op: TraceOp::Write, offset: 0, size: 4096 },
            ]
        );
    }

    #[test]
    fn msr_and_heimdall_layouts_parse_to_the_same_records() {
        let msr = "Timestamp,Hostname,DiskNumber,Type,Offset,Size,ResponseTime\n\
                   128166372003061629,src1,1,Read,7014609920,24576,41286\n\
                   128166372003066629,src1,1,Write,512,1536,10\n";
        let recs: Vec<_> =
            TraceReader::with_format(msr.as_bytes(), TraceFormat::Msr).collect::<Result<_, _>>().unwrap();
        assert_eq!(
            recs[0],
            TraceRecord { timestamp_us: 12816637200306162, op: TraceOp::Read, offset: 7014609920, size: 24576 }
        );
        assert_eq!(
            (recs[1].timestamp_us - recs[0].timestamp_us, recs[1].op, recs[1].size),
            (500, TraceOp::Write, 1536)
        );
        let h = "0.000 0 200626176 4096 0\n223.412 0 3159347200 36864 1\n";
        let recs: Vec<_> =
            TraceReader::with_format(h.as_bytes(), TraceFormat::Heimdall).collect::<Result<_, _>>().unwrap();
        assert_eq!(recs[1], TraceRecord { timestamp_us: 223412, op: TraceOp::Read, offset: 3159347200, size: 36864 });
        assert_eq!(recs[0].op, TraceOp::Write);
        let bad = |f, t: &str| TraceReader::with_format(t.as_bytes(), f).next().unwrap().unwrap_err().to_string();
        assert!(bad(TraceFormat::Heimdall, "0.0 0 0 4096 2\n").contains("unknown op \"2\""));
        assert!(bad(TraceFormat::Heimdall, "0.0 0 0 4096\n").contains("expected 5"));
        assert!(bad(TraceFormat::Msr, "1,h,0,Trim,0,1,0\n").contains("Trim"));
        assert!(bad(TraceFormat::Heimdall, "-1 0 0 4096 0\n").contains("timestamp"));
        assert_eq!("heimdall".parse::<TraceFormat>(), Ok(TraceFormat::Heimdall));
        assert!("blk".parse::<TraceFormat>().is_err());
    }

    #[test]
    fn header_is_optional() {
        assert_eq!(parse_trace("5,W,0,4096\n").unwrap().len(), 1);
        assert_eq!(parse_trace("").unwrap(), vec![]);
    }

    fn line_err(text: &str) -> (usize, TraceLineError) {
        match parse_trace(text).unwrap_err() {
            TraceError::Line { line, kind } => (line, kind),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn errors_carry_line_numbers() {
        assert_eq!(line_err("0,R,0,4096\n1,X,0,4096\n"), (2, TraceLineError::BadOp("X".into())));
        assert_eq!(line_err("# c\n\n0,R,0\n"), (3, TraceLineError::FieldCount(3)));
        assert_eq!(line_err("0,R,0,4096,9\n"), (1, TraceLineError::FieldCount(5)));
        assert_eq!(line_err("h,o,o,s\n0,R,-1,4096\n"), (2, TraceLineError::BadOffset("-1".into())));
        assert_eq!(line_err("0,R,0,4k\n"), (1, TraceLineError::BadSize("4k".into())));
        assert_eq!(line_err("0,W,0,1\n1.5,W,0,1\n"), (2, TraceLineError::BadTimestamp("1.5".into())));
        assert_eq!(
            line_err("0,W,18446744073709551615,2\n"),
            (1, TraceLineError::Overflow { offset: u64::MAX, size: 2 })
        );
        // A header is only recognised before the first record.
        assert_eq!(line_err("0,W,0,1\nts,op,offset,size\n"), (2, TraceLineError::BadTimestamp("ts".into())));
        let e = parse_trace("0,R,0,1\n0,Q,0,1\n").unwrap_err();
        assert_eq!(e.line(), 2);
        assert!(e.to_string().contains("line 2"), "{e}");
    }

    #[test]
    fn reader_continues_after_a_bad_line() {
        let items: Vec<_> = TraceReader::new("0,R,0,1\nbad\n2,W,0,1\n".as_bytes()).collect();
        assert_eq!(items.len(), 3);
        assert!(items[0].is_ok());
        assert_eq!(items[1].as_ref().unwrap_err().line(), 2);
        assert_eq!(items[2].as_ref().unwrap().timestamp_us, 2);
    }

    #[test]
    fn io_errors_are_reported_with_line() {
        // Invalid UTF-8 on line 2 surfaces as an I/O error from `lines()`.
        let bytes: &[u8] = b"0,R,0,1\n\xff\xfe\n";
        let items: Vec<_> = TraceReader::new(bytes).collect();
        assert!(matches!(items[1], Err(TraceError::Io { line: 2, .. })));
    }
}

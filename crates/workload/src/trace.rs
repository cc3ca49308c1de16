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

/// What is wrong with a line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
}

/// A trace error with its line number.
#[derive(Debug, thiserror::Error)]
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

fn parse_line(raw: &str, header_allowed: bool) -> Result<Line, TraceLineError> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(Line::Skip);
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
    if offset.checked_add(size).is_none() {
        return Err(TraceLineError::Overflow { offset, size });
    }
    Ok(Line::Record(TraceRecord { timestamp_us, op, offset, size }))
}

/// Streaming reader over any [`BufRead`]; yields one item per record or bad line.
pub struct TraceReader<R> {
    lines: io::Lines<R>,
    line: usize,
    header_allowed: bool,
}

impl<R: BufRead> TraceReader<R> {
    pub fn new(reader: R) -> Self {
        TraceReader { lines: reader.lines(), line: 0, header_allowed: true }
    }
}

impl<R: BufRead> Iterator for TraceReader<R> {
    type Item = Result<TraceRecord, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let raw = self.lines.next()?;
            self.line += 1;
            let line = self.line;
            let raw = match raw {
                Ok(r) => r,
                Err(source) => return Some(Err(TraceError::Io { line, source })),
            };
            match parse_line(&raw, self.header_allowed) {
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

//! fio job files: parsing into [`JobSpec`]s and resolving them against a device size.
//!
//! Owns: the INI reader ([`parse_job_file`]), fio's value syntaxes ([`parse_size`], [`parse_runtime`],
//! [`parse_uint`], [`parse_bool`]), the job model ([`JobSpec`]) and its placement on a device
//! ([`JobSpec::resolve`] → [`ResolvedJob`] with one [`JobInstance`] per `numjobs` clone).
//!
//! File format (as fio reads it): `[section]` headers, `key=value` or bare `key` lines; everything from
//! the first `;` or `#` on a line is a comment (fio strips these anywhere in the line); whitespace
//! around keys and values is ignored. A `[global]` section sets defaults for the job sections that
//! *follow* it; several `[global]` sections may appear. Option names are case-sensitive, like fio's.
//!
//! Supported keys: `rw`/`readwrite`, `bs`/`blocksize` (`4k` or `read,write[,trim]`), `size`,
//! `offset`/`fileoffset`, `offset_increment`, `numjobs`, `iodepth`, `random_distribution`,
//! `rwmixread`, `rwmixwrite` (each sets the other to 100 − value; the later one wins, as in fio),
//! `randseed`, `io_size`/`io_limit`, `runtime`/`timeout`, `time_based`, `norandommap`, `name`,
//! `filename` (kept, unused), and our extension `precondition` = `none` | `seq` | `seq+rand`
//! (see [`Precondition`]). Any other key becomes a [`Warning`]; a bad value for a supported key is a
//! typed [`JobError`].
//!
//! Invariants and fio semantics (checked against fio 3.33 where noted):
//! - Sizes use `kb_base=1024` (fio's default) *including its compatibility quirk*: `k`/`kb`/`K`/`KB`
//!   are powers of 1024 but the IEC forms `KiB`/`MiB`/`GiB`/`TiB`/`PiB` are powers of **1000**
//!   (fio 3.33: `size=1MiB` does 1 000 000 bytes, `size=1GiB` 10⁹). Suffixes are case-insensitive.
//!   `0x` hex is accepted; fractional values are rejected (fio silently truncates `1.5M` to 1 byte).
//! - `size=N%`, `offset=N%`, `offset_increment=N%`, `io_size=N%` are percentages: of the device for
//!   the first three, of the instance's region for `io_size` (rounded up to the minimum block size).
//!   A percentage size is capped at `device − offset` and aligned down to the minimum block size;
//!   a percentage offset (or any offset when `offset_increment` is a percentage) is rounded *up* to
//!   the minimum block size (fio's `get_start_offset`).
//! - `numjobs` is kept as a count in [`JobSpec`]; [`JobSpec::resolve`] expands it. Clone `i` starts at
//!   `offset + i × offset_increment` (all clones share the region unless `offset_increment` is set).
//! - Unset or zero `size` means "to the end of the device"; unset `io_size` means one region's worth
//!   of bytes; `time_based` makes the I/O stream endless (fio ignores `io_size` then).
//! - `runtime` takes fio's time suffixes (`us`, `ms`, `s`, `m`, `h`, `d`; bare numbers are seconds).
//! - Each instance gets its own seed, `mix(randseed, job index in file, clone index)`, mirroring fio's
//!   use of the global thread number, so clones and sibling jobs never replay the same offsets.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::dist::{DistError, Distribution};
use crate::gen::{
    GenError, GenParams, IoGen, Op, Precondition, PreconditionGen, PreconditionParseError, RwKind, RwParseError,
};
use crate::rng::mix_seed;

/// fio's default `randseed`.
pub const DEFAULT_RANDSEED: u64 = 0x89;

/// A size that may be absolute or a percentage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SizeValue {
    Bytes(u64),
    /// 0..=100.
    Percent(u8),
}

/// Block sizes per direction (fio's `bs=read,write`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockSizes {
    pub read: u64,
    pub write: u64,
}

impl BlockSizes {
    /// fio's `min_bs`.
    pub fn min(&self) -> u64 {
        self.read.min(self.write)
    }

    /// Block size of a direction.
    pub fn of(&self, op: Op) -> u64 {
        match op {
            Op::Read => self.read,
            Op::Write => self.write,
        }
    }
}

impl Default for BlockSizes {
    fn default() -> Self {
        BlockSizes { read: 4096, write: 4096 }
    }
}

/// One job section, with `[global]` defaults applied and `numjobs` kept as a count.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobSpec {
    /// Section name, or the `name=` option.
    pub name: String,
    /// Position of the job among the file's jobs (0-based); part of the instance seeds.
    pub job_index: usize,
    pub rw: RwKind,
    pub bs: BlockSizes,
    /// `None`: to the end of the device.
    pub size: Option<SizeValue>,
    pub offset: SizeValue,
    pub offset_increment: SizeValue,
    pub numjobs: u32,
    pub iodepth: u32,
    pub distribution: Distribution,
    /// Percentage of reads for mixed kinds.
    pub rwmixread: u8,
    pub randseed: u64,
    /// `None`: one region's worth.
    pub io_size: Option<SizeValue>,
    pub runtime: Option<Duration>,
    pub time_based: bool,
    pub norandommap: bool,
    pub filename: Option<String>,
    pub precondition: Precondition,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            name: String::new(),
            job_index: 0,
            rw: RwKind::Read,
            bs: BlockSizes::default(),
            size: None,
            offset: SizeValue::Bytes(0),
            offset_increment: SizeValue::Bytes(0),
            numjobs: 1,
            iodepth: 1,
            distribution: Distribution::Random,
            rwmixread: 50,
            randseed: DEFAULT_RANDSEED,
            io_size: None,
            runtime: None,
            time_based: false,
            norandommap: false,
            filename: None,
            precondition: Precondition::None,
        }
    }
}

/// An option we do not model; fio has hundreds, so these are reported, not fatal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Warning {
    pub line: usize,
    pub section: String,
    pub key: String,
}

impl fmt::Display for Warning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: option {:?} in [{}] is not supported and was ignored", self.line, self.key, self.section)
    }
}

/// Result of parsing a job file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobFile {
    pub jobs: Vec<JobSpec>,
    pub warnings: Vec<Warning>,
}

/// Why a value is invalid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ValueError {
    #[error("empty value")]
    Empty,
    #[error("not a non-negative integer: {0:?}")]
    BadNumber(String),
    #[error("unknown unit suffix {0:?} (sizes take k, m, g, t, p; KiB, MiB, GiB, TiB, PiB; KB, MB, GB, TB, PB)")]
    UnknownSuffix(String),
    #[error("value {0:?} overflows 64 bits")]
    Overflow(String),
    #[error("a percentage is not allowed here")]
    PercentNotAllowed,
    #[error("percentage {0} out of range")]
    PercentOutOfRange(u64),
    #[error("value {value} out of range ({min}..={max})")]
    OutOfRange { value: u64, min: u64, max: u64 },
    #[error("not a boolean (expected empty, 0 or 1): {0:?}")]
    BadBool(String),
    #[error("too many comma-separated block sizes")]
    TooManyBlockSizes,
    #[error(transparent)]
    Rw(#[from] RwParseError),
    #[error(transparent)]
    Distribution(#[from] DistError),
    #[error(transparent)]
    Precondition(#[from] PreconditionParseError),
}

/// Job-file errors, with 1-based line numbers.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum JobError {
    #[error("line {line}: malformed section header {text:?}")]
    BadSectionHeader { line: usize, text: String },
    #[error("line {line}: option {key:?} outside of any section")]
    OptionOutsideSection { line: usize, key: String },
    #[error("line {line}: option {key:?} needs a value")]
    MissingValue { line: usize, key: String },
    #[error("line {line}: invalid value {value:?} for {key:?}: {source}")]
    InvalidValue {
        line: usize,
        key: String,
        value: String,
        #[source]
        source: ValueError,
    },
    #[error("job file defines no jobs")]
    NoJobs,
}

/// Errors placing a job on a device.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum ResolveError {
    #[error("device size is 0")]
    EmptyDevice,
    #[error("job {job:?} instance {instance}: offset {offset} is beyond the device ({device} bytes)")]
    OffsetBeyondDevice { job: String, instance: u32, offset: u64, device: u64 },
    #[error("job {job:?} instance {instance}: region {offset}+{size} exceeds the device ({device} bytes)")]
    RegionOutOfBounds { job: String, instance: u32, offset: u64, size: u64, device: u64 },
    #[error("job {job:?} instance {instance}: empty region")]
    EmptyRegion { job: String, instance: u32 },
    #[error("job {job:?} instance {instance}: {source}")]
    Gen {
        job: String,
        instance: u32,
        #[source]
        source: GenError,
    },
}

/// Parses a plain non-negative integer: decimal or `0x` hex, no suffix.
pub fn parse_uint(s: &str) -> Result<u64, ValueError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    let (digits, radix) = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => (h, 16),
        None => (s, 10),
    };
    if digits.is_empty() || !digits.chars().all(|c| c.is_digit(radix)) {
        return Err(ValueError::BadNumber(s.into()));
    }
    u64::from_str_radix(digits, radix).map_err(|_| ValueError::Overflow(s.into()))
}

/// How a size's unit suffix is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Units {
    /// fio's, in job files (module docs): `k`/`kb` are 1024, and — fio's
    /// `kb_base=1024` quirk — `KiB` is 1000.
    Fio,
    /// Sluice's own, in its config and on its command line
    /// (docs/serve.md, "Sizes"): `KiB`/`MiB`/`GiB`/`TiB`/`PiB` are powers
    /// of two, `KB`/`MB`/`GB`/`TB`/`PB` powers of ten, and the one-letter
    /// `k`/`m`/`g`/`t`/`p` powers of two as fio reads them.
    Sluice,
}

/// Parses a fio size: integer with optional unit suffix (see module docs), or `N%`.
pub fn parse_size(s: &str) -> Result<SizeValue, ValueError> {
    parse_size_in(s, Units::Fio)
}

/// Parses a size with a unit suffix read as `units` says, or `N%`.
pub fn parse_size_in(s: &str, units: Units) -> Result<SizeValue, ValueError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    if s.starts_with("0x") || s.starts_with("0X") {
        return parse_uint(s).map(SizeValue::Bytes);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() || suffix.starts_with('.') {
        return Err(ValueError::BadNumber(s.into()));
    }
    let value: u64 = digits.parse().map_err(|_| ValueError::Overflow(s.into()))?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let (base, pow): (u64, u32) = match suffix.as_str() {
        "%" => {
            return u8::try_from(value)
                .ok()
                .filter(|&p| p <= 100)
                .map(SizeValue::Percent)
                .ok_or(ValueError::PercentOutOfRange(value))
        }
        "" | "b" => (1, 0),
        "k" | "kib" | "m" | "mib" | "g" | "gib" | "t" | "tib" | "p" | "pib" | "kb" | "mb" | "gb" | "tb" | "pb"
            if units == Units::Sluice =>
        {
            let pow = 1 + "kmgtp".find(&suffix[..1]).expect("a known prefix") as u32;
            (if suffix.len() == 2 { 1000 } else { 1024 }, pow)
        }
        "k" | "kb" => (1024, 1),
        "m" | "mb" => (1024, 2),
        "g" | "gb" => (1024, 3),
        "t" | "tb" => (1024, 4),
        "p" | "pb" => (1024, 5),
        // kb_base=1024 compatibility mode: IEC prefixes mean powers of 1000 (fio's get_mult_bytes).
        "kib" => (1000, 1),
        "mib" => (1000, 2),
        "gib" => (1000, 3),
        "tib" => (1000, 4),
        "pib" => (1000, 5),
        _ => return Err(ValueError::UnknownSuffix(suffix)),
    };
    base.checked_pow(pow).and_then(|m| value.checked_mul(m)).map(SizeValue::Bytes).ok_or(ValueError::Overflow(s.into()))
}

/// Parses a size in a job file that must be absolute (fio's units).
pub fn parse_fio_bytes(s: &str) -> Result<u64, ValueError> {
    match parse_size(s)? {
        SizeValue::Bytes(b) => Ok(b),
        SizeValue::Percent(_) => Err(ValueError::PercentNotAllowed),
    }
}

/// Parses a size in Sluice's config or on its command line (`Units::Sluice`),
/// which must be absolute: the one parser of sizes outside job files.
pub fn parse_bytes(s: &str) -> Result<u64, ValueError> {
    match parse_size_in(s, Units::Sluice)? {
        SizeValue::Bytes(b) => Ok(b),
        SizeValue::Percent(_) => Err(ValueError::PercentNotAllowed),
    }
}

/// Parses fio's time syntax: integer plus `us`/`usec`, `ms`/`msec`, `s`, `m`, `h`, `d`
/// (case-insensitive); a bare number is in seconds (fio's `runtime` unit).
pub fn parse_runtime(s: &str) -> Result<Duration, ValueError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(ValueError::Empty);
    }
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, suffix) = s.split_at(split);
    if digits.is_empty() || suffix.starts_with('.') {
        return Err(ValueError::BadNumber(s.into()));
    }
    let value: u64 = digits.parse().map_err(|_| ValueError::Overflow(s.into()))?;
    let suffix = suffix.trim().to_ascii_lowercase();
    let micros_per_unit: u64 = match suffix.as_str() {
        "us" | "usec" => 1,
        "ms" | "msec" => 1_000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        "d" => 86_400_000_000,
        _ => return Err(ValueError::UnknownSuffix(suffix)),
    };
    value.checked_mul(micros_per_unit).map(Duration::from_micros).ok_or(ValueError::Overflow(s.into()))
}

/// Parses a fio boolean: bare key (`None`) is true; otherwise an integer, non-zero meaning true.
pub fn parse_bool(v: Option<&str>) -> Result<bool, ValueError> {
    match v {
        None => Ok(true),
        Some(s) if s.trim().is_empty() => Ok(true),
        Some(s) => parse_uint(s).map(|n| n != 0).map_err(|_| ValueError::BadBool(s.trim().into())),
    }
}

fn in_range(value: u64, min: u64, max: u64) -> Result<u64, ValueError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(ValueError::OutOfRange { value, min, max })
    }
}

fn percent_in(v: SizeValue, min: u8) -> Result<SizeValue, ValueError> {
    match v {
        SizeValue::Percent(p) if p < min => Err(ValueError::PercentOutOfRange(u64::from(p))),
        other => Ok(other),
    }
}

fn parse_block_sizes(s: &str, current: BlockSizes) -> Result<BlockSizes, ValueError> {
    let parts: Vec<&str> = s.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return Err(ValueError::TooManyBlockSizes);
    }
    let one = |p: &str| -> Result<Option<u64>, ValueError> {
        if p.is_empty() {
            return Ok(None);
        }
        in_range(parse_fio_bytes(p)?, 1, u64::MAX).map(Some)
    };
    match parts.as_slice() {
        [all] => {
            let b = one(all)?.ok_or(ValueError::Empty)?;
            Ok(BlockSizes { read: b, write: b })
        }
        [r, w, ..] => {
            let read = one(r)?.unwrap_or(current.read);
            let write = one(w)?.unwrap_or(current.write);
            if let [_, _, t] = parts.as_slice() {
                one(t)?; // trim block size: validated, unused
            }
            Ok(BlockSizes { read, write })
        }
        [] => Err(ValueError::Empty),
    }
}

/// Outcome of applying one option.
enum Applied {
    Known,
    Unknown,
}

fn apply(spec: &mut JobSpec, key: &str, value: Option<&str>) -> Result<Applied, ValueError> {
    let req = || value.map(str::trim).filter(|v| !v.is_empty()).ok_or(ValueError::Empty);
    match key {
        "rw" | "readwrite" => spec.rw = req()?.parse()?,
        "bs" | "blocksize" => spec.bs = parse_block_sizes(req()?, spec.bs)?,
        "size" => {
            spec.size = match percent_in(parse_size(req()?)?, 1)? {
                SizeValue::Bytes(0) => None,
                v => Some(v),
            }
        }
        "offset" | "fileoffset" => spec.offset = parse_size(req()?)?,
        "offset_increment" => spec.offset_increment = parse_size(req()?)?,
        "numjobs" => spec.numjobs = in_range(parse_uint(req()?)?, 1, u64::from(u32::MAX))? as u32,
        "iodepth" => spec.iodepth = in_range(parse_uint(req()?)?, 1, u64::from(u32::MAX))? as u32,
        "random_distribution" => spec.distribution = req()?.parse()?,
        "rwmixread" => spec.rwmixread = in_range(parse_uint(req()?)?, 0, 100)? as u8,
        "rwmixwrite" => spec.rwmixread = 100 - in_range(parse_uint(req()?)?, 0, 100)? as u8,
        "randseed" => spec.randseed = parse_uint(req()?)?,
        "io_size" | "io_limit" => {
            spec.io_size = match percent_in(parse_size(req()?)?, 1)? {
                SizeValue::Bytes(0) => None,
                v => Some(v),
            }
        }
        "runtime" | "timeout" => {
            let d = parse_runtime(req()?)?;
            spec.runtime = if d.is_zero() { None } else { Some(d) };
        }
        "time_based" => spec.time_based = parse_bool(value)?,
        "norandommap" => spec.norandommap = parse_bool(value)?,
        "name" => spec.name = req()?.to_string(),
        "filename" => spec.filename = Some(req()?.to_string()),
        "precondition" => spec.precondition = req()?.parse()?,
        _ => return Ok(Applied::Unknown),
    }
    Ok(Applied::Known)
}

/// Parses a fio job file (see module docs for the accepted syntax and semantics).
pub fn parse_job_file(text: &str) -> Result<JobFile, JobError> {
    let mut global = JobSpec::default();
    // (section name is global?, accumulated spec)
    let mut current: Option<(bool, JobSpec)> = None;
    let mut jobs = Vec::new();
    let mut warnings = Vec::new();

    fn finish(current: Option<(bool, JobSpec)>, global: &mut JobSpec, jobs: &mut Vec<JobSpec>) {
        match current {
            Some((true, g)) => *global = g,
            Some((false, mut job)) => {
                job.job_index = jobs.len();
                jobs.push(job);
            }
            None => {}
        }
    }

    for (idx, raw) in text.lines().enumerate() {
        let line_no = idx + 1;
        let line = raw.find([';', '#']).map_or(raw, |i| &raw[..i]).trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with('[') {
            let name = line
                .strip_prefix('[')
                .and_then(|l| l.strip_suffix(']'))
                .map(str::trim)
                .filter(|n| !n.is_empty() && !n.contains(['[', ']']))
                .ok_or_else(|| JobError::BadSectionHeader { line: line_no, text: line.into() })?;
            finish(current.take(), &mut global, &mut jobs);
            current = Some(if name == "global" {
                (true, global.clone())
            } else {
                (false, JobSpec { name: name.to_string(), ..global.clone() })
            });
            continue;
        }
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (line, None),
        };
        let Some((is_global, spec)) = current.as_mut() else {
            return Err(JobError::OptionOutsideSection { line: line_no, key: key.into() });
        };
        match apply(spec, key, value) {
            Ok(Applied::Known) => {}
            Ok(Applied::Unknown) => warnings.push(Warning {
                line: line_no,
                section: if *is_global { "global".into() } else { spec.name.clone() },
                key: key.into(),
            }),
            Err(ValueError::Empty) if value.is_none() => {
                return Err(JobError::MissingValue { line: line_no, key: key.into() })
            }
            Err(source) => {
                return Err(JobError::InvalidValue {
                    line: line_no,
                    key: key.into(),
                    value: value.unwrap_or("").into(),
                    source,
                })
            }
        }
    }
    finish(current, &mut global, &mut jobs);
    if jobs.is_empty() {
        return Err(JobError::NoJobs);
    }
    Ok(JobFile { jobs, warnings })
}

/// Placement of one `numjobs` clone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInstance {
    /// Clone index, `0..numjobs`.
    pub index: u32,
    /// Absolute region start, bytes.
    pub offset: u64,
    /// Region length, bytes.
    pub size: u64,
    /// Bytes to issue; `None` for `time_based` (endless).
    pub io_limit: Option<u64>,
    pub seed: u64,
}

/// A job placed on a device of known size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResolvedJob {
    pub spec: JobSpec,
    pub device_bytes: u64,
    pub instances: Vec<JobInstance>,
}

fn percent_of(total: u64, p: u8) -> u64 {
    (u128::from(total) * u128::from(p) / 100) as u64
}

impl JobSpec {
    /// Computes every clone's region on a device of `device_bytes`, following fio's
    /// `get_start_offset` and size-percentage rules (see module docs), and validates that each
    /// clone can generate I/O.
    pub fn resolve(&self, device_bytes: u64) -> Result<ResolvedJob, ResolveError> {
        if device_bytes == 0 {
            return Err(ResolveError::EmptyDevice);
        }
        let min_bs = self.bs.min().max(1);
        let (increment, inc_pct) = match self.offset_increment {
            SizeValue::Bytes(b) => (b, false),
            SizeValue::Percent(p) => (percent_of(device_bytes, p), true),
        };
        let mut instances = Vec::with_capacity(self.numjobs as usize);
        for index in 0..self.numjobs {
            let job = || self.name.clone();
            let (base, pct) = match self.offset {
                SizeValue::Bytes(b) => (b, false),
                SizeValue::Percent(p) => (percent_of(device_bytes, p), true),
            };
            let raw = u128::from(base) + u128::from(index) * u128::from(increment);
            let raw = if pct || inc_pct { raw.div_ceil(u128::from(min_bs)) * u128::from(min_bs) } else { raw };
            let offset = u64::try_from(raw).unwrap_or(u64::MAX);
            if offset >= device_bytes {
                return Err(ResolveError::OffsetBeyondDevice {
                    job: job(),
                    instance: index,
                    offset,
                    device: device_bytes,
                });
            }
            let room = device_bytes - offset;
            let size = match self.size {
                None => room,
                Some(SizeValue::Bytes(b)) => b,
                Some(SizeValue::Percent(p)) => {
                    let s = percent_of(device_bytes, p).min(room);
                    s - s % min_bs
                }
            };
            if size == 0 {
                return Err(ResolveError::EmptyRegion { job: job(), instance: index });
            }
            if size > room {
                return Err(ResolveError::RegionOutOfBounds {
                    job: job(),
                    instance: index,
                    offset,
                    size,
                    device: device_bytes,
                });
            }
            let io_limit = if self.time_based {
                None
            } else {
                Some(match self.io_size {
                    None => size,
                    Some(SizeValue::Bytes(b)) => b,
                    Some(SizeValue::Percent(p)) => percent_of(size, p).div_ceil(min_bs).saturating_mul(min_bs),
                })
            };
            let seed = mix_seed(&[self.randseed, self.job_index as u64, u64::from(index)]);
            instances.push(JobInstance { index, offset, size, io_limit, seed });
        }
        let resolved = ResolvedJob { spec: self.clone(), device_bytes, instances };
        for inst in &resolved.instances {
            resolved.params_of(inst).validate().map_err(|source| ResolveError::Gen {
                job: self.name.clone(),
                instance: inst.index,
                source,
            })?;
        }
        Ok(resolved)
    }
}

impl ResolvedJob {
    fn params_of(&self, inst: &JobInstance) -> GenParams {
        let s = &self.spec;
        GenParams {
            rw: s.rw,
            bs_read: s.bs.read,
            bs_write: s.bs.write,
            distribution: s.distribution,
            norandommap: s.norandommap,
            // fio: time_based starts every random-map pass with a new order; io_size-driven wrap
            // repeats the same order (verified with fio 3.33).
            reshuffle_each_pass: s.time_based,
            rwmixread: s.rwmixread,
            region_offset: inst.offset,
            region_size: inst.size,
            io_limit: inst.io_limit,
            seed: inst.seed,
        }
    }

    fn instance(&self, index: usize) -> Result<&JobInstance, GenError> {
        self.instances.get(index).ok_or(GenError::NoSuchInstance { index, count: self.instances.len() })
    }

    /// Generator parameters of clone `index`.
    pub fn params(&self, index: usize) -> Result<GenParams, GenError> {
        Ok(self.params_of(self.instance(index)?))
    }

    /// The I/O stream of clone `index`.
    pub fn generator(&self, index: usize) -> Result<IoGen, GenError> {
        IoGen::new(self.params(index)?)
    }

    /// The preconditioning stream of clone `index` (`None` for `precondition=none`). Clones that
    /// share a region each get a stream; run it once per distinct region.
    pub fn precondition(&self, index: usize) -> Result<Option<PreconditionGen>, GenError> {
        PreconditionGen::new(&self.params(index)?, self.spec.precondition)
    }
}

#[cfg(test)]
#[path = "job_tests.rs"]
mod tests;

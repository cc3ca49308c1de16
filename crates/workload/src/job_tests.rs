//! Tests of `job`, kept apart so the module itself stays readable.

use super::*;

const KI: u64 = 1024;
const MI: u64 = 1024 * 1024;
const GI: u64 = 1024 * 1024 * 1024;

#[test]
fn size_suffixes_follow_fio_kb_base_1024() {
    let b = |s| parse_fio_bytes(s).unwrap();
    assert_eq!(b("4096"), 4096);
    assert_eq!(b("4k"), 4 * KI);
    assert_eq!(b("4K"), 4 * KI);
    assert_eq!(b("4KB"), 4 * KI);
    assert_eq!(b("4kb"), 4 * KI);
    assert_eq!(b("1m"), MI);
    assert_eq!(b("1M"), MI);
    assert_eq!(b("1g"), GI);
    assert_eq!(b("1G"), GI);
    assert_eq!(b("2t"), 2 * 1024 * GI);
    assert_eq!(b("1p"), 1024 * 1024 * GI);
    assert_eq!(b("7b"), 7);
    assert_eq!(b("0x1000"), 4096);
    assert_eq!(b(" 64k "), 64 * KI);
    // fio 3.33 compatibility mode: IEC prefixes are powers of 1000.
    assert_eq!(b("1KiB"), 1000);
    assert_eq!(b("1MiB"), 1_000_000);
    assert_eq!(b("1mib"), 1_000_000);
    assert_eq!(b("1GiB"), 1_000_000_000);
    assert_eq!(b("1TiB"), 1_000_000_000_000);
}

#[test]
fn size_errors_and_percentages() {
    assert_eq!(parse_size("50%"), Ok(SizeValue::Percent(50)));
    assert_eq!(parse_size("100%"), Ok(SizeValue::Percent(100)));
    assert_eq!(parse_size("101%"), Err(ValueError::PercentOutOfRange(101)));
    assert_eq!(parse_size("4x"), Err(ValueError::UnknownSuffix("x".into())));
    assert_eq!(parse_size("4kbytes"), Err(ValueError::UnknownSuffix("kbytes".into())));
    assert_eq!(parse_size("1.5M"), Err(ValueError::BadNumber("1.5M".into())));
    assert_eq!(parse_size("-4k"), Err(ValueError::BadNumber("-4k".into())));
    assert_eq!(parse_size("k"), Err(ValueError::BadNumber("k".into())));
    assert_eq!(parse_size(""), Err(ValueError::Empty));
    assert_eq!(parse_size("0xZZ"), Err(ValueError::BadNumber("0xZZ".into())));
    assert_eq!(parse_size("20000000p"), Err(ValueError::Overflow("20000000p".into())));
    assert_eq!(parse_size("99999999999999999999"), Err(ValueError::Overflow("99999999999999999999".into())));
    assert_eq!(parse_fio_bytes("10%"), Err(ValueError::PercentNotAllowed));
    assert_eq!(parse_bytes("10%"), Err(ValueError::PercentNotAllowed));
}

#[test]
fn runtime_suffixes() {
    let r = |s| parse_runtime(s).unwrap();
    assert_eq!(r("10"), Duration::from_secs(10));
    assert_eq!(r("10s"), Duration::from_secs(10));
    assert_eq!(r("2m"), Duration::from_secs(120));
    assert_eq!(r("1h"), Duration::from_secs(3600));
    assert_eq!(r("1d"), Duration::from_secs(86400));
    assert_eq!(r("500ms"), Duration::from_millis(500));
    assert_eq!(r("250us"), Duration::from_micros(250));
    assert_eq!(r("3M"), Duration::from_secs(180));
    assert_eq!(parse_runtime("2min"), Err(ValueError::UnknownSuffix("min".into())));
    assert_eq!(parse_runtime("abc"), Err(ValueError::BadNumber("abc".into())));
    assert_eq!(parse_runtime("1.5s"), Err(ValueError::BadNumber("1.5s".into())));
}

#[test]
fn bools() {
    assert_eq!(parse_bool(None), Ok(true));
    assert_eq!(parse_bool(Some("1")), Ok(true));
    assert_eq!(parse_bool(Some("2")), Ok(true));
    assert_eq!(parse_bool(Some("0")), Ok(false));
    assert_eq!(parse_bool(Some("true")), Err(ValueError::BadBool("true".into())));
}

const FILE: &str = "\
; a comment
# another comment
[global]
bs=64k          ; trailing comment
rw=randwrite
size=1g
random_distribution=zipf:1.2
ioengine=libaio
direct=1

[seq-fill]
rw=write#no space before comment
precondition=seq

[global]
rwmixread=70
norandommap

[mixed]
rw=randrw
bs=4k,16k
numjobs=8
offset_increment=1g
randseed=1234
io_limit=4g
runtime=2m
time_based
iodepth=32
name=mixed-renamed
filename=/dev/nvme0n1
rwmixwrite=10
precondition=seq+rand
";

#[test]
fn parses_globals_jobs_and_warnings() {
    let f = parse_job_file(FILE).unwrap();
    assert_eq!(f.jobs.len(), 2);
    let a = &f.jobs[0];
    assert_eq!(a.name, "seq-fill");
    assert_eq!(a.job_index, 0);
    assert_eq!(a.rw, RwKind::Write);
    assert_eq!(a.bs, BlockSizes { read: 64 * KI, write: 64 * KI });
    assert_eq!(a.size, Some(SizeValue::Bytes(GI)));
    assert_eq!(a.distribution, Distribution::Zipf { theta: 1.2, center: None });
    assert_eq!(a.rwmixread, 50, "later [global] must not affect earlier jobs");
    assert!(!a.norandommap);
    assert_eq!(a.precondition, Precondition::Seq);
    assert_eq!(a.numjobs, 1);
    assert_eq!(a.randseed, DEFAULT_RANDSEED);

    let b = &f.jobs[1];
    assert_eq!(b.name, "mixed-renamed");
    assert_eq!(b.job_index, 1);
    assert_eq!(b.rw, RwKind::RandRw);
    assert_eq!(b.bs, BlockSizes { read: 4 * KI, write: 16 * KI });
    assert_eq!(b.numjobs, 8);
    assert_eq!(b.offset_increment, SizeValue::Bytes(GI));
    assert_eq!(b.randseed, 1234);
    assert_eq!(b.io_size, Some(SizeValue::Bytes(4 * GI)));
    assert_eq!(b.runtime, Some(Duration::from_secs(120)));
    assert!(b.time_based);
    assert!(b.norandommap);
    assert_eq!(b.iodepth, 32);
    assert_eq!(b.filename.as_deref(), Some("/dev/nvme0n1"));
    assert_eq!(b.rwmixread, 90, "rwmixwrite after rwmixread wins");
    assert_eq!(b.precondition, Precondition::SeqRand);

    let keys: Vec<(&str, &str, usize)> =
        f.warnings.iter().map(|w| (w.key.as_str(), w.section.as_str(), w.line)).collect();
    assert_eq!(keys, vec![("ioengine", "global", 8), ("direct", "global", 9)]);
}

#[test]
fn typed_errors_with_line_numbers() {
    let err = |s: &str| parse_job_file(s).unwrap_err();
    assert_eq!(err("bs=4k\n[a]\n"), JobError::OptionOutsideSection { line: 1, key: "bs".into() });
    assert_eq!(err("[a\nbs=4k\n"), JobError::BadSectionHeader { line: 1, text: "[a".into() });
    assert_eq!(err("[]\n"), JobError::BadSectionHeader { line: 1, text: "[]".into() });
    assert_eq!(err("[global]\nbs=4k\n"), JobError::NoJobs);
    assert_eq!(err(""), JobError::NoJobs);
    assert_eq!(err("[a]\nbs\n"), JobError::MissingValue { line: 2, key: "bs".into() });
    match err("[a]\n\nrw=trim\n") {
        JobError::InvalidValue { line: 3, key, source: ValueError::Rw(RwParseError::Unsupported(_)), .. } => {
            assert_eq!(key, "rw")
        }
        e => panic!("{e:?}"),
    }
    assert!(matches!(
        err("[a]\nrandom_distribution=zipf:1\n"),
        JobError::InvalidValue { line: 2, source: ValueError::Distribution(DistError::ZipfThetaOne), .. }
    ));
    assert!(matches!(
        err("[a]\nrwmixread=101\n"),
        JobError::InvalidValue { source: ValueError::OutOfRange { value: 101, min: 0, max: 100 }, .. }
    ));
    assert!(matches!(err("[a]\nnumjobs=0\n"), JobError::InvalidValue { source: ValueError::OutOfRange { .. }, .. }));
    assert!(matches!(err("[a]\nbs=0\n"), JobError::InvalidValue { source: ValueError::OutOfRange { .. }, .. }));
    assert!(matches!(err("[a]\nsize=0%\n"), JobError::InvalidValue { source: ValueError::PercentOutOfRange(0), .. }));
    assert!(matches!(err("[a]\nbs=1%\n"), JobError::InvalidValue { source: ValueError::PercentNotAllowed, .. }));
    assert!(matches!(
        err("[a]\nbs=4k,4k,4k,4k\n"),
        JobError::InvalidValue { source: ValueError::TooManyBlockSizes, .. }
    ));
    assert!(matches!(err("[a]\nnorandommap=yes\n"), JobError::InvalidValue { source: ValueError::BadBool(_), .. }));
    assert!(matches!(err("[a]\nruntime=10x\n"), JobError::InvalidValue { source: ValueError::UnknownSuffix(_), .. }));
    assert!(matches!(
        err("[a]\nprecondition=rand\n"),
        JobError::InvalidValue { source: ValueError::Precondition(_), .. }
    ));
    // Error messages carry the line number.
    assert!(err("[a]\n\n\nsize=12q\n").to_string().starts_with("line 4:"));
}

fn job(text: &str) -> JobSpec {
    let mut f = parse_job_file(text).unwrap();
    f.jobs.remove(0)
}

#[test]
fn resolve_defaults_to_whole_device() {
    let r = job("[a]\nrw=randread\n").resolve(GI).unwrap();
    assert_eq!(
        r.instances,
        vec![JobInstance { index: 0, offset: 0, size: GI, io_limit: Some(GI), seed: r.instances[0].seed }]
    );
    let r = job("[a]\noffset=256m\n").resolve(GI).unwrap();
    assert_eq!((r.instances[0].offset, r.instances[0].size), (256 * MI, 768 * MI));
}

#[test]
fn resolve_offset_increment_partitions() {
    let r = job("[a]\nnumjobs=8\nsize=128m\noffset_increment=128m\nrw=randwrite\n").resolve(GI).unwrap();
    assert_eq!(r.instances.len(), 8);
    for (i, inst) in r.instances.iter().enumerate() {
        assert_eq!(inst.offset, i as u64 * 128 * MI);
        assert_eq!(inst.size, 128 * MI);
    }
    let seeds: std::collections::HashSet<u64> = r.instances.iter().map(|i| i.seed).collect();
    assert_eq!(seeds.len(), 8);
    // Without offset_increment, clones share the region.
    let r = job("[a]\nnumjobs=3\nsize=128m\n").resolve(GI).unwrap();
    assert!(r.instances.iter().all(|i| i.offset == 0 && i.size == 128 * MI));
}

#[test]
fn resolve_percentages_like_fio() {
    // fio 3.33 on a 1 024 000-byte file, bs=4k, numjobs=3, size=10%, offset_increment=25%:
    // regions start at 0, 258048 (256000 rounded up to 4k), 512000 and are 102400 bytes long.
    let r = job("[a]\nnumjobs=3\nsize=10%\noffset_increment=25%\nrw=write\n").resolve(1_024_000).unwrap();
    let got: Vec<(u64, u64)> = r.instances.iter().map(|i| (i.offset, i.size)).collect();
    assert_eq!(got, vec![(0, 102_400), (258_048, 102_400), (512_000, 102_400)]);
    // offset=50% size=75%: size capped at the rest of the device (fio does 512000 bytes).
    let r = job("[a]\noffset=50%\nsize=75%\n").resolve(1_024_000).unwrap();
    assert_eq!((r.instances[0].offset, r.instances[0].size), (512_000, 512_000));
    // size=50% io_size=50%: 256000 rounded up to 4k = 258048 bytes (fio 3.33).
    let r = job("[a]\nsize=50%\nio_size=50%\n").resolve(1_024_000).unwrap();
    assert_eq!(r.instances[0].io_limit, Some(258_048));
    // Percentage size is aligned down to the minimum block size.
    let r = job("[a]\nsize=10%\nbs=4k\n").resolve(1_000_000).unwrap();
    assert_eq!(r.instances[0].size, 98_304);
}

#[test]
fn resolve_io_limits() {
    let r = job("[a]\nsize=1m\nio_size=4m\n").resolve(GI).unwrap();
    assert_eq!(r.instances[0].io_limit, Some(4 * MI));
    let r = job("[a]\nsize=1m\nio_size=4m\ntime_based\nruntime=10s\n").resolve(GI).unwrap();
    assert_eq!(r.instances[0].io_limit, None);
}

#[test]
fn resolve_errors() {
    assert_eq!(job("[a]\n").resolve(0), Err(ResolveError::EmptyDevice));
    assert!(matches!(job("[a]\noffset=2g\n").resolve(GI), Err(ResolveError::OffsetBeyondDevice { .. })));
    assert!(matches!(
        job("[a]\nsize=512m\noffset=768m\n").resolve(GI),
        Err(ResolveError::RegionOutOfBounds { size, .. }) if size == 512 * MI
    ));
    assert!(matches!(
        job("[a]\nnumjobs=9\nsize=128m\noffset_increment=128m\n").resolve(GI),
        Err(ResolveError::OffsetBeyondDevice { instance: 8, .. })
    ));
    assert!(matches!(
        job("[a]\nbs=1m\nsize=64k\n").resolve(GI),
        Err(ResolveError::Gen { source: GenError::BlockLargerThanRegion { .. }, .. })
    ));
    assert!(matches!(job("[a]\nsize=1%\nbs=1m\n").resolve(MI), Err(ResolveError::EmptyRegion { .. })));
}

#[test]
fn resolved_generators_are_distinct_per_instance_and_deterministic() {
    let spec = job("[a]\nrw=randwrite\nnumjobs=2\nsize=4m\nrandom_distribution=zipf:0.8\n");
    let r = spec.resolve(GI).unwrap();
    let a: Vec<_> = r.generator(0).unwrap().take(100).collect();
    let b: Vec<_> = r.generator(1).unwrap().take(100).collect();
    let a2: Vec<_> = spec.resolve(GI).unwrap().generator(0).unwrap().take(100).collect();
    assert_eq!(a, a2);
    assert_ne!(a, b);
    assert_eq!(r.generator(2).unwrap_err(), GenError::NoSuchInstance { index: 2, count: 2 });
    // A different randseed changes the stream.
    let c: Vec<_> = job("[a]\nrw=randwrite\nnumjobs=2\nsize=4m\nrandom_distribution=zipf:0.8\nrandseed=7\n")
        .resolve(GI)
        .unwrap()
        .generator(0)
        .unwrap()
        .take(100)
        .collect();
    assert_ne!(a, c);
}

#[test]
fn resolved_job_generates_whole_region_once() {
    let r = job("[a]\nrw=randwrite\nsize=1m\noffset=1m\n").resolve(GI).unwrap();
    let mut offs: Vec<u64> = r.generator(0).unwrap().map(|io| io.offset).collect();
    offs.sort_unstable();
    let expect: Vec<u64> = (0..256).map(|i| MI + i * 4096).collect();
    assert_eq!(offs, expect);
    assert!(r.precondition(0).unwrap().is_none(), "precondition=none yields no stream");
}

#[test]
fn sluice_sizes_read_iec_units_as_powers_of_two_and_si_units_as_powers_of_ten() {
    let b = |s| parse_bytes(s).unwrap();
    for (text, want) in [
        ("1GiB", KI * KI * KI),
        ("1gib", KI * KI * KI),
        ("4KiB", 4 * KI),
        ("3MiB", 3 * KI * KI),
        ("2TiB", 2 * KI * KI * KI * KI),
        ("1PiB", KI * KI * KI * KI * KI),
        ("1GB", 1_000_000_000),
        ("5MB", 5_000_000),
        ("8kB", 8_000),
        ("1TB", 1_000_000_000_000),
        ("1g", KI * KI * KI),
        ("64k", 64 * KI),
        ("2M", 2 * KI * KI),
        ("4096", 4096),
        ("4096b", 4096),
        ("0x1000", 4096),
    ] {
        assert_eq!(b(text), want, "{text}");
    }
    assert_eq!(parse_bytes("1GiBs"), Err(ValueError::UnknownSuffix("gibs".into())));
    assert_eq!(parse_bytes("1.5GiB"), Err(ValueError::BadNumber("1.5GiB".into())));
    assert_eq!(parse_bytes("20000000PiB"), Err(ValueError::Overflow("20000000PiB".into())));
    // Job files keep fio's reading (its kb_base=1024 quirk).
    assert_eq!(parse_fio_bytes("1GiB"), Ok(1_000_000_000));
    assert_eq!(parse_fio_bytes("1GB"), Ok(KI * KI * KI));
}

//! The `sluice` command end to end: real processes, real files, the JSON
//! contracts other tools read.

use std::path::PathBuf;
use std::process::Command;

fn sluice() -> Command {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("sluice-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Both record layers open and seal the same bytes (each checks what it
/// opened and a rustls client checks what it sealed) and report speeds.
#[test]
fn bench_tls_records_compares_both_record_layers() {
    let dir = tmp("tls-records");
    let json = dir.join("tls.json");
    let out = sluice().args(["bench", "tls-records", "--mib", "4", "--json"]).arg(&json).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("own / rustls"));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    for side in ["own", "rustls_unbuffered"] {
        for key in ["open_mib_per_s", "seal_mib_per_s"] {
            assert!(r[side][key].as_f64().is_some_and(|v| v > 0.0), "{side}.{key} in {r}");
        }
    }
    let bad = sluice().args(["bench", "tls-records", "--mib", "0"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("must be positive"));
}

#[test]
fn bench_media_writes_the_documented_json_rows() {
    let dir = tmp("media");
    let json = dir.join("media.json");
    let out =
        sluice().args(["bench", "media", "--quick", "--only", "64k-zipf1.2", "--json"]).arg(&json).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("64k-zipf1.2"), "{stdout}");
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2, "qlc and tlc rows of 64k-zipf1.2");
    for r in rows {
        for key in ["workload", "device", "waf", "mib_per_s", "paper_waf", "paper_mib_per_s"] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert!(r["waf"].as_f64().unwrap() > 0.5 && r["mib_per_s"].as_f64().unwrap() > 1.0, "{r}");
    }
    assert!(dir.join("jobs/qlc-64k-zipf1.2.fio").exists(), "the job file that ran is kept");
}

#[test]
fn bench_job_runs_a_user_job_file_and_rejects_bad_input() {
    let dir = tmp("job");
    let file = dir.join("j.fio");
    std::fs::write(&file, "[global]\nbs=64k\niodepth=4\nsize=32m\n[w]\nrw=randwrite\nrandom_distribution=zipf:1.1\n")
        .unwrap();
    let json = dir.join("r.json");
    let out = sluice()
        .args(["bench", "job"])
        .arg(&file)
        .args(["--system", "tlc", "--capacity", "1g", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["device"]["host_write_bytes"].as_u64(), Some(32 << 20));

    let out = sluice().args(["bench", "job"]).arg(&file).args(["--system", "floppy"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown system"));
    std::fs::write(&file, "[w]\nrw=sideways\n").unwrap();
    let out = sluice().args(["bench", "job"]).arg(&file).args(["--system", "qlc"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn bench_trace_replays_a_csv_trace() {
    let dir = tmp("trace");
    let file = dir.join("t.csv");
    std::fs::write(&file, "timestamp_us,op,offset,size\n0,W,0,4096\n100,R,0,4096\n200,T,0,4096\n300,F,0,0\n").unwrap();
    let out =
        sluice().args(["bench", "trace"]).arg(&file).args(["--system", "scm", "--capacity", "1g"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("4 records (1 reads, 1 writes, 1 trims, 1 flushes"));
}

/// A real trace's layout (Heimdall's cut of MSR: ms timestamps, 512-byte
/// requests), several passes after a fill, on a stack: per-pass rows and
/// the steady window in the JSON; an unknown format is refused.
#[test]
fn bench_trace_replays_a_real_trace_in_passes_on_a_stack() {
    let dir = tmp("trace-passes");
    let file = dir.join("t.trace");
    std::fs::write(&file, "0.000 0 4096 4096 0\n0.500 0 8704 512 0\n1.250 0 4096 4096 1\n").unwrap();
    let json = dir.join("t.json");
    let out = sluice()
        .args(["bench", "trace"])
        .arg(&file)
        .args(["--format", "heimdall", "--system", "sluice+qlc", "--capacity", "2g", "--cache", "64m"])
        .args(["--passes", "4", "--precondition", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("1 unaligned") && stdout.contains("steady state (last 2 of 4 passes)"), "{stdout}");
    let run: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(run["passes"].as_array().unwrap().len(), 4);
    assert_eq!(run["steady_write_bytes"], 2 * 8192, "two passes of 4 KiB + 512 B widened to 4 KiB");
    assert_eq!(
        run["precondition_bytes"].as_u64().unwrap() >> 20,
        8 * 204,
        "every byte of the 8 volumes (80 % of 2 GiB)"
    );
    let bad =
        sluice().args(["bench", "trace"]).arg(&file).args(["--format", "blk", "--system", "qlc"]).output().unwrap();
    assert!(!bad.status.success() && String::from_utf8_lossy(&bad.stderr).contains("csv, msr, heimdall or vscsi"));
}

#[test]
fn sim_runs_a_seed_range_and_reports_its_crashes() {
    let out = sluice().args(["sim", "--seeds", "3", "--seed-start", "1000", "--ops", "900"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("3 seeds from 1000") && text.contains("all passed"), "{text}");
    let bad = sluice().args(["sim", "--seeds", "x"]).output().unwrap();
    assert!(!bad.status.success());
}

/// `sluice bench caching` writes the documented JSON keys for the cases it
/// ran; `sluice clean` on an engine that is not in place refuses, clearly,
/// and leaves it as it was (a later `sluice check` finds it clean).
#[test]
fn bench_caching_writes_its_rows_and_clean_refuses_a_bands_engine() {
    let dir = tmp("caching");
    let json = dir.join("caching.json");
    let out = sluice()
        .args(["bench", "caching", "--quick", "--only", "no-cache,selective-volume", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = rows.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        for key in [
            "case",
            "hdd_bytes_written",
            "hdd_busy_s",
            "temp_mib_per_s",
            "spill_bytes",
            "cutoff_bypass_fraction",
            "errors",
        ] {
            assert!(r.get(key).is_some(), "missing {key} in {r}");
        }
        assert!(r["errors"].as_array().unwrap().is_empty(), "{r}");
    }
    let config = dir.join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            "data_dir = {:?}\n[cache]\nsize = \"64m\"\n[capacity]\nsize = \"1g\"\n[engine]\nchunk_size = \"4m\"\n\
             band_size = \"32m\"\n[[volume]]\nname = \"default\"\nsize = \"256m\"\n",
            dir.join("data")
        ),
    )
    .unwrap();
    let out = sluice().args(["format", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = sluice().args(["clean", "--config"]).arg(&config).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("in-place"), "{err}");
    let out = sluice().args(["check", "--config"]).arg(&config).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `sluice advise` on a small trace: the report, the documented JSON keys;
/// bad input is a one-line error and writes nothing.
#[test]
fn advise_reports_a_curve_a_recommendation_and_endurance() {
    let dir = tmp("advise");
    let trace = dir.join("t.csv");
    // 40 MiB of 64 KiB writes, each region read back and deleted 20 MiB later.
    let mut text = String::from(
        "# sluice trace: volume \"t\", size 268435456 bytes, started at unix time 0\ntimestamp_us,op,offset,size\n",
    );
    let mib = 1u64 << 20;
    for i in 0..640u64 {
        text += &format!("{},W,{},65536\n", i * 1000, (i * 65536) % (128 * mib));
        if i >= 320 {
            let old = ((i - 320) * 65536) % (128 * mib);
            text += &format!("{},R,{old},65536\n{},T,{old},65536\n", i * 1000 + 1, i * 1000 + 2);
        }
    }
    std::fs::write(&trace, text).unwrap();
    let json = dir.join("advise.json");
    let out = sluice()
        .args(["advise", "--capacity", "qlc", "--sizes", "64m,128m", "--seq-cutoff", "never", "--trace"])
        .arg(&trace)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("peak 20 MiB") && stdout.contains("recommended cache: 64 MiB"), "{stdout}");
    // Half of what was written is deleted in the cache and never reaches the drive.
    let a: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let written = a["curve"][0]["capacity_write_bytes"].as_u64().unwrap();
    assert!(written <= 21 << 20, "{written} bytes reached the drive\n{stdout}");
    assert_eq!(a["volume_bytes"], 256 << 20, "from the trace's header");
    assert_eq!(a["curve"].as_array().unwrap().len(), 2);
    for key in ["profile", "curve", "recommended_bytes", "reason", "p95_rule_bytes", "endurance"] {
        assert!(a.get(key).is_some(), "missing {key}");
    }
    // The policy from a serve config, the volume named by the trace's header.
    let cfg = dir.join("sluice.toml");
    std::fs::write(&cfg, "[[volume]]\nname = \"t\"\nsize = \"256m\"\nseq_cutoff = \"never\"\n").unwrap();
    let json2 = dir.join("advise2.json");
    let out = sluice()
        .args(["advise", "--capacity", "qlc", "--sizes", "64m,128m", "--config"])
        .arg(&cfg)
        .arg("--trace")
        .arg(&trace)
        .arg("--json")
        .arg(&json2)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let b: serde_json::Value = serde_json::from_slice(&std::fs::read(&json2).unwrap()).unwrap();
    assert_eq!(a["curve"], b["curve"], "the config's seq_cutoff = never, as the flag");
    for (args, expect) in [
        (vec!["--sizes", "1m"], "64 MiB or more"),
        (vec!["--capacity", "tape"], "hdd, qlc or tlc"),
        (vec!["--mode", "fast"], "mode"),
        (vec!["--config", "/nonexistent/sluice.toml"], "sluice.toml"),
    ] {
        let bad = dir.join("bad.json");
        let out =
            sluice().arg("advise").arg("--trace").arg(&trace).args(&args).arg("--json").arg(&bad).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expect), "{args:?}: {err}");
        assert!(!bad.exists());
    }
    let out = sluice().args(["advise", "--trace"]).arg(dir.join("missing.csv")).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("missing.csv"));
    let _ = std::fs::remove_dir_all(&dir);
}

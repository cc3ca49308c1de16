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
    assert!(String::from_utf8_lossy(&out.stdout).contains("4 records (1 reads, 1 writes, 1 trims, 1 flushes)"));
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

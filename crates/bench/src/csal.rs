//! `sluice bench csal`: the CSAL white paper's evaluation, regenerated on the
//! emulators in virtual time — QLC only, TLC only, a set-associative cache
//! over SCM + QLC, Sluice over SCM + QLC and Sluice over SCM + ZNS, under
//! the paper's workloads (8 jobs on 8 partitions, which on Sluice are 8
//! volumes; iodepth 32; preconditioned).
//!
//! Every row is an ordinary fio job file run through `job::run_job_text`, the
//! path `sluice bench job` takes, so any row can be rerun or varied by hand.
//! WAF is the paper's: bytes programmed to the capacity device's media per
//! byte the jobs wrote ("WAF is only 0.17 (data written to QLC drive)");
//! `waf_host` (bytes written to both devices per user byte) and `waf_device`
//! (the capacity device's own internal WAF) are reported beside it.
//!
//! Scale: every system gets the same capacity device (16 GiB, or 2 GiB with
//! `--quick`) and, on stacks, an SCM cache of 1/32 of it; the measured phase
//! writes a fixed number of bytes per job, so fast and slow systems do the
//! same work.

use crate::job::{run_job_text, BenchError, JobReport, RunOptions, System};
use crate::media::{job_text_with, PAPER_ROWS};
use serde::Serialize;
use std::time::Instant;

/// Systems of the table, in order.
pub const SYSTEMS: [System; 5] = [System::Qlc, System::Tlc, System::SetAssocQlc, System::SluiceQlc, System::SluiceZns];

/// The paper's SCM + QLC rows (per job): (workload, MiB/s, WAF).
pub const PAPER_SLUICE_QLC: [(&str, f64, f64); 5] = [
    ("4k-uniform", 70.4, 3.57),
    ("4k-zipf1.2", 496.0, 0.17),
    ("64k-zipf0.8", 125.0, 2.87),
    ("64k-zipf1.2", 544.0, 0.41),
    ("mixed", 163.0, 3.54),
];

/// Scale of a run.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CsalScale {
    /// Capacity device size (QLC, TLC, ZNS usable).
    pub capacity_bytes: u64,
    /// Bytes each job writes (or reads and writes) in the measured phase.
    pub io_bytes_per_job: u64,
    /// Random drive writes after the fill that precondition each row.
    pub steady_state_drive_writes: f64,
}

impl CsalScale {
    pub fn full() -> CsalScale {
        CsalScale { capacity_bytes: 16 << 30, io_bytes_per_job: 256 << 20, steady_state_drive_writes: 1.0 }
    }
    pub fn quick() -> CsalScale {
        CsalScale { capacity_bytes: 1536 << 20, io_bytes_per_job: 32 << 20, steady_state_drive_writes: 1.0 }
    }
}

/// One row of the table.
#[derive(Clone, Debug, Serialize)]
pub struct CsalRow {
    pub workload: String,
    pub system: String,
    /// Per-job write bandwidth (the paper's unit).
    pub mib_per_s: f64,
    /// Per-job read bandwidth, for the mixed workload.
    pub read_mib_per_s: Option<f64>,
    /// Capacity media bytes programmed / user bytes written (the paper's WAF).
    pub waf: f64,
    /// (cache + capacity) bytes written by the host side / user bytes written.
    pub waf_host: f64,
    /// The capacity device's own WAF.
    pub waf_device: f64,
    /// Bytes written to the cache device / user bytes written (stacks only).
    pub cache_write_ratio: Option<f64>,
    pub paper_mib_per_s: Option<f64>,
    pub paper_waf: Option<f64>,
    /// This row's bandwidth over the `qlc` row's of the same workload.
    pub speedup_vs_qlc: Option<f64>,
    /// The paper's SCM + QLC speedup over QLC, where it gives both.
    pub paper_speedup_vs_qlc: Option<f64>,
    pub capacity_bytes: u64,
    pub wall_seconds: f64,
    pub report: JobReport,
}

fn paper(workload: &str, system: System) -> (Option<f64>, Option<f64>) {
    match system {
        System::SluiceQlc => {
            PAPER_SLUICE_QLC.iter().find(|r| r.0 == workload).map_or((None, None), |r| (Some(r.1), Some(r.2)))
        }
        System::Qlc | System::Tlc => PAPER_ROWS
            .iter()
            .find(|r| r.workload == workload && r.system == system)
            .map_or((None, None), |r| (Some(r.mib_per_s), Some(r.waf))),
        _ => (None, None),
    }
}

/// Bytes per job of the measured phase: the mixed workload moves 64 KiB
/// reads and 4 KiB writes half and half by count, so it runs 17× longer to
/// write as much as the write-only rows.
pub fn io_size(workload: &str, scale: &CsalScale) -> u64 {
    if workload == "mixed" {
        scale.io_bytes_per_job * 17
    } else {
        scale.io_bytes_per_job
    }
}

/// Run one workload on one system at `scale`.
pub fn run_row(
    workload: &str,
    system: System,
    scale: &CsalScale,
    progress: &mut dyn FnMut(&str, f64),
) -> Result<CsalRow, BenchError> {
    let exposed = system.exposed_bytes(scale.capacity_bytes);
    let text = job_text_with(workload, exposed, &format!("io_size={}\n", io_size(workload, scale)));
    let opts = RunOptions {
        system,
        capacity_bytes: scale.capacity_bytes,
        steady_state_drive_writes: scale.steady_state_drive_writes,
    };
    let t0 = Instant::now();
    let report = run_job_text(&text, &opts, progress)?;
    let (paper_mib_per_s, paper_waf) = paper(workload, system);
    let user = report.device.host_write_bytes.max(1) as f64;
    Ok(CsalRow {
        workload: workload.to_string(),
        system: system.name().to_string(),
        mib_per_s: report.write_mib_per_s,
        read_mib_per_s: (workload == "mixed").then_some(report.read_mib_per_s),
        waf: report.waf,
        waf_host: report.waf_host,
        waf_device: report.waf_device,
        cache_write_ratio: report.tiers.map(|t| t.cache.host_write_bytes as f64 / user),
        paper_mib_per_s,
        paper_waf,
        speedup_vs_qlc: None,
        paper_speedup_vs_qlc: None,
        capacity_bytes: scale.capacity_bytes,
        wall_seconds: t0.elapsed().as_secs_f64(),
        report,
    })
}

/// Fill in each row's speedup over the `qlc` row of its workload.
pub fn add_speedups(rows: &mut [CsalRow]) {
    let base: Vec<(String, f64)> =
        rows.iter().filter(|r| r.system == "qlc").map(|r| (r.workload.clone(), r.mib_per_s)).collect();
    let paper_qlc =
        |w: &str| PAPER_ROWS.iter().find(|r| r.workload == w && r.system == System::Qlc).map(|r| r.mib_per_s);
    for r in rows.iter_mut() {
        if let Some((_, q)) = base.iter().find(|(w, _)| *w == r.workload) {
            r.speedup_vs_qlc = (*q > 0.0).then(|| r.mib_per_s / q);
        }
        if r.system == "sluice+qlc" {
            r.paper_speedup_vs_qlc = r.paper_mib_per_s.zip(paper_qlc(&r.workload)).map(|(s, q)| s / q);
        }
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or("-".to_string(), |x| format!("{x:.prec$}"))
}

/// A human table of rows.
pub fn table(rows: &[CsalRow]) -> String {
    let mut s = format!(
        "{:<12} {:<13} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>6}\n",
        "workload", "system", "MiB/s", "paper", "WAF", "paper", "host", "device", "×qlc", "paper×", "read", "wall s"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<12} {:<13} {:>9.2} {:>8} {:>7.3} {:>7} {:>7.2} {:>7.2} {:>7} {:>8} {:>8} {:>6.1}\n",
            r.workload,
            r.system,
            r.mib_per_s,
            opt(r.paper_mib_per_s, 1),
            r.waf,
            opt(r.paper_waf, 2),
            r.waf_host,
            r.waf_device,
            opt(r.speedup_vs_qlc, 1),
            opt(r.paper_speedup_vs_qlc, 1),
            opt(r.read_mib_per_s, 1),
            r.wall_seconds
        ));
    }
    s.push_str(
        "MiB/s per job of 8. WAF = bytes programmed to the capacity device's media / bytes the jobs wrote \
         (the paper's definition);\nhost = bytes written to cache + capacity devices / bytes the jobs wrote; \
         device = the capacity device's own WAF.\n",
    );
    s
}

/// The table as an SVG bar chart: per workload, one bar per system, log-scale MiB/s per job.
pub fn svg(rows: &[CsalRow]) -> String {
    let workloads: Vec<&str> = {
        let mut w: Vec<&str> = Vec::new();
        for r in rows {
            if !w.contains(&r.workload.as_str()) {
                w.push(&r.workload);
            }
        }
        w
    };
    let systems: Vec<&str> = SYSTEMS.iter().map(|s| s.name()).filter(|n| rows.iter().any(|r| r.system == *n)).collect();
    let colors = ["#8c564b", "#9467bd", "#7f7f7f", "#1f77b4", "#2ca02c"];
    let (w, h, left, top, bottom) = (960.0, 420.0, 60.0, 40.0, 80.0);
    let plot_h = h - top - bottom;
    let max = rows.iter().map(|r| r.mib_per_s).fold(1.0f64, f64::max);
    let (lo, hi) = (0.1f64.log10(), (max * 2.0).log10());
    let y = |v: f64| top + plot_h * (1.0 - ((v.max(0.1)).log10() - lo) / (hi - lo));
    let group = (w - left - 20.0) / workloads.len().max(1) as f64;
    let bar = group * 0.8 / systems.len().max(1) as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">Write bandwidth per job (MiB/s, log scale), 8 jobs, virtual time</text>\n"
    );
    let mut tick = 0.1f64;
    while tick <= max * 2.0 {
        let ty = y(tick);
        s.push_str(&format!(
            "<line x1=\"{left}\" x2=\"{}\" y1=\"{ty:.1}\" y2=\"{ty:.1}\" stroke=\"#ddd\"/>\
             <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{tick}</text>\n",
            w - 20.0,
            left - 4.0,
            ty + 4.0
        ));
        tick *= 10.0;
    }
    for (wi, wl) in workloads.iter().enumerate() {
        let gx = left + wi as f64 * group + group * 0.1;
        for (si, sys) in systems.iter().enumerate() {
            if let Some(r) = rows.iter().find(|r| r.workload == *wl && r.system == *sys) {
                let x = gx + si as f64 * bar;
                let top_y = y(r.mib_per_s);
                s.push_str(&format!(
                    "<rect x=\"{x:.1}\" y=\"{top_y:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{} {}: {:.2} MiB/s, WAF {:.3}</title></rect>\n",
                    bar * 0.9,
                    top + plot_h - top_y,
                    colors[si % colors.len()],
                    wl,
                    sys,
                    r.mib_per_s,
                    r.waf
                ));
            }
        }
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{wl}</text>\n",
            gx + group * 0.4,
            top + plot_h + 16.0
        ));
    }
    for (si, sys) in systems.iter().enumerate() {
        let x = left + si as f64 * 150.0;
        s.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{sys}</text>\n",
            h - 30.0,
            colors[si % colors.len()],
            x + 16.0,
            h - 20.0
        ));
    }
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sluice_beats_qlc_on_small_random_writes() {
        // The smallest meaningful scale: Sluice must turn 4 KiB random writes
        // into far more bandwidth and far less QLC wear than the bare drive.
        let scale = CsalScale { capacity_bytes: 1 << 30, io_bytes_per_job: 8 << 20, steady_state_drive_writes: 0.5 };
        let mut rows = vec![
            run_row("4k-uniform", System::Qlc, &scale, &mut |_, _| {}).unwrap(),
            run_row("4k-uniform", System::SluiceQlc, &scale, &mut |_, _| {}).unwrap(),
        ];
        add_speedups(&mut rows);
        let (q, s) = (&rows[0], &rows[1]);
        assert!(s.speedup_vs_qlc.unwrap() > 3.0, "sluice {} vs qlc {} MiB/s", s.mib_per_s, q.mib_per_s);
        assert!(s.waf < q.waf / 3.0, "sluice WAF {} vs qlc {}", s.waf, q.waf);
        assert!(s.waf_host > 1.0 && s.cache_write_ratio.unwrap() >= 1.0, "{s:?}");
        let svg = svg(&rows);
        assert!(svg.starts_with("<svg") && svg.matches("<rect").count() >= 2 + 2);
    }
}

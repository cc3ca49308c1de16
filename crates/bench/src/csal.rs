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
//! `--quick`) and, on stacks, an SCM cache of 1/19.2 of it (the paper's
//! 800 GB : 15.36 TB); the measured phase
//! writes a fixed number of bytes per job, so fast and slow systems do the
//! same work.

use crate::job::{run_job_text, BenchError, JobReport, RunOptions, System};
use crate::media::{job_text_with, PAPER_ROWS};
use serde::Serialize;
use std::time::Instant;

/// Systems of the table, in order.
pub const SYSTEMS: [System; 6] =
    [System::Qlc, System::Tlc, System::SetAssocQlc, System::SluiceQlc, System::SluiceQlcLifetime, System::SluiceZns];

/// The ZNS isolation experiment: four tenants whose data lives for very
/// different times, on Sluice over ZNS with per-volume zones and with one
/// zone stream shared by all volumes.
pub const TENANT_WORKLOAD: &str = "tenants4";
pub const TENANT_SYSTEMS: [System; 2] = [System::SluiceZns, System::SluiceZnsShared];

/// Every workload of the table, in order.
pub fn workloads() -> Vec<&'static str> {
    let mut w = crate::media::WORKLOADS.to_vec();
    w.push(TENANT_WORKLOAD);
    w
}

/// The systems a workload runs on.
pub fn systems_of(workload: &str) -> &'static [System] {
    if workload == TENANT_WORKLOAD {
        &TENANT_SYSTEMS
    } else {
        &SYSTEMS
    }
}

/// The job file of a workload on `exposed` bytes (8 equal partitions; on
/// Sluice stacks, 8 volumes), with `measure` saying how long it runs.
pub fn job_text(workload: &str, exposed: u64, measure: &str) -> String {
    if workload == TENANT_WORKLOAD {
        tenants_job_text(exposed, measure)
    } else {
        job_text_with(workload, exposed, measure)
    }
}

/// Four tenants, each on two of the eight partitions (volumes), with data
/// of four lifetimes: `log` rewrites its space sequentially (every block
/// lives exactly one pass, and dies with its neighbours); `hot` writes 4 KiB
/// records with zipf:1.2 (a small hot set dies fast, the tail lives long);
/// `warm` overwrites 64 KiB blocks uniformly (lifetime ≈ its space); `cold`
/// was written once and is only read (its data never dies). Kept in their
/// own zones, the log's zones empty themselves and GC copies little; mixed
/// in shared zones, every zone holds some long-lived data that GC must copy
/// before it can reset the zone.
pub fn tenants_job_text(exposed: u64, measure: &str) -> String {
    let part = exposed / 8 / 4096 * 4096;
    let tenant = 2 * part;
    format!(
        "[global]\niodepth=32\nsize={tenant}\nrandseed=20231\n{measure}\n\
         [log]\nrw=write\nbs=128k\noffset=0\nprecondition=seq\n\n\
         [hot]\nrw=randwrite\nbs=4k\nrandom_distribution=zipf:1.2\noffset={}\nprecondition=seq+rand\n\n\
         [warm]\nrw=randwrite\nbs=64k\nrandom_distribution=random\noffset={}\nprecondition=seq+rand\n\n\
         [cold]\nrw=randread\nbs=64k\noffset={}\nprecondition=seq\n",
        tenant,
        2 * tenant,
        3 * tenant
    )
}

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
    /// The isolation workload: each tenant's own figures.
    pub tenants: Option<Vec<TenantRow>>,
    pub report: JobReport,
}

/// One tenant of the isolation workload (two volumes).
#[derive(Clone, Debug, Serialize)]
pub struct TenantRow {
    pub tenant: String,
    pub user_write_bytes: u64,
    /// Data bytes compaction and GC wrote to the capacity device for this
    /// tenant / bytes it wrote (headers and padding excluded).
    pub capacity_waf: f64,
    /// Of which GC: relocated bytes / bytes it wrote.
    pub gc_ratio: f64,
}

/// The tenants of `tenants_job_text`, in partition order.
pub const TENANTS: [&str; 4] = ["log", "hot", "warm", "cold"];

fn tenant_rows(report: &JobReport) -> Option<Vec<TenantRow>> {
    let vols = report.volumes.as_ref()?;
    let per = vols.len() / TENANTS.len();
    Some(
        TENANTS
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let v = &vols[k * per..(k + 1) * per];
                let user: u64 = v.iter().map(|t| t.user_write_bytes).sum();
                let gc: u64 = v.iter().map(|t| t.gc_bytes).sum();
                let moved: u64 = v.iter().map(|t| t.compaction_bytes).sum::<u64>() + gc;
                let ratio = |b: u64| if user > 0 { b as f64 / user as f64 } else { 0.0 };
                TenantRow {
                    tenant: name.to_string(),
                    user_write_bytes: user,
                    capacity_waf: ratio(moved),
                    gc_ratio: ratio(gc),
                }
            })
            .collect(),
    )
}

fn paper(workload: &str, system: System) -> (Option<f64>, Option<f64>) {
    match system {
        System::SluiceQlc | System::SluiceQlcLifetime => {
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
    } else if workload == TENANT_WORKLOAD {
        // Long enough for the log tenant to rewrite a good part of its space.
        scale.io_bytes_per_job * 4
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
    let text = job_text(workload, exposed, &format!("io_size={}\n", io_size(workload, scale)));
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
        tenants: if workload == TENANT_WORKLOAD { tenant_rows(&report) } else { None },
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
        "{:<12} {:<13} {:>9} {:>8} {:>7} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>11} {:>6}\n",
        "workload",
        "system",
        "MiB/s",
        "paper",
        "WAF",
        "paper",
        "host",
        "device",
        "×qlc",
        "paper×",
        "read",
        "busy c/cap",
        "wall s"
    );
    for r in rows {
        s.push_str(&format!(
            "{:<12} {:<13} {:>9.2} {:>8} {:>7.3} {:>7} {:>7.2} {:>7.2} {:>7} {:>8} {:>8} {:>11} {:>6.1}\n",
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
            match (r.report.cache_busy_share, r.report.capacity_busy_share) {
                (Some(c), Some(k)) => format!("{:.0}/{:.0} %", c * 100.0, k * 100.0),
                _ => format!("{:.0} %", r.report.busy_share * 100.0),
            },
            r.wall_seconds
        ));
    }
    s.push_str(
        "MiB/s per job of 8. WAF = bytes programmed to the capacity device's media / bytes the jobs wrote \
         (the paper's definition);\nhost = bytes written to cache + capacity devices / bytes the jobs wrote; \
         device = the capacity device's own WAF;\nbusy c/cap = share of the measured window the cache / capacity device had a request in flight \
         (the device alone on bare rows).\n",
    );
    s
}

/// The isolation workload's per-tenant table (empty without those rows).
pub fn tenant_table(rows: &[CsalRow]) -> String {
    let rows: Vec<&CsalRow> = rows.iter().filter(|r| r.tenants.is_some()).collect();
    if rows.is_empty() {
        return String::new();
    }
    let mut s = format!(
        "\n{TENANT_WORKLOAD}: capacity data writes per tenant byte (compaction + GC; of which GC)\n{:<20}",
        "system"
    );
    for t in TENANTS {
        s.push_str(&format!(" {t:>16}"));
    }
    s.push_str(&format!(" {:>10} {:>7}\n", "zones 1/2+", "WAF"));
    for r in rows {
        s.push_str(&format!("{:<20}", r.system));
        for t in r.tenants.iter().flatten() {
            let cell = if t.user_write_bytes == 0 {
                "(reads only)".to_string()
            } else {
                format!("{:.3} ({:.3})", t.capacity_waf, t.gc_ratio)
            };
            s.push_str(&format!(" {cell:>16}"));
        }
        let ten = r.report.band_tenancy.clone().unwrap_or_default();
        let one = ten.first().copied().unwrap_or(0);
        let more: u64 = ten.iter().skip(1).sum();
        s.push_str(&format!(" {:>10} {:>7.3}\n", format!("{one}/{more}"), r.waf));
    }
    s.push_str(
        "zones 1/2+: zones holding valid data of one tenant / of two or more at the end; \
         WAF: capacity media programmed / bytes the jobs wrote.\n",
    );
    s
}

/// The ZNS isolation figure: capacity data writes per byte each tenant
/// wrote, own zones vs shared zones, as an SVG bar chart.
pub fn tenant_svg(rows: &[CsalRow]) -> Option<String> {
    let rows: Vec<&CsalRow> = rows.iter().filter(|r| r.tenants.is_some()).collect();
    if rows.is_empty() {
        return None;
    }
    let colors = ["#2ca02c", "#d62728", "#1f77b4", "#ff7f0e"];
    let (w, h, left, top, bottom) = (640.0, 360.0, 60.0, 40.0, 70.0);
    let plot_h = h - top - bottom;
    let groups: Vec<(&str, Vec<f64>)> = rows
        .iter()
        .map(|r| (r.system.as_str(), r.tenants.iter().flatten().map(|t| t.capacity_waf).collect()))
        .collect();
    let max = groups.iter().flat_map(|g| g.1.iter().copied()).fold(0.5f64, f64::max) * 1.15;
    let y = |v: f64| top + plot_h * (1.0 - v / max);
    let group_w = (w - left - 20.0) / groups.len() as f64;
    let bar = group_w * 0.8 / TENANTS.len() as f64;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <text x=\"{left}\" y=\"20\" font-size=\"14\">ZNS isolation: capacity writes per byte each tenant wrote</text>\n"
    );
    let mut tick = 0.0f64;
    while tick <= max {
        svg_grid_line(&mut s, left, w - 20.0, y(tick), &format!("{tick:.1}"));
        tick += if max > 3.0 { 1.0 } else { 0.5 };
    }
    for (gi, (system, vals)) in groups.iter().enumerate() {
        let gx = left + gi as f64 * group_w + group_w * 0.1;
        for (ti, v) in vals.iter().enumerate() {
            let x = gx + ti as f64 * bar;
            s.push_str(&format!(
                "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"{}\"><title>{system} {}: {v:.3}</title></rect>\n",
                y(*v),
                bar * 0.9,
                top + plot_h - y(*v),
                colors[ti % colors.len()],
                TENANTS[ti]
            ));
        }
        svg_label(&mut s, gx + group_w * 0.4, top + plot_h + 16.0, system);
    }
    svg_legend(&mut s, &TENANTS, &colors, left, 110.0, h);
    s.push_str("</svg>\n");
    Some(s)
}

/// A horizontal grid line at `y` from `left` to `right`, labelled on the left.
fn svg_grid_line(s: &mut String, left: f64, right: f64, y: f64, label: &str) {
    s.push_str(&format!(
        "<line x1=\"{left}\" x2=\"{right}\" y1=\"{y:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
         <text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{label}</text>\n",
        left - 4.0,
        y + 4.0
    ));
}

/// A centred label under a group of bars.
fn svg_label(s: &mut String, x: f64, y: f64, text: &str) {
    s.push_str(&format!("<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\">{text}</text>\n"));
}

/// A legend along the bottom of a chart `h` high: one swatch per name.
fn svg_legend(s: &mut String, names: &[&str], colors: &[&str], left: f64, spacing: f64, h: f64) {
    for (i, name) in names.iter().enumerate() {
        let x = left + i as f64 * spacing;
        s.push_str(&format!(
            "<rect x=\"{x}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\"/><text x=\"{}\" y=\"{}\">{name}</text>\n",
            h - 30.0,
            colors[i % colors.len()],
            x + 16.0,
            h - 20.0
        ));
    }
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
    let rows: Vec<&CsalRow> = rows.iter().filter(|r| r.workload != TENANT_WORKLOAD).collect();
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
        svg_grid_line(&mut s, left, w - 20.0, y(tick), &tick.to_string());
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
        svg_label(&mut s, gx + group * 0.4, top + plot_h + 16.0, wl);
    }
    svg_legend(&mut s, &systems, &colors, left, 150.0, h);
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

    #[test]
    fn the_isolation_workload_separates_tenants_only_with_own_zones() {
        let scale = CsalScale { capacity_bytes: 1 << 30, io_bytes_per_job: 8 << 20, steady_state_drive_writes: 0.5 };
        let own = run_row(TENANT_WORKLOAD, System::SluiceZns, &scale, &mut |_, _| {}).unwrap();
        let shared = run_row(TENANT_WORKLOAD, System::SluiceZnsShared, &scale, &mut |_, _| {}).unwrap();
        let mixed = |r: &CsalRow| r.report.band_tenancy.as_ref().unwrap()[1..].iter().sum::<u64>();
        let zones = |r: &CsalRow| r.report.band_tenancy.as_ref().unwrap().iter().sum::<u64>();
        // Own zones: only GC's zones may hold several tenants.
        assert!(mixed(&own) * 4 < zones(&own), "own zones: {:?}", own.report.band_tenancy);
        assert!(mixed(&shared) * 2 > zones(&shared), "shared zones: {:?}", shared.report.band_tenancy);
        for r in [&own, &shared] {
            let t = r.tenants.as_ref().unwrap();
            assert_eq!(t.iter().map(|t| t.tenant.as_str()).collect::<Vec<_>>(), TENANTS);
            assert_eq!(t[3].user_write_bytes, 0, "cold only reads");
            assert!(t[..3].iter().all(|t| t.user_write_bytes > 0 && t.capacity_waf > 0.0), "{t:?}");
            assert_eq!(r.report.tiers.unwrap().capacity.errors, 0, "ZNS rejected nothing");
        }
        let table = tenant_table(&[own.clone(), shared.clone()]);
        assert!(table.contains("sluice+zns-shared") && table.contains("(reads only)"), "{table}");
        assert_eq!(tenant_svg(&[own, shared]).unwrap().matches("<rect").count(), 2 * 4 + 4);
    }
}

//! Rated endurance of the emulated devices, and projections from a write
//! rate to the years until the rating is used up.
//!
//! Owns: [`Endurance`] (a rating with its source) and [`Projection`].
//!
//! Two kinds of rating exist in data sheets:
//! - flash (SCM, TLC, QLC): drive writes per day (DWPD) over a warranty
//!   period, i.e. a total of host bytes written (TBW = DWPD × capacity ×
//!   365 × years) — a lifetime budget, so the projection is in years;
//! - hard disks: an annual workload rate limit (bytes read *and* written per
//!   year) — a rate, not a budget: beyond it the failure rate rises, so the
//!   projection is the share of the rate used.
//!
//! Invariants: every rating names its source (a vendor figure, docs/advise.md
//! lists them, and says which were not checked against a copy of the data
//! sheet); projections are plain arithmetic on host bytes, the unit the
//! ratings are given in.
//!
//! Why here: the ratings belong with the device profiles they describe.

use crate::{HddProfile, ScmProfile};
use serde::Serialize;

/// How a device's endurance is rated.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Rating {
    /// `dwpd` full-capacity writes per day for `years`.
    DriveWritesPerDay { dwpd: f64, years: f64 },
    /// At most this many bytes read plus written per year.
    WorkloadPerYear { bytes_per_year: f64 },
}

/// A device's rated endurance and where the figure comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Endurance {
    pub rating: Rating,
    pub source: &'static str,
}

/// What a daily traffic means against a rating.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Projection {
    pub written_per_day: f64,
    pub read_per_day: f64,
    /// Years until the rated bytes written are used up (flash); `None` for
    /// a rate rating, or when nothing is written.
    pub years: Option<f64>,
    /// The traffic as a share of the rating's daily allowance (1.0: the
    /// rating exactly).
    pub share_of_rating: f64,
    /// Flash: the smallest device of this rating that lasts its warranty
    /// period at this traffic (written per day / DWPD).
    pub device_bytes_for_rating: Option<f64>,
}

impl Endurance {
    /// Project `written_per_day` and `read_per_day` (host bytes) on a device
    /// of `device_bytes`.
    pub fn project(&self, device_bytes: u64, written_per_day: f64, read_per_day: f64) -> Projection {
        match self.rating {
            Rating::DriveWritesPerDay { dwpd, years } => {
                let allowance = dwpd * device_bytes as f64;
                Projection {
                    written_per_day,
                    read_per_day,
                    years: (written_per_day > 0.0).then(|| allowance * years / written_per_day),
                    share_of_rating: written_per_day / allowance,
                    device_bytes_for_rating: Some(written_per_day / dwpd),
                }
            }
            Rating::WorkloadPerYear { bytes_per_year } => Projection {
                written_per_day,
                read_per_day,
                years: None,
                share_of_rating: (written_per_day + read_per_day) * 365.0 / bytes_per_year,
                device_bytes_for_rating: None,
            },
        }
    }
}

impl ScmProfile {
    /// Optane P5800X: 100 DWPD over 5 years (Intel's product brief).
    pub fn endurance(&self) -> Endurance {
        Endurance {
            rating: Rating::DriveWritesPerDay { dwpd: 100.0, years: 5.0 },
            source: "Intel Optane SSD DC P5800X product brief: 100 DWPD, 5-year warranty",
        }
    }
}

impl crate::ssd::SsdProfile {
    /// QLC: Solidigm D5-P5316 (0.41 DWPD for 64 KiB random writes, 5 years;
    /// 22.9 PBW at 30.72 TB); TLC: a read-intensive data-centre TLC drive
    /// (Solidigm D7-P5520 class, 1 DWPD, 5 years).
    pub fn endurance(&self) -> Endurance {
        if self.name.starts_with("qlc") {
            Endurance {
                rating: Rating::DriveWritesPerDay { dwpd: 0.41, years: 5.0 },
                source: "Solidigm D5-P5316 product brief, as recalled (unverified): 0.41 DWPD (64 KiB random writes), 5-year warranty",
            }
        } else {
            Endurance {
                rating: Rating::DriveWritesPerDay { dwpd: 1.0, years: 5.0 },
                source: "Solidigm D7-P5520 product brief, as recalled (unverified): 1 DWPD (4 KiB random writes), 5-year warranty",
            }
        }
    }
}

impl HddProfile {
    /// Nearline 7200 rpm disks: 550 TB/year read plus written (Seagate's
    /// "Annualized Workload Rate" note; Exos and WD Gold data sheets).
    pub fn endurance(&self) -> Endurance {
        Endurance {
            rating: Rating::WorkloadPerYear { bytes_per_year: 550e12 },
            source:
                "Seagate, Annualized Workload Rate: enterprise capacity (nearline) disks < 550 TB/year read + written",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn projections_follow_the_rating_arithmetic() {
        // 100 DWPD on 1 GB for 5 years is 182.5 TB; at 50 GB/day that is 10 years.
        let p = ScmProfile::p5800x().endurance().project(1_000_000_000, 50e9, 0.0);
        assert!((p.years.unwrap() - 10.0).abs() < 1e-9 && (p.share_of_rating - 0.5).abs() < 1e-12, "{p:?}");
        assert_eq!(p.device_bytes_for_rating, Some(0.5e9));
        assert_eq!(ScmProfile::p5800x().endurance().project(1 << 30, 0.0, 1e9).years, None);
        // A disk: reads count too, and there is no lifetime.
        let h = HddProfile::hdd_7200().endurance().project(8_000_000_000_000, 1e12, 0.5e12);
        assert_eq!(h.years, None);
        assert!((h.share_of_rating - 1.5e12 * 365.0 / 550e12).abs() < 1e-9);
        let q = crate::ssd::SsdProfile::qlc(1 << 30).endurance();
        assert!(matches!(q.rating, Rating::DriveWritesPerDay { dwpd, .. } if dwpd < 1.0));
    }
}

//! Offset distributions: which block (of `n` equal ranges of the job region) the next random I/O hits.
//!
//! Owns: the [`Distribution`] enum as written in fio's `random_distribution=` option, and the samplers
//! [`Uniform`] (fio's default random map), [`UniformNoMap`] (`norandommap`), [`Zipf`] and [`Pareto`],
//! unified by [`Sampler`]. Blocks are indices in `[0, n)`; callers turn them into byte offsets.
//!
//! Invariants:
//! - Every sampler returns a block `< n`, and `n >= 1` (an empty range is a typed error).
//! - [`Uniform`] visits every block exactly once per pass of `n` draws. Its order is a keyed bijection
//!   ([`Permutation`]: a balanced Feistel network over the next even power of two, cycle-walked back
//!   into `[0, n)`), so it needs O(1) memory whatever `n` is.
//! - [`Zipf`] and [`Pareto`] reproduce fio's `lib/zipf.c` arithmetic step by step (same floating-point
//!   operation order, ζₙ summed over `min(n, 10⁷)` terms in ascending order, fio's 32-bit uniform
//!   `u = r / (2³² − 1)`, and the golden-ratio scatter hash with wrapping 64-bit arithmetic), so for the
//!   same `u` they return the same block as fio. Only the random source differs: fio's Tausworthe
//!   seeded from a hash of the file name versus our seeded [`Rng`].
//! - `rand_off` follows fio: a random 32-bit value, or `n × center` when a center is given
//!   (`zipf:θ:center`, `pareto:h:center`).
//!
//! Why: results of the simulator must be comparable with real fio runs, and the distribution shape (how
//! much I/O the hottest blocks absorb) is what drives cache and write-buffer behaviour. Matching fio's
//! formulas exactly, including its quirks (θ = 1 rejected, ζₙ truncation), keeps that shape identical;
//! the integration test `tests/fio_zipf.rs` checks it against the real fio binary.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::rng::{splitmix64, Rng};

/// fio's `GOLDEN_RATIO_64` (hash.h), used by `__hash_u64` to scatter zipf/pareto ranks over the file.
pub const FIO_GOLDEN_RATIO_64: u64 = 0x61C8_8646_80B5_83EB;
/// fio's `ZIPF_MAX_GEN`: ζₙ is summed over at most this many terms.
pub const ZIPF_MAX_GEN: u64 = 10_000_000;
/// fio's default θ for a bare `zipf` (`FIO_DEF_ZIPF`).
pub const DEFAULT_ZIPF_THETA: f64 = 1.1;
/// fio's default h for a bare `pareto` (`FIO_DEF_PARETO`).
pub const DEFAULT_PARETO_H: f64 = 0.2;

/// Errors of distribution parsing and sampler construction.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum DistError {
    /// Not one of `random`, `zipf[:θ[:center]]`, `pareto[:h[:center]]` (fio's names are case-sensitive).
    #[error("unknown random distribution {0:?} (supported: random, zipf[:theta[:center]], pareto[:h[:center]])")]
    Unknown(String),
    /// A fio distribution we do not implement (`normal`, `zoned`, `zoned_abs`).
    #[error("random distribution {0:?} is valid in fio but not supported here")]
    Unsupported(String),
    /// A parameter that is not a finite number.
    #[error("bad distribution parameter {0:?}: not a finite number")]
    BadNumber(String),
    /// More `:`-separated parameters than fio accepts.
    #[error("too many parameters in random distribution {0:?}")]
    TooManyParams(String),
    /// fio rejects θ = 1 ("zipf theta must different than 1.0"): the rank formula divides by 1 − θ.
    #[error("zipf theta must be different from 1.0")]
    ZipfThetaOne,
    /// fio requires 0 < h < 1.
    #[error("pareto h {0} out of range (0 < h < 1)")]
    ParetoOutOfRange(f64),
    /// fio requires 0 ≤ center ≤ 1.
    #[error("distribution center {0} out of range (0 <= center <= 1)")]
    CenterOutOfRange(f64),
    /// A sampler over zero blocks.
    #[error("distribution over an empty range (0 blocks)")]
    EmptyRange,
}

/// A `random_distribution=` value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub enum Distribution {
    /// `random`: uniform (with random map unless `norandommap`).
    #[default]
    Random,
    /// `zipf:θ[:center]`; `zipf` alone means θ = 1.1 (fio's default).
    Zipf { theta: f64, center: Option<f64> },
    /// `pareto:h[:center]`; `pareto` alone means h = 0.2 (fio's default).
    Pareto { h: f64, center: Option<f64> },
}

fn parse_float(s: &str, whole: &str) -> Result<f64, DistError> {
    let v: f64 = s.trim().parse().map_err(|_| DistError::BadNumber(whole.to_string()))?;
    if v.is_finite() {
        Ok(v)
    } else {
        Err(DistError::BadNumber(whole.to_string()))
    }
}

impl FromStr for Distribution {
    type Err = DistError;

    /// Parses fio's syntax. Validation matches fio's option callback: θ ≠ 1 (any other finite θ,
    /// including 0 and negatives, is accepted as fio does), 0 < h < 1, 0 ≤ center ≤ 1.
    fn from_str(s: &str) -> Result<Self, DistError> {
        let s = s.trim();
        let mut parts = s.split(':');
        let kind = parts.next().unwrap_or("");
        let p1 = parts.next();
        let p2 = parts.next();
        if parts.next().is_some() {
            return Err(DistError::TooManyParams(s.to_string()));
        }
        let center = match p2 {
            None => None,
            Some(c) => {
                let c = parse_float(c, s)?;
                if !(0.0..=1.0).contains(&c) {
                    return Err(DistError::CenterOutOfRange(c));
                }
                Some(c)
            }
        };
        match kind {
            "random" if p1.is_none() => Ok(Distribution::Random),
            "random" => Err(DistError::TooManyParams(s.to_string())),
            "zipf" => {
                let theta = match p1 {
                    None => DEFAULT_ZIPF_THETA,
                    Some(t) => parse_float(t, s)?,
                };
                if theta == 1.0 {
                    return Err(DistError::ZipfThetaOne);
                }
                Ok(Distribution::Zipf { theta, center })
            }
            "pareto" => {
                let h = match p1 {
                    None => DEFAULT_PARETO_H,
                    Some(t) => parse_float(t, s)?,
                };
                if h <= 0.0 || h >= 1.0 {
                    return Err(DistError::ParetoOutOfRange(h));
                }
                Ok(Distribution::Pareto { h, center })
            }
            "normal" | "zoned" | "zoned_abs" => Err(DistError::Unsupported(s.to_string())),
            _ => Err(DistError::Unknown(s.to_string())),
        }
    }
}

impl fmt::Display for Distribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Distribution::Random => write!(f, "random"),
            Distribution::Zipf { theta, center: None } => write!(f, "zipf:{theta}"),
            Distribution::Zipf { theta, center: Some(c) } => write!(f, "zipf:{theta}:{c}"),
            Distribution::Pareto { h, center: None } => write!(f, "pareto:{h}"),
            Distribution::Pareto { h, center: Some(c) } => write!(f, "pareto:{h}:{c}"),
        }
    }
}

/// fio's uniform draw for zipf/pareto: a 32-bit random value divided by `FRAND32_MAX` (so `u ∈ [0, 1]`).
pub fn fio_uniform(rng: &mut Rng) -> f64 {
    f64::from(rng.next_u32()) / f64::from(u32::MAX)
}

/// fio's scatter: `(__hash_u64(v) + rand_off) % n`, all in wrapping 64-bit arithmetic as in C.
pub fn scatter(v: u64, rand_off: u64, n: u64) -> u64 {
    v.wrapping_mul(FIO_GOLDEN_RATIO_64).wrapping_add(rand_off) % n
}

/// fio's `rand_off`: `n × center` if a center is given, else a random 32-bit value (fio draws it with
/// `__rand` from the 32-bit Tausworthe state of the distribution).
fn rand_off(n: u64, center: Option<f64>, rng: &mut Rng) -> u64 {
    match center {
        Some(c) => (n as f64 * c) as u64,
        None => u64::from(rng.next_u32()),
    }
}

/// A keyed bijection on `[0, n)`: balanced Feistel network over `2^(2h) >= n` values, cycle-walked.
///
/// Cycle walking re-applies the Feistel permutation until the value falls back into `[0, n)`; because
/// the outer permutation is a bijection, the restriction is a bijection on `[0, n)`. The domain is
/// less than `4n`, so the expected number of walks per call is below 4.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; Self::ROUNDS],
}

impl Permutation {
    const ROUNDS: usize = 6;

    /// A permutation of `[0, n)` selected by `key`. `n` must be at least 1.
    pub fn new(n: u64, key: u64) -> Result<Self, DistError> {
        if n == 0 {
            return Err(DistError::EmptyRange);
        }
        let bits = 64 - (n - 1).leading_zeros();
        let half_bits = bits.div_ceil(2);
        let mut p = Permutation { n, half_bits, keys: [0; Self::ROUNDS] };
        p.rekey(key);
        Ok(p)
    }

    /// Selects another permutation of the same `[0, n)`.
    pub fn rekey(&mut self, key: u64) {
        let mut ks = key;
        self.keys = std::array::from_fn(|_| splitmix64(&mut ks));
    }

    /// Number of elements.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// Always false: a permutation has at least one element.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn feistel(&self, x: u64) -> u64 {
        let h = self.half_bits;
        if h == 0 {
            return x;
        }
        let mask = if h >= 64 { u64::MAX } else { (1u64 << h) - 1 };
        let mut l = x >> h;
        let mut r = x & mask;
        for &k in &self.keys {
            let mut z = r ^ k;
            let f = splitmix64(&mut z) & mask;
            let nl = r;
            r = l ^ f;
            l = nl;
        }
        (l << h) | r
    }

    /// Image of `x` (`x < n`).
    pub fn apply(&self, x: u64) -> u64 {
        debug_assert!(x < self.n);
        let mut y = self.feistel(x);
        while y >= self.n {
            y = self.feistel(y);
        }
        y
    }
}

/// Uniform with fio's random map: each pass of `n` draws touches every block exactly once.
///
/// fio (verified on fio 3.33): with `time_based` each new pass has a new random order; when a job
/// wraps because `io_size`/`loops` exceed the region, fio re-seeds and repeats the same order.
/// `reshuffle_each_pass` selects between the two.
#[derive(Debug, Clone)]
pub struct Uniform {
    perm: Permutation,
    idx: u64,
    reshuffle_each_pass: bool,
    passes: u64,
}

impl Uniform {
    /// A random map over `n` blocks; the first order is drawn from `rng`.
    pub fn new(n: u64, reshuffle_each_pass: bool, rng: &mut Rng) -> Result<Self, DistError> {
        Ok(Uniform { perm: Permutation::new(n, rng.next_u64())?, idx: 0, reshuffle_each_pass, passes: 0 })
    }

    /// Next block; starts a new pass after `n` draws.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        if self.idx == self.perm.len() {
            self.idx = 0;
            self.passes += 1;
            if self.reshuffle_each_pass {
                self.perm.rekey(rng.next_u64());
            }
        }
        let b = self.perm.apply(self.idx);
        self.idx += 1;
        b
    }

    /// Completed passes so far.
    pub fn passes(&self) -> u64 {
        self.passes
    }
}

/// Uniform draws with replacement (`norandommap`).
#[derive(Debug, Clone)]
pub struct UniformNoMap {
    n: u64,
}

impl UniformNoMap {
    /// Uniform over `n` blocks.
    pub fn new(n: u64) -> Result<Self, DistError> {
        if n == 0 {
            return Err(DistError::EmptyRange);
        }
        Ok(UniformNoMap { n })
    }

    /// Next block.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        rng.below(self.n)
    }
}

/// fio's zipf (`zipf_init` / `zipf_next`).
#[derive(Debug, Clone)]
pub struct Zipf {
    n: u64,
    theta: f64,
    zetan: f64,
    zeta2: f64,
    rand_off: u64,
}

impl Zipf {
    /// Zipf over `n` ranges with exponent `theta` and a given scatter offset.
    pub fn with_rand_off(n: u64, theta: f64, rand_off: u64) -> Result<Self, DistError> {
        if n == 0 {
            return Err(DistError::EmptyRange);
        }
        if theta == 1.0 {
            return Err(DistError::ZipfThetaOne);
        }
        if !theta.is_finite() {
            return Err(DistError::BadNumber(theta.to_string()));
        }
        let to_gen = n.min(ZIPF_MAX_GEN);
        let mut zetan = 0.0f64;
        for i in 0..to_gen {
            zetan += (1.0 / (i + 1) as f64).powf(theta);
        }
        let zeta2 = 1.0f64.powf(theta) + 0.5f64.powf(theta);
        Ok(Zipf { n, theta, zetan, zeta2, rand_off })
    }

    /// Zipf as fio initialises it: `rand_off = n × center`, or a random 32-bit value from `rng`.
    pub fn new(n: u64, theta: f64, center: Option<f64>, rng: &mut Rng) -> Result<Self, DistError> {
        let off = rand_off(n, center, rng);
        Self::with_rand_off(n, theta, off)
    }

    /// ζₙ as fio computes it (truncated at 10⁷ terms).
    pub fn zetan(&self) -> f64 {
        self.zetan
    }

    /// The scatter offset.
    pub fn rand_off(&self) -> u64 {
        self.rand_off
    }

    /// fio's 1-based rank for uniform `u` (the value of `val` in `zipf_next` before `val--`).
    /// Can be `n + 1` for `u = 1.0`, exactly like fio; the scatter's `% n` folds it back.
    pub fn rank(&self, u: f64) -> u64 {
        let n = self.n;
        let alpha = 1.0 / (1.0 - self.theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - self.theta)) / (1.0 - self.zeta2 / self.zetan);
        let rand_z = u * self.zetan;
        if rand_z < 1.0 {
            1
        } else if rand_z < 1.0 + 0.5f64.powf(self.theta) {
            2
        } else {
            1u64.wrapping_add((n as f64 * (eta * u - eta + 1.0).powf(alpha)) as u64)
        }
    }

    /// Block hit by the `rank`-th most popular range.
    pub fn block_of_rank(&self, rank: u64) -> u64 {
        scatter(rank.wrapping_sub(1), self.rand_off, self.n)
    }

    /// Block for uniform `u` (deterministic; what fio returns for the same `u`).
    pub fn sample(&self, u: f64) -> u64 {
        self.block_of_rank(self.rank(u))
    }

    /// Next block.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.sample(fio_uniform(rng))
    }
}

/// fio's pareto (`pareto_init` / `pareto_next`).
#[derive(Debug, Clone)]
pub struct Pareto {
    n: u64,
    pareto_pow: f64,
    rand_off: u64,
}

impl Pareto {
    /// Pareto over `n` ranges with parameter `h` (0 < h < 1) and a given scatter offset.
    pub fn with_rand_off(n: u64, h: f64, rand_off: u64) -> Result<Self, DistError> {
        if n == 0 {
            return Err(DistError::EmptyRange);
        }
        if !(h > 0.0 && h < 1.0) {
            return Err(DistError::ParetoOutOfRange(h));
        }
        Ok(Pareto { n, pareto_pow: h.ln() / (1.0 - h).ln(), rand_off })
    }

    /// Pareto as fio initialises it (see [`Zipf::new`] for `rand_off`).
    pub fn new(n: u64, h: f64, center: Option<f64>, rng: &mut Rng) -> Result<Self, DistError> {
        let off = rand_off(n, center, rng);
        Self::with_rand_off(n, h, off)
    }

    /// Unscattered value `(n − 1) · u^(ln h / ln(1 − h))`, truncated like fio's assignment to an integer.
    pub fn value(&self, u: f64) -> u64 {
        ((self.n - 1) as f64 * u.powf(self.pareto_pow)) as u64
    }

    /// Block for uniform `u`.
    pub fn sample(&self, u: f64) -> u64 {
        scatter(self.value(u), self.rand_off, self.n)
    }

    /// Next block.
    pub fn next(&mut self, rng: &mut Rng) -> u64 {
        self.sample(fio_uniform(rng))
    }
}

/// Any of the samplers, chosen from a [`Distribution`] and `norandommap`.
#[derive(Debug, Clone)]
pub enum Sampler {
    Uniform(Uniform),
    UniformNoMap(UniformNoMap),
    Zipf(Zipf),
    Pareto(Pareto),
}

impl Sampler {
    /// Builds the sampler fio would use. As in fio, zipf and pareto never use the random map.
    pub fn new(
        dist: &Distribution,
        n: u64,
        norandommap: bool,
        reshuffle_each_pass: bool,
        rng: &mut Rng,
    ) -> Result<Self, DistError> {
        Ok(match *dist {
            Distribution::Random if norandommap => Sampler::UniformNoMap(UniformNoMap::new(n)?),
            Distribution::Random => Sampler::Uniform(Uniform::new(n, reshuffle_each_pass, rng)?),
            Distribution::Zipf { theta, center } => Sampler::Zipf(Zipf::new(n, theta, center, rng)?),
            Distribution::Pareto { h, center } => Sampler::Pareto(Pareto::new(n, h, center, rng)?),
        })
    }

    /// Next block in `[0, n)`.
    pub fn next_block(&mut self, rng: &mut Rng) -> u64 {
        match self {
            Sampler::Uniform(s) => s.next(rng),
            Sampler::UniformNoMap(s) => s.next(rng),
            Sampler::Zipf(s) => s.next(rng),
            Sampler::Pareto(s) => s.next(rng),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_fio_strings() {
        assert_eq!("random".parse::<Distribution>(), Ok(Distribution::Random));
        assert_eq!("zipf:1.2".parse::<Distribution>(), Ok(Distribution::Zipf { theta: 1.2, center: None }));
        assert_eq!("zipf".parse::<Distribution>(), Ok(Distribution::Zipf { theta: 1.1, center: None }));
        assert_eq!("zipf: 0.8".parse::<Distribution>(), Ok(Distribution::Zipf { theta: 0.8, center: None }));
        assert_eq!("zipf:1.2:0.5".parse::<Distribution>(), Ok(Distribution::Zipf { theta: 1.2, center: Some(0.5) }));
        assert_eq!("pareto:0.9".parse::<Distribution>(), Ok(Distribution::Pareto { h: 0.9, center: None }));
        assert_eq!("pareto".parse::<Distribution>(), Ok(Distribution::Pareto { h: 0.2, center: None }));
        // fio accepts θ = 0 and negative θ; only exactly 1 is rejected.
        assert!("zipf:0".parse::<Distribution>().is_ok());
        assert!("zipf:-1".parse::<Distribution>().is_ok());
    }

    #[test]
    fn parse_errors_are_typed() {
        assert_eq!("zipf:1".parse::<Distribution>(), Err(DistError::ZipfThetaOne));
        assert_eq!("zipf:1.0".parse::<Distribution>(), Err(DistError::ZipfThetaOne));
        assert_eq!("pareto:1".parse::<Distribution>(), Err(DistError::ParetoOutOfRange(1.0)));
        assert_eq!("pareto:0".parse::<Distribution>(), Err(DistError::ParetoOutOfRange(0.0)));
        assert_eq!("zipf:1.2:1.5".parse::<Distribution>(), Err(DistError::CenterOutOfRange(1.5)));
        assert!(matches!("zipf:abc".parse::<Distribution>(), Err(DistError::BadNumber(_))));
        assert!(matches!("zipf:nan".parse::<Distribution>(), Err(DistError::BadNumber(_))));
        assert!(matches!("ZIPF:1.2".parse::<Distribution>(), Err(DistError::Unknown(_))));
        assert!(matches!("normal".parse::<Distribution>(), Err(DistError::Unsupported(_))));
        assert!(matches!("zipf:1.2:0.5:1".parse::<Distribution>(), Err(DistError::TooManyParams(_))));
        assert!(matches!("random:5".parse::<Distribution>(), Err(DistError::TooManyParams(_))));
    }

    #[test]
    fn display_round_trips() {
        for s in ["random", "zipf:1.2", "zipf:0.8:0.25", "pareto:0.9", "pareto:0.3:1"] {
            let d: Distribution = s.parse().unwrap();
            assert_eq!(d.to_string().parse::<Distribution>().unwrap(), d);
        }
    }

    #[test]
    fn permutation_is_a_bijection_for_many_sizes() {
        for n in [1u64, 2, 3, 4, 5, 7, 8, 9, 100, 1000, 1023, 1024, 1025, 4097] {
            for key in [0u64, 1, 0xDEAD_BEEF] {
                let p = Permutation::new(n, key).unwrap();
                let mut seen = vec![false; n as usize];
                for x in 0..n {
                    let y = p.apply(x);
                    assert!(y < n);
                    assert!(!seen[y as usize], "n={n} key={key}: {y} hit twice");
                    seen[y as usize] = true;
                }
            }
        }
        assert_eq!(Permutation::new(0, 1).unwrap_err(), DistError::EmptyRange);
    }

    #[test]
    fn permutation_is_not_identity_and_depends_on_key() {
        let n = 1000;
        let a = Permutation::new(n, 1).unwrap();
        let b = Permutation::new(n, 2).unwrap();
        let fixed = (0..n).filter(|&x| a.apply(x) == x).count();
        assert!(fixed < 10, "{fixed} fixed points");
        let same = (0..n).filter(|&x| a.apply(x) == b.apply(x)).count();
        assert!(same < 10, "{same} equal images");
    }

    #[test]
    fn random_map_covers_every_block_once_per_pass() {
        for reshuffle in [false, true] {
            let n = 777u64;
            let mut rng = Rng::new(3);
            let mut u = Uniform::new(n, reshuffle, &mut rng).unwrap();
            let mut orders = Vec::new();
            for _pass in 0..3 {
                let order: Vec<u64> = (0..n).map(|_| u.next(&mut rng)).collect();
                let mut sorted = order.clone();
                sorted.sort_unstable();
                assert_eq!(sorted, (0..n).collect::<Vec<_>>());
                orders.push(order);
            }
            assert_eq!(u.passes(), 2);
            if reshuffle {
                assert_ne!(orders[0], orders[1]);
                assert_ne!(orders[1], orders[2]);
            } else {
                assert_eq!(orders[0], orders[1]);
                assert_eq!(orders[1], orders[2]);
            }
        }
    }

    #[test]
    fn no_map_draws_with_replacement() {
        let n = 100u64;
        let mut rng = Rng::new(5);
        let mut s = UniformNoMap::new(n).unwrap();
        let mut seen = vec![0u32; n as usize];
        for _ in 0..n {
            seen[s.next(&mut rng) as usize] += 1;
        }
        // With replacement, ~n/e blocks stay untouched in n draws; a map would leave none.
        let untouched = seen.iter().filter(|&&c| c == 0).count();
        assert!((20..=50).contains(&untouched), "{untouched}");
    }

    #[test]
    fn zipf_rank_formula_matches_reference() {
        // Hand-computed from the formulas in fio's lib/zipf.c.
        let n = 1000u64;
        let theta = 1.2;
        let z = Zipf::with_rand_off(n, theta, 0).unwrap();
        let zetan: f64 = (1..=n).map(|i| (1.0 / i as f64).powf(theta)).sum();
        assert!((z.zetan() - zetan).abs() < 1e-9);
        assert_eq!(z.rank(0.0), 1);
        assert_eq!(z.rank(0.99 / zetan), 1);
        assert_eq!(z.rank(1.01 / zetan), 2);
        assert_eq!(z.rank((1.0 + 0.5f64.powf(theta)) * 0.999 / zetan), 2);
        let u = 0.9;
        let zeta2 = 1.0 + 0.5f64.powf(theta);
        let eta = (1.0 - (2.0 / n as f64).powf(1.0 - theta)) / (1.0 - zeta2 / zetan);
        let expect = 1 + (n as f64 * (eta * u - eta + 1.0).powf(1.0 / (1.0 - theta))) as u64;
        assert_eq!(z.rank(u), expect);
        // Ranks are monotone in u.
        let mut last = 0;
        for i in 0..=1000 {
            let r = z.rank(i as f64 / 1000.0);
            assert!(r >= last);
            last = r;
        }
        assert!(last <= n + 1);
    }

    #[test]
    fn zipf_scatter_matches_fio_with_center() {
        // Verified against fio 3.33 (zipf:1.2:0.5, 65536 ranges): hottest blocks 32768, 1003, 34774, 3009.
        let n = 65536;
        let mut rng = Rng::new(1);
        let z = Zipf::new(n, 1.2, Some(0.5), &mut rng).unwrap();
        assert_eq!(z.rand_off(), 32768);
        let hot: Vec<u64> = (1..=5).map(|r| z.block_of_rank(r)).collect();
        assert_eq!(hot, vec![32768, 1003, 34774, 3009, 36780]);
    }

    #[test]
    fn zipf_truncates_zeta_at_ten_million_terms() {
        let small = Zipf::with_rand_off(ZIPF_MAX_GEN, 1.2, 0).unwrap();
        let big = Zipf::with_rand_off(ZIPF_MAX_GEN * 3, 1.2, 0).unwrap();
        assert_eq!(small.zetan(), big.zetan());
    }

    #[test]
    fn zipf_top_share_matches_theory() {
        let n = 10_000u64;
        let mut rng = Rng::new(11);
        let mut z = Zipf::new(n, 1.2, None, &mut rng).unwrap();
        let hot = z.block_of_rank(1);
        let draws = 200_000;
        let mut hits = 0;
        for _ in 0..draws {
            let b = z.next(&mut rng);
            assert!(b < n);
            hits += u32::from(b == hot);
        }
        let share = f64::from(hits) / f64::from(draws);
        let expect = 1.0 / z.zetan();
        assert!((share - expect).abs() < 0.005, "share {share} expected {expect}");
    }

    #[test]
    fn zipf_rejects_theta_one_and_empty() {
        let mut rng = Rng::new(1);
        assert_eq!(Zipf::new(10, 1.0, None, &mut rng).unwrap_err(), DistError::ZipfThetaOne);
        assert_eq!(Zipf::new(0, 1.2, None, &mut rng).unwrap_err(), DistError::EmptyRange);
        assert_eq!(Pareto::new(0, 0.5, None, &mut rng).unwrap_err(), DistError::EmptyRange);
        assert_eq!(Pareto::new(10, 1.5, None, &mut rng).unwrap_err(), DistError::ParetoOutOfRange(1.5));
    }

    #[test]
    fn small_ranges_stay_in_bounds() {
        let mut rng = Rng::new(2);
        for n in 1..6u64 {
            for d in ["random", "zipf:0.8", "zipf:1.2", "pareto:0.9", "zipf:0"] {
                let dist: Distribution = d.parse().unwrap();
                for nomap in [false, true] {
                    let mut s = Sampler::new(&dist, n, nomap, true, &mut rng).unwrap();
                    for _ in 0..200 {
                        assert!(s.next_block(&mut rng) < n, "{d} n={n}");
                    }
                }
            }
            // u = 1.0 is possible with fio's 32-bit uniform; it must not escape the range.
            let z = Zipf::with_rand_off(n, 1.2, 7).unwrap();
            assert!(z.sample(1.0) < n);
            let p = Pareto::with_rand_off(n, 0.9, 7).unwrap();
            assert!(p.sample(1.0) < n);
        }
    }

    #[test]
    fn pareto_value_formula() {
        let p = Pareto::with_rand_off(1001, 0.9, 0).unwrap();
        let pow = 0.9f64.ln() / 0.1f64.ln();
        for u in [0.0, 0.1, 0.5, 0.99, 1.0] {
            assert_eq!(p.value(u), (1000.0 * u.powf(pow)) as u64);
        }
        assert_eq!(p.value(1.0), 1000);
        assert_eq!(p.value(0.0), 0);
    }

    #[test]
    fn samplers_are_deterministic_by_seed() {
        let dist: Distribution = "zipf:0.8".parse().unwrap();
        let run = |seed| {
            let mut rng = Rng::new(seed);
            let mut s = Sampler::new(&dist, 5000, false, true, &mut rng).unwrap();
            (0..1000).map(|_| s.next_block(&mut rng)).collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
        assert_ne!(run(1), run(2));
    }
}

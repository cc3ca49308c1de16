//! SplitMix64: the tiny seedable generator simulations and fault injection
//! use to make choices. Same seed, same sequence — a failing seed replays.

/// SplitMix64 (Steele, Lea, Flood 2014).
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, n) (modulo bias is irrelevant at simulation sizes).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    pub fn coin(&mut self) -> bool {
        self.next_u64() & 1 == 1
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn same_seed_same_sequence() {
        let (mut a, mut b) = (super::SplitMix64(7), super::SplitMix64(7));
        assert!((0..100).all(|_| a.next_u64() == b.next_u64()));
        assert_ne!(super::SplitMix64(8).next_u64(), super::SplitMix64(7).next_u64());
    }
}

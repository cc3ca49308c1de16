//! The engine's write sequence: every log record, capacity segment, chunk
//! generation and band epoch takes the next number, and for each LBA the
//! entry with the highest sequence wins a recovery (segments.rs, rule 1),
//! so crash ordering rests on this counter alone.
//!
//! Owns the counter, in a private field. It changes in two ways only:
//! `next` (one more, for something about to be written) and
//! `restart_above` (recovery: far above everything the media hold).
//! Invariant: it never goes back, and never wraps (both asserted).

/// The last sequence number handed out.
#[derive(Debug)]
pub(super) struct Sequence(u64);

impl Sequence {
    /// A counter whose last number was `last` (a new engine's 0, or the
    /// checkpoint's).
    pub(super) fn at(last: u64) -> Sequence {
        Sequence(last)
    }

    /// The last number handed out.
    pub(super) fn last(&self) -> u64 {
        self.0
    }

    /// The next number, now the last.
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.checked_add(1).expect("the write sequence wrapped");
        self.0
    }

    /// Recovery: restart `gap` above `floor` (the highest sequence the
    /// media hold, or a previous restart), so that no leftover of a torn
    /// write shares a number with what is written next.
    pub(super) fn restart_above(&mut self, floor: u64, gap: u64) -> u64 {
        let at = floor.checked_add(gap).expect("the write sequence wrapped");
        assert!(at >= self.0, "the write sequence goes back from {} to {at}", self.0);
        self.0 = at;
        at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_only_goes_forward() {
        let mut s = Sequence::at(7);
        assert_eq!((s.next(), s.next(), s.last()), (8, 9, 9));
        assert_eq!(s.restart_above(100, 1 << 32), 100 + (1 << 32));
        assert_eq!(s.next(), 101 + (1 << 32));
    }

    #[test]
    #[should_panic(expected = "goes back")]
    fn a_restart_below_the_last_number_is_a_bug() {
        let mut s = Sequence::at(1 << 40);
        s.restart_above(5, 1 << 32);
    }
}

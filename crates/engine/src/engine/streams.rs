//! Sequential stream detection for the in-place cache's cutoff
//! (caching.rs): how many bytes of one sequential stream a request extends.
//!
//! Owns: each volume's streams of one direction (writes and reads keep
//! separate tables, `Streams`), at most `STREAMS` at once, so interleaved
//! writers — a file system writing several files, nbdcopy's workers — keep
//! their own.
//!
//! Real clients do not send a stream in order: nbdfuse splits a 1 MiB read
//! into 1,015,808 + 32,768 bytes and delivers the second first; the kernel's
//! readahead and nbdcopy keep many requests in flight on several
//! connections, which the server's workers run in any order. So a stream is
//! a run of blocks [start, end) grown at either end: a request that ends
//! where a stream starts extends it downwards, one that starts where a
//! stream ends extends it upwards, and one that fills the gap between two
//! streams joins them into one. Its length is its run — or, when requests
//! in flight far out of order leave many runs close together, the runs
//! within `NEAR` of it, if they cover at least half of the span they reach
//! (a scan read out of order does; random I/O does not). What is not a
//! stream: a request that overlaps a stream (a hot region written or read
//! again, which a scan never does) ends it, so random I/O over a small
//! region never grows past a few blocks, and random I/O over a large one
//! rarely meets a neighbour at all.
//!
//! Invariants (asserted in `check`): the streams' runs are disjoint and
//! none is empty.

use super::BS;

/// Runs tracked per volume and direction: interleaved streams, and the
/// pieces of a stream whose requests arrive out of order.
pub(super) const STREAMS: usize = 64;
/// How far out of order a stream's requests may arrive, in blocks (16 MiB:
/// nbdcopy keeps 64 requests of 256 KiB in flight per connection, and the
/// server's workers run them in any order).
const NEAR: u64 = 4096;

#[derive(Clone, Copy, Default)]
struct Stream {
    /// The run of blocks [start, end); empty (end = 0) for a free slot.
    start: u64,
    end: u64,
    /// When it was last extended (`Streams::tick`).
    used: u64,
}

/// One direction's streams of one volume.
pub(super) struct Streams {
    slots: [Stream; STREAMS],
    tick: u64,
}

impl Default for Streams {
    fn default() -> Streams {
        Streams { slots: [Stream::default(); STREAMS], tick: 0 }
    }
}

impl Streams {
    /// A request of `len` bytes at `offset` (whole blocks): the bytes of
    /// the stream it extends (or starts), itself included. `near`: runs
    /// within `NEAR` count together — for reads (scans read far out of
    /// order), not for writes (a file system writing many small files side
    /// by side, a job's temporary files, would look like one stream).
    pub(super) fn extend(&mut self, offset: u64, len: u64, near: bool) -> u64 {
        self.tick += 1;
        let (a, b) = (offset / BS, (offset + len).div_ceil(BS));
        if b <= a {
            return 0;
        }
        let live = |s: &Stream| s.end > s.start;
        // Overlapping a run: a rewrite or a re-read, not a scan.
        for s in self.slots.iter_mut().filter(|s| live(s) && a < s.end && b > s.start) {
            *s = Stream::default();
        }
        let below = self.slots.iter().position(|s| live(s) && s.end == a);
        let above = self.slots.iter().position(|s| live(s) && s.start == b);
        let i = match (below, above) {
            (Some(l), Some(r)) => {
                self.slots[l].end = self.slots[r].end;
                self.slots[r] = Stream::default();
                l
            }
            (Some(l), None) => {
                self.slots[l].end = b;
                l
            }
            (None, Some(r)) => {
                self.slots[r].start = a;
                r
            }
            (None, None) => {
                // The least recently used run gives up its slot (a free
                // one first: it was never used).
                let i = (0..STREAMS).min_by_key(|&i| (live(&self.slots[i]), self.slots[i].used)).expect("slots");
                self.slots[i] = Stream { start: a, end: b, used: 0 };
                i
            }
        };
        self.slots[i].used = self.tick;
        let own = self.slots[i].end - self.slots[i].start;
        if !near {
            return own * BS;
        }
        // Requests in flight far out of order leave many runs close
        // together: the runs within `NEAR` of this one count with it if
        // they cover at least half of the span they reach (a scan read
        // ahead of order), not if they are scattered (random I/O).
        let (lo, hi) = (a.saturating_sub(NEAR), b + NEAR);
        let (mut total, mut first, mut last) = (0, a, b);
        for s in self.slots.iter().filter(|s| live(s) && s.end > lo && s.start < hi) {
            total += s.end - s.start;
            first = first.min(s.start);
            last = last.max(s.end);
        }
        match 2 * total >= last - first {
            true => total.max(own) * BS,
            false => own * BS,
        }
    }

    /// The runs are disjoint and none is empty but free slots.
    #[cfg(test)]
    fn check(&self) {
        let mut runs: Vec<(u64, u64)> =
            self.slots.iter().filter(|s| s.end > s.start).map(|s| (s.start, s.end)).collect();
        runs.sort_unstable();
        assert!(runs.windows(2).all(|w| w[0].1 <= w[1].0), "overlapping runs {runs:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MIB: u64 = 1 << 20;

    #[test]
    fn a_stream_in_order_counts_every_byte() {
        let mut s = Streams::default();
        for i in 0..32 {
            assert_eq!(s.extend(i * (128 << 10), 128 << 10, true), (i + 1) * (128 << 10));
        }
    }

    #[test]
    fn split_and_reordered_requests_still_count_as_one_stream() {
        let mut s = Streams::default();
        let mut n = 0;
        for i in 0..64u64 {
            // nbdfuse: each 1 MiB read split at 1,015,808, the tail first.
            n = s.extend(i * MIB + 1_015_808, 32_768, true);
            n = n.max(s.extend(i * MIB, 1_015_808, true));
        }
        assert_eq!(n, 64 * MIB);
        // nbdcopy: 64 requests of 256 KiB in flight, answered in any order.
        let mut s = Streams::default();
        let mut order: Vec<u64> = (0..256).collect();
        for w in order.chunks_mut(64) {
            w.reverse();
        }
        let n = order.iter().map(|&i| s.extend(i * (256 << 10), 256 << 10, true)).max().unwrap();
        assert_eq!(n, 64 * MIB);
    }

    #[test]
    fn random_io_over_a_hot_region_never_becomes_a_stream() {
        let mut s = Streams::default();
        let mut rng = sluice_media::rng::SplitMix64(3);
        let most = (0..20_000).map(|_| s.extend(rng.below(512) * BS, BS, true)).max().unwrap();
        s.check();
        assert!(most < 512 << 10, "a hot 2 MiB region read at random counted {most} sequential bytes");
        // Nor random I/O over a large volume, however long it runs.
        let mut s = Streams::default();
        let most = (0..200_000).map(|_| s.extend(rng.below(1 << 18) * BS, BS, true)).max().unwrap();
        assert!(most < 64 << 10, "random 4 KiB over 1 GiB counted {most} sequential bytes");
    }

    /// nbdcopy as the server's workers run it: 64 requests of 256 KiB in
    /// flight, in any order. Past its first few requests, the scan is one
    /// stream past a 1 MiB cutoff.
    #[test]
    fn a_scan_run_far_out_of_order_is_still_one_stream() {
        let mut s = Streams::default();
        let mut rng = sluice_media::rng::SplitMix64(5);
        let mut order: Vec<u64> = (0..3072).collect();
        for w in order.chunks_mut(64) {
            for i in (1..w.len()).rev() {
                w.swap(i, rng.below(i as u64 + 1) as usize);
            }
        }
        let short = order.iter().filter(|&&i| s.extend(i * (256 << 10), 256 << 10, true) <= 1 << 20).count();
        assert!(short < 3072 / 20, "{short} of 3072 requests seen as no stream past 1 MiB");
        s.check();
    }

    /// Writes count runs alone: small files written side by side with
    /// their metadata between them (a job's temporary files) are not one
    /// stream, as they would be counted as reads.
    #[test]
    fn small_files_written_side_by_side_are_not_one_write_stream() {
        let (mut w, mut r) = (Streams::default(), Streams::default());
        let (mut most_w, mut most_r) = (0, 0);
        for i in 0..64u64 {
            most_w = most_w.max(w.extend(i * (68 << 10), 64 << 10, false));
            most_r = most_r.max(r.extend(i * (68 << 10), 64 << 10, true));
        }
        assert_eq!(most_w, 64 << 10);
        assert!(most_r > 1 << 20, "read back, they are a scan");
    }

    #[test]
    fn interleaved_streams_keep_their_own_length() {
        let mut s = Streams::default();
        let (mut a, mut b) = (0, 0);
        for i in 0..40u64 {
            a = s.extend(i * 65536, 65536, true);
            b = s.extend((1 << 30) + i * 65536, 65536, true);
        }
        assert_eq!((a, b), (40 * 65536, 40 * 65536));
    }
}

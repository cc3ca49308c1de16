//! Helpers shared by the media tests: drive a device at a queue depth and
//! measure the span of a set of completions on its clock.

use crate::device::{BlockDevice, IoCompletion, IoRequest};

/// Keep `qd` requests in flight until `next` runs dry; returns every
/// completion (all must have succeeded).
pub(crate) fn run_queue(
    dev: &dyn BlockDevice,
    qd: usize,
    mut next: impl FnMut() -> Option<IoRequest>,
) -> Vec<IoCompletion> {
    let mut out = Vec::new();
    let mut more = true;
    loop {
        while more && dev.in_flight() < qd {
            match next() {
                Some(r) => dev.submit(r),
                None => more = false,
            }
        }
        if dev.in_flight() == 0 {
            break;
        }
        dev.reap(1, &mut out);
    }
    assert!(out.iter().all(|c| c.result.is_ok()), "{:?}", out.iter().find(|c| c.result.is_err()));
    out
}

/// Device time from the first submission to the last completion.
pub(crate) fn span_ns(out: &[IoCompletion]) -> u64 {
    out.iter().map(|c| c.completed_ns).max().unwrap() - out.iter().map(|c| c.submitted_ns).min().unwrap()
}

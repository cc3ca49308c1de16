//! The engine's health: whether it takes changes, and if not, why.
//!
//! Owns one state, private, changed by two transitions only:
//! - `stop(cause)`: a device error, corrupt data or damage under a change.
//!   The in-memory state may be ahead of or behind the media, so nothing
//!   more is written (every change fails with `VolumeError::Stopped`);
//!   reads go on; reopening recovers from the media. The first cause is
//!   kept (and said once, the moment it happens);
//! - `close()`: a shutdown, clean or not; every later request fails with
//!   `VolumeError::ReadOnly`. A stop before it stays recorded, so a
//!   shutdown of a stopped engine leaves the superblock dirty.
//!
//! Invariant: health never returns to serving (a reopen builds a new
//! engine), and a stopped engine's cause never changes.

use crate::volume::VolumeError;

#[derive(Debug, Default)]
pub(super) struct Health {
    /// Why the engine stopped taking changes, if it did.
    stopped: Option<VolumeError>,
    closed: bool,
    /// Opened read-only (`OpenOptions::read_only`): reads are served,
    /// every change is refused, and nothing is ever written.
    read_only: bool,
}

impl Health {
    /// Whether the engine takes changes: not once shut down (`ReadOnly`),
    /// nor after a stop (`Stopped`).
    pub(super) fn taking_changes(&self) -> Result<(), VolumeError> {
        if self.closed || self.read_only {
            return Err(VolumeError::ReadOnly);
        }
        match &self.stopped {
            Some(cause) if host_full(cause) => return Err(VolumeError::StoppedFull),
            Some(_) => return Err(VolumeError::Stopped),
            None => {}
        }
        Ok(())
    }

    pub(super) fn is_closed(&self) -> bool {
        self.closed
    }

    /// Serve reads only, for the engine's whole life (set before it
    /// serves anything).
    pub(super) fn open_read_only(&mut self) {
        assert!(!self.closed && self.stopped.is_none(), "read-only from the start");
        self.read_only = true;
    }

    pub(super) fn is_read_only(&self) -> bool {
        self.read_only
    }

    pub(super) fn is_stopped(&self) -> bool {
        self.stopped.is_some()
    }

    /// Why the engine stopped taking changes.
    pub(super) fn cause(&self) -> Option<&VolumeError> {
        self.stopped.as_ref()
    }

    /// Stop taking changes because of `cause` (the first one is kept, and
    /// said at once: every later change fails until a restart recovers
    /// from the devices).
    pub(super) fn stop(&mut self, cause: &VolumeError) {
        let before = self.stopped.clone();
        if self.stopped.is_none() {
            let todo = match host_full(cause) {
                true => "make room on the file system holding the devices, then restart: recovery replays every flushed write (changes fail with ENOSPC until then)",
                false => "restart to recover",
            };
            crate::report::say(format_args!("sluice: engine stopped taking changes: {cause}; reads go on; {todo}"));
            self.stopped = Some(cause.clone());
        }
        assert!(self.stopped.is_some(), "a stop leaves the engine stopped");
        assert!(before.is_none() || before == self.stopped, "a stopped engine's cause never changes");
    }

    /// Shut down: every later request fails.
    pub(super) fn close(&mut self) {
        let stopped = self.stopped.is_some();
        self.closed = true;
        assert!(self.taking_changes().is_err() && self.stopped.is_some() == stopped, "closing never serves again");
    }
}

/// A device write found the file system (or quota) holding it full: the
/// device's own ENOSPC, not the engine's (`VolumeError::NoSpace`).
fn host_full(cause: &VolumeError) -> bool {
    matches!(cause, VolumeError::Io(_)) && cause.errno() == 28
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_keeps_its_first_cause_and_a_close_keeps_the_stop() {
        crate::report::quiet();
        let mut h = Health::default();
        assert_eq!(h.taking_changes(), Ok(()));
        h.stop(&VolumeError::NoSpace);
        h.stop(&VolumeError::Stopped);
        assert_eq!((h.taking_changes(), h.cause()), (Err(VolumeError::Stopped), Some(&VolumeError::NoSpace)));
        h.close();
        assert!(h.is_stopped() && h.is_closed());
        assert_eq!(h.taking_changes(), Err(VolumeError::ReadOnly));
    }
}

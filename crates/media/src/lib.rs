//! Sluice's media layer: the one narrow device interface (`BlockDevice`,
//! `ZonedDevice`), real backends (memory, null, io_uring files and raw
//! devices) and faithful emulators of the media Sluice targets (SCM, QLC/TLC
//! SSDs with indirection units and internal GC, ZNS SSDs, HDDs), timed by an
//! injected clock. It knows nothing of caching: emulators enforce a medium's
//! rules and account its costs, nothing more.

pub mod buf;
pub mod clock;
pub mod crash;
pub mod device;
pub mod emulate;
pub mod endurance;
pub mod file;
pub mod hdd;
pub mod memory;
pub mod rng;
pub mod scm;
pub mod shared;
pub mod ssd;
pub mod stripe;
#[cfg(test)]
mod testutil;
pub mod zns;

pub use buf::IoBuf;
pub use clock::{Clock, ClockRef, RealClock, VirtualClock};
pub use crash::{CrashDevice, FaultPlan, FaultRule};
pub use device::{
    BlockDevice, DeviceError, DeviceInfo, DeviceStats, IoCompletion, IoOp, IoRequest, ZoneAction, ZoneDesc, ZoneError,
    ZoneLimits, ZoneState, ZonedDevice,
};
pub use emulate::{BackendAction, Emulated, MediaModel, Pending, Service, Timelines};
pub use file::{CacheMode, FileDevice, FileError, FileOptions};
pub use hdd::{hdd_device, HddModel, HddProfile};
pub use memory::MemoryDevice;
pub use scm::{scm_device, ScmModel, ScmProfile};
pub use shared::SharedDevice;
pub use stripe::StripedDevice;
pub use zns::{zns_device, ZnsModel, ZnsProfile};

//! Sluice's simulations: the engine driven by one seeded operation
//! generator (ops.rs) against a model of what every block must read back.
//!
//! - `sim`: memory devices, no crashes; every read must return exactly the
//!   last version written.
//! - `crashsim`: crash devices, power lost between and inside operations,
//!   reopened; every block must read back as a version that may survive.
//!
//! Both use only the engine's public API, and live outside it so that the
//! engine carries no simulation code. A failure names its seed, and the
//! same seed replays it exactly (`sluice sim --seed-start S --seeds 1`).

pub use sluice_engine::{
    BandPlacement, Engine, EngineConfig, EngineError, EngineVolume, Layout, OpenOptions, StagedWrite, Stepped, Volume,
    VolumeError, VolumeSpec, WriteStep,
};

pub mod crashsim;
pub mod ops;
pub mod sim;
/// Small worlds and the block pattern: the same file the engine's own unit
/// tests use.
#[path = "../../engine/src/testkit.rs"]
pub mod testkit;

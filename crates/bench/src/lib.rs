//! Sluice's reproducible experiments: fio-style jobs driven against emulated
//! media in virtual time, turned into tables and JSON.

pub mod caching;
pub mod csal;
pub mod engine;
pub mod engine_threads;
pub mod error;
pub mod heap;
pub mod job;
pub mod l2p;
pub mod media;
pub mod runner;
pub mod stacked;
pub mod trace;
pub mod uring;

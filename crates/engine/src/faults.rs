//! Named faults an operator's test can arm in a real process, through the
//! environment: `SLUICE_FAULTS=compactor-panic,...`. Read once, at the
//! first check; a fault not named is never armed. They exist so that the
//! fault suite (scripts/faults.sh, crates/sluice/tests/faults.rs) can prove
//! what a real `sluice serve` does when a bug or a device misbehaves —
//! paths no workload reaches on purpose.
//!
//! Faults:
//! - `compactor-panic`: the background compactor panics (holding the engine
//!   lock) at its first step with work to do, as a broken invariant would.

use std::sync::OnceLock;

/// The environment variable that arms faults.
pub const FAULTS_ENV: &str = "SLUICE_FAULTS";

fn armed_list() -> &'static [String] {
    static LIST: OnceLock<Vec<String>> = OnceLock::new();
    LIST.get_or_init(|| {
        std::env::var(FAULTS_ENV)
            .map(|v| v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_default()
    })
}

/// Whether the fault `name` is armed in this process.
pub fn armed(name: &str) -> bool {
    armed_list().iter().any(|f| f == name)
}

//! Building the scheduler a run uses: the typed configuration of
//! `gpusched_plugins` (`SchedulerConfig`, unknown fields denied), read from
//! YAML with located errors, optionally with another packing policy.

use crate::LoadError;
use gpusched_core::Scheduler;
use gpusched_plugins::SchedulerConfig;
use gpusched_plugins::packing::{PackingConfig, PolicyName, UnknownPolicy};

/// Reads a scheduler configuration (YAML), with errors naming the file,
/// line and field.
pub fn config_from_yaml(file: &str, text: &str) -> Result<SchedulerConfig, LoadError> {
    crate::load::parse_yaml(file, text)
}

/// The scheduler for `cfg` (default: `SchedulerConfig::default()`), with
/// the packing policy replaced by `policy` when given.
pub fn build(cfg: Option<&SchedulerConfig>, policy: Option<&str>) -> Result<Scheduler, String> {
    let mut cfg = cfg.cloned().unwrap_or_default();
    if let Some(p) = policy {
        let p: PolicyName = p.parse().map_err(|e: UnknownPolicy| e.to_string())?;
        cfg.packing = PackingConfig::from(p);
    }
    gpusched_plugins::build(&cfg).map_err(|e| e.to_string())
}

/// The default scheduler (`SchedulerConfig::default()`).
pub fn default_scheduler() -> Scheduler {
    match build(None, None) {
        Ok(s) => s,
        // the default configuration is tested by gpusched-plugins
        Err(e) => panic!("default scheduler configuration is invalid: {e}"),
    }
}

//! Building the scheduler a run uses: the typed configuration of
//! `gpusched_plugins` (`SchedulerConfig`, unknown fields denied, read by
//! `SchedulerConfig::from_yaml`), optionally with another packing policy.

use gpusched_core::Scheduler;
use gpusched_plugins::SchedulerConfig;
use gpusched_plugins::packing::{PackingConfig, PolicyName, UnknownPolicy};

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

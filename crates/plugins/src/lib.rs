//! Scheduling policies of gpusched, registered explicitly from typed config
//! ([`config::build`]): filters, packing policies (including the FGD paper's
//! baselines and our default), on the core's extension points.

pub mod config;
pub mod filters;
pub mod packing;
pub mod podapi;

pub use config::{ConfigError, SchedulerConfig, build, build_with};
pub use packing::{PackingConfig, PolicyName};

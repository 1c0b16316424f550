//! Trace-driven discrete-event simulator of gpusched.
//!
//! A [`Scenario`] (nodes from a cluster file, queues, jobs and cluster
//! events from a workload file, or the embedded default) is run against a
//! [`gpusched_core::Scheduler`] in virtual time with [`run`]; the
//! [`SimResult`] holds the metrics and renders as a terminal table
//! ([`table::render`]) or a self-contained HTML page ([`report::render`]).
//! Same scenario, scheduler and seed: same result, byte for byte.

pub mod engine;
pub mod eval;
pub mod frag;
pub mod load;
pub mod metrics;
pub mod openb;
pub mod replay;
pub mod report;
pub mod sched;
pub mod table;
pub mod workload;

pub use engine::{Hooks, NoHooks, run, run_checked};
pub use load::{LoadError, Source, default_scenario, scenario};
pub use metrics::SimResult;
pub use workload::{ClusterEvent, EventKind, Job, Scenario, SimSettings};

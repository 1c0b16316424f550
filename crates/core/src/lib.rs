//! The deterministic scheduling core of gpusched.
//!
//! [`Scheduler::cycle`] takes a [`Snapshot`] of the cluster, the current
//! (virtual) time and a seed, and returns a [`CycleOutput`]: decisions (bind,
//! evict, nominate, pod-group phase) and an explanation for every pod left
//! pending. It does no I/O, reads no clock and uses no unseeded randomness;
//! the same input gives the same output.
//!
//! Mechanism lives here (the action pipeline, statements, the cluster state);
//! policy lives in plugins behind the traits of [`plugin`], registered
//! explicitly by whoever builds the [`Scheduler`] (see `gpusched-plugins`).

pub mod decision;
pub mod engine;
pub mod fairshare;
pub mod plugin;
pub mod reason;
pub mod report;
pub mod scheduler;
pub mod snapshot;
pub mod state;
pub mod statement;

pub use decision::{
    CycleOutput, CycleStats, Decision, Explanation, GroupPhase, QueuePosition, Verdict,
};
pub use engine::{Change, ChangeError, Engine, PodAt};
pub use plugin::{
    ConstraintState, Filter, FilterName, FilterResult, Needs, PackEnv, Packer, Placement,
    PodConstraint, PodsChanged, SchedulingKey, Score, place,
};
pub use reason::{
    CandidateRejection, EvictionAttempt, EvictionKind, EvictionOutcome, EvictionReason,
    EvictionSkip, NearestNode, NodeReason, NodeSummary, PendingReason, QueueProblem, QuotaRule,
    QuotaViolation,
};
pub use scheduler::{Scheduler, SchedulerOptions};
pub use snapshot::{GpuAssignment, NodeId, PodId, PodPhase, PodState, Snapshot};
pub use state::{ClusterState, NodeState, StateParts};
pub use statement::Statement;

//! The scheduler's output.

use crate::snapshot::{GpuAssignment, NodeId, PodId};
use serde::{Deserialize, Serialize};

/// Phase of a pod group after a cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GroupPhase {
    /// Fewer than `minMember` pods exist yet.
    Pending,
    /// Waiting for capacity.
    Inqueue,
    /// At least `minMember` members placed.
    Running,
    /// Gave up after its schedule timeout.
    TimedOut,
}

/// One thing the scheduler decided.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    /// Bind a pending pod to a node with these GPUs.
    Bind {
        pod: PodId,
        node: NodeId,
        gpus: GpuAssignment,
    },
    /// Evict a running pod (preemption, reclaim).
    Evict {
        pod: PodId,
        kind: EvictionKind,
        reason: String,
    },
    /// Remember that a node is being freed for a pending pod.
    Nominate { pod: PodId, node: NodeId },
    /// A pod group changed phase.
    Group { group: String, phase: GroupPhase },
}

/// Why a pod is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EvictionKind {
    /// For a higher-priority job of the same queue.
    Preempt,
    /// For a queue below its deserved share.
    Reclaim,
}

/// Whether a pending pod may fit later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// May fit later (capacity, quota, gang, reservation).
    Unschedulable,
    /// Never fits as the cluster is (wrong GPU model, bigger than any node).
    Unresolvable,
}

/// Why a pod is still pending, in kube-scheduler's words.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub pod: PodId,
    pub verdict: Verdict,
    pub message: String,
}

/// Counters of one cycle.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleStats {
    pub pending: u32,
    pub bound: u32,
    pub evicted: u32,
    pub nodes_scored: u64,
    pub gangs_started: u32,
    pub gangs_waiting: u32,
    pub backfilled: u32,
}

/// Everything a cycle produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CycleOutput {
    pub decisions: Vec<Decision>,
    pub explanations: Vec<Explanation>,
    pub stats: CycleStats,
}

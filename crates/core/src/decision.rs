//! The scheduler's output.

use crate::reason::{EvictionReason, PendingReason, QueueProblem};
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
    /// Evict a running pod (preemption, reclaim); `reason.kind()` tells
    /// which, `reason.to_string()` renders it.
    Evict { pod: PodId, reason: EvictionReason },
    /// Remember that a node is being freed for a pending pod.
    Nominate { pod: PodId, node: NodeId },
    /// A pod group changed phase.
    Group { group: String, phase: GroupPhase },
}

/// Whether a pending pod may fit later.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// May fit later (capacity, quota, gang, reservation).
    Unschedulable,
    /// Never fits as the cluster is (wrong GPU model, bigger than any node).
    Unresolvable,
}

/// Why a pod is still pending.
///
/// `reasons` holds, in order, the node summary (when no node takes the pod
/// now) and the queue, quota, gang or reservation reason (when there is
/// one). No reasons means the pod fits now and will be placed in a
/// following cycle. [`Explanation::message`] renders them in
/// kube-scheduler's words, e.g. `0/8 nodes are available: 3 Insufficient
/// nvidia.com/gpu, 5 node(s) had untolerated taint(s). pod group "g": only 2
/// of the 4 required pods fit now (all-or-nothing).`
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Explanation {
    pub pod: PodId,
    pub verdict: Verdict,
    pub reasons: Vec<PendingReason>,
}

impl Explanation {
    /// The reasons as one message (for events, `PodScheduled` conditions,
    /// the CLI).
    pub fn message(&self) -> String {
        if self.reasons.is_empty() {
            return "fits now; it will be placed in a following cycle".to_string();
        }
        let parts: Vec<String> = self.reasons.iter().map(|r| r.to_string()).collect();
        parts.join(" ")
    }
}

impl std::fmt::Display for Explanation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message())
    }
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
    /// Problems with the snapshot's queue tree (the cycle went on with the
    /// tree repaired; see [`QueueProblem`]).
    pub warnings: Vec<QueueProblem>,
}

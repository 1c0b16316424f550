//! The scheduler's output.

use crate::reason::{EvictionAttempt, EvictionReason, PendingReason, QueueProblem};
use crate::snapshot::{GpuAssignment, NodeId, PodId};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

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
#[serde(rename_all_fields = "camelCase")]
pub enum Decision {
    /// Bind a pending pod to a node with these GPUs.
    Bind {
        /// The pending pod.
        pod: PodId,
        /// Its node.
        node: NodeId,
        /// The GPUs it gets there (what the node agent allocates).
        gpus: GpuAssignment,
    },
    /// Evict a running pod (preemption, reclaim); `reason.kind()` tells
    /// which, `reason.to_string()` renders it.
    Evict {
        /// The running pod to evict.
        pod: PodId,
        /// Why, with its facts.
        reason: EvictionReason,
    },
    /// Remember that a node is being freed for a pending pod, or (after
    /// its consolidation eviction) the node planned for a moved pod.
    Nominate {
        /// The pending pod.
        pod: PodId,
        /// The node held for it (the next cycle keeps it for its job).
        node: NodeId,
    },
    /// A pod group changed phase.
    Group {
        /// The pod group's name.
        group: String,
        /// Its new phase.
        phase: GroupPhase,
    },
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
#[serde(rename_all = "camelCase")]
pub struct Explanation {
    /// The pending pod.
    pub pod: PodId,
    /// Whether it may fit later.
    pub verdict: Verdict,
    /// Why it is pending (see the type's documentation for the order).
    /// Shared: the pods of one job, and pods with the same signature and
    /// note, hold the same list (a deep queue explains tens of thousands
    /// of pods per cycle).
    #[serde(with = "shared_list")]
    pub reasons: Arc<[PendingReason]>,
    /// The preempt and reclaim passes tried (or skipped) for its job and
    /// why they freed nothing (not part of [`Explanation::message`]);
    /// shared by the pods of the job.
    #[serde(default, skip_serializing_if = "slice_is_empty", with = "shared_list")]
    pub evictions: Arc<[EvictionAttempt]>,
    /// Where its job stood in its queue's order this cycle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_position: Option<QueuePosition>,
}

/// A job's place in its queue's order (nominated jobs first, then
/// priority, arrival, name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueuePosition {
    /// 1 for the job tried first.
    pub position: u32,
    /// Jobs of the queue this cycle.
    pub jobs: u32,
}

fn slice_is_empty<T>(v: &Arc<[T]>) -> bool {
    v.is_empty()
}

/// A shared list (`Arc<[T]>`) in serde as a plain list (without serde's
/// `rc` feature, which would rebuild every crate that uses serde).
mod shared_list {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use std::sync::Arc;

    pub fn serialize<T: Serialize, S: Serializer>(v: &Arc<[T]>, s: S) -> Result<S::Ok, S::Error> {
        v.as_ref().serialize(s)
    }

    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Arc<[T]>, D::Error> {
        Vec::<T>::deserialize(d).map(Arc::from)
    }
}

impl Explanation {
    /// The reasons as one message (for events, `PodScheduled` conditions,
    /// the CLI).
    pub fn message(&self) -> String {
        if self.reasons.is_empty() {
            return "fits now; it will be placed in a following cycle".to_string();
        }
        let mut parts: Vec<String> = self.reasons.iter().map(|r| r.to_string()).collect();
        // a pass that found victims but waits for their minimum runtime:
        // said in the message (kube-scheduler's "preemption: …" part), with
        // when it ends, not left to "Insufficient nvidia.com/gpu" alone
        parts.extend(
            self.evictions
                .iter()
                .filter(|a| a.waits_for_min_runtime())
                .map(|a| a.to_string()),
        );
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
#[serde(rename_all = "camelCase")]
pub struct CycleStats {
    /// Pods pending in the snapshot.
    pub pending: u32,
    /// Bind decisions.
    pub bound: u32,
    /// Evict decisions.
    pub evicted: u32,
    /// Packer calls that scored a node.
    pub nodes_scored: u64,
    /// Gangs that reached `minMember` this cycle.
    pub gangs_started: u32,
    /// Gangs tried that did not fit.
    pub gangs_waiting: u32,
    /// Jobs placed while an earlier job of their queue waited.
    pub backfilled: u32,
    /// Job attempts (placement or an eviction pass) not made because an
    /// equivalent job had just failed them (see
    /// `SchedulerOptions::skip_equivalent_jobs`).
    #[serde(default)]
    pub jobs_skipped: u32,
    /// Jobs left out of the cycle because they are parked (the incremental
    /// core, `crate::engine`: a job that failed waits for a change that
    /// may help it); 0 in a full pass.
    #[serde(default)]
    pub jobs_parked: u32,
}

/// Everything a cycle produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CycleOutput {
    /// What to do, in order (evictions before the nominations they free).
    pub decisions: Vec<Decision>,
    /// One per pod left pending.
    pub explanations: Vec<Explanation>,
    /// Counters.
    pub stats: CycleStats,
    /// Problems with the snapshot's queue tree (the cycle went on with the
    /// tree repaired; see [`QueueProblem`]).
    pub warnings: Vec<QueueProblem>,
}

impl CycleOutput {
    /// The pods this cycle binds.
    pub fn bound_pods(&self) -> std::collections::BTreeSet<PodId> {
        self.decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Bind { pod, .. } => Some(*pod),
                _ => None,
            })
            .collect()
    }
}

//! Reports for `gpusched explain`: where one pod or one queue stands after a
//! cycle, and why, as data.
//!
//! [`pod_report`] and [`queue_report`] read a [`CycleView`] (the snapshot a
//! cycle saw, what it decided and explained, and its time) and return
//! serde-serializable values; the scheduler's debug endpoint and the
//! simulator build the same reports from their last cycle. Text comes only
//! from the `Display` impls here and in [`crate::reason`], at the edges.
//!
//! Queue figures (usage, fair share, borrowed) are those of the snapshot,
//! before the cycle's own bindings: the state the cycle decided from.

use crate::decision::{CycleOutput, Decision, Explanation, GroupPhase, QueuePosition, Verdict};
use crate::fairshare::{QueueIdx, QueueTree, schedulable_capacity};
use crate::reason::{
    EvictionAttempt, NearestNode, NodeReason, PendingReason, QueueProblem, level_name,
};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase, Snapshot};
use crate::state::ClusterState;
use gpusched_model::duration::fmt_duration;
use gpusched_model::topology::{choose, ideal_cost, set_cost};
use gpusched_model::{
    GPU_MILLI, GpuRequest, ResourceKind, ResourceLimit, ResourceVec, TopologyConstraint,
    TopologyLevel,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

pub mod classify;
mod index;
mod pending;
mod pod;
mod queue;
mod text;
use index::CycleIndex;
pub use pending::{PendingEntry, PendingList, pending_list};
pub use pod::pod_report;
pub use queue::{queue_report, queue_tree};
pub use text::{amount_text, bytes_text, gpus_text};

/// What one cycle saw and produced.
#[derive(Clone, Copy, Debug)]
pub struct CycleView<'a> {
    /// The snapshot the cycle read.
    pub snapshot: &'a Snapshot,
    /// What it decided and explained.
    pub output: &'a CycleOutput,
    /// Its (virtual) time in ms.
    pub now_ms: u64,
}

/// One GPU a pod holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRef {
    /// Its index on the node (as `nvidia-smi` shows it).
    pub index: u32,
    /// Its UUID.
    pub uuid: String,
    /// Its model.
    pub model: String,
}

/// How well a multi-GPU set is connected: the sum of its pairwise link
/// costs (`gpusched_model::topology`) against the best a set of its size
/// can have on that node — what the placement is judged by — and against
/// the all-NVLink ideal (every pair sharing an NVLink domain and NUMA
/// node), which a PCIe node never reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyScore {
    /// The set's cost.
    pub cost: u64,
    /// The lowest cost of a set of this size among all the node's GPUs,
    /// free or not (the scheduler's own choice, `topology::choose`).
    #[serde(default)]
    pub node_best: u64,
    /// The all-NVLink ideal for a set of this size.
    pub ideal: u64,
}

/// Where a pod is placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The node.
    pub node: String,
    /// The GPUs (one for a share).
    pub gpus: Vec<GpuRef>,
    /// The share of that GPU, for a GPU share: (milli-GPU, MiB).
    pub share: Option<(u32, u64)>,
    /// For two or more whole GPUs.
    pub topology: Option<TopologyScore>,
    /// MIG instances of that GPU (device ids), for MIG instances; `share`
    /// then holds their measure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<String>,
}

/// Where a pod stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum PodStatus {
    /// Bound and holding its resources.
    Bound {
        /// Where.
        placement: Placement,
        /// Since when (ms).
        since_ms: u64,
    },
    /// Placed by the last cycle; the binding is being written.
    Binding {
        /// Where.
        placement: Placement,
    },
    /// Being evicted or deleted; holds its resources until gone.
    Terminating {
        /// Where.
        placement: Placement,
    },
    /// Waiting for a node.
    Pending {
        /// Whether it may fit later (`None`: the last cycle did not explain
        /// it, e.g. it arrived after that cycle).
        verdict: Option<Verdict>,
        /// Why it waits, most specific first ([`classify::classify`]): the
        /// first is the name `pending`, the Queue status, doctor, the
        /// metrics and the pod's event show.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        classes: Vec<classify::PendingClass>,
        /// Its `PodScheduled=False` reason ([`classify::condition_reason`]).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        condition: Option<String>,
        /// The explanation as one message (kube-scheduler's words).
        message: String,
        /// The typed reasons behind the message.
        reasons: Vec<PendingReason>,
        /// Preempt and reclaim: skipped or tried, and why nothing was freed.
        evictions: Vec<EvictionAttempt>,
        /// Its job's place in its queue's order.
        queue_position: Option<QueuePosition>,
        /// A node held for it (preemption, reservation).
        nominated: Option<String>,
    },
    /// Not scheduled until its scheduling gates are removed.
    Gated {
        /// The gates present.
        gates: Vec<String>,
    },
    /// Cannot be scheduled as written.
    Invalid {
        /// Why, naming the field.
        error: String,
    },
}

/// A queue's quota and fair-share state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueState {
    /// The queue.
    pub name: String,
    /// Its parent (`None`: under the root).
    pub parent: Option<String>,
    /// Weight among siblings.
    pub weight: u32,
    /// Guarantee (GPU: plain plus per-model).
    pub guarantee: ResourceVec,
    /// Limit, if any (only the dimensions it names are capped).
    pub limit: Option<ResourceLimit>,
    /// Whether it may use more than its guarantee.
    pub can_borrow: bool,
    /// Whether what it borrowed may be reclaimed.
    pub reclaimable: bool,
    /// What its running pods hold (its subtree's).
    pub usage: ResourceVec,
    /// What its pending pods ask for.
    pub pending: ResourceVec,
    /// Its fair share now (deserved).
    pub fair_share: ResourceVec,
    /// Usage above the guarantee, per dimension.
    pub borrowed: ResourceVec,
    /// Usage against fair share, dominant dimension, in ppm (1,000,000 =
    /// exactly its share).
    pub share_ppm: u64,
}

/// A gang's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GangState {
    /// The pod group.
    pub group: String,
    /// Its queue.
    pub queue: String,
    /// Members that must start together.
    pub min_member: u32,
    /// Members running.
    pub running: u32,
    /// Members pending.
    pub pending: u32,
    /// Members terminating.
    pub terminating: u32,
    /// Its phase as the last cycle set it (`None`: unchanged).
    pub phase: Option<GroupPhase>,
    /// Its topology constraint.
    pub topology: Option<TopologyConstraint>,
    /// Its schedule timeout (ms).
    pub timeout_ms: Option<u64>,
    /// Time left before it times out (ms), while it waits.
    pub timeout_left_ms: Option<u64>,
}

/// What would make a pending pod fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum Hint {
    /// Nothing: it fits now and is placed in a following cycle.
    FitsNow,
    /// `gpus` whole GPUs free on one node that passes its filters.
    FreeGpusOnOneNode {
        /// GPUs it asks.
        gpus: u32,
        /// The node closest now.
        nearest: Option<NearestNode>,
    },
    /// `milli` free on one GPU of a node that passes its filters.
    FreeShareOnOneGpu {
        /// Milli-GPU it asks.
        milli: u32,
        /// The node closest now.
        nearest: Option<NearestNode>,
    },
    /// `amount` of a non-GPU resource free on one node that passes its
    /// filters.
    FreeResource {
        /// The resource.
        resource: ResourceKind,
        /// What it asks.
        amount: u64,
    },
    /// `gpus` whole GPUs free in one topology domain for its gang.
    FreeGpusInOneDomain {
        /// The level.
        level: TopologyLevel,
        /// GPUs the gang's required members ask together.
        gpus: u64,
        /// The domain with the most free GPUs now, and how many.
        best: Option<(String, u64)>,
    },
    /// The job alone asks `needs` of `dimension`, more than the queue's
    /// quota allows: only a larger quota (or a smaller job) helps.
    RaiseQuota {
        /// The queue whose rule blocks it.
        queue: String,
        /// The dimension.
        dimension: ResourceKind,
        /// What the job asks (resource units; milli-GPU for GPUs).
        needs: u64,
    },
    /// The queue must use `amount` less of `dimension` first.
    QueueFrees {
        /// The queue whose rule blocks it.
        queue: String,
        /// The dimension.
        dimension: ResourceKind,
        /// How much less (resource units; milli-GPU for GPUs).
        amount: u64,
    },
    /// `missing` more members of the gang must be created.
    MoreMembers {
        /// The gang.
        group: String,
        /// How many.
        missing: u32,
    },
    /// Room for `need - fit` more of the gang's members at once.
    MoreMembersFit {
        /// The gang.
        group: String,
        /// How many fit now.
        fit: u32,
        /// How many must.
        need: u32,
    },
    /// Create the queue.
    CreateQueue {
        /// The queue.
        queue: String,
    },
    /// Create the pod group.
    CreateGroup {
        /// The group.
        group: String,
    },
    /// Pods leaving `node` (evicted or terminating) free the room.
    WaitForNode {
        /// The node.
        node: String,
    },
    /// The gang timed out; recreate it.
    Recreate {
        /// The gang.
        group: String,
    },
    /// No node that passes its filters could ever hold it: change the
    /// request, selectors or tolerations, or add such nodes.
    NeverFits,
    /// Remove its scheduling gates.
    RemoveGates {
        /// The gates.
        gates: Vec<String>,
    },
    /// Fix the pod's spec.
    FixSpec {
        /// What is wrong.
        error: String,
    },
}

/// A pod's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// The pod (`namespace/name` on Kubernetes).
    pub pod: String,
    /// Its queue (its gang's, for a gang member).
    pub queue: String,
    /// Its gang.
    pub group: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its GPU request.
    pub gpu: GpuRequest,
    /// Its other requests.
    pub requests: ResourceVec,
    /// Where it stands.
    pub status: PodStatus,
    /// Its queue, then the queue's ancestors up to the root.
    pub queues: Vec<QueueState>,
    /// Its gang's state.
    pub gang: Option<GangState>,
    /// What would make it fit (pending pods).
    pub hints: Vec<Hint>,
    /// The time of the cycle the report is from (ms).
    pub at_ms: u64,
}

impl PodReport {
    /// The report of a pod that is not in the snapshot because it is gated
    /// or invalid (the adapter knows; the core never sees such pods).
    pub fn outside(pod: String, queue: String, status: PodStatus, at_ms: u64) -> Self {
        let hints = match &status {
            PodStatus::Gated { gates } => vec![Hint::RemoveGates {
                gates: gates.clone(),
            }],
            PodStatus::Invalid { error } => vec![Hint::FixSpec {
                error: error.clone(),
            }],
            _ => Vec::new(),
        };
        PodReport {
            pod,
            queue,
            group: None,
            priority: 0,
            gpu: GpuRequest::None,
            requests: ResourceVec::default(),
            status,
            queues: Vec::new(),
            gang: None,
            hints,
            at_ms,
        }
    }
}

/// A queue's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    /// The queue.
    pub queue: QueueState,
    /// Its ancestors, parent first.
    pub ancestors: Vec<QueueState>,
    /// Its children.
    pub children: Vec<String>,
    /// Pods of the queue running (or terminating).
    pub running_pods: u32,
    /// Pods of the queue the cycle explained, by the reason name of their
    /// main class ([`classify::queue_pending_by_reason`]: what the Queue's
    /// status shows). The scheduler's debug endpoint adds the pods the core
    /// never sees (gated, invalid).
    pub pending_by_reason: BTreeMap<String, u32>,
    /// Problems of the queue tree about this queue.
    pub problems: Vec<QueueProblem>,
    /// The time of the cycle the report is from (ms).
    pub at_ms: u64,
}

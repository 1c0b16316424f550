//! The scheduler's input: a consistent view of the cluster.

use gpusched_model::{Node, Pod, PodGroup, Queue};
use serde::{Deserialize, Serialize};

/// Index of a node in [`Snapshot::nodes`].
pub type NodeId = u32;
/// Index of a pod in [`Snapshot::pods`].
pub type PodId = u32;

/// Which GPUs of its node a pod holds. GPU numbers are positions in
/// [`Node::gpus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuAssignment {
    #[default]
    None,
    Whole(Vec<u32>),
    Share {
        gpu: u32,
        milli: u32,
        memory_mib: u64,
    },
}

impl GpuAssignment {
    /// GPU milli this assignment takes.
    pub fn milli(&self) -> u64 {
        match self {
            GpuAssignment::None => 0,
            GpuAssignment::Whole(v) => v.len() as u64 * gpusched_model::GPU_MILLI,
            GpuAssignment::Share { milli, .. } => *milli as u64,
        }
    }
}

/// Where a pod is in its life, as far as scheduling cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodPhase {
    /// Waiting for a node. `nominated`: a node freed for it by preemption.
    Pending { nominated: Option<NodeId> },
    /// Bound to a node and holding resources.
    Running {
        node: NodeId,
        gpus: GpuAssignment,
        since_ms: u64,
    },
    /// Being evicted: still holds its resources until it is gone.
    Terminating { node: NodeId, gpus: GpuAssignment },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    pub pod: Pod,
    pub phase: PodPhase,
}

impl PodState {
    pub fn pending(pod: Pod) -> Self {
        PodState {
            pod,
            phase: PodPhase::Pending { nominated: None },
        }
    }

    pub fn is_pending(&self) -> bool {
        matches!(self.phase, PodPhase::Pending { .. })
    }

    /// The node and GPUs the pod holds, if it holds any.
    pub fn holding(&self) -> Option<(NodeId, &GpuAssignment)> {
        match &self.phase {
            PodPhase::Running { node, gpus, .. } | PodPhase::Terminating { node, gpus } => {
                Some((*node, gpus))
            }
            PodPhase::Pending { .. } => None,
        }
    }
}

/// A consistent view of the cluster. Order matters only as a final
/// tie-break (it is part of the deterministic input).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub nodes: Vec<Node>,
    pub queues: Vec<Queue>,
    pub groups: Vec<PodGroup>,
    pub pods: Vec<PodState>,
}

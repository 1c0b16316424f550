//! The scheduler's input: a consistent view of the cluster.

use gpusched_model::{Node, Pod, PodGroup, Queue};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// Index of a node in [`Snapshot::nodes`].
pub type NodeId = u32;
/// Index of a pod in [`Snapshot::pods`].
pub type PodId = u32;

/// Which GPUs of its node a pod holds. GPU numbers are positions in
/// [`Node::gpus`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuAssignment {
    /// No GPU.
    #[default]
    None,
    /// Whole GPUs (positions in [`Node::gpus`]).
    Whole(Vec<u32>),
    /// A share of one GPU.
    Share {
        /// The GPU's position.
        gpu: u32,
        /// Compute share in milli-GPU.
        milli: u32,
        /// GPU memory in MiB (0: not asked by memory).
        memory_mib: u64,
    },
    /// MIG instances of one GPU in MIG mode.
    Mig {
        /// The GPU's position.
        gpu: u32,
        /// The instances' positions in the GPU's [`gpusched_model::Gpu::mig`].
        instances: Vec<u32>,
        /// Their measure, milli-GPU (Σ of the instances' milli).
        milli: u32,
    },
}

impl GpuAssignment {
    /// GPU milli this assignment takes.
    pub fn milli(&self) -> u64 {
        match self {
            GpuAssignment::None => 0,
            GpuAssignment::Whole(v) => v.len() as u64 * gpusched_model::GPU_MILLI,
            GpuAssignment::Share { milli, .. } | GpuAssignment::Mig { milli, .. } => *milli as u64,
        }
    }
}

/// Where a pod is in its life, as far as scheduling cares.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodPhase {
    /// Waiting for a node. `nominated`: a node freed for it by preemption.
    Pending {
        /// A node freed (or reserved) for it in an earlier cycle. Honoured
        /// (the node held for its job) only while the pod passes the static
        /// filters there and fits the node's allocatable, and for at most
        /// `SchedulerOptions::max_nomination_ms` from `nominated_at_ms`.
        nominated: Option<NodeId>,
        /// When the runner first saw this nomination (the clock of `now`).
        /// `None`: not known, the nomination's age is not bounded.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        nominated_at_ms: Option<u64>,
    },
    /// Bound to a node and holding resources.
    Running {
        /// Its node.
        node: NodeId,
        /// Its GPUs there.
        gpus: GpuAssignment,
        /// When it started (virtual ms).
        since_ms: u64,
    },
    /// Being evicted: still holds its resources until it is gone.
    Terminating {
        /// Its node.
        node: NodeId,
        /// Its GPUs there.
        gpus: GpuAssignment,
    },
}

/// A pod and where it is in its life.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodState {
    /// The pod: one record shared by whoever holds it (a runner's world,
    /// its snapshot cache, the engine) — cloning a `PodState` copies a
    /// pointer, not the pod.
    pub pod: Arc<Pod>,
    /// Its phase.
    pub phase: PodPhase,
}

impl PodState {
    /// A pending pod without nomination.
    pub fn pending(pod: impl Into<Arc<Pod>>) -> Self {
        PodState {
            pod: pod.into(),
            phase: PodPhase::Pending {
                nominated: None,
                nominated_at_ms: None,
            },
        }
    }

    /// Whether it waits for a node.
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
    /// The nodes ([`NodeId`] = position).
    pub nodes: Vec<Node>,
    /// The queue tree (parents by name).
    pub queues: Vec<Queue>,
    /// The pod groups (gangs).
    pub groups: Vec<PodGroup>,
    /// The pods ([`PodId`] = position).
    pub pods: Vec<PodState>,
}

//! What the scheduler and the node agent tell each other through the API
//! (`docs/protocol.md`): the GPU decision recorded on a pod
//! (`gpusched.io/decision`, written through the Binding) and a node's GPUs
//! as its agent publishes them (`gpusched.io/gpus`). Pure data and parsing;
//! both sides use these types so they cannot drift apart.

use crate::gpu::Gpu;
use serde::{Deserialize, Serialize};

/// Annotation carrying the decision (JSON).
pub const ANNOTATION_DECISION: &str = "gpusched.io/decision";
/// Version of the decision format.
pub const DECISION_VERSION: u32 = 1;
/// Longest decision text accepted (a forged or corrupted annotation must not
/// cost the scheduler or the agent more than this).
pub const MAX_DECISION_BYTES: usize = 16 * 1024;

/// A GPU share of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShareDecision {
    /// Thousandths of the GPU's compute.
    pub milli: u32,
    /// MiB of the GPU's memory (0: no memory share asked).
    #[serde(default)]
    pub memory_mib: u64,
}

/// What the scheduler decided for one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuDecision {
    /// Format version ([`DECISION_VERSION`]).
    pub v: u32,
    /// UID of the pod the decision was made for (a decision copied onto
    /// another pod is refused).
    pub uid: String,
    /// Node the pod was bound to.
    pub node: String,
    /// Increasing per scheduler instance; orders decisions of one node.
    pub seq: u64,
    /// Indices of the GPUs on the node (`nvidia-smi` order).
    pub indices: Vec<u32>,
    /// UUIDs of the same GPUs, in the same order.
    pub gpus: Vec<String>,
    /// Set when the pod holds a share of `gpus[0]` rather than whole GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<ShareDecision>,
}

/// Why a recorded decision was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecisionError {
    /// Longer than [`MAX_DECISION_BYTES`].
    #[error("annotation {ANNOTATION_DECISION} is {0} bytes (limit {MAX_DECISION_BYTES})")]
    TooLong(usize),
    /// Not valid JSON of the decision shape.
    #[error("annotation {ANNOTATION_DECISION} is malformed: {0}")]
    Malformed(String),
    /// A version this build does not know.
    #[error(
        "annotation {ANNOTATION_DECISION}: unknown version {0} (this build reads {DECISION_VERSION})"
    )]
    Version(u32),
    /// Made for another pod or node.
    #[error("annotation {ANNOTATION_DECISION} was made for {what} {expected:?}, not {actual:?}")]
    Mismatch {
        /// What was compared: `pod` or `node`.
        what: &'static str,
        /// The value expected here.
        expected: String,
        /// The value the annotation names.
        actual: String,
    },
    /// Names GPUs the node does not have, or twice.
    #[error("annotation {ANNOTATION_DECISION}: {0}")]
    Gpus(String),
}

impl GpuDecision {
    /// JSON text for the annotation.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation, checking size and version only.
    pub fn parse(text: &str) -> Result<Self, DecisionError> {
        if text.len() > MAX_DECISION_BYTES {
            return Err(DecisionError::TooLong(text.len()));
        }
        let d: GpuDecision =
            serde_json::from_str(text).map_err(|e| DecisionError::Malformed(e.to_string()))?;
        if d.v != DECISION_VERSION {
            return Err(DecisionError::Version(d.v));
        }
        Ok(d)
    }
}

/// Node annotation with the node's GPUs and their topology (JSON list of
/// [`NodeGpu`]), published by the node agent.
pub const ANNOTATION_NODE_GPUS: &str = "gpusched.io/gpus";

/// One GPU as a node publishes it in [`ANNOTATION_NODE_GPUS`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeGpu {
    /// Index on the node (`nvidia-smi` order).
    pub index: u32,
    /// GPU UUID.
    pub uuid: String,
    /// Model (the `nvidia.com/gpu.product` vocabulary).
    pub model: String,
    /// Memory in MiB.
    #[serde(rename = "memoryMiB")]
    pub memory_mib: u64,
    /// NVLink domain inside the node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nvlink: Option<u32>,
    /// PCIe switch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_switch: Option<u32>,
    /// NUMA node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<u32>,
    /// Health as the agent sees it.
    #[serde(default = "yes")]
    pub healthy: bool,
}

fn yes() -> bool {
    true
}

impl NodeGpu {
    /// The annotation form of a model GPU.
    pub fn from_model(g: &Gpu) -> Self {
        NodeGpu {
            index: g.index,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
            memory_mib: g.memory_mib,
            nvlink: g.topo.nvlink,
            pcie_switch: g.topo.pcie_switch,
            numa: g.topo.numa,
            healthy: g.is_healthy(),
        }
    }
}

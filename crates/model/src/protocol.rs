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
    /// The time-sliced resource the pod asks (`nvidia.com/gpu.shared`, or
    /// `nvidia.com/gpu` time-sliced under its own name); absent for a
    /// `gpusched.io/gpu-milli` share. `milli` is then `replicas` replicas of
    /// [`crate::sharing::replica_milli`] each.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Replicas of `resource` the pod asks (with `resource`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<u32>,
}

/// MIG instances of one GPU decided for a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigDecision {
    /// The resource the pod asks (`nvidia.com/mig-1g.10gb`, or
    /// `nvidia.com/gpu` on a `migStrategy: single` node).
    pub resource: String,
    /// The instances' profile.
    pub profile: String,
    /// Device ids of the instances (`MIG-…`), as the node agent publishes
    /// them in `gpusched.io/sharing`; all of the decision's one GPU.
    pub instances: Vec<String>,
    /// Their measure in milli-GPU (Σ of each instance's
    /// [`crate::sharing::mig_milli`]).
    pub milli: u32,
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
    /// Set when the pod holds MIG instances of `gpus[0]` (then `share` is
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Box<MigDecision>>,
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

/// Node annotation with what the node's agent has handed out, per pod
/// (JSON [`NodeAllocations`]), published by the node agent from its ledger
/// (the served decisions, rebuilt from the kubelet's PodResources after a
/// restart). `gpusched doctor` compares it with the pods that exist to find
/// GPUs still counted for pods that are gone or finished.
pub const ANNOTATION_NODE_ALLOCATIONS: &str = "gpusched.io/allocations";
/// Version of the allocations format.
pub const ALLOCATIONS_VERSION: u32 = 1;
/// Longest allocations text accepted.
pub const MAX_ALLOCATIONS_BYTES: usize = 256 * 1024;

/// What one pod holds on the node, as its agent sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodAllocation {
    /// The pod's UID (from its decision).
    pub uid: String,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// UUIDs of the GPUs handed to its containers (whole GPUs), or the one
    /// GPU it has a share of.
    pub gpus: Vec<String>,
    /// Milli-GPU handed out, for a share (absent for whole GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// Device ids of the MIG instances its containers hold (with `gpus`
    /// their one GPU and `milli` their measure); absent otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<String>,
}

/// The [`ANNOTATION_NODE_ALLOCATIONS`] document.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeAllocations {
    /// Format version ([`ALLOCATIONS_VERSION`]).
    pub v: u32,
    /// Version of the agent that wrote it.
    #[serde(default)]
    pub agent: String,
    /// Pods holding GPUs, by UID.
    pub pods: Vec<PodAllocation>,
}

/// Why an allocations annotation was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocationsError {
    /// Longer than [`MAX_ALLOCATIONS_BYTES`].
    #[error(
        "annotation {ANNOTATION_NODE_ALLOCATIONS} is {0} bytes (limit {MAX_ALLOCATIONS_BYTES})"
    )]
    TooLong(usize),
    /// Not valid JSON of the allocations shape.
    #[error("annotation {ANNOTATION_NODE_ALLOCATIONS} is malformed: {0}")]
    Malformed(String),
    /// A version this build does not know.
    #[error(
        "annotation {ANNOTATION_NODE_ALLOCATIONS}: unknown version {0} (this build reads {ALLOCATIONS_VERSION})"
    )]
    Version(u32),
}

impl NodeAllocations {
    /// JSON text for the annotation.
    pub fn to_annotation(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parses an annotation, checking size and version.
    pub fn parse(text: &str) -> Result<Self, AllocationsError> {
        if text.len() > MAX_ALLOCATIONS_BYTES {
            return Err(AllocationsError::TooLong(text.len()));
        }
        let a: NodeAllocations =
            serde_json::from_str(text).map_err(|e| AllocationsError::Malformed(e.to_string()))?;
        if a.v != ALLOCATIONS_VERSION {
            return Err(AllocationsError::Version(a.v));
        }
        Ok(a)
    }
}

#[cfg(test)]
mod allocation_tests {
    use super::*;

    #[test]
    fn allocations_round_trip_and_reject_bad_text() {
        let a = NodeAllocations {
            v: ALLOCATIONS_VERSION,
            agent: "0.1.0".into(),
            pods: vec![
                PodAllocation {
                    uid: "u1".into(),
                    namespace: "ml".into(),
                    name: "a".into(),
                    gpus: vec!["GPU-0".into(), "GPU-1".into()],
                    milli: None,
                    mig: Vec::new(),
                },
                PodAllocation {
                    uid: "u2".into(),
                    namespace: "ml".into(),
                    name: "b".into(),
                    gpus: vec!["GPU-2".into()],
                    milli: Some(300),
                    mig: Vec::new(),
                },
            ],
        };
        let text = a.to_annotation();
        assert!(text.contains(r#""milli":300"#), "{text}");
        assert!(!text.contains(r#""milli":null"#), "{text}");
        assert_eq!(NodeAllocations::parse(&text).unwrap(), a);
        assert_eq!(
            NodeAllocations::parse(r#"{"v":2,"pods":[]}"#),
            Err(AllocationsError::Version(2))
        );
        assert!(matches!(
            NodeAllocations::parse("{"),
            Err(AllocationsError::Malformed(_))
        ));
        let long = " ".repeat(MAX_ALLOCATIONS_BYTES + 1);
        assert!(matches!(
            NodeAllocations::parse(&long),
            Err(AllocationsError::TooLong(_))
        ));
    }
}

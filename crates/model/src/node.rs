//! Nodes.

use crate::gpu::Gpu;
use crate::labels;
use crate::resources::ResourceVec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Effect of a taint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    /// New pods are not placed unless they tolerate it.
    NoSchedule,
    /// Avoided when possible; not a filter.
    PreferNoSchedule,
    /// Like `NoSchedule`; running pods are also evicted by Kubernetes.
    NoExecute,
}

/// A node taint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value (may be empty).
    #[serde(default)]
    pub value: String,
    /// What the taint does.
    pub effect: TaintEffect,
}

/// A node as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// Node name, unique in a snapshot.
    pub name: String,
    /// Node labels (rack, block, NVLink domain, GPU model, …).
    pub labels: BTreeMap<String, String>,
    /// Taints pods must tolerate.
    pub taints: Vec<Taint>,
    /// Allocatable CPU, memory and extended resources. The GPU dimensions
    /// are derived from [`Node::gpus`] and kept in step by
    /// [`Node::sync_gpu_allocatable`].
    pub allocatable: ResourceVec,
    /// The node's GPUs, ordered by index.
    pub gpus: Vec<Gpu>,
    /// `spec.unschedulable` (cordoned or draining).
    pub unschedulable: bool,
    /// The kubelet offers this node's GPUs only as time-sliced replicas
    /// under another name (`nvidia.com/gpu.shared`): no whole GPU can be
    /// placed here, only replicas (as shares, `crate::sharing`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicas_only: bool,
    /// CSI attach limits (the node's `CSINode` `spec.drivers[].allocatable.count`):
    /// how many distinct volumes of each driver (by name) pods on the node
    /// may use; a driver not listed has no limit.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub attach_limits: BTreeMap<String, u32>,
}

impl Node {
    /// A schedulable node without labels or taints; GPU allocatable is derived from `gpus`.
    pub fn new(name: impl Into<String>, allocatable: ResourceVec, gpus: Vec<Gpu>) -> Self {
        let mut n = Node {
            name: name.into(),
            labels: BTreeMap::new(),
            taints: Vec::new(),
            allocatable,
            gpus,
            unschedulable: false,
            replicas_only: false,
            attach_limits: BTreeMap::new(),
        };
        n.sync_gpu_allocatable();
        n
    }

    /// Sets the GPU dimensions of `allocatable` from the healthy GPUs.
    pub fn sync_gpu_allocatable(&mut self) {
        let healthy = self.gpus.iter().filter(|g| g.is_healthy());
        self.allocatable.gpu_milli = healthy.clone().count() as u64 * crate::GPU_MILLI;
        self.allocatable.gpu_mem_mib = healthy.map(|g| g.memory_mib).sum();
    }

    /// Value of a label.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels.get(key).map(String::as_str)
    }

    /// The rack (`gpusched.io/rack`), if labelled.
    pub fn rack(&self) -> Option<&str> {
        self.label(labels::LABEL_RACK)
    }

    /// The block of racks (`gpusched.io/block`), if labelled.
    pub fn block(&self) -> Option<&str> {
        self.label(labels::LABEL_BLOCK)
    }

    /// Multi-node NVLink domain, if the node is part of one.
    pub fn nvlink_domain(&self) -> Option<&str> {
        self.label(labels::LABEL_NVLINK_DOMAIN)
    }

    /// Distinct GPU models on the node (sorted).
    pub fn gpu_models(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self.gpus.iter().map(|g| g.model.as_str()).collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// Topology of each GPU, by index.
    pub fn topos(&self) -> Vec<crate::topology::GpuTopo> {
        self.gpus.iter().map(|g| g.topo).collect()
    }
}

//! Physical GPUs as the scheduler and the node agent see them.

use serde::{Deserialize, Serialize};

/// Health of one GPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GpuHealth {
    /// Usable.
    #[default]
    Healthy,
    /// Failed (XID, ECC, lost): never given to a pod.
    Unhealthy,
    /// Healthy as far as the node agent knows, but the kubelet does not
    /// offer it (its `nvidia.com/gpu` allocatable is below the GPUs the
    /// agent reports: not yet registered, or being withdrawn). Never given
    /// to a pod.
    NotAllocatable,
}

/// One physical GPU of a node.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Index on the node (0-based, as `nvidia-smi` shows it).
    pub index: u32,
    /// NVIDIA UUID (`GPU-…`), stable across reboots.
    pub uuid: String,
    /// Model name, e.g. `H100-SXM5-80GB` or `V100M32`.
    pub model: String,
    /// Memory, MiB.
    pub memory_mib: u64,
    /// Health as last reported.
    pub health: GpuHealth,
    /// Position in the node's NVLink / PCIe / NUMA layout.
    pub topo: crate::topology::GpuTopo,
}

impl Gpu {
    /// Whether the GPU may be given to pods.
    pub fn is_healthy(&self) -> bool {
        self.health == GpuHealth::Healthy
    }
}

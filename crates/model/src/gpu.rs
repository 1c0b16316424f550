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
    /// Its MIG instances when it is in MIG mode (empty otherwise). A GPU
    /// in MIG mode is never given whole nor as a share: only its instances
    /// are, each to one pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<MigSlot>,
}

/// One MIG instance of a GPU as the scheduler counts it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigSlot {
    /// The device id the kubelet sees (`MIG-…`).
    pub id: String,
    /// Profile (`1g.10gb`).
    pub profile: String,
    /// The resource the kubelet advertises it under (`nvidia.com/gpu`
    /// under `migStrategy: single`, `nvidia.com/mig-<profile>` under
    /// `mixed`).
    pub resource: String,
    /// Its measure in milli-GPU of its GPU
    /// ([`crate::sharing::mig_milli`]).
    pub milli: u32,
}

impl Gpu {
    /// Whether the GPU may be given to pods.
    pub fn is_healthy(&self) -> bool {
        self.health == GpuHealth::Healthy
    }

    /// Whether the GPU is in MIG mode (has instances).
    pub fn is_mig(&self) -> bool {
        !self.mig.is_empty()
    }
}

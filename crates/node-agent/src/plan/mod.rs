//! Which resources the node offers and which device ids make them up
//! (whole GPUs, MIG devices, time-sliced replicas), and the pure answers to
//! `Allocate` and `GetPreferredAllocation` over them.

//!
//! Layout: this file holds the types and what a plan is (its kind, its
//! socket); `build.rs` builds the plans from the inventory and settings;
//! `answers.rs` answers the kubelet's questions over one plan (device
//! list, `Allocate`, `GetPreferredAllocation`).

mod answers;
mod build;
#[cfg(test)]
mod tests;

pub use build::{build_plans, mig_instance, unused_replication};

use gpusched_model::labels::RESOURCE_GPU;
use gpusched_model::topology::GpuTopo;
use std::collections::HashMap;

/// A device unit: a whole GPU or one MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Index into [`Inventory::gpus`](crate::backend::Inventory::gpus).
    pub gpu: usize,
    /// Index into the GPU's MIG devices.
    pub mig: Option<usize>,
    /// UUID of the unit (GPU or MIG device).
    pub uuid: String,
    /// Id in the index strategy (`3`, or `3:1` for MIG device 1 of GPU 3).
    pub index_id: String,
    /// Where its GPU sits.
    pub topo: GpuTopo,
    /// Its GPU's `/dev/nvidia<minor>`.
    pub minor: u32,
    /// MIG capability device nodes (empty for whole GPUs).
    pub caps: Vec<String>,
}

/// One id advertised to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDevice {
    /// The id (UUID or index id, with `::<replica>` under time-slicing).
    pub id: String,
    /// Index into [`ResourcePlan::units`].
    pub unit: usize,
    /// Replica number under time-slicing.
    pub replica: Option<u32>,
}

/// One resource served by one plugin socket.
#[derive(Clone, Debug)]
pub struct ResourcePlan {
    /// Name advertised to the kubelet.
    pub name: String,
    /// The GPUs or MIG devices offered.
    pub units: Vec<Unit>,
    /// The ids advertised, `replicas` per unit.
    pub devices: Vec<PlanDevice>,
    /// Id → index into `devices`.
    pub by_id: HashMap<String, usize>,
    /// 1 when not shared.
    pub replicas: u32,
    /// Refuse containers asking for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Topology of each unit (index = unit), for preferred allocation.
    pub unit_topos: Vec<GpuTopo>,
    /// For MIG devices not time-sliced: one device's measure in milli-GPU
    /// of its GPU (`⌊1000 · g / G⌋`, all devices of a resource have one
    /// profile); 0 otherwise.
    pub unit_milli: u32,
}

/// The node's resources cannot be built from its devices and settings.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// Under `migStrategy: single`, a GPU without MIG devices or with two profiles (which, in words).
    #[error("mig strategy single needs every GPU in MIG mode with MIG devices of one profile: {0}")]
    MixedMig(String),
    /// Two plans would advertise this name.
    #[error("two resources would be advertised as {0:?}")]
    DuplicateResource(String),
    #[error(
        "field `{field}`: {replicas} replicas × {units} devices = {devices} devices for {resource}; \
         at most {max} per resource (a kubelet refuses device lists over 4 MiB)"
    )]
    /// Time-slicing would advertise more than [`MAX_DEVICES_PER_RESOURCE`] ids.
    TooManyDevices {
        /// The config field (`sharing.timeSlicing.resources[0].replicas`).
        field: String,
        /// The resource.
        resource: String,
        /// Replicas asked.
        replicas: u32,
        /// Devices of the resource.
        units: usize,
        /// `replicas × units`.
        devices: u64,
        /// [`MAX_DEVICES_PER_RESOURCE`].
        max: usize,
    },
}

/// Most device ids one resource may advertise. A `ListAndWatch` message of
/// this many devices with the longest ids (MIG UUIDs with a replica suffix)
/// encodes to about 1.2 MB, well under the 4 MiB a kubelet accepts.
pub const MAX_DEVICES_PER_RESOURCE: usize = 16_384;

/// A request the kubelet (or anyone) should not have made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// The request is malformed (unknown id, wrong count …): `INVALID_ARGUMENT`.
    #[error("{0}")]
    Invalid(String),
    /// The request is well formed but cannot be served now (unhealthy device …): `FAILED_PRECONDITION`.
    #[error("{0}")]
    Precondition(String),
}

impl RequestError {
    /// The gRPC status to answer with.
    pub fn into_status(self) -> tonic::Status {
        match self {
            RequestError::Invalid(m) => tonic::Status::invalid_argument(m),
            RequestError::Precondition(m) => tonic::Status::failed_precondition(m),
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

impl ResourcePlan {
    /// Socket file name for this resource, e.g. `gpusched-nvidia.com-gpu.sock`.
    pub fn socket_name(&self) -> String {
        format!("gpusched-{}.sock", sanitize(&self.name))
    }
}

/// Tokens of `gpusched.io/gpu-milli` per GPU.
pub const SHARE_TOKENS: u32 = 1000;
pub use gpusched_model::labels::RESOURCE_GPU_MILLI;

impl ResourcePlan {
    /// This plan carries GPU shares.
    pub fn is_share(&self) -> bool {
        self.name == RESOURCE_GPU_MILLI
    }

    /// This plan is time-sliced replicas of whole GPUs (under
    /// `nvidia.com/gpu` or a renamed resource; not MIG): the scheduler
    /// places a pod's replicas as a share of one GPU
    /// (`gpusched_model::sharing`), and decisions govern.
    pub fn is_time_sliced_gpu(&self) -> bool {
        !self.is_share()
            && self.replicas > 1
            && !self.units.is_empty()
            && self.units.iter().all(|u| u.mig.is_none())
    }

    /// What a call for `n` devices of this plan is in the decisions'
    /// measure: `(milli, resource)`, the resource `None` for
    /// `gpusched.io/gpu-milli` tokens, else the time-sliced resource.
    pub fn share_call(&self, n: usize) -> (u32, Option<&str>) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if self.is_share() {
            (n, None)
        } else if self.is_mig() {
            (n.saturating_mul(self.unit_milli), Some(self.name.as_str()))
        } else {
            (
                n.saturating_mul(gpusched_model::sharing::replica_milli(self.replicas)),
                Some(self.name.as_str()),
            )
        }
    }

    /// This plan is MIG devices, not time-sliced, of a known measure: the
    /// scheduler places a pod's devices as MIG instances of one GPU
    /// (`GpuDecision::mig`), and decisions govern. A call for `k` devices
    /// is `k ·` [`ResourcePlan::unit_milli`] of that resource
    /// ([`ResourcePlan::share_call`]).
    pub fn is_mig(&self) -> bool {
        !self.is_share()
            && self.replicas <= 1
            && self.unit_milli > 0
            && !self.units.is_empty()
            && self.units.iter().all(|u| u.mig.is_some())
    }

    /// This plan is whole, non-shared GPUs (`nvidia.com/gpu`, no MIG, no
    /// time-slicing): the resource decisions govern.
    pub fn is_whole_gpu(&self) -> bool {
        self.name == RESOURCE_GPU
            && self.replicas <= 1
            && self.units.iter().all(|u| u.mig.is_none())
    }
}

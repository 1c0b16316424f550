//! Device sources: the [`DeviceBackend`] trait and its two implementations,
//! [`nvml`] (real GPUs through libnvidia-ml, loaded at run time) and
//! [`fake`] (a node described in YAML, with fault injection).

pub mod fake;
pub mod nvml;

use gpusched_model::topology::GpuTopo;
use std::time::Duration;
use tokio::sync::mpsc::UnboundedSender;

/// A MIG device (GPU instance + compute instance) of a GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigInfo {
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    pub memory_mib: u64,
    /// Capability device nodes (`/dev/nvidia-caps/nvidia-capN`) a container
    /// needs to use this MIG device without the NVIDIA runtime.
    pub caps: Vec<String>,
}

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    pub index: u32,
    pub uuid: String,
    pub model: String,
    /// The product name as the driver reports it (`NVIDIA H100 80GB HBM3`);
    /// the fake backend uses the model.
    pub product_name: String,
    pub memory_mib: u64,
    /// PCI bus id, `0000:1b:00.0`.
    pub pci_bus_id: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    pub topo: GpuTopo,
    /// Indices of GPUs reachable over NVLink directly.
    pub nvlink_peers: Vec<u32>,
    pub mig_enabled: bool,
    pub mig: Vec<MigInfo>,
    /// CUDA compute capability (major, minor), when known.
    pub compute_capability: Option<(u32, u32)>,
}

/// What a backend found on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    pub gpus: Vec<GpuInfo>,
    pub driver_version: String,
    /// `12.4`.
    pub cuda_version: String,
    /// The machine's product name (DMI `product_name`, e.g. `DGX H100`),
    /// when known.
    pub machine: Option<String>,
}

/// Something a health source observed about one GPU (by UUID).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HealthEvent {
    /// An XID error was reported.
    Xid { gpu: String, xid: u64 },
    /// A periodic check failed (device lost, query error …).
    CheckFailed { gpu: String, reason: String },
    /// Fault injection or an operator: unhealthy until released.
    Force { gpu: String, reason: String },
    /// Fault injection or an operator: clear every fault now.
    Release { gpu: String },
}

impl HealthEvent {
    pub fn gpu(&self) -> &str {
        match self {
            HealthEvent::Xid { gpu, .. }
            | HealthEvent::CheckFailed { gpu, .. }
            | HealthEvent::Force { gpu, .. }
            | HealthEvent::Release { gpu } => gpu,
        }
    }
}

/// Live readings of one GPU for `/metrics`.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuSample {
    pub uuid: String,
    pub utilization_ratio: Option<f64>,
    pub memory_used_bytes: Option<u64>,
    pub memory_total_bytes: Option<u64>,
    pub power_watts: Option<f64>,
    pub temperature_celsius: Option<f64>,
}

/// A device source failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "nvml is not available: {0} (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)"
    )]
    NvmlUnavailable(String),
    #[error("nvml query {what} failed: {why}")]
    Nvml { what: String, why: String },
    #[error("cannot read node file {path}: {source}")]
    ReadNodeFile {
        path: String,
        source: std::io::Error,
    },
    #[error("node file {path}: {message}")]
    NodeFile { path: String, message: String },
    #[error("health monitoring: {0}")]
    Health(String),
}

/// How health monitoring runs.
#[derive(Clone, Debug)]
pub struct HealthWatch {
    /// Period of the cheap checks (device still answers, control file …).
    pub check_interval: Duration,
}

/// A source of GPUs and of facts about their health.
///
/// Contract: `discover` is cheap enough to call at start and after a
/// restart, and never changes any device setting. `watch_health` starts
/// background monitoring that sends [`HealthEvent`]s until `events` is
/// closed; it returns once monitoring is set up (so errors in the set-up are
/// reported to the caller). `sample` reads live figures for metrics and may
/// leave any figure out.
pub trait DeviceBackend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    fn discover(&self) -> Result<Inventory, BackendError>;
    fn watch_health(
        &self,
        watch: HealthWatch,
        events: UnboundedSender<HealthEvent>,
    ) -> Result<(), BackendError>;
    fn sample(&self) -> Vec<GpuSample>;
    /// UUIDs of GPUs known to be unhealthy before monitoring starts (held
    /// unhealthy until released).
    fn initial_faults(&self) -> Vec<String> {
        Vec::new()
    }
}

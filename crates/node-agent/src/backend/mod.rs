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
    /// The MIG device UUID (`MIG-…`).
    pub uuid: String,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// Memory of the GPU instance.
    pub memory_mib: u64,
    /// Capability device nodes (`/dev/nvidia-caps/nvidia-capN`) a container
    /// needs to use this MIG device without the NVIDIA runtime.
    pub caps: Vec<String>,
}

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// The driver's index (`nvidia-smi -i`).
    pub index: u32,
    /// The GPU UUID (`GPU-…`).
    pub uuid: String,
    /// The model as the scheduler names it (`H100-SXM5-80GB`).
    pub model: String,
    /// The product name as the driver reports it (`NVIDIA H100 80GB HBM3`);
    /// the fake backend uses the model.
    pub product_name: String,
    /// Total memory.
    pub memory_mib: u64,
    /// PCI bus id, `0000:1b:00.0`.
    pub pci_bus_id: String,
    /// `/dev/nvidia<minor>`.
    pub minor: u32,
    /// Where the GPU sits (NVLink domain, PCIe switch, NUMA node).
    pub topo: GpuTopo,
    /// Indices of GPUs reachable over NVLink directly.
    pub nvlink_peers: Vec<u32>,
    /// MIG mode is on.
    pub mig_enabled: bool,
    /// Its MIG devices (empty when MIG mode is off).
    pub mig: Vec<MigInfo>,
    /// CUDA compute capability (major, minor), when known.
    pub compute_capability: Option<(u32, u32)>,
}

/// What a backend found on the node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The GPUs, by index.
    pub gpus: Vec<GpuInfo>,
    /// The driver version (`550.54.15`).
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
    Xid {
        /// The GPU UUID.
        gpu: String,
        /// The XID number.
        xid: u64,
    },
    /// A periodic check failed (device lost, query error …).
    CheckFailed {
        /// The GPU UUID.
        gpu: String,
        /// What failed, in words.
        reason: String,
    },
    /// Fault injection or an operator: unhealthy until released.
    Force {
        /// The GPU UUID.
        gpu: String,
        /// Why, as given.
        reason: String,
    },
    /// Fault injection or an operator: clear every fault now.
    Release {
        /// The GPU UUID.
        gpu: String,
    },
}

impl HealthEvent {
    /// The UUID of the GPU the event is about.
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
    /// The GPU UUID.
    pub uuid: String,
    /// GPU utilization as a ratio, 0..=1.
    pub utilization_ratio: Option<f64>,
    /// Device memory in use.
    pub memory_used_bytes: Option<u64>,
    /// Device memory in total.
    pub memory_total_bytes: Option<u64>,
    /// Power draw.
    pub power_watts: Option<f64>,
    /// GPU temperature.
    pub temperature_celsius: Option<f64>,
}

/// A device source failed.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error(
        "nvml is not available: {0} (is the NVIDIA driver installed and libnvidia-ml.so.1 on the library path?)"
    )]
    /// libnvidia-ml could not be loaded or initialised (the library's error).
    NvmlUnavailable(String),
    /// An NVML query failed.
    #[error("nvml query {what} failed: {why}")]
    Nvml {
        /// The query.
        what: String,
        /// NVML's error.
        why: String,
    },
    /// The fake backend's node file could not be read.
    #[error("cannot read node file {path}: {source}")]
    ReadNodeFile {
        /// The node file.
        path: String,
        /// Why reading failed.
        source: std::io::Error,
    },
    /// The fake backend's node file is not a valid node.
    #[error("node file {path}: {message}")]
    NodeFile {
        /// The node file.
        path: String,
        /// What is wrong.
        message: String,
    },
    /// Health monitoring could not be set up.
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
    /// Short name for logs (`nvml`, `fake`).
    fn name(&self) -> &'static str;
    /// The GPUs of the node.
    fn discover(&self) -> Result<Inventory, BackendError>;
    /// Starts health monitoring (see the trait's contract).
    fn watch_health(
        &self,
        watch: HealthWatch,
        events: UnboundedSender<HealthEvent>,
    ) -> Result<(), BackendError>;
    /// Live readings of every GPU (see the trait's contract).
    fn sample(&self) -> Vec<GpuSample>;
    /// UUIDs of GPUs known to be unhealthy before monitoring starts (held
    /// unhealthy until released).
    fn initial_faults(&self) -> Vec<String> {
        Vec::new()
    }
}

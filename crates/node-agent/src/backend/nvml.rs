//! The `nvml` backend: real NVIDIA GPUs through libnvidia-ml, which
//! nvml-wrapper loads at run time (so the agent builds everywhere and fails
//! with a clear error where the library is missing).
//!
//! Read-only by design: this module only queries NVML and registers for
//! events; it never changes a GPU setting (no MIG, clock, power or
//! persistence-mode calls).

use super::{
    BackendError, DeviceBackend, GpuInfo, GpuSample, HealthEvent, HealthWatch, Inventory, MigInfo,
};
use gpusched_model::topology::GpuTopo;
use nvml_wrapper::Nvml;
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{TemperatureSensor, TopologyLevel};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::mpsc::UnboundedSender;

/// Real GPUs.
pub struct NvmlBackend {
    nvml: Arc<Nvml>,
    sysfs: std::path::PathBuf,
}

fn q<T>(what: &str, r: Result<T, NvmlError>) -> Result<T, BackendError> {
    r.map_err(|e| BackendError::Nvml {
        what: what.to_string(),
        why: e.to_string(),
    })
}

/// `NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`.
pub fn mig_profile_from_name(name: &str) -> Option<String> {
    let (_, p) = name.rsplit_once("MIG ")?;
    let p = p.trim();
    (!p.is_empty()).then(|| p.to_string())
}

/// GPU-instance and compute-instance ids of a MIG device handle, when the
/// driver exports the calls.
fn mig_instance_ids(nvml: &Nvml, md: &nvml_wrapper::Device) -> Option<(u32, u32)> {
    let lib = nvml.lib();
    if lib.nvmlDeviceGetGpuInstanceId.is_err() || lib.nvmlDeviceGetComputeInstanceId.is_err() {
        return None;
    }
    let (mut gi, mut ci) = (0u32, 0u32);
    // SAFETY: both symbols are present (checked above); `md` is a live MIG
    // device handle from this NVML instance, and the out-pointers point at
    // local integers. Read-only queries.
    let (a, b) = unsafe {
        (
            lib.nvmlDeviceGetGpuInstanceId(md.handle(), &mut gi),
            lib.nvmlDeviceGetComputeInstanceId(md.handle(), &mut ci),
        )
    };
    (a == 0 && b == 0).then_some((gi, ci))
}

/// Capability device paths of MIG device `gi`/`ci` of the GPU with minor
/// `gpu_minor`, from the text of `/proc/driver/nvidia-caps/mig-minors`
/// (`gpu0/gi1/access 12`, `gpu0/gi1/ci0/access 13`).
pub fn mig_cap_paths(mig_minors: &str, gpu_minor: u32, gi: u32, ci: u32) -> Vec<String> {
    let want = [
        format!("gpu{gpu_minor}/gi{gi}/access"),
        format!("gpu{gpu_minor}/gi{gi}/ci{ci}/access"),
    ];
    want.iter()
        .filter_map(|w| {
            mig_minors.lines().find_map(|l| {
                let (k, v) = l.trim().split_once(char::is_whitespace)?;
                (k == w)
                    .then(|| v.trim().parse::<u32>().ok())
                    .flatten()
                    .map(|m| format!("/dev/nvidia-caps/nvidia-cap{m}"))
            })
        })
        .collect()
}

/// `NVIDIA H100 80GB HBM3` → `NVIDIA-H100-80GB-HBM3` (GFD's label spelling).
pub fn product_label(name: &str) -> String {
    name.split_whitespace().collect::<Vec<_>>().join("-")
}

impl NvmlBackend {
    /// Loads and initialises NVML.
    pub fn new() -> Result<Self, BackendError> {
        let nvml = Nvml::init().map_err(|e| BackendError::NvmlUnavailable(e.to_string()))?;
        Ok(NvmlBackend {
            nvml: Arc::new(nvml),
            sysfs: "/sys/bus/pci/devices".into(),
        })
    }

    fn numa_node(&self, bus_id: &str) -> Option<u32> {
        // NVML spells the domain with 8 hex digits; sysfs with 4.
        let lower = bus_id.to_ascii_lowercase();
        let short = match lower.split_once(':') {
            Some((dom, rest)) if dom.len() > 4 => format!("{}:{rest}", &dom[dom.len() - 4..]),
            _ => lower.clone(),
        };
        let text = std::fs::read_to_string(self.sysfs.join(short).join("numa_node")).ok()?;
        let n: i64 = text.trim().parse().ok()?;
        u32::try_from(n).ok()
    }
}

impl DeviceBackend for NvmlBackend {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn discover(&self) -> Result<Inventory, BackendError> {
        let nvml = &self.nvml;
        let count = q("device_count", nvml.device_count())?;
        let driver_version = q("sys_driver_version", nvml.sys_driver_version())?;
        let cuda = q("sys_cuda_driver_version", nvml.sys_cuda_driver_version())?;
        let cuda_version = format!(
            "{}.{}",
            nvml_wrapper::cuda_driver_version_major(cuda),
            nvml_wrapper::cuda_driver_version_minor(cuda)
        );
        let mig_minors =
            std::fs::read_to_string("/proc/driver/nvidia-caps/mig-minors").unwrap_or_default();
        let mut gpus = Vec::new();
        let mut handles = Vec::new();
        for i in 0..count {
            let d = q("device_by_index", nvml.device_by_index(i))?;
            let uuid = q("uuid", d.uuid())?;
            let name = q("name", d.name())?;
            let mem = q("memory_info", d.memory_info())?;
            let pci = q("pci_info", d.pci_info())?;
            let minor = q("minor_number", d.minor_number())?;
            let numa = self.numa_node(&pci.bus_id);
            let mig_enabled = matches!(d.mig_mode(), Ok(m) if m.current == 1);
            let mut mig = Vec::new();
            if mig_enabled {
                let max = d.mig_device_count().unwrap_or(0);
                for m in 0..max {
                    let Ok(md) = d.mig_device_by_index(m) else {
                        continue;
                    };
                    let (Ok(u), Ok(n)) = (md.uuid(), md.name()) else {
                        continue;
                    };
                    let caps = mig_instance_ids(nvml, &md)
                        .map(|(gi, ci)| mig_cap_paths(&mig_minors, minor, gi, ci))
                        .unwrap_or_default();
                    mig.push(MigInfo {
                        uuid: u,
                        profile: mig_profile_from_name(&n).unwrap_or_else(|| "unknown".into()),
                        memory_mib: md.memory_info().map(|m| m.total >> 20).unwrap_or(0),
                        caps,
                    });
                }
            }
            let compute_capability = d
                .cuda_compute_capability()
                .ok()
                .and_then(|c| Some((u32::try_from(c.major).ok()?, u32::try_from(c.minor).ok()?)));
            gpus.push(GpuInfo {
                compute_capability,
                index: i,
                uuid,
                model: product_label(&name),
                product_name: name.clone(),
                memory_mib: mem.total >> 20,
                pci_bus_id: pci.bus_id.clone(),
                minor,
                topo: GpuTopo {
                    nvlink: None,
                    pcie_switch: None,
                    numa,
                },
                nvlink_peers: Vec::new(),
                mig_enabled,
                mig,
            });
            handles.push(pci.bus_id);
        }
        // NVLink peers: an active link whose remote end is another GPU.
        let by_bus: BTreeMap<String, u32> = gpus
            .iter()
            .map(|g| (g.pci_bus_id.to_ascii_lowercase(), g.index))
            .collect();
        for g in gpus.iter_mut() {
            let d = q("device_by_index", nvml.device_by_index(g.index))?;
            let mut peers = Vec::new();
            for l in 0..nvml_wrapper_sys_links() {
                let link = d.link_wrapper_for(l);
                if !matches!(link.is_active(), Ok(true)) {
                    continue;
                }
                if let Ok(r) = link.remote_pci_info()
                    && let Some(&p) = by_bus.get(&r.bus_id.to_ascii_lowercase())
                    && p != g.index
                    && !peers.contains(&p)
                {
                    peers.push(p);
                }
            }
            peers.sort_unstable();
            g.nvlink_peers = peers;
        }
        // NVLink domains: connected components of the peer graph. A GPU with
        // an active link to an NVSwitch (not a GPU) shares the switch's
        // domain, which NVML reports as common ancestor "internal"/"single"
        // with NVLink present; we approximate with the peer graph plus
        // "every GPU with active links but no GPU peers is on one switch".
        let n = gpus.len();
        let mut domain: Vec<Option<u32>> = vec![None; n];
        let mut next = 0u32;
        for s in 0..n {
            if domain[s].is_some() || gpus[s].nvlink_peers.is_empty() {
                continue;
            }
            let mut stack = vec![s];
            domain[s] = Some(next);
            while let Some(x) = stack.pop() {
                for &p in &gpus[x].nvlink_peers {
                    let pi = p as usize;
                    if pi < n && domain[pi].is_none() {
                        domain[pi] = Some(next);
                        stack.push(pi);
                    }
                }
            }
            next += 1;
        }
        let switched: Vec<usize> = (0..n)
            .filter(|&i| {
                domain[i].is_none()
                    && nvml.device_by_index(gpus[i].index).is_ok_and(|d| {
                        (0..nvml_wrapper_sys_links())
                            .any(|l| matches!(d.link_wrapper_for(l).is_active(), Ok(true)))
                    })
            })
            .collect();
        if switched.len() > 1 {
            for i in switched {
                domain[i] = Some(next);
            }
        }
        // PCIe switches: GPUs whose common ancestor is at most a multi-level
        // switch share one; number the groups in index order.
        let mut switch: Vec<Option<u32>> = vec![None; n];
        let mut next_sw = 0u32;
        for a in 0..n {
            if switch[a].is_some() {
                continue;
            }
            switch[a] = Some(next_sw);
            let da = q("device_by_index", nvml.device_by_index(gpus[a].index))?;
            for b in a + 1..n {
                if switch[b].is_some() {
                    continue;
                }
                let Ok(db) = nvml.device_by_index(gpus[b].index) else {
                    continue;
                };
                if matches!(
                    da.topology_common_ancestor(db),
                    Ok(TopologyLevel::Internal | TopologyLevel::Single | TopologyLevel::Multiple)
                ) {
                    switch[b] = Some(next_sw);
                }
            }
            next_sw += 1;
        }
        for (i, g) in gpus.iter_mut().enumerate() {
            g.topo.nvlink = domain[i];
            g.topo.pcie_switch = switch[i];
        }
        let machine = std::fs::read_to_string("/sys/class/dmi/id/product_name")
            .ok()
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty());
        Ok(Inventory {
            gpus,
            driver_version,
            cuda_version,
            machine,
        })
    }

    fn watch_health(
        &self,
        watch: HealthWatch,
        events: UnboundedSender<HealthEvent>,
    ) -> Result<(), BackendError> {
        let nvml = self.nvml.clone();
        let interval = watch.check_interval;
        // Set-up runs in the monitoring thread (an event set borrows the
        // NVML handle); its outcome comes back so errors surface at start.
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), BackendError>>();
        std::thread::Builder::new()
            .name("nvml-health".into())
            .spawn(move || {
                let setup = || -> Result<_, BackendError> {
                    let count = q("device_count", nvml.device_count())?;
                    let mut set = q("create_event_set", nvml.create_event_set())?;
                    let mut uuids = Vec::new();
                    for i in 0..count {
                        let d = q("device_by_index", nvml.device_by_index(i))?;
                        let uuid = q("uuid", d.uuid())?;
                        let supported = d.supported_event_types().unwrap_or(EventTypes::empty());
                        let types = supported
                            & (EventTypes::CRITICAL_XID_ERROR | EventTypes::DOUBLE_BIT_ECC_ERROR);
                        if types.is_empty() {
                            tracing::warn!(gpu = %uuid, "device supports no health events; periodic checks only");
                        } else {
                            set = d.register_events(types, set).map_err(|e| BackendError::Nvml {
                                what: format!("register_events({uuid})"),
                                why: e.error.to_string(),
                            })?;
                            tracing::info!(gpu = %uuid, events = ?types, "registered for XID events");
                        }
                        uuids.push(uuid);
                    }
                    Ok((set, uuids))
                };
                let (set, uuids) = match setup() {
                    Ok(v) => {
                        let _ = ready_tx.send(Ok(()));
                        v
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                        return;
                    }
                };
                let mut last_check = std::time::Instant::now();
                loop {
                    if events.is_closed() {
                        return;
                    }
                    let wait_ms = (interval.as_millis().min(5000) as u32).max(10);
                    match set.wait(wait_ms) {
                        Ok(ev) => {
                            let uuid = ev.device.uuid().unwrap_or_default();
                            let xid = match ev.event_data {
                                Some(XidError::Value(v)) => v,
                                Some(XidError::Unknown) | None => {
                                    if ev.event_type.contains(EventTypes::DOUBLE_BIT_ECC_ERROR) {
                                        48
                                    } else {
                                        999
                                    }
                                }
                            };
                            let targets: Vec<String> = if uuid.is_empty() {
                                // Unknown device: every GPU is suspect.
                                uuids.clone()
                            } else {
                                vec![uuid]
                            };
                            for gpu in targets {
                                let _ = events.send(HealthEvent::Xid { gpu, xid });
                            }
                        }
                        Err(NvmlError::Timeout) => {}
                        Err(e) => {
                            tracing::warn!("nvml event wait: {e}");
                            std::thread::sleep(interval);
                        }
                    }
                    if last_check.elapsed() >= interval {
                        last_check = std::time::Instant::now();
                        for u in &uuids {
                            let r = nvml.device_by_uuid(u.as_str()).and_then(|d| d.memory_info());
                            if let Err(e) = r {
                                let _ = events.send(HealthEvent::CheckFailed {
                                    gpu: u.clone(),
                                    reason: e.to_string(),
                                });
                            }
                        }
                    }
                }
            })
            .map_err(|e| BackendError::Health(e.to_string()))?;
        ready_rx
            .recv()
            .map_err(|_| BackendError::Health("monitoring thread ended during set-up".into()))?
    }

    fn sample(&self) -> Vec<GpuSample> {
        let nvml = &self.nvml;
        let count = nvml.device_count().unwrap_or(0);
        (0..count)
            .filter_map(|i| nvml.device_by_index(i).ok())
            .filter_map(|d| {
                let uuid = d.uuid().ok()?;
                let mem = d.memory_info().ok();
                Some(GpuSample {
                    uuid,
                    utilization_ratio: d.utilization_rates().ok().map(|u| u.gpu as f64 / 100.0),
                    memory_used_bytes: mem.as_ref().map(|m| m.used),
                    memory_total_bytes: mem.as_ref().map(|m| m.total),
                    power_watts: d.power_usage().ok().map(|mw| mw as f64 / 1000.0),
                    temperature_celsius: d
                        .temperature(TemperatureSensor::Gpu)
                        .ok()
                        .map(|t| t as f64),
                })
            })
            .collect()
    }
}

/// Most NVLink links a GPU can have (NVML's `NVML_NVLINK_MAX_LINKS`).
fn nvml_wrapper_sys_links() -> u32 {
    18
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_library_is_a_clear_error() {
        // On a GPU machine this succeeds; everywhere else it must explain.
        if let Err(e) = NvmlBackend::new() {
            let m = e.to_string();
            assert!(m.contains("nvml is not available"), "{m}");
            assert!(m.contains("libnvidia-ml.so.1"), "{m}");
        }
    }

    #[test]
    fn mig_caps_from_proc() {
        let text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu1/gi1/access 147\ngpu1/gi1/ci0/access 148\n";
        assert_eq!(
            mig_cap_paths(text, 1, 1, 0),
            vec![
                "/dev/nvidia-caps/nvidia-cap147".to_string(),
                "/dev/nvidia-caps/nvidia-cap148".to_string()
            ]
        );
        assert!(mig_cap_paths(text, 3, 1, 0).is_empty());
    }

    #[test]
    fn names() {
        assert_eq!(
            mig_profile_from_name("NVIDIA A100-SXM4-40GB MIG 1g.5gb").as_deref(),
            Some("1g.5gb")
        );
        assert_eq!(mig_profile_from_name("NVIDIA A100"), None);
        assert_eq!(
            product_label("NVIDIA H100 80GB HBM3"),
            "NVIDIA-H100-80GB-HBM3"
        );
    }
}

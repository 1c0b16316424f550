//! One world: the whole GPUs gpusched's own driver publishes on a node
//! without device-plugin GPUs are the core's GPUs of that node, and a
//! pod's plain GPU claims are a core GPU request — so queues, quotas, fair
//! share, gangs, packing, topology, preemption and explain count them like
//! any GPU.
//!
//! A claim is a *plain GPU claim* when each of its requests is `exactly`
//! N devices (`ExactCount`) of the DeviceClass [`dra::DEVICE_CLASS`] whose
//! selectors are none or only `device.driver == "gpu.gpusched.io"`, with no
//! selectors, tolerations or admin access of its own, and the claim has no
//! constraints. Anything else goes through the generic allocator as a node
//! filter ([`super::alloc`]).

use super::{Allocation, AllocatedDevice, AttrValue, Claim, Class, Count, Device, DeviceId};
use gpusched_model::dra;
use gpusched_model::topology::GpuTopo;
use gpusched_model::{Gpu, GpuHealth};
use std::collections::BTreeMap;

/// The core's GPUs of a node from its devices of [`dra::DRIVER`] named
/// `gpu-<index>` (sorted by index; none: the node has none). A device with
/// an untolerated-by-default taint (`NoSchedule`, `NoExecute`) is
/// unhealthy.
pub fn node_gpus(devices: &[&Device]) -> Vec<Gpu> {
    let mut out: Vec<Gpu> = Vec::new();
    // NVLink domains and PCIe roots are strings: numbered in order seen
    let mut nvlink: BTreeMap<String, u32> = BTreeMap::new();
    let mut pcie: BTreeMap<String, u32> = BTreeMap::new();
    let mut sorted: Vec<(u32, &Device)> = devices
        .iter()
        .filter(|d| d.id.driver == dra::DRIVER)
        .filter_map(|d| Some((dra::gpu_device_index(&d.id.device)?, *d)))
        .collect();
    sorted.sort_by_key(|(i, _)| *i);
    sorted.dedup_by_key(|(i, _)| *i);
    for (index, d) in sorted {
        let attr = |name: &str| d.attributes.get(&format!("{}/{name}", dra::DRIVER));
        let text = |name: &str| match attr(name) {
            Some(AttrValue::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let numbered = |m: &mut BTreeMap<String, u32>, v: Option<String>| {
            v.map(|v| {
                let n = m.len() as u32;
                *m.entry(v).or_insert(n)
            })
        };
        let nvl = numbered(&mut nvlink, text(dra::ATTR_NVLINK_DOMAIN));
        let root = match d.attributes.get(dra::ATTR_PCIE_ROOT) {
            Some(AttrValue::Str(s)) => Some(s.clone()),
            _ => None,
        };
        let pci = numbered(&mut pcie, root);
        let numa = match attr(dra::ATTR_NUMA_NODE) {
            Some(AttrValue::Int(n)) => u32::try_from(*n).ok(),
            _ => None,
        };
        let memory_mib = d
            .capacity
            .get(&format!("{}/{}", dra::DRIVER, dra::CAPACITY_MEMORY))
            .map_or(0, |m| u64::try_from(*m / 1000 / (1024 * 1024)).unwrap_or(0));
        let unhealthy = d
            .taints
            .iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute");
        out.push(Gpu {
            index,
            uuid: text(dra::ATTR_UUID).unwrap_or_else(|| d.id.to_string()),
            model: text(dra::ATTR_MODEL)
                .or_else(|| text(dra::ATTR_PRODUCT_NAME))
                .unwrap_or_default(),
            memory_mib,
            health: if unhealthy {
                GpuHealth::Unhealthy
            } else {
                GpuHealth::Healthy
            },
            topo: GpuTopo {
                nvlink: nvl,
                pcie_switch: pci,
                numa,
            },
        });
    }
    out
}

/// Whether a class selects every device of gpusched's driver and nothing
/// narrower.
fn plain_class(c: &Class) -> bool {
    let driver = format!("device.driver == \"{}\"", dra::DRIVER);
    c.name == dra::DEVICE_CLASS && c.selectors.iter().all(|s| s.trim() == driver)
}

/// The GPUs a plain GPU claim asks (`None`: not a plain GPU claim).
pub fn plain_count(c: &Claim, classes: &BTreeMap<String, Class>) -> Option<u32> {
    if !c.constraints.is_empty() {
        return None;
    }
    let mut n = 0u32;
    for r in c.requests.as_ref().ok()? {
        let [a] = r.alternatives.as_slice() else {
            return None;
        };
        let Count::Exact(k) = a.count else {
            return None;
        };
        if a.admin || !a.selectors.is_empty() || !a.tolerations.is_empty() {
            return None;
        }
        if !plain_class(classes.get(&a.class)?) {
            return None;
        }
        n = n.checked_add(k)?;
    }
    (n > 0).then_some(n)
}

/// The device of each whole GPU of a node, by index.
pub fn device_ids(devices: &[&Device]) -> BTreeMap<u32, DeviceId> {
    devices
        .iter()
        .filter(|d| d.id.driver == dra::DRIVER)
        .filter_map(|d| Some((dra::gpu_device_index(&d.id.device)?, d.id.clone())))
        .collect()
}

/// The allocations of plain GPU claims from the GPU indices the core chose
/// on `node` (`ids`: its devices by index): the first claim's requests take
/// the first indices, and so on. `None` when the counts do not add up or an
/// index has no device.
pub fn allocations(
    node: &str,
    claims: &[(&Claim, u32)],
    indices: &[u32],
    ids: &BTreeMap<u32, DeviceId>,
) -> Option<Vec<Allocation>> {
    let total: u32 = claims.iter().map(|(_, n)| n).sum();
    if total as usize != indices.len() {
        return None;
    }
    let mut it = indices.iter();
    let mut out = Vec::new();
    for (c, _) in claims {
        let mut devices = Vec::new();
        for r in c.requests.as_ref().ok()? {
            let Count::Exact(k) = r.alternatives.first()?.count else {
                return None;
            };
            for _ in 0..k {
                let i = it.next()?;
                devices.push(AllocatedDevice {
                    request: r.name.clone(),
                    id: ids.get(i)?.clone(),
                    admin: false,
                });
            }
        }
        out.push(Allocation {
            node: Some(node.to_string()),
            devices,
        });
    }
    Some(out)
}

//! One world: the ResourceSlice devices of a GPU driver are the core's
//! GPUs of their node.
//!
//! A device is a GPU when its driver is one of the GPU drivers (gpusched's
//! [`gpusched_model::dra::DRIVER`] unless the scheduler is told others,
//! e.g. NVIDIA's `gpu.nvidia.com`) and it is a whole GPU: it has no
//! `<driver>/type` attribute, or that attribute is `"gpu"` (NVIDIA's driver
//! publishes MIG devices with `type: mig`, which are not whole GPUs). Only
//! devices of one node (a slice with `nodeName`) are GPUs of that node, and
//! not partitionable devices (consuming shared counters). A device that
//! allows several allocations (consumable capacity) is a GPU when it is a
//! *shared GPU*: its capacity `milli` (in its driver's domain, or
//! `gpu.gpusched.io/milli`) is 1000 milli-GPUs, as gpusched's agent
//! publishes a GPU with `--shares`; an allocation on it takes the milli it
//! consumes ([`result_milli`]: a share of that GPU in the core, 1000 a
//! whole GPU). Other devices allowing several allocations are left to the
//! allocator alone.
//!
//! A node's GPUs are its GPU devices ordered by their `<driver>/index`
//! attribute (devices without one after those with one), then by id; the
//! core's GPU position `i` is the `i`-th device of that order. Attributes
//! give the model (`model`, else `productName`), the UUID (`uuid`), the
//! NUMA node (`numaNode`), the NVLink domain (`nvlinkDomain`) and the PCIe
//! root (`resource.kubernetes.io/pcieRoot`); the `memory` capacity gives
//! the memory. A device with an untolerated-by-default taint (`NoSchedule`
//! or `NoExecute`) is an unhealthy GPU: the core never chooses it (a claim
//! that tolerates the taint may still get it from the allocator).

use super::{AttrValue, CounterSetId, Counters, Device, DeviceId};
use gpusched_model::topology::GpuTopo;
use gpusched_model::{Gpu, GpuHealth, MigSlot};
use std::collections::{BTreeMap, BTreeSet};

/// The GPU drivers: which drivers' devices are GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuDrivers(BTreeSet<String>);

impl Default for GpuDrivers {
    fn default() -> Self {
        GpuDrivers(BTreeSet::from([gpusched_model::dra::DRIVER.to_string()]))
    }
}

impl GpuDrivers {
    /// These drivers (empty: the default, gpusched's own).
    pub fn new(drivers: &[String]) -> Self {
        if drivers.is_empty() {
            return GpuDrivers::default();
        }
        GpuDrivers(drivers.iter().cloned().collect())
    }

    /// These drivers and `more`.
    pub fn with<'a>(&self, more: impl IntoIterator<Item = &'a str>) -> Self {
        let mut s = self.0.clone();
        s.extend(more.into_iter().map(str::to_string));
        GpuDrivers(s)
    }

    /// The drivers, by name.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// Whether `d` is a whole GPU of a GPU driver on one node (not a
    /// partitionable device consuming shared counters, nor one that allows
    /// several allocations unless it is a shared GPU ([`is_shared_gpu`]):
    /// those are left to the allocator).
    pub fn is_gpu(&self, d: &Device) -> bool {
        d.node.is_some()
            && d.consumes.is_empty()
            && (!d.multiple || is_shared_gpu(d))
            && self.0.contains(&d.id.driver)
            && match d.attributes.get(&format!("{}/type", d.id.driver)) {
                None => true,
                Some(AttrValue::Str(t)) => t == "gpu",
                Some(_) => false,
            }
    }
}

impl GpuDrivers {
    /// Whether `d` is a MIG instance of a GPU driver on one node: its
    /// `<driver>/type` is `"mig"` and it consumes one shared counter set
    /// (its GPU's). Its GPU is a core GPU in MIG mode ([`CoreGpu::Mig`]).
    pub fn is_mig(&self, d: &Device) -> bool {
        d.node.is_some()
            && d.consumes.len() == 1
            && self.0.contains(&d.id.driver)
            && matches!(
                d.attributes.get(&format!("{}/type", d.id.driver)),
                Some(AttrValue::Str(t)) if t == "mig"
            )
    }
}

/// The drivers whose devices are GPUs because a DeviceClass maps a GPU
/// resource name to them: each class whose `spec.extendedResourceName` is
/// [`gpusched_model::labels::RESOURCE_GPU`] names, in its selectors, the
/// driver(s) it selects (`device.driver == "gpu.nvidia.com"`). Such a
/// class says that a pod asking `nvidia.com/gpu` may be served by those
/// devices (KEP-5004): they are that node's GPUs, with or without
/// `--dra-gpu-driver`. A class whose selectors name no driver that way
/// makes none (its devices are left to the allocator).
pub fn class_gpu_drivers<'a>(
    classes: impl IntoIterator<Item = &'a super::Class>,
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for c in classes {
        if c.extended_resource.as_deref() != Some(gpusched_model::labels::RESOURCE_GPU) {
            continue;
        }
        for s in &c.selectors {
            out.extend(selected_drivers(s));
        }
    }
    out
}

/// The drivers a CEL selector compares `device.driver` equal to
/// (`device.driver == 'x'`, `"x" == device.driver`; spaces free).
fn selected_drivers(expr: &str) -> Vec<String> {
    const FIELD: &str = "device.driver";
    let literal = |s: &str| -> Option<String> {
        let q = s.chars().next().filter(|c| *c == '"' || *c == '\'')?;
        let rest = &s[1..];
        let end = rest.find(q)?;
        Some(rest[..end].to_string()).filter(|d| !d.is_empty())
    };
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = expr[from..].find(FIELD).map(|i| i + from) {
        from = i + FIELD.len();
        // device.driver == 'x'
        let after = expr[from..].trim_start();
        if let Some(rest) = after.strip_prefix("==")
            && let Some(d) = literal(rest.trim_start())
        {
            out.push(d);
            continue;
        }
        // 'x' == device.driver
        let before = expr[..i].trim_end();
        if let Some(lhs) = before.strip_suffix("==") {
            let lhs = lhs.trim_end();
            if let Some(q) = lhs.chars().last().filter(|c| *c == '"' || *c == '\'')
                && let Some(start) = lhs[..lhs.len() - 1].rfind(q)
            {
                let d = &lhs[start + 1..lhs.len() - 1];
                if !d.is_empty() {
                    out.push(d.to_string());
                }
            }
        }
    }
    out
}

/// What the core counts of a MIG instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MigInfo {
    /// Its profile (`<driver>/profile`, e.g. `3g.40gb`).
    pub profile: String,
    /// Its measure of its GPU, [`gpusched_model::sharing::mig_milli`]`(g, G)`.
    pub milli: u32,
}

/// A MIG instance's profile and measure: `g` is the `compute-slices` it
/// consumes of its counter set (else the profile's leading `<g>g`), `G`
/// the set's `compute-slices`. `None` when either is unknown (the set is
/// not published, no profile): such an instance is left to the allocator.
pub fn mig_info(d: &Device, sets: &BTreeMap<CounterSetId, Counters>) -> Option<MigInfo> {
    use gpusched_model::dra::{ATTR_MIG_PROFILE, COUNTER_COMPUTE_SLICES};
    let u = d.consumes.first()?;
    let set = sets.get(&counter_set(d, &u.set))?;
    let units = |v: i128| u32::try_from(v / 1000).ok().filter(|v| *v > 0);
    let of = units(*set.get(COUNTER_COMPUTE_SLICES)?)?;
    let profile = text(d, ATTR_MIG_PROFILE)?;
    let g = match u.counters.get(COUNTER_COMPUTE_SLICES) {
        Some(v) => units(*v)?,
        None => profile.split_once('g')?.0.parse().ok()?,
    };
    (g <= of).then(|| MigInfo {
        milli: gpusched_model::sharing::mig_milli(g, of),
        profile,
    })
}

/// The counter set `set` of `d`'s pool.
pub fn counter_set(d: &Device, set: &str) -> CounterSetId {
    CounterSetId {
        driver: d.id.driver.clone(),
        pool: d.id.pool.clone(),
        name: set.to_string(),
    }
}

/// One of a node's core GPUs as its devices publish it.
#[derive(Clone, Debug)]
pub enum CoreGpu<'a> {
    /// A whole GPU, or a shared GPU: one device.
    Device(&'a Device),
    /// A GPU in MIG mode: the instances consuming its counter set, in
    /// device id order, each with what the core counts of it.
    Mig {
        /// Its counter set.
        set: CounterSetId,
        /// The GPU's memory (the set's `memory` counter), milli-units.
        memory: i128,
        /// Its instances.
        instances: Vec<(&'a Device, MigInfo)>,
    },
}

impl<'a> CoreGpu<'a> {
    /// The device whose attributes describe the GPU (a MIG GPU's first
    /// instance).
    fn device(&self) -> Option<&'a Device> {
        match self {
            CoreGpu::Device(d) => Some(d),
            CoreGpu::Mig { instances, .. } => instances.first().map(|(d, _)| *d),
        }
    }

    /// Its `index` (a MIG GPU's instances' `parentIndex`).
    fn index(&self) -> Option<i64> {
        match self {
            CoreGpu::Device(d) => int(d, gpusched_model::dra::ATTR_INDEX),
            CoreGpu::Mig { .. } => int(self.device()?, gpusched_model::dra::ATTR_PARENT_INDEX),
        }
    }

    /// What orders it among the node's GPUs after the index.
    fn key(&self) -> (&str, &str, &str) {
        match self {
            CoreGpu::Device(d) => (&d.id.driver, &d.id.pool, &d.id.device),
            CoreGpu::Mig { set, .. } => (&set.driver, &set.pool, &set.name),
        }
    }

    /// Whether device `id` is (part of) this GPU.
    pub fn holds(&self, id: &DeviceId) -> bool {
        match self {
            CoreGpu::Device(d) => d.id == *id,
            CoreGpu::Mig { instances, .. } => instances.iter().any(|(d, _)| d.id == *id),
        }
    }
}

/// A node's core GPUs from its GPU devices (whole and shared GPUs, in the
/// core's order: [`order`]) and its MIG instances ([`GpuDrivers::is_mig`]
/// with a known measure): the devices first, then the GPUs in MIG mode by
/// `parentIndex` (those without one last), then by counter set. (The
/// devices keep positions `0..k`, which a claim's per-GPU answer,
/// `ClaimGpus`, is indexed by; a GPU in MIG mode is never taken whole.)
pub fn core_gpus<'a>(
    devices: &[&'a Device],
    instances: &[&'a Device],
    sets: &BTreeMap<CounterSetId, Counters>,
) -> Vec<CoreGpu<'a>> {
    let mut out: Vec<CoreGpu<'a>> = Vec::new();
    let mut mig: BTreeMap<CounterSetId, Vec<(&'a Device, MigInfo)>> = BTreeMap::new();
    for d in instances {
        if let (Some(u), Some(info)) = (d.consumes.first(), mig_info(d, sets)) {
            mig.entry(counter_set(d, &u.set))
                .or_default()
                .push((d, info));
        }
    }
    for (set, mut instances) in mig {
        instances.sort_by(|a, b| a.0.id.cmp(&b.0.id));
        instances.dedup_by(|a, b| a.0.id == b.0.id);
        let memory = sets
            .get(&set)
            .and_then(|c| c.get(gpusched_model::dra::COUNTER_MEMORY))
            .copied()
            .unwrap_or(0);
        out.push(CoreGpu::Mig {
            set,
            memory,
            instances,
        });
    }
    out.sort_by(|a, b| {
        let ka = a.index().map_or((1, 0), |i| (0, i));
        let kb = b.index().map_or((1, 0), |i| (0, i));
        ka.cmp(&kb).then_with(|| a.key().cmp(&b.key()))
    });
    devices
        .iter()
        .map(|d| CoreGpu::Device(d))
        .chain(out)
        .collect()
}

/// A shared GPU's `milli` capacity, in milli-units: 1000 milli-GPUs.
const SHARED_GPU_CAPACITY: i128 = 1000 * 1000;

/// The `milli` capacity of a device (in its driver's domain, else
/// gpusched's), milli-units.
fn milli_capacity(d: &Device) -> Option<i128> {
    use gpusched_model::dra::{CAPACITY_MILLI, DRIVER};
    d.capacity
        .get(&super::translate::qualify(&d.id.driver, CAPACITY_MILLI))
        .or_else(|| d.capacity.get(&format!("{DRIVER}/{CAPACITY_MILLI}")))
        .copied()
}

/// Whether `d` is a shared GPU: it allows several allocations and has the
/// capacity `milli` of exactly 1000 milli-GPUs (what gpusched's agent
/// publishes with `--shares`). Whether its driver is a GPU driver is
/// [`GpuDrivers::is_gpu`]'s question.
pub fn is_shared_gpu(d: &Device) -> bool {
    d.multiple && milli_capacity(d) == Some(SHARED_GPU_CAPACITY)
}

/// The milli-GPUs an allocation result takes of its device: on a shared
/// GPU the `milli` capacity it consumes (rounded up, at most 1000), on a
/// whole GPU (or a result without amounts, which holds the whole device)
/// 1000.
pub fn result_milli(r: &super::AllocatedDevice) -> u32 {
    use gpusched_model::dra::{CAPACITY_MILLI, DRIVER};
    let v = r
        .consumed
        .get(CAPACITY_MILLI)
        .or_else(|| {
            r.consumed
                .get(&super::translate::qualify(&r.id.driver, CAPACITY_MILLI))
        })
        .or_else(|| r.consumed.get(&format!("{DRIVER}/{CAPACITY_MILLI}")));
    match v {
        Some(&v) => ((v.max(0) + 999) / 1000).min(1000) as u32,
        None => 1000,
    }
}

fn attr<'a>(d: &'a Device, name: &str) -> Option<&'a AttrValue> {
    d.attributes
        .get(&super::translate::qualify(&d.id.driver, name))
}

fn int(d: &Device, name: &str) -> Option<i64> {
    match attr(d, name)? {
        AttrValue::Int(i) => Some(*i),
        _ => None,
    }
}

fn text(d: &Device, name: &str) -> Option<String> {
    match attr(d, name)? {
        AttrValue::Str(s) | AttrValue::Version(s) => Some(s.clone()),
        AttrValue::Int(i) => Some(i.to_string()),
        AttrValue::Bool(_) => None,
    }
}

/// Sorts a node's GPU devices into the core's order (see the module doc).
pub fn order(devices: &mut [&Device]) {
    devices.sort_by(|a, b| {
        let ka = int(a, gpusched_model::dra::ATTR_INDEX).map_or((1, 0), |i| (0, i));
        let kb = int(b, gpusched_model::dra::ATTR_INDEX).map_or((1, 0), |i| (0, i));
        ka.cmp(&kb).then_with(|| a.id.cmp(&b.id))
    });
}

/// The core's GPUs of one node from its GPU devices in the core's order.
pub fn model_gpus(devices: &[&Device]) -> Vec<Gpu> {
    let gpus: Vec<CoreGpu<'_>> = devices.iter().map(|d| CoreGpu::Device(d)).collect();
    model_core_gpus(&gpus)
}

/// The core's GPUs of one node from [`core_gpus`]. A MIG GPU takes its
/// facts from its first instance (`parentIndex`, `parentUUID`, model,
/// NUMA node, PCIe root), its memory from its counter set, and is
/// unhealthy when an instance has a `NoSchedule`/`NoExecute` taint (the
/// agent taints every instance of a faulty GPU); its instances are its
/// MIG slots (resource `<driver>/mig-<profile>`).
pub fn model_core_gpus(gpus: &[CoreGpu<'_>]) -> Vec<Gpu> {
    use gpusched_model::dra::{
        ATTR_INDEX, ATTR_MODEL, ATTR_NUMA_NODE, ATTR_NVLINK_DOMAIN, ATTR_PARENT_INDEX,
        ATTR_PARENT_UUID, ATTR_PCIE_ROOT, ATTR_PRODUCT_NAME, ATTR_UUID, CAPACITY_MEMORY,
    };
    // NVLink domains and PCIe roots as small numbers, in name order
    let ordinals = |name: &str| -> BTreeMap<String, u32> {
        let names: BTreeSet<String> = gpus
            .iter()
            .filter_map(|g| text(g.device()?, name))
            .collect();
        names
            .into_iter()
            .enumerate()
            .map(|(i, n)| (n, i as u32))
            .collect()
    };
    let nvlink = ordinals(ATTR_NVLINK_DOMAIN);
    let pcie = ordinals(ATTR_PCIE_ROOT);
    let tainted = |d: &Device| {
        d.taints
            .iter()
            .any(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
    };
    gpus.iter()
        .enumerate()
        .filter_map(|(pos, g)| {
            let d = g.device()?;
            let (index_attr, uuid_attr) = match g {
                CoreGpu::Device(_) => (ATTR_INDEX, ATTR_UUID),
                CoreGpu::Mig { .. } => (ATTR_PARENT_INDEX, ATTR_PARENT_UUID),
            };
            let (memory_milli, unhealthy, mig) = match g {
                CoreGpu::Device(d) => (
                    d.capacity
                        .get(&super::translate::qualify(&d.id.driver, CAPACITY_MEMORY))
                        .copied()
                        .unwrap_or(0),
                    tainted(d),
                    Vec::new(),
                ),
                CoreGpu::Mig {
                    memory, instances, ..
                } => (
                    *memory,
                    instances.iter().any(|(d, _)| tainted(d)),
                    instances
                        .iter()
                        .map(|(d, info)| MigSlot {
                            id: d.id.device.clone(),
                            profile: info.profile.clone(),
                            resource: mig_resource(&d.id.driver, &info.profile),
                            milli: info.milli,
                        })
                        .collect(),
                ),
            };
            Some(Gpu {
                index: int(d, index_attr)
                    .and_then(|i| u32::try_from(i).ok())
                    .unwrap_or(pos as u32),
                uuid: text(d, uuid_attr).unwrap_or_default(),
                model: text(d, ATTR_MODEL)
                    .or_else(|| text(d, ATTR_PRODUCT_NAME))
                    .unwrap_or_default(),
                memory_mib: (memory_milli.max(0) / 1000 / (1 << 20)) as u64,
                health: if unhealthy {
                    GpuHealth::Unhealthy
                } else {
                    GpuHealth::Healthy
                },
                topo: GpuTopo {
                    nvlink: text(d, ATTR_NVLINK_DOMAIN).and_then(|n| nvlink.get(&n).copied()),
                    pcie_switch: text(d, ATTR_PCIE_ROOT).and_then(|n| pcie.get(&n).copied()),
                    numa: int(d, ATTR_NUMA_NODE).and_then(|i| u32::try_from(i).ok()),
                },
                mig,
            })
        })
        .collect()
}

/// The name the core knows a DRA MIG instance's kind by (its MIG slot's
/// and a claim's [`gpusched_model::MigAsk`] resource): `<driver>/mig-<profile>`.
pub fn mig_resource(driver: &str, profile: &str) -> String {
    format!("{driver}/mig-{profile}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::{DeviceId, DeviceTaint};
    use gpusched_model::dra::DRIVER;

    fn dev(driver: &str, name: &str, attrs: &[(&str, AttrValue)], mem_gi: i128) -> Device {
        let attributes: BTreeMap<String, AttrValue> = attrs
            .iter()
            .map(|(k, v)| (crate::dra::translate::qualify(driver, k), v.clone()))
            .collect();
        let capacity = BTreeMap::from([(format!("{driver}/memory"), mem_gi * 1000 * (1 << 30))]);
        Device {
            id: DeviceId {
                driver: driver.into(),
                pool: "n1".into(),
                device: name.into(),
            },
            node: Some("n1".into()),
            selector: None,
            cel: crate::dra::cel::device_value(driver, &attributes, &capacity),
            attributes,
            capacity,
            taints: vec![],
            serial: 1,
            consumes: vec![],
            multiple: false,
            capacity_info: BTreeMap::new(),
            binding: Default::default(),
        }
    }

    #[test]
    fn gpu_devices_become_the_core_gpus_in_index_order_with_their_facts() {
        let s = |v: &str| AttrValue::Str(v.into());
        let mut d10 = dev(
            DRIVER,
            "gpu-10",
            &[
                ("index", AttrValue::Int(10)),
                ("model", s("H100")),
                ("uuid", s("GPU-10")),
                ("nvlinkDomain", s("z")),
                ("numaNode", AttrValue::Int(1)),
                ("resource.kubernetes.io/pcieRoot", s("pci0000:80")),
            ],
            80,
        );
        d10.taints.push(DeviceTaint {
            key: "gpu.gpusched.io/unhealthy".into(),
            value: "xid 79".into(),
            effect: "NoExecute".into(),
        });
        let d2 = dev(
            DRIVER,
            "gpu-2",
            &[
                ("index", AttrValue::Int(2)),
                ("productName", s("NVIDIA H100 80GB HBM3")),
                ("nvlinkDomain", s("a")),
            ],
            40,
        );
        let mut v = vec![&d10, &d2];
        order(&mut v);
        let g = model_gpus(&v);
        assert_eq!(g.iter().map(|g| g.index).collect::<Vec<_>>(), vec![2, 10]);
        assert_eq!(g[0].model, "NVIDIA H100 80GB HBM3");
        assert_eq!(g[0].memory_mib, 40 * 1024);
        assert_eq!(g[0].health, GpuHealth::Healthy);
        assert_eq!(g[1].model, "H100");
        assert_eq!(g[1].uuid, "GPU-10");
        assert_eq!(g[1].health, GpuHealth::Unhealthy);
        // domains numbered in name order: "a" 0, "z" 1
        assert_eq!(g[0].topo.nvlink, Some(0));
        assert_eq!(
            g[1].topo,
            GpuTopo {
                nvlink: Some(1),
                pcie_switch: Some(0),
                numa: Some(1)
            }
        );
    }

    #[test]
    fn only_whole_gpus_of_gpu_drivers_on_one_node_are_gpus() {
        let ours = dev(DRIVER, "gpu-0", &[], 80);
        let nv = dev(
            "gpu.nvidia.com",
            "gpu-0",
            &[("type", AttrValue::Str("gpu".into()))],
            80,
        );
        let mig = dev(
            "gpu.nvidia.com",
            "mig-0",
            &[("type", AttrValue::Str("mig".into()))],
            10,
        );
        let nic = dev("nic.example.com", "eth0", &[], 0);
        let mut everywhere = dev(DRIVER, "gpu-1", &[], 80);
        everywhere.node = None;
        let mut shared = dev(DRIVER, "gpu-2", &[], 80);
        shared.multiple = true;
        let mut partition = dev(DRIVER, "gpu-3", &[], 80);
        partition.consumes.push(crate::dra::CounterUse {
            set: "gpu-3".into(),
            counters: BTreeMap::new(),
            groups: vec![],
        });
        // a GPU published for sharing: 1000 milli-GPUs of capacity
        let mut for_shares = dev(DRIVER, "gpu-4", &[], 80);
        for_shares.multiple = true;
        for_shares
            .capacity
            .insert(format!("{DRIVER}/milli"), 1000 * 1000);
        let mut other_milli = for_shares.clone();
        other_milli
            .capacity
            .insert(format!("{DRIVER}/milli"), 500 * 1000);
        let def = GpuDrivers::default();
        assert!(def.is_gpu(&for_shares) && is_shared_gpu(&for_shares));
        assert!(!def.is_gpu(&other_milli) && !is_shared_gpu(&ours));
        assert!(def.is_gpu(&ours));
        assert!(!def.is_gpu(&nv) && !def.is_gpu(&nic) && !def.is_gpu(&everywhere));
        assert!(!def.is_gpu(&shared) && !def.is_gpu(&partition));
        let both = GpuDrivers::new(&[DRIVER.into(), "gpu.nvidia.com".into()]);
        assert!(both.is_gpu(&ours) && both.is_gpu(&nv));
        assert!(!both.is_gpu(&mig) && !both.is_gpu(&nic));
    }

    /// #39 item 8: a DeviceClass mapping `nvidia.com/gpu` to NVIDIA's
    /// driver makes that driver's devices GPUs without `--dra-gpu-driver`;
    /// a class mapping another resource, or none, makes nothing a GPU.
    #[test]
    fn a_class_mapping_nvidia_gpu_makes_its_drivers_devices_gpus() {
        let class = |name: &str, ext: Option<&str>, selectors: &[&str]| crate::dra::Class {
            name: name.into(),
            selectors: selectors.iter().map(|s| s.to_string()).collect(),
            extended_resource: ext.map(str::to_string),
            created_ns: 0,
        };
        let classes = [
            class(
                "gpu.nvidia.com",
                Some("nvidia.com/gpu"),
                &[
                    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
                ],
            ),
            class(
                "reversed",
                Some("nvidia.com/gpu"),
                &["\"gpu.other.example\"==device.driver"],
            ),
            class(
                "nic",
                Some("example.com/nic"),
                &["device.driver == 'nic.example.com'"],
            ),
            class("plain", None, &["device.driver == \"parts.example.com\""]),
            class(
                "no-driver",
                Some("nvidia.com/gpu"),
                &["device.attributes['x'].kind == 'gpu'"],
            ),
        ];
        assert_eq!(
            class_gpu_drivers(&classes).into_iter().collect::<Vec<_>>(),
            ["gpu.nvidia.com", "gpu.other.example"]
        );
        let nv = dev(
            "gpu.nvidia.com",
            "gpu-0",
            &[("type", AttrValue::Str("gpu".into()))],
            80,
        );
        let def = GpuDrivers::default();
        assert!(!def.is_gpu(&nv));
        let derived = class_gpu_drivers(&classes);
        assert!(def.with(derived.iter().map(String::as_str)).is_gpu(&nv));
    }

    #[test]
    fn a_result_takes_its_consumed_milli_or_the_whole_gpu() {
        let r = |consumed: &[(&str, i128)]| crate::dra::AllocatedDevice {
            request: "gpu".into(),
            id: DeviceId {
                driver: DRIVER.into(),
                pool: "n1".into(),
                device: "gpu-0".into(),
            },
            admin: false,
            consumed: consumed.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            share: None,
            binding: Default::default(),
        };
        assert_eq!(result_milli(&r(&[])), 1000);
        assert_eq!(result_milli(&r(&[("milli", 300_000), ("memory", 0)])), 300);
        assert_eq!(result_milli(&r(&[("gpu.gpusched.io/milli", 299_500)])), 300);
        assert_eq!(result_milli(&r(&[("milli", 5_000_000)])), 1000);
        assert_eq!(result_milli(&r(&[("milli", -1)])), 0);
    }
}

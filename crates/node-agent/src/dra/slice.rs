//! This node's ResourceSlice (`resource.k8s.io/v1`): one pool named after
//! the node, one device per whole GPU (`gpu-<index>`) with the attributes
//! and capacity of `gpusched_model::dra`. Pure: the inventory and each
//! GPU's health in, the slice's spec out.
//!
//! Unhealthy GPUs stay in the slice with a device taint
//! ([`TAINT_UNHEALTHY`]): `NoExecute` for XIDs that leave the GPU unusable
//! or its memory corrupt ([`NO_EXECUTE_XIDS`]), `NoSchedule` for every
//! other fault. Keeping them (rather than dropping them) lets the scheduler
//! tell "unhealthy" from "gone", lets a claim that tolerates the taint
//! (diagnostics) still get the GPU, and keeps device names stable.
//!
//! With shares on ([`SliceOptions::shares`]), each whole GPU allows
//! multiple allocations and has the capacity [`dra::CAPACITY_MILLI`]
//! (1000, any request from 1 to 1000, default 1000 = the whole GPU): a claim
//! asking `capacity.requests["gpu.gpusched.io/milli"]: 300` shares the GPU.
//!
//! A GPU in MIG mode is not a whole-GPU device: its existing MIG instances
//! are (`gpu-<index>-mig-<k>`, [`mig_devices`]), each consuming the GPU's
//! shared counter set ([`counter_set`]: compute slices, memory slices,
//! memory), which a second slice of the pool publishes (the API allows a
//! slice either devices or shared counters). The agent never creates or
//! destroys instances.

use crate::backend::{GpuInfo, Inventory, MigInfo};
use crate::labels::{gpu_compute_slices, gpu_family, mig_slices};
use gpusched_model::dra;
use k8s_openapi::api::resource::v1::{
    CapacityRequestPolicy, CapacityRequestPolicyRange, Counter, CounterSet, Device,
    DeviceAttribute, DeviceCapacity, DeviceCounterConsumption, DeviceTaint, ResourcePool,
    ResourceSliceSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::BTreeMap;

/// Device taint key of an unhealthy GPU; its value is the fault.
pub const TAINT_UNHEALTHY: &str = "gpu.gpusched.io/unhealthy";

/// XIDs whose GPU must not keep running pods: 48 (double-bit ECC error),
/// 74 (NVLink error), 79 (GPU fallen off the bus), 95 (uncontained ECC
/// error), 119 and 120 (GSP errors).
pub const NO_EXECUTE_XIDS: [u64; 6] = [48, 74, 79, 95, 119, 120];

/// Health of one GPU as the slice shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GpuCondition {
    /// No fault.
    Healthy,
    /// The health tracker's reason (`xid 79`, `device lost`, …).
    Unhealthy(String),
}

/// The taint effect of an unhealthy GPU's reason.
pub fn taint_effect(reason: &str) -> &'static str {
    let xid = reason
        .strip_prefix("xid ")
        .and_then(|x| x.trim().parse::<u64>().ok());
    match xid {
        Some(x) if NO_EXECUTE_XIDS.contains(&x) => "NoExecute",
        _ => "NoSchedule",
    }
}

/// A taint value: at most 63 characters of `[A-Za-z0-9_.-]`, starting and
/// ending alphanumeric (label value syntax).
fn taint_value(reason: &str) -> String {
    let mut v = String::new();
    for c in reason.chars() {
        if c.is_ascii_alphanumeric() || c == '.' || c == '_' {
            v.push(c);
        } else if !v.ends_with('-') {
            v.push('-');
        }
    }
    let mut v: String = v
        .trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .chars()
        .take(63)
        .collect();
    while v.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        v.pop();
    }
    v
}

fn string(s: impl Into<String>) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}

fn int(v: u32) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i64::from(v)),
        ..Default::default()
    }
}

/// `ada-lovelace` → `Ada Lovelace`.
fn architecture(g: &GpuInfo) -> Option<String> {
    let (major, minor) = g.compute_capability?;
    let family = gpu_family(major, minor);
    if family == "undefined" {
        return None;
    }
    Some(
        family
            .split('-')
            .map(|w| {
                let mut c = w.chars();
                match c.next() {
                    Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                    None => String::new(),
                }
            })
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// MiB as the API server writes the quantity back (its canonical form: the
/// largest binary suffix that divides exactly, `81920` → `80Gi`), so the
/// published slice compares equal to what the agent computes.
pub fn mib_quantity(mib: u64) -> String {
    for (shift, suffix) in [(40, "Ei"), (30, "Pi"), (20, "Ti"), (10, "Gi")] {
        if mib > 0 && mib.is_multiple_of(1u64 << shift) {
            return format!("{}{suffix}", mib >> shift);
        }
    }
    format!("{mib}Mi")
}

/// What the slice offers beside whole GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SliceOptions {
    /// Whole GPUs allow multiple allocations, each taking part of the
    /// capacity [`dra::CAPACITY_MILLI`] (the agent's `--shares`).
    pub shares: bool,
}

/// Milli-GPUs of a whole GPU (the [`dra::CAPACITY_MILLI`] capacity).
pub const GPU_MILLI: u32 = 1000;

/// Memory slices of a GPU in MIG mode: 4 on an A30, 8 on the A100, H100,
/// H200 and B200 families (NVIDIA's MIG user guide).
pub fn gpu_memory_slices(model: &str) -> u32 {
    if model.to_ascii_uppercase().contains("A30") {
        4
    } else {
        8
    }
}

/// Counter names of a GPU's shared counter set (the scheduler reads the
/// compute slices and the memory: the names are the model's).
pub const COUNTER_COMPUTE_SLICES: &str = gpusched_model::dra::COUNTER_COMPUTE_SLICES;
/// See [`COUNTER_COMPUTE_SLICES`].
pub const COUNTER_MEMORY_SLICES: &str = "memory-slices";
/// See [`COUNTER_COMPUTE_SLICES`].
pub const COUNTER_MEMORY: &str = gpusched_model::dra::COUNTER_MEMORY;

/// At most this many counter sets in one slice (the API's limit): MIG GPUs
/// beyond the 8th by index are left out of the slice.
pub const MAX_COUNTER_SETS: usize = 8;

fn counter(v: impl Into<String>) -> Counter {
    Counter {
        value: Quantity(v.into()),
    }
}

fn quantity(q: &str) -> Option<Quantity> {
    Some(Quantity(q.to_string()))
}

/// The device of one whole GPU.
pub fn gpu_device(g: &GpuInfo, cond: &GpuCondition, opts: SliceOptions) -> Device {
    let mut attrs = BTreeMap::new();
    attrs.insert(dra::ATTR_UUID.to_string(), string(&g.uuid));
    attrs.insert(dra::ATTR_INDEX.to_string(), int(g.index));
    attrs.insert(dra::ATTR_PRODUCT_NAME.to_string(), string(&g.product_name));
    attrs.insert(dra::ATTR_MODEL.to_string(), string(&g.model));
    if let Some(a) = architecture(g) {
        attrs.insert(dra::ATTR_ARCHITECTURE.to_string(), string(a));
    }
    if let Some(n) = g.topo.numa {
        attrs.insert(dra::ATTR_NUMA_NODE.to_string(), int(n));
    }
    if let Some(d) = g.topo.nvlink {
        attrs.insert(dra::ATTR_NVLINK_DOMAIN.to_string(), string(d.to_string()));
    }
    if let Some(s) = g.topo.pcie_switch {
        // The PCIe grouping the backend found, in the standard attribute's
        // `pci<domain>:<bus>` spelling.
        attrs.insert(
            dra::ATTR_PCIE_ROOT.to_string(),
            string(format!("pci0000:{s:02x}")),
        );
    }
    let mut capacity = BTreeMap::new();
    capacity.insert(
        dra::CAPACITY_MEMORY.to_string(),
        DeviceCapacity {
            value: Quantity(mib_quantity(g.memory_mib)),
            // Shared: memory is not split between the shares (a claim may
            // ask for some, which is then counted); without a request a
            // share takes none of it.
            request_policy: opts.shares.then(|| CapacityRequestPolicy {
                default: quantity("0"),
                valid_range: Some(CapacityRequestPolicyRange {
                    min: Quantity("0".into()),
                    max: None,
                    step: None,
                }),
                valid_values: None,
            }),
        },
    );
    if opts.shares {
        // 1000 as the API server writes it back (canonical form), so the
        // published slice compares equal.
        let full = "1k".to_string();
        capacity.insert(
            dra::CAPACITY_MILLI.to_string(),
            DeviceCapacity {
                value: Quantity(full.clone()),
                request_policy: Some(CapacityRequestPolicy {
                    default: quantity(&full),
                    valid_range: Some(CapacityRequestPolicyRange {
                        min: Quantity("1".into()),
                        max: quantity(&full),
                        step: quantity("1"),
                    }),
                    valid_values: None,
                }),
            },
        );
    }
    Device {
        name: dra::gpu_device_name(g.index),
        attributes: Some(attrs),
        capacity: Some(capacity),
        taints: taints(cond),
        allow_multiple_allocations: opts.shares.then_some(true),
        ..Default::default()
    }
}

fn taints(cond: &GpuCondition) -> Option<Vec<DeviceTaint>> {
    match cond {
        GpuCondition::Healthy => None,
        GpuCondition::Unhealthy(reason) => Some(vec![DeviceTaint {
            key: TAINT_UNHEALTHY.to_string(),
            value: Some(taint_value(reason)).filter(|v| !v.is_empty()),
            effect: taint_effect(reason).to_string(),
            time_added: None,
        }]),
    }
}

/// What MIG instance `m` of a GPU takes of the GPU's counter set:
/// (compute slices, memory slices), `None` for a profile we cannot read.
pub fn mig_consumption(g: &GpuInfo, m: &MigInfo) -> Option<(u32, u32)> {
    let (gi, _) = mig_slices(&m.profile)?;
    let total = gpu_memory_slices(&g.model);
    // Memory slices: the instance's share of the GPU's memory, rounded up
    // (a 1g.10gb instance reports a little under 10 GiB).
    let mem = if g.memory_mib == 0 {
        1
    } else {
        (m.memory_mib * u64::from(total)).div_ceil(g.memory_mib)
    };
    let mem = u32::try_from(mem).unwrap_or(u32::MAX).clamp(1, total);
    Some((gi, mem))
}

/// The shared counter set of a GPU in MIG mode.
pub fn counter_set(g: &GpuInfo) -> CounterSet {
    let mut counters = BTreeMap::new();
    counters.insert(
        COUNTER_COMPUTE_SLICES.to_string(),
        counter(gpu_compute_slices(&g.model).to_string()),
    );
    counters.insert(
        COUNTER_MEMORY_SLICES.to_string(),
        counter(gpu_memory_slices(&g.model).to_string()),
    );
    counters.insert(
        COUNTER_MEMORY.to_string(),
        counter(mib_quantity(g.memory_mib)),
    );
    CounterSet {
        name: dra::counter_set_name(g.index),
        counters,
    }
}

/// The devices of a GPU's existing MIG instances (instances of a profile
/// the agent cannot read are left out, with a warning).
pub fn mig_devices(g: &GpuInfo, cond: &GpuCondition) -> Vec<Device> {
    let mut out = Vec::new();
    for (k, m) in g.mig.iter().enumerate() {
        let Some((compute, memory)) = mig_consumption(g, m) else {
            tracing::warn!(gpu = g.index, profile = %m.profile, "MIG instance of an unknown profile left out of the slice");
            continue;
        };
        let mut attrs = BTreeMap::new();
        attrs.insert(dra::ATTR_TYPE.to_string(), string("mig"));
        attrs.insert(dra::ATTR_UUID.to_string(), string(&m.uuid));
        attrs.insert(dra::ATTR_MIG_PROFILE.to_string(), string(&m.profile));
        attrs.insert(dra::ATTR_PARENT_UUID.to_string(), string(&g.uuid));
        attrs.insert(dra::ATTR_PARENT_INDEX.to_string(), int(g.index));
        attrs.insert(dra::ATTR_PRODUCT_NAME.to_string(), string(&g.product_name));
        if let Some(a) = architecture(g) {
            attrs.insert(dra::ATTR_ARCHITECTURE.to_string(), string(a));
        }
        if let Some(n) = g.topo.numa {
            attrs.insert(dra::ATTR_NUMA_NODE.to_string(), int(n));
        }
        if let Some(sw) = g.topo.pcie_switch {
            attrs.insert(
                dra::ATTR_PCIE_ROOT.to_string(),
                string(format!("pci0000:{sw:02x}")),
            );
        }
        let mut capacity = BTreeMap::new();
        capacity.insert(
            dra::CAPACITY_MEMORY.to_string(),
            DeviceCapacity {
                value: Quantity(mib_quantity(m.memory_mib)),
                ..Default::default()
            },
        );
        let mut counters = BTreeMap::new();
        counters.insert(
            COUNTER_COMPUTE_SLICES.to_string(),
            counter(compute.to_string()),
        );
        counters.insert(
            COUNTER_MEMORY_SLICES.to_string(),
            counter(memory.to_string()),
        );
        counters.insert(
            COUNTER_MEMORY.to_string(),
            counter(mib_quantity(m.memory_mib)),
        );
        out.push(Device {
            name: dra::mig_device_name(g.index, k),
            attributes: Some(attrs),
            capacity: Some(capacity),
            consumes_counters: Some(vec![DeviceCounterConsumption {
                counter_set: dra::counter_set_name(g.index),
                counters,
                compatibility_groups: None,
            }]),
            taints: taints(cond),
            ..Default::default()
        });
    }
    out
}

/// The GPUs a slice publishes whole: GPUs not in MIG mode, by index.
pub fn published_gpus(inv: &Inventory) -> Vec<&GpuInfo> {
    let mut v: Vec<&GpuInfo> = inv.gpus.iter().filter(|g| !g.mig_enabled).collect();
    v.sort_by_key(|g| g.index);
    v
}

/// The GPUs in MIG mode whose instances a slice publishes, by index (at
/// most [`MAX_COUNTER_SETS`]; the others are logged and left out).
pub fn published_mig_gpus(inv: &Inventory) -> Vec<&GpuInfo> {
    let mut v: Vec<&GpuInfo> = inv.gpus.iter().filter(|g| g.mig_enabled).collect();
    v.sort_by_key(|g| g.index);
    if v.len() > MAX_COUNTER_SETS {
        for g in &v[MAX_COUNTER_SETS..] {
            tracing::warn!(
                gpu = g.index,
                "more than {MAX_COUNTER_SETS} GPUs in MIG mode: this one's instances are not published"
            );
        }
        v.truncate(MAX_COUNTER_SETS);
    }
    v
}

fn condition(inv: &Inventory, conditions: &[GpuCondition], g: &GpuInfo) -> GpuCondition {
    let i = inv
        .gpus
        .iter()
        .position(|x| std::ptr::eq(x, g))
        .unwrap_or(usize::MAX);
    conditions.get(i).cloned().unwrap_or(GpuCondition::Healthy)
}

/// The devices of this node's slice — whole GPUs, then MIG instances;
/// `conditions` is in inventory order (a MIG instance has its GPU's).
pub fn devices(inv: &Inventory, conditions: &[GpuCondition], opts: SliceOptions) -> Vec<Device> {
    let mut out: Vec<Device> = published_gpus(inv)
        .into_iter()
        .map(|g| gpu_device(g, &condition(inv, conditions, g), opts))
        .collect();
    for g in published_mig_gpus(inv) {
        out.extend(mig_devices(g, &condition(inv, conditions, g)));
    }
    out
}

/// The shared counter sets of the GPUs in MIG mode (empty without any).
pub fn counter_sets(inv: &Inventory) -> Vec<CounterSet> {
    published_mig_gpus(inv)
        .into_iter()
        .map(counter_set)
        .collect()
}

/// The specs of this node's pool at `generation`: the devices' slice
/// ([`slice_name`]), and when there are counter sets the counters' slice
/// ([`counters_slice_name`]), each with its object name.
pub fn pool_specs(
    node: &str,
    devices: Vec<Device>,
    counters: Vec<CounterSet>,
    generation: i64,
) -> Vec<(String, ResourceSliceSpec)> {
    let count = if counters.is_empty() { 1 } else { 2 };
    let pool = ResourcePool {
        name: node.to_string(),
        generation,
        resource_slice_count: count,
    };
    let mut out = vec![(
        slice_name(node),
        ResourceSliceSpec {
            driver: dra::DRIVER.to_string(),
            node_name: Some(node.to_string()),
            pool: pool.clone(),
            devices: Some(devices),
            ..Default::default()
        },
    )];
    if !counters.is_empty() {
        out.push((
            counters_slice_name(node),
            ResourceSliceSpec {
                driver: dra::DRIVER.to_string(),
                node_name: Some(node.to_string()),
                pool,
                shared_counters: Some(counters),
                ..Default::default()
            },
        ));
    }
    out
}

/// The devices' slice spec for `node` at pool `generation` (a pool of
/// this one slice).
pub fn slice_spec(node: &str, devices: Vec<Device>, generation: i64) -> ResourceSliceSpec {
    pool_specs(node, devices, Vec::new(), generation)
        .remove(0)
        .1
}

/// The devices' slice object name (one per node and driver).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{}", dra::DRIVER)
}

/// The object name of the slice with the shared counters of the node's
/// GPUs in MIG mode.
pub fn counters_slice_name(node: &str) -> String {
    format!("{node}-{}-counters", dra::DRIVER)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::DeviceBackend;
    use crate::backend::fake::FakeBackend;

    const NODE: &str = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus:\n      count: 2\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      pcie_switches: 2\n";

    fn inv() -> Inventory {
        FakeBackend::from_yaml(NODE, "n.yaml")
            .unwrap()
            .discover()
            .unwrap()
    }

    #[test]
    fn devices_carry_the_contract_attributes() {
        let inv = inv();
        let d = devices(
            &inv,
            &[GpuCondition::Healthy, GpuCondition::Healthy],
            SliceOptions::default(),
        );
        assert_eq!(d.len(), 2);
        assert_eq!(d[1].name, "gpu-1");
        let a = d[1].attributes.as_ref().unwrap();
        assert_eq!(a["uuid"].string.as_deref(), Some(inv.gpus[1].uuid.as_str()));
        assert_eq!(a["index"].int, Some(1));
        assert_eq!(a["model"].string.as_deref(), Some("H100-SXM5-80GB"));
        assert_eq!(a["architecture"].string.as_deref(), Some("Hopper"));
        assert!(a.contains_key("nvlinkDomain"));
        assert!(a.contains_key(dra::ATTR_PCIE_ROOT));
        assert_eq!(d[1].capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
        assert!(d[0].taints.is_none());
        assert_eq!(mib_quantity(81920), "80Gi");
        assert_eq!(mib_quantity(1536), "1536Mi");
        assert_eq!(mib_quantity(2 << 20), "2Ti");
        assert_eq!(mib_quantity(0), "0Mi");
    }

    #[test]
    fn unhealthy_gpus_are_tainted_by_severity() {
        let inv = inv();
        let d = devices(
            &inv,
            &[
                GpuCondition::Unhealthy("xid 79".into()),
                GpuCondition::Unhealthy("xid 13".into()),
            ],
            SliceOptions::default(),
        );
        let t0 = &d[0].taints.as_ref().unwrap()[0];
        assert_eq!(t0.key, TAINT_UNHEALTHY);
        assert_eq!(t0.effect, "NoExecute");
        assert_eq!(t0.value.as_deref(), Some("xid-79"));
        assert_eq!(d[1].taints.as_ref().unwrap()[0].effect, "NoSchedule");
        assert_eq!(taint_effect("device lost: query failed"), "NoSchedule");
        assert_eq!(taint_value("  (bad) value!! "), "bad-value");
        assert_eq!(taint_value(&"x".repeat(80)).len(), 63);
    }

    #[test]
    fn shares_make_each_gpu_a_consumable_capacity_of_1000_milli() {
        let inv = inv();
        let opts = SliceOptions { shares: true };
        let d = devices(&inv, &[GpuCondition::Healthy, GpuCondition::Healthy], opts);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].allow_multiple_allocations, Some(true));
        let cap = d[0].capacity.as_ref().unwrap();
        let milli = &cap[dra::CAPACITY_MILLI];
        assert_eq!(milli.value.0, "1k");
        let p = milli.request_policy.as_ref().unwrap();
        assert_eq!(p.default.as_ref().unwrap().0, "1k");
        let r = p.valid_range.as_ref().unwrap();
        assert_eq!(r.min.0, "1");
        assert_eq!(r.max.as_ref().unwrap().0, "1k");
        assert_eq!(
            gpusched_model::quantity::parse_integer(&milli.value.0).unwrap(),
            u64::from(GPU_MILLI)
        );
        assert_eq!(r.step.as_ref().unwrap().0, "1");
        // memory is not split: a share takes none unless it asks
        let mem = cap[dra::CAPACITY_MEMORY].request_policy.as_ref().unwrap();
        assert_eq!(mem.default.as_ref().unwrap().0, "0");
        // without shares: no capacity policy, one allocation at a time
        let plain = devices(&inv, &[], SliceOptions::default());
        assert_eq!(plain[0].allow_multiple_allocations, None);
        assert!(!plain[0].capacity.as_ref().unwrap().contains_key("milli"));
    }

    const MIG: &str = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus:\n      count: 3\n      model: A100-SXM4-80GB\n      memory: 80Gi\n      devices:\n        - index: 0\n          mig:\n            - {profile: 3g.40gb}\n            - {profile: 1g.10gb}\n        - index: 2\n          mig:\n            - {profile: 7g.80gb}\n";

    #[test]
    fn mig_instances_are_devices_consuming_their_gpus_counter_set() {
        let inv = FakeBackend::from_yaml(MIG, "mig.yaml")
            .unwrap()
            .discover()
            .unwrap();
        let conds = [
            GpuCondition::Unhealthy("xid 31".into()),
            GpuCondition::Healthy,
            GpuCondition::Healthy,
        ];
        let d = devices(&inv, &conds, SliceOptions { shares: true });
        let names: Vec<&str> = d.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(
            names,
            ["gpu-1", "gpu-0-mig-0", "gpu-0-mig-1", "gpu-2-mig-0"],
            "whole GPU 1, then the instances of GPUs 0 and 2"
        );
        let g0 = inv.gpus.iter().find(|g| g.index == 0).unwrap();
        let m = &d[1];
        let a = m.attributes.as_ref().unwrap();
        assert_eq!(a["type"].string.as_deref(), Some("mig"));
        assert_eq!(a["profile"].string.as_deref(), Some("3g.40gb"));
        assert_eq!(a["uuid"].string.as_deref(), Some(g0.mig[0].uuid.as_str()));
        assert_eq!(a["parentUUID"].string.as_deref(), Some(g0.uuid.as_str()));
        assert_eq!(a["parentIndex"].int, Some(0));
        assert!(!a.contains_key("index"), "not a whole GPU");
        assert_eq!(
            m.capacity.as_ref().unwrap()["memory"].value.0,
            mib_quantity(g0.mig[0].memory_mib)
        );
        assert_eq!(
            m.allow_multiple_allocations, None,
            "an instance is not shared"
        );
        let c = &m.consumes_counters.as_ref().unwrap()[0];
        assert_eq!(c.counter_set, "gpu-0-counters");
        assert_eq!(c.counters["compute-slices"].value.0, "3");
        assert_eq!(c.counters["memory-slices"].value.0, "4");
        let small = &d[2].consumes_counters.as_ref().unwrap()[0];
        assert_eq!(small.counters["compute-slices"].value.0, "1");
        assert_eq!(small.counters["memory-slices"].value.0, "1");
        let full = &d[3].consumes_counters.as_ref().unwrap()[0];
        assert_eq!(full.counters["memory-slices"].value.0, "8");
        // the GPU's health is its instances'
        assert_eq!(m.taints.as_ref().unwrap()[0].effect, "NoSchedule");
        assert!(d[3].taints.is_none());
        // one counter set per MIG GPU, covering what its instances take
        let sets = counter_sets(&inv);
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0].name, "gpu-0-counters");
        assert_eq!(sets[0].counters["compute-slices"].value.0, "7");
        assert_eq!(sets[0].counters["memory-slices"].value.0, "8");
        assert_eq!(sets[0].counters["memory"].value.0, "80Gi");
        // the pool: devices in one slice, counters in another
        let specs = pool_specs("n", d, sets, 4);
        assert_eq!(specs.len(), 2);
        assert_eq!(specs[0].0, "n-gpu.gpusched.io");
        assert_eq!(specs[1].0, "n-gpu.gpusched.io-counters");
        assert!(specs[1].1.devices.is_none());
        assert_eq!(specs[1].1.shared_counters.as_ref().unwrap().len(), 2);
        for (_, s) in &specs {
            assert_eq!((s.pool.generation, s.pool.resource_slice_count), (4, 2));
        }
    }

    #[test]
    fn spec_names_one_pool_per_node() {
        let s = slice_spec("node-a", vec![], 3);
        assert_eq!(s.driver, "gpu.gpusched.io");
        assert_eq!(s.pool.name, "node-a");
        assert_eq!(s.pool.generation, 3);
        assert_eq!(s.pool.resource_slice_count, 1);
        assert_eq!(s.node_name.as_deref(), Some("node-a"));
        assert_eq!(slice_name("node-a"), "node-a-gpu.gpusched.io");
    }
}

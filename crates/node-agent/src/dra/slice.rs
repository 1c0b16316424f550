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
//! GPUs in MIG mode are left out: MIG partitions as partitionable devices
//! are not published yet (docs/dra.md).

use crate::backend::{GpuInfo, Inventory};
use crate::labels::gpu_family;
use gpusched_model::dra;
use k8s_openapi::api::resource::v1::{
    Device, DeviceAttribute, DeviceCapacity, DeviceTaint, ResourcePool, ResourceSliceSpec,
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

/// The device of one whole GPU.
pub fn gpu_device(g: &GpuInfo, cond: &GpuCondition) -> Device {
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
            ..Default::default()
        },
    );
    let taints = match cond {
        GpuCondition::Healthy => None,
        GpuCondition::Unhealthy(reason) => Some(vec![DeviceTaint {
            key: TAINT_UNHEALTHY.to_string(),
            value: Some(taint_value(reason)).filter(|v| !v.is_empty()),
            effect: taint_effect(reason).to_string(),
            time_added: None,
        }]),
    };
    Device {
        name: dra::gpu_device_name(g.index),
        attributes: Some(attrs),
        capacity: Some(capacity),
        taints,
        ..Default::default()
    }
}

/// The GPUs a slice publishes: whole GPUs not in MIG mode, by index.
pub fn published_gpus(inv: &Inventory) -> Vec<&GpuInfo> {
    let mut v: Vec<&GpuInfo> = inv.gpus.iter().filter(|g| !g.mig_enabled).collect();
    v.sort_by_key(|g| g.index);
    v
}

/// The devices of this node's slice; `conditions` is in inventory order.
pub fn devices(inv: &Inventory, conditions: &[GpuCondition]) -> Vec<Device> {
    published_gpus(inv)
        .into_iter()
        .map(|g| {
            let i = inv
                .gpus
                .iter()
                .position(|x| std::ptr::eq(x, g))
                .unwrap_or(usize::MAX);
            let cond = conditions.get(i).cloned().unwrap_or(GpuCondition::Healthy);
            gpu_device(g, &cond)
        })
        .collect()
}

/// The slice's spec for `node` at pool `generation`.
pub fn slice_spec(node: &str, devices: Vec<Device>, generation: i64) -> ResourceSliceSpec {
    ResourceSliceSpec {
        driver: dra::DRIVER.to_string(),
        node_name: Some(node.to_string()),
        pool: ResourcePool {
            name: node.to_string(),
            generation,
            resource_slice_count: 1,
        },
        devices: Some(devices),
        ..Default::default()
    }
}

/// The slice's object name (one slice per node and driver).
pub fn slice_name(node: &str) -> String {
    format!("{node}-{}", dra::DRIVER)
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
        let d = devices(&inv, &[GpuCondition::Healthy, GpuCondition::Healthy]);
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

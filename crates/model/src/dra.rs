//! The names gpusched's DRA driver publishes and its scheduler reads
//! (`resource.k8s.io/v1`).
//!
//! The node agent in DRA mode publishes one ResourceSlice pool per node
//! (pool name = node name) under [`DRIVER`]. Each whole GPU is one device
//! named `gpu-<index>` ([`gpu_device_name`]). The scheduler turns those
//! devices back into the core's GPUs, so the attribute names below are the
//! contract between the two sides: change them on both or not at all.
//!
//! Attribute names without a domain belong to the driver's domain, as DRA
//! defines (a CEL selector reads them as
//! `device.attributes["gpu.gpusched.io"].productName`).

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// The DRA driver name of gpusched's node agent.
pub const DRIVER: &str = "gpu.gpusched.io";

/// The DeviceClass the chart ships for whole GPUs of this driver.
pub const DEVICE_CLASS: &str = "gpu.gpusched.io";

/// The DeviceClass the chart ships for the MIG instances of this driver.
pub const MIG_DEVICE_CLASS: &str = "mig.gpusched.io";

/// Device attribute: the GPU's UUID (string).
pub const ATTR_UUID: &str = "uuid";
/// Device attribute: the GPU's index on its node (int).
pub const ATTR_INDEX: &str = "index";
/// Device attribute: the product name, e.g. `NVIDIA H100 80GB HBM3` (string).
pub const ATTR_PRODUCT_NAME: &str = "productName";
/// Device attribute: the GPU model as gpusched names it, e.g. `H100` (string).
pub const ATTR_MODEL: &str = "model";
/// Device attribute: the architecture, e.g. `Hopper` (string).
pub const ATTR_ARCHITECTURE: &str = "architecture";
/// Device attribute: the NUMA node the GPU sits on (int).
pub const ATTR_NUMA_NODE: &str = "numaNode";
/// Device attribute: the NVLink domain (string); GPUs sharing it are NVLink-connected.
pub const ATTR_NVLINK_DOMAIN: &str = "nvlinkDomain";
/// Device attribute, Kubernetes' standard name: the PCIe root complex (string).
pub const ATTR_PCIE_ROOT: &str = "resource.kubernetes.io/pcieRoot";
/// Device capacity: the GPU's memory (quantity, bytes, e.g. `80Gi`).
pub const CAPACITY_MEMORY: &str = "memory";
/// Device capacity of a GPU published for sharing (`allowMultipleAllocations`,
/// the agent's `--shares`): 1000 milli-GPUs; a request's
/// `capacity.requests["gpu.gpusched.io/milli"]` is its share (1–1000,
/// default 1000 = the whole GPU).
pub const CAPACITY_MILLI: &str = "milli";
/// Device attribute: the kind of device, `mig` for a MIG instance (string;
/// whole GPUs have none).
pub const ATTR_TYPE: &str = "type";
/// Device attribute of a MIG instance: its profile, e.g. `1g.10gb` (string).
pub const ATTR_MIG_PROFILE: &str = "profile";
/// Device attribute of a MIG instance: the UUID of its GPU (string).
pub const ATTR_PARENT_UUID: &str = "parentUUID";
/// Device attribute of a MIG instance: the index of its GPU (int).
pub const ATTR_PARENT_INDEX: &str = "parentIndex";

/// Shared counter of a MIG GPU's counter set, consumed by each instance:
/// compute slices (the set has the GPU's `G`, 7 on an A100/H100; an
/// instance consumes its profile's `g`). The scheduler measures an
/// instance as [`crate::sharing::mig_milli`]`(g, G)` of its GPU.
pub const COUNTER_COMPUTE_SLICES: &str = "compute-slices";
/// Shared counter of a MIG GPU's counter set: the GPU's memory (quantity).
pub const COUNTER_MEMORY: &str = "memory";

/// The device name of MIG instance `k` (the backend's order) of GPU `index`.
pub fn mig_device_name(index: u32, k: usize) -> String {
    format!("gpu-{index}-mig-{k}")
}

/// The (GPU index, instance position) of a MIG device name.
pub fn mig_device_index(name: &str) -> Option<(u32, usize)> {
    let (gpu, k) = name.strip_prefix("gpu-")?.split_once("-mig-")?;
    let canonical = |d: &str| !d.is_empty() && (d.len() == 1 || !d.starts_with('0'));
    if !canonical(gpu) || !canonical(k) {
        return None;
    }
    Some((gpu.parse().ok()?, k.parse().ok()?))
}

/// The shared counter set of GPU `index` (its MIG instances consume it).
pub fn counter_set_name(index: u32) -> String {
    format!("gpu-{index}-counters")
}

/// The device name of the whole GPU with this index.
pub fn gpu_device_name(index: u32) -> String {
    format!("gpu-{index}")
}

/// The index of a whole-GPU device name, `None` when it is not one.
pub fn gpu_device_index(name: &str) -> Option<u32> {
    let digits = name.strip_prefix("gpu-")?;
    if digits.is_empty() || (digits.len() > 1 && digits.starts_with('0')) {
        return None;
    }
    digits.parse().ok()
}

/// DRA, for the core: which of each node's GPUs a pending pod's
/// ResourceClaims may take, and which must go together (a `matchAttribute`
/// constraint). The Kubernetes adapter evaluates the claims' selectors
/// (DeviceClass and request CEL) on every GPU device of every node the
/// claims can be allocated on; the core gives the pod only GPUs allowed
/// here, all of one group.
///
/// A GPU's group is the (interned) tuple of its values of
/// [`ClaimGpus::attributes`]; with no attribute every allowed GPU is in
/// group 0. With [`ClaimGpus::distinct`] (`distinctAttribute`) no two GPUs
/// of the pod may share their (interned) values of those attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimGpus {
    /// The claim the constraint comes from (`namespace/name`), for reasons.
    pub claim: String,
    /// The `matchAttribute` attributes (qualified) every GPU of the pod
    /// must share; empty: none (only the selectors restrict).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attributes: Vec<String>,
    /// Per node name: per GPU position, the GPU's group, `None` where the
    /// claims cannot take it. A node not listed: none of its GPUs.
    pub nodes: BTreeMap<String, Vec<Option<u32>>>,
    /// The `distinctAttribute` attributes (qualified) no two GPUs of the
    /// pod may share; empty: none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub distinct: Vec<String>,
    /// With [`ClaimGpus::distinct`]: per node, per GPU position, the
    /// (interned) tuple of its values of those attributes (`None` where it
    /// is not allowed).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub values: BTreeMap<String, Vec<Option<u32>>>,
}

impl ClaimGpus {
    /// The group of GPU `g` of node `node` (`None`: not allowed).
    pub fn group(&self, node: &str, g: usize) -> Option<u32> {
        self.nodes.get(node)?.get(g).copied().flatten()
    }

    /// Whether the claims may take GPU `g` of node `node`.
    pub fn allows(&self, node: &str, g: usize) -> bool {
        self.group(node, g).is_some()
    }

    /// GPU `g`'s key for [`ClaimGpus::distinct`]: its values' id, or (no
    /// distinct attributes) a key of its own.
    fn distinct_key(&self, node: &str, g: usize) -> Option<u64> {
        if self.distinct.is_empty() {
            return Some((1 << 32) | g as u64);
        }
        self.values
            .get(node)?
            .get(g)
            .copied()
            .flatten()
            .map(u64::from)
    }

    /// Of `free` (GPU positions of `node`, ascending), the allowed ones of
    /// the group to take `k` from: the group with the fewest such GPUs
    /// that has at least `k` (best fit keeps larger groups whole), then
    /// the lowest group. `None` when no group has `k`.
    ///
    /// With [`ClaimGpus::distinct`], a group keeps one GPU (the lowest) per
    /// value: any `k` of those are distinct.
    pub fn pick_group(&self, node: &str, free: &[usize], k: usize) -> Option<Vec<usize>> {
        let mut by_group: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
        let mut seen: BTreeSet<(u32, u64)> = BTreeSet::new();
        for &g in free {
            if let (Some(grp), Some(key)) = (self.group(node, g), self.distinct_key(node, g))
                && seen.insert((grp, key))
            {
                by_group.entry(grp).or_default().push(g);
            }
        }
        by_group
            .into_values()
            .filter(|v| v.len() >= k)
            .min_by_key(Vec::len)
    }

    /// Whether `gpus` (positions on `node`) are all allowed, of one group
    /// and (with [`ClaimGpus::distinct`]) of distinct values.
    pub fn admits(&self, node: &str, gpus: impl IntoIterator<Item = usize>) -> bool {
        let mut first = None;
        let mut keys = BTreeSet::new();
        for g in gpus {
            let (Some(grp), Some(key)) = (self.group(node, g), self.distinct_key(node, g)) else {
                return false;
            };
            if *first.get_or_insert(grp) != grp || !keys.insert(key) {
                return false;
            }
        }
        true
    }

    /// The most allowed GPUs of one group (of distinct values, with
    /// [`ClaimGpus::distinct`]) among `gpus` of `node`.
    pub fn largest_group(&self, node: &str, gpus: impl IntoIterator<Item = usize>) -> usize {
        let mut by_group: BTreeMap<u32, BTreeSet<u64>> = BTreeMap::new();
        for g in gpus {
            if let (Some(grp), Some(key)) = (self.group(node, g), self.distinct_key(node, g)) {
                by_group.entry(grp).or_default().insert(key);
            }
        }
        by_group.into_values().map(|v| v.len()).max().unwrap_or(0)
    }

    /// What the pod lacks on a node, in kube-scheduler's style: `node(s)
    /// had no 2 free GPUs with one gpu.gpusched.io/nvlinkDomain for
    /// ResourceClaim ml/gpus` (`free`: say "free").
    pub fn shortage(&self, k: u32, free: bool) -> String {
        let free = if free { "free " } else { "" };
        let mut with = Vec::new();
        if !self.attributes.is_empty() {
            with.push(format!("one {}", self.attributes.join(" and one ")));
        }
        if !self.distinct.is_empty() {
            with.push(format!("distinct {}", self.distinct.join(" and ")));
        }
        if with.is_empty() {
            format!(
                "node(s) had no {k} {free}GPUs the selectors of ResourceClaim {} match",
                self.claim
            )
        } else {
            format!(
                "node(s) had no {k} {free}GPUs with {} for ResourceClaim {}",
                with.join(" and "),
                self.claim
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_round_trip_and_refuse_others() {
        for i in [0, 7, 15, 1023] {
            assert_eq!(gpu_device_index(&gpu_device_name(i)), Some(i));
        }
        for bad in [
            "gpu-",
            "gpu-01",
            "gpu--1",
            "gpu-x",
            "mig-0",
            "gpu-99999999999",
        ] {
            assert_eq!(gpu_device_index(bad), None, "{bad}");
        }
        assert_eq!(gpu_device_index(&mig_device_name(1, 2)), None);
        assert_eq!(mig_device_index(&mig_device_name(3, 6)), Some((3, 6)));
        for bad in [
            "gpu-1",
            "gpu-01-mig-1",
            "gpu-1-mig-",
            "gpu-1-mig-x",
            "mig-1-1",
        ] {
            assert_eq!(mig_device_index(bad), None, "{bad}");
        }
    }

    #[test]
    fn claim_gpus_groups_pick_the_tightest_group_that_fits() {
        // node a: GPUs 0,1 in domain 0; 2,3 in domain 1; GPU 4 not allowed
        let c = ClaimGpus {
            claim: "ml/gpus".into(),
            attributes: vec!["gpu.gpusched.io/nvlinkDomain".into()],
            nodes: [(
                "a".to_string(),
                vec![Some(0), Some(0), Some(1), Some(1), None],
            )]
            .into(),
            ..ClaimGpus::default()
        };
        assert!(c.allows("a", 0) && !c.allows("a", 4) && !c.allows("b", 0));
        // one free in each domain: no two of one
        assert_eq!(c.pick_group("a", &[1, 2, 4], 2), None);
        assert_eq!(c.pick_group("a", &[1, 2, 3, 4], 2), Some(vec![2, 3]));
        // both domains whole: the tightest fit, then the lowest group
        assert_eq!(c.pick_group("a", &[0, 1, 2, 3], 2), Some(vec![0, 1]));
        assert_eq!(c.pick_group("a", &[0, 1, 2, 3], 1), Some(vec![0, 1]));
        assert!(c.admits("a", [2, 3]) && !c.admits("a", [1, 2]) && !c.admits("a", [3, 4]));
        assert_eq!(c.largest_group("a", [0, 2, 3, 4]), 2);
        assert_eq!(
            c.shortage(2, true),
            "node(s) had no 2 free GPUs with one gpu.gpusched.io/nvlinkDomain for ResourceClaim ml/gpus"
        );
    }

    #[test]
    fn claim_gpus_distinct_values_never_go_together() {
        // node a: GPUs 0,1 on root 0, 2,3 on root 1, GPU 4 without one
        let c = ClaimGpus {
            claim: "ml/apart".into(),
            nodes: [("a".to_string(), vec![Some(0); 5])].into(),
            distinct: vec!["resource.kubernetes.io/pcieRoot".into()],
            values: [(
                "a".to_string(),
                vec![Some(0), Some(0), Some(1), Some(1), None],
            )]
            .into(),
            ..ClaimGpus::default()
        };
        assert_eq!(c.pick_group("a", &[0, 1, 2, 3, 4], 2), Some(vec![0, 2]));
        assert_eq!(c.pick_group("a", &[0, 1, 4], 2), None);
        assert!(c.admits("a", [1, 3]) && !c.admits("a", [0, 1]) && !c.admits("a", [0, 4]));
        assert_eq!(c.largest_group("a", [0, 1, 2, 3, 4]), 2);
        assert_eq!(c.largest_group("a", [0, 1]), 1);
        assert_eq!(
            c.shortage(2, true),
            "node(s) had no 2 free GPUs with distinct resource.kubernetes.io/pcieRoot for ResourceClaim ml/apart"
        );
    }
}

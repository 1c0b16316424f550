//! The cluster-file vocabulary: how nodes and their GPUs are described in
//! YAML. Shared by the simulator's cluster files, test fixtures and the node
//! agent's `fake` backend. Parsing the text (with line numbers) is left to
//! the caller; these types deny unknown fields, and [`ClusterSpec::build`]
//! validates values, naming the node group and field of every error.
//!
//! ```yaml
//! nodes:
//!   - name: dgx                 # node names dgx-0, dgx-1, … (count > 1)
//!     count: 4
//!     cpu: "224"
//!     memory: 2Ti
//!     rack: rack-a               # or with nodes_per_rack: rack-a-0, rack-a-1, …
//!     nodes_per_rack: 2
//!     block: block-1
//!     labels: {pool: training}
//!     taints: [{key: dedicated, value: train, effect: NoSchedule}]
//!     gpus:
//!       count: 8
//!       model: H100-SXM5-80GB
//!       memory: 80Gi
//!       interconnect: nvswitch   # nvswitch | nvlink-pairs | pcie
//!       pcie_switches: 4
//!       numa_nodes: 2
//! ```

use crate::gpu::{Gpu, GpuHealth};
use crate::labels;
use crate::node::{Node, Taint};
use crate::quantity::{parse_bytes, parse_cpu_milli, parse_integer, parse_mib};
use crate::resources::ResourceVec;
use crate::topology::{GpuTopo, shapes};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A whole cluster file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSpec {
    /// Node groups, in order.
    pub nodes: Vec<NodeGroupSpec>,
}

/// One or more identical nodes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeGroupSpec {
    /// Group name; nodes are named `NAME-0`, `NAME-1`, … (or `NAME` when `count` is 1).
    pub name: String,
    /// Number of identical nodes (default 1).
    #[serde(default = "one")]
    pub count: u32,
    /// Allocatable CPU, as a Kubernetes quantity (`64`, `500m`).
    pub cpu: String,
    /// Allocatable memory, as a Kubernetes quantity (`512Gi`).
    pub memory: String,
    /// Rack label for every node (or a prefix when `nodes_per_rack` is set).
    #[serde(default)]
    pub rack: Option<String>,
    /// Split the group into racks of this many nodes.
    #[serde(default)]
    pub nodes_per_rack: Option<u32>,
    /// Block (group of racks) label for every node.
    #[serde(default)]
    pub block: Option<String>,
    /// Multi-node NVLink domain (e.g. an NVL72 rack).
    #[serde(default)]
    pub nvlink_domain: Option<String>,
    /// Split the group into NVLink domains of this many nodes.
    #[serde(default)]
    pub nodes_per_nvlink_domain: Option<u32>,
    /// Extra node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node taints.
    #[serde(default)]
    pub taints: Vec<Taint>,
    /// Extra extended resources (`rdma/hca: "1"`).
    #[serde(default)]
    pub extended: BTreeMap<String, String>,
    /// Nodes start cordoned.
    #[serde(default)]
    pub unschedulable: bool,
    /// The GPUs of each node (none: a CPU-only group).
    #[serde(default)]
    pub gpus: Option<GpuLayoutSpec>,
}

fn one() -> u32 {
    1
}

/// How GPUs inside a node are connected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Interconnect {
    /// Every GPU in one NVLink domain (NVSwitch).
    Nvswitch,
    /// NVLink bridges between GPU pairs (0-1, 2-3, …).
    NvlinkPairs,
    /// PCIe only.
    #[default]
    Pcie,
}

/// The GPUs of each node of a group.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuLayoutSpec {
    /// GPUs per node.
    pub count: u32,
    /// GPU model name (e.g. `H100-SXM5-80GB`).
    pub model: String,
    /// Memory per GPU, as a quantity (`80Gi`).
    pub memory: String,
    /// How the GPUs are connected (default PCIe).
    #[serde(default)]
    pub interconnect: Interconnect,
    /// PCIe switches the GPUs are spread over (default 1).
    #[serde(default = "one")]
    pub pcie_switches: u32,
    /// NUMA nodes the GPUs are spread over (default 1).
    #[serde(default = "one")]
    pub numa_nodes: u32,
    /// Per-GPU overrides, by index.
    #[serde(default)]
    pub devices: Vec<GpuDeviceSpec>,
}

impl Default for GpuLayoutSpec {
    /// No GPUs yet, PCIe, one switch, one NUMA node (as a file that names
    /// neither would get).
    fn default() -> Self {
        GpuLayoutSpec {
            count: 0,
            model: String::new(),
            memory: String::new(),
            interconnect: Interconnect::Pcie,
            pcie_switches: 1,
            numa_nodes: 1,
            devices: Vec::new(),
        }
    }
}

/// Overrides for one GPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuDeviceSpec {
    /// GPU index the overrides apply to.
    pub index: u32,
    /// UUID (default: a synthetic, stable one).
    #[serde(default)]
    pub uuid: Option<String>,
    /// Model (default: the group's).
    #[serde(default)]
    pub model: Option<String>,
    /// Memory (default: the group's).
    #[serde(default)]
    pub memory: Option<String>,
    /// NVLink domain on the node.
    #[serde(default)]
    pub nvlink: Option<u32>,
    /// PCIe switch.
    #[serde(default)]
    pub pcie_switch: Option<u32>,
    /// NUMA node.
    #[serde(default)]
    pub numa: Option<u32>,
    /// Health (default healthy).
    #[serde(default)]
    pub healthy: Option<bool>,
    /// MIG devices on this GPU (MIG mode on when non-empty).
    #[serde(default)]
    pub mig: Vec<MigDeviceSpec>,
}

/// A MIG instance.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigDeviceSpec {
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
    /// UUID (default: a synthetic, stable one).
    #[serde(default)]
    pub uuid: Option<String>,
}

/// A refused value in a cluster spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("node group {group:?} (nodes[{index}]): field `{field}`: {why}")]
pub struct SpecError {
    /// Name of the node group.
    pub group: String,
    /// Position of the group in `nodes`.
    pub index: usize,
    /// The refused field.
    pub field: String,
    /// Why it was refused.
    pub why: String,
}

/// A node built from a spec, with the MIG devices the agent needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuiltNode {
    /// The node.
    pub node: Node,
    /// `(gpu index, profile, uuid)` of every MIG device.
    pub mig: Vec<(u32, String, String)>,
}

/// A deterministic UUID-shaped id for a GPU of a generated node.
pub fn synthetic_uuid(node: &str, index: u32, salt: &str) -> String {
    // FNV-1a, twice with different offsets, for 128 bits.
    let h = |seed: u64| {
        let mut x = seed;
        for b in node.bytes().chain(salt.bytes()).chain(index.to_le_bytes()) {
            x ^= b as u64;
            x = x.wrapping_mul(0x100000001b3);
        }
        x
    };
    let a = h(0xcbf29ce484222325);
    let b = h(0x84222325cbf29ce4);
    format!(
        "GPU-{:08x}-{:04x}-{:04x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xffff,
        b >> 48,
        b & 0xffff_ffff_ffff
    )
}

impl ClusterSpec {
    /// Builds every node, in file order.
    pub fn build(&self) -> Result<Vec<BuiltNode>, SpecError> {
        let mut out = Vec::new();
        let mut names = std::collections::BTreeSet::new();
        for (gi, g) in self.nodes.iter().enumerate() {
            if g.count == 0 {
                return Err(g.err(gi, "count", "must be at least 1"));
            }
            for i in 0..g.count {
                let b = g.build_one(gi, i)?;
                if !names.insert(b.node.name.clone()) {
                    return Err(g.err(
                        gi,
                        "name",
                        format!("duplicate node name {:?}", b.node.name),
                    ));
                }
                out.push(b);
            }
        }
        Ok(out)
    }

    /// Builds every node, dropping the MIG detail.
    pub fn nodes(&self) -> Result<Vec<Node>, SpecError> {
        Ok(self.build()?.into_iter().map(|b| b.node).collect())
    }
}

impl NodeGroupSpec {
    fn err(&self, index: usize, field: &str, why: impl Into<String>) -> SpecError {
        SpecError {
            group: self.name.clone(),
            index,
            field: field.to_string(),
            why: why.into(),
        }
    }

    /// Builds node `i` of the group (`gi` is the group's index in the file).
    pub fn build_one(&self, gi: usize, i: u32) -> Result<BuiltNode, SpecError> {
        if self.name.is_empty() {
            return Err(self.err(gi, "name", "must not be empty"));
        }
        if self.count == 0 {
            return Err(self.err(gi, "count", "must be at least 1"));
        }
        let name = if self.count == 1 {
            self.name.clone()
        } else {
            format!("{}-{}", self.name, i)
        };
        let mut alloc = ResourceVec {
            cpu_milli: parse_cpu_milli(&self.cpu)
                .map_err(|e| self.err(gi, "cpu", e.to_string()))?,
            memory: parse_bytes(&self.memory).map_err(|e| self.err(gi, "memory", e.to_string()))?,
            ..Default::default()
        };
        for (k, v) in &self.extended {
            let n = parse_integer(v)
                .map_err(|e| self.err(gi, &format!("extended.{k}"), e.to_string()))?;
            alloc.ext.insert(k.clone(), n);
        }
        let mut labels = self.labels.clone();
        let grouped = |base: &Option<String>,
                       per: Option<u32>,
                       field: &str|
         -> Result<Option<String>, SpecError> {
            match (base, per) {
                (None, None) => Ok(None),
                (None, Some(_)) => Err(self.err(gi, field, "needs the matching name field")),
                (Some(b), None) => Ok(Some(b.clone())),
                (Some(_), Some(0)) => Err(self.err(gi, field, "must be at least 1")),
                (Some(b), Some(p)) => Ok(Some(format!("{b}-{}", i / p))),
            }
        };
        if let Some(r) = grouped(&self.rack, self.nodes_per_rack, "nodes_per_rack")? {
            labels.insert(labels::LABEL_RACK.into(), r);
        }
        if let Some(b) = &self.block {
            labels.insert(labels::LABEL_BLOCK.into(), b.clone());
        }
        if let Some(d) = grouped(
            &self.nvlink_domain,
            self.nodes_per_nvlink_domain,
            "nodes_per_nvlink_domain",
        )? {
            labels.insert(labels::LABEL_NVLINK_DOMAIN.into(), d);
        }
        let mut gpus = Vec::new();
        let mut mig = Vec::new();
        if let Some(l) = &self.gpus {
            let n = l.count as usize;
            if l.model.is_empty() {
                return Err(self.err(gi, "gpus.model", "must not be empty"));
            }
            let mem =
                parse_mib(&l.memory).map_err(|e| self.err(gi, "gpus.memory", e.to_string()))?;
            if l.pcie_switches == 0 || l.numa_nodes == 0 {
                return Err(self.err(gi, "gpus.pcie_switches/numa_nodes", "must be at least 1"));
            }
            let sw = l.pcie_switches as usize;
            let numa = l.numa_nodes as usize;
            let topos: Vec<GpuTopo> = match l.interconnect {
                Interconnect::Nvswitch => shapes::nvswitch(n, sw, numa),
                Interconnect::NvlinkPairs => shapes::bridged_pairs(n, sw, numa),
                Interconnect::Pcie => shapes::pcie(n, sw, numa),
            };
            for (idx, topo) in topos.into_iter().enumerate() {
                gpus.push(Gpu {
                    index: idx as u32,
                    uuid: synthetic_uuid(&name, idx as u32, ""),
                    model: l.model.clone(),
                    memory_mib: mem,
                    health: GpuHealth::Healthy,
                    topo,
                    mig: Vec::new(),
                });
            }
            let mut seen = std::collections::BTreeSet::new();
            for d in &l.devices {
                let field = format!("gpus.devices[index={}]", d.index);
                if !seen.insert(d.index) {
                    return Err(self.err(gi, &field, "duplicate index"));
                }
                let Some(g) = gpus.get_mut(d.index as usize) else {
                    return Err(self.err(
                        gi,
                        &field,
                        format!("index out of range (the node has {n} GPUs)"),
                    ));
                };
                if let Some(u) = &d.uuid {
                    if u.is_empty() {
                        return Err(self.err(gi, &format!("{field}.uuid"), "must not be empty"));
                    }
                    g.uuid = if self.count == 1 {
                        u.clone()
                    } else {
                        format!("{u}-{i}")
                    };
                }
                if let Some(m) = &d.model {
                    g.model = m.clone();
                }
                if let Some(m) = &d.memory {
                    g.memory_mib = parse_mib(m)
                        .map_err(|e| self.err(gi, &format!("{field}.memory"), e.to_string()))?;
                }
                if d.nvlink.is_some() {
                    g.topo.nvlink = d.nvlink;
                }
                if d.pcie_switch.is_some() {
                    g.topo.pcie_switch = d.pcie_switch;
                }
                if d.numa.is_some() {
                    g.topo.numa = d.numa;
                }
                if d.healthy == Some(false) {
                    g.health = GpuHealth::Unhealthy;
                }
                for (k, m) in d.mig.iter().enumerate() {
                    if m.profile.is_empty() {
                        return Err(self.err(
                            gi,
                            &format!("{field}.mig[{k}].profile"),
                            "must not be empty",
                        ));
                    }
                    let uuid = m.uuid.clone().unwrap_or_else(|| {
                        synthetic_uuid(&name, d.index, &format!("mig{k}"))
                            .replacen("GPU-", "MIG-", 1)
                    });
                    mig.push((d.index, m.profile.clone(), uuid));
                }
            }
        }
        let mut uuids = std::collections::BTreeSet::new();
        for g in &gpus {
            if !uuids.insert(g.uuid.clone()) {
                return Err(self.err(
                    gi,
                    "gpus.devices.uuid",
                    format!("duplicate GPU uuid {:?}", g.uuid),
                ));
            }
        }
        let mut node = Node::new(name, alloc, gpus);
        // MIG-enabled GPUs are not offered whole; their instances are
        // extended resources `nvidia.com/mig-<profile>` (mixed strategy).
        let mig_gpus: std::collections::BTreeSet<u32> = mig.iter().map(|m| m.0).collect();
        if !mig_gpus.is_empty() {
            node.gpus.retain(|g| !mig_gpus.contains(&g.index));
            node.sync_gpu_allocatable();
            for (_, p, _) in &mig {
                *node
                    .allocatable
                    .ext
                    .entry(format!("{}{p}", labels::RESOURCE_MIG_PREFIX))
                    .or_insert(0) += 1;
            }
        }
        node.labels = labels;
        node.taints = self.taints.clone();
        node.unschedulable = self.unschedulable;
        Ok(BuiltNode { node, mig })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group() -> NodeGroupSpec {
        NodeGroupSpec {
            name: "dgx".into(),
            count: 4,
            cpu: "224".into(),
            memory: "2Ti".into(),
            rack: Some("rack".into()),
            nodes_per_rack: Some(2),
            gpus: Some(GpuLayoutSpec {
                count: 8,
                model: "H100".into(),
                memory: "80Gi".into(),
                interconnect: Interconnect::Nvswitch,
                pcie_switches: 4,
                numa_nodes: 2,
                devices: vec![],
            }),
            ..Default::default()
        }
    }

    #[test]
    fn builds_groups() {
        let nodes = ClusterSpec {
            nodes: vec![group()],
        }
        .nodes()
        .unwrap();
        assert_eq!(nodes.len(), 4);
        assert_eq!(nodes[3].name, "dgx-3");
        assert_eq!(nodes[3].rack(), Some("rack-1"));
        assert_eq!(nodes[0].gpus.len(), 8);
        assert_eq!(nodes[0].allocatable.gpu_milli, 8000);
        assert_eq!(nodes[0].allocatable.cpu_milli, 224_000);
        assert_ne!(nodes[0].gpus[0].uuid, nodes[1].gpus[0].uuid);
        assert_eq!(
            nodes[0].gpus[7].topo,
            GpuTopo {
                nvlink: Some(0),
                pcie_switch: Some(3),
                numa: Some(1)
            }
        );
    }

    #[test]
    fn errors_name_group_and_field() {
        let mut g = group();
        g.gpus.as_mut().unwrap().memory = "80Gx".into();
        let e = ClusterSpec { nodes: vec![g] }.nodes().unwrap_err();
        assert_eq!(e.field, "gpus.memory");
        assert!(e.to_string().contains("\"dgx\""), "{e}");
        let mut g = group();
        g.gpus.as_mut().unwrap().devices.push(GpuDeviceSpec {
            index: 9,
            ..Default::default()
        });
        let e = ClusterSpec { nodes: vec![g] }.nodes().unwrap_err();
        assert!(e.to_string().contains("out of range"), "{e}");
        let e = ClusterSpec {
            nodes: vec![group(), group()],
        }
        .nodes()
        .unwrap_err();
        assert!(e.to_string().contains("duplicate node name"), "{e}");
    }

    #[test]
    fn mig_devices_become_extended_resources() {
        let mut g = group();
        g.count = 1;
        g.gpus.as_mut().unwrap().devices.push(GpuDeviceSpec {
            index: 0,
            mig: vec![
                MigDeviceSpec {
                    profile: "3g.40gb".into(),
                    uuid: None,
                },
                MigDeviceSpec {
                    profile: "3g.40gb".into(),
                    uuid: None,
                },
            ],
            ..Default::default()
        });
        let b = &ClusterSpec { nodes: vec![g] }.build().unwrap()[0];
        assert_eq!(b.node.gpus.len(), 7);
        assert_eq!(b.node.allocatable.ext_get("nvidia.com/mig-3g.40gb"), 2);
        assert_eq!(b.mig.len(), 2);
        assert!(b.mig[0].2.starts_with("MIG-"));
    }
}

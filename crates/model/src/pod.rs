//! Pods, pod groups (gangs) and their placement constraints.

use crate::node::{Node, TaintEffect};
use crate::podapi::PodConstraints;
use crate::resources::{GPU_MILLI, ResourceVec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a pod asks of GPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum GpuRequest {
    /// No GPU.
    #[default]
    None,
    /// `n` whole GPUs (`nvidia.com/gpu: n`).
    Whole(u32),
    /// A share of one GPU: `milli` thousandths of its compute and/or
    /// `memory_mib` of its memory (either may be zero, not both).
    Share {
        /// Thousandths of the GPU's compute (0–1000).
        milli: u32,
        /// GPU memory, MiB.
        #[serde(alias = "memory_mib")]
        memory_mib: u64,
    },
}

impl GpuRequest {
    /// GPU demand in milli-GPU, the unit quotas count in.
    pub fn milli(&self) -> u64 {
        match *self {
            GpuRequest::None => 0,
            GpuRequest::Whole(n) => n as u64 * GPU_MILLI,
            GpuRequest::Share { milli, .. } => milli as u64,
        }
    }

    /// Whole GPUs asked for (0 for a share or none).
    pub fn whole(&self) -> u32 {
        match *self {
            GpuRequest::Whole(n) => n,
            _ => 0,
        }
    }

    /// Whether no GPU is asked for.
    pub fn is_none(&self) -> bool {
        matches!(self, GpuRequest::None | GpuRequest::Whole(0))
    }
}

/// Operator of a node selector requirement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeSelectorOp {
    /// The label's value is one of `values`.
    In,
    /// The label is absent or its value is none of `values`.
    NotIn,
    /// The label is present.
    Exists,
    /// The label is absent.
    DoesNotExist,
    /// Node selectors only: the label's value, read as an integer, is
    /// greater than the one value (a missing or non-integer label does not
    /// match), as Kubernetes defines `Gt`.
    Gt,
    /// Node selectors only: the label's value, read as an integer, is less
    /// than the one value.
    Lt,
}

/// One requirement of a node selector term (`matchExpressions` entry).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeSelectorRequirement {
    /// Label key.
    pub key: String,
    /// How the label is tested.
    pub operator: NodeSelectorOp,
    /// Values for `In` / `NotIn`.
    #[serde(default)]
    pub values: Vec<String>,
}

impl NodeSelectorRequirement {
    /// Whether a node with these labels meets the requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let v = labels.get(&self.key);
        match self.operator {
            NodeSelectorOp::In => v.is_some_and(|v| self.values.iter().any(|x| x == v)),
            NodeSelectorOp::NotIn => !v.is_some_and(|v| self.values.iter().any(|x| x == v)),
            NodeSelectorOp::Exists => v.is_some(),
            NodeSelectorOp::DoesNotExist => v.is_none(),
            NodeSelectorOp::Gt | NodeSelectorOp::Lt => {
                let int = |x: &String| x.trim().parse::<i64>().ok();
                let (Some(v), Some(bound)) = (v.and_then(int), self.values.first().and_then(int))
                else {
                    return false;
                };
                if self.operator == NodeSelectorOp::Gt {
                    v > bound
                } else {
                    v < bound
                }
            }
        }
    }
}

#[cfg(test)]
mod node_selector_tests {
    use super::*;

    #[test]
    fn gt_and_lt_compare_integer_labels_and_refuse_the_rest() {
        let req = |op, v: &str| NodeSelectorRequirement {
            key: "nvidia.com/gpu.memory".into(),
            operator: op,
            values: vec![v.into()],
        };
        let node = |v: Option<&str>| -> BTreeMap<String, String> {
            v.map(|v| ("nvidia.com/gpu.memory".to_string(), v.to_string()))
                .into_iter()
                .collect()
        };
        let big = node(Some("81559"));
        let small = node(Some("40960"));
        assert!(req(NodeSelectorOp::Gt, "40960").matches(&big));
        assert!(
            !req(NodeSelectorOp::Gt, "40960").matches(&small),
            "equal is not greater"
        );
        assert!(req(NodeSelectorOp::Lt, "81559").matches(&small));
        assert!(
            !req(NodeSelectorOp::Lt, "81559").matches(&big),
            "equal is not less"
        );
        assert!(req(NodeSelectorOp::Gt, "-1").matches(&node(Some("0"))));
        for missing in [node(None), node(Some("80GiB")), node(Some(""))] {
            assert!(
                !req(NodeSelectorOp::Gt, "0").matches(&missing),
                "{missing:?}"
            );
            assert!(
                !req(NodeSelectorOp::Lt, "999999").matches(&missing),
                "{missing:?}"
            );
        }
        assert!(
            !req(NodeSelectorOp::Gt, "x").matches(&big),
            "a bound that is not an integer"
        );
    }

    #[test]
    fn match_fields_test_the_node_name_and_an_empty_term_matches_nothing() {
        let name = |is_in, n: &str| NodeNameRequirement {
            is_in,
            name: n.into(),
        };
        let gpu: BTreeMap<String, String> = [("gpu".to_string(), "h100".to_string())].into();
        // a DaemonSet pod's term: the node's name In one value
        let pin = NodeSelectorTerm {
            match_fields: vec![name(true, "n1")],
            ..Default::default()
        };
        assert!(pin.matches("n1", &gpu));
        assert!(pin.matches("n1", &BTreeMap::new()), "no labels needed");
        assert!(!pin.matches("n10", &gpu), "the whole name, not a prefix");
        let not = NodeSelectorTerm {
            match_fields: vec![name(false, "n1")],
            ..Default::default()
        };
        assert!(!not.matches("n1", &gpu));
        assert!(not.matches("n2", &gpu));
        // fields and expressions are ANDed
        let both = NodeSelectorTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "gpu".into(),
                operator: NodeSelectorOp::In,
                values: vec!["h100".into()],
            }],
            match_fields: vec![name(true, "n1"), name(false, "n2")],
        };
        assert!(both.matches("n1", &gpu));
        assert!(!both.matches("n1", &BTreeMap::new()));
        assert!(!both.matches("n2", &gpu));
        // "a null or empty node selector term matches no objects"
        assert!(!NodeSelectorTerm::default().matches("n1", &gpu));
    }
}

/// The one node field a node selector term's `matchFields` may test, as
/// Kubernetes defines it.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// One requirement of a term's `matchFields`: the node's name is (`In`) or
/// is not (`NotIn`) the one value — the only field and operators
/// Kubernetes accepts there (DaemonSet pods pin their node this way).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeNameRequirement {
    /// `In` (true) or `NotIn` (false).
    pub is_in: bool,
    /// The node name.
    pub name: String,
}

/// Requirements ANDed together: labels (`matchExpressions`) and the node's
/// name (`matchFields`). A term with neither matches no node, as in
/// Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeSelectorTerm {
    /// The label requirements; all must hold.
    pub match_expressions: Vec<NodeSelectorRequirement>,
    /// The node-name requirements (`matchFields` on `metadata.name`); all
    /// must hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_fields: Vec<NodeNameRequirement>,
}

impl NodeSelectorTerm {
    /// Whether the node `name` with these labels meets every requirement.
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        !(self.match_expressions.is_empty() && self.match_fields.is_empty())
            && self.match_expressions.iter().all(|r| r.matches(labels))
            && self
                .match_fields
                .iter()
                .all(|f| (f.name == name) == f.is_in)
    }
}

/// Operator of a toleration.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum TolerationOp {
    /// Key and value must equal the taint's.
    #[default]
    Equal,
    /// The key must equal the taint's (or be empty: any key).
    Exists,
}

/// A toleration; `key` empty with `Exists` tolerates everything.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Toleration {
    /// Taint key tolerated (empty with `Exists`: every key).
    #[serde(default)]
    pub key: String,
    /// How key and value are compared.
    #[serde(default)]
    pub operator: TolerationOp,
    /// Value compared by `Equal`.
    #[serde(default)]
    pub value: String,
    /// `None` tolerates every effect.
    #[serde(default)]
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// Whether this toleration tolerates taint `t`.
    pub fn tolerates(&self, t: &crate::node::Taint) -> bool {
        if let Some(e) = self.effect
            && e != t.effect
        {
            return false;
        }
        match self.operator {
            TolerationOp::Exists => self.key.is_empty() || self.key == t.key,
            TolerationOp::Equal => self.key == t.key && self.value == t.value,
        }
    }
}

/// Topology level a gang must (or should) fit in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    /// All members on one node.
    Node,
    /// All members in one NVLink domain (one node, or one multi-node domain
    /// labelled `gpusched.io/nvlink-domain`).
    NvlinkDomain,
    /// All members in one rack (`gpusched.io/rack`).
    Rack,
    /// All members in one block of racks (`gpusched.io/block`).
    Block,
}

/// Where a gang's members must (or should) be placed together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TopologyConstraint {
    /// The level of the domain.
    pub level: TopologyLevel,
    /// Required: never place across the level. Preferred: try, then relax.
    pub required: bool,
}

impl TopologyLevel {
    /// The domain key of a node at this level (`None`: the node is in no
    /// domain of this level and can only take part alone, if at all).
    pub fn domain_of<'a>(&self, node: &'a Node) -> Option<&'a str> {
        match self {
            TopologyLevel::Node => Some(node.name.as_str()),
            TopologyLevel::NvlinkDomain => node.nvlink_domain().or_else(|| {
                // a single-node NVSwitch domain
                (!node.gpus.is_empty()
                    && node.gpus.iter().all(|g| {
                        g.topo.nvlink.is_some() && g.topo.nvlink == node.gpus[0].topo.nvlink
                    }))
                .then_some(node.name.as_str())
            }),
            TopologyLevel::Rack => node.rack(),
            TopologyLevel::Block => node.block(),
        }
    }
}

/// A gang: the pods that must start together.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodGroup {
    /// Group name, unique in a snapshot.
    pub name: String,
    /// Queue the group is charged to.
    pub queue: String,
    /// How many member pods must be placed for the group to start.
    pub min_member: u32,
    /// Priority of the group (its members' priority when they differ).
    pub priority: i32,
    /// Placement constraint for the members together.
    pub topology: Option<TopologyConstraint>,
    /// Milliseconds after the first member arrived before the group is
    /// reported as timed out (its members are failed by the runner).
    pub schedule_timeout_ms: Option<u64>,
}

/// A pod as the scheduler sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pod {
    /// `namespace/name`, unique in a snapshot.
    pub name: String,
    /// Queue the pod is charged to.
    pub queue: String,
    /// Pod group (gang) the pod belongs to, if any.
    pub group: Option<String>,
    /// Priority (from its PriorityClass); higher is scheduled first and may preempt.
    pub priority: i32,
    /// CPU, memory and extended resources (GPU dimensions left zero; see
    /// [`Pod::gpu`]).
    pub requests: ResourceVec,
    /// GPUs asked for.
    pub gpu: GpuRequest,
    /// Allowed GPU models; empty = any.
    pub gpu_models: Vec<String>,
    /// Minimum memory of each GPU used, in MiB.
    pub min_gpu_memory_mib: u64,
    /// Labels a node must carry (`spec.nodeSelector`).
    pub node_selector: BTreeMap<String, String>,
    /// Required node affinity: terms ORed; empty = no constraint.
    pub affinity: Vec<NodeSelectorTerm>,
    /// Taints the pod tolerates.
    pub tolerations: Vec<Toleration>,
    /// Virtual time (ms) the pod arrived.
    pub arrival_ms: u64,
    /// Whether the pod may be preempted or reclaimed.
    pub preemptible: bool,
    /// Whether the pod may evict others to fit (Kubernetes'
    /// `preemptionPolicy: Never` is `false`).
    #[serde(default = "yes")]
    pub may_evict: bool,
    /// Evicting it would break a PodDisruptionBudget: chosen as a victim
    /// only when nothing else frees enough (kube-scheduler's rule).
    #[serde(default)]
    pub disruption_budget_exhausted: bool,
    /// The pod opted in to being moved by consolidation (label or
    /// annotation `gpusched.io/movable: "true"`): it may be restarted on
    /// another node so that a pending pod of equal or higher priority fits.
    /// Its queue may opt in for all its pods ([`crate::Queue::movable`]).
    #[serde(default)]
    pub movable: bool,
    /// Namespace (empty in the simulator unless a workload sets it): the
    /// default namespace of its inter-pod terms, and what other pods'
    /// terms match it by.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub namespace: String,
    /// Labels (what other pods' affinity, anti-affinity and spread
    /// selectors match).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Inter-pod (anti-)affinity, topology spread, host ports, preferred
    /// node affinity (`None`: none of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<Box<PodConstraints>>,
    /// MIG instances asked (`None`: none). Such a pod's [`Pod::gpu`] is
    /// the share the instances measure (`count` instances of
    /// [`crate::sharing::mig_milli`] each), which quotas and fair share
    /// count; where it goes is decided by instances, never by that milli.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mig: Option<Box<MigAsk>>,
}

/// A pod's ask of MIG instances: `count` instances of one profile under
/// one resource name, all of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigAsk {
    /// The resource asked (`nvidia.com/mig-1g.10gb`, or `nvidia.com/gpu`
    /// on nodes of `migStrategy: single`).
    pub resource: String,
    /// The profile its instances have (`1g.10gb`).
    pub profile: String,
    /// Instances asked (≥ 1).
    pub count: u32,
}

fn yes() -> bool {
    true
}

impl Pod {
    /// A pod with only a name, a queue and requests; the rest default.
    pub fn new(name: impl Into<String>, queue: impl Into<String>) -> Self {
        Pod {
            name: name.into(),
            queue: queue.into(),
            group: None,
            priority: 0,
            requests: ResourceVec::default(),
            gpu: GpuRequest::None,
            gpu_models: Vec::new(),
            min_gpu_memory_mib: 0,
            node_selector: BTreeMap::new(),
            affinity: Vec::new(),
            tolerations: Vec::new(),
            arrival_ms: 0,
            preemptible: true,
            may_evict: true,
            disruption_budget_exhausted: false,
            movable: false,
            namespace: String::new(),
            labels: BTreeMap::new(),
            constraints: None,
            mig: None,
        }
    }

    /// The pod's constraints (empty when it has none).
    pub fn constraints(&self) -> &PodConstraints {
        static NONE: std::sync::OnceLock<PodConstraints> = std::sync::OnceLock::new();
        self.constraints
            .as_deref()
            .unwrap_or_else(|| NONE.get_or_init(PodConstraints::default))
    }

    /// Mutable constraints (created empty when absent).
    pub fn constraints_mut(&mut self) -> &mut PodConstraints {
        self.constraints.get_or_insert_with(Default::default)
    }

    /// Everything the pod asks, GPU included, in quota units.
    pub fn demand(&self) -> ResourceVec {
        let mut r = self.requests.clone();
        r.gpu_milli = self.gpu.milli();
        if let GpuRequest::Share { memory_mib, .. } = self.gpu {
            r.gpu_mem_mib = memory_mib;
        }
        r
    }

    /// Whether the pod's taint tolerations let it onto a node with these
    /// taints (NoSchedule and NoExecute must be tolerated).
    pub fn tolerates_all(&self, node: &Node) -> bool {
        node.taints
            .iter()
            .filter(|t| t.effect != TaintEffect::PreferNoSchedule)
            .all(|t| self.tolerations.iter().any(|tol| tol.tolerates(t)))
    }

    /// Whether the pod may run on a GPU of this model.
    pub fn allows_model(&self, model: &str) -> bool {
        self.gpu_models.is_empty() || self.gpu_models.iter().any(|m| m == model)
    }
}

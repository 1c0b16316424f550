//! Pure translation of Kubernetes objects into the core's vocabulary. No
//! I/O: every function takes objects and returns model values or an error
//! that names the object and the field, so the rules are fixture-tested.

use crate::crd::{PodGroup, Queue, SpPodGroup, TopologyLevel as CrdLevel, TopologyMode};
use crate::decision::{ANNOTATION_DECISION, DecisionError, GpuDecision};
pub use gpusched_model::labels::LABEL_MOVABLE;
pub use gpusched_model::labels::LABEL_QUEUE;
use gpusched_model::labels::{GFD_MEMORY, GFD_PRODUCT, LABEL_POD_GROUP, RESOURCE_GPU, parse_flag};
use gpusched_model::labels::{RESOURCE_GPU_MEMORY_MIB, RESOURCE_GPU_MILLI};
pub use gpusched_model::protocol::{ANNOTATION_NODE_GPUS, NodeGpu};
use gpusched_model::quantity::{parse_bytes, parse_cpu_milli, parse_integer, parse_mib};
use gpusched_model::topology::GpuTopo;
use gpusched_model::validate::{ContainerResources, ResourceError, pod_resources};
use gpusched_model::{
    Gpu, GpuHealth, GpuRequest, Node as MNode, NodeSelectorTerm, Pod as MPod, PodGroup as MGroup,
    Queue as MQueue, ResourceKind, ResourceLimit, ResourceVec, Taint, TaintEffect, Toleration,
    TolerationOp, TopologyConstraint, TopologyLevel,
};
use k8s_openapi::api::core::v1::{Container, Node, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use std::collections::{BTreeMap, BTreeSet};

mod groups;
pub mod keys;
mod pods;

pub use groups::{PdbView, group, pdb, queue, selects, sp_group};
pub use pods::{PodKind, PodView, effective_resources, group_of, model_pod, pod, pod_for};

/// Scheduler name pods use to opt in.
pub const SCHEDULER_NAME: &str = "gpusched";
/// Queue of pods that name none.
pub const DEFAULT_QUEUE: &str = "default";
/// Label of the scheduler-plugins coscheduling pod group.
pub const LABEL_SP_POD_GROUP: &str = "scheduling.x-k8s.io/pod-group";
/// Label the Job controller puts on a Job's pods.
pub const LABEL_JOB_NAME: &str = "batch.kubernetes.io/job-name";
/// Label on a `batch/v1` Job: `"true"` makes it a gang (a PodGroup named
/// after the Job is created, minMember = parallelism).
pub const LABEL_GANG: &str = "gpusched.io/gang";
/// Annotation on a PodGroup created for a Job (the Job's name): the Job's
/// pods join it without a pod-group label.
pub const ANNOTATION_FOR_JOB: &str = "gpusched.io/job";

/// Pod annotation: allowed GPU models, comma-separated.
pub const ANNOTATION_GPU_MODELS: &str = "gpusched.io/gpu-models";
/// Pod annotation: minimum memory of each GPU used (a quantity).
pub const ANNOTATION_MIN_GPU_MEMORY: &str = "gpusched.io/min-gpu-memory";
/// Pod annotation `"false"`: never preempted or reclaimed.
pub const ANNOTATION_PREEMPTIBLE: &str = "gpusched.io/preemptible";

/// Most GPUs gpusched models on one node (a node that advertises more is
/// warned about and used up to this many): a decision for all of them stays
/// well inside [`crate::decision::MAX_DECISION_BYTES`].
pub const MAX_NODE_GPUS: u64 = 1024;

/// Most whole GPUs one pod may ask: a decision naming that many GPUs by
/// UUID (about 50 bytes each) stays inside
/// [`crate::decision::MAX_DECISION_BYTES`]. A pod asking more is refused
/// naming this cap (never proposed and then dropped, which would hold its
/// GPUs away from every other pod in each cycle).
pub const MAX_POD_GPUS: u32 = 256;

/// The stand-in UUID of GPU `index` of a node without the agent's
/// `gpusched.io/gpus` annotation (its real UUIDs are unknown; decisions
/// leave it out).
pub fn synthetic_uuid(node: &str, index: u32) -> String {
    format!("{node}-gpu-{index}")
}

/// A translation error, naming the object and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslateError {
    /// A resource quantity or rule was refused.
    #[error("{object}: {source}")]
    Resources {
        /// The object it is about (`pod ns/name`, `node name`, …).
        object: String,
        /// What the rule refused.
        source: ResourceError,
    },
    /// A field has a value we cannot use.
    #[error("{object}: {field}: {what}")]
    Field {
        /// The object it is about (`pod ns/name`, `node name`, …).
        object: String,
        /// The field's path in the object.
        field: String,
        /// What is wrong with its value.
        what: String,
    },
    /// The GPU decision annotation is unusable.
    #[error("{object}: {source}")]
    Decision {
        /// The object it is about (`pod ns/name`).
        object: String,
        /// Why the annotation cannot be used.
        source: DecisionError,
    },
}

impl TranslateError {
    /// The object it is about (`pod ns/name`, `node name`, …).
    pub fn object(&self) -> &str {
        match self {
            TranslateError::Resources { object, .. }
            | TranslateError::Field { object, .. }
            | TranslateError::Decision { object, .. } => object,
        }
    }

    /// The message without the object it is about: for the surfaces that
    /// already name it (the object's own event and condition, `explain`,
    /// doctor's finding, a log line that names it) — "pod default/x: pod
    /// default/x: container …" said it twice.
    pub fn detail(&self) -> String {
        let s = self.to_string();
        match s
            .strip_prefix(self.object())
            .and_then(|r| r.strip_prefix(": "))
        {
            Some(rest) => rest.to_string(),
            None => s,
        }
    }
}

pub(crate) fn field_err(object: &str, field: &str, what: impl Into<String>) -> TranslateError {
    TranslateError::Field {
        object: object.to_string(),
        field: field.to_string(),
        what: what.into(),
    }
}

/// What the scheduler needs of a Node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeView {
    /// The node in the core's vocabulary.
    pub node: MNode,
    /// Condition Ready is True.
    pub ready: bool,
    /// Problems found while translating (bad annotation, …): the node is
    /// still used with what could be read.
    pub warnings: Vec<String>,
    /// What the node's agent has handed out, by pod UID (its
    /// `gpusched.io/allocations` annotation): where the kubelet really put
    /// each pod, which may differ from its decision (a same-size swap).
    pub allocations: BTreeMap<String, gpusched_model::protocol::PodAllocation>,
    /// The node's time-sliced resources (its agent's `gpusched.io/sharing`).
    pub sharing: Option<gpusched_model::sharing::NodeSharing>,
}

fn quantity_map(m: Option<&BTreeMap<String, Quantity>>) -> BTreeMap<String, String> {
    m.map(|m| m.iter().map(|(k, v)| (k.clone(), v.0.clone())).collect())
        .unwrap_or_default()
}

/// Whether a node's condition `Ready` is `True`.
pub fn node_ready(n: &Node) -> bool {
    n.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
        .is_some_and(|c| c.status == "True")
}

/// Node → the core's node. GPUs come from the agent's annotation when there
/// is one, else from `nvidia.com/gpu` allocatable and the GFD labels. Never
/// fails: what cannot be read is left out and reported in `warnings`, and
/// GPUs beyond what the kubelet reports allocatable are marked unhealthy.
pub fn node(n: &Node) -> NodeView {
    let name = n.metadata.name.clone().unwrap_or_default();
    let obj = format!("node {name}");
    let mut warnings = Vec::new();
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let status = n.status.as_ref();
    let alloc = quantity_map(status.and_then(|s| s.allocatable.as_ref()));
    let mut res = ResourceVec::default();
    let mut gpu_alloc = 0u64;
    for (k, v) in &alloc {
        let r = match k.as_str() {
            "cpu" => parse_cpu_milli(v).map(|x| res.cpu_milli = x),
            "memory" => parse_bytes(v).map(|x| res.memory = x),
            RESOURCE_GPU => parse_integer(v).map(|x| gpu_alloc = x),
            "pods" | "ephemeral-storage" => Ok(()),
            k if k.starts_with("hugepages-") => Ok(()),
            k if k.contains('/') => parse_integer(v).map(|x| {
                res.ext.insert(k.to_string(), x);
            }),
            _ => Ok(()),
        };
        if let Err(e) = r {
            warnings.push(format!("{obj}: status.allocatable[{k}]: {e}"));
        }
    }
    let annotations = n.metadata.annotations.clone().unwrap_or_default();
    let mut gpus: Vec<Gpu> = Vec::new();
    if let Some(text) = annotations.get(ANNOTATION_NODE_GPUS) {
        match serde_json::from_str::<Vec<NodeGpu>>(text) {
            Ok(list) => {
                gpus = list
                    .into_iter()
                    .map(|g| Gpu {
                        index: g.index,
                        uuid: g.uuid,
                        model: g.model,
                        memory_mib: g.memory_mib,
                        health: if g.healthy {
                            GpuHealth::Healthy
                        } else {
                            GpuHealth::Unhealthy
                        },
                        topo: GpuTopo {
                            nvlink: g.nvlink,
                            pcie_switch: g.pcie_switch,
                            numa: g.numa,
                        },
                        mig: Vec::new(),
                    })
                    .collect();
                gpus.sort_by_key(|g| g.index);
                gpus.dedup_by_key(|g| g.index);
                if gpus.len() as u64 > MAX_NODE_GPUS {
                    warnings.push(format!(
                        "{obj}: annotation {ANNOTATION_NODE_GPUS} lists {} GPUs, more than the {MAX_NODE_GPUS} per node gpusched supports; only the first {MAX_NODE_GPUS} are used",
                        gpus.len()
                    ));
                    gpus.truncate(MAX_NODE_GPUS as usize);
                }
            }
            Err(e) => warnings.push(format!(
                "{obj}: annotation {ANNOTATION_NODE_GPUS}: {e}; using nvidia.com/gpu and GFD labels"
            )),
        }
    }
    if gpus.is_empty() && gpu_alloc > 0 {
        let model = labels.get(GFD_PRODUCT).cloned().unwrap_or_default();
        let memory_mib = match labels.get(GFD_MEMORY) {
            // GFD writes MiB as a plain number
            Some(m) => m
                .parse::<u64>()
                .or_else(|_| parse_mib(m))
                .unwrap_or_else(|_| {
                    warnings.push(format!(
                        "{obj}: label {GFD_MEMORY}: {m:?} is not a MiB count"
                    ));
                    0
                }),
            None => 0,
        };
        if gpu_alloc > MAX_NODE_GPUS {
            warnings.push(format!(
                "{obj}: {RESOURCE_GPU} allocatable {gpu_alloc} is more than the {MAX_NODE_GPUS} GPUs per node gpusched supports; only {MAX_NODE_GPUS} are used"
            ));
        }
        let count = gpu_alloc.min(MAX_NODE_GPUS) as u32;
        gpus = (0..count)
            .map(|i| Gpu {
                index: i,
                uuid: synthetic_uuid(&name, i),
                model: model.clone(),
                memory_mib,
                health: GpuHealth::Healthy,
                topo: GpuTopo::default(),
                mig: Vec::new(),
            })
            .collect();
    }
    let mut sharing = None;
    if let Some(text) = annotations.get(gpusched_model::sharing::ANNOTATION_NODE_SHARING) {
        match gpusched_model::sharing::NodeSharing::parse(text) {
            Ok(s) => sharing = Some(s),
            Err(e) => warnings.push(format!(
                "{obj}: {e}; its time-sliced resources are not placed as shares"
            )),
        }
    }
    // GPUs in MIG mode: their instances, as the agent publishes them; the
    // kubelet's `nvidia.com/gpu` counts MIG devices under `single`, so
    // those are not whole GPUs
    let mut mig_as_gpu = 0u64;
    if let Some(s) = &sharing {
        for mg in &s.mig {
            let Some(g) = gpus.iter_mut().find(|g| g.index == mg.index) else {
                warnings.push(format!(
                    "{obj}: annotation {}: MIG GPU {} is not among the node's GPUs; its instances are not placed",
                    gpusched_model::sharing::ANNOTATION_NODE_SHARING,
                    mg.index
                ));
                continue;
            };
            g.mig = mg
                .instances
                .iter()
                .map(|m| gpusched_model::MigSlot {
                    id: m.id.clone(),
                    profile: m.profile.clone(),
                    resource: m.resource.clone(),
                    milli: m.milli(),
                })
                .collect();
            mig_as_gpu += mg
                .instances
                .iter()
                .filter(|m| m.resource == RESOURCE_GPU)
                .count() as u64;
        }
    }
    // each MIG resource: GPUs beyond what the kubelet offers (not yet
    // registered, or unhealthy instances) are not allocatable, highest
    // index first
    let mig_resources: BTreeSet<String> = gpus
        .iter()
        .flat_map(|g| g.mig.iter().map(|m| m.resource.clone()))
        .collect();
    for r in &mig_resources {
        let offered = if r == RESOURCE_GPU {
            gpu_alloc
        } else {
            res.ext_get(r)
        };
        let of_r = |g: &Gpu| g.mig.iter().filter(|m| &m.resource == r).count() as u64;
        let mut listed: u64 = gpus.iter().filter(|g| g.is_healthy()).map(of_r).sum();
        for g in gpus.iter_mut().rev() {
            if listed <= offered {
                break;
            }
            let k = of_r(g);
            if k > 0 && g.is_healthy() {
                g.health = GpuHealth::NotAllocatable;
                listed -= k;
            }
        }
    }
    gpu_alloc = gpu_alloc.saturating_sub(mig_as_gpu);
    // GPUs time-sliced (under their own name or renamed): the kubelet
    // counts replicas, N per GPU, of the advertised name
    if let Some(s) = &sharing {
        let sliced = s
            .time_slicing
            .iter()
            .filter(|t| t.of == RESOURCE_GPU)
            .map(|t| {
                let have = if t.resource == RESOURCE_GPU {
                    gpu_alloc
                } else {
                    res.ext_get(&t.resource)
                };
                have / u64::from(t.replicas.max(1))
            })
            .max();
        if let Some(m) = sliced {
            gpu_alloc = m;
        }
    }
    // The kubelet's allocatable count is the truth of what it will hand out:
    // mark healthy GPUs beyond it not allocatable, highest index first (for
    // ~10 s after an agent starts its GPUs are published before the
    // kubelet's allocatable: they are not "unhealthy").
    let mut healthy = gpus
        .iter()
        .filter(|g| g.is_healthy() && !g.is_mig())
        .count() as u64;
    for g in gpus.iter_mut().rev() {
        if healthy <= gpu_alloc {
            break;
        }
        if g.is_healthy() && !g.is_mig() {
            g.health = GpuHealth::NotAllocatable;
            healthy -= 1;
        }
    }
    let mut taints = Vec::new();
    for t in n
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
    {
        let effect = match t.effect.as_str() {
            "NoSchedule" => TaintEffect::NoSchedule,
            "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
            "NoExecute" => TaintEffect::NoExecute,
            other => {
                warnings.push(format!(
                    "{obj}: spec.taints[{}]: unknown effect {other:?}",
                    t.key
                ));
                continue;
            }
        };
        taints.push(Taint {
            key: t.key.clone(),
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    let mut allocations = BTreeMap::new();
    if let Some(text) = annotations.get(gpusched_model::protocol::ANNOTATION_NODE_ALLOCATIONS) {
        match gpusched_model::protocol::NodeAllocations::parse(text) {
            Ok(a) => {
                for p in a.pods {
                    allocations.insert(p.uid.clone(), p);
                }
            }
            Err(e) => warnings.push(format!("{obj}: {e}; using the pods' decisions")),
        }
    }
    let ready = node_ready(n);
    let mut mnode = MNode::new(name, res, gpus);
    mnode.labels = labels;
    mnode.taints = taints;
    // renamed replicas: the kubelet offers no whole GPU here
    mnode.replicas_only = sharing.as_ref().is_some_and(|s| {
        s.time_slicing
            .iter()
            .any(|t| t.of == RESOURCE_GPU && t.resource != RESOURCE_GPU)
    });
    mnode.unschedulable = n
        .spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
        || !ready;
    NodeView {
        node: mnode,
        ready,
        warnings,
        allocations,
        sharing,
    }
}

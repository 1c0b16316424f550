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

/// Where a pod stands for the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PodKind {
    /// Ours, waiting for a node.
    Pending {
        /// The pod in the core's vocabulary.
        pod: MPod,
        /// `status.nominatedNodeName`.
        nominated: Option<String>,
    },
    /// Ours, held back by `spec.schedulingGates`.
    Gated {
        /// Names of the gates still present.
        gates: Vec<String>,
    },
    /// Ours, but its spec cannot be scheduled (bad GPU request, …).
    Invalid {
        /// What is wrong, naming the field.
        error: String,
    },
    /// On a node (any scheduler's), holding resources.
    Bound {
        /// The pod in the core's vocabulary (queue "" for pods of other
        /// schedulers without a queue label).
        pod: MPod,
        /// `spec.nodeName`.
        node: String,
        /// The recorded GPU decision, when gpusched placed it.
        decision: Option<Result<GpuDecision, DecisionError>>,
        /// Being deleted (still holds resources until gone).
        terminating: bool,
    },
    /// Finished, or not ours and not on a node: holds nothing.
    Ignored,
}

/// A pod, translated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodView {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `spec.schedulerName` is ours.
    pub ours: bool,
    /// Pod group (`namespace/name`), from our label or scheduler-plugins'.
    pub group: Option<String>,
    /// The Job that owns it (`batch.kubernetes.io/job-name`), for gangs
    /// made from Jobs.
    pub job: Option<String>,
    /// Queue label, if any.
    pub queue_label: Option<String>,
    /// `spec.preemptionPolicy: Never`.
    pub never_preempts: bool,
    /// Milliseconds since the Unix epoch of `metadata.creationTimestamp`.
    pub created_ms: u64,
    /// Milliseconds since the Unix epoch the pod has been bound since: its
    /// `PodScheduled=True` condition's transition time, else
    /// `status.startTime`, else its creation (a victim's minimum runtime
    /// counts from here).
    pub bound_ms: u64,
    /// `status.phase` is Running.
    pub running: bool,
    /// `metadata.labels` (for PodDisruptionBudget selectors).
    pub labels: BTreeMap<String, String>,
    /// The ResourceClaims it references (`spec.resourceClaims`), which
    /// gpusched allocates before binding it ([`crate::dra`]).
    pub claims: Vec<crate::dra::PodClaim>,
    /// The domain-qualified resources its containers ask, which a
    /// DeviceClass may map to DRA devices (KEP-5004,
    /// [`crate::dra::extended`]).
    pub extended: Vec<crate::dra::extended::Asked>,
    /// What to do with it.
    pub kind: PodKind,
}

fn container_resources(c: &Container) -> ContainerResources {
    let r = c.resources.as_ref();
    ContainerResources {
        name: c.name.clone(),
        requests: quantity_map(r.and_then(|r| r.requests.as_ref())),
        limits: quantity_map(r.and_then(|r| r.limits.as_ref())),
    }
}

fn max_into(acc: &mut ResourceVec, o: &ResourceVec) {
    acc.cpu_milli = acc.cpu_milli.max(o.cpu_milli);
    acc.memory = acc.memory.max(o.memory);
    for (k, v) in &o.ext {
        let e = acc.ext.entry(k.clone()).or_insert(0);
        *e = (*e).max(*v);
    }
}

/// Effective requests of a pod, the way the kubelet and kube-scheduler count
/// them: the sum over app containers and restartable init containers
/// (sidecars), or the largest plain init container if that is more, plus
/// `spec.overhead`. GPU requests follow the same rule.
pub fn effective_resources(p: &Pod) -> Result<(ResourceVec, GpuRequest), ResourceError> {
    let spec = p.spec.as_ref();
    let mut app: Vec<ContainerResources> = spec
        .map(|s| s.containers.iter().map(container_resources).collect())
        .unwrap_or_default();
    let mut init_max = ResourceVec::default();
    let mut init_gpu = GpuRequest::None;
    for c in spec
        .and_then(|s| s.init_containers.as_ref())
        .into_iter()
        .flatten()
    {
        if c.restart_policy.as_deref() == Some("Always") {
            app.push(container_resources(c));
            continue;
        }
        let (r, g) = pod_resources(std::slice::from_ref(&container_resources(c)))?;
        max_into(&mut init_max, &r);
        if g.milli() > init_gpu.milli() {
            init_gpu = g;
        }
    }
    let (mut total, mut gpu) = pod_resources(&app)?;
    max_into(&mut total, &init_max);
    if init_gpu.milli() > gpu.milli() {
        gpu = init_gpu;
    }
    if let Some(o) = spec.and_then(|s| s.overhead.as_ref()) {
        let oc = ContainerResources {
            name: "overhead".into(),
            requests: quantity_map(Some(o)),
            limits: BTreeMap::new(),
        };
        let (r, _) = pod_resources(&[oc])?;
        total.cpu_milli += r.cpu_milli;
        total.memory += r.memory;
    }
    Ok((total, gpu))
}

fn unix_ms(t: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> u64 {
    t.map(|t| t.0.as_millisecond().max(0) as u64).unwrap_or(0)
}

fn node_terms(p: &Pod, obj: &str) -> Result<Vec<NodeSelectorTerm>, TranslateError> {
    let Some(req) = p
        .spec
        .as_ref()
        .and_then(|s| s.affinity.as_ref())
        .and_then(|a| a.node_affinity.as_ref())
        .and_then(|a| {
            a.required_during_scheduling_ignored_during_execution
                .as_ref()
        })
    else {
        return Ok(Vec::new());
    };
    let mut terms = Vec::new();
    for (i, t) in req.node_selector_terms.iter().enumerate() {
        terms.push(crate::podapi::node_term(
            t,
            obj,
            &format!(
                "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[{i}]"
            ),
        )?);
    }
    Ok(terms)
}

fn tolerations(p: &Pod, obj: &str) -> Result<Vec<Toleration>, TranslateError> {
    let mut out = Vec::new();
    for (i, t) in p
        .spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .into_iter()
        .flatten()
        .enumerate()
    {
        let operator = match t.operator.as_deref() {
            None | Some("Equal") => TolerationOp::Equal,
            Some("Exists") => TolerationOp::Exists,
            Some(other) => {
                return Err(field_err(
                    obj,
                    &format!("spec.tolerations[{i}].operator"),
                    format!("unknown operator {other:?}"),
                ));
            }
        };
        let effect = match t.effect.as_deref() {
            None | Some("") => None,
            Some("NoSchedule") => Some(TaintEffect::NoSchedule),
            Some("PreferNoSchedule") => Some(TaintEffect::PreferNoSchedule),
            Some("NoExecute") => Some(TaintEffect::NoExecute),
            Some(other) => {
                return Err(field_err(
                    obj,
                    &format!("spec.tolerations[{i}].effect"),
                    format!("unknown effect {other:?}"),
                ));
            }
        };
        out.push(Toleration {
            key: t.key.clone().unwrap_or_default(),
            operator,
            value: t.value.clone().unwrap_or_default(),
            effect,
        });
    }
    Ok(out)
}

/// The core's pod from a Kubernetes pod (its queue is the label's, or
/// [`DEFAULT_QUEUE`]; the caller may replace it with its group's queue).
pub fn model_pod(p: &Pod) -> Result<MPod, TranslateError> {
    let ns = p.metadata.namespace.clone().unwrap_or_default();
    let name = p.metadata.name.clone().unwrap_or_default();
    let obj = format!("pod {ns}/{name}");
    let (requests, gpu) = effective_resources(p).map_err(|source| TranslateError::Resources {
        object: obj.clone(),
        source,
    })?;
    if let GpuRequest::Whole(k) = gpu
        && k > MAX_POD_GPUS
    {
        return Err(field_err(
            &obj,
            &format!("resources.limits[{RESOURCE_GPU}]"),
            format!(
                "{k} GPUs in one pod is more than the {MAX_POD_GPUS} gpusched places in one pod (its decision names every GPU and must fit the {} bytes the node agent accepts); split the job into several pods, e.g. a gang",
                crate::decision::MAX_DECISION_BYTES
            ),
        ));
    }
    if let GpuRequest::Share {
        milli: 0,
        memory_mib,
    } = gpu
        && memory_mib > 0
    {
        // the simulator derives a share's compute from its memory; on a
        // cluster the agent serves shares by gpu-milli tokens, so a pod
        // without them would hold GPU memory nobody counts (docs/protocol.md)
        return Err(field_err(
            &obj,
            &format!("resources.limits[{RESOURCE_GPU_MEMORY_MIB}]"),
            format!(
                "{RESOURCE_GPU_MEMORY_MIB} needs {RESOURCE_GPU_MILLI} of at least 1 in the same pod (a share is a fraction of one GPU's compute, with optional memory)"
            ),
        ));
    }
    let labels = p.metadata.labels.clone().unwrap_or_default();
    let annotations = p.metadata.annotations.clone().unwrap_or_default();
    let spec = p.spec.as_ref();
    let mut pod = MPod::new(
        format!("{ns}/{name}"),
        labels
            .get(LABEL_QUEUE)
            .cloned()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string()),
    );
    pod.group = group_of(p);
    pod.priority = spec.and_then(|s| s.priority).unwrap_or(0);
    pod.requests = requests;
    pod.gpu = gpu;
    pod.node_selector = spec
        .and_then(|s| s.node_selector.clone())
        .unwrap_or_default();
    pod.affinity = node_terms(p, &obj)?;
    pod.tolerations = tolerations(p, &obj)?;
    pod.namespace = ns.clone();
    pod.labels = labels.clone();
    pod.constraints = crate::podapi::constraints(p, &obj)?;
    pod.arrival_ms = unix_ms(p.metadata.creation_timestamp.as_ref());
    if let Some(m) = annotations.get(ANNOTATION_GPU_MODELS) {
        pod.gpu_models = m
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect();
    }
    if let Some(m) = annotations.get(ANNOTATION_MIN_GPU_MEMORY) {
        pod.min_gpu_memory_mib = parse_mib(m).map_err(|e| {
            field_err(
                &obj,
                &format!("metadata.annotations[{ANNOTATION_MIN_GPU_MEMORY}]"),
                e.to_string(),
            )
        })?;
    }
    pod.preemptible = annotations.get(ANNOTATION_PREEMPTIBLE).map(String::as_str) != Some("false");
    pod.may_evict = spec.and_then(|s| s.preemption_policy.as_deref()) != Some("Never");
    pod.movable = movable(&labels, &annotations, &obj)?;
    Ok(pod)
}

/// Whether the pod opted in to consolidation moves: the label or the
/// annotation [`LABEL_MOVABLE`] says `"true"` (either is enough; a value
/// other than `"true"`/`"false"` is an error naming where it is).
fn movable(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
    obj: &str,
) -> Result<bool, TranslateError> {
    let mut yes = false;
    for (where_, map) in [("labels", labels), ("annotations", annotations)] {
        if let Some(v) = map.get(LABEL_MOVABLE) {
            yes |= parse_flag(v).map_err(|e| {
                field_err(
                    obj,
                    &format!("metadata.{where_}[{LABEL_MOVABLE}]"),
                    e.to_string(),
                )
            })?;
        }
    }
    Ok(yes)
}

/// The pod group a pod belongs to (`namespace/name`): our label first, then
/// the scheduler-plugins label.
pub fn group_of(p: &Pod) -> Option<String> {
    let labels = p.metadata.labels.as_ref()?;
    let ns = p.metadata.namespace.as_deref().unwrap_or_default();
    labels
        .get(LABEL_POD_GROUP)
        .or_else(|| labels.get(LABEL_SP_POD_GROUP))
        .filter(|g| !g.is_empty())
        .map(|g| format!("{ns}/{g}"))
}

/// Pod → where it stands for the scheduler named [`SCHEDULER_NAME`].
pub fn pod(p: &Pod) -> PodView {
    pod_for(p, &[SCHEDULER_NAME])
}

/// Pod → where it stands for a scheduler answering to `scheduler_names`
/// (`--scheduler-name`): a pod whose `spec.schedulerName` is one of them is
/// ours.
pub fn pod_for<S: AsRef<str>>(p: &Pod, scheduler_names: &[S]) -> PodView {
    let meta = &p.metadata;
    let spec = p.spec.as_ref();
    let ours = spec
        .and_then(|s| s.scheduler_name.as_deref())
        .is_some_and(|n| scheduler_names.iter().any(|s| s.as_ref() == n));
    let phase = p
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("Pending");
    let node_name = spec
        .and_then(|s| s.node_name.clone())
        .filter(|n| !n.is_empty());
    let terminating = meta.deletion_timestamp.is_some();
    let labels = meta.labels.clone().unwrap_or_default();
    let mut view = PodView {
        uid: meta.uid.clone().unwrap_or_default(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        ours,
        group: group_of(p),
        job: labels.get(LABEL_JOB_NAME).cloned(),
        queue_label: labels.get(LABEL_QUEUE).cloned(),
        never_preempts: spec.and_then(|s| s.preemption_policy.as_deref()) == Some("Never"),
        created_ms: unix_ms(meta.creation_timestamp.as_ref()),
        bound_ms: bound_since(p),
        running: phase == "Running",
        labels: labels.clone(),
        claims: crate::dra::translate::pod_claims(p),
        extended: crate::dra::extended::asked(p),
        kind: PodKind::Ignored,
    };
    if phase == "Succeeded" || phase == "Failed" {
        return view;
    }
    view.kind = match node_name {
        Some(node) => {
            let pod = match model_pod(p) {
                Ok(pod) => pod,
                Err(_) => {
                    // A bound pod still holds what its containers ask; count
                    // its native requests leniently, GPUs by nvidia.com/gpu.
                    let mut pod = MPod::new(format!("{}/{}", view.namespace, view.name), "");
                    pod.gpu = lenient_gpu(p);
                    // other pods' affinity and spread still see it
                    pod.namespace = view.namespace.clone();
                    pod.labels = labels.clone();
                    pod
                }
            };
            let mut pod = pod;
            if !ours && view.queue_label.is_none() {
                pod.queue = String::new();
            }
            if !ours {
                // gpusched never evicts pods it did not place
                pod.preemptible = false;
            }
            let decision = meta
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DECISION))
                .map(|t| GpuDecision::parse(t));
            PodKind::Bound {
                pod,
                node,
                decision,
                terminating,
            }
        }
        None if !ours || terminating => PodKind::Ignored,
        None => {
            let gates: Vec<String> = spec
                .and_then(|s| s.scheduling_gates.as_ref())
                .map(|g| g.iter().map(|g| g.name.clone()).collect())
                .unwrap_or_default();
            if !gates.is_empty() {
                PodKind::Gated { gates }
            } else {
                match model_pod(p) {
                    Ok(pod) => PodKind::Pending {
                        pod,
                        nominated: p
                            .status
                            .as_ref()
                            .and_then(|s| s.nominated_node_name.clone())
                            .filter(|n| !n.is_empty()),
                    },
                    Err(e) => PodKind::Invalid {
                        error: e.to_string(),
                    },
                }
            }
        }
    };
    view
}

/// When a bound pod was bound (Unix ms; see [`PodView::bound_ms`]).
fn bound_since(p: &Pod) -> u64 {
    let status = p.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "True")
        .and_then(|c| c.last_transition_time.as_ref());
    let t = scheduled.or_else(|| status.and_then(|s| s.start_time.as_ref()));
    match t {
        Some(t) => unix_ms(Some(t)),
        None => unix_ms(p.metadata.creation_timestamp.as_ref()),
    }
}

/// GPUs of a bound pod whose spec we refuse (e.g. requests != limits, which
/// the apiserver allows for pods of other schedulers): the largest integer
/// `nvidia.com/gpu` limit or request over its containers.
fn lenient_gpu(p: &Pod) -> GpuRequest {
    let mut n = 0u64;
    for c in p.spec.iter().flat_map(|s| s.containers.iter()) {
        let r = c.resources.as_ref();
        for m in [
            r.and_then(|r| r.limits.as_ref()),
            r.and_then(|r| r.requests.as_ref()),
        ]
        .into_iter()
        .flatten()
        {
            if let Some(q) = m.get(RESOURCE_GPU) {
                n += parse_integer(&q.0).unwrap_or(0);
                break;
            }
        }
    }
    if n == 0 {
        GpuRequest::None
    } else {
        GpuRequest::Whole(n.min(u32::MAX as u64) as u32)
    }
}

fn resource_vec(
    obj: &str,
    field: &str,
    m: &BTreeMap<String, String>,
) -> Result<ResourceVec, TranslateError> {
    let mut r = ResourceVec::default();
    for (k, v) in m {
        let f = || format!("{field}[{k}]");
        let e = |e: gpusched_model::quantity::QuantityError| field_err(obj, &f(), e.to_string());
        match k.as_str() {
            "cpu" => r.cpu_milli = parse_cpu_milli(v).map_err(e)?,
            "memory" => r.memory = parse_bytes(v).map_err(e)?,
            RESOURCE_GPU => {
                r.gpu_milli = parse_integer(v)
                    .map_err(e)?
                    .saturating_mul(gpusched_model::GPU_MILLI)
            }
            gpusched_model::labels::RESOURCE_GPU_MILLI => {
                r.gpu_milli = parse_integer(v).map_err(e)?
            }
            k if k.contains('/') => {
                r.ext.insert(k.to_string(), parse_integer(v).map_err(e)?);
            }
            other => {
                return Err(field_err(
                    obj,
                    &f(),
                    format!(
                        "unknown resource {other:?} (cpu, memory, nvidia.com/gpu or an extended resource)"
                    ),
                ));
            }
        }
    }
    Ok(r)
}

/// A limit caps exactly the resources its map names; the others stay
/// unbounded (a limit of `{nvidia.com/gpu: 4}` leaves CPU and memory free).
fn resource_limit(
    obj: &str,
    field: &str,
    m: &BTreeMap<String, String>,
) -> Result<ResourceLimit, TranslateError> {
    let v = resource_vec(obj, field, m)?;
    let named: Vec<ResourceKind> = m
        .keys()
        .map(|k| ResourceKind::from_resource_name(k))
        .collect();
    Ok(ResourceLimit::named(&v, &named))
}

/// Queue CRD → the core's queue.
pub fn queue(q: &Queue) -> Result<MQueue, TranslateError> {
    let name = q.metadata.name.clone().unwrap_or_default();
    let obj = format!("queue {name}");
    let mut m = MQueue::new(name);
    m.parent = q.spec.parent.clone().filter(|p| !p.is_empty());
    if q.spec.weight == 0 {
        return Err(field_err(&obj, "spec.weight", "must be 1 or more"));
    }
    m.weight = q.spec.weight;
    m.guarantee = resource_vec(&obj, "spec.guaranteed", &q.spec.guaranteed)?;
    for (model, v) in &q.spec.guaranteed_gpus_by_model {
        let n = parse_integer(v).map_err(|e| {
            field_err(
                &obj,
                &format!("spec.guaranteedGpusByModel[{model}]"),
                e.to_string(),
            )
        })?;
        m.gpu_guarantee_by_model
            .insert(model.clone(), n.saturating_mul(gpusched_model::GPU_MILLI));
    }
    m.limit = match &q.spec.limit {
        Some(l) => Some(resource_limit(&obj, "spec.limit", l)?),
        None => None,
    };
    m.can_borrow = q.spec.borrow;
    m.reclaimable = q.spec.reclaimable;
    m.movable = q.spec.movable;
    m.min_runtime_ms = q.spec.min_runtime_seconds.map(|s| s.saturating_mul(1000));
    Ok(m)
}

/// PodGroup CRD → the core's group (`priority` resolved by the caller from
/// the PriorityClass named in the spec; `queue` defaults to
/// [`DEFAULT_QUEUE`] and may be replaced by the members' label).
pub fn group(g: &PodGroup, priority: i32) -> Result<MGroup, TranslateError> {
    let ns = g.metadata.namespace.clone().unwrap_or_default();
    let name = g.metadata.name.clone().unwrap_or_default();
    let obj = format!("podgroup {ns}/{name}");
    if g.spec.min_member == 0 {
        return Err(field_err(&obj, "spec.minMember", "must be 1 or more"));
    }
    Ok(MGroup {
        name: format!("{ns}/{name}"),
        queue: g
            .spec
            .queue
            .clone()
            .unwrap_or_else(|| DEFAULT_QUEUE.to_string()),
        min_member: g.spec.min_member,
        priority,
        topology: g.spec.topology.as_ref().map(|t| TopologyConstraint {
            level: match t.level {
                CrdLevel::Node => TopologyLevel::Node,
                CrdLevel::NvlinkDomain => TopologyLevel::NvlinkDomain,
                CrdLevel::Rack => TopologyLevel::Rack,
                CrdLevel::Block => TopologyLevel::Block,
            },
            required: t.mode == TopologyMode::Required,
        }),
        schedule_timeout_ms: g
            .spec
            .schedule_timeout_seconds
            .map(|s| s.saturating_mul(1000)),
    })
}

/// scheduler-plugins PodGroup → the core's group.
pub fn sp_group(g: &SpPodGroup) -> Result<MGroup, TranslateError> {
    let ns = g.metadata.namespace.clone().unwrap_or_default();
    let name = g.metadata.name.clone().unwrap_or_default();
    let obj = format!("podgroup.scheduling.x-k8s.io {ns}/{name}");
    let min = u32::try_from(g.spec.min_member)
        .ok()
        .filter(|&m| m >= 1)
        .ok_or_else(|| field_err(&obj, "spec.minMember", "must be 1 or more"))?;
    Ok(MGroup {
        name: format!("{ns}/{name}"),
        queue: DEFAULT_QUEUE.to_string(),
        min_member: min,
        priority: 0,
        topology: None,
        schedule_timeout_ms: g
            .spec
            .schedule_timeout_seconds
            .filter(|&s| s > 0)
            .map(|s| s as u64 * 1000),
    })
}

/// What the scheduler needs of a PodDisruptionBudget.
#[derive(Clone, Debug, PartialEq)]
pub struct PdbView {
    /// Namespace it covers.
    pub namespace: String,
    /// `spec.selector` (`None`: selects nothing).
    pub selector: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector>,
    /// `spec.minAvailable`.
    pub min_available: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// `spec.maxUnavailable`.
    pub max_unavailable: Option<k8s_openapi::apimachinery::pkg::util::intstr::IntOrString>,
    /// `status.disruptionsAllowed` when the disruption controller has
    /// observed the current spec.
    pub observed_allowed: Option<i32>,
}

/// PodDisruptionBudget → what the scheduler needs of it.
pub fn pdb(p: &k8s_openapi::api::policy::v1::PodDisruptionBudget) -> PdbView {
    let spec = p.spec.clone().unwrap_or_default();
    let generation = p.metadata.generation.unwrap_or(0);
    let observed_allowed = p.status.as_ref().and_then(|s| {
        (s.observed_generation.unwrap_or(-1) >= generation && generation > 0)
            .then_some(s.disruptions_allowed)
            .flatten()
    });
    PdbView {
        namespace: p.metadata.namespace.clone().unwrap_or_default(),
        selector: spec.selector,
        min_available: spec.min_available,
        max_unavailable: spec.max_unavailable,
        observed_allowed,
    }
}

/// Whether a label selector selects `labels` (an empty selector selects
/// everything; an unknown operator selects nothing).
pub fn selects(
    sel: &k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector,
    labels: &BTreeMap<String, String>,
) -> bool {
    if let Some(m) = &sel.match_labels
        && m.iter().any(|(k, v)| labels.get(k) != Some(v))
    {
        return false;
    }
    sel.match_expressions.iter().flatten().all(|e| {
        let v = labels.get(&e.key);
        let vals = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => v.is_some_and(|v| vals.contains(v)),
            "NotIn" => !v.is_some_and(|v| vals.contains(v)),
            "Exists" => v.is_some(),
            "DoesNotExist" => v.is_none(),
            _ => false,
        }
    })
}

impl PdbView {
    /// Disruptions allowed now: the controller's figure when it is current,
    /// else computed the way the disruption controller does from the pods
    /// it selects (`expected`) and how many of them run (`healthy`).
    pub fn allowed(&self, expected: u32, healthy: u32) -> i64 {
        use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
        if let Some(a) = self.observed_allowed {
            return i64::from(a);
        }
        let scaled = |v: &IntOrString| -> i64 {
            match v {
                IntOrString::Int(i) => i64::from(*i),
                IntOrString::String(s) => {
                    let pct: i64 = s.trim_end_matches('%').parse().unwrap_or(100);
                    (pct * i64::from(expected) + 99) / 100
                }
            }
        };
        let desired = if let Some(m) = &self.min_available {
            scaled(m)
        } else if let Some(m) = &self.max_unavailable {
            i64::from(expected) - scaled(m)
        } else {
            return 1;
        };
        i64::from(healthy) - desired
    }
}

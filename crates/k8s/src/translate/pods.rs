//! Pods: where a pod stands for the scheduler ([`PodKind`]), what it asks
//! ([`effective_resources`]) and the core's pod ([`model_pod`]).

use super::*;

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
    /// On a node with `status.phase` Succeeded or Failed: holds nothing,
    /// unless its node's agent still lists it holding GPUs (the kubelet
    /// shows its devices in use; `status.phase` is anyone's with
    /// pods/status, issue 38).
    Finished {
        /// The pod in the core's vocabulary (not preemptible).
        pod: MPod,
        /// `spec.nodeName`.
        node: String,
    },
    /// Not ours and not on a node (or finished nowhere): holds nothing.
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
    /// Its `gpusched.io/` label and annotation keys gpusched does not know,
    /// each with the nearest known one ([`super::keys::unknown_keys`]).
    pub key_warnings: Vec<String>,
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
        let add = gpusched_model::validate::add_checked;
        total.cpu_milli = add(total.cpu_milli, r.cpu_milli, "overhead", "cpu")?;
        total.memory = add(total.memory, r.memory, "overhead", "memory")?;
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
                format!("{e} (a memory quantity, such as 40Gi or 81920Mi)"),
            )
        })?;
    }
    // an unreadable value (refused while pending, [`closed_values`]) is
    // read on the safe side for a pod already bound: not evicted
    pod.preemptible = annotations
        .get(ANNOTATION_PREEMPTIBLE)
        .is_none_or(|v| v.trim() != "false" && parse_flag(v).is_ok());
    pod.may_evict = spec.and_then(|s| s.preemption_policy.as_deref()) != Some("Never");
    pod.movable = movable(&labels, &annotations, &obj)?;
    Ok(pod)
}

/// The pod's `gpusched.io/` values with a closed vocabulary that
/// [`model_pod`] reads leniently (a pod already bound keeps its place): a
/// pending pod with a value outside it is refused, naming the key, the
/// value and the values accepted, rather than placed as something it did
/// not ask — `gpusched.io/preemptible: "no"` evictable, a pod's own
/// `gpusched.io/gang: "yes"` (a Job template's label) without its gang.
fn closed_values(p: &Pod) -> Result<(), TranslateError> {
    let meta = &p.metadata;
    let obj = format!(
        "pod {}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    );
    let none = BTreeMap::new();
    let labels = meta.labels.as_ref().unwrap_or(&none);
    let annotations = meta.annotations.as_ref().unwrap_or(&none);
    if let Some(v) = annotations.get(ANNOTATION_PREEMPTIBLE) {
        parse_flag(v).map_err(|e| {
            field_err(
                &obj,
                &format!("metadata.annotations[{ANNOTATION_PREEMPTIBLE}]"),
                format!("{e} (\"false\": never evicted)"),
            )
        })?;
    }
    for (where_, map) in [("labels", labels), ("annotations", annotations)] {
        if let Some(v) = map.get(LABEL_GANG) {
            parse_flag(v).map_err(|e| {
                field_err(
                    &obj,
                    &format!("metadata.{where_}[{LABEL_GANG}]"),
                    format!(
                        "{e} (a gang is never placed as independent pods: the pod waits until the value is fixed)"
                    ),
                )
            })?;
        }
    }
    Ok(())
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
        key_warnings: super::keys::unknown_keys(
            &labels,
            meta.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        ),
        kind: PodKind::Ignored,
    };
    let bound_pod = || match model_pod(p) {
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
    if phase == "Succeeded" || phase == "Failed" {
        if let Some(node) = node_name {
            let mut pod = bound_pod();
            pod.preemptible = false;
            if !ours && view.queue_label.is_none() {
                pod.queue = String::new();
            }
            view.kind = PodKind::Finished { pod, node };
        }
        return view;
    }
    view.kind = match node_name {
        Some(node) => {
            let mut pod = bound_pod();
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
                match closed_values(p).and_then(|()| model_pod(p)) {
                    Ok(pod) => PodKind::Pending {
                        pod,
                        nominated: p
                            .status
                            .as_ref()
                            .and_then(|s| s.nominated_node_name.clone())
                            .filter(|n| !n.is_empty()),
                    },
                    // the pod is named wherever this is shown
                    Err(e) => PodKind::Invalid { error: e.detail() },
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

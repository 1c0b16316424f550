//! The checks, pure: [`Facts`] in, [`Report`] out.

use super::{Facts, Finding, Report, Status, Summary, gpus_text};
use crate::world::{Built, Problem};
use gpusched_core::{PodPhase, Scheduler, Verdict};
use gpusched_model::protocol::{
    ANNOTATION_NODE_ALLOCATIONS, ANNOTATION_NODE_GPUS, NodeAllocations, NodeGpu,
};
pub use gpusched_plugins::classify::{PendingClass, classify};
use k8s_openapi::api::core::v1::{Node, Pod};
use std::collections::{BTreeMap, BTreeSet};

/// Label the agent's DaemonSet puts on its pods.
pub const AGENT_POD_LABEL: (&str, &str) = ("app.kubernetes.io/name", "gpusched-agent");
/// A pod deleted this long ago (beyond its grace period) and still there is
/// stuck, and keeps its GPUs counted.
pub const STUCK_TERMINATING_MS: u64 = 5 * 60 * 1000;
/// A pod that fits now but has waited this long is not being scheduled.
pub const FITS_NOW_GRACE_MS: u64 = 60 * 1000;

fn node_name(n: &Node) -> String {
    n.metadata.name.clone().unwrap_or_default()
}

fn quantity(
    m: Option<&BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    k: &str,
) -> Option<u64> {
    m?.get(k)?.0.trim().parse::<u64>().ok()
}

fn annotation<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.annotations.as_ref()?.get(k).map(String::as_str)
}

fn label<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(k).map(String::as_str)
}

/// Whether a node has GPUs: the agent's annotation, GFD labels, or a GPU
/// resource in its capacity.
pub fn is_gpu_node(n: &Node) -> bool {
    annotation(n, ANNOTATION_NODE_GPUS).is_some()
        || label(n, "nvidia.com/gpu.count").is_some()
        || label(n, "nvidia.com/gpu.product").is_some()
        || quantity(
            n.status.as_ref().and_then(|s| s.capacity.as_ref()),
            "nvidia.com/gpu",
        )
        .is_some()
}

fn pod_phase(p: &Pod) -> &str {
    p.status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("")
}

fn pod_key(p: &Pod) -> String {
    format!(
        "{}/{}",
        p.metadata.namespace.as_deref().unwrap_or_default(),
        p.metadata.name.as_deref().unwrap_or_default()
    )
}

fn ts_ms(t: &k8s_openapi::apimachinery::pkg::apis::meta::v1::Time) -> u64 {
    t.0.as_millisecond().max(0) as u64
}

/// Runs every check (`namespace`: only pods of it are reported).
pub fn run(facts: &Facts, scheduler: &mut Scheduler, namespace: Option<&str>) -> Report {
    let world = facts.world();
    let built = world.build();
    let mut findings = Vec::new();
    let mut summary = Summary {
        nodes: facts.nodes.len() as u32,
        ..Summary::default()
    };
    let mut nodes: Vec<&Node> = facts.nodes.iter().collect();
    nodes.sort_by_key(|n| node_name(n));
    let gpu_nodes: Vec<&Node> = nodes.iter().copied().filter(|n| is_gpu_node(n)).collect();
    summary.gpu_nodes = gpu_nodes.len() as u32;
    for n in &built.snapshot.nodes {
        summary.gpus += n.gpus.len() as u32;
        summary.unhealthy_gpus += n.gpus.iter().filter(|g| !g.is_healthy()).count() as u32;
    }
    for p in &built.snapshot.pods {
        if let Some((_, a)) = p.holding() {
            summary.allocated_milli += a.milli();
        }
    }
    if gpu_nodes.is_empty() {
        findings.push(Finding::new(
            "gpu-resources",
            Status::Fail,
            "cluster",
            "no node has GPUs (no gpusched.io/gpus annotation, GFD labels or nvidia.com/gpu capacity)",
            "deploy the gpusched agent DaemonSet on the GPU nodes (deploy/)",
        ));
    }
    for n in &gpu_nodes {
        gpu_resources(n, &mut findings);
    }
    for n in &gpu_nodes {
        agent(n, &facts.pods, &mut findings);
    }
    for n in &nodes {
        node_state(n, is_gpu_node(n), &mut findings);
    }
    pending(
        facts,
        &built,
        scheduler,
        namespace,
        &mut findings,
        &mut summary,
    );
    for n in &gpu_nodes {
        topology(n, &mut findings);
    }
    leaks(facts, &gpu_nodes, namespace, &mut findings, &mut summary);
    config(&built, namespace, &mut findings);
    Report::new(summary, findings)
}

fn gpu_resources(n: &Node, out: &mut Vec<Finding>) {
    let name = node_name(n);
    let subject = format!("node/{name}");
    let st = n.status.as_ref();
    let cap = st.and_then(|s| s.capacity.as_ref());
    let alloc = st.and_then(|s| s.allocatable.as_ref());
    // GPUs time-sliced by the agent (gpusched.io/sharing): the kubelet
    // counts replicas of the advertised name, N per GPU
    let sliced = annotation(n, gpusched_model::sharing::ANNOTATION_NODE_SHARING)
        .and_then(|t| gpusched_model::sharing::NodeSharing::parse(t).ok())
        .and_then(|s| {
            s.time_slicing
                .into_iter()
                .find(|t| t.of == "nvidia.com/gpu")
        });
    let (res, per_gpu) = match &sliced {
        Some(t) => (t.resource.as_str(), u64::from(t.replicas.max(1))),
        None => ("nvidia.com/gpu", 1),
    };
    let gpu_cap = quantity(cap, res);
    let res_alloc = quantity(alloc, res).unwrap_or(0);
    let gpu_alloc = res_alloc / per_gpu;
    let counted = if per_gpu > 1 {
        format!("{res_alloc} {res} allocatable ({gpu_alloc} GPUs × {per_gpu} replicas)")
    } else {
        format!("{gpu_alloc} nvidia.com/gpu allocatable")
    };
    let published: Option<Result<Vec<NodeGpu>, String>> = annotation(n, ANNOTATION_NODE_GPUS)
        .map(|t| serde_json::from_str::<Vec<NodeGpu>>(t).map_err(|e| e.to_string()));
    let before = out.len();
    if gpu_alloc == 0 {
        out.push(Finding::new(
            "gpu-resources",
            Status::Fail,
            &subject,
            format!(
                "no {res} allocatable (capacity {})",
                gpu_cap.map(|c| c.to_string()).unwrap_or_else(|| "absent".into())
            ),
            "the device plugin is not registered with the kubelet, or every GPU is unhealthy: check the gpusched-agent pod on this node and its log",
        ));
    }
    // every GPU-ish resource: capacity vs allocatable
    if let Some(cap) = cap {
        for (k, c) in cap {
            if !(k.starts_with("nvidia.com/") || k.starts_with("gpusched.io/")) {
                continue;
            }
            let a = alloc.and_then(|m| m.get(k)).map(|q| q.0.clone());
            if a.as_deref() != Some(c.0.as_str()) && !(k == res && gpu_alloc == 0) {
                out.push(Finding::new(
                    "gpu-resources",
                    Status::Warn,
                    &subject,
                    format!(
                        "{k}: capacity {} but allocatable {}",
                        c.0,
                        a.unwrap_or_else(|| "absent".into())
                    ),
                    "the kubelet withholds devices the plugin reported Unhealthy (or reserved them): see the unhealthy GPUs below and the agent log",
                ));
            }
        }
    }
    match published {
        Some(Ok(gpus)) => {
            let bad: Vec<String> = gpus
                .iter()
                .filter(|g| !g.healthy)
                .map(|g| format!("GPU {} ({})", g.index, g.uuid))
                .collect();
            if !bad.is_empty() {
                out.push(Finding::new(
                    "gpu-resources",
                    Status::Fail,
                    &subject,
                    format!("the agent reports {} unhealthy: {}", bad.len(), bad.join(", ")),
                    "check XID errors in the agent log and `nvidia-smi -q`; the GPU gets no new pods until the agent sees it healthy again",
                ));
            }
            let healthy = gpus.iter().filter(|g| g.healthy).count() as u64;
            if healthy != gpu_alloc && gpu_alloc > 0 {
                out.push(Finding::new(
                    "gpu-resources",
                    Status::Warn,
                    &subject,
                    format!(
                        "the agent reports {healthy} healthy GPUs but the kubelet has {counted}"
                    ),
                    "the kubelet's count wins: the scheduler takes the extra GPUs as unhealthy; restart the agent if it persists",
                ));
            }
        }
        Some(Err(e)) => out.push(Finding::new(
            "gpu-resources",
            Status::Fail,
            &subject,
            format!("annotation {ANNOTATION_NODE_GPUS} is unreadable: {e}"),
            "the scheduler falls back to nvidia.com/gpu and GFD labels (no topology); check the agent version",
        )),
        None => {}
    }
    if out.len() == before {
        out.push(Finding::new(
            "gpu-resources",
            Status::Ok,
            &subject,
            format!("{counted}, all healthy"),
            "",
        ));
    }
}

fn agent(n: &Node, pods: &[Pod], out: &mut Vec<Finding>) {
    let name = node_name(n);
    let subject = format!("node/{name}");
    let agents: Vec<&Pod> = pods
        .iter()
        .filter(|p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(name.as_str())
                && p.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(AGENT_POD_LABEL.0))
                    .is_some_and(|v| v == AGENT_POD_LABEL.1)
        })
        .collect();
    let registered = quantity(
        n.status.as_ref().and_then(|s| s.allocatable.as_ref()),
        "nvidia.com/gpu",
    )
    .unwrap_or(0)
        > 0;
    let published = annotation(n, ANNOTATION_NODE_GPUS).is_some();
    let version = annotation(n, ANNOTATION_NODE_ALLOCATIONS)
        .and_then(|t| NodeAllocations::parse(t).ok())
        .map(|a| a.agent)
        .filter(|v| !v.is_empty());
    let before = out.len();
    if agents.is_empty() {
        out.push(Finding::new(
            "agent",
            Status::Warn,
            &subject,
            format!(
                "no gpusched-agent pod (label {}={}) on this node{}",
                AGENT_POD_LABEL.0,
                AGENT_POD_LABEL.1,
                if published { " (but the node carries its annotation: another deployment?)" } else { "" }
            ),
            "check the DaemonSet's nodeSelector and tolerations (kubectl -n gpusched-system get ds gpusched-agent)",
        ));
    }
    for p in &agents {
        let key = pod_key(p);
        let statuses = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.clone())
            .unwrap_or_default();
        let restarts: i32 = statuses.iter().map(|c| c.restart_count).sum();
        let ready = !statuses.is_empty() && statuses.iter().all(|c| c.ready);
        if pod_phase(p) != "Running" || !ready {
            out.push(Finding::new(
                "agent",
                Status::Fail,
                &subject,
                format!("agent pod {key} is {} (ready: {ready})", pod_phase(p)),
                format!(
                    "kubectl -n {} describe pod {} ; kubectl logs",
                    p.metadata.namespace.as_deref().unwrap_or_default(),
                    p.metadata.name.as_deref().unwrap_or_default()
                ),
            ));
        }
        if restarts > 0 {
            out.push(Finding::new(
                "agent",
                Status::Warn,
                &subject,
                format!("agent pod {key} restarted {restarts} time(s)"),
                "kubectl logs --previous on the agent pod shows why",
            ));
        }
    }
    if !published {
        out.push(Finding::new(
            "agent",
            Status::Warn,
            &subject,
            format!("no {ANNOTATION_NODE_GPUS} annotation: GPUs come from labels only (no topology, no health)"),
            "run the agent with --node-name (the DaemonSet sets it) and RBAC to patch nodes",
        ));
    } else if !registered {
        out.push(Finding::new(
            "agent",
            Status::Fail,
            &subject,
            "the agent published its GPUs but the kubelet offers none: not registered with the kubelet",
            "check the agent log for registration errors and the kubelet's device-plugins directory",
        ));
    }
    if out.len() == before {
        out.push(Finding::new(
            "agent",
            Status::Ok,
            &subject,
            format!(
                "agent running, registered with the kubelet{}",
                version
                    .map(|v| format!(", version {v}"))
                    .unwrap_or_default()
            ),
            "",
        ));
    }
}

fn node_state(n: &Node, gpu: bool, out: &mut Vec<Finding>) {
    let subject = format!("node/{}", node_name(n));
    let before = out.len();
    let conds = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    if !crate::translate::node_ready(n) {
        out.push(Finding::new(
            "node",
            if gpu { Status::Fail } else { Status::Warn },
            &subject,
            "condition Ready is not True: no new pods",
            "kubectl describe node; check the kubelet",
        ));
    }
    for c in &conds {
        if c.type_ != "Ready" && c.type_.ends_with("Pressure") && c.status == "True" {
            out.push(Finding::new(
                "node",
                Status::Warn,
                &subject,
                format!("{} is True", c.type_),
                "the kubelet may evict pods and the node lifecycle controller taints the node",
            ));
        }
    }
    let spec = n.spec.as_ref();
    if spec.and_then(|s| s.unschedulable).unwrap_or(false) {
        out.push(Finding::new(
            "node",
            Status::Warn,
            &subject,
            "cordoned (spec.unschedulable)",
            "kubectl uncordon when maintenance is over",
        ));
    }
    let taints: Vec<String> = spec
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
        .iter()
        .filter(|t| t.effect != "PreferNoSchedule")
        .map(|t| {
            format!(
                "{}{}:{}",
                t.key,
                t.value
                    .as_ref()
                    .map(|v| format!("={v}"))
                    .unwrap_or_default(),
                t.effect
            )
        })
        .collect();
    if gpu && !taints.is_empty() {
        out.push(Finding::new(
            "node",
            Status::Warn,
            &subject,
            format!("tainted: {}", taints.join(", ")),
            "only pods that tolerate these taints land here",
        ));
    }
    if gpu && out.len() == before {
        out.push(Finding::new(
            "node",
            Status::Ok,
            &subject,
            "Ready, schedulable, no taints",
            "",
        ));
    }
}

fn in_ns(namespace: Option<&str>, ns: &str) -> bool {
    namespace.is_none_or(|n| n == ns)
}

fn pending(
    facts: &Facts,
    built: &Built,
    scheduler: &mut Scheduler,
    namespace: Option<&str>,
    out: &mut Vec<Finding>,
    summary: &mut Summary,
) {
    let cycle = scheduler.cycle(&built.snapshot, facts.now_ms, 1);
    let before = out.len();
    for p in &built.problems {
        let (pod, class, msg) = match p {
            Problem::GatedPod { pod, gates } => (
                pod,
                PendingClass::Gated,
                format!("scheduling gates: {}", gates.join(", ")),
            ),
            Problem::InvalidPod { pod, error } => (pod, PendingClass::InvalidSpec, error.clone()),
            Problem::ClaimsPending {
                pod,
                class,
                message,
            } => (pod, *class, message.clone()),
            _ => continue,
        };
        summary.pending_pods += 1;
        if !in_ns(namespace, &pod.namespace) {
            continue;
        }
        let mut f = Finding::new(
            "pending",
            if class == PendingClass::InvalidSpec {
                Status::Fail
            } else {
                Status::Warn
            },
            format!("pod/{}/{}", pod.namespace, pod.name),
            msg,
            class.hint(),
        );
        f.class = Some(class);
        out.push(f);
    }
    for e in &cycle.explanations {
        let i = e.pod as usize;
        let (Some(r), Some(ps)) = (built.pods.get(i), built.snapshot.pods.get(i)) else {
            continue;
        };
        if !matches!(ps.phase, PodPhase::Pending { .. }) {
            continue;
        }
        summary.pending_pods += 1;
        if !in_ns(namespace, &r.namespace) {
            continue;
        }
        let classes = classify(e, &ps.pod, &built.snapshot);
        let class = classes.first().copied().unwrap_or(PendingClass::FitsNow);
        let status =
            if e.verdict == Verdict::Unresolvable || class == PendingClass::MissingQueueOrGroup {
                Status::Fail
            } else {
                Status::Warn
            };
        let mut msg = e.message();
        if classes.len() > 1 {
            let names: Vec<&str> = classes.iter().map(|c| c.as_str()).collect();
            msg = format!("{msg} [{}]", names.join(", "));
        }
        let mut f = Finding::new(
            "pending",
            status,
            format!("pod/{}/{}", r.namespace, r.name),
            msg,
            class.hint(),
        );
        f.class = Some(class);
        out.push(f);
    }
    // pods the cycle would place now are pending too, but not explained: a
    // scheduler that runs binds them within moments; one that waited long
    // means no scheduler is placing them
    let mut placed = 0;
    for d in &cycle.decisions {
        let gpusched_core::Decision::Bind { pod, node, .. } = d else {
            continue;
        };
        let i = *pod as usize;
        let (Some(r), Some(ps)) = (built.pods.get(i), built.snapshot.pods.get(i)) else {
            continue;
        };
        placed += 1;
        summary.pending_pods += 1;
        let waited = facts.now_ms.saturating_sub(ps.pod.arrival_ms);
        if waited < FITS_NOW_GRACE_MS || !in_ns(namespace, &r.namespace) {
            continue;
        }
        let mut f = Finding::new(
            "pending",
            Status::Warn,
            format!("pod/{}/{}", r.namespace, r.name),
            format!(
                "pending for {} s although it fits now (the scheduler would bind it to {})",
                waited / 1000,
                built
                    .snapshot
                    .nodes
                    .get(*node as usize)
                    .map(|n| n.name.as_str())
                    .unwrap_or("?")
            ),
            PendingClass::FitsNow.hint(),
        );
        f.class = Some(PendingClass::FitsNow);
        out.push(f);
    }
    if out.len() == before {
        out.push(Finding::new(
            "pending",
            Status::Ok,
            "cluster",
            if placed > 0 {
                format!("no pod waits for a reason; {placed} fit now and are placed next cycle")
            } else {
                "no pending pods".to_string()
            },
            "",
        ));
    }
}

fn topology(n: &Node, out: &mut Vec<Finding>) {
    let subject = format!("node/{}", node_name(n));
    let Some(Ok(gpus)) =
        annotation(n, ANNOTATION_NODE_GPUS).map(serde_json::from_str::<Vec<NodeGpu>>)
    else {
        return;
    };
    let mut diffs: Vec<String> = Vec::new();
    let mut cmp = |key: &str, discovered: String| {
        if let Some(l) = label(n, key)
            && l != discovered
        {
            diffs.push(format!("{key}={l} but the agent discovered {discovered}"));
        }
    };
    cmp("nvidia.com/gpu.count", gpus.len().to_string());
    let models: BTreeSet<&str> = gpus.iter().map(|g| g.model.as_str()).collect();
    if models.len() == 1 {
        cmp(
            "nvidia.com/gpu.product",
            models.iter().next().copied().unwrap_or("").to_string(),
        );
    }
    let mems: BTreeSet<u64> = gpus.iter().map(|g| g.memory_mib).collect();
    if mems.len() == 1 {
        cmp(
            "nvidia.com/gpu.memory",
            mems.iter().next().copied().unwrap_or(0).to_string(),
        );
    }
    let distinct = |f: fn(&NodeGpu) -> Option<u32>| {
        gpus.iter()
            .filter_map(f)
            .collect::<BTreeSet<u32>>()
            .len()
            .to_string()
    };
    cmp("gpusched.io/gpu.nvlink-domains", distinct(|g| g.nvlink));
    cmp("gpusched.io/gpu.pcie-switches", distinct(|g| g.pcie_switch));
    cmp("gpusched.io/gpu.numa-nodes", distinct(|g| g.numa));
    if diffs.is_empty() {
        out.push(Finding::new(
            "topology",
            Status::Ok,
            &subject,
            format!(
                "labels agree with the {} discovered GPUs ({} NVLink domain(s), {} PCIe switch(es))",
                gpus.len(),
                distinct(|g| g.nvlink),
                distinct(|g| g.pcie_switch)
            ),
            "",
        ));
    } else {
        out.push(Finding::new(
            "topology",
            Status::Warn,
            &subject,
            diffs.join("; "),
            "labels are stale or set by hand: selectors on them may mislead; the scheduler places by the agent's annotation",
        ));
    }
}

fn leaks(
    facts: &Facts,
    gpu_nodes: &[&Node],
    namespace: Option<&str>,
    out: &mut Vec<Finding>,
    summary: &mut Summary,
) {
    let by_uid: BTreeMap<&str, &Pod> = facts
        .pods
        .iter()
        .filter_map(|p| Some((p.metadata.uid.as_deref()?, p)))
        .collect();
    let before = out.len();
    let mut publishing = 0;
    for n in gpu_nodes {
        let name = node_name(n);
        let Some(text) = annotation(n, ANNOTATION_NODE_ALLOCATIONS) else {
            continue;
        };
        let allocs = match NodeAllocations::parse(text) {
            Ok(a) => a,
            Err(e) => {
                out.push(Finding::new(
                    "leaks",
                    Status::Warn,
                    format!("node/{name}"),
                    e.to_string(),
                    "an agent of another version? the leak check skips this node",
                ));
                continue;
            }
        };
        publishing += 1;
        for a in &allocs.pods {
            let why = match by_uid.get(a.uid.as_str()) {
                None => "no longer exists".to_string(),
                Some(p) if matches!(pod_phase(p), "Succeeded" | "Failed") => {
                    format!("has finished ({})", pod_phase(p))
                }
                Some(p)
                    if p.spec.as_ref().and_then(|s| s.node_name.as_deref())
                        != Some(name.as_str()) =>
                {
                    "is not on this node".to_string()
                }
                Some(_) => continue,
            };
            let milli = a.milli.map(u64::from).unwrap_or(a.gpus.len() as u64 * 1000);
            summary.leaked_milli += milli;
            if !in_ns(namespace, &a.namespace) {
                continue;
            }
            let mut f = Finding::new(
                "leaks",
                Status::Fail,
                format!("node/{name}"),
                format!(
                    "{} GPU(s) [{}] still counted for pod {}/{} (uid {}), which {why}",
                    gpus_text(milli),
                    a.gpus.join(", "),
                    a.namespace,
                    a.name,
                    a.uid
                ),
                "restart the gpusched-agent pod on this node (it rebuilds from the kubelet's PodResources); if the kubelet still lists the pod, the kubelet holds the devices until the pod object is gone",
            );
            f.reclaimable_milli = Some(milli);
            out.push(f);
        }
    }
    // pods stuck terminating keep their GPUs counted by the scheduler
    for p in &facts.pods {
        let Some(del) = &p.metadata.deletion_timestamp else {
            continue;
        };
        let ns = p.metadata.namespace.as_deref().unwrap_or_default();
        let grace = p.metadata.deletion_grace_period_seconds.unwrap_or(0).max(0) as u64 * 1000;
        let since = ts_ms(del);
        if facts.now_ms < since + grace + STUCK_TERMINATING_MS || !in_ns(namespace, ns) {
            continue;
        }
        let gpu = crate::translate::effective_resources(p)
            .map(|(_, g)| g.milli())
            .unwrap_or(0);
        if gpu == 0 || p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            continue;
        }
        let mut f = Finding::new(
            "leaks",
            Status::Warn,
            format!("pod/{}", pod_key(p)),
            format!(
                "deleted {} s ago and still terminating: its {} GPU(s) stay counted",
                (facts.now_ms - since) / 1000,
                gpus_text(gpu)
            ),
            "a finalizer or an unreachable kubelet holds it: check finalizers, or force-delete once the node is known down",
        );
        f.reclaimable_milli = Some(gpu);
        out.push(f);
    }
    if out.len() == before {
        out.push(Finding::new(
            "leaks",
            Status::Ok,
            "cluster",
            if publishing > 0 {
                format!("no GPU held for an exited pod ({publishing} node(s) publish their allocations)")
            } else {
                format!("no node publishes {ANNOTATION_NODE_ALLOCATIONS}; only pods stuck terminating were checked")
            },
            "",
        ));
    }
}

fn config(built: &Built, namespace: Option<&str>, out: &mut Vec<Finding>) {
    let before = out.len();
    for p in &built.problems {
        let f = match p {
            Problem::InvalidQueue { queue, error } => Finding::new(
                "config",
                Status::Fail,
                format!("queue/{queue}"),
                error.clone(),
                "kubectl get queue -o yaml; fix the spec (its Valid condition says the same)",
            ),
            Problem::InvalidGroup { group, error } => Finding::new(
                "config",
                Status::Fail,
                format!("podgroup/{group}"),
                error.clone(),
                "fix the PodGroup's spec",
            ),
            Problem::NodeWarning { node, warning } => Finding::new(
                "config",
                Status::Warn,
                format!("node/{node}"),
                warning.clone(),
                "",
            ),
            Problem::BadDecision { pod, error } if in_ns(namespace, &pod.namespace) => {
                Finding::new(
                    "config",
                    Status::Warn,
                    format!("pod/{}/{}", pod.namespace, pod.name),
                    error.clone(),
                    "its GPUs are assumed to be the lowest free ones; the agent refuses such a decision",
                )
            }
            _ => continue,
        };
        out.push(f);
    }
    if out.len() == before {
        out.push(Finding::new(
            "config",
            Status::Ok,
            "cluster",
            "queues, pod groups and node annotations are readable",
            "",
        ));
    }
}

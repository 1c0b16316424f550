//! The checks of each node: GPU resources and the device plugin, the
//! agent, readiness and cordons, topology labels.

use super::*;

pub(super) fn gpu_resources(n: &Node, out: &mut Vec<Finding>) {
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

pub(super) fn agent(n: &Node, pods: &[Pod], out: &mut Vec<Finding>) {
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
    // a kwok node (the try-out, the e2e cluster) runs no pods: no agent is
    // expected there
    let kwok =
        annotation(n, crate::kwok::KWOK_ANNOTATION.0) == Some(crate::kwok::KWOK_ANNOTATION.1);
    if agents.is_empty() && kwok {
        out.push(Finding::new(
            "agent",
            Status::Ok,
            &subject,
            "a kwok node: no gpusched-agent pod expected (its GPUs are the node's labels and annotations)",
            "",
        ));
    } else if agents.is_empty() {
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

pub(super) fn node_state(n: &Node, gpu: bool, out: &mut Vec<Finding>) {
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

pub(super) fn topology(n: &Node, out: &mut Vec<Finding>) {
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

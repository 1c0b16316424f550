//! The checks of pods: why each pending GPU pod waits (one offline core
//! cycle, the shared classification), and GPUs that leak (allocations the
//! agents publish that no running pod holds, pods stuck terminating).

use super::*;

pub(super) fn pending(
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

pub(super) fn leaks(
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

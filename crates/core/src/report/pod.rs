//! A pod's report ([`pod_report`]): where it stands, where it runs, its
//! queues and gang, and what would make it fit.

use super::queue::queue_state;
use super::*;

fn placement(snap: &Snapshot, node: NodeId, gpus: &GpuAssignment) -> Placement {
    let Some(n) = snap.nodes.get(node as usize) else {
        return Placement {
            node: format!("#{node}"),
            gpus: Vec::new(),
            share: None,
            topology: None,
            mig: Vec::new(),
        };
    };
    let gref = |i: u32| {
        n.gpus.get(i as usize).map(|g| GpuRef {
            index: g.index,
            uuid: g.uuid.clone(),
            model: g.model.clone(),
        })
    };
    match gpus {
        GpuAssignment::None => Placement {
            node: n.name.clone(),
            gpus: Vec::new(),
            share: None,
            topology: None,
            mig: Vec::new(),
        },
        GpuAssignment::Whole(v) => {
            let topos: Vec<_> = n.gpus.iter().map(|g| g.topo).collect();
            let set: Vec<usize> = v
                .iter()
                .map(|&i| i as usize)
                .filter(|&i| i < topos.len())
                .collect();
            Placement {
                node: n.name.clone(),
                gpus: v.iter().filter_map(|&i| gref(i)).collect(),
                share: None,
                topology: (set.len() >= 2).then(|| {
                    let cost = set_cost(&topos, &set);
                    let all: Vec<usize> = (0..topos.len()).collect();
                    let node_best = choose(&topos, &all, &[], set.len())
                        .map_or(cost, |b| set_cost(&topos, &b))
                        .min(cost);
                    TopologyScore {
                        cost,
                        node_best,
                        ideal: ideal_cost(set.len()),
                    }
                }),
                mig: Vec::new(),
            }
        }
        GpuAssignment::Share {
            gpu,
            milli,
            memory_mib,
        } => Placement {
            node: n.name.clone(),
            gpus: gref(*gpu).into_iter().collect(),
            share: Some((*milli, *memory_mib)),
            topology: None,
            mig: Vec::new(),
        },
        GpuAssignment::Mig {
            gpu,
            instances,
            milli,
        } => Placement {
            node: n.name.clone(),
            gpus: gref(*gpu).into_iter().collect(),
            share: Some((*milli, 0)),
            topology: None,
            mig: n
                .gpus
                .get(*gpu as usize)
                .map(|g| {
                    instances
                        .iter()
                        .filter_map(|&i| g.mig.get(i as usize).map(|m| m.id.clone()))
                        .collect()
                })
                .unwrap_or_default(),
        },
    }
}

fn gang_state(view: &CycleView<'_>, group: &str) -> Option<GangState> {
    let snap = view.snapshot;
    let g = snap.groups.iter().find(|g| g.name == group)?;
    let (mut running, mut pending, mut terminating) = (0u32, 0u32, 0u32);
    let mut first_pending: Option<u64> = None;
    for p in &snap.pods {
        if p.pod.group.as_deref() != Some(group) {
            continue;
        }
        match p.phase {
            PodPhase::Running { .. } => running += 1,
            PodPhase::Terminating { .. } => terminating += 1,
            PodPhase::Pending { .. } => {
                pending += 1;
                first_pending =
                    Some(first_pending.map_or(p.pod.arrival_ms, |a: u64| a.min(p.pod.arrival_ms)));
            }
        }
    }
    let phase = view.output.decisions.iter().rev().find_map(|d| match d {
        Decision::Group { group: n, phase } if n == group => Some(*phase),
        _ => None,
    });
    // the cycle's rule: the timeout runs from the first pending member's
    // arrival while fewer than minMember run
    let timeout_left_ms = match (g.schedule_timeout_ms, first_pending) {
        (Some(t), Some(a)) if running < g.min_member => {
            Some(a.saturating_add(t).saturating_sub(view.now_ms))
        }
        _ => None,
    };
    Some(GangState {
        group: g.name.clone(),
        queue: g.queue.clone(),
        min_member: g.min_member,
        running,
        pending,
        terminating,
        phase,
        topology: g.topology,
        timeout_ms: g.schedule_timeout_ms,
        timeout_left_ms,
    })
}

/// The domain of `level` with the most whole GPUs free that `pod` may use
/// (model, memory; ties by name), and how many (milli-GPU).
fn best_domain(
    snap: &Snapshot,
    cs: &ClusterState<'_>,
    level: TopologyLevel,
    pod: &gpusched_model::Pod,
) -> Option<(String, u64)> {
    let mut by: BTreeMap<&str, u64> = BTreeMap::new();
    for (i, n) in snap.nodes.iter().enumerate() {
        if n.unschedulable {
            continue;
        }
        if let Some(d) = level.domain_of(n) {
            let free = cs.free_whole_gpus(pod, i as NodeId).len() as u64;
            *by.entry(d).or_default() += free * GPU_MILLI;
        }
    }
    by.into_iter()
        .max_by(|a, b| a.1.cmp(&b.1).then(b.0.cmp(a.0)))
        .map(|(d, f)| (d.to_string(), f))
}

fn hints(view: &CycleView<'_>, pod: &gpusched_model::Pod, e: &Explanation) -> Vec<Hint> {
    let mut out = Vec::new();
    if e.verdict == Verdict::Unresolvable {
        out.push(Hint::NeverFits);
    }
    for r in e.reasons.iter() {
        match r {
            PendingReason::Nodes(s) => {
                for (nr, _) in &s.counts {
                    let h = match nr {
                        NodeReason::Insufficient(ResourceKind::Gpu) => Hint::FreeGpusOnOneNode {
                            gpus: pod.gpu.whole(),
                            nearest: s.nearest.clone(),
                        },
                        NodeReason::InsufficientGpuShare => Hint::FreeShareOnOneGpu {
                            milli: pod.gpu.milli() as u32,
                            nearest: s.nearest.clone(),
                        },
                        NodeReason::Insufficient(k) => Hint::FreeResource {
                            resource: k.clone(),
                            amount: pod.requests.get(k),
                        },
                        _ => continue,
                    };
                    if e.verdict != Verdict::Unresolvable && !out.contains(&h) {
                        out.push(h);
                    }
                }
            }
            PendingReason::NoTopologyDomain { level, need, .. } => {
                let (cs, _) = ClusterState::from_snapshot(view.snapshot);
                out.push(Hint::FreeGpusInOneDomain {
                    level: *level,
                    gpus: u64::from(*need) * pod.gpu.milli(),
                    best: best_domain(view.snapshot, &cs, *level, pod),
                });
            }
            PendingReason::Quota(v) if v.never() => out.push(Hint::RaiseQuota {
                queue: v.queue.clone(),
                dimension: v.dimension.clone(),
                needs: v.needs,
            }),
            PendingReason::Quota(v) => out.push(Hint::QueueFrees {
                queue: v.queue.clone(),
                dimension: v.dimension.clone(),
                amount: v.would_use.saturating_sub(v.cap),
            }),
            PendingReason::GangIncomplete { group, have, need } => out.push(Hint::MoreMembers {
                group: group.clone(),
                missing: need.saturating_sub(*have),
            }),
            PendingReason::GangShort { group, fit, need } => out.push(Hint::MoreMembersFit {
                group: group.clone(),
                fit: *fit,
                need: *need,
            }),
            PendingReason::QueueMissing { queue }
            | PendingReason::GroupQueueMissing { queue, .. } => out.push(Hint::CreateQueue {
                queue: queue.clone(),
            }),
            PendingReason::GroupMissing { group } => out.push(Hint::CreateGroup {
                group: group.clone(),
            }),
            PendingReason::GangTimedOut { group, .. } => out.push(Hint::Recreate {
                group: group.clone(),
            }),
            PendingReason::VictimsTerminating { node, .. }
            | PendingReason::TerminatingPods { node }
            | PendingReason::PodsMoving { node, .. }
            | PendingReason::Reserved { node } => {
                out.push(Hint::WaitForNode { node: node.clone() })
            }
            // the verdict's NeverFits says it
            PendingReason::GangNeverFits { .. }
            | PendingReason::Nominated
            | PendingReason::SnapshotInconsistent { .. } => {}
        }
    }
    if e.reasons.is_empty() {
        out.push(Hint::FitsNow);
    }
    out
}

/// The report of the pod named `name` (`None`: not in the snapshot).
pub fn pod_report(view: &CycleView<'_>, name: &str) -> Option<PodReport> {
    let snap = view.snapshot;
    let id = snap.pods.iter().position(|p| p.pod.name == name)? as PodId;
    let ps = &snap.pods[id as usize];
    let pod = &ps.pod;
    let group = pod
        .group
        .as_deref()
        .and_then(|g| snap.groups.iter().find(|x| x.name == g));
    let queue = group.map_or(pod.queue.clone(), |g| g.queue.clone());
    let (tree, _) = queue_tree(snap);
    let queues = tree
        .idx(&queue)
        .map(|q| {
            tree.path(q)
                .into_iter()
                .map(|a| queue_state(&tree, a))
                .collect()
        })
        .unwrap_or_default();
    let bind = view.output.decisions.iter().find_map(|d| match d {
        Decision::Bind { pod: p, node, gpus } if *p == id => Some((*node, gpus)),
        _ => None,
    });
    let mut hint_list = Vec::new();
    let status = match (&ps.phase, bind) {
        (
            PodPhase::Running {
                node,
                gpus,
                since_ms,
            },
            _,
        ) => PodStatus::Bound {
            placement: placement(snap, *node, gpus),
            since_ms: *since_ms,
        },
        (PodPhase::Terminating { node, gpus }, _) => PodStatus::Terminating {
            placement: placement(snap, *node, gpus),
        },
        (PodPhase::Pending { .. }, Some((node, gpus))) => PodStatus::Binding {
            placement: placement(snap, node, gpus),
        },
        (PodPhase::Pending { nominated, .. }, None) => {
            let nominated = view
                .output
                .decisions
                .iter()
                .find_map(|d| match d {
                    Decision::Nominate { pod: p, node } if *p == id => Some(*node),
                    _ => None,
                })
                .or(*nominated)
                .and_then(|n| snap.nodes.get(n as usize))
                .map(|n| n.name.clone());
            match view.output.explanations.iter().find(|e| e.pod == id) {
                Some(e) => {
                    hint_list = hints(view, pod, e);
                    let classes = classify::classify(e, pod, snap);
                    let condition = classify::condition_reason(e, &classes).to_string();
                    PodStatus::Pending {
                        verdict: Some(e.verdict),
                        classes,
                        condition: Some(condition),
                        message: e.message(),
                        reasons: e.reasons.to_vec(),
                        evictions: e.evictions.to_vec(),
                        // where its job stands now, computed when asked
                        queue_position: super::index::CycleIndex::new(view).position(id),
                        nominated,
                    }
                }
                None => PodStatus::Pending {
                    verdict: None,
                    classes: Vec::new(),
                    condition: None,
                    message: "not explained by the last cycle".into(),
                    reasons: Vec::new(),
                    evictions: Vec::new(),
                    queue_position: None,
                    nominated,
                },
            }
        }
    };
    Some(PodReport {
        pod: pod.name.clone(),
        queue,
        group: pod.group.clone(),
        priority: group.map_or(pod.priority, |g| g.priority),
        gpu: pod.gpu,
        requests: pod.requests.clone(),
        status,
        queues,
        gang: pod.group.as_deref().and_then(|g| gang_state(view, g)),
        hints: hint_list,
        at_ms: view.now_ms,
    })
}

//! Reports for `gpusched explain`: where one pod or one queue stands after a
//! cycle, and why, as data.
//!
//! [`pod_report`] and [`queue_report`] read a [`CycleView`] (the snapshot a
//! cycle saw, what it decided and explained, and its time) and return
//! serde-serializable values; the scheduler's debug endpoint and the
//! simulator build the same reports from their last cycle. Text comes only
//! from the `Display` impls here and in [`crate::reason`], at the edges.
//!
//! Queue figures (usage, fair share, borrowed) are those of the snapshot,
//! before the cycle's own bindings: the state the cycle decided from.

use crate::decision::{CycleOutput, Decision, Explanation, GroupPhase, QueuePosition, Verdict};
use crate::fairshare::{QueueIdx, QueueTree, schedulable_capacity};
use crate::reason::{
    EvictionAttempt, NearestNode, NodeReason, PendingReason, QueueProblem, level_name,
};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase, Snapshot};
use crate::state::ClusterState;
use gpusched_model::duration::fmt_duration;
use gpusched_model::topology::{ideal_cost, set_cost};
use gpusched_model::{
    GPU_MILLI, GpuRequest, ResourceKind, ResourceLimit, ResourceVec, TopologyConstraint,
    TopologyLevel,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

mod pending;
mod text;
pub use pending::{PendingEntry, PendingList, pending_list};
pub use text::{amount_text, bytes_text, gpus_text};

/// What one cycle saw and produced.
#[derive(Clone, Copy, Debug)]
pub struct CycleView<'a> {
    /// The snapshot the cycle read.
    pub snapshot: &'a Snapshot,
    /// What it decided and explained.
    pub output: &'a CycleOutput,
    /// Its (virtual) time in ms.
    pub now_ms: u64,
}

/// One GPU a pod holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuRef {
    /// Its index on the node (as `nvidia-smi` shows it).
    pub index: u32,
    /// Its UUID.
    pub uuid: String,
    /// Its model.
    pub model: String,
}

/// How well a multi-GPU set is connected: the sum of its pairwise link
/// costs against the best possible for its size (`gpusched_model::topology`;
/// equal means every pair shares an NVLink domain and NUMA node).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TopologyScore {
    /// The set's cost.
    pub cost: u64,
    /// The best cost a set of this size can have.
    pub ideal: u64,
}

/// Where a pod is placed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// The node.
    pub node: String,
    /// The GPUs (one for a share).
    pub gpus: Vec<GpuRef>,
    /// The share of that GPU, for a GPU share: (milli-GPU, MiB).
    pub share: Option<(u32, u64)>,
    /// For two or more whole GPUs.
    pub topology: Option<TopologyScore>,
    /// MIG instances of that GPU (device ids), for MIG instances; `share`
    /// then holds their measure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mig: Vec<String>,
}

/// Where a pod stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum PodStatus {
    /// Bound and holding its resources.
    Bound {
        /// Where.
        placement: Placement,
        /// Since when (ms).
        since_ms: u64,
    },
    /// Placed by the last cycle; the binding is being written.
    Binding {
        /// Where.
        placement: Placement,
    },
    /// Being evicted or deleted; holds its resources until gone.
    Terminating {
        /// Where.
        placement: Placement,
    },
    /// Waiting for a node.
    Pending {
        /// Whether it may fit later (`None`: the last cycle did not explain
        /// it, e.g. it arrived after that cycle).
        verdict: Option<Verdict>,
        /// The explanation as one message (kube-scheduler's words).
        message: String,
        /// The typed reasons behind the message.
        reasons: Vec<PendingReason>,
        /// Preempt and reclaim: skipped or tried, and why nothing was freed.
        evictions: Vec<EvictionAttempt>,
        /// Its job's place in its queue's order.
        queue_position: Option<QueuePosition>,
        /// A node held for it (preemption, reservation).
        nominated: Option<String>,
    },
    /// Not scheduled until its scheduling gates are removed.
    Gated {
        /// The gates present.
        gates: Vec<String>,
    },
    /// Cannot be scheduled as written.
    Invalid {
        /// Why, naming the field.
        error: String,
    },
}

/// A queue's quota and fair-share state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueState {
    /// The queue.
    pub name: String,
    /// Its parent (`None`: under the root).
    pub parent: Option<String>,
    /// Weight among siblings.
    pub weight: u32,
    /// Guarantee (GPU: plain plus per-model).
    pub guarantee: ResourceVec,
    /// Limit, if any (only the dimensions it names are capped).
    pub limit: Option<ResourceLimit>,
    /// Whether it may use more than its guarantee.
    pub can_borrow: bool,
    /// Whether what it borrowed may be reclaimed.
    pub reclaimable: bool,
    /// What its running pods hold (its subtree's).
    pub usage: ResourceVec,
    /// What its pending pods ask for.
    pub pending: ResourceVec,
    /// Its fair share now (deserved).
    pub fair_share: ResourceVec,
    /// Usage above the guarantee, per dimension.
    pub borrowed: ResourceVec,
    /// Usage against fair share, dominant dimension, in ppm (1,000,000 =
    /// exactly its share).
    pub share_ppm: u64,
}

/// A gang's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GangState {
    /// The pod group.
    pub group: String,
    /// Its queue.
    pub queue: String,
    /// Members that must start together.
    pub min_member: u32,
    /// Members running.
    pub running: u32,
    /// Members pending.
    pub pending: u32,
    /// Members terminating.
    pub terminating: u32,
    /// Its phase as the last cycle set it (`None`: unchanged).
    pub phase: Option<GroupPhase>,
    /// Its topology constraint.
    pub topology: Option<TopologyConstraint>,
    /// Its schedule timeout (ms).
    pub timeout_ms: Option<u64>,
    /// Time left before it times out (ms), while it waits.
    pub timeout_left_ms: Option<u64>,
}

/// What would make a pending pod fit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum Hint {
    /// Nothing: it fits now and is placed in a following cycle.
    FitsNow,
    /// `gpus` whole GPUs free on one node that passes its filters.
    FreeGpusOnOneNode {
        /// GPUs it asks.
        gpus: u32,
        /// The node closest now.
        nearest: Option<NearestNode>,
    },
    /// `milli` free on one GPU of a node that passes its filters.
    FreeShareOnOneGpu {
        /// Milli-GPU it asks.
        milli: u32,
        /// The node closest now.
        nearest: Option<NearestNode>,
    },
    /// `amount` of a non-GPU resource free on one node that passes its
    /// filters.
    FreeResource {
        /// The resource.
        resource: ResourceKind,
        /// What it asks.
        amount: u64,
    },
    /// `gpus` whole GPUs free in one topology domain for its gang.
    FreeGpusInOneDomain {
        /// The level.
        level: TopologyLevel,
        /// GPUs the gang's required members ask together.
        gpus: u64,
        /// The domain with the most free GPUs now, and how many.
        best: Option<(String, u64)>,
    },
    /// The job alone asks `needs` of `dimension`, more than the queue's
    /// quota allows: only a larger quota (or a smaller job) helps.
    RaiseQuota {
        /// The queue whose rule blocks it.
        queue: String,
        /// The dimension.
        dimension: ResourceKind,
        /// What the job asks (resource units; milli-GPU for GPUs).
        needs: u64,
    },
    /// The queue must use `amount` less of `dimension` first.
    QueueFrees {
        /// The queue whose rule blocks it.
        queue: String,
        /// The dimension.
        dimension: ResourceKind,
        /// How much less (resource units; milli-GPU for GPUs).
        amount: u64,
    },
    /// `missing` more members of the gang must be created.
    MoreMembers {
        /// The gang.
        group: String,
        /// How many.
        missing: u32,
    },
    /// Room for `need - fit` more of the gang's members at once.
    MoreMembersFit {
        /// The gang.
        group: String,
        /// How many fit now.
        fit: u32,
        /// How many must.
        need: u32,
    },
    /// Create the queue.
    CreateQueue {
        /// The queue.
        queue: String,
    },
    /// Create the pod group.
    CreateGroup {
        /// The group.
        group: String,
    },
    /// Pods leaving `node` (evicted or terminating) free the room.
    WaitForNode {
        /// The node.
        node: String,
    },
    /// The gang timed out; recreate it.
    Recreate {
        /// The gang.
        group: String,
    },
    /// No node that passes its filters could ever hold it: change the
    /// request, selectors or tolerations, or add such nodes.
    NeverFits,
    /// Remove its scheduling gates.
    RemoveGates {
        /// The gates.
        gates: Vec<String>,
    },
    /// Fix the pod's spec.
    FixSpec {
        /// What is wrong.
        error: String,
    },
}

/// A pod's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodReport {
    /// The pod (`namespace/name` on Kubernetes).
    pub pod: String,
    /// Its queue (its gang's, for a gang member).
    pub queue: String,
    /// Its gang.
    pub group: Option<String>,
    /// Its priority.
    pub priority: i32,
    /// Its GPU request.
    pub gpu: GpuRequest,
    /// Its other requests.
    pub requests: ResourceVec,
    /// Where it stands.
    pub status: PodStatus,
    /// Its queue, then the queue's ancestors up to the root.
    pub queues: Vec<QueueState>,
    /// Its gang's state.
    pub gang: Option<GangState>,
    /// What would make it fit (pending pods).
    pub hints: Vec<Hint>,
    /// The time of the cycle the report is from (ms).
    pub at_ms: u64,
}

impl PodReport {
    /// The report of a pod that is not in the snapshot because it is gated
    /// or invalid (the adapter knows; the core never sees such pods).
    pub fn outside(pod: String, queue: String, status: PodStatus, at_ms: u64) -> Self {
        let hints = match &status {
            PodStatus::Gated { gates } => vec![Hint::RemoveGates {
                gates: gates.clone(),
            }],
            PodStatus::Invalid { error } => vec![Hint::FixSpec {
                error: error.clone(),
            }],
            _ => Vec::new(),
        };
        PodReport {
            pod,
            queue,
            group: None,
            priority: 0,
            gpu: GpuRequest::None,
            requests: ResourceVec::default(),
            status,
            queues: Vec::new(),
            gang: None,
            hints,
            at_ms,
        }
    }
}

/// A queue's report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    /// The queue.
    pub queue: QueueState,
    /// Its ancestors, parent first.
    pub ancestors: Vec<QueueState>,
    /// Its children.
    pub children: Vec<String>,
    /// Pods of the queue running (or terminating).
    pub running_pods: u32,
    /// Pods of the queue pending, by the kind of their main reason
    /// ([`PendingReason::label`]; `FitsNow` when none, `NotExplained` when
    /// the cycle did not explain them). The scheduler's debug endpoint and
    /// `gpusched explain queue --from-sim` replace these with the reason
    /// names of `gpusched_plugins::classify` (what the Queue's status shows),
    /// which the core cannot call.
    pub pending_by_reason: BTreeMap<String, u32>,
    /// Problems of the queue tree about this queue.
    pub problems: Vec<QueueProblem>,
    /// The time of the cycle the report is from (ms).
    pub at_ms: u64,
}

/// The queue tree of a snapshot with usage, pending demand and fair shares
/// computed against the schedulable capacity (healthy GPUs of schedulable
/// nodes), as the cycle computes them at its start.
pub fn queue_tree(snap: &Snapshot) -> (QueueTree, Vec<QueueProblem>) {
    let (mut tree, problems) = QueueTree::build(&snap.queues);
    tree.account(snap);
    tree.compute_deserved(&schedulable_capacity(snap));
    (tree, problems)
}

fn queue_state(tree: &QueueTree, q: QueueIdx) -> QueueState {
    let queue = &tree.queues[q];
    let a = &tree.acct[q];
    let over = |u: u64, g: u64| u.saturating_sub(g);
    let mut borrowed = ResourceVec {
        cpu_milli: over(a.usage.cpu_milli, a.guarantee.cpu_milli),
        memory: over(a.usage.memory, a.guarantee.memory),
        gpu_milli: over(a.usage.gpu_milli, a.guarantee.gpu_milli),
        gpu_mem_mib: over(a.usage.gpu_mem_mib, a.guarantee.gpu_mem_mib),
        ..Default::default()
    };
    for (k, v) in &a.usage.ext {
        let b = over(*v, a.guarantee.ext_get(k));
        if b > 0 {
            borrowed.ext.insert(k.clone(), b);
        }
    }
    QueueState {
        name: queue.name.clone(),
        parent: tree.parent[q].map(|p| tree.queues[p].name.clone()),
        weight: queue.weight,
        guarantee: a.guarantee.clone(),
        limit: queue.limit.clone(),
        can_borrow: queue.can_borrow,
        reclaimable: queue.reclaimable,
        usage: a.usage.clone(),
        pending: a.pending.clone(),
        fair_share: a.deserved.clone(),
        borrowed,
        share_ppm: tree.share_ppm(q),
    }
}

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
                topology: (set.len() >= 2).then(|| TopologyScore {
                    cost: set_cost(&topos, &set),
                    ideal: ideal_cost(set.len()),
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
    for r in &e.reasons {
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
            PendingReason::Nominated | PendingReason::SnapshotInconsistent { .. } => {}
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
        (PodPhase::Pending { nominated }, None) => {
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
                    PodStatus::Pending {
                        verdict: Some(e.verdict),
                        message: e.message(),
                        reasons: e.reasons.clone(),
                        evictions: e.evictions.clone(),
                        queue_position: e.queue_position,
                        nominated,
                    }
                }
                None => PodStatus::Pending {
                    verdict: None,
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

/// The report of the queue named `name` (`None`: no such queue).
pub fn queue_report(view: &CycleView<'_>, name: &str) -> Option<QueueReport> {
    let snap = view.snapshot;
    let (tree, problems) = queue_tree(snap);
    let q = tree.idx(name)?;
    let group_queue: BTreeMap<&str, &str> = snap
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.queue.as_str()))
        .collect();
    let queue_of = |p: &gpusched_model::Pod| -> String {
        p.group
            .as_deref()
            .and_then(|g| group_queue.get(g))
            .map_or(p.queue.clone(), |q| q.to_string())
    };
    let explained: BTreeMap<PodId, &Explanation> = view
        .output
        .explanations
        .iter()
        .map(|e| (e.pod, e))
        .collect();
    let bound: Vec<PodId> = view
        .output
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, .. } => Some(*pod),
            _ => None,
        })
        .collect();
    let mut running_pods = 0;
    let mut pending_by_reason: BTreeMap<String, u32> = BTreeMap::new();
    for (i, p) in snap.pods.iter().enumerate() {
        if queue_of(&p.pod) != name {
            continue;
        }
        let id = i as PodId;
        if p.holding().is_some() || bound.contains(&id) {
            running_pods += 1;
            continue;
        }
        let label = match explained.get(&id) {
            Some(e) => e.reasons.last().map_or("FitsNow", |r| r.label()),
            None => "NotExplained",
        };
        *pending_by_reason.entry(label.to_string()).or_default() += 1;
    }
    Some(QueueReport {
        queue: queue_state(&tree, q),
        ancestors: tree.path(q)[1..]
            .iter()
            .map(|&a| queue_state(&tree, a))
            .collect(),
        children: tree.children[q]
            .iter()
            .map(|&c| tree.queues[c].name.clone())
            .collect(),
        running_pods,
        pending_by_reason,
        problems: problems.into_iter().filter(|p| p.queue() == name).collect(),
        at_ms: view.now_ms,
    })
}

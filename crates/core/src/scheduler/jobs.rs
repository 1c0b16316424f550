//! Jobs: pending pods grouped into what is placed together (a pod group,
//! or a lone pod), and their order inside a queue.

use super::cycle::PerPod;
use crate::decision::{CycleOutput, Decision, GroupPhase};
use crate::fairshare::{QueueIdx, QueueTree};
use crate::reason::PendingReason;
use crate::snapshot::{NodeId, PodId, PodPhase, Snapshot};
use gpusched_model::{ResourceVec, TopologyConstraint};
use std::cmp::Reverse;

/// Index of a job in the cycle's job list.
pub(super) type JobId = usize;

#[derive(Debug)]
pub(super) struct Job {
    pub queue: QueueIdx,
    pub priority: i32,
    pub arrival: u64,
    pub name: String,
    pub group: Option<usize>,
    /// Pending pods, in name order.
    pub pods: Vec<PodId>,
    /// How many of `pods` must be placed together (the rest are extras).
    pub need: usize,
    pub topology: Option<TopologyConstraint>,
    /// Nodes nominated for this job in the snapshot (only those still
    /// honoured: `Cycle::new` drops the rest).
    pub nominated: Vec<NodeId>,
    /// What the `need` pods that must start together ask for (summed once
    /// when the job is built).
    pub demand: ResourceVec,
}

/// What the first `need` of `pods` ask for.
fn demand(snap: &Snapshot, pods: &[PodId], need: usize) -> ResourceVec {
    let mut r = ResourceVec::default();
    for &p in &pods[..need.min(pods.len())] {
        r.add(&snap.pods[p as usize].pod.demand());
    }
    r
}

/// The jobs of each queue in the order they are tried: jobs with a
/// nomination first, then priority (high first), arrival, name.
pub(super) fn per_queue_order(jobs: &[Job], n_queues: usize) -> Vec<Vec<JobId>> {
    let mut per_queue: Vec<Vec<JobId>> = vec![Vec::new(); n_queues];
    for (j, job) in jobs.iter().enumerate() {
        per_queue[job.queue].push(j);
    }
    for list in &mut per_queue {
        list.sort_by(|&a, &b| {
            let (x, y) = (&jobs[a], &jobs[b]);
            (
                Reverse(!x.nominated.is_empty()),
                Reverse(x.priority),
                x.arrival,
                &x.name,
            )
                .cmp(&(
                    Reverse(!y.nominated.is_empty()),
                    Reverse(y.priority),
                    y.arrival,
                    &y.name,
                ))
        });
    }
    per_queue
}

/// Groups the snapshot's pending pods into jobs. Pods that cannot form a
/// job (unknown queue or group, gang incomplete or timed out) get their
/// reason in `notes`; group phase changes go to `out`. Each pod's queue
/// is looked up once per cycle (`pod_queue`, beside the tree).
pub(super) fn build_jobs(
    snap: &Snapshot,
    (tree, pod_queue, parked): (&QueueTree, &[Option<QueueIdx>], &[bool]),
    pod_group: &[Option<usize>],
    group_running: &[Vec<PodId>],
    now_ms: u64,
    out: &mut CycleOutput,
    notes: &mut PerPod<PendingReason>,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    let is_parked = |p: PodId| parked.get(p as usize).copied().unwrap_or(false);
    // per group index (visited in index order below)
    let mut group_pending: Vec<Vec<PodId>> = vec![Vec::new(); snap.groups.len()];
    for (i, p) in snap.pods.iter().enumerate() {
        let PodPhase::Pending { nominated, .. } = p.phase else {
            continue;
        };
        let id = i as PodId;
        if is_parked(id) {
            // a parked job is left out of the cycle (crate::engine)
            continue;
        }
        let Some(q) = pod_queue.get(i).copied().flatten() else {
            notes.insert(
                id,
                PendingReason::QueueMissing {
                    queue: p.pod.queue.clone(),
                },
            );
            continue;
        };
        match p.pod.group.as_deref() {
            Some(g) => match pod_group.get(i).copied().flatten() {
                Some(gi) => match group_pending.get_mut(gi) {
                    Some(v) => v.push(id),
                    None => notes.insert(
                        id,
                        PendingReason::GroupMissing {
                            group: g.to_string(),
                        },
                    ),
                },
                None => {
                    notes.insert(
                        id,
                        PendingReason::GroupMissing {
                            group: g.to_string(),
                        },
                    );
                }
            },
            None => jobs.push(Job {
                queue: q,
                priority: p.pod.priority,
                arrival: p.pod.arrival_ms,
                name: p.pod.name.clone(),
                group: None,
                pods: vec![id],
                need: 1,
                topology: None,
                nominated: nominated.into_iter().collect(),
                demand: demand(snap, &[id], 1),
            }),
        }
    }
    for (gi, mut pods) in group_pending.into_iter().enumerate() {
        if pods.is_empty() {
            continue;
        }
        let g = &snap.groups[gi];
        pods.sort_by(|a, b| {
            snap.pods[*a as usize]
                .pod
                .name
                .cmp(&snap.pods[*b as usize].pod.name)
        });
        let running = group_running[gi].len();
        let min = g.min_member as usize;
        let arrival = pods
            .iter()
            .map(|&p| snap.pods[p as usize].pod.arrival_ms)
            .min()
            .unwrap_or(0);
        let Some(q) = tree.idx(&g.queue) else {
            for &p in &pods {
                notes.insert(
                    p,
                    PendingReason::GroupQueueMissing {
                        group: g.name.clone(),
                        queue: g.queue.clone(),
                    },
                );
            }
            continue;
        };
        if running < min {
            if let Some(t) = g.schedule_timeout_ms
                && now_ms >= arrival.saturating_add(t)
            {
                out.decisions.push(Decision::Group {
                    group: g.name.clone(),
                    phase: GroupPhase::TimedOut,
                });
                for &p in &pods {
                    notes.insert(
                        p,
                        PendingReason::GangTimedOut {
                            group: g.name.clone(),
                            after_ms: t,
                        },
                    );
                }
                continue;
            }
            if running + pods.len() < min {
                out.decisions.push(Decision::Group {
                    group: g.name.clone(),
                    phase: GroupPhase::Pending,
                });
                for &p in &pods {
                    notes.insert(
                        p,
                        PendingReason::GangIncomplete {
                            group: g.name.clone(),
                            have: (running + pods.len()) as u32,
                            need: min as u32,
                        },
                    );
                }
                continue;
            }
        }
        let nominated: Vec<NodeId> = pods
            .iter()
            .filter_map(|&p| match snap.pods[p as usize].phase {
                PodPhase::Pending { nominated, .. } => nominated,
                _ => None,
            })
            .collect();
        let need = min.saturating_sub(running);
        jobs.push(Job {
            queue: q,
            priority: g.priority,
            arrival,
            name: g.name.clone(),
            group: Some(gi),
            need,
            demand: demand(snap, &pods, need),
            pods,
            topology: g.topology,
            nominated,
        });
    }
    jobs
}

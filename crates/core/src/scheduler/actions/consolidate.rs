//! Consolidate: a job that allocate could not place, although the
//! cluster's free GPUs would hold it in total, gets room by moving the
//! fewest movable pods (the planner of [`crate::scheduler::moves`]).
//!
//! A pod may be moved for a job only if it opted in (`Pod::movable`, or
//! its queue's `Queue::movable`), has a priority no higher than the job's,
//! is preemptible, runs alone (not in a pod group: moving one member would
//! restart its gang) and is not protected by an exhausted
//! PodDisruptionBudget (moving is optional, so a budget is never broken
//! for it). A job whose pods may not evict (`preemptionPolicy: Never`)
//! moves nothing. All moves of a job are planned in one [`Statement`] and
//! committed together, or not at all: each moved pod is evicted with
//! [`EvictionReason::Moved`] (naming the pod it makes room for and its
//! planned node) and nominated to that node; the job's pods are nominated
//! where room was made. The moved pods keep holding their old place for
//! the rest of the cycle (they are gone only when the runner says so); the
//! job's nodes are held by its nomination, each moved pod's destination
//! where it is free.

use super::Action;
use crate::decision::Decision;
use crate::reason::{EvictionReason, PendingReason};
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::scheduler::moves::{MoveLimits, MoveWorld, plan_all};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase};
use crate::statement::Statement;
use std::collections::BTreeSet;

/// A job id no node is ever reserved for: moved pods go only to free
/// (unreserved) nodes.
const NO_JOB: JobId = JobId::MAX;

/// The consolidate action.
pub(super) struct Consolidate;

impl Action for Consolidate {
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]) {
        if c.unplaced.is_empty() {
            return;
        }
        let any_movable = (0..c.snap.pods.len() as PodId).any(|v| c.opted_in(v));
        if !any_movable || c.opts.max_moves_per_cycle == 0 {
            return;
        }
        c.build_victim_index();
        let mut free: u64 = c.cs.states().iter().map(|s| s.free.gpu_milli).sum();
        // (signature, priority) of single pods whose search failed (nothing
        // committed since): the same search would fail again
        let mut failed: BTreeSet<(usize, i32)> = BTreeSet::new();
        let mut moves = 0u32;
        let unplaced = std::mem::take(&mut c.unplaced);
        for &j in &unplaced {
            if moves >= c.opts.max_moves_per_cycle || c.evictions >= c.opts.max_evictions_per_cycle
            {
                break;
            }
            let job = &jobs[j];
            let count = job.need.min(job.pods.len());
            if count == 0
                || job.pods.iter().any(|&p| c.placed[p as usize])
                || job.pods.iter().any(|&p| !c.pod(p).may_evict)
                || job.topology.is_some_and(|t| t.required) && count > 1
                || c.tree.quota_violation(job.queue, &job.demand).is_some()
            {
                continue;
            }
            // fits the free capacity in total (else moving cannot help)
            let need: u64 = job.pods[..count]
                .iter()
                .map(|&p| c.pod(p).gpu.milli())
                .sum();
            if need == 0 || need > free {
                continue;
            }
            let sig = (count == 1).then(|| (c.sig_of(job.pods[0]), job.priority));
            if sig.is_some_and(|s| failed.contains(&s)) {
                continue;
            }
            if c.wait_for_terminating(j, job, count) {
                continue;
            }
            let budget = (c.opts.max_moves_per_cycle - moves)
                .min(c.opts.max_evictions_per_cycle - c.evictions);
            match c.consolidate_for(j, job, count, budget) {
                Some(n) => {
                    moves += n;
                    free = free.saturating_sub(need);
                    failed.clear();
                }
                None => {
                    if let Some(s) = sig {
                        failed.insert(s);
                    }
                }
            }
        }
        c.unplaced = unplaced;
    }
}

impl<'s> Cycle<'s> {
    /// Whether running pod `v` opted in to being moved (itself or through
    /// its queue) and nothing forbids it in general.
    fn opted_in(&self, v: PodId) -> bool {
        let ps = &self.snap.pods[v as usize];
        matches!(ps.phase, PodPhase::Running { .. })
            && !self.gone[v as usize]
            && ps.pod.preemptible
            && !ps.pod.disruption_budget_exhausted
            && ps.pod.group.is_none()
            && (ps.pod.movable
                || self.pod_queue[v as usize].is_some_and(|q| self.tree.queues[q].movable))
    }

    /// Plans and commits the moves that let the job's `count` pods fit;
    /// returns how many pods were moved.
    fn consolidate_for(&mut self, j: JobId, job: &Job, count: usize, budget: u32) -> Option<u32> {
        let limits = MoveLimits {
            max_moves: self.opts.max_moves_per_job.min(budget),
            max_nodes: self.opts.consolidation_max_nodes,
            max_trials: self.opts.consolidation_max_trials,
        };
        let mut st = Statement::new();
        let mut w = InCycle {
            c: self,
            job,
            j,
            removed: BTreeSet::new(),
        };
        let plans = plan_all(
            &mut w,
            &mut st,
            &job.pods[..count],
            &limits,
            budget,
            |w, p| w.c.best_node(p, w.j, None),
        )?;
        let moved: u32 = plans.iter().map(|p| p.moves.len() as u32).sum();
        if moved == 0 {
            // it fits without moves after all
            self.bind_all(job, st);
            return Some(0);
        }
        // A moved pod holds its old place until it is gone (as a victim
        // does, see evict): the trial is undone, so nothing is bound onto
        // that capacity in this cycle; the job's nodes are held by its
        // nomination. Each moved pod's destination is held for it where it
        // is free now (a chain's destination frees only when the pod
        // there leaves; the nomination holds it from the next cycle).
        self.rollback(&mut st, 0);
        let mut hold = Statement::new();
        for m in plans.iter().flat_map(|p| &p.moves) {
            let _ = self.st_place(&mut hold, m.pod, m.to, m.gpus.clone());
        }
        let _ = hold.commit();
        for plan in &plans {
            let for_pod = self.pod(plan.pod).name.clone();
            for m in &plan.moves {
                self.gone[m.pod as usize] = true;
                self.leaving.push(m.pod);
                self.evictions += 1;
                self.out.stats.evicted += 1;
                self.out.decisions.push(Decision::Evict {
                    pod: m.pod,
                    reason: EvictionReason::Moved {
                        for_pod: for_pod.clone(),
                        to_node: self.snap.nodes[m.to as usize].name.clone(),
                    },
                });
                self.out.decisions.push(Decision::Nominate {
                    pod: m.pod,
                    node: m.to,
                });
            }
        }
        let placements: Vec<(PodId, NodeId)> = plans.iter().map(|p| (p.pod, p.node)).collect();
        self.nominate_for(j, job, placements, |node| PendingReason::PodsMoving {
            moved,
            node,
        });
        Some(moved)
    }
}

/// The cycle seen by the planner while it plans for one job.
struct InCycle<'a, 's> {
    c: &'a mut Cycle<'s>,
    job: &'a Job,
    j: JobId,
    /// Running pods the statement has removed (never moved twice).
    removed: BTreeSet<PodId>,
}

impl MoveWorld for InCycle<'_, '_> {
    fn fit(&mut self, pod: PodId, node: NodeId) -> Option<GpuAssignment> {
        self.c.pre_filter(pod);
        self.c.place_checked(pod, node).map(|pl| pl.gpus)
    }

    fn targets(&mut self, pod: PodId) -> Vec<NodeId> {
        let s = self.c.sig_of(pod);
        let j = self.j;
        let reserved = &self.c.reserved;
        self.c.sigs[s]
            .ok_list
            .iter()
            .copied()
            .filter(|&n| reserved[n as usize].is_none_or(|r| r == j))
            .collect()
    }

    fn movable_on(&self, node: NodeId, _for_pod: PodId) -> Vec<PodId> {
        self.c.on_node[node as usize]
            .iter()
            .copied()
            .filter(|&v| {
                !self.removed.contains(&v)
                    && self.c.pod(v).priority <= self.job.priority
                    && self.c.opted_in(v)
            })
            .collect()
    }

    fn gpu_milli(&self, pod: PodId) -> u64 {
        let ps = &self.c.snap.pods[pod as usize];
        match ps.holding() {
            Some((_, g)) => g.milli(),
            None => ps.pod.gpu.milli(),
        }
    }

    fn free_gpu_milli(&self, node: NodeId) -> u64 {
        self.c.cs.get(node).free.gpu_milli
    }

    fn remove(&mut self, st: &mut Statement, pod: PodId) {
        self.c.st_remove(st, pod);
        self.removed.insert(pod);
    }

    fn place(&mut self, st: &mut Statement, pod: PodId, node: NodeId, gpus: GpuAssignment) -> bool {
        self.c.st_place(st, pod, node, gpus)
    }

    fn rollback(&mut self, st: &mut Statement, checkpoint: usize) {
        self.c.rollback(st, checkpoint);
        self.removed = st.removed_pods().collect();
    }

    fn destination(&mut self, pod: PodId, avoid: NodeId) -> Option<(NodeId, GpuAssignment)> {
        let held = self.c.reserved[avoid as usize];
        self.c.reserved[avoid as usize] = Some(self.j);
        let best = self.c.best_node(pod, NO_JOB, None);
        self.c.reserved[avoid as usize] = held;
        best
    }
}

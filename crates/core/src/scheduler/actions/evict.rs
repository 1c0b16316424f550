//! Evict: preempt (lower priority, same queue) and reclaim (queues above
//! their deserved share, for a queue below it) for jobs allocate could not
//! place. Victims are chosen per node (fewest and lowest-priority, greedy
//! removal then reprieve); a victim in a running gang takes its gang with
//! it. Evictions commit only if the preemptor then fits; its nodes are
//! nominated for it.

use super::Action;
use crate::decision::Decision;
use crate::fairshare::QueueIdx;
use crate::reason::{
    CandidateRejection, EvictionAttempt, EvictionKind, EvictionOutcome, EvictionReason,
    EvictionSkip, PendingReason,
};
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::snapshot::{NodeId, PodId, PodPhase};
use crate::statement::Statement;
use std::cmp::Reverse;
use std::collections::BTreeMap;

/// How much freeing a node costs, lowest first: budget violations, the
/// highest victim priority, the number of victims, then the node id.
type VictimCost = (usize, i32, usize, NodeId);

/// Why candidate nodes were not freed, in the order they are counted and
/// rendered.
const REJECTIONS: [CandidateRejection; 6] = [
    CandidateRejection::ReservedForOtherJob,
    CandidateRejection::NoVictims,
    CandidateRejection::VictimsTooYoung,
    CandidateRejection::NotEnoughGpus,
    CandidateRejection::DoesNotFit,
    CandidateRejection::WouldBreakBudget,
];

/// The preempt or the reclaim action.
pub(super) struct Evict(pub EvictionKind);

impl Action for Evict {
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]) {
        let pass = self.0;
        if !c.unplaced.is_empty() {
            c.build_victim_index();
        }
        let unplaced = std::mem::take(&mut c.unplaced);
        for (i, &j) in unplaced.iter().enumerate() {
            if c.evictions >= c.opts.max_evictions_per_cycle {
                let max = c.opts.max_evictions_per_cycle;
                for &k in &unplaced[i..] {
                    c.note_eviction(pass, k, || {
                        EvictionOutcome::Skipped(EvictionSkip::EvictionLimit { max })
                    });
                }
                break;
            }
            let job = &jobs[j];
            if job.pods.iter().any(|&p| c.placed[p as usize])
                || job.need == 0 && job.group.is_some()
            {
                continue;
            }
            if job
                .pods
                .iter()
                .any(|&p| !c.snap.pods[p as usize].pod.may_evict)
            {
                c.note_eviction(pass, j, || {
                    EvictionOutcome::Skipped(EvictionSkip::PreemptionPolicyNever)
                });
                continue;
            }
            if let Some(q) = c.tree.quota_violation(job.queue, &job.demand) {
                c.note_eviction(pass, j, || {
                    EvictionOutcome::Skipped(EvictionSkip::Quota(q.clone()))
                });
                continue;
            }
            let count = job.need.max(1).min(job.pods.len());
            let shape = c.shape(j, job, count, Some(pass));
            match shape {
                Some(ref s) if c.evict_failed_before(s, j, job) => {}
                Some(s) => {
                    let before = (c.out.decisions.len(), c.evict_notes[j].len());
                    c.try_evict_for(pass, j, job);
                    c.evict_done(s, j, job, before);
                }
                None => c.try_evict_for(pass, j, job),
            }
        }
        c.unplaced = unplaced;
    }
}

/// Whether a running pod may be a victim.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// No: the pass's rules exclude it.
    No,
    /// It would be, but it (or its gang) started less than its queue's
    /// minimum runtime ago.
    TooYoung,
    /// Yes.
    Yes,
}

impl<'s> Cycle<'s> {
    /// Whether running pod `v` may be evicted for `job` by this pass
    /// (`surplus`: what each queue holds above its deserved share, less
    /// what is on its way out; a victim takes its whole unit, so the
    /// unit's GPUs must come out of it).
    #[inline]
    fn victim(
        &self,
        pass: EvictionKind,
        job: &Job,
        v: PodId,
        surplus: &BTreeMap<QueueIdx, u64>,
    ) -> Victim {
        let ps = &self.snap.pods[v as usize];
        if self.gone[v as usize]
            || !ps.pod.preemptible
            || !matches!(ps.phase, PodPhase::Running { .. })
        {
            return Victim::No;
        }
        let Some(vq) = self.pod_queue[v as usize] else {
            return Victim::No;
        };
        let ok = match pass {
            EvictionKind::Preempt => vq == job.queue && ps.pod.priority < job.priority,
            EvictionKind::Reclaim => {
                vq != job.queue
                    && self.tree.queues[vq].reclaimable
                    && surplus.get(&vq).copied().unwrap_or(0) >= self.unit_gpu[v as usize]
            }
            EvictionKind::Consolidate => false,
        };
        if !ok {
            Victim::No
        } else if self.now_ms.saturating_sub(self.unit_since[v as usize]) < self.min_runtime[vq] {
            Victim::TooYoung
        } else {
            Victim::Yes
        }
    }

    /// Evicts for `job` if that makes it fit (all its `need` pods).
    fn try_evict_for(&mut self, pass: EvictionKind, j: JobId, job: &Job) {
        let reason = match pass {
            EvictionKind::Preempt => EvictionReason::Preempted {
                by: job.name.clone(),
                priority: job.priority,
            },
            EvictionKind::Reclaim => EvictionReason::Reclaimed {
                for_queue: self.tree.queues[job.queue].name.clone(),
            },
            // moves have their own action (consolidate)
            EvictionKind::Consolidate => return,
        };
        if job.topology.is_some_and(|t| t.required) && job.need > 1 {
            // victims for domain-bound gangs: not attempted (documented)
            self.note_eviction(pass, j, || {
                EvictionOutcome::Skipped(EvictionSkip::RequiredTopology)
            });
            return;
        }
        // reclaim only for queues below what they deserve
        let mut surplus: BTreeMap<QueueIdx, u64> = BTreeMap::new();
        if pass == EvictionKind::Reclaim {
            let a = &self.tree.acct[job.queue];
            let after = a.usage.gpu_milli + job.demand.gpu_milli;
            let deserved = a.deserved.gpu_milli.max(a.guarantee.gpu_milli);
            if after > deserved {
                let queue = self.tree.queues[job.queue].name.clone();
                self.note_eviction(pass, j, || {
                    EvictionOutcome::Skipped(EvictionSkip::NotBelowDeservedShare {
                        queue: queue.clone(),
                        would_use: after,
                        deserved,
                    })
                });
                return;
            }
            // what a queue's terminating pods hold is already leaving it
            // (counted again, it would be reclaimed twice)
            for q in 0..self.tree.queues.len() {
                let s = self.tree.gpu_surplus(q).saturating_sub(self.leaving_gpu[q]);
                if s > 0 {
                    surplus.insert(q, s);
                }
            }
        }
        let count = job.need.max(1).min(job.pods.len());
        if self.wait_for_terminating(j, job, count) {
            return;
        }
        let mut st = Statement::new();
        let mut victims: Vec<PodId> = Vec::new();
        let mut placements: Vec<(PodId, NodeId)> = Vec::new();
        for &p in &job.pods[..count] {
            if let Some((n, g)) = self.best_node(p, j, None)
                && self.st_place(&mut st, p, n, g)
            {
                placements.push((p, n));
                continue;
            }
            // find the cheapest node to free (the victims' removal updates
            // the constraint states, so a node blocked by a victim's
            // anti-affinity becomes a candidate)
            self.pre_filter(p);
            let s = self.sig_of(p);
            let pod = self.pod(p);
            let mut best: Option<(VictimCost, Vec<PodId>)> = None;
            let cands = self.sigs[s].ok_list.clone();
            // why candidate nodes were not used, for the explanation
            // (indexed like REJECTIONS; counting is all the hot loop does)
            let mut rejected = [0u32; REJECTIONS.len()];
            // when the first victim that is merely too young on a node
            // refused for that reaches its minimum runtime
            let mut young_until: Option<u64> = None;
            // candidate victims on one node (reused: this loop is hot)
            let mut vs: Vec<PodId> = Vec::new();
            for &n in &cands {
                if self.reserved[n as usize].is_some_and(|r| r != j) {
                    rejected[0] += 1;
                    continue;
                }
                vs.clear();
                // victims but for their minimum runtime: how many, what GPU
                let (mut young, mut young_gpu) = (0u32, 0u64);
                let mut young_end = u64::MAX;
                for &v in &self.on_node[n as usize] {
                    match self.victim(pass, job, v, &surplus) {
                        Victim::Yes => vs.push(v),
                        Victim::TooYoung => {
                            young += 1;
                            young_gpu += self.pod(v).gpu.milli();
                            let vq = self.pod_queue[v as usize].unwrap_or_default();
                            young_end = young_end.min(
                                self.unit_since[v as usize].saturating_add(self.min_runtime[vq]),
                            );
                        }
                        Victim::No => {}
                    }
                }
                if vs.is_empty() && young == 0 {
                    rejected[1] += 1;
                    continue;
                }
                // quick bound: even all victims gone (the young ones too),
                // not enough GPU
                let free = self.cs.get(n).free.gpu_milli
                    + young_gpu
                    + vs.iter().map(|&v| self.pod(v).gpu.milli()).sum::<u64>();
                if free < pod.gpu.milli() {
                    rejected[3] += 1;
                    continue;
                }
                if vs.is_empty() {
                    rejected[2] += 1;
                    young_until = Some(young_until.map_or(young_end, |u| u.min(young_end)));
                    continue;
                }
                vs.sort_by_key(|&v| {
                    let ps = &self.snap.pods[v as usize];
                    let since = match ps.phase {
                        PodPhase::Running { since_ms, .. } => since_ms,
                        _ => 0,
                    };
                    (
                        ps.pod.disruption_budget_exhausted,
                        ps.pod.priority,
                        Reverse(since),
                        v,
                    )
                });
                let cp = st.checkpoint();
                let mut removed: Vec<PodId> = Vec::new();
                let mut fits = self.fits_on(p, n);
                // reclaim: what this node's victims take from each queue's
                // surplus (together they may not push it below its share)
                let mut taken: BTreeMap<QueueIdx, u64> = BTreeMap::new();
                for &v in &vs {
                    if fits {
                        break;
                    }
                    if removed.contains(&v) {
                        continue;
                    }
                    if pass == EvictionKind::Reclaim
                        && let Some(vq) = self.pod_queue[v as usize]
                    {
                        let t = taken.entry(vq).or_insert(0);
                        let unit = self.unit_gpu[v as usize];
                        if *t + unit > surplus.get(&vq).copied().unwrap_or(0) {
                            continue;
                        }
                        *t += unit;
                    }
                    for u in self.victim_unit(v) {
                        if !removed.contains(&u) {
                            self.st_remove(&mut st, u);
                            removed.push(u);
                        }
                    }
                    fits = self.fits_on(p, n);
                }
                if fits {
                    // reprieve: give back victims not needed, those a
                    // disruption budget protects first, then highest priority
                    let mut order = removed.clone();
                    order.sort_by_key(|&v| {
                        let p = self.pod(v);
                        (Reverse(p.disruption_budget_exhausted), Reverse(p.priority))
                    });
                    let mut kept = removed.clone();
                    for v in order {
                        if !kept.contains(&v) {
                            continue;
                        }
                        let unit = self.victim_unit(v);
                        let cp2 = st.checkpoint();
                        let mut ok = true;
                        for &u in &unit {
                            if !self.st_restore(&mut st, u) {
                                ok = false;
                                break;
                            }
                        }
                        if ok && self.fits_on(p, n) {
                            kept.retain(|k| !unit.contains(k));
                        } else {
                            self.rollback(&mut st, cp2);
                        }
                    }
                    let maxp = kept
                        .iter()
                        .map(|&v| self.pod(v).priority)
                        .max()
                        .unwrap_or(i32::MIN);
                    // fewest budget violations, then lowest top priority,
                    // then fewest victims (kube-scheduler's order)
                    let violations = kept
                        .iter()
                        .filter(|&&v| self.pod(v).disruption_budget_exhausted)
                        .count();
                    let key = (violations, maxp, kept.len(), n);
                    if best.as_ref().is_none_or(|(k, _)| key < *k) {
                        best = Some((key, kept));
                    }
                } else {
                    rejected[4] += 1;
                }
                self.rollback(&mut st, cp);
            }
            // a disruption budget is broken only as a last resort: while
            // some node's victims are merely too young, wait for them (at
            // most their minimum runtime) instead
            if best
                .as_ref()
                .is_some_and(|((violations, ..), _)| *violations > 0)
                && rejected[2] > 0
            {
                best = None;
                rejected[5] += 1;
            }
            let Some(((_, _, _, n), kept)) = best else {
                self.rollback(&mut st, 0);
                for &v in &victims {
                    self.gone[v as usize] = false;
                }
                let name = pod.name.clone();
                let considered = cands.len() as u32;
                let counts: Vec<(CandidateRejection, u32)> = REJECTIONS
                    .iter()
                    .zip(rejected)
                    .filter(|(_, c)| *c > 0)
                    .map(|(r, c)| (*r, c))
                    .collect();
                let now = self.now_ms;
                let wait_ms = young_until
                    .filter(|&u| u != u64::MAX)
                    .map(|u| u.saturating_sub(now));
                self.note_eviction(pass, j, || EvictionOutcome::NoNode {
                    pod: name.clone(),
                    considered,
                    counts: counts.clone(),
                    wait_ms,
                });
                return;
            };
            let new_victims = victims.len();
            for v in kept {
                if !self.gone[v as usize] {
                    self.st_remove(&mut st, v);
                    self.gone[v as usize] = true;
                    victims.push(v);
                }
            }
            let placed = match self.place_checked(p, n) {
                Some(pl) => self.st_place(&mut st, p, n, pl.gpus),
                None => false,
            };
            match placed {
                true => placements.push((p, n)),
                false => {
                    self.rollback(&mut st, 0);
                    for &v in &victims {
                        self.gone[v as usize] = false;
                    }
                    return;
                }
            }
            if pass == EvictionKind::Reclaim {
                for &v in &victims[new_victims..] {
                    if let Some(vq) = self.tree.idx(&self.pod(v).queue)
                        && let Some(s) = surplus.get_mut(&vq)
                    {
                        *s = s.saturating_sub(self.pod(v).gpu.milli());
                    }
                }
            }
        }
        if victims.is_empty() {
            // it fits without evictions after all, in room nobody holds
            // (evicted pods keep theirs until they are gone)
            self.bind_all(job, st);
            return;
        }
        // commit: evictions + nominations. A victim holds what it holds
        // until it is gone (a runner carries an eviction out over the pod's
        // grace period), so the trial is undone: nothing may be bound onto
        // the victims' capacity in this cycle — not the leftovers on the
        // preemptor's nodes, not a victim gang's other nodes. The
        // preemptor's nodes are held for it by its nomination; the victims
        // count as leaving for the jobs after it (`wait_for_terminating`).
        self.rollback(&mut st, 0);
        self.leaving.extend(victims.iter().copied());
        for &v in &victims {
            self.evictions += 1;
            self.out.stats.evicted += 1;
            let d = self.pod(v).demand();
            if let Some(vq) = self.tree.idx(&self.pod(v).queue) {
                self.tree.sub_usage(vq, &d);
            }
            self.out.decisions.push(Decision::Evict {
                pod: v,
                reason: reason.clone(),
            });
        }
        let victims = victims.len() as u32;
        self.nominate_for(j, job, placements, |node| {
            PendingReason::VictimsTerminating { victims, node }
        });
    }

    /// Records for every pod of `job` what the `pass` came to (for the
    /// explanation of the pods left pending).
    fn note_eviction(
        &mut self,
        pass: EvictionKind,
        j: JobId,
        outcome: impl FnOnce() -> EvictionOutcome,
    ) {
        if let Some(notes) = self.evict_notes.get_mut(j) {
            notes.push(EvictionAttempt {
                kind: pass,
                outcome: outcome(),
            });
        }
    }

    /// Capacity already on its way out: pods that are terminating (evicted
    /// in an earlier cycle, or deleted) and pods evicted earlier in this
    /// cycle still hold their resources until they are gone. If the job
    /// fits once they leave, it waits for them (its nodes reserved and
    /// nominated) instead of evicting more; without this a runner whose
    /// evictions take time (Kubernetes' graceful deletion) would evict
    /// again every cycle until the victims are gone. The trial is rolled
    /// back: their resources stay held this cycle.
    pub(super) fn wait_for_terminating(&mut self, j: JobId, job: &Job, count: usize) -> bool {
        if self.leaving.is_empty() {
            return false;
        }
        let leaving = self.leaving.clone();
        let mut st = Statement::new();
        for &v in &leaving {
            self.st_remove(&mut st, v);
        }
        let mut placements: Vec<(PodId, NodeId)> = Vec::new();
        for &p in &job.pods[..count] {
            let Some((n, g)) = self.best_node(p, j, None) else {
                break;
            };
            if !self.st_place(&mut st, p, n, g) {
                break;
            }
            placements.push((p, n));
        }
        self.rollback(&mut st, 0);
        if placements.len() < count {
            return false;
        }
        self.nominate_for(j, job, placements, |node| PendingReason::TerminatingPods {
            node,
        });
        true
    }

    /// Holds the nodes of `placements` for the job until its pods can bind
    /// there: reserved, counted in its queue, nominated, with `why` naming
    /// the node as the pods' pending reason.
    pub(super) fn nominate_for(
        &mut self,
        j: JobId,
        job: &Job,
        placements: Vec<(PodId, NodeId)>,
        why: impl Fn(String) -> PendingReason,
    ) {
        for (p, n) in placements {
            self.placed[p as usize] = true;
            self.reserve_node(n, j);
            let d = self.pod(p).demand();
            self.tree.add_usage(job.queue, &d);
            self.out
                .decisions
                .push(Decision::Nominate { pod: p, node: n });
            self.notes
                .insert(p, why(self.snap.nodes[n as usize].name.clone()));
        }
    }
}

//! Allocate: admit jobs queue by queue (most under-served first) and place
//! each inside a statement, all-or-nothing for gangs, one topology domain
//! at a time for domain-bound gangs. With backfill, later jobs still try
//! when one does not fit; the head job of a queue that waited past
//! `reserve_after_ms` gets nodes reserved (see [`super::reserve`]).

use super::Action;
use crate::decision::{Decision, GroupPhase};
use crate::fairshare::QueueIdx;
use crate::reason::PendingReason;
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::snapshot::NodeId;
use crate::statement::Statement;
use gpusched_model::TopologyConstraint;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

pub(super) struct Allocate;

impl Action for Allocate {
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]) {
        let opts = c.opts;
        let per_queue = std::mem::take(&mut c.order);
        let mut cursor = vec![0usize; per_queue.len()];
        let mut blocked = vec![false; per_queue.len()];
        // whether a job of the queue already waits for capacity this cycle
        let mut waiting_in_queue = vec![false; per_queue.len()];
        let mut reservations = 0u32;
        // the queues' order keys, as of a decision count (they change only
        // with usage, which changes only with a decision)
        let mut keys: Vec<Vec<u64>> = Vec::new();
        let mut keys_at: Option<usize> = None;
        loop {
            if keys_at != Some(c.out.decisions.len()) {
                keys = (0..per_queue.len()).map(|q| c.tree.order_key(q)).collect();
                keys_at = Some(c.out.decisions.len());
            }
            // most under-served queue with work left
            let mut best: Option<(&Vec<u64>, QueueIdx)> = None;
            for q in 0..per_queue.len() {
                if blocked[q] || cursor[q] >= per_queue[q].len() {
                    continue;
                }
                let key = &keys[q];
                if best.is_none_or(|(k, bq)| (key, q) < (k, bq)) {
                    best = Some((key, q));
                }
            }
            let Some((_, q)) = best else { break };
            let j = per_queue[q][cursor[q]];
            cursor[q] += 1;
            let job = &jobs[j];
            // a parked job of this queue comes first (it waits, as it would
            // have when tried): this one is not the queue's head, and
            // without backfill the queue waits behind it
            if !waiting_in_queue[q]
                && job.nominated.is_empty()
                && c.parked_first[q].as_ref().is_some_and(|k| {
                    (k.0, k.1, k.2.as_str())
                        < (Reverse(job.priority), job.arrival, job.name.as_str())
                })
            {
                waiting_in_queue[q] = true;
                if !opts.backfill {
                    blocked[q] = true;
                    continue;
                }
            }
            let demand = &job.demand;
            if let Some(why) = c.tree.quota_violation(q, demand) {
                for &p in &job.pods {
                    c.notes.insert(p, PendingReason::Quota(why.clone()));
                }
                c.unplaced.push(j);
                continue;
            }
            let shape = c.shape(j, job, job.need, None);
            let placed = match shape {
                Some(ref s) if c.alloc_failed_before(s, job) => false,
                _ => c.try_place(j, job),
            };
            if !placed && let Some(s) = shape {
                c.alloc_failed(s, job);
            }
            if placed {
                if job.group.is_some() {
                    c.out.stats.gangs_started += 1;
                }
                if waiting_in_queue[q] {
                    c.out.stats.backfilled += 1;
                }
                continue;
            }
            c.unplaced.push(j);
            if job.group.is_some() {
                c.out.stats.gangs_waiting += 1;
            }
            if !opts.backfill {
                blocked[q] = true;
            }
            let waited = c.now_ms.saturating_sub(job.arrival);
            let head = !waiting_in_queue[q];
            waiting_in_queue[q] = true;
            if head
                && waited >= opts.reserve_after_ms
                && reservations < opts.max_reservations
                && c.reserve(j, job)
            {
                reservations += 1;
            }
        }
        c.order = per_queue;
    }
}

impl<'s> Cycle<'s> {
    /// Places `need` pods of the job (all or nothing), then extras.
    fn try_place(&mut self, j: JobId, job: &Job) -> bool {
        let domains: Vec<Option<BTreeSet<NodeId>>> = match job.topology {
            Some(t) if job.need > 1 => {
                let mut ds: Vec<Option<BTreeSet<NodeId>>> = self
                    .domains(t, job)
                    .into_iter()
                    .take(self.opts.max_domains_per_gang as usize)
                    .map(Some)
                    .collect();
                if !t.required {
                    ds.push(None);
                }
                ds
            }
            _ => vec![None],
        };
        for dom in &domains {
            let mut st = Statement::new();
            let mut ok = true;
            for &p in &job.pods[..job.need] {
                let placed = match self.best_node(p, j, dom.as_ref()) {
                    Some((n, g)) => self.st_place(&mut st, p, n, g),
                    None => false,
                };
                if !placed {
                    ok = false;
                    break;
                }
            }
            if !ok {
                let fitted = st.len();
                self.rollback(&mut st, 0);
                if job.group.is_some() && dom.is_none() {
                    let why = PendingReason::GangShort {
                        group: job.name.clone(),
                        fit: fitted as u32,
                        need: job.need as u32,
                    };
                    for &p in &job.pods {
                        self.notes.insert_if_none(p, || why.clone());
                    }
                }
                continue;
            }
            // extras (elastic members beyond minMember): best effort
            // (each within the queue's quota, counting what this job takes)
            let mut taken = job.demand.clone();
            for &p in &job.pods[job.need..] {
                let mut with = taken.clone();
                with.add(&self.pod(p).demand());
                if self.tree.quota_violation(job.queue, &with).is_some() {
                    continue;
                }
                if let Some((n, g)) = self.best_node(p, j, dom.as_ref())
                    && self.st_place(&mut st, p, n, g)
                {
                    taken = with;
                }
            }
            if self.bind_all(job, st) == 0 {
                return false;
            }
            if let Some(g) = job.group {
                self.out.decisions.push(Decision::Group {
                    group: self.snap.groups[g].name.clone(),
                    phase: GroupPhase::Running,
                });
            }
            return true;
        }
        if let Some(t) = job.topology
            && job.need > 1
        {
            let why = PendingReason::NoTopologyDomain {
                group: job.name.clone(),
                level: t.level,
                need: job.need as u32,
                required: t.required,
            };
            for &p in &job.pods {
                self.notes.insert_if_none(p, || why.clone());
            }
        }
        false
    }

    /// Candidate domains for a topology-constrained gang, best fit first:
    /// the domains whose free GPUs (on statically suitable nodes) cover the
    /// gang, smallest surplus first.
    fn domains(&mut self, t: TopologyConstraint, job: &Job) -> Vec<BTreeSet<NodeId>> {
        let need_gpu: u64 = job.pods[..job.need]
            .iter()
            .map(|&p| self.pod(p).gpu.milli())
            .sum();
        let mut by: BTreeMap<&str, (u64, BTreeSet<NodeId>)> = BTreeMap::new();
        for (i, n) in self.snap.nodes.iter().enumerate() {
            if let Some(d) = t.level.domain_of(n) {
                let e = by.entry(d).or_default();
                e.0 += self.cs.states()[i].free.gpu_milli;
                e.1.insert(i as NodeId);
            }
        }
        let mut v: Vec<(u64, &str, BTreeSet<NodeId>)> = by
            .into_iter()
            .filter(|(_, (f, _))| *f >= need_gpu)
            .map(|(d, (f, s))| (f - need_gpu, d, s))
            .collect();
        v.sort_by(|a, b| (a.0, a.1).cmp(&(b.0, b.1)));
        v.into_iter().map(|(_, _, s)| s).collect()
    }
}

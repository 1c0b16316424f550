//! Explain: typed reasons for every pod left pending — the node summary in
//! kube-scheduler's style (`0/N nodes are available: …`) plus the queue,
//! quota, gang or reservation reason the other actions noted.

use super::Action;
use crate::decision::{Decision, Explanation, QueuePosition, Verdict};
use crate::plugin::Packer;
use crate::reason::{NearestNode, NodeReason, NodeSummary, PendingReason};
use crate::scheduler::candidates::SigCache;
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId, per_queue_order};
use crate::snapshot::{NodeId, PodId};
use crate::state::ClusterState;
use gpusched_model::{GpuRequest, Pod, ResourceKind};
use std::collections::BTreeMap;

pub(super) struct Explain;

impl Action for Explain {
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]) {
        c.explain(jobs);
    }
}

impl<'s> Cycle<'s> {
    /// Messages for every pod left pending.
    fn explain(&mut self, jobs: &[Job]) {
        let mut diag_cache: BTreeMap<usize, (Verdict, Option<NodeSummary>)> = BTreeMap::new();
        // whether each pod is in a job
        let mut in_job = vec![false; self.snap.pods.len()];
        for j in jobs {
            for &p in &j.pods {
                in_job[p as usize] = true;
            }
        }
        // each job's place in its queue's order
        let mut position: Vec<Option<QueuePosition>> = vec![None; self.snap.pods.len()];
        for list in per_queue_order(jobs, self.tree.queues.len()) {
            let n = list.len() as u32;
            for (i, &j) in list.iter().enumerate() {
                for &p in &jobs[j].pods {
                    position[p as usize] = Some(QueuePosition {
                        position: i as u32 + 1,
                        jobs: n,
                    });
                }
            }
        }
        let mut nominated_set = vec![false; self.snap.pods.len()];
        for d in &self.out.decisions {
            if let Decision::Nominate { pod, .. } = d {
                nominated_set[*pod as usize] = true;
            }
        }
        for (i, ps) in self.snap.pods.iter().enumerate() {
            let p = i as PodId;
            if !ps.is_pending() {
                continue;
            }
            let nominated = nominated_set[i];
            if self.placed[i] && !nominated {
                continue;
            }
            let note = self.notes.get(&p).cloned();
            let evictions = std::mem::take(&mut self.evict_notes[i]);
            let queue_position = position[i];
            if nominated {
                self.out.explanations.push(Explanation {
                    pod: p,
                    verdict: Verdict::Unschedulable,
                    reasons: vec![note.unwrap_or(PendingReason::Nominated)],
                    evictions,
                    queue_position,
                });
                continue;
            }
            let constrained = in_job[i] && self.pre_filter(p).filter;
            let (verdict, diag) = if constrained {
                // its own: what runs where refuses nodes for this pod
                let s = self.sig_of(p);
                let pod = self.pod(p);
                let refuse = |n: NodeId| self.constraint_refusal(p, n);
                diagnose(
                    &self.cs,
                    &self.sigs[s],
                    &self.reserved,
                    self.packer,
                    pod,
                    &refuse,
                )
            } else if in_job[i] {
                let s = self.sig_of(p);
                diag_cache
                    .entry(s)
                    .or_insert_with(|| {
                        let pod = &self.snap.pods[self.sigs[s].rep as usize].pod;
                        diagnose(
                            &self.cs,
                            &self.sigs[s],
                            &self.reserved,
                            self.packer,
                            pod,
                            &|_| None,
                        )
                    })
                    .clone()
            } else {
                (Verdict::Unschedulable, None)
            };
            // a quota the job alone exceeds is never met by waiting
            let verdict = match &note {
                Some(PendingReason::Quota(v)) if v.never() => Verdict::Unresolvable,
                _ => verdict,
            };
            let reasons = diag
                .map(PendingReason::Nodes)
                .into_iter()
                .chain(note)
                .collect();
            self.out.explanations.push(Explanation {
                pod: p,
                verdict,
                reasons,
                evictions,
                queue_position,
            });
        }
    }
}

/// kube-scheduler-style summary of why no node takes `pod` now.
fn diagnose(
    cs: &ClusterState<'_>,
    sig: &SigCache,
    reserved: &[Option<JobId>],
    packer: &dyn Packer,
    pod: &Pod,
    refuse: &dyn Fn(NodeId) -> Option<NodeReason>,
) -> (Verdict, Option<NodeSummary>) {
    let mut reasons: BTreeMap<NodeReason, u32> = sig.rejects.clone();
    let mut ever_fits = false;
    let mut fits_now = 0u32;
    // (free whole GPUs, most free on one GPU, node) of the nearest node
    let mut nearest: Option<(u32, u32, NodeId)> = None;
    for &n in &sig.ok_list {
        let node = cs.node(n);
        if let Some(r) = refuse(n) {
            // refused by what runs where (affinity, spread, ports): it may
            // fit later, so the pod is not unresolvable for it
            ever_fits = true;
            *reasons.entry(r).or_insert(0) += 1;
            continue;
        }
        if !pod.gpu.is_none() {
            let st = cs.get(n);
            let allowed = (0..st.gpu_free_milli.len()).filter(|&g| cs.gpu_allowed(pod, n, g));
            let (mut whole, mut best) = (0u32, 0u32);
            for g in allowed {
                let m = st.gpu_free_milli[g];
                if u64::from(m) == gpusched_model::GPU_MILLI {
                    whole += 1;
                }
                best = best.max(m);
            }
            let better = match nearest {
                None => true,
                Some((w, b, _)) => match pod.gpu {
                    GpuRequest::Share { .. } => (best, whole) > (b, w),
                    _ => (whole, best) > (w, b),
                },
            };
            if better {
                nearest = Some((whole, best, n));
            }
        }
        // could it fit on the empty node?
        let mut empty_alloc = node.allocatable.clone();
        empty_alloc.gpu_milli = u64::MAX;
        empty_alloc.gpu_mem_mib = u64::MAX;
        let usable =
            (0..node.gpus.len()).filter(|&g| cs.get(n).gpu_usable[g] && cs.gpu_allowed(pod, n, g));
        let usable_allowed = match crate::state::claim_gpus(pod) {
            // GPUs that can go together
            Some(c) => c.largest_group(&node.name, usable) as u32,
            None => usable.count() as u32,
        };
        let gpu_possible = match pod.gpu {
            GpuRequest::None => true,
            GpuRequest::Whole(k) => usable_allowed >= k,
            GpuRequest::Share { .. } => usable_allowed >= 1,
        };
        if pod.requests.fits_in(&empty_alloc) && gpu_possible {
            ever_fits = true;
        }
        let free = &cs.get(n).free;
        let mut miss: Vec<NodeReason> = Vec::new();
        if pod.requests.cpu_milli > free.cpu_milli {
            miss.push(NodeReason::Insufficient(ResourceKind::Cpu));
        }
        if pod.requests.memory > free.memory {
            miss.push(NodeReason::Insufficient(ResourceKind::Memory));
        }
        for (k, v) in &pod.requests.ext {
            if *v > free.ext_get(k) {
                miss.push(NodeReason::Insufficient(ResourceKind::Extended(k.clone())));
            }
        }
        if !pod.gpu.is_none() && crate::place(packer, pod, n, cs).is_none() {
            miss.push(match (&pod.mig, pod.gpu) {
                (Some(m), _) => {
                    NodeReason::Insufficient(ResourceKind::Extended(m.resource.clone()))
                }
                (_, GpuRequest::Share { .. }) => NodeReason::InsufficientGpuShare,
                _ => match crate::state::claim_gpus(pod) {
                    Some(c) => NodeReason::ClaimGpus {
                        claim: c.claim.clone(),
                        count: pod.gpu.whole(),
                        attributes: c.attributes.clone(),
                    },
                    None => NodeReason::Insufficient(ResourceKind::Gpu),
                },
            });
        }
        if miss.is_empty() && reserved[n as usize].is_some() {
            miss.push(NodeReason::ReservedForOtherJob);
        }
        if miss.is_empty() {
            fits_now += 1;
        }
        for m in miss {
            *reasons.entry(m).or_insert(0) += 1;
        }
    }
    let mut counts: Vec<(String, NodeReason, u32)> = reasons
        .into_iter()
        .map(|(r, c)| (r.to_string(), r, c))
        .collect();
    counts.sort_by(|a, b| a.0.cmp(&b.0));
    let verdict = if ever_fits {
        Verdict::Unschedulable
    } else {
        Verdict::Unresolvable
    };
    if fits_now > 0 {
        // the pod alone would fit; the reason is its gang, queue or
        // reservation, which the caller's note gives.
        return (verdict, None);
    }
    let summary = NodeSummary {
        total: cs.len() as u32,
        counts: counts.into_iter().map(|(_, r, c)| (r, c)).collect(),
        nearest: nearest.map(|(free_gpus, best_gpu_free_milli, n)| NearestNode {
            node: cs.node(n).name.clone(),
            free_gpus,
            best_gpu_free_milli,
        }),
    };
    (verdict, Some(summary))
}

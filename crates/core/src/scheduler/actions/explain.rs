//! Explain: typed reasons for every pod left pending — the node summary in
//! kube-scheduler's style (`0/N nodes are available: …`) plus the queue,
//! quota, gang or reservation reason the other actions noted.

use super::Action;
use crate::decision::{Decision, Explanation, QueuePosition, Verdict};
use crate::plugin::Packer;
use crate::reason::{EvictionAttempt, NearestNode, NodeReason, NodeSummary, PendingReason};
use crate::scheduler::candidates::SigCache;
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::snapshot::{NodeId, PodId};
use crate::state::ClusterState;
use gpusched_model::{GpuRequest, Pod, ResourceKind};
use std::collections::BTreeMap;
use std::sync::Arc;

pub(super) struct Explain;

/// A reason list with the signature and note it was built from.
type SharedList = (usize, Option<PendingReason>, Arc<[PendingReason]>);

impl Action for Explain {
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]) {
        c.explain(jobs);
    }
}

impl<'s> Cycle<'s> {
    /// Messages for every pod left pending. The pods of a job share its
    /// eviction notes, and consecutive pods with the same signature and
    /// note share one reason list (a deep queue's pods are mostly alike:
    /// one list per job, not one per pod).
    fn explain(&mut self, jobs: &[Job]) {
        let mut diag_cache: BTreeMap<usize, (Verdict, Option<NodeSummary>)> = BTreeMap::new();
        // each pod's job
        let mut job_of: Vec<Option<JobId>> = vec![None; self.snap.pods.len()];
        for (j, job) in jobs.iter().enumerate() {
            for &p in &job.pods {
                job_of[p as usize] = Some(j);
            }
        }
        // each job's place in its queue's order
        let mut position: Vec<Option<QueuePosition>> = vec![None; jobs.len()];
        for list in &self.order {
            let n = list.len() as u32;
            for (i, &j) in list.iter().enumerate() {
                position[j] = Some(QueuePosition {
                    position: i as u32 + 1,
                    jobs: n,
                });
            }
        }
        let mut never_fits: BTreeMap<JobId, Option<PendingReason>> = BTreeMap::new();
        let mut nominated_set = vec![false; self.snap.pods.len()];
        for d in &self.out.decisions {
            if let Decision::Nominate { pod, .. } = d {
                nominated_set[*pod as usize] = true;
            }
        }
        // each job's eviction notes, shared by its pods
        let evictions: Vec<Arc<[EvictionAttempt]>> = std::mem::take(&mut self.evict_notes)
            .into_iter()
            .map(Arc::from)
            .collect();
        let none: Arc<[EvictionAttempt]> = Arc::from(Vec::new());
        // per job, the last reason list built for one of its pods, with
        // the signature and note it was built from
        let mut lists: Vec<Option<SharedList>> = vec![None; jobs.len()];
        // per job, the last list of a nominated pod (one reason)
        let mut nominated_lists: Vec<Option<Arc<[PendingReason]>>> = vec![None; jobs.len()];
        for (i, ps) in self.snap.pods.iter().enumerate() {
            let p = i as PodId;
            if !ps.is_pending() || self.parked_pod.get(i) == Some(&true) {
                continue;
            }
            let nominated = nominated_set[i];
            if self.placed[i] && !nominated {
                continue;
            }
            let mut note = self.notes.get(&p).cloned();
            let job = job_of[i];
            // a gang that falls short now but could never fit at once, even
            // on an empty cluster, is told apart (a gang's Unresolvable)
            if let (Some(PendingReason::GangShort { .. }), Some(j)) = (&note, job) {
                let never = never_fits
                    .entry(j)
                    .or_insert_with(|| self.gang_never_fits(&jobs[j]));
                if let Some(why) = never {
                    note = Some(why.clone());
                }
            }
            let evictions = job.and_then(|j| evictions.get(j)).unwrap_or(&none).clone();
            let queue_position = job.and_then(|j| position[j]);
            if nominated {
                let why = note.unwrap_or(PendingReason::Nominated);
                let slot = job.and_then(|j| nominated_lists.get_mut(j));
                let reasons = match slot {
                    Some(Some(r)) if r.first() == Some(&why) => r.clone(),
                    slot => {
                        let r: Arc<[PendingReason]> = Arc::from(vec![why]);
                        if let Some(slot) = slot {
                            *slot = Some(r.clone());
                        }
                        r
                    }
                };
                self.out.explanations.push(Explanation {
                    pod: p,
                    verdict: Verdict::Unschedulable,
                    reasons,
                    evictions,
                    queue_position,
                });
                continue;
            }
            let constrained = job.is_some() && self.pre_filter(p).filter;
            // (verdict, the node summary when it is not shared, the
            // signature whose cached diagnosis it shares)
            let (verdict, own, shared_sig) = if constrained {
                // its own: what runs where refuses nodes for this pod
                let s = self.sig_of(p);
                let pod = self.pod(p);
                let refuse = |n: NodeId| self.constraint_refusal(p, n);
                let (v, d) = diagnose(
                    &self.cs,
                    &self.sigs[s],
                    &self.reserved,
                    self.packer,
                    pod,
                    &refuse,
                );
                (v, d, None)
            } else if job.is_some() {
                let s = self.sig_of(p);
                let (v, _) = diag_cache.entry(s).or_insert_with(|| {
                    let pod = &self.snap.pods[self.sigs[s].rep as usize].pod;
                    diagnose(
                        &self.cs,
                        &self.sigs[s],
                        &self.reserved,
                        self.packer,
                        pod,
                        &|_| None,
                    )
                });
                (*v, None, Some(s))
            } else {
                (Verdict::Unschedulable, None, None)
            };
            // a quota the job alone exceeds is never met by waiting
            let verdict = match &note {
                Some(PendingReason::Quota(v)) if v.never() => Verdict::Unresolvable,
                Some(PendingReason::GangNeverFits { .. }) => Verdict::Unresolvable,
                _ => verdict,
            };
            let slot = match (job, shared_sig) {
                (Some(j), Some(_)) => lists.get_mut(j),
                _ => None,
            };
            let reasons = match slot {
                Some(Some((s, n, r))) if shared_sig == Some(*s) && *n == note => r.clone(),
                slot => {
                    let diag = match shared_sig {
                        Some(s) => diag_cache.get(&s).and_then(|(_, d)| d.clone()),
                        None => own,
                    };
                    let r: Arc<[PendingReason]> = diag
                        .map(PendingReason::Nodes)
                        .into_iter()
                        .chain(note.clone())
                        .collect();
                    if let (Some(slot), Some(s)) = (slot, shared_sig) {
                        *slot = Some((s, note, r.clone()));
                    }
                    r
                }
            };
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

impl Cycle<'_> {
    /// Whether `job`'s required members can never run at once, even with
    /// every node empty: for the members of one signature asking `k` whole
    /// GPUs each, a node that passes their filters holds at most
    /// ⌊usable GPUs / k⌋ of them, so more members than the sum over those
    /// nodes never fit (a necessary condition only: a gang that passes it
    /// may still never fit, and is then told "short" as before).
    fn gang_never_fits(&mut self, job: &Job) -> Option<PendingReason> {
        job.group?;
        let need = job.need.min(job.pods.len());
        // members by signature: (count, a representative)
        let mut by_sig: BTreeMap<usize, (u32, PodId)> = BTreeMap::new();
        for &p in &job.pods[..need] {
            if let GpuRequest::Whole(k) = self.pod(p).gpu
                && k > 0
            {
                let s = self.sig_of(p);
                by_sig.entry(s).or_insert((0, p)).0 += 1;
            }
        }
        for (s, (count, rep)) in by_sig {
            let pod = self.pod(rep);
            let k = pod.gpu.whole();
            let claims = crate::state::claim_gpus(pod);
            let kept = match claims {
                None => self.gang_most.get(&s).copied(),
                Some(_) => None,
            };
            let most = match kept {
                Some(m) => m,
                None => {
                    let mut most = 0u32;
                    for &n in &self.sigs[s].ok_list {
                        let node = self.cs.node(n);
                        let usable = (0..node.gpus.len()).filter(|&g| {
                            self.cs.get(n).gpu_usable[g] && self.cs.gpu_allowed(pod, n, g)
                        });
                        let usable = match &claims {
                            Some(c) => c.largest_group(&node.name, usable) as u32,
                            None => usable.count() as u32,
                        };
                        most = most.saturating_add(usable / k);
                    }
                    if claims.is_none() {
                        self.gang_most.insert(s, most);
                    }
                    most
                }
            };
            if count > most {
                return Some(PendingReason::GangNeverFits {
                    group: job.name.clone(),
                    need: need as u32,
                    count,
                    gpus: k,
                    most,
                });
            }
        }
        None
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
        if !pod.gpu.is_none()
            && !pod.gpu_models.is_empty()
            && !node.gpus.iter().any(|g| pod.allows_model(&g.model))
        {
            // no GPU of the models it asks: say which it asks and which
            // the node has, not "Insufficient nvidia.com/gpu"
            miss.push(NodeReason::NoGpuOfModel {
                asked: pod.gpu_models.clone(),
                has: node.gpu_models().into_iter().map(str::to_string).collect(),
            });
        } else if !pod.gpu.is_none() && crate::place(packer, pod, n, cs).is_none() {
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
                        distinct: c.distinct.clone(),
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

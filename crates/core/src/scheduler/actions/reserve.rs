//! Reservations: a job that waited too long gets nodes reserved for it;
//! nothing else is placed there and they drain until it fits (no
//! starvation). Called by allocate for the head job of a queue.

use crate::decision::Decision;
use crate::reason::PendingReason;
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::snapshot::{NodeId, PodId};
use gpusched_model::{GpuRequest, ResourceVec};
use std::cmp::Reverse;

impl<'s> Cycle<'s> {
    /// How many pods like `p` node `n` could hold once drained: 0 when the
    /// static filters refuse `p` there, its requests (GPU dimensions
    /// aside) pass the node's allocatable, or no usable GPU there may
    /// serve it (wrong model, too small, unhealthy).
    pub(super) fn slots_when_empty(&mut self, p: PodId, n: NodeId) -> usize {
        let s = self.sig_of(p);
        if !self.sigs[s].ok.get(n as usize).copied().unwrap_or(false) {
            return 0;
        }
        let pod = self.pod(p);
        let node = self.cs.node(n);
        if !pod.requests.fits_in(&ResourceVec {
            gpu_milli: u64::MAX,
            gpu_mem_mib: u64::MAX,
            ..node.allocatable.clone()
        }) {
            return 0;
        }
        if pod.gpu.is_none() {
            return 1;
        }
        let usable = (0..node.gpus.len())
            .filter(|&g| self.cs.get(n).gpu_usable[g] && self.cs.gpu_allowed(pod, n, g))
            .count();
        match pod.gpu {
            GpuRequest::Share { .. } => usable.min(1),
            _ => usable / pod.gpu.whole().max(1) as usize,
        }
    }

    /// Whether pod `p`'s nomination to node `n`, made at `at_ms`, still
    /// holds the node (`SchedulerOptions::max_nomination_ms`,
    /// [`Cycle::slots_when_empty`]).
    pub(in crate::scheduler) fn nomination_holds(
        &mut self,
        p: PodId,
        n: NodeId,
        at_ms: Option<u64>,
    ) -> bool {
        if n as usize >= self.snap.nodes.len() {
            return false;
        }
        if let Some(at) = at_ms
            && self.now_ms.saturating_sub(at) > self.opts.max_nomination_ms
        {
            return false;
        }
        self.slots_when_empty(p, n) > 0
    }

    /// Reserves nodes for a job that has waited too long: nodes that could
    /// hold its members when empty, most free first.
    pub(super) fn reserve(&mut self, j: JobId, job: &Job) -> bool {
        let Some(&first) = job.pods.first() else {
            return false;
        };
        let s = self.sig_of(first);
        let mut cands: Vec<(bool, u64, NodeId, usize)> = Vec::new();
        for i in 0..self.sigs[s].ok_list.len() {
            let n = self.sigs[s].ok_list[i];
            if self.reserved[n as usize].is_some_and(|r| r != j) {
                continue;
            }
            let slots = self.slots_when_empty(first, n);
            if slots == 0 {
                continue;
            }
            cands.push((
                !job.nominated.contains(&n),
                Reverse(self.cs.get(n).free.gpu_milli).0,
                n,
                slots,
            ));
        }
        // nominated first, then most free, then id
        cands.sort_by_key(|a| (a.0, Reverse(a.1), a.2));
        let mut need = job.need.max(1);
        let mut chosen = Vec::new();
        for (_, _, n, slots) in cands {
            if need == 0 {
                break;
            }
            chosen.push((n, slots.min(need)));
            need = need.saturating_sub(slots);
        }
        if need > 0 {
            return false;
        }
        let mut k = 0;
        for (n, slots) in chosen {
            self.reserve_node(n, j);
            for _ in 0..slots {
                if let Some(&p) = job.pods.get(k) {
                    self.out
                        .decisions
                        .push(Decision::Nominate { pod: p, node: n });
                    self.notes.insert(
                        p,
                        PendingReason::Reserved {
                            node: self.snap.nodes[n as usize].name.clone(),
                        },
                    );
                }
                k += 1;
            }
        }
        true
    }
}

//! Reservations: a job that waited too long gets nodes reserved for it;
//! nothing else is placed there and they drain until it fits (no
//! starvation). Called by allocate for the head job of a queue.

use crate::decision::Decision;
use crate::reason::PendingReason;
use crate::scheduler::cycle::Cycle;
use crate::scheduler::jobs::{Job, JobId};
use crate::snapshot::NodeId;
use gpusched_model::{GpuRequest, ResourceVec};
use std::cmp::Reverse;

impl<'s> Cycle<'s> {
    /// Reserves nodes for a job that has waited too long: nodes that could
    /// hold its members when empty, most free first.
    pub(super) fn reserve(&mut self, j: JobId, job: &Job) -> bool {
        let Some(&first) = job.pods.first() else {
            return false;
        };
        let s = self.sig_of(first);
        let pod = self.pod(first);
        let per_pod_gpu = pod.gpu.whole().max(1) as usize;
        let mut cands: Vec<(bool, u64, NodeId, usize)> = Vec::new();
        for &n in &self.sigs[s].ok_list {
            if self.reserved[n as usize].is_some_and(|r| r != j) {
                continue;
            }
            let node = self.cs.node(n);
            let alloc = &node.allocatable;
            if !pod.requests.fits_in(&ResourceVec {
                gpu_milli: u64::MAX,
                gpu_mem_mib: u64::MAX,
                ..alloc.clone()
            }) {
                continue;
            }
            let slots = if pod.gpu.is_none() {
                1
            } else {
                let usable = (0..node.gpus.len())
                    .filter(|&g| self.cs.get(n).gpu_usable[g] && self.cs.gpu_allowed(pod, n, g))
                    .count();
                match pod.gpu {
                    GpuRequest::Share { .. } => usable.min(1),
                    _ => usable / per_pod_gpu,
                }
            };
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

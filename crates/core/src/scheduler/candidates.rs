//! The candidate index: which nodes a pod may go to, and the best of them.
//!
//! Static filter verdicts are cached per pod signature (pods that ask for
//! the same thing share one entry); packer scores sit in a lazy max-heap
//! per signature, invalidated by node version, so a placement re-scores
//! only the nodes it changed (through the cycle's change log).

use super::cycle::Cycle;
use super::jobs::JobId;
use crate::plugin::{FilterResult, Placement, SchedulingKey, Score};
use crate::reason::NodeReason;
use crate::snapshot::{GpuAssignment, NodeId, PodId};
use gpusched_model::Pod;
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(super) struct HeapItem {
    score: Score,
    node: Reverse<NodeId>,
    version: u64,
}

/// Per pod-signature cache: static filter verdicts and a lazy max-heap of
/// node scores, kept fresh through the cycle's change log.
pub(super) struct SigCache {
    /// The pod whose verdicts these are (any pod of the signature).
    pub rep: PodId,
    /// Whether the filters pass each node.
    pub ok: Vec<bool>,
    /// The nodes the filters pass, in id order.
    pub ok_list: Vec<NodeId>,
    /// How many nodes each filter refusal was given by.
    pub rejects: BTreeMap<NodeReason, u32>,
    heap: Option<BinaryHeap<HeapItem>>,
    log_pos: usize,
}

impl<'s> Cycle<'s> {
    /// The key of pod `p`'s cache entry: what the core reads, then what each
    /// filter and the packer declare.
    fn scheduling_key(&self, pod: &Pod) -> SchedulingKey {
        let mut key = SchedulingKey::new();
        key.add(&pod.requests);
        key.add(&pod.gpu);
        key.add(&pod.gpu_models);
        key.add(&pod.min_gpu_memory_mib);
        for f in self.filters {
            f.scheduling_key(pod, &mut key);
        }
        self.packer.scheduling_key(pod, &mut key);
        key
    }

    /// The signature entry of pod `p` (computing the filter verdicts the
    /// first time a signature is seen).
    pub fn sig_of(&mut self, p: PodId) -> usize {
        if let Some(s) = self.pod_sig[p as usize] {
            return s;
        }
        let pod = self.pod(p);
        let key = self.scheduling_key(pod);
        let snap = self.snap;
        if let Some(&s) = self.sig_index.get(&key) {
            self.pod_sig[p as usize] = Some(s);
            return s;
        }
        let mut ok = vec![false; snap.nodes.len()];
        let mut ok_list = Vec::new();
        let mut rejects: BTreeMap<NodeReason, u32> = BTreeMap::new();
        for (i, node) in snap.nodes.iter().enumerate() {
            let mut refused = None;
            for f in self.filters {
                if let FilterResult::Reject(reason) = f.filter(pod, node) {
                    refused = Some(NodeReason::Filter {
                        plugin: Cow::Borrowed(f.name()),
                        reason,
                    });
                    break;
                }
            }
            match refused {
                None => {
                    ok[i] = true;
                    ok_list.push(i as NodeId);
                }
                Some(r) => *rejects.entry(r).or_insert(0) += 1,
            }
        }
        let s = self.sigs.len();
        self.sigs.push(SigCache {
            rep: p,
            ok,
            ok_list,
            rejects,
            heap: None,
            log_pos: 0,
        });
        self.sig_index.insert(key, s);
        self.pod_sig[p as usize] = Some(s);
        s
    }
    /// Where `pod` would go on `node` now, if it fits.
    pub fn place_on(&self, pod: &Pod, node: NodeId) -> Option<Placement> {
        if !self.cs.fits_non_gpu(pod, node) {
            return None;
        }
        self.packer.place(pod, node, &self.cs)
    }
    /// Best node for pod `p` (not reserved for another job), optionally
    /// restricted to `only`.
    pub fn best_node(
        &mut self,
        p: PodId,
        job: JobId,
        only: Option<&BTreeSet<NodeId>>,
    ) -> Option<(NodeId, GpuAssignment)> {
        let s = self.sig_of(p);
        let pod = self.pod(p);
        let allowed = |r: Option<JobId>| r.is_none() || r == Some(job);
        if let Some(only) = only {
            let mut best: Option<(Score, Reverse<NodeId>, GpuAssignment)> = None;
            for &n in only {
                if !self.sigs[s].ok[n as usize] || !allowed(self.reserved[n as usize]) {
                    continue;
                }
                self.out.stats.nodes_scored += 1;
                if let Some(pl) = self.place_on(pod, n)
                    && best
                        .as_ref()
                        .is_none_or(|(sc, rn, _)| (pl.score, Reverse(n)) > (*sc, *rn))
                {
                    best = Some((pl.score, Reverse(n), pl.gpus));
                }
            }
            return best.map(|(_, Reverse(n), g)| (n, g));
        }
        // lazy heap
        if self.sigs[s].heap.is_none() {
            let mut items = Vec::with_capacity(self.sigs[s].ok_list.len());
            for &n in &self.sigs[s].ok_list {
                self.out.stats.nodes_scored += 1;
                if let Some(pl) = self.place_on(pod, n) {
                    items.push(HeapItem {
                        score: pl.score,
                        node: Reverse(n),
                        version: self.cs.get(n).version,
                    });
                }
            }
            self.sigs[s].heap = Some(BinaryHeap::from(items));
            self.sigs[s].log_pos = self.change_log.len();
        }
        // catch up with changes since the heap was last used
        let from = self.sigs[s].log_pos;
        let mut fresh = Vec::new();
        for &n in &self.change_log[from..] {
            if self.sigs[s].ok[n as usize] {
                fresh.push(n);
            }
        }
        fresh.sort_unstable();
        fresh.dedup();
        for n in fresh {
            self.out.stats.nodes_scored += 1;
            if let Some(pl) = self.place_on(pod, n) {
                let version = self.cs.get(n).version;
                if let Some(h) = self.sigs[s].heap.as_mut() {
                    h.push(HeapItem {
                        score: pl.score,
                        node: Reverse(n),
                        version,
                    });
                }
            }
        }
        self.sigs[s].log_pos = self.change_log.len();
        let mut skipped = Vec::new();
        let mut found = None;
        while let Some(top) = self.sigs[s].heap.as_ref().and_then(|h| h.peek().copied()) {
            let n = top.node.0;
            if top.version != self.cs.get(n).version {
                if let Some(h) = self.sigs[s].heap.as_mut() {
                    h.pop();
                }
                continue;
            }
            if !allowed(self.reserved[n as usize]) {
                if let Some(h) = self.sigs[s].heap.as_mut() {
                    h.pop();
                }
                skipped.push(top);
                continue;
            }
            match self.place_on(pod, n) {
                Some(pl) => {
                    found = Some((n, pl.gpus));
                    break;
                }
                None => {
                    if let Some(h) = self.sigs[s].heap.as_mut() {
                        h.pop();
                    }
                }
            }
        }
        if let Some(h) = self.sigs[s].heap.as_mut() {
            h.extend(skipped);
        }
        found
    }
}

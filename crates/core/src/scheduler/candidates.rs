//! The candidate index: which nodes a pod may go to, and the best of them.
//!
//! Static filter verdicts are cached per pod signature (pods that ask for
//! the same thing share one entry); packer scores sit in a lazy max-heap
//! per signature, invalidated by node version, so a placement re-scores
//! only the nodes it changed (through the cycle's change log).

use super::PreferenceOrder;
use super::cycle::Cycle;
use super::jobs::JobId;
use crate::plugin::{FilterResult, Needs, Placement, SchedulingKey, Score};
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
    pub(super) fn scheduling_key(&self, pod: &Pod) -> SchedulingKey {
        let mut key = SchedulingKey::new();
        key.add(&pod.requests);
        key.add(&pod.gpu);
        key.add(&pod.mig);
        key.add(&pod.gpu_models);
        key.add(&pod.min_gpu_memory_mib);
        key.add(&crate::state::claim_gpus(pod));
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
        // kept by the engine while no node changed: the filters read only
        // the pod's key and the node
        if let Some(v) = self.kept_verdicts.and_then(|k| k.get(&key)) {
            let v = v.clone();
            let s = self.sigs.len();
            self.sigs.push(SigCache {
                rep: p,
                ok: v.ok.clone(),
                ok_list: v.ok_list.clone(),
                rejects: v.rejects.clone(),
                heap: None,
                log_pos: 0,
            });
            self.sig_index.insert(key, s);
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
        if self.kept_verdicts.is_some() {
            self.new_verdicts.push((
                key.clone(),
                std::sync::Arc::new(super::Verdicts {
                    ok: ok.clone(),
                    ok_list: ok_list.clone(),
                    rejects: rejects.clone(),
                }),
            ));
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
        crate::place(self.packer, pod, node, &self.cs)
    }
    /// Asks every constraint state what pod `p` needs (its pre-filter,
    /// before each evaluation; the states keep it current as pods are
    /// placed and removed).
    pub fn pre_filter(&mut self, p: PodId) -> Needs {
        if !self.any_constraints {
            return Needs::NONE;
        }
        let mut needs = Needs::NONE;
        for c in &mut self.cstates {
            needs = needs.or(c.pre_filter(p));
        }
        if self.opts.preferences == PreferenceOrder::Ignore {
            needs.score = false;
        }
        self.pod_needs[p as usize] = needs;
        needs
    }

    /// The first refusal of pod `p` on node `n` by a constraint state
    /// (after [`Cycle::pre_filter`]); `None`: they all pass.
    pub fn constraint_refusal(&self, p: PodId, n: NodeId) -> Option<NodeReason> {
        if !self.pod_needs[p as usize].filter {
            return None;
        }
        for (c, st) in self.constraints.iter().zip(&self.cstates) {
            if let FilterResult::Reject(reason) = st.filter(p, n) {
                return Some(NodeReason::Filter {
                    plugin: Cow::Borrowed(c.name()),
                    reason,
                });
            }
        }
        None
    }

    /// Where pod `p` would go on `node` now, if it fits there, constraints
    /// included (after [`Cycle::pre_filter`]).
    pub fn place_checked(&self, p: PodId, node: NodeId) -> Option<Placement> {
        if self.constraint_refusal(p, node).is_some() {
            return None;
        }
        self.place_on(self.pod(p), node)
    }

    /// Whether pod `p` fits on `node` now, constraints included.
    pub fn fits_on(&self, p: PodId, node: NodeId) -> bool {
        self.place_checked(p, node).is_some()
    }

    /// The weighted, normalised preference score of pod `p` on each of
    /// `cands` (in that order): every scoring state's scores are scaled to
    /// 0–100 over the candidates (the least liked 0, the most liked 100,
    /// all 0 when they are equal) and summed with the plugin's weight.
    fn preference_totals(&self, p: PodId, cands: &[NodeId]) -> Vec<i64> {
        let mut total = vec![0i64; cands.len()];
        let mut raw: Vec<Option<i64>> = Vec::with_capacity(cands.len());
        for (c, st) in self.constraints.iter().zip(&self.cstates) {
            raw.clear();
            raw.extend(cands.iter().map(|&n| st.score(p, n)));
            let lo = raw.iter().flatten().min().copied();
            let hi = raw.iter().flatten().max().copied();
            let (Some(lo), Some(hi)) = (lo, hi) else {
                continue;
            };
            let w = c.weight();
            for (t, r) in total.iter_mut().zip(&raw) {
                if let Some(r) = r
                    && hi > lo
                {
                    *t += w * (100 * (r - lo) / (hi - lo));
                }
            }
        }
        total
    }

    /// Best node for pod `p` (not reserved for another job), optionally
    /// restricted to `only`: the packer's best, or, for a pod with
    /// constraints, the best that passes them, ranked with its preferences
    /// as [`SchedulerOptions::preferences`] says.
    pub fn best_node(
        &mut self,
        p: PodId,
        job: JobId,
        only: Option<&BTreeSet<NodeId>>,
    ) -> Option<(NodeId, GpuAssignment)> {
        let needs = self.pre_filter(p);
        if needs.is_none() {
            self.best_node_fast(p, job, only)
        } else {
            self.best_node_constrained(p, job, only, needs)
        }
    }

    /// [`Cycle::best_node`] for a pod with constraints. Without
    /// preferences it walks the signature's score heap best first and takes
    /// the first node that passes the constraints; with preferences it
    /// walks it until the best combined key is certain.
    fn best_node_constrained(
        &mut self,
        p: PodId,
        job: JobId,
        only: Option<&BTreeSet<NodeId>>,
        needs: Needs,
    ) -> Option<(NodeId, GpuAssignment)> {
        let s = self.sig_of(p);
        let pod = self.pod(p);
        let allowed = |r: Option<JobId>| r.is_none() || r == Some(job);
        let before = self.opts.preferences == PreferenceOrder::BeforePacking;
        // (total preference, node) of every candidate when scoring
        let mut pref: Vec<i64> = Vec::new();
        let mut target = 0i64;
        if needs.score || only.is_some() {
            let base: Vec<NodeId> = match only {
                Some(o) => o.iter().copied().collect(),
                None => self.sigs[s].ok_list.clone(),
            };
            let cands: Vec<NodeId> = base
                .into_iter()
                .filter(|&n| {
                    self.sigs[s].ok[n as usize]
                        && allowed(self.reserved[n as usize])
                        && self.constraint_refusal(p, n).is_none()
                })
                .collect();
            let totals = if needs.score {
                self.preference_totals(p, &cands)
            } else {
                vec![0; cands.len()]
            };
            if only.is_some() {
                // a domain: score every candidate
                let mut best: Option<((i64, Score), Reverse<NodeId>, GpuAssignment)> = None;
                for (&n, &t) in cands.iter().zip(&totals) {
                    self.out.stats.nodes_scored += 1;
                    if let Some(pl) = self.place_on(pod, n) {
                        let key = if before {
                            (t, pl.score)
                        } else {
                            (
                                pl.score.primary,
                                Score::keys(pl.score.secondary, pl.score.tie, t),
                            )
                        };
                        if best
                            .as_ref()
                            .is_none_or(|(k, rn, _)| (key, Reverse(n)) > (*k, *rn))
                        {
                            best = Some((key, Reverse(n), pl.gpus));
                        }
                    }
                }
                return best.map(|(_, Reverse(n), g)| (n, g));
            }
            pref = vec![i64::MIN; self.snap.nodes.len()];
            for (&n, &t) in cands.iter().zip(&totals) {
                pref[n as usize] = t;
            }
            target = totals.iter().copied().max().unwrap_or(i64::MIN);
            if cands.is_empty() {
                return None;
            }
        }
        self.sync_heap(s, pod);
        let mut aside: Vec<HeapItem> = Vec::new();
        let mut found: Option<(NodeId, GpuAssignment)> = None;
        // best so far when preferences rank: ((pref, score) or (score, pref))
        let mut best: Option<((i64, Score), HeapItem, GpuAssignment)> = None;
        while let Some(top) = self.sigs[s].heap.as_ref().and_then(|h| h.peek().copied()) {
            let n = top.node.0;
            if let Some(h) = self.sigs[s].heap.as_mut() {
                h.pop();
            }
            if top.version != self.cs.get(n).version {
                continue;
            }
            if !needs.score {
                if !allowed(self.reserved[n as usize]) || self.constraint_refusal(p, n).is_some() {
                    aside.push(top);
                    continue;
                }
                match self.place_on(pod, n) {
                    Some(pl) => {
                        aside.push(top);
                        found = Some((n, pl.gpus));
                        break;
                    }
                    None => continue,
                }
            }
            if pref[n as usize] == i64::MIN {
                // not a candidate (reserved, refused by a constraint)
                aside.push(top);
                continue;
            }
            let Some(pl) = self.place_on(pod, n) else {
                continue;
            };
            aside.push(top);
            let t = pref[n as usize];
            if before {
                if t == target {
                    found = Some((n, pl.gpus));
                    break;
                }
                if best.as_ref().is_none_or(|(k, _, _)| t > k.0) {
                    best = Some(((t, pl.score), top, pl.gpus));
                }
            } else {
                match &best {
                    Some((k, _, _)) if k.1 != pl.score => break,
                    Some((k, _, _)) if k.0 >= t => {}
                    _ => best = Some(((t, pl.score), top, pl.gpus)),
                }
            }
        }
        if let Some(h) = self.sigs[s].heap.as_mut() {
            h.extend(aside);
        }
        found.or(best.map(|(_, top, g)| (top.node.0, g)))
    }

    /// Builds the signature's score heap the first time, then brings it up
    /// to date with the nodes changed since it was last used.
    fn sync_heap(&mut self, s: usize, pod: &Pod) {
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
    }

    /// [`Cycle::best_node`] for a pod without constraints: the cached fast
    /// path.
    fn best_node_fast(
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
        self.sync_heap(s, pod);
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

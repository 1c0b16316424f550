//! The action pipeline: admit → allocate (with backfill and reservations)
//! → preempt → reclaim → explain.
//!
//! - **admit**: pending pods are grouped into jobs (a pod group, or a lone
//!   pod). Queues are visited most-under-served first (see
//!   [`crate::fairshare`]); inside a queue, jobs go by priority (high first),
//!   then arrival, then name. A job that would break a queue limit or a
//!   no-borrow rule waits.
//! - **allocate**: a job is placed inside a [`Statement`]; a gang commits
//!   only when `minMember` pods fit (else everything rolls back). Gangs with
//!   a topology constraint try one domain at a time (best fit first); a
//!   preferred constraint falls back to the whole cluster.
//! - **backfill**: when a job does not fit, later jobs still try (so small
//!   jobs use idle capacity). Once the head job has waited
//!   `reserve_after_ms`, nodes are reserved for it: nothing else is placed
//!   there, and they drain until it fits (no starvation).
//! - **preempt**: a job that still does not fit may evict pods of its own
//!   queue with lower priority. Victims are chosen per node with the fewest
//!   and lowest-priority victims (greedy removal, then reprieve); a victim in
//!   a running gang takes its whole gang with it. Evictions are committed
//!   only if the preemptor then fits; the freed nodes are nominated for it.
//! - **reclaim**: a queue below what it deserves may evict pods of queues
//!   above what they deserve (if reclaimable), never pushing them below
//!   their deserved share or guarantee.
//! - **explain**: every pod left pending gets a message in kube-scheduler's
//!   style plus queue, gang and reservation reasons.

use crate::decision::{CycleOutput, Decision, Explanation, GroupPhase, Verdict};
use crate::fairshare::{QueueIdx, QueueTree};
use crate::plugin::{Filter, FilterResult, PackEnv, Packer};
use crate::reason::{EvictionKind, EvictionReason, NodeReason, NodeSummary, PendingReason};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase, Snapshot};
use crate::state::ClusterState;
use crate::statement::{Op, Statement};
use gpusched_model::{GpuRequest, Pod, ResourceKind, ResourceVec, TopologyConstraint};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Knobs of the action pipeline (policy knobs live in the plugins).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerOptions {
    /// Let smaller jobs use idle capacity while a bigger one waits.
    pub backfill: bool,
    /// After the head of a queue has waited this long (ms), capacity is
    /// reserved for it and backfill may no longer use it.
    pub reserve_after_ms: u64,
    /// How many jobs may hold reservations at once.
    pub max_reservations: u32,
    /// Preempt lower-priority pods of the same queue.
    pub preemption: bool,
    /// Reclaim borrowed capacity across queues.
    pub reclaim: bool,
    /// Upper bound on evictions per cycle.
    pub max_evictions_per_cycle: u32,
    /// Upper bound on topology domains tried per gang.
    pub max_domains_per_gang: u32,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            backfill: true,
            reserve_after_ms: 300_000,
            max_reservations: 1,
            preemption: true,
            reclaim: true,
            max_evictions_per_cycle: 256,
            max_domains_per_gang: 32,
        }
    }
}

/// The scheduler: the action pipeline plus explicitly registered plugins.
pub struct Scheduler {
    pub opts: SchedulerOptions,
    filters: Vec<Box<dyn Filter>>,
    packer: Box<dyn Packer>,
}

type JobId = usize;

#[derive(Debug)]
struct Job {
    queue: QueueIdx,
    priority: i32,
    arrival: u64,
    name: String,
    group: Option<usize>,
    /// Pending pods, in name order.
    pods: Vec<PodId>,
    /// How many of `pods` must be placed together (the rest are extras).
    need: usize,
    topology: Option<TopologyConstraint>,
    /// Nodes nominated for this job in the snapshot.
    nominated: Vec<NodeId>,
}

impl Job {
    fn demand(&self, snap: &Snapshot) -> ResourceVec {
        let mut r = ResourceVec::default();
        for &p in &self.pods[..self.need.min(self.pods.len())] {
            r.add(&snap.pods[p as usize].pod.demand());
        }
        r
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
struct HeapItem {
    score: i64,
    node: Reverse<NodeId>,
    version: u64,
}

/// Per pod-signature cache: static filter verdicts and a lazy max-heap of
/// node scores, kept fresh through the cycle's change log.
struct SigCache {
    rep: PodId,
    ok: Vec<bool>,
    ok_list: Vec<NodeId>,
    rejects: BTreeMap<NodeReason, u32>,
    heap: Option<BinaryHeap<HeapItem>>,
    log_pos: usize,
}

/// Mutable state of one cycle.
struct Cycle<'s> {
    snap: &'s Snapshot,
    cs: ClusterState<'s>,
    tree: QueueTree,
    sigs: Vec<SigCache>,
    sig_index: BTreeMap<u64, Vec<usize>>,
    pod_sig: Vec<Option<usize>>,
    change_log: Vec<NodeId>,
    reserved: Vec<Option<JobId>>,
    /// Running pods per node (pod ids), for victim search.
    on_node: Vec<Vec<PodId>>,
    /// Pods evicted (tentatively or for real) this cycle.
    gone: Vec<bool>,
    /// Bound or nominated this cycle.
    placed: Vec<bool>,
    out: CycleOutput,
    notes: BTreeMap<PodId, PendingReason>,
    evictions: u32,
    /// Running members per group index.
    group_running: Vec<Vec<PodId>>,
}

fn sig_hash(p: &Pod) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.requests.hash(&mut h);
    p.gpu.hash(&mut h);
    p.gpu_models.hash(&mut h);
    p.min_gpu_memory_mib.hash(&mut h);
    p.node_selector.hash(&mut h);
    format!("{:?}{:?}", p.affinity, p.tolerations).hash(&mut h);
    h.finish()
}

fn same_sig(a: &Pod, b: &Pod) -> bool {
    a.requests == b.requests
        && a.gpu == b.gpu
        && a.gpu_models == b.gpu_models
        && a.min_gpu_memory_mib == b.min_gpu_memory_mib
        && a.node_selector == b.node_selector
        && a.affinity == b.affinity
        && a.tolerations == b.tolerations
}

impl Scheduler {
    pub fn new(
        opts: SchedulerOptions,
        filters: Vec<Box<dyn Filter>>,
        packer: Box<dyn Packer>,
    ) -> Self {
        Scheduler {
            opts,
            filters,
            packer,
        }
    }

    pub fn packer_name(&self) -> &'static str {
        self.packer.name()
    }

    pub fn filter_names(&self) -> Vec<&'static str> {
        self.filters.iter().map(|f| f.name()).collect()
    }

    /// One scheduling cycle over `snap` at virtual time `now_ms`.
    pub fn cycle(&mut self, snap: &Snapshot, now_ms: u64, seed: u64) -> CycleOutput {
        let (cs, errors) = ClusterState::from_snapshot(snap);
        let (mut tree, problems) = QueueTree::build(&snap.queues);
        tree.account(snap);
        let mut capacity = ResourceVec::default();
        for (i, n) in snap.nodes.iter().enumerate() {
            if !n.unschedulable {
                let mut a = n.allocatable.clone();
                a.gpu_milli = cs.state[i].gpu_usable.iter().filter(|u| **u).count() as u64
                    * gpusched_model::GPU_MILLI;
                capacity.add(&a);
            }
        }
        tree.compute_deserved(&capacity);
        self.packer.prepare(&PackEnv {
            snapshot: snap,
            state: &cs,
            seed,
        });
        let n_nodes = snap.nodes.len();
        let n_pods = snap.pods.len();
        let mut on_node = vec![Vec::new(); n_nodes];
        for (i, p) in snap.pods.iter().enumerate() {
            if let Some((n, _)) = p.holding()
                && (n as usize) < n_nodes
            {
                on_node[n as usize].push(i as PodId);
            }
        }
        let mut group_running = vec![Vec::new(); snap.groups.len()];
        let group_idx: BTreeMap<&str, usize> = snap
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (g.name.as_str(), i))
            .collect();
        for (i, p) in snap.pods.iter().enumerate() {
            if matches!(p.phase, PodPhase::Running { .. })
                && let Some(g) = p.pod.group.as_deref().and_then(|g| group_idx.get(g))
            {
                group_running[*g].push(i as PodId);
            }
        }
        let mut c = Cycle {
            snap,
            cs,
            tree,
            sigs: Vec::new(),
            sig_index: BTreeMap::new(),
            pod_sig: vec![None; n_pods],
            change_log: Vec::new(),
            reserved: vec![None; n_nodes],
            on_node,
            gone: vec![false; n_pods],
            placed: vec![false; n_pods],
            out: CycleOutput::default(),
            notes: BTreeMap::new(),
            evictions: 0,
            group_running,
        };
        for (i, e) in errors {
            c.notes.insert(
                i as PodId,
                PendingReason::SnapshotInconsistent {
                    error: e.to_string(),
                },
            );
        }
        c.out.warnings = problems;
        let jobs = build_jobs(
            snap,
            &c.tree,
            &group_idx,
            &c.group_running,
            now_ms,
            &mut c.out,
            &mut c.notes,
        );
        c.out.stats.pending = snap.pods.iter().filter(|p| p.is_pending()).count() as u32;

        // Nominations from the last cycle hold their nodes for their job.
        for (j, job) in jobs.iter().enumerate() {
            for &n in &job.nominated {
                if (n as usize) < n_nodes && c.reserved[n as usize].is_none() {
                    c.reserved[n as usize] = Some(j);
                }
            }
        }

        // ---- admit + allocate (+ backfill, reservations)
        let mut per_queue: Vec<Vec<JobId>> = vec![Vec::new(); c.tree.queues.len()];
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
        let mut cursor = vec![0usize; per_queue.len()];
        let mut blocked = vec![false; per_queue.len()];
        let mut unplaced: Vec<JobId> = Vec::new();
        // whether a job of the queue already waits for capacity this cycle
        let mut waiting_in_queue = vec![false; per_queue.len()];
        let mut reservations = 0u32;
        loop {
            // most under-served queue with work left
            let mut best: Option<(Vec<u64>, QueueIdx)> = None;
            for q in 0..per_queue.len() {
                if blocked[q] || cursor[q] >= per_queue[q].len() {
                    continue;
                }
                let key = c.tree.order_key(q);
                if best.as_ref().is_none_or(|(k, bq)| (&key, q) < (k, *bq)) {
                    best = Some((key, q));
                }
            }
            let Some((_, q)) = best else { break };
            let j = per_queue[q][cursor[q]];
            cursor[q] += 1;
            let job = &jobs[j];
            let demand = job.demand(snap);
            if let Some(why) = c.tree.quota_violation(q, &demand) {
                for &p in &job.pods {
                    c.notes.insert(p, PendingReason::Quota(why.clone()));
                }
                unplaced.push(j);
                continue;
            }
            if c.try_place(&self.filters, self.packer.as_ref(), &self.opts, j, job) {
                if job.group.is_some() {
                    c.out.stats.gangs_started += 1;
                }
                if waiting_in_queue[q] {
                    c.out.stats.backfilled += 1;
                }
                continue;
            }
            unplaced.push(j);
            if job.group.is_some() {
                c.out.stats.gangs_waiting += 1;
            }
            if !self.opts.backfill {
                blocked[q] = true;
            }
            let waited = now_ms.saturating_sub(job.arrival);
            let head = !waiting_in_queue[q];
            waiting_in_queue[q] = true;
            if head
                && waited >= self.opts.reserve_after_ms
                && reservations < self.opts.max_reservations
                && c.reserve(&self.filters, j, job)
            {
                reservations += 1;
            }
        }

        // ---- preempt, then reclaim
        for pass in [EvictionKind::Preempt, EvictionKind::Reclaim] {
            let enabled = match pass {
                EvictionKind::Preempt => self.opts.preemption,
                EvictionKind::Reclaim => self.opts.reclaim,
            };
            if !enabled {
                continue;
            }
            for &j in &unplaced {
                if c.evictions >= self.opts.max_evictions_per_cycle {
                    break;
                }
                let job = &jobs[j];
                if job.pods.iter().any(|&p| c.placed[p as usize])
                    || job.need == 0 && job.group.is_some()
                {
                    continue;
                }
                if c.tree
                    .quota_violation(job.queue, &job.demand(snap))
                    .is_some()
                {
                    continue;
                }
                c.try_evict_for(&self.filters, self.packer.as_ref(), pass, j, job);
            }
        }

        // ---- explain
        c.explain(&self.filters, self.packer.as_ref(), &jobs);
        c.out
    }
}

fn build_jobs(
    snap: &Snapshot,
    tree: &QueueTree,
    group_idx: &BTreeMap<&str, usize>,
    group_running: &[Vec<PodId>],
    now_ms: u64,
    out: &mut CycleOutput,
    notes: &mut BTreeMap<PodId, PendingReason>,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut group_pending: BTreeMap<usize, Vec<PodId>> = BTreeMap::new();
    for (i, p) in snap.pods.iter().enumerate() {
        let PodPhase::Pending { nominated } = p.phase else {
            continue;
        };
        let id = i as PodId;
        let Some(q) = tree.idx(&p.pod.queue) else {
            notes.insert(
                id,
                PendingReason::QueueMissing {
                    queue: p.pod.queue.clone(),
                },
            );
            continue;
        };
        match p.pod.group.as_deref() {
            Some(g) => match group_idx.get(g) {
                Some(&gi) => group_pending.entry(gi).or_default().push(id),
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
            }),
        }
    }
    for (gi, mut pods) in group_pending {
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
                PodPhase::Pending { nominated } => nominated,
                _ => None,
            })
            .collect();
        jobs.push(Job {
            queue: q,
            priority: g.priority,
            arrival,
            name: g.name.clone(),
            group: Some(gi),
            need: min.saturating_sub(running),
            pods,
            topology: g.topology,
            nominated,
        });
    }
    jobs
}

impl<'s> Cycle<'s> {
    fn pod(&self, p: PodId) -> &'s Pod {
        &self.snap.pods[p as usize].pod
    }

    fn sig_of(&mut self, filters: &[Box<dyn Filter>], p: PodId) -> usize {
        if let Some(s) = self.pod_sig[p as usize] {
            return s;
        }
        let pod = self.pod(p);
        let h = sig_hash(pod);
        let snap = self.snap;
        if let Some(list) = self.sig_index.get(&h) {
            for &s in list {
                if same_sig(&snap.pods[self.sigs[s].rep as usize].pod, pod) {
                    self.pod_sig[p as usize] = Some(s);
                    return s;
                }
            }
        }
        let mut ok = vec![false; snap.nodes.len()];
        let mut ok_list = Vec::new();
        let mut rejects: BTreeMap<NodeReason, u32> = BTreeMap::new();
        for (i, node) in snap.nodes.iter().enumerate() {
            let mut refused = None;
            for f in filters {
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
        self.sig_index.entry(h).or_default().push(s);
        self.pod_sig[p as usize] = Some(s);
        s
    }

    /// Where `pod` would go on `node` now, if it fits.
    fn place_on(
        &self,
        packer: &dyn Packer,
        pod: &Pod,
        node: NodeId,
    ) -> Option<crate::plugin::Placement> {
        if !self.cs.fits_non_gpu(pod, node) {
            return None;
        }
        packer.place(pod, node, &self.cs)
    }

    /// Best node for pod `p` (not reserved for another job), optionally
    /// restricted to `only`.
    fn best_node(
        &mut self,
        filters: &[Box<dyn Filter>],
        packer: &dyn Packer,
        p: PodId,
        job: JobId,
        only: Option<&BTreeSet<NodeId>>,
    ) -> Option<(NodeId, GpuAssignment)> {
        let s = self.sig_of(filters, p);
        let pod = self.pod(p);
        let allowed = |r: Option<JobId>| r.is_none() || r == Some(job);
        if let Some(only) = only {
            let mut best: Option<(i64, Reverse<NodeId>, GpuAssignment)> = None;
            for &n in only {
                if !self.sigs[s].ok[n as usize] || !allowed(self.reserved[n as usize]) {
                    continue;
                }
                self.out.stats.nodes_scored += 1;
                if let Some(pl) = self.place_on(packer, pod, n)
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
                if let Some(pl) = self.place_on(packer, pod, n) {
                    items.push(HeapItem {
                        score: pl.score,
                        node: Reverse(n),
                        version: self.cs.state[n as usize].version,
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
            if let Some(pl) = self.place_on(packer, pod, n) {
                let version = self.cs.state[n as usize].version;
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
            if top.version != self.cs.state[n as usize].version {
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
            match self.place_on(packer, pod, n) {
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

    fn note_change(&mut self, n: NodeId) {
        self.change_log.push(n);
    }

    fn st_place(&mut self, st: &mut Statement, p: PodId, n: NodeId, gpus: GpuAssignment) -> bool {
        let req = &self.snap.pods[p as usize].pod.requests;
        if st.place(&mut self.cs, p, n, req, gpus).is_err() {
            return false;
        }
        self.note_change(n);
        true
    }

    fn rollback(&mut self, st: &mut Statement, to: usize) {
        let nodes: Vec<NodeId> = st.ops_since(to).iter().map(op_node).collect();
        st.rollback_to(&mut self.cs, to);
        for n in nodes {
            self.note_change(n);
        }
    }

    /// Places `need` pods of the job (all or nothing), then extras.
    fn try_place(
        &mut self,
        filters: &[Box<dyn Filter>],
        packer: &dyn Packer,
        opts: &SchedulerOptions,
        j: JobId,
        job: &Job,
    ) -> bool {
        let domains: Vec<Option<BTreeSet<NodeId>>> = match job.topology {
            Some(t) if job.need > 1 => {
                let mut ds: Vec<Option<BTreeSet<NodeId>>> = self
                    .domains(t, job)
                    .into_iter()
                    .take(opts.max_domains_per_gang as usize)
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
                let placed = match self.best_node(filters, packer, p, j, dom.as_ref()) {
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
                        self.notes.entry(p).or_insert_with(|| why.clone());
                    }
                }
                continue;
            }
            // extras (elastic members beyond minMember): best effort
            // (each within the queue's quota, counting what this job takes)
            let mut taken = job.demand(self.snap);
            for &p in &job.pods[job.need..] {
                let mut with = taken.clone();
                with.add(&self.pod(p).demand());
                if self.tree.quota_violation(job.queue, &with).is_some() {
                    continue;
                }
                if let Some((n, g)) = self.best_node(filters, packer, p, j, dom.as_ref())
                    && self.st_place(&mut st, p, n, g)
                {
                    taken = with;
                }
            }
            let ops = st.commit();
            if ops.is_empty() {
                return false;
            }
            for op in ops {
                if let Op::Place {
                    pod, node, gpus, ..
                } = op
                {
                    self.bind(job, pod, node, gpus);
                }
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
                self.notes.entry(p).or_insert_with(|| why.clone());
            }
        }
        false
    }

    fn bind(&mut self, job: &Job, pod: PodId, node: NodeId, gpus: GpuAssignment) {
        let d = self.pod(pod).demand();
        self.tree.add_usage(job.queue, &d);
        self.placed[pod as usize] = true;
        self.out.stats.bound += 1;
        self.out.decisions.push(Decision::Bind { pod, node, gpus });
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
                e.0 += self.cs.state[i].free.gpu_milli;
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

    /// Reserves nodes for a job that has waited too long: nodes that could
    /// hold its members when empty, most free first.
    fn reserve(&mut self, filters: &[Box<dyn Filter>], j: JobId, job: &Job) -> bool {
        let Some(&first) = job.pods.first() else {
            return false;
        };
        let s = self.sig_of(filters, first);
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
                    .filter(|&g| {
                        self.cs.state[n as usize].gpu_usable[g] && self.cs.gpu_allowed(pod, n, g)
                    })
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
                Reverse(self.cs.state[n as usize].free.gpu_milli).0,
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
            self.reserved[n as usize] = Some(j);
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

    fn group_of(&self, p: PodId) -> Option<usize> {
        let g = self.pod(p).group.as_deref()?;
        self.snap.groups.iter().position(|x| x.name == g)
    }

    /// All pods that go if `victim` goes (its running gang).
    fn victim_unit(&self, victim: PodId) -> Vec<PodId> {
        match self.group_of(victim) {
            Some(g) if !self.group_running[g].is_empty() => self.group_running[g].clone(),
            _ => vec![victim],
        }
    }

    fn is_victim_ok(
        &self,
        pass: EvictionKind,
        job: &Job,
        v: PodId,
        surplus: &BTreeMap<QueueIdx, u64>,
    ) -> bool {
        let ps = &self.snap.pods[v as usize];
        if self.gone[v as usize]
            || !ps.pod.preemptible
            || !matches!(ps.phase, PodPhase::Running { .. })
        {
            return false;
        }
        let Some(vq) = self.tree.idx(&ps.pod.queue) else {
            return false;
        };
        match pass {
            EvictionKind::Preempt => vq == job.queue && ps.pod.priority < job.priority,
            EvictionKind::Reclaim => {
                vq != job.queue
                    && self.tree.queues[vq].reclaimable
                    && surplus.get(&vq).copied().unwrap_or(0) >= ps.pod.demand().gpu_milli
            }
        }
    }

    fn try_evict_for(
        &mut self,
        filters: &[Box<dyn Filter>],
        packer: &dyn Packer,
        pass: EvictionKind,
        j: JobId,
        job: &Job,
    ) {
        if job.topology.is_some_and(|t| t.required) && job.need > 1 {
            return; // victims for domain-bound gangs: not attempted (documented)
        }
        // reclaim only for queues below what they deserve
        let mut surplus: BTreeMap<QueueIdx, u64> = BTreeMap::new();
        if pass == EvictionKind::Reclaim {
            let a = &self.tree.acct[job.queue];
            let after = a.usage.gpu_milli + job.demand(self.snap).gpu_milli;
            if after > a.deserved.gpu_milli.max(a.guarantee.gpu_milli) {
                return;
            }
            for q in 0..self.tree.queues.len() {
                let s = self.tree.gpu_surplus(q);
                if s > 0 {
                    surplus.insert(q, s);
                }
            }
        }
        let mut st = Statement::new();
        let mut victims: Vec<PodId> = Vec::new();
        let mut placements: Vec<(PodId, NodeId)> = Vec::new();
        let count = job.need.max(1).min(job.pods.len());
        for &p in &job.pods[..count] {
            if let Some((n, g)) = self.best_node(filters, packer, p, j, None)
                && self.st_place(&mut st, p, n, g)
            {
                placements.push((p, n));
                continue;
            }
            // find the cheapest node to free
            let s = self.sig_of(filters, p);
            let pod = self.pod(p);
            let mut best: Option<((i32, usize, NodeId), Vec<PodId>)> = None;
            let cands = self.sigs[s].ok_list.clone();
            for n in cands {
                if self.reserved[n as usize].is_some_and(|r| r != j) {
                    continue;
                }
                let mut vs: Vec<PodId> = self.on_node[n as usize]
                    .iter()
                    .copied()
                    .filter(|&v| self.is_victim_ok(pass, job, v, &surplus))
                    .collect();
                if vs.is_empty() {
                    continue;
                }
                // quick bound: even all victims gone, not enough GPU
                let free = self.cs.state[n as usize].free.gpu_milli
                    + vs.iter().map(|&v| self.pod(v).gpu.milli()).sum::<u64>();
                if free < pod.gpu.milli() {
                    continue;
                }
                vs.sort_by_key(|&v| {
                    let ps = &self.snap.pods[v as usize];
                    let since = match ps.phase {
                        PodPhase::Running { since_ms, .. } => since_ms,
                        _ => 0,
                    };
                    (ps.pod.priority, Reverse(since), v)
                });
                let cp = st.checkpoint();
                let mut removed: Vec<PodId> = Vec::new();
                let mut fits = self.place_on(packer, pod, n).is_some();
                for &v in &vs {
                    if fits {
                        break;
                    }
                    for u in self.victim_unit(v) {
                        if !removed.contains(&u) {
                            self.st_remove(&mut st, u);
                            removed.push(u);
                        }
                    }
                    fits = self.place_on(packer, pod, n).is_some();
                }
                if fits {
                    // reprieve: give back victims not needed, highest priority first
                    let mut order = removed.clone();
                    order.sort_by_key(|&v| Reverse(self.pod(v).priority));
                    let mut kept = removed.clone();
                    for v in order {
                        if !kept.contains(&v) {
                            continue;
                        }
                        let unit = self.victim_unit(v);
                        let cp2 = st.checkpoint();
                        let mut ok = true;
                        for &u in &unit {
                            if let Some((un, ug)) = self.snap.pods[u as usize].holding() {
                                let req = &self.pod(u).requests;
                                if st.place(&mut self.cs, u, un, req, ug.clone()).is_err() {
                                    ok = false;
                                    break;
                                }
                            }
                        }
                        if ok && self.place_on(packer, pod, n).is_some() {
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
                    let key = (maxp, kept.len(), n);
                    if best.as_ref().is_none_or(|(k, _)| key < *k) {
                        best = Some((key, kept));
                    }
                }
                self.rollback(&mut st, cp);
            }
            let Some(((_, _, n), kept)) = best else {
                self.rollback(&mut st, 0);
                for &v in &victims {
                    self.gone[v as usize] = false;
                }
                return;
            };
            for v in kept {
                if !self.gone[v as usize] {
                    self.st_remove(&mut st, v);
                    self.gone[v as usize] = true;
                    victims.push(v);
                }
            }
            let placed = match self.place_on(packer, pod, n) {
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
                for &v in &victims {
                    if let Some(vq) = self.tree.idx(&self.pod(v).queue)
                        && let Some(s) = surplus.get_mut(&vq)
                    {
                        *s = s.saturating_sub(self.pod(v).gpu.milli());
                    }
                }
            }
        }
        if victims.is_empty() {
            // it fits without evictions after all (capacity freed earlier in the pass)
            let ops = st.commit();
            for op in ops {
                if let Op::Place {
                    pod, node, gpus, ..
                } = op
                {
                    self.bind(job, pod, node, gpus);
                }
            }
            return;
        }
        // commit: evictions + nominations; the placements stay in the state
        // so nothing else takes the freed capacity this cycle.
        let _ = st.commit();
        let reason = match pass {
            EvictionKind::Preempt => EvictionReason::Preempted {
                by: job.name.clone(),
                priority: job.priority,
            },
            EvictionKind::Reclaim => EvictionReason::Reclaimed {
                for_queue: self.tree.queues[job.queue].name.clone(),
            },
        };
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
        for (p, n) in placements {
            self.placed[p as usize] = true;
            self.reserved[n as usize] = Some(j);
            let d = self.pod(p).demand();
            self.tree.add_usage(job.queue, &d);
            self.out
                .decisions
                .push(Decision::Nominate { pod: p, node: n });
            self.notes.insert(
                p,
                PendingReason::VictimsTerminating {
                    victims: victims.len() as u32,
                    node: self.snap.nodes[n as usize].name.clone(),
                },
            );
        }
    }

    /// Tentatively removes a running pod (a trial: `gone` is not set).
    fn st_remove(&mut self, st: &mut Statement, v: PodId) {
        if let Some((n, g)) = self.snap.pods[v as usize].holding() {
            let req = &self.snap.pods[v as usize].pod.requests;
            st.remove(&mut self.cs, v, n, req, g.clone());
            self.note_change(n);
        }
    }

    /// Messages for every pod left pending.
    fn explain(&mut self, filters: &[Box<dyn Filter>], packer: &dyn Packer, jobs: &[Job]) {
        let mut diag_cache: BTreeMap<usize, (Verdict, Option<NodeSummary>)> = BTreeMap::new();
        let mut job_of: BTreeMap<PodId, &Job> = BTreeMap::new();
        for j in jobs {
            for &p in &j.pods {
                job_of.insert(p, j);
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
            if nominated {
                self.out.explanations.push(Explanation {
                    pod: p,
                    verdict: Verdict::Unschedulable,
                    reasons: vec![note.unwrap_or(PendingReason::Nominated)],
                });
                continue;
            }
            let (verdict, diag) = if job_of.contains_key(&p) {
                let s = self.sig_of(filters, p);
                diag_cache
                    .entry(s)
                    .or_insert_with(|| {
                        let pod = &self.snap.pods[self.sigs[s].rep as usize].pod;
                        diagnose(&self.cs, &self.sigs[s], &self.reserved, packer, pod)
                    })
                    .clone()
            } else {
                (Verdict::Unschedulable, None)
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
            });
        }
    }
}

fn op_node(op: &Op) -> NodeId {
    match op {
        Op::Place { node, .. } | Op::Remove { node, .. } => *node,
    }
}

/// kube-scheduler-style summary of why no node takes `pod` now.
fn diagnose(
    cs: &ClusterState<'_>,
    sig: &SigCache,
    reserved: &[Option<JobId>],
    packer: &dyn Packer,
    pod: &Pod,
) -> (Verdict, Option<NodeSummary>) {
    let mut reasons: BTreeMap<NodeReason, u32> = sig.rejects.clone();
    let mut ever_fits = false;
    let mut fits_now = 0u32;
    for &n in &sig.ok_list {
        let node = cs.node(n);
        // could it fit on the empty node?
        let mut empty_alloc = node.allocatable.clone();
        empty_alloc.gpu_milli = u64::MAX;
        empty_alloc.gpu_mem_mib = u64::MAX;
        let usable_allowed = (0..node.gpus.len())
            .filter(|&g| cs.get(n).gpu_usable[g] && cs.gpu_allowed(pod, n, g))
            .count() as u32;
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
        if !pod.gpu.is_none() && packer.place(pod, n, cs).is_none() {
            miss.push(match pod.gpu {
                GpuRequest::Share { .. } => NodeReason::InsufficientGpuShare,
                _ => NodeReason::Insufficient(ResourceKind::Gpu),
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
    };
    (verdict, Some(summary))
}

//! The mutable state of one cycle and its bookkeeping.
//!
//! Every change to the cluster state goes through a [`Statement`] and is
//! logged per node (`change_log`), so the candidate index re-scores only
//! the nodes that changed. Actions use these helpers; they do not touch
//! `cs` directly.

use super::candidates::SigCache;
use super::equiv::Equivalence;
use super::jobs::{Job, JobId, build_jobs, per_queue_order};
use super::{Parked, ParkedKey, SchedulerOptions};
use crate::decision::{CycleOutput, Decision};
use crate::fairshare::{QueueIdx, QueueTree, schedulable_capacity};
use crate::plugin::{
    ConstraintState, Filter, Needs, PackEnv, Packer, PodConstraint, SchedulingKey,
};
use crate::reason::{EvictionAttempt, PendingReason};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase, PodState, Snapshot};
use crate::state::{ClusterState, StateError};
use crate::statement::{Op, Statement};
use gpusched_model::Pod;
use std::collections::{BTreeMap, BTreeSet};

/// Mutable state of one cycle.
pub(super) struct Cycle<'s> {
    pub snap: &'s Snapshot,
    pub filters: &'s [Box<dyn Filter>],
    pub packer: &'s dyn Packer,
    /// The stateful constraint plugins and their states (kept in step with
    /// `cs` by every statement change).
    /// Only the plugins some pod of the snapshot is relevant to
    /// (`PodConstraint::relevant`): the others would ask nothing of any pod.
    pub constraints: Vec<&'s dyn PodConstraint>,
    pub cstates: Vec<Box<dyn ConstraintState + 's>>,
    /// Whether any constraint plugin is registered (else every pod takes
    /// the fast path without asking).
    pub any_constraints: bool,
    /// What each pod needed at its last pre-filter.
    pub pod_needs: Vec<Needs>,
    pub opts: &'s SchedulerOptions,
    pub now_ms: u64,
    pub cs: ClusterState<'s>,
    pub tree: QueueTree,
    /// The queue of every pod of the snapshot (looked up once per cycle).
    pub pod_queue: Vec<Option<QueueIdx>>,
    pub sigs: Vec<SigCache>,
    /// Cache entry of each scheduling key.
    pub sig_index: BTreeMap<SchedulingKey, usize>,
    pub pod_sig: Vec<Option<usize>>,
    pub change_log: Vec<NodeId>,
    /// The job each node is reserved (or nominated) for (set through
    /// [`Cycle::reserve_node`]).
    pub reserved: Vec<Option<JobId>>,
    /// The jobs some node is reserved (or nominated) for.
    pub reserving: BTreeSet<JobId>,
    /// Outcomes of jobs that failed, by their shape, to be reused by
    /// equivalent jobs while nothing was committed since (see
    /// [`super::equiv`]).
    pub equiv: Equivalence,
    /// Running pods per node (pod ids), for victim search.
    pub on_node: Vec<Vec<PodId>>,
    /// Whether `on_node`, `unit_since` and `unit_gpu` are built (only the
    /// eviction and consolidation searches read them:
    /// [`Cycle::build_victim_index`]).
    pub victims_built: bool,
    /// Pods evicted (tentatively or for real) this cycle.
    pub gone: Vec<bool>,
    /// Pods that hold capacity on its way out: those the snapshot shows
    /// terminating (in id order, listed once per cycle: every job that
    /// waits for them would otherwise scan all pods), then those evicted
    /// in this cycle, in eviction order. They hold it in `cs` until the
    /// runner sees them gone.
    pub leaving: Vec<PodId>,
    /// Bound or nominated this cycle.
    pub placed: Vec<bool>,
    /// The jobs of each queue in the order they are tried
    /// ([`per_queue_order`], sorted once per cycle; the allocate action
    /// takes it while it runs).
    pub order: Vec<Vec<JobId>>,
    /// Jobs the allocate action could not place (for preempt and reclaim).
    pub unplaced: Vec<JobId>,
    pub out: CycleOutput,
    /// The queue, quota, gang or reservation reason of a pending pod.
    pub notes: PerPod<PendingReason>,
    /// What the preempt and reclaim passes did for each job (by
    /// [`JobId`]) and why it freed nothing (for its pods' explanations).
    pub evict_notes: Vec<Vec<EvictionAttempt>>,
    pub evictions: u32,
    /// Running members per group index.
    pub group_running: Vec<Vec<PodId>>,
    /// Per pod, when the unit it would be evicted with (itself, or its
    /// running gang) last started: the latest bind among them (0 for a
    /// pod that is not running).
    pub unit_since: Vec<u64>,
    /// Per pod, the GPU milli of that unit.
    pub unit_gpu: Vec<u64>,
    /// Per queue, how long its pods run before they may be victims
    /// (its own `min_runtime_ms`, else its nearest ancestor's, else the
    /// options').
    pub min_runtime: Vec<u64>,
    /// Per queue, the GPU milli of its pods the snapshot shows terminating
    /// (counted in its usage, but already on their way out).
    pub leaving_gpu: Vec<u64>,
    /// Pods of parked jobs, by pod id (left out of the cycle; empty when
    /// nothing is parked).
    pub parked_pod: &'s [bool],
    /// Per queue, the order key of its first parked job: the jobs after it
    /// are not the queue's head and, without backfill, wait behind it.
    pub parked_first: Vec<Option<ParkedKey>>,
    /// Static filter verdicts kept by the engine (`None` in a full pass).
    pub kept_verdicts: Option<&'s BTreeMap<SchedulingKey, std::sync::Arc<super::Verdicts>>>,
    /// The verdicts this cycle computed that were not kept (for the engine).
    pub new_verdicts: super::NewVerdicts,
    /// Per signature of whole-GPU pods without claims: how many of them
    /// the usable GPUs of the nodes that pass its filters hold at most
    /// (`gang_never_fits`; the same for every gang of that signature in a
    /// cycle, where a deep queue has thousands).
    pub gang_most: BTreeMap<usize, u32>,
}

impl<'s> Cycle<'s> {
    /// Builds the cycle's state from the snapshot (cluster state, queue
    /// tree with deserved shares, the packer's preparation) and the jobs.
    pub fn new(
        (snap, cs, errors, parked): (
            &'s Snapshot,
            ClusterState<'s>,
            Vec<(usize, StateError)>,
            &'s Parked,
        ),
        filters: &'s [Box<dyn Filter>],
        packer: &'s mut dyn Packer,
        constraints: &'s [Box<dyn PodConstraint>],
        opts: &'s SchedulerOptions,
        now_ms: u64,
        seed: u64,
    ) -> (Self, Vec<Job>) {
        let (mut tree, problems) = QueueTree::build(&snap.queues);
        // each pod's queue and group, looked up once per cycle (pods of one
        // queue or gang tend to be neighbours: the last lookup is kept)
        // (the engine keeps them across cycles)
        let pod_queue = match &parked.pod_queue {
            Some(v) => v.clone(),
            None => lookup_per_pod(snap, |p| Some(p.pod.queue.as_str()), |q| tree.idx(q)),
        };
        let pod_group = match &parked.pod_group {
            Some(v) => v.clone(),
            None => {
                let group_idx: BTreeMap<&str, usize> = snap
                    .groups
                    .iter()
                    .enumerate()
                    .map(|(i, g)| (g.name.as_str(), i))
                    .collect();
                lookup_per_pod(
                    snap,
                    |p| p.pod.group.as_deref(),
                    |g| group_idx.get(g).copied(),
                )
            }
        };
        match &parked.sums {
            Some(sums) => {
                for (q, (usage, pending)) in sums.iter().enumerate().take(tree.queues.len()) {
                    tree.add_usage(q, usage);
                    tree.add_pending(q, pending);
                }
            }
            None => tree.account_with(snap, &pod_queue),
        }
        match &parked.capacity {
            Some(c) => tree.compute_deserved(c),
            None => tree.compute_deserved(&schedulable_capacity(snap)),
        }
        packer.prepare(&PackEnv {
            snapshot: snap,
            state: &cs,
            seed,
            pods_changed: parked.pods_changed.as_ref(),
        });
        let packer: &'s dyn Packer = packer;
        let n_nodes = snap.nodes.len();
        let n_pods = snap.pods.len();
        let mut group_running = vec![Vec::new(); snap.groups.len()];
        for (i, p) in snap.pods.iter().enumerate() {
            if matches!(p.phase, PodPhase::Running { .. })
                && let Some(g) = pod_group[i]
            {
                group_running[g].push(i as PodId);
            }
        }
        let min_runtime: Vec<u64> = (0..tree.queues.len())
            .map(|q| {
                let mut at = Some(q);
                while let Some(i) = at {
                    if let Some(m) = tree.queues[i].min_runtime_ms {
                        return m;
                    }
                    at = tree.parent[i];
                }
                opts.min_runtime_ms
            })
            .collect();
        let mut leaving_gpu = vec![0u64; tree.queues.len()];
        for (p, q) in snap.pods.iter().zip(&pod_queue) {
            if let (PodPhase::Terminating { .. }, Some(q)) = (&p.phase, q) {
                leaving_gpu[*q] += p.pod.gpu.milli();
            }
        }
        let constraints: Vec<&'s dyn PodConstraint> = constraints
            .iter()
            .enumerate()
            .filter(|(i, c)| match &parked.relevant {
                Some(counts) => counts.get(*i).is_none_or(|&n| n > 0),
                None => snap.pods.iter().any(|p| c.relevant(&p.pod)),
            })
            .map(|(_, c)| &**c)
            .collect();
        let mut cstates: Vec<Box<dyn ConstraintState + 's>> =
            constraints.iter().map(|c| c.start(snap)).collect();
        if !cstates.is_empty() {
            for (i, p) in snap.pods.iter().enumerate() {
                if let Some((n, _)) = p.holding()
                    && (n as usize) < n_nodes
                {
                    for c in &mut cstates {
                        c.add_pod(i as PodId, n);
                    }
                }
            }
        }
        let mut c = Cycle {
            snap,
            filters,
            packer,
            constraints,
            any_constraints: !cstates.is_empty(),
            pod_needs: vec![Needs::NONE; n_pods],
            cstates,
            opts,
            now_ms,
            cs,
            tree,
            pod_queue,
            sigs: Vec::new(),
            sig_index: BTreeMap::new(),
            pod_sig: vec![None; n_pods],
            change_log: Vec::new(),
            reserved: vec![None; n_nodes],
            reserving: BTreeSet::new(),
            equiv: Equivalence::default(),
            on_node: Vec::new(),
            victims_built: false,
            gone: vec![false; n_pods],
            leaving: (0..n_pods as PodId)
                .filter(|&p| matches!(snap.pods[p as usize].phase, PodPhase::Terminating { .. }))
                .collect(),
            placed: vec![false; n_pods],
            order: Vec::new(),
            unplaced: Vec::new(),
            out: CycleOutput::default(),
            notes: PerPod::new(n_pods),
            evict_notes: Vec::new(),
            evictions: 0,
            group_running,
            unit_since: Vec::new(),
            unit_gpu: Vec::new(),
            min_runtime,
            leaving_gpu,
            parked_pod: &parked.pod,
            parked_first: Vec::new(),
            kept_verdicts: parked.verdicts.as_ref(),
            new_verdicts: Vec::new(),
            gang_most: BTreeMap::new(),
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
        let mut jobs = build_jobs(
            snap,
            (&c.tree, &c.pod_queue, &parked.pod),
            &pod_group,
            &c.group_running,
            now_ms,
            &mut c.out,
            &mut c.notes,
        );
        c.parked_first = (0..c.tree.queues.len())
            .map(|q| parked.first.get(&c.tree.queues[q].name).cloned())
            .collect();
        c.out.stats.gangs_waiting += parked.gangs;
        c.out.stats.jobs_parked = parked.jobs;
        c.out.stats.pending = snap.pods.iter().filter(|p| p.is_pending()).count() as u32;
        // Nominations from earlier cycles (the scheduler's, or anyone's who
        // may write pod status) hold their nodes for their job only while
        // the pod could fit there and for a bounded time: one that never
        // can, or went stale, is dropped (kube-scheduler likewise treats a
        // nominated pod as a claim only where it passes the filters).
        for job in &mut jobs {
            let mut kept = Vec::new();
            for &p in &job.pods {
                if let PodPhase::Pending {
                    nominated: Some(n),
                    nominated_at_ms,
                } = snap.pods[p as usize].phase
                    && c.nomination_holds(p, n, nominated_at_ms)
                {
                    kept.push(n);
                }
            }
            job.nominated = kept;
        }
        c.order = per_queue_order(&jobs, c.tree.queues.len());
        c.evict_notes = vec![Vec::new(); jobs.len()];

        // Nominations from the last cycle hold their nodes for their job.
        for (j, job) in jobs.iter().enumerate() {
            for &n in &job.nominated {
                if (n as usize) < n_nodes && c.reserved[n as usize].is_none() {
                    c.reserve_node(n, j);
                }
            }
        }
        (c, jobs)
    }

    pub fn pod(&self, p: PodId) -> &'s Pod {
        &self.snap.pods[p as usize].pod
    }

    /// Reserves node `n` for job `j` (nothing else is placed there this
    /// cycle).
    pub fn reserve_node(&mut self, n: NodeId, j: JobId) {
        self.reserved[n as usize] = Some(j);
        self.reserving.insert(j);
    }

    pub fn note_change(&mut self, n: NodeId) {
        self.change_log.push(n);
    }

    /// Tentatively places pod `p` (recorded in `st`).
    pub fn st_place(
        &mut self,
        st: &mut Statement,
        p: PodId,
        n: NodeId,
        gpus: GpuAssignment,
    ) -> bool {
        let req = &self.snap.pods[p as usize].pod.requests;
        if st.place(&mut self.cs, p, n, req, gpus).is_err() {
            return false;
        }
        self.note_change(n);
        for c in &mut self.cstates {
            c.add_pod(p, n);
        }
        true
    }

    /// Puts a running pod that `st` removed back where it held (a
    /// reprieve in a preemption what-if); false if it no longer fits.
    pub fn st_restore(&mut self, st: &mut Statement, v: PodId) -> bool {
        if let Some((n, g)) = self.snap.pods[v as usize].holding() {
            let req = &self.snap.pods[v as usize].pod.requests;
            if st.place(&mut self.cs, v, n, req, g.clone()).is_err() {
                return false;
            }
            self.note_change(n);
            for c in &mut self.cstates {
                c.add_pod(v, n);
            }
        }
        true
    }

    /// Tentatively removes a running pod (a trial: `gone` is not set).
    pub fn st_remove(&mut self, st: &mut Statement, v: PodId) {
        if let Some((n, g)) = self.snap.pods[v as usize].holding() {
            let req = &self.snap.pods[v as usize].pod.requests;
            st.remove(&mut self.cs, v, n, req, g.clone());
            self.note_change(n);
            for c in &mut self.cstates {
                c.remove_pod(v, n);
            }
        }
    }

    /// Undoes `st` back to checkpoint `to`.
    pub fn rollback(&mut self, st: &mut Statement, to: usize) {
        if !self.cstates.is_empty() {
            // newest first, as the statement undoes them
            for op in st.ops_since(to).iter().rev() {
                for c in &mut self.cstates {
                    match *op {
                        Op::Place { pod, node, .. } => c.remove_pod(pod, node),
                        Op::Remove { pod, node, .. } => c.add_pod(pod, node),
                    }
                }
            }
        }
        let nodes: Vec<NodeId> = st.ops_since(to).iter().map(op_node).collect();
        st.rollback_to(&mut self.cs, to);
        for n in nodes {
            self.note_change(n);
        }
    }

    /// Commits the placements of `st` as bind decisions.
    pub fn bind_all(&mut self, job: &Job, st: Statement) -> usize {
        let ops = st.commit();
        let n = ops.len();
        for op in ops {
            if let Op::Place {
                pod, node, gpus, ..
            } = op
            {
                self.bind(job, pod, node, gpus);
            }
        }
        n
    }

    /// A bind decision (the state already holds the placement).
    pub fn bind(&mut self, job: &Job, pod: PodId, node: NodeId, gpus: GpuAssignment) {
        let d = self.pod(pod).demand();
        self.tree.add_usage(job.queue, &d);
        self.placed[pod as usize] = true;
        self.out.stats.bound += 1;
        self.out.decisions.push(Decision::Bind { pod, node, gpus });
    }

    pub fn group_of(&self, p: PodId) -> Option<usize> {
        let g = self.pod(p).group.as_deref()?;
        self.snap.groups.iter().position(|x| x.name == g)
    }

    /// All pods that go if `victim` goes (its running gang).
    pub fn victim_unit(&self, victim: PodId) -> Vec<PodId> {
        match self.group_of(victim) {
            Some(g) if !self.group_running[g].is_empty() => self.group_running[g].clone(),
            _ => vec![victim],
        }
    }
}

impl Cycle<'_> {
    /// Builds what the victim searches read — the running pods of each node,
    /// and per pod when its eviction unit (itself or its running gang) last
    /// started and the GPUs it holds — once per cycle, when a search first
    /// needs it (a cycle that places everything or parks the rest never
    /// does).
    pub fn build_victim_index(&mut self) {
        if self.victims_built {
            return;
        }
        self.victims_built = true;
        let snap = self.snap;
        let n_nodes = snap.nodes.len();
        let mut on_node = vec![Vec::new(); n_nodes];
        for (i, p) in snap.pods.iter().enumerate() {
            if let Some((n, _)) = p.holding()
                && (n as usize) < n_nodes
            {
                on_node[n as usize].push(i as PodId);
            }
        }
        let since = |p: &PodState| match p.phase {
            PodPhase::Running { since_ms, .. } => since_ms,
            _ => 0,
        };
        let mut unit_since: Vec<u64> = snap.pods.iter().map(since).collect();
        let mut unit_gpu: Vec<u64> = snap.pods.iter().map(|p| p.pod.gpu.milli()).collect();
        for members in &self.group_running {
            let latest = members.iter().map(|&m| unit_since[m as usize]).max();
            let gpu: u64 = members.iter().map(|&m| unit_gpu[m as usize]).sum();
            for &m in members {
                unit_since[m as usize] = latest.unwrap_or(0);
                unit_gpu[m as usize] = gpu;
            }
        }
        self.on_node = on_node;
        self.unit_since = unit_since;
        self.unit_gpu = unit_gpu;
    }

    /// The jobs this cycle could not place and did nothing for, which the
    /// engine may park: not placed, nominated or reserving, no pod whose
    /// constraint plugins have a say (what runs elsewhere may help those),
    /// and not a queue's head that has waited long enough to reserve (it
    /// stays in every cycle, as it may reserve once a slot frees).
    pub fn park_candidates(&mut self, jobs: &[Job]) -> Vec<super::ParkCandidate> {
        let nominated: BTreeSet<PodId> = self
            .out
            .decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Nominate { pod, .. } => Some(*pod),
                _ => None,
            })
            .collect();
        let unplaced: BTreeSet<JobId> = self.unplaced.iter().copied().collect();
        let head: Vec<Option<JobId>> = self
            .order
            .iter()
            .map(|list| list.iter().copied().find(|j| unplaced.contains(j)))
            .collect();
        let any_timeout_at = self
            .unplaced
            .iter()
            .filter_map(|&j| {
                let g = &self.snap.groups[jobs[j].group?];
                Some(jobs[j].arrival.saturating_add(g.schedule_timeout_ms?))
            })
            .filter(|&t| t > self.now_ms)
            .min();
        let mut out = Vec::new();
        for j in self.unplaced.clone() {
            let job = &jobs[j];
            if job.need == 0
                || !job.nominated.is_empty()
                || self.reserving.contains(&j)
                || job
                    .pods
                    .iter()
                    .any(|&p| self.placed[p as usize] || nominated.contains(&p))
            {
                continue;
            }
            if job.pods.iter().any(|&p| !self.pre_filter(p).is_none()) {
                continue;
            }
            let old = self.now_ms.saturating_sub(job.arrival) >= self.opts.reserve_after_ms;
            let parked_before = self.parked_first[job.queue].as_ref().is_some_and(|k| {
                (k.0, k.1, k.2.as_str())
                    < (
                        std::cmp::Reverse(job.priority),
                        job.arrival,
                        job.name.as_str(),
                    )
            });
            if old && head.get(job.queue) == Some(&Some(j)) && !parked_before {
                continue;
            }
            let group = job.group.map(|g| &self.snap.groups[g]);
            let quota = matches!(
                job.pods.first().and_then(|p| self.notes.get(p)),
                Some(PendingReason::Quota(_))
            );
            let shape = job.pods[..job.need.min(job.pods.len())]
                .iter()
                .map(|&p| self.scheduling_key(&self.snap.pods[p as usize].pod))
                .collect();
            out.push(super::ParkCandidate {
                shape,
                demand: job.demand.clone(),
                pods: job.pods.clone(),
                group: group.map(|g| g.name.clone()),
                queue: self.tree.queues[job.queue].name.clone(),
                priority: job.priority,
                arrival: job.arrival,
                name: job.name.clone(),
                timeout_at: group
                    .and_then(|g| g.schedule_timeout_ms)
                    .map(|t| job.arrival.saturating_add(t)),
                any_timeout_at,
                counts_waiting: group.is_some() && !quota,
                holds_place: !quota,
            });
        }
        out
    }
}

/// A note per pod of the snapshot (indexed by pod id: a deep queue notes
/// tens of thousands of pods per cycle).
pub(super) struct PerPod<T>(Vec<Option<T>>);

impl<T> PerPod<T> {
    /// No note for any of `n` pods.
    pub fn new(n: usize) -> Self {
        PerPod(std::iter::repeat_with(|| None).take(n).collect())
    }

    /// Sets pod `p`'s note (ignored for a pod outside the snapshot).
    pub fn insert(&mut self, p: PodId, v: T) {
        if let Some(slot) = self.0.get_mut(p as usize) {
            *slot = Some(v);
        }
    }

    /// Sets pod `p`'s note unless it has one.
    pub fn insert_if_none(&mut self, p: PodId, v: impl FnOnce() -> T) {
        if let Some(slot) = self.0.get_mut(p as usize)
            && slot.is_none()
        {
            *slot = Some(v());
        }
    }

    /// Pod `p`'s note.
    pub fn get(&self, p: &PodId) -> Option<&T> {
        self.0.get(*p as usize)?.as_ref()
    }
}

fn op_node(op: &Op) -> NodeId {
    match op {
        Op::Place { node, .. } | Op::Remove { node, .. } => *node,
    }
}

/// `find(key(pod))` for every pod of the snapshot (`None` where `key` gives
/// none), reusing the last lookup while neighbours share the key.
fn lookup_per_pod<'a, T: Copy>(
    snap: &'a Snapshot,
    key: impl Fn(&'a PodState) -> Option<&'a str>,
    find: impl Fn(&str) -> Option<T>,
) -> Vec<Option<T>> {
    let mut last: Option<(&str, Option<T>)> = None;
    snap.pods
        .iter()
        .map(|p| {
            let k = key(p)?;
            match last {
                Some((name, v)) if name == k => v,
                _ => {
                    let v = find(k);
                    last = Some((k, v));
                    v
                }
            }
        })
        .collect()
}

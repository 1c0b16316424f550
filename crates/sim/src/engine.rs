//! The discrete-event loop: virtual time in milliseconds, one event queue,
//! scheduling cycles coalesced after events and repeated while pods wait.
//!
//! Every cycle the simulator builds a [`Snapshot`] (a `PodId` is an index
//! into `snapshot.pods`; the simulator keeps its own id maps), calls
//! [`Scheduler::cycle`] and applies the decisions defensively: each bind is
//! checked against a [`ClusterState`] built from the same snapshot, and a
//! refused decision is counted and reported, never applied.

use crate::frag::{engine_for, fragmentation_milli};
use crate::metrics::{self, Cdf, Heatmap, Incident, QueueReport, Series, SimResult, Totals};
use crate::workload::{EventKind, Scenario, fmt_duration};
use gpusched_core::state::share_milli;
use gpusched_core::{
    ClusterState, CycleOutput, Decision, EvictionKind, GpuAssignment, GroupPhase, PodPhase,
    PodState, Scheduler, Snapshot,
};
use gpusched_model::{GPU_MILLI, GpuHealth, GpuRequest, Node, Pod, PodGroup};
use gpusched_plugins::packing::fgd::FragEngine;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

/// Observes a run from outside (wall-clock timing, progress). The library
/// never reads the clock itself.
pub trait Hooks {
    fn before_cycle(&mut self, _now_ms: u64) {}
    fn after_cycle(&mut self, _now_ms: u64, _out: &CycleOutput) {}
    /// Called after every cycle; `horizon_ms` is an estimate of the end.
    fn progress(&mut self, _now_ms: u64, _horizon_ms: u64) {}
}

/// Hooks that do nothing.
pub struct NoHooks;
impl Hooks for NoHooks {}

/// How many simulator errors are kept verbatim in the result.
const MAX_ERRORS: usize = 50;
/// At most this many buckets in the time series and heat map.
const BUCKETS: u64 = 150;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Cluster(u32),
    Complete { pod: u32, epoch: u32 },
    Arrival(u32),
    Retry { pod: u32, epoch: u32 },
    Cycle,
}

impl Ev {
    fn class(&self) -> u8 {
        match self {
            Ev::Cluster(_) => 0,
            Ev::Complete { .. } => 1,
            Ev::Arrival(_) => 2,
            Ev::Retry { .. } => 3,
            Ev::Cycle => 9,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Ph {
    NotArrived,
    Pending {
        nominated: Option<u32>,
    },
    Backoff,
    Running {
        node: u32,
        gpus: GpuAssignment,
        since: u64,
    },
    Succeeded,
    Failed,
}

struct PodRt {
    pod: Pod,
    job: u32,
    group: Option<u32>,
    queue: usize,
    phase: Ph,
    epoch: u32,
    retries: u32,
    first_start: Option<u64>,
}

struct GroupRt {
    pg: PodGroup,
    members: Vec<u32>,
    retries: u32,
    running: u32,
}

struct JobRt {
    /// Pod ids `first_pod .. first_pod + pods` (contiguous).
    first_pod: u32,
    arrival: u64,
    duration: u64,
    left: u32,
    failed: bool,
    end: Option<u64>,
    queue: usize,
}

struct NodeRt {
    node: Node,
    up: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Cause {
    Preempt,
    Failure,
    Drain,
}

/// Runs a scenario to its end with `scheduler` and `seed`.
pub fn run(
    scenario: &Scenario,
    scheduler: &mut Scheduler,
    seed: u64,
    hooks: &mut dyn Hooks,
) -> SimResult {
    let mut sim = Sim::new(scenario, seed);
    sim.run(scheduler, hooks);
    sim.result(scheduler.packer_name())
}

struct Sim<'a> {
    sc: &'a Scenario,
    seed: u64,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Reverse<(u64, u8, u64, Ev)>>,
    non_cycle_events: u64,
    next_cycle: Option<u64>,
    last_cycle: Option<u64>,
    last_change: u64,
    nodes: Vec<NodeRt>,
    node_idx: BTreeMap<String, u32>,
    pods: Vec<PodRt>,
    groups: Vec<GroupRt>,
    group_idx: BTreeMap<String, u32>,
    jobs: Vec<JobRt>,
    /// Pods pending or running, in id order.
    active: BTreeSet<u32>,
    /// FGD fragmentation engine; rebuilt with the node cache.
    frag: Option<FragEngine>,
    horizon: u64,
    ended_by: &'static str,
    // metrics
    t: Totals,
    cycles: u64,
    errors: Vec<String>,
    queue_used: Vec<u64>,
    /// GPU milli held per node.
    node_used: Vec<u64>,
    /// Running pods per node.
    node_pods: Vec<BTreeSet<u32>>,
    /// Node maps of the snapshot (snapshot → sim, sim → snapshot), rebuilt
    /// when a node changed; `cached_nodes` holds the snapshot's nodes
    /// between cycles (lent to each snapshot and given back).
    node_cache: Option<(Vec<u32>, Vec<Option<u32>>)>,
    cached_nodes: Vec<Node>,
    /// Pod states of the last snapshot and their sim ids, reused.
    snap_pods: Vec<PodState>,
    snap_ids: Vec<u32>,
    queue_preempted: Vec<u64>,
    waits: Vec<Vec<u64>>,
    series: Vec<(u64, [f64; 6])>,
    node_steps: Vec<Vec<(u64, f64)>>,
    last_sample: Option<u64>,
    // integrals over time (milli·ms)
    used_int: Vec<f64>,
    fair_int: Vec<f64>,
    gap_int: f64,
    cap_int: f64,
    prev_q: Option<(Vec<u64>, Vec<u64>, u64, u64)>,
    incidents: Vec<Incident>,
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, seed: u64) -> Self {
        let nodes: Vec<NodeRt> = sc
            .nodes
            .iter()
            .map(|n| NodeRt {
                node: n.clone(),
                up: true,
            })
            .collect();
        let node_idx = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| (n.node.name.clone(), i as u32))
            .collect();
        let qidx: BTreeMap<&str, usize> = sc
            .queues
            .iter()
            .enumerate()
            .map(|(i, q)| (q.name.as_str(), i))
            .collect();
        let mut pods = Vec::new();
        let mut groups = Vec::new();
        let mut group_idx = BTreeMap::new();
        let mut jobs = Vec::new();
        let mut horizon = 0u64;
        for (ji, j) in sc.jobs.iter().enumerate() {
            let queue = qidx.get(j.queue.as_str()).copied().unwrap_or(0);
            let first_pod = pods.len() as u32;
            let gid = j.group.as_ref().map(|g| {
                let id = groups.len() as u32;
                group_idx.insert(g.name.clone(), id);
                groups.push(GroupRt {
                    pg: g.clone(),
                    members: Vec::new(),
                    retries: 0,
                    running: 0,
                });
                id
            });
            for p in 0..j.pods {
                let mut pod = j.template.clone();
                pod.name = format!("{}-p{p}", j.name);
                let id = pods.len() as u32;
                if let Some(g) = gid {
                    groups[g as usize].members.push(id);
                }
                pods.push(PodRt {
                    pod,
                    job: ji as u32,
                    group: gid,
                    queue,
                    phase: Ph::NotArrived,
                    epoch: 0,
                    retries: 0,
                    first_start: None,
                });
            }
            jobs.push(JobRt {
                first_pod,
                arrival: j.arrival_ms,
                duration: j.duration_ms,
                left: j.pods,
                failed: false,
                end: None,
                queue,
            });
            horizon = horizon.max(j.arrival_ms + j.duration_ms);
        }
        for e in &sc.events {
            horizon = horizon.max(e.at_ms);
        }
        if let Some(u) = sc.settings.until_ms {
            horizon = u;
        }
        let nq = sc.queues.len();
        let nn = nodes.len();
        let mut sim = Sim {
            sc,
            seed,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            non_cycle_events: 0,
            next_cycle: None,
            last_cycle: None,
            last_change: 0,
            nodes,
            node_idx,
            pods,
            groups,
            group_idx,
            jobs,
            active: BTreeSet::new(),
            frag: None,
            horizon: horizon.max(1),
            ended_by: "done",
            t: Totals::default(),
            cycles: 0,
            errors: Vec::new(),
            queue_used: vec![0; nq],
            node_used: vec![0; nn],
            node_pods: vec![BTreeSet::new(); nn],
            node_cache: None,
            cached_nodes: Vec::new(),
            snap_pods: Vec::new(),
            snap_ids: Vec::new(),
            queue_preempted: vec![0; nq],
            waits: vec![Vec::new(); nq],
            series: Vec::new(),
            node_steps: vec![Vec::new(); nn],
            last_sample: None,
            used_int: vec![0.0; nq],
            fair_int: vec![0.0; nq],
            gap_int: 0.0,
            cap_int: 0.0,
            prev_q: None,
            incidents: Vec::new(),
        };
        for (i, j) in sc.jobs.iter().enumerate() {
            sim.push(j.arrival_ms, Ev::Arrival(i as u32));
        }
        for (i, e) in sc.events.iter().enumerate() {
            sim.push(e.at_ms, Ev::Cluster(i as u32));
        }
        sim.t.jobs = sc.jobs.len() as u64;
        sim.t.pods = sim.pods.len() as u64;
        sim
    }

    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        if ev != Ev::Cycle {
            self.non_cycle_events += 1;
        }
        self.heap.push(Reverse((at, ev.class(), self.seq, ev)));
    }

    fn error(&mut self, msg: String) {
        self.t.sim_errors += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors
                .push(format!("t={}: {msg}", fmt_duration(self.now)));
        }
    }

    fn request_cycle(&mut self, at: u64) {
        let t = match self.last_cycle {
            Some(l) => at.max(l + self.sc.settings.cycle_interval_ms.max(1)),
            None => at,
        };
        if self.next_cycle.is_some_and(|x| x <= t) {
            return;
        }
        self.next_cycle = Some(t);
        self.push(t, Ev::Cycle);
    }

    fn run(&mut self, sched: &mut Scheduler, hooks: &mut dyn Hooks) {
        let until = self.sc.settings.until_ms;
        while let Some(Reverse((at, _, _, ev))) = self.heap.pop() {
            if ev != Ev::Cycle {
                self.non_cycle_events -= 1;
            }
            if let Some(u) = until
                && at > u
            {
                self.now = u;
                self.ended_by = "until";
                break;
            }
            self.now = at;
            match ev {
                Ev::Cycle => {
                    if self.next_cycle != Some(at) {
                        continue; // superseded
                    }
                    self.next_cycle = None;
                    self.cycle(sched, hooks);
                    hooks.progress(self.now, self.horizon);
                    let waiting = self
                        .active
                        .iter()
                        .any(|&p| matches!(self.pods[p as usize].phase, Ph::Pending { .. }));
                    if waiting {
                        if self.non_cycle_events == 0
                            && self.now.saturating_sub(self.last_change)
                                >= self.sc.settings.idle_stop_ms
                        {
                            self.ended_by = "idle";
                            break;
                        }
                        let tick = self.now + self.sc.settings.tick_ms.max(1);
                        self.request_cycle(tick);
                    }
                }
                Ev::Arrival(j) => {
                    self.last_change = at;
                    self.arrive(j);
                    self.request_cycle(at);
                }
                Ev::Complete { pod, epoch } => {
                    if self.complete(pod, epoch) {
                        self.last_change = at;
                        self.request_cycle(at);
                    }
                }
                Ev::Retry { pod, epoch } => {
                    let p = &mut self.pods[pod as usize];
                    if p.epoch == epoch && p.phase == Ph::Backoff {
                        p.phase = Ph::Pending { nominated: None };
                        self.active.insert(pod);
                        self.last_change = at;
                        self.request_cycle(at);
                    }
                }
                Ev::Cluster(i) => {
                    self.last_change = at;
                    self.cluster_event(i as usize);
                    self.request_cycle(at);
                }
            }
            if self.sc.settings.verify && ev != Ev::Cycle {
                self.verify("after event");
            }
        }
        self.close_integrals(self.now);
    }

    fn arrive(&mut self, j: u32) {
        let first = self.jobs[j as usize].first_pod;
        let n = self.sc.jobs[j as usize].pods;
        for id in first..first + n {
            let p = &mut self.pods[id as usize];
            if p.phase == Ph::NotArrived {
                p.phase = Ph::Pending { nominated: None };
                self.active.insert(id);
            }
        }
    }

    fn complete(&mut self, pod: u32, epoch: u32) -> bool {
        let p = &self.pods[pod as usize];
        if p.epoch != epoch || !matches!(p.phase, Ph::Running { .. }) {
            return false;
        }
        self.stop(pod);
        let p = &mut self.pods[pod as usize];
        p.phase = Ph::Succeeded;
        self.t.pods_succeeded += 1;
        let j = &mut self.jobs[p.job as usize];
        j.left = j.left.saturating_sub(1);
        if j.left == 0 && !j.failed {
            j.end = Some(self.now);
        }
        true
    }

    /// Takes a running pod off its node (accounting only).
    fn stop(&mut self, pod: u32) -> Option<(u32, GpuAssignment)> {
        let p = &mut self.pods[pod as usize];
        let Ph::Running { node, gpus, .. } = std::mem::replace(&mut p.phase, Ph::Backoff) else {
            return None;
        };
        p.epoch += 1;
        self.active.remove(&pod);
        self.queue_used[p.queue] = self.queue_used[p.queue].saturating_sub(gpus.milli());
        self.node_used[node as usize] = self.node_used[node as usize].saturating_sub(gpus.milli());
        self.node_pods[node as usize].remove(&pod);
        if let Some(g) = p.group {
            let g = &mut self.groups[g as usize];
            g.running = g.running.saturating_sub(1);
        }
        Some((node, gpus))
    }

    /// Stops `pod` for `cause`, with its gang, and decides what comes next.
    /// Returns the pods stopped with what they held.
    fn kill(&mut self, pod: u32, cause: Cause) -> Vec<(u32, u32, GpuAssignment)> {
        let targets: Vec<u32> = match self.pods[pod as usize].group {
            Some(g) => {
                let mut v: Vec<u32> = self.groups[g as usize]
                    .members
                    .iter()
                    .copied()
                    .filter(|&m| matches!(self.pods[m as usize].phase, Ph::Running { .. }))
                    .collect();
                if !v.contains(&pod) {
                    v.push(pod);
                }
                v
            }
            None => vec![pod],
        };
        let mut stopped = Vec::new();
        for &t in &targets {
            if let Some((n, g)) = self.stop(t) {
                stopped.push((t, n, g));
            }
        }
        if stopped.is_empty() {
            return stopped;
        }
        let group = self.pods[pod as usize].group;
        if group.is_some() {
            self.t.gang_restarts += 1;
        }
        match cause {
            Cause::Preempt | Cause::Drain => {
                for &(t, _, _) in &stopped {
                    self.pods[t as usize].phase = Ph::Pending { nominated: None };
                    self.active.insert(t);
                    self.t.requeues += 1;
                }
            }
            Cause::Failure => {
                self.t.failure_kills += stopped.len() as u64;
                let retries = match group {
                    Some(g) => {
                        self.groups[g as usize].retries += 1;
                        self.groups[g as usize].retries
                    }
                    None => {
                        self.pods[pod as usize].retries += 1;
                        self.pods[pod as usize].retries
                    }
                };
                if retries > self.sc.settings.retry_limit {
                    // give up on the whole unit (its waiting members too)
                    let unit: Vec<u32> = match group {
                        Some(g) => self.groups[g as usize].members.clone(),
                        None => vec![pod],
                    };
                    for m in unit {
                        let p = &mut self.pods[m as usize];
                        if matches!(p.phase, Ph::Succeeded | Ph::Failed) {
                            continue;
                        }
                        if matches!(p.phase, Ph::Running { .. }) {
                            continue; // not in this gang attempt
                        }
                        p.phase = Ph::Failed;
                        p.epoch += 1;
                        self.active.remove(&m);
                        self.t.pods_failed += 1;
                        self.t.retry_limit_failures += 1;
                        let j = &mut self.jobs[p.job as usize];
                        if !j.failed {
                            j.failed = true;
                            j.end = None;
                        }
                    }
                } else {
                    let s = &self.sc.settings;
                    let back = s
                        .backoff_ms
                        .saturating_mul(1u64 << (retries - 1).min(30))
                        .min(s.backoff_max_ms.max(s.backoff_ms));
                    for &(t, _, _) in &stopped {
                        let p = &mut self.pods[t as usize];
                        p.phase = Ph::Backoff;
                        let epoch = p.epoch;
                        self.t.retries += 1;
                        self.push(self.now + back, Ev::Retry { pod: t, epoch });
                    }
                }
            }
        }
        stopped
    }

    fn cluster_event(&mut self, i: usize) {
        let e = &self.sc.events[i];
        let Some(&n) = self.node_idx.get(&e.node) else {
            self.error(format!("event on unknown node {:?}", e.node));
            return;
        };
        let on_node = |s: &Self| -> Vec<u32> { s.node_pods[n as usize].iter().copied().collect() };
        self.node_cache = None;
        self.frag = None;
        let mut stopped = 0u32;
        let what;
        match e.kind {
            EventKind::NodeFailure => {
                what = "node failure".to_string();
                self.nodes[n as usize].up = false;
                for p in on_node(self) {
                    stopped += self.kill(p, Cause::Failure).len() as u32;
                }
            }
            EventKind::NodeRecovery => {
                what = "node recovery".to_string();
                self.nodes[n as usize].up = true;
            }
            EventKind::GpuFailure | EventKind::GpuRecovery => {
                let g = e.gpu.unwrap_or(0) as usize;
                let fail = e.kind == EventKind::GpuFailure;
                what = format!("gpu {g} {}", if fail { "failure" } else { "recovery" });
                let node = &mut self.nodes[n as usize].node;
                if let Some(gpu) = node.gpus.get_mut(g) {
                    gpu.health = if fail {
                        GpuHealth::Unhealthy
                    } else {
                        GpuHealth::Healthy
                    };
                }
                node.sync_gpu_allocatable();
                if fail {
                    let victims: Vec<u32> = on_node(self)
                        .into_iter()
                        .filter(|&p| match &self.pods[p as usize].phase {
                            Ph::Running { gpus, .. } => match gpus {
                                GpuAssignment::Whole(l) => l.contains(&(g as u32)),
                                GpuAssignment::Share { gpu, .. } => *gpu as usize == g,
                                GpuAssignment::None => false,
                            },
                            _ => false,
                        })
                        .collect();
                    for p in victims {
                        stopped += self.kill(p, Cause::Failure).len() as u32;
                    }
                }
            }
            EventKind::Drain => {
                what = "drain".to_string();
                self.nodes[n as usize].node.unschedulable = true;
                for p in on_node(self) {
                    stopped += self.kill(p, Cause::Drain).len() as u32;
                }
            }
            EventKind::Uncordon => {
                what = "uncordon".to_string();
                self.nodes[n as usize].node.unschedulable = false;
            }
        }
        // forget nominations of a node that can no longer take them
        if matches!(
            e.kind,
            EventKind::NodeFailure | EventKind::Drain | EventKind::GpuFailure
        ) {
            for &p in &self.active {
                if let Ph::Pending { nominated } = &mut self.pods[p as usize].phase
                    && *nominated == Some(n)
                {
                    *nominated = None;
                }
            }
        }
        self.incidents.push(Incident {
            t_ms: self.now,
            what,
            node: e.node.clone(),
            pods_stopped: stopped,
        });
    }

    /// Builds the snapshot of the live cluster: nodes that are up, pods
    /// pending or running. Returns it with the maps snapshot id → sim id.
    fn snapshot(&mut self) -> (Snapshot, Vec<u32>, Vec<u32>, Vec<Option<u32>>) {
        if self.node_cache.is_none() {
            let mut node_map = Vec::new();
            let mut rev = vec![None; self.nodes.len()];
            let mut nodes = Vec::new();
            for (i, n) in self.nodes.iter().enumerate() {
                if n.up {
                    rev[i] = Some(nodes.len() as u32);
                    node_map.push(i as u32);
                    nodes.push(n.node.clone());
                }
            }
            self.cached_nodes = nodes;
            self.node_cache = Some((node_map, rev));
        }
        let (node_map, rev) = self.node_cache.clone().unwrap_or_default();
        let nodes = std::mem::take(&mut self.cached_nodes);
        let mut pod_map = Vec::with_capacity(self.active.len());
        let mut pods = Vec::with_capacity(self.active.len());
        let mut groups_in: BTreeSet<u32> = BTreeSet::new();
        // Reuse last snapshot's pod states (same id order): only new pods
        // are cloned, only changed phases rebuilt.
        let old_ids = std::mem::take(&mut self.snap_ids);
        let old_pods = std::mem::take(&mut self.snap_pods);
        let mut old = old_ids.into_iter().zip(old_pods).peekable();
        for &id in &self.active {
            let p = &self.pods[id as usize];
            let same = |ph: &PodPhase| match (&p.phase, ph) {
                (Ph::Pending { nominated }, PodPhase::Pending { nominated: sn }) => {
                    nominated.and_then(|n| rev[n as usize]) == *sn
                }
                (
                    Ph::Running { node, gpus, since },
                    PodPhase::Running {
                        node: sn,
                        gpus: sg,
                        since_ms,
                    },
                ) => rev[*node as usize] == Some(*sn) && gpus == sg && since == since_ms,
                _ => false,
            };
            let phase = || match &p.phase {
                Ph::Pending { nominated } => Some(PodPhase::Pending {
                    nominated: nominated.and_then(|n| rev[n as usize]),
                }),
                Ph::Running { node, gpus, since } => {
                    rev[*node as usize].map(|sn| PodPhase::Running {
                        node: sn,
                        gpus: gpus.clone(),
                        since_ms: *since,
                    })
                }
                _ => None,
            };
            while old.peek().is_some_and(|(o, _)| *o < id) {
                old.next();
            }
            let reused = match old.peek() {
                Some((o, _)) if *o == id => old.next().map(|x| x.1),
                _ => None,
            };
            let ps = match reused {
                Some(ps) if same(&ps.phase) => ps,
                Some(mut ps) => match phase() {
                    Some(ph) => {
                        ps.phase = ph;
                        ps
                    }
                    None => continue,
                },
                None => match phase() {
                    Some(ph) => PodState {
                        pod: p.pod.clone(),
                        phase: ph,
                    },
                    None => continue, // backoff etc. are not in `active`
                },
            };
            if let Some(g) = p.group {
                groups_in.insert(g);
            }
            pod_map.push(id);
            pods.push(ps);
        }
        let snap = Snapshot {
            nodes,
            queues: self.sc.queues.clone(),
            groups: groups_in
                .iter()
                .map(|&g| self.groups[g as usize].pg.clone())
                .collect(),
            pods,
        };
        (snap, pod_map, node_map, rev)
    }

    /// The snapshot built from scratch, without the caches of
    /// [`Sim::snapshot`]; verify mode checks that both agree.
    fn snapshot_uncached(&self) -> (Snapshot, Vec<u32>) {
        let mut rev = vec![None; self.nodes.len()];
        let mut nodes = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.up {
                rev[i] = Some(nodes.len() as u32);
                nodes.push(n.node.clone());
            }
        }
        let mut pod_map = Vec::new();
        let mut pods = Vec::new();
        let mut groups_in: BTreeSet<u32> = BTreeSet::new();
        for &id in &self.active {
            let p = &self.pods[id as usize];
            let phase = match &p.phase {
                Ph::Pending { nominated } => PodPhase::Pending {
                    nominated: nominated.and_then(|n| rev[n as usize]),
                },
                Ph::Running { node, gpus, since } => match rev[*node as usize] {
                    Some(sn) => PodPhase::Running {
                        node: sn,
                        gpus: gpus.clone(),
                        since_ms: *since,
                    },
                    None => continue,
                },
                _ => continue,
            };
            if let Some(g) = p.group {
                groups_in.insert(g);
            }
            pod_map.push(id);
            pods.push(PodState {
                pod: p.pod.clone(),
                phase,
            });
        }
        let snap = Snapshot {
            nodes,
            queues: self.sc.queues.clone(),
            groups: groups_in
                .iter()
                .map(|&g| self.groups[g as usize].pg.clone())
                .collect(),
            pods,
        };
        (snap, pod_map)
    }

    /// Takes back the nodes and pod states lent to a snapshot.
    fn give_back(&mut self, snap: Snapshot, pod_map: Vec<u32>) {
        if self.node_cache.is_some() {
            self.cached_nodes = snap.nodes;
        }
        self.snap_pods = snap.pods;
        self.snap_ids = pod_map;
    }

    fn cycle(&mut self, sched: &mut Scheduler, hooks: &mut dyn Hooks) {
        self.last_cycle = Some(self.now);
        self.cycles += 1;
        let (snap, pod_map, node_map, _) = self.snapshot();
        if self.sc.settings.verify {
            let (fresh, fresh_map) = self.snapshot_uncached();
            if fresh != snap || fresh_map != pod_map {
                self.error("incremental snapshot differs from a fresh one".into());
            }
        }
        let cycle_seed = self
            .seed
            .wrapping_add(self.cycles.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        hooks.before_cycle(self.now);
        let out = sched.cycle(&snap, self.now, cycle_seed);
        hooks.after_cycle(self.now, &out);
        let (mut cs, errs) = ClusterState::from_snapshot(&snap);
        for (i, e) in errs {
            self.error(format!(
                "conservation: pod {} does not fit where it runs: {e}",
                snap.pods[i].pod.name
            ));
        }
        self.t.backfilled += out.stats.backfilled as u64;
        let mut changed = false;
        let rev_snap = |sim_node: u32| node_map.iter().position(|&n| n == sim_node);

        // pass 1: evictions
        let mut stopped_now: BTreeSet<u32> = BTreeSet::new();
        for d in &out.decisions {
            let Decision::Evict { pod, reason } = d else {
                continue;
            };
            let Some(&sp) = pod_map.get(*pod as usize) else {
                self.error(format!("evict of unknown pod id {pod}"));
                continue;
            };
            if stopped_now.contains(&sp) {
                continue; // already stopped with its gang in this cycle
            }
            if !matches!(self.pods[sp as usize].phase, Ph::Running { .. }) {
                let name = self.pods[sp as usize].pod.name.clone();
                self.error(format!("evict of pod {name} that is not running"));
                continue;
            }
            let kind = reason.kind();
            *self
                .t
                .evictions_by_reason
                .entry(kind.label().to_string())
                .or_insert(0) += 1;
            match kind {
                EvictionKind::Reclaim => self.t.reclaims += 1,
                EvictionKind::Preempt => self.t.preemptions += 1,
            }
            let q = self.pods[sp as usize].queue;
            self.queue_preempted[q] += 1;
            for (t, n, g) in self.kill(sp, Cause::Preempt) {
                stopped_now.insert(t);
                if let Some(sn) = rev_snap(n) {
                    cs.release(sn as u32, &self.pods[t as usize].pod.requests, &g);
                }
            }
            changed = true;
        }

        // pass 2: binds, nominations, group phases
        let fresh: BTreeMap<u32, bool> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (i as u32, g.running == 0))
            .filter(|(_, f)| *f)
            .collect();
        let mut binds_by_group: BTreeMap<u32, u32> = BTreeMap::new();
        // A nomination holds its node for the next cycle only: the core
        // renews the ones still needed (reservations, pending preemptors).
        let mut prev_nominated: BTreeSet<(u32, u32)> = BTreeSet::new();
        for (i, p) in self.pods.iter_mut().enumerate() {
            if let Ph::Pending { nominated: Some(n) } = p.phase {
                prev_nominated.insert((i as u32, n));
            }
        }
        for p in &mut self.pods {
            if let Ph::Pending { nominated } = &mut p.phase {
                *nominated = None;
            }
        }
        for d in &out.decisions {
            match d {
                Decision::Evict { .. } => {}
                Decision::Bind { pod, node, gpus } => {
                    if self.bind(*pod, *node, gpus, &pod_map, &node_map, &mut cs) {
                        changed = true;
                        if let Some(g) = self.pods[pod_map[*pod as usize] as usize].group {
                            *binds_by_group.entry(g).or_insert(0) += 1;
                        }
                    }
                }
                Decision::Nominate { pod, node } => {
                    let (Some(&sp), Some(&sn)) =
                        (pod_map.get(*pod as usize), node_map.get(*node as usize))
                    else {
                        self.error(format!("nominate with unknown ids pod {pod} node {node}"));
                        continue;
                    };
                    if let Ph::Pending { nominated } = &mut self.pods[sp as usize].phase {
                        if !prev_nominated.contains(&(sp, sn)) {
                            self.t.nominations += 1;
                        }
                        *nominated = Some(sn);
                    }
                }
                Decision::Group { group, phase } => {
                    if *phase == GroupPhase::TimedOut {
                        self.time_out(group);
                        changed = true;
                    }
                }
            }
        }
        for (g, n) in binds_by_group {
            if !fresh.contains_key(&g) {
                continue;
            }
            let min = self.groups[g as usize].pg.min_member;
            if n >= min {
                self.t.gang_starts += 1;
            } else {
                self.t.gangs_started_partially += 1;
                let name = self.groups[g as usize].pg.name.clone();
                self.error(format!(
                    "gang {name} started partially: {n} of minMember {min} bound in one cycle"
                ));
            }
        }
        if changed {
            self.last_change = self.now;
        }
        self.sample(&cs);
        drop(cs);
        self.give_back(snap, pod_map);
        if self.sc.settings.verify {
            self.verify("after cycle");
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn bind(
        &mut self,
        pod: u32,
        node: u32,
        gpus: &GpuAssignment,
        pod_map: &[u32],
        node_map: &[u32],
        cs: &mut ClusterState<'_>,
    ) -> bool {
        let (Some(&sp), Some(&sn)) = (pod_map.get(pod as usize), node_map.get(node as usize))
        else {
            self.error(format!("bind with unknown ids pod {pod} node {node}"));
            return false;
        };
        let p = &self.pods[sp as usize];
        let name = p.pod.name.clone();
        let n = &self.nodes[sn as usize];
        if !matches!(p.phase, Ph::Pending { .. }) {
            self.error(format!("bind of pod {name} that is not pending"));
            return false;
        }
        if !n.up || n.node.unschedulable {
            let nn = n.node.name.clone();
            self.error(format!("bind of pod {name} onto unschedulable node {nn}"));
            return false;
        }
        let ok_shape = match (p.pod.gpu, gpus) {
            (GpuRequest::None | GpuRequest::Whole(0), GpuAssignment::None) => true,
            (GpuRequest::Whole(k), GpuAssignment::Whole(l)) => l.len() == k as usize,
            (
                GpuRequest::Share { milli, memory_mib },
                GpuAssignment::Share {
                    gpu,
                    milli: m,
                    memory_mib: mm,
                },
            ) => {
                let gm = n
                    .node
                    .gpus
                    .get(*gpu as usize)
                    .map(|g| g.memory_mib)
                    .unwrap_or(0);
                *m == share_milli(milli, memory_mib, gm) && *mm == memory_mib
            }
            _ => false,
        };
        if !ok_shape {
            self.error(format!(
                "bind of pod {name}: assignment {gpus:?} does not match request {:?}",
                p.pod.gpu
            ));
            return false;
        }
        if let Err(e) = cs.assign(node, &p.pod.requests, gpus) {
            self.error(format!(
                "bind of pod {name} refused (would overcommit): {e}"
            ));
            return false;
        }
        let now = self.now;
        let p = &mut self.pods[sp as usize];
        p.phase = Ph::Running {
            node: sn,
            gpus: gpus.clone(),
            since: now,
        };
        p.epoch += 1;
        let epoch = p.epoch;
        let q = p.queue;
        if p.first_start.is_none() {
            p.first_start = Some(now);
            let arrival = p.pod.arrival_ms;
            self.waits[q].push(now.saturating_sub(arrival));
        }
        let job = p.job as usize;
        if let Some(g) = p.group {
            self.groups[g as usize].running += 1;
        }
        self.queue_used[q] += gpus.milli();
        self.node_used[sn as usize] += gpus.milli();
        self.node_pods[sn as usize].insert(sp);
        self.t.binds += 1;
        let dur = self.jobs[job].duration;
        self.push(now + dur, Ev::Complete { pod: sp, epoch });
        true
    }

    fn time_out(&mut self, group: &str) {
        let Some(&g) = self.group_idx.get(group) else {
            self.error(format!("timeout of unknown group {group:?}"));
            return;
        };
        let mut any = false;
        for m in self.groups[g as usize].members.clone() {
            let p = &mut self.pods[m as usize];
            if matches!(p.phase, Ph::Pending { .. } | Ph::Backoff | Ph::NotArrived) {
                p.phase = Ph::Failed;
                p.epoch += 1;
                self.active.remove(&m);
                self.t.pods_failed += 1;
                self.jobs[p.job as usize].failed = true;
                any = true;
            }
        }
        if any {
            self.t.groups_timed_out += 1;
        }
    }

    /// Rebuilds the cluster state from scratch and checks that nothing is
    /// overcommitted and no gang runs below `minMember` at its start.
    fn verify(&mut self, when: &str) {
        let (snap, pod_map, _, _) = self.snapshot();
        let (_, errs) = ClusterState::from_snapshot(&snap);
        for (i, e) in errs {
            self.error(format!(
                "conservation ({when}): pod {}: {e}",
                snap.pods[i].pod.name
            ));
        }
        self.give_back(snap, pod_map);
    }

    fn sample(&mut self, cs: &ClusterState<'_>) {
        let mut cap = 0u64;
        let mut used = 0u64;
        for (i, st) in cs.state.iter().enumerate() {
            let usable = st.gpu_usable.iter().filter(|u| **u).count() as u64 * GPU_MILLI;
            let u = usable - st.free.gpu_milli.min(usable);
            used += u;
            if !cs.nodes[i].unschedulable {
                cap += usable;
            }
        }
        if self.frag.is_none() {
            self.frag = Some(engine_for(self.pods.iter().map(|p| &p.pod)));
        }
        let frag = self
            .frag
            .as_ref()
            .map(|e| fragmentation_milli(cs, e))
            .unwrap_or(0);
        let mut pending = 0u64;
        let mut running = 0u64;
        let nq = self.sc.queues.len();
        let mut qdemand = vec![0u64; nq];
        for &p in &self.active {
            let pr = &self.pods[p as usize];
            match pr.phase {
                Ph::Pending { .. } => {
                    pending += 1;
                    qdemand[pr.queue] += pr.pod.gpu.milli();
                }
                Ph::Running { .. } => running += 1,
                _ => {}
            }
        }
        for (q, d) in qdemand.iter_mut().enumerate() {
            *d += self.queue_used[q];
        }
        let pct = |a: u64| {
            if cap > 0 {
                a as f64 * 100.0 / cap as f64
            } else {
                0.0
            }
        };
        let row = [
            pct(used),
            pct(frag),
            used as f64 / GPU_MILLI as f64,
            cap as f64 / GPU_MILLI as f64,
            pending as f64,
            running as f64,
        ];
        if self.series.last().map(|s| s.1) != Some(row) {
            if self.series.last().map(|s| s.0) == Some(self.now) {
                self.series.pop();
            }
            self.series.push((self.now, row));
        }
        // per node: used fraction, −1 when down or cordoned
        for (i, n) in self.nodes.iter().enumerate() {
            let v = if !n.up || n.node.unschedulable {
                -1.0
            } else {
                let total = n.node.gpus.len().max(1) as f64 * GPU_MILLI as f64;
                let u = self.node_used[i];
                u as f64 / total
            };
            let steps = &mut self.node_steps[i];
            if steps.last().map(|s| s.1) != Some(v) {
                if steps.last().map(|s| s.0) == Some(self.now) {
                    steps.pop();
                }
                steps.push((self.now, v));
            }
        }
        // fairness integrals
        self.close_integrals(self.now);
        let fair = metrics::fair_shares(
            &self.sc.queues,
            &qdemand.iter().map(|d| Some(*d)).collect::<Vec<_>>(),
            cap,
        );
        self.prev_q = Some((self.queue_used.clone(), fair, cap, self.now));
    }

    fn close_integrals(&mut self, now: u64) {
        if let Some((used, fair, cap, t0)) = &self.prev_q {
            let dt = now.saturating_sub(*t0) as f64;
            let mut gap = 0.0;
            for q in 0..used.len() {
                self.used_int[q] += used[q] as f64 * dt;
                self.fair_int[q] += fair[q] as f64 * dt;
                gap += (used[q] as f64 - fair[q] as f64).abs();
            }
            self.gap_int += gap / 2.0 * dt;
            self.cap_int += *cap as f64 * dt;
            self.prev_q = Some((used.clone(), fair.clone(), *cap, now));
        }
        self.last_sample = Some(now);
    }

    fn result(mut self, scheduler: &str) -> SimResult {
        let end = self.now.max(1);
        let r4 = metrics::r4;
        // series
        let bucket_ms = metrics::nice_bucket(end, BUCKETS);
        let mut cols: Vec<Vec<f64>> = Vec::new();
        for c in 0..6 {
            let steps: Vec<(u64, f64)> = self.series.iter().map(|(t, r)| (*t, r[c])).collect();
            cols.push(metrics::bucketize_w(&steps, end, bucket_ms));
        }
        let t_ms: Vec<u64> = (0..cols[0].len() as u64).map(|k| k * bucket_ms).collect();
        let series = Series {
            bucket_ms,
            t_ms,
            alloc_pct: cols[0].clone(),
            frag_pct: cols[1].clone(),
            used_gpus: cols[2].clone(),
            capacity_gpus: cols[3].clone(),
            pending_pods: cols[4].clone(),
            running_pods: cols[5].clone(),
        };
        let mut cells = Vec::new();
        for steps in &self.node_steps {
            // mark buckets mostly down/cordoned as −1, else average use
            let used: Vec<(u64, f64)> = steps.iter().map(|&(t, v)| (t, v.max(0.0))).collect();
            let down: Vec<(u64, f64)> = steps
                .iter()
                .map(|&(t, v)| (t, if v < 0.0 { 1.0 } else { 0.0 }))
                .collect();
            let u = metrics::bucketize_w(&used, end, bucket_ms);
            let d = metrics::bucketize_w(&down, end, bucket_ms);
            cells.push(
                u.iter()
                    .zip(&d)
                    .map(|(u, d)| {
                        if *d > 0.5 {
                            -1.0
                        } else {
                            r4(u / (1.0 - d).max(1e-9))
                        }
                    })
                    .collect(),
            );
        }
        let heatmap = Heatmap {
            bucket_ms,
            nodes: self.nodes.iter().map(|n| n.node.name.clone()).collect(),
            node_gpus: self
                .nodes
                .iter()
                .map(|n| n.node.gpus.len() as u32)
                .collect(),
            cells,
        };
        // totals
        let endf = end as f64;
        // time integral of column `c` of the step series
        let integral = |c: usize| -> f64 {
            self.series
                .iter()
                .enumerate()
                .map(|(i, (t, r))| {
                    let t1 = self.series.get(i + 1).map(|x| x.0).unwrap_or(end);
                    r[c] * (t1 - t) as f64
                })
                .sum()
        };
        let alloc_mean = {
            let (used, cap) = (integral(2), integral(3));
            if cap > 0.0 { used * 100.0 / cap } else { 0.0 }
        };
        let frag_mean = integral(1) / endf;
        self.t.alloc_mean_pct = r4(alloc_mean);
        self.t.alloc_peak_pct = r4(self.series.iter().map(|s| s.1[0]).fold(0.0, f64::max));
        self.t.frag_mean_pct = r4(frag_mean);
        self.t.fairness_gap_pct = if self.cap_int > 0.0 {
            r4(self.gap_int * 100.0 / self.cap_int)
        } else {
            0.0
        };
        let mut all_waits: Vec<u64> = self.waits.iter().flatten().copied().collect();
        all_waits.sort_unstable();
        self.t.wait_p50_s = metrics::pct_s(&all_waits, 50.0);
        self.t.wait_p95_s = metrics::pct_s(&all_waits, 95.0);
        self.t.wait_p99_s = metrics::pct_s(&all_waits, 99.0);
        let mut jct_q: Vec<Vec<u64>> = vec![Vec::new(); self.sc.queues.len()];
        let mut jobs_q = vec![0u64; self.sc.queues.len()];
        for j in &self.jobs {
            jobs_q[j.queue] += 1;
            if j.failed {
                self.t.jobs_failed += 1;
            } else if let Some(e) = j.end {
                self.t.jobs_completed += 1;
                jct_q[j.queue].push(e - j.arrival);
            } else {
                self.t.jobs_unfinished += 1;
            }
        }
        let mut all_jct: Vec<u64> = jct_q.iter().flatten().copied().collect();
        all_jct.sort_unstable();
        self.t.jct_p50_s = metrics::pct_s(&all_jct, 50.0);
        self.t.jct_mean_s = metrics::mean_s(&all_jct);
        let total_cap = self
            .sc
            .nodes
            .iter()
            .map(|n| n.gpus.len() as u64)
            .sum::<u64>()
            * GPU_MILLI;
        let entitled = metrics::fair_shares(
            &self.sc.queues,
            &vec![None; self.sc.queues.len()],
            total_cap,
        );
        let mut queues = Vec::new();
        let mut wait_cdf = Vec::new();
        for (qi, q) in self.sc.queues.iter().enumerate() {
            let mut w = self.waits[qi].clone();
            w.sort_unstable();
            let mut jc = jct_q[qi].clone();
            jc.sort_unstable();
            let avg = self.used_int[qi] / endf;
            let fair = self.fair_int[qi] / endf;
            queues.push(QueueReport {
                name: q.name.clone(),
                weight: q.weight,
                guarantee_gpus: metrics::gpus(metrics::guarantee_milli(q) as f64),
                jobs: jobs_q[qi],
                jobs_completed: jc.len() as u64,
                pods: self.pods.iter().filter(|p| p.queue == qi).count() as u64,
                pods_started: w.len() as u64,
                wait_p50_s: metrics::pct_s(&w, 50.0),
                wait_p95_s: metrics::pct_s(&w, 95.0),
                wait_p99_s: metrics::pct_s(&w, 99.0),
                jct_p50_s: metrics::pct_s(&jc, 50.0),
                jct_p95_s: metrics::pct_s(&jc, 95.0),
                jct_mean_s: metrics::mean_s(&jc),
                avg_gpus: metrics::gpus(avg),
                fair_gpus: metrics::gpus(fair),
                entitled_gpus: metrics::gpus(entitled[qi] as f64),
                fairness_ratio: if fair > 0.0 { r4(avg / fair) } else { 0.0 },
                preempted: self.queue_preempted[qi],
            });
            // CDF: at most 101 points (every percentile)
            let points = if w.is_empty() {
                Vec::new()
            } else {
                let n = w.len();
                let mut pts: Vec<(f64, f64)> = Vec::new();
                for k in 0..=100usize {
                    let idx = ((k * n) / 100).min(n - 1);
                    let frac = (idx + 1) as f64 / n as f64;
                    let x = r4(w[idx] as f64 / 1000.0);
                    if pts.last().map(|p| p.0) == Some(x) {
                        pts.pop();
                    }
                    pts.push((x, r4(frac)));
                }
                pts
            };
            wait_cdf.push(Cdf {
                queue: q.name.clone(),
                points,
            });
        }
        SimResult {
            scenario: self.sc.name.clone(),
            seed: self.seed,
            scheduler: scheduler.to_string(),
            nodes: self.sc.nodes.len() as u32,
            gpus: (total_cap / GPU_MILLI) as u32,
            end_ms: self.now,
            cycles: self.cycles,
            ended_by: self.ended_by.to_string(),
            totals: self.t,
            queues,
            series,
            heatmap,
            wait_cdf,
            incidents: self.incidents,
            errors: self.errors,
        }
    }
}

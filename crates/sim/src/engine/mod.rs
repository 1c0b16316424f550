//! The discrete-event loop: virtual time in milliseconds, one event queue,
//! scheduling cycles coalesced after events and repeated while pods wait.
//!
//! Every cycle the simulator builds a [`Snapshot`] (a `PodId` is an index
//! into `snapshot.pods`; the simulator keeps its own id maps), calls
//! [`Scheduler::cycle`] and applies the decisions defensively: each bind is
//! checked against a [`ClusterState`] built from the same snapshot, and a
//! refused decision is counted and reported, never applied.
//!
//! Where things go:
//!
//! - this module: the event queue, the world's records (pods, groups, jobs,
//!   nodes) and the main loop that dispatches events;
//! - `world`: lifecycle of pods, gangs and jobs (arrival, completion,
//!   stop/kill with gang restarts and retry backoff, group time-outs);
//! - `faults`: the scenario's cluster events (failures, GPU faults,
//!   drains, recoveries, added nodes) — a new simulator event goes here
//!   (its kind in `workload::EventKind`);
//! - `snapshot`: the incremental snapshot handed to the scheduler;
//! - `apply`: one cycle — call the scheduler, apply its decisions;
//! - `record`: samples, integrals, checks and the final result.

use crate::frag::{engine_for, fragmentation_milli};
use crate::metrics::{
    self, Cdf, FailedJob, Heatmap, IdleReason, IdleWhilePending, Incident, Marks, QueueReport,
    Series, SimResult, Totals,
};
use crate::workload::{EventKind, Scenario, fmt_duration};
use gpusched_core::engine::EngineStats;
use gpusched_core::state::share_milli;
use gpusched_core::{
    ClusterState, CycleOutput, Decision, Engine, EvictionKind, GpuAssignment, GroupPhase, NodeId,
    PodId, PodPhase, PodState, Scheduler, Snapshot,
};
use gpusched_model::{GPU_MILLI, GpuHealth, GpuRequest, Node, Pod, PodGroup};
use gpusched_plugins::packing::fgd::FragEngine;
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap};

mod apply;
mod faults;
mod record;
mod snapshot;
mod world;

/// Observes a run from outside (wall-clock timing, progress). The library
/// never reads the clock itself.
pub trait Hooks {
    /// Called before each cycle at virtual time `now_ms`.
    fn before_cycle(&mut self, _now_ms: u64) {}
    /// Called after each cycle with its output.
    fn after_cycle(&mut self, _now_ms: u64, _out: &CycleOutput) {}
    /// Called after every cycle with the snapshot it read and its output
    /// (for tools that inspect one cycle, e.g. `gpusched explain --from-sim`).
    fn cycle_seen(&mut self, _now_ms: u64, _snap: &Snapshot, _out: &CycleOutput) {}
    /// Called after every cycle; `horizon_ms` is an estimate of the end.
    fn progress(&mut self, _now_ms: u64, _horizon_ms: u64) {}
    /// Whether `after_cycle` and `cycle_seen` must see an explanation for
    /// every pending pod, the parked ones included (their explanation from
    /// the cycle that parked them; `Engine::explain_parked`). Off by
    /// default: a cycle explains the pods it tried.
    fn every_explanation(&self) -> bool {
        false
    }
}

/// Hooks that do nothing.
pub struct NoHooks;
impl Hooks for NoHooks {}

/// How many simulator errors are kept verbatim in the result.
const MAX_ERRORS: usize = 50;
/// At most this many buckets in the time series and heat map.
const BUCKETS: u64 = 150;

/// A pod of the simulation: an index into `Sim::pods`. Not a snapshot's
/// `PodId` (an index into `Snapshot::pods`, which holds only active pods);
/// the snapshot's maps translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SimPod(u32);

/// A node of the simulation: an index into `Sim::nodes`. Not a snapshot's
/// `NodeId` (down nodes are left out of the snapshot); the maps translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SimNode(u32);

/// A job of the scenario: an index into `Sim::jobs` (and `Scenario::jobs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SimJob(u32);

/// A pod group of the simulation: an index into `Sim::groups`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct SimGroup(u32);

impl SimJob {
    fn ix(self) -> usize {
        self.0 as usize
    }
}

impl SimGroup {
    fn ix(self) -> usize {
        self.0 as usize
    }
}

impl SimPod {
    fn ix(self) -> usize {
        self.0 as usize
    }
}

impl SimNode {
    fn ix(self) -> usize {
        self.0 as usize
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    Cluster(u32),
    Complete { pod: SimPod, epoch: u32 },
    Arrival(SimJob),
    Retry { pod: SimPod, epoch: u32 },
    Gone { pod: SimPod, epoch: u32 },
    Cycle,
}

impl Ev {
    fn class(&self) -> u8 {
        match self {
            Ev::Cluster(_) => 0,
            Ev::Complete { .. } => 1,
            Ev::Arrival(_) => 2,
            Ev::Retry { .. } => 3,
            Ev::Gone { .. } => 4,
            Ev::Cycle => 9,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Ph {
    NotArrived,
    Pending {
        nominated: Option<SimNode>,
    },
    Backoff,
    Running {
        node: SimNode,
        gpus: GpuAssignment,
        since: u64,
    },
    /// Evicted, still holding its node and GPUs until its grace period
    /// ends (`SimSettings::termination_grace_ms`).
    Terminating {
        node: SimNode,
        gpus: GpuAssignment,
    },
    Succeeded,
    Failed,
}

struct PodRt {
    /// Shared with every snapshot the simulation hands the engine.
    pod: std::sync::Arc<Pod>,
    job: SimJob,
    group: Option<SimGroup>,
    queue: usize,
    phase: Ph,
    epoch: u32,
    retries: u32,
    first_start: Option<u64>,
}

struct GroupRt {
    pg: PodGroup,
    members: Vec<SimPod>,
    retries: u32,
    running: u32,
}

struct JobRt {
    /// Pod ids `first_pod .. first_pod + pods` (contiguous).
    first_pod: SimPod,
    arrival: u64,
    duration: u64,
    left: u32,
    failed: bool,
    /// When and why it failed (the report names failed jobs).
    failed_why: Option<(u64, &'static str)>,
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

/// Runs a scenario to its end with `scheduler` and `seed`. The scheduler
/// runs as the incremental core ([`Engine`]): each cycle hands it what
/// changed since the last one.
pub fn run(
    scenario: &Scenario,
    scheduler: &mut Scheduler,
    seed: u64,
    hooks: &mut dyn Hooks,
) -> SimResult {
    run_checked(scenario, scheduler, None, seed, hooks)
}

/// As [`run`], with `oracle` — a second scheduler built as `scheduler`,
/// used for nothing else — running the full pass beside every cycle
/// (`Engine::verify_with`): each difference in decisions, counters,
/// explanations or kept capacity is a simulator error in the result.
pub fn run_checked(
    scenario: &Scenario,
    scheduler: &mut Scheduler,
    oracle: Option<Scheduler>,
    seed: u64,
    hooks: &mut dyn Hooks,
) -> SimResult {
    let mut sim = Sim::new(scenario, seed);
    let mut engine = Engine::lend(scheduler);
    if let Some(o) = oracle {
        engine.verify_with(o);
    }
    sim.run(&mut engine, hooks);
    sim.engine = engine.stats().clone();
    engine.give_back(scheduler);
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
    node_idx: BTreeMap<String, SimNode>,
    pods: Vec<PodRt>,
    groups: Vec<GroupRt>,
    group_idx: BTreeMap<String, SimGroup>,
    jobs: Vec<JobRt>,
    /// Pods pending or running, in id order.
    active: BTreeSet<SimPod>,
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
    node_pods: Vec<BTreeSet<SimPod>>,
    /// Node maps of the snapshot (snapshot → sim, sim → snapshot), rebuilt
    /// when a node changed; `cached_nodes` holds the snapshot's nodes
    /// between cycles (lent to each snapshot and given back).
    node_cache: Option<(Vec<SimNode>, Vec<Option<NodeId>>)>,
    cached_nodes: Vec<Node>,
    /// Pod states of the last snapshot and their sim ids, reused.
    snap_pods: Vec<PodState>,
    snap_ids: Vec<SimPod>,
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
    /// Why pending GPU pods waited, by reason name, as of the last
    /// classification (at most once a virtual minute).
    idle_reasons: Vec<(String, u32)>,
    idle_classified_at: Option<u64>,
    /// The open interval: since when, idle GPU milli, pending GPU pods by
    /// reason.
    idle_prev: Option<IdleInterval>,
    /// The incremental core's divergences from the full pass reported so
    /// far (with an oracle).
    divergences: usize,
    /// The incremental core's counters at the end of the run.
    engine: EngineStats,
    /// ∫ idle GPU milli dt (ms) while GPU pods were pending.
    idle_milli_ms: f64,
    /// ∫ pending GPU pods dt (ms) by reason, while ≥ 1 GPU sat idle.
    idle_by_reason: BTreeMap<String, f64>,
    /// Gang starts and reservations on the timeline.
    marks: Marks,
}

/// An open idle-while-pending interval: since when (ms), idle GPU milli,
/// pending GPU pods by reason.
type IdleInterval = (u64, u64, Vec<(String, u32)>);

/// At most this many of each timeline mark.
const MAX_MARKS: usize = 2_000;

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
            .map(|(i, n)| (n.node.name.clone(), SimNode(i as u32)))
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
            let first_pod = SimPod(pods.len() as u32);
            let gid = j.group.as_ref().map(|g| {
                let id = SimGroup(groups.len() as u32);
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
                let id = SimPod(pods.len() as u32);
                if let Some(g) = gid {
                    groups[g.ix()].members.push(id);
                }
                pods.push(PodRt {
                    pod: pod.into(),
                    job: SimJob(ji as u32),
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
                failed_why: None,
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
            idle_reasons: Vec::new(),
            idle_classified_at: None,
            idle_prev: None,
            divergences: 0,
            engine: EngineStats::default(),
            idle_milli_ms: 0.0,
            idle_by_reason: BTreeMap::new(),
            marks: Marks::default(),
        };
        for (i, j) in sc.jobs.iter().enumerate() {
            sim.push(j.arrival_ms, Ev::Arrival(SimJob(i as u32)));
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

    fn run(&mut self, sched: &mut Engine, hooks: &mut dyn Hooks) {
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
                        .any(|&p| matches!(self.pods[p.ix()].phase, Ph::Pending { .. }));
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
                    let p = &mut self.pods[pod.ix()];
                    if p.epoch == epoch && p.phase == Ph::Backoff {
                        p.phase = Ph::Pending { nominated: None };
                        self.active.insert(pod);
                        self.last_change = at;
                        self.request_cycle(at);
                    }
                }
                Ev::Gone { pod, epoch } => {
                    if self.gone(pod, epoch) {
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
}

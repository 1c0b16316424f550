//! The incremental core's seam: a vocabulary of changes into a core that
//! keeps the cluster between cycles.
//!
//! A runner (the simulator, the Kubernetes adapter, a benchmark) hands the
//! [`Engine`] what changed — a node, queue, pod group or pod added, updated
//! or gone, each under its stable key (its name) — instead of a whole
//! [`Snapshot`] per cycle; [`Engine::cycle`] then runs the same action
//! pipeline as [`Scheduler::cycle`] on the state the engine keeps. A whole
//! snapshot is the same changes ([`changes_of`], [`Engine::sync`]): replay,
//! tests and `simulate --snapshot` go through the one seam.
//!
//! What is kept across cycles today: the objects themselves (with a
//! generation counter bumped by every change) and the free capacity of
//! every node ([`crate::state::StateParts`]), updated pod by pod from the
//! changes instead of rebuilt from every pod each cycle. A cycle's binds are
//! not assumed: the engine gives back what they took when the cycle ends,
//! and the runner reports the pods as running (or not) like any change, so
//! the runner stays the authority on what happened.
//!
//! The guard: with an oracle ([`Engine::verify_with`]: a second scheduler
//! built alike; tests, debug builds) every cycle also runs the full pass
//! ([`Scheduler::cycle`] over the same snapshot) and compares its output
//! and the kept capacity with a fresh build; each difference is recorded
//! in [`Engine::divergences`].

use crate::decision::{CycleOutput, Decision};
use crate::scheduler::{ParkCandidate, Parked, Scheduler};
use crate::snapshot::{GpuAssignment, NodeId, PodId, PodPhase, PodState, Snapshot};
use crate::state::{ClusterState, StateParts};
use gpusched_model::{Node, Pod, PodGroup, Queue, ResourceVec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Where a pod is, as a runner reports it: [`PodPhase`] with its node named
/// (node ids are the engine's).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PodAt {
    /// Waiting for a node (`nominated`: a node held for it, by name).
    Pending {
        /// The nominated node.
        nominated: Option<String>,
        /// When the runner first saw the nomination.
        nominated_at_ms: Option<u64>,
    },
    /// Bound to a node and holding resources.
    Running {
        /// Its node.
        node: String,
        /// Its GPUs there.
        gpus: GpuAssignment,
        /// When it started.
        since_ms: u64,
    },
    /// Being evicted: holds its resources until it is gone.
    Terminating {
        /// Its node.
        node: String,
        /// Its GPUs there.
        gpus: GpuAssignment,
    },
}

impl PodAt {
    /// A pending pod without nomination.
    pub fn pending() -> Self {
        PodAt::Pending {
            nominated: None,
            nominated_at_ms: None,
        }
    }
}

/// One change of the cluster, keyed by name. Adding and updating are the
/// same change (the object replaces the one of its name, if any).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    /// A node added or updated.
    Node(Node),
    /// A node gone (no pod may hold resources on it any more).
    NodeGone(String),
    /// A queue added or updated.
    Queue(Queue),
    /// A queue gone.
    QueueGone(String),
    /// A pod group added or updated.
    Group(PodGroup),
    /// A pod group gone.
    GroupGone(String),
    /// A pod added or updated, and where it is.
    Pod(Arc<Pod>, PodAt),
    /// A pod gone.
    PodGone(String),
}

/// A change the engine refused (it changed nothing).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChangeError {
    /// The change removes an object the engine does not have.
    #[error("{kind} {name:?} is gone, but the engine has no {kind} of that name")]
    Unknown {
        /// `node`, `queue`, `group` or `pod`.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A pod names a node the engine does not have.
    #[error("pod {pod:?}: node {node:?} is not known (add the node first)")]
    UnknownNode {
        /// The pod.
        pod: String,
        /// The node it names.
        node: String,
    },
    /// A snapshot names two objects of one kind alike.
    #[error("the snapshot has two {kind}s named {name:?}")]
    Duplicate {
        /// `node`, `queue`, `group` or `pod`.
        kind: &'static str,
        /// The name.
        name: String,
    },
    /// A node goes while pods hold resources on it.
    #[error(
        "node {node:?} is gone while {pods} pod(s) hold resources there (first {first:?}): report them gone or moved first"
    )]
    NodeInUse {
        /// The node.
        node: String,
        /// How many pods hold resources there.
        pods: usize,
        /// One of them.
        first: String,
    },
}

/// The packer of the stand-in [`Engine::lend`] leaves behind: places
/// nothing (it is never run).
struct Lent;

impl crate::plugin::Packer for Lent {
    fn name(&self) -> &'static str {
        "lent"
    }
    fn place(
        &self,
        _pod: &Pod,
        _node: NodeId,
        _state: &ClusterState<'_>,
    ) -> Option<crate::plugin::Placement> {
        None
    }
}

/// A parked job: what the wake-up rules read.
#[derive(Clone, Debug)]
struct ParkedJob {
    queue: String,
    priority: i32,
    arrival: u64,
    /// Its pods' names.
    pods: Vec<String>,
    /// It had waited `reserve_after_ms` when parked.
    old: bool,
    /// A gang a full pass counts as waiting.
    counts_waiting: bool,
    /// It waits in its queue as a full pass would have it (not refused by
    /// quota): `view.first`.
    holds_place: bool,
    /// What the cycle that parked it said of each of `pods` (ids of that
    /// cycle; the queue position dropped: it moves while the job waits).
    explained: Vec<Option<crate::decision::Explanation>>,
    /// When it was parked, and the engine's generation then.
    parked_ms: u64,
    parked_gen: u64,
    /// Its shape (`ParkCandidate::shape`) and what its pods that must start
    /// together ask (for the wake-up by capacity).
    shape: Vec<crate::plugin::SchedulingKey>,
    demand: ResourceVec,
    /// When it could start reserving, if it had not waited long enough
    /// when parked: only it is woken then.
    reserve_at: Option<u64>,
}

/// Counters of the engine's own work.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EngineStats {
    /// Changes applied.
    pub changes: u64,
    /// Cycles run.
    pub cycles: u64,
    /// Cycles whose free capacity was rebuilt from every pod (the first,
    /// after a change that invalidates the kept capacity — a node's
    /// capacity or GPUs changed, a pod whose holdings do not fit).
    pub rebuilds: u64,
    /// Jobs parked now.
    pub parked: u64,
    /// Times every parked job was woken (a change that may help any of
    /// them, a timer, the flush).
    pub woken_all: u64,
    /// Parked jobs woken one by one (a change of their own pods).
    pub woken: u64,
    /// Times capacity freed woke only the parked jobs it can hold (the
    /// rest stayed parked).
    #[serde(default)]
    pub woken_by_capacity: u64,
    /// Safety flushes.
    pub flushes: u64,
    /// Jobs a flush woke that then got a decision: a change that could
    /// help them woke nothing (0 when the hints are right).
    pub missed_hints: u64,
}

/// The scheduler with the cluster kept across cycles (module docs).
pub struct Engine {
    sched: Scheduler,
    snap: Snapshot,
    node_ix: BTreeMap<String, NodeId>,
    pod_ix: BTreeMap<String, PodId>,
    queue_ix: BTreeMap<String, usize>,
    group_ix: BTreeMap<String, usize>,
    /// Every node's free capacity with every holding pod placed; `None`:
    /// rebuilt at the next cycle. Kept only while every holding pod fits
    /// (a snapshot whose holdings do not fit is rebuilt each cycle, as the
    /// full pass reports those pods).
    state: Option<StateParts>,
    /// What the changes since the last cycle do to `state`, in order.
    adjust: Vec<Adjust>,
    generation: u64,
    /// Parked jobs by (gang, name): left out of cycles until a change may
    /// help them (module docs).
    parked: BTreeMap<(bool, String), ParkedJob>,
    /// What a cycle reads of them; `pod` has one flag per pod id.
    view: Parked,
    /// `view.first`, `view.jobs`, `view.gangs` and `summary` need a
    /// recount.
    view_dirty: bool,
    /// Per queue with parked jobs: their highest priority, and whether one
    /// has waited long enough to reserve.
    summary: BTreeMap<String, (i32, bool)>,
    /// The earliest time a parked job must be tried again (a reservation,
    /// a gang's timeout, a victim's minimum runtime).
    wake_at: Option<u64>,
    /// The earliest timer that wakes every parked job (a gang's timeout, a
    /// victim coming of age); `wake_at` is the earliest of it and the
    /// parked jobs' own reserving times.
    wake_all_at: Option<u64>,
    /// Running pods by (queue, priority): how many started at each time
    /// (for when a victim's minimum runtime ends).
    holders: BTreeMap<(String, i32), BTreeMap<u64, u32>>,
    /// When the safety flush last woke every parked job.
    last_flush: Option<u64>,
    /// The jobs the last flush woke (a decision for one is a missed hint).
    flushed: std::collections::BTreeSet<(bool, String)>,
    /// Per queue name: the demand of its pods that hold resources, and of
    /// those that do not (the queues' usage and pending demand, kept
    /// instead of summed over every pod each cycle).
    sums: BTreeMap<String, (ResourceVec, ResourceVec)>,
    /// Each pod's queue and group positions (`view.pod_queue`,
    /// `view.pod_group`) must be looked up again (queues or groups changed,
    /// or the pods were reordered).
    index_dirty: bool,
    /// The pods added and removed since the last cycle, by spec (for the
    /// packer, `PackEnv::pods_changed`); `delta_valid` once a cycle has
    /// passed (the first lets the packer count every pod).
    delta: crate::plugin::PodsChanged,
    delta_valid: bool,
    /// Park jobs a cycle could not place (on by default).
    pub park: bool,
    /// The safety flush: every parked job is woken this often (virtual
    /// ms); each one it wakes that then gets a decision counts as a missed
    /// hint.
    pub flush_ms: u64,
    /// The oracle: a second scheduler, built as the engine's, that runs the
    /// full pass over the engine's state beside every cycle (it sees the
    /// same cycles at the same states, so a plugin that keeps state across
    /// cycles — the gpusched packer does — is in the same state in both).
    oracle: Option<Scheduler>,
    divergences: Vec<String>,
    stats: EngineStats,
    /// Capacity was freed or moved since the last cycle (a holding pod
    /// changed or went, a nomination was dropped): the next cycle wakes
    /// the parked jobs it may help ([`Engine::wake_by_capacity`]).
    capacity_freed: bool,
    /// Running pods that opted in to consolidation moves.
    movable_running: u32,
}

impl Engine {
    /// An engine with no objects around `sched` (no oracle: see
    /// [`Engine::verify_with`]).
    pub fn new(sched: Scheduler) -> Self {
        Engine {
            sched,
            snap: Snapshot::default(),
            node_ix: BTreeMap::new(),
            pod_ix: BTreeMap::new(),
            queue_ix: BTreeMap::new(),
            group_ix: BTreeMap::new(),
            state: Some(StateParts::default()),
            adjust: Vec::new(),
            generation: 0,
            parked: BTreeMap::new(),
            view: Parked::default(),
            view_dirty: false,
            summary: BTreeMap::new(),
            wake_at: None,
            wake_all_at: None,
            holders: BTreeMap::new(),
            last_flush: None,
            flushed: Default::default(),
            sums: BTreeMap::new(),
            index_dirty: true,
            delta: Default::default(),
            delta_valid: false,
            park: true,
            flush_ms: 300_000,
            oracle: None,
            divergences: Vec::new(),
            stats: EngineStats::default(),
            capacity_freed: false,
            movable_running: 0,
        }
    }

    /// An engine around the scheduler `sched` lends it (for a runner handed
    /// `&mut Scheduler`); [`Engine::give_back`] returns it, with whatever
    /// state its plugins kept.
    pub fn lend(sched: &mut Scheduler) -> Self {
        let stand_in = Scheduler::new(sched.opts.clone(), Vec::new(), Box::new(Lent));
        Engine::new(std::mem::replace(sched, stand_in))
    }

    /// Puts the scheduler [`Engine::lend`] took back where it came from.
    pub fn give_back(self, into: &mut Scheduler) {
        *into = self.sched;
    }

    /// Runs `oracle` — a scheduler built as this engine's, used for nothing
    /// else — beside every cycle from now on: the full pass over the same
    /// state, its output and a fresh build of the free capacity compared
    /// with the engine's ([`Engine::divergences`]). For tests and debug
    /// builds: it costs a full pass per cycle.
    pub fn verify_with(&mut self, oracle: Scheduler) {
        self.oracle = Some(oracle);
    }

    /// The scheduler (its options may be changed between cycles).
    pub fn scheduler(&mut self) -> &mut Scheduler {
        &mut self.sched
    }

    /// The state as a snapshot: the ids of a cycle's decisions are
    /// positions in it (valid until the next change).
    pub fn snapshot(&self) -> &Snapshot {
        &self.snap
    }

    /// Bumped by every change applied.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The engine's counters.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Where the kept state and the full pass disagreed (with `verify`).
    pub fn divergences(&self) -> &[String] {
        &self.divergences
    }

    /// Adds to `out` (this engine's last cycle) what was said of the pods
    /// of parked jobs when they were parked, under their ids now, and puts
    /// the explanations in pod order, as a full pass lists them. A cycle
    /// explains only the pods it tried; a runner that shows every pending
    /// pod (status, metrics, `explain`) asks for the rest here, when it
    /// shows them. Their queue position is left out: it moves while a job
    /// waits (`explain` and `pending` compute it when asked).
    pub fn explain_parked(&self, out: &mut CycleOutput) {
        if self.parked.is_empty() {
            return;
        }
        let bound = out.bound_pods();
        let before = out.explanations.len();
        let had: std::collections::BTreeSet<PodId> =
            out.explanations.iter().map(|e| e.pod).collect();
        for job in self.parked.values() {
            for (name, e) in job.pods.iter().zip(&job.explained) {
                let (Some(&id), Some(e)) = (self.pod_ix.get(name), e) else {
                    continue;
                };
                if self.view.pod.get(id as usize) == Some(&true)
                    && !bound.contains(&id)
                    && !had.contains(&id)
                {
                    out.explanations.push(crate::decision::Explanation {
                        pod: id,
                        ..e.clone()
                    });
                }
            }
        }
        if out.explanations.len() > before {
            out.explanations.sort_by_key(|e| e.pod);
        }
    }

    /// The id of node `name` in [`Engine::snapshot`].
    pub fn node_id(&self, name: &str) -> Option<NodeId> {
        self.node_ix.get(name).copied()
    }

    /// The id of pod `name` in [`Engine::snapshot`].
    pub fn pod_id(&self, name: &str) -> Option<PodId> {
        self.pod_ix.get(name).copied()
    }

    /// Applies changes in order; stops at the first refused one (which
    /// changed nothing).
    pub fn apply_all(
        &mut self,
        changes: impl IntoIterator<Item = Change>,
    ) -> Result<(), ChangeError> {
        for c in changes {
            self.apply(c)?;
        }
        Ok(())
    }

    /// Applies one change.
    pub fn apply(&mut self, change: Change) -> Result<(), ChangeError> {
        let pod = matches!(change, Change::Pod(..) | Change::PodGone(_));
        let node = matches!(change, Change::Node(_) | Change::NodeGone(_));
        match change {
            Change::Node(n) => self.set_node(n),
            Change::NodeGone(name) => self.remove_node(&name)?,
            Change::Queue(q) => {
                set_named(&mut self.snap.queues, &mut self.queue_ix, q, |q| &q.name)
            }
            Change::QueueGone(name) => remove_named(
                &mut self.snap.queues,
                &mut self.queue_ix,
                &name,
                "queue",
                |q| &q.name,
            )?,
            Change::Group(g) => {
                set_named(&mut self.snap.groups, &mut self.group_ix, g, |g| &g.name)
            }
            Change::GroupGone(name) => remove_named(
                &mut self.snap.groups,
                &mut self.group_ix,
                &name,
                "group",
                |g| &g.name,
            )?,
            Change::Pod(pod, at) => self.set_pod(pod, at)?,
            Change::PodGone(name) => self.remove_pod(&name)?,
        }
        // what the change may invalidate (only once it applied: a refused
        // change leaves the kept state and the parked jobs as they were)
        if !pod {
            // a node, queue or group change may help any parked job
            self.wake_all();
        }
        if node {
            self.view.capacity = None;
            self.view.verdicts = None;
        } else if !pod {
            // queue or group positions moved
            self.index_dirty = true;
        }
        self.generation += 1;
        self.stats.changes += 1;
        Ok(())
    }

    /// Makes the engine's state equal to `snap` through changes: what
    /// differs is updated, what is missing added, what is not there any
    /// more removed. The result decides as `snap` does, though ids may be
    /// in another order (a whole snapshot as the same changes).
    pub fn sync(&mut self, snap: &Snapshot) -> Result<(), ChangeError> {
        // first every check, then the changes: a refused snapshot changes
        // nothing. Objects are compared where they lie; only what differs
        // is cloned into a change.
        unique("node", snap.nodes.iter().map(|n| n.name.as_str()))?;
        unique("queue", snap.queues.iter().map(|q| q.name.as_str()))?;
        unique("group", snap.groups.iter().map(|g| g.name.as_str()))?;
        // the snapshot's node ids as the engine's (by name)
        let same_nodes = snap.nodes.len() == self.snap.nodes.len()
            && snap
                .nodes
                .iter()
                .zip(&self.snap.nodes)
                .all(|(a, b)| a.name == b.name);
        let node_map: Vec<Option<NodeId>> = if same_nodes {
            (0..snap.nodes.len() as NodeId).map(Some).collect()
        } else {
            snap.nodes
                .iter()
                .map(|n| self.node_ix.get(&n.name).copied())
                .collect()
        };
        // each snapshot pod's engine id, whether it differs, and new ones
        let mut seen = vec![false; self.snap.pods.len()];
        let mut differ: Vec<usize> = Vec::new();
        let mut added: std::collections::BTreeSet<&str> = std::collections::BTreeSet::new();
        for (i, p) in snap.pods.iter().enumerate() {
            let duplicate = || ChangeError::Duplicate {
                kind: "pod",
                name: p.pod.name.clone(),
            };
            // a runner's snapshot mostly keeps the engine's order: the pod
            // at the same position, when it has the name, is the one (names
            // are unique in the engine), without a lookup by name
            let at_same = self
                .snap
                .pods
                .get(i)
                .is_some_and(|h| Arc::ptr_eq(&h.pod, &p.pod) || h.pod.name == p.pod.name);
            let id = if at_same {
                Some(i as PodId)
            } else {
                self.pod_ix.get(&p.pod.name).copied()
            };
            match id {
                Some(id) => {
                    if std::mem::replace(&mut seen[id as usize], true) {
                        return Err(duplicate());
                    }
                    let have = &self.snap.pods[id as usize];
                    if have.pod != p.pod || !same_phase(&p.phase, &have.phase, &node_map) {
                        differ.push(i);
                    }
                }
                None => {
                    if !added.insert(p.pod.name.as_str()) {
                        return Err(duplicate());
                    }
                    differ.push(i);
                }
            }
            // a pod that holds resources names a node of the snapshot
            if let Some((n, _)) = p.holding()
                && n as usize >= snap.nodes.len()
            {
                return Err(ChangeError::UnknownNode {
                    pod: p.pod.name.clone(),
                    node: format!("#{n}"),
                });
            }
        }
        let gone: Vec<String> = seen
            .iter()
            .enumerate()
            .filter(|(_, s)| !**s)
            .map(|(id, _)| self.snap.pods[id].pod.name.clone())
            .collect();
        for name in gone {
            self.apply(Change::PodGone(name))?;
        }
        // the nodes, queues and groups that stay or come, then the pods
        // (which name their nodes), then what went
        for n in &snap.nodes {
            let have = self.node_ix.get(&n.name);
            if have.is_none_or(|&i| self.snap.nodes[i as usize] != *n) {
                self.apply(Change::Node(n.clone()))?;
            }
        }
        for q in &snap.queues {
            let have = self.queue_ix.get(&q.name);
            if have.is_none_or(|&i| self.snap.queues[i] != *q) {
                self.apply(Change::Queue(q.clone()))?;
            }
        }
        for g in &snap.groups {
            let have = self.group_ix.get(&g.name);
            if have.is_none_or(|&i| self.snap.groups[i] != *g) {
                self.apply(Change::Group(g.clone()))?;
            }
        }
        for i in differ {
            let p = &snap.pods[i];
            let at = pod_at(snap, p)?;
            self.apply(Change::Pod(p.pod.clone(), at))?;
        }
        if !same_nodes {
            let nodes: std::collections::BTreeSet<&str> =
                snap.nodes.iter().map(|n| n.name.as_str()).collect();
            for name in keys_not_in(&self.node_ix, &nodes) {
                self.apply(Change::NodeGone(name))?;
            }
        }
        let queues: std::collections::BTreeSet<&str> =
            snap.queues.iter().map(|q| q.name.as_str()).collect();
        for name in keys_not_in(&self.queue_ix, &queues) {
            self.apply(Change::QueueGone(name))?;
        }
        let groups: std::collections::BTreeSet<&str> =
            snap.groups.iter().map(|g| g.name.as_str()).collect();
        for name in keys_not_in(&self.group_ix, &groups) {
            self.apply(Change::GroupGone(name))?;
        }
        self.follow_order(snap);
        Ok(())
    }

    /// Puts the objects in `snap`'s order (after [`Engine::sync`] made them
    /// the same set): ids are positions and break the last ties, so a
    /// runner that hands whole snapshots gets exactly the decisions of a
    /// full pass over its own snapshot.
    fn follow_order(&mut self, snap: &Snapshot) {
        if !snap
            .nodes
            .iter()
            .map(|n| &n.name)
            .eq(self.snap.nodes.iter().map(|n| &n.name))
        {
            let node_names: Vec<String> = snap.nodes.iter().map(|n| n.name.clone()).collect();
            // new id of each old id
            let wanted: BTreeMap<&str, usize> = node_names
                .iter()
                .enumerate()
                .map(|(i, n)| (n.as_str(), i))
                .collect();
            let new_id: Vec<NodeId> = self
                .snap
                .nodes
                .iter()
                .map(|n| wanted.get(n.name.as_str()).copied().unwrap_or(0) as NodeId)
                .collect();
            let mut nodes: Vec<Option<Node>> = vec![None; node_names.len()];
            let mut states: Vec<Option<crate::state::NodeState>> = vec![None; node_names.len()];
            let old_states = self.state.take().map(|p| p.state);
            for (i, n) in std::mem::take(&mut self.snap.nodes).into_iter().enumerate() {
                nodes[new_id[i] as usize] = Some(n);
            }
            if let Some(old) = old_states {
                for (i, st) in old.into_iter().enumerate() {
                    states[new_id[i] as usize] = Some(st);
                }
                self.state = states
                    .into_iter()
                    .collect::<Option<Vec<_>>>()
                    .map(|state| StateParts { state });
            }
            self.snap.nodes = nodes.into_iter().flatten().collect();
            self.view.capacity = None;
            self.view.verdicts = None;
            for a in &mut self.adjust {
                a.node = new_id[a.node as usize];
            }
            for p in &mut self.snap.pods {
                match &mut p.phase {
                    PodPhase::Pending { nominated, .. } => {
                        if let Some(n) = nominated {
                            *n = new_id[*n as usize];
                        }
                    }
                    PodPhase::Running { node, .. } | PodPhase::Terminating { node, .. } => {
                        *node = new_id[*node as usize];
                    }
                }
            }
            self.node_ix = index(&self.snap.nodes, |n| &n.name)
                .into_iter()
                .map(|(k, v)| (k, v as NodeId))
                .collect();
        }
        if !snap
            .pods
            .iter()
            .map(|p| &p.pod.name)
            .eq(self.snap.pods.iter().map(|p| &p.pod.name))
        {
            let mut old: Vec<Option<PodState>> = std::mem::take(&mut self.snap.pods)
                .into_iter()
                .map(Some)
                .collect();
            self.snap.pods = snap
                .pods
                .iter()
                .filter_map(|p| old[*self.pod_ix.get(&p.pod.name)? as usize].take())
                .collect();
            self.pod_ix = index(&self.snap.pods, |p| &p.pod.name)
                .into_iter()
                .map(|(k, v)| (k, v as PodId))
                .collect();
            // the parked jobs stay parked: their pods' flags follow them
            self.view.pod = vec![false; self.snap.pods.len()];
            for job in self.parked.values() {
                for name in &job.pods {
                    if let Some(&i) = self.pod_ix.get(name) {
                        self.view.pod[i as usize] = true;
                    }
                }
            }
            self.index_dirty = true;
        }
        let queues: Vec<&String> = self.snap.queues.iter().map(|q| &q.name).collect();
        if !snap.queues.iter().map(|q| &q.name).eq(queues) {
            self.snap.queues = snap.queues.clone();
            self.queue_ix = index(&self.snap.queues, |q| &q.name);
            self.index_dirty = true;
        }
        let groups: Vec<&String> = self.snap.groups.iter().map(|g| &g.name).collect();
        if !snap.groups.iter().map(|g| &g.name).eq(groups) {
            self.snap.groups = snap.groups.clone();
            self.group_ix = index(&self.snap.groups, |g| &g.name);
            self.index_dirty = true;
        }
    }

    /// One cycle at virtual time `now_ms` on the kept state.
    pub fn cycle(&mut self, now_ms: u64, seed: u64) -> CycleOutput {
        self.stats.cycles += 1;
        // the changes' hints first (capacity freed), then timers and the
        // safety flush (which counts what the hints left parked)
        if std::mem::take(&mut self.capacity_freed) {
            self.wake_by_capacity();
        }
        self.flushed.clear();
        if self.wake_at.is_some_and(|t| now_ms >= t) {
            if self.wake_all_at.is_some_and(|t| now_ms >= t) {
                self.wake_all();
            } else {
                // a job growing old enough to reserve changes only itself
                // (it may reserve if it is its queue's head; the others
                // stay behind it as they were)
                let due: Vec<(bool, String)> = self
                    .parked
                    .iter()
                    .filter(|(_, j)| j.reserve_at.is_some_and(|t| now_ms >= t))
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in &due {
                    self.wake(key);
                }
                self.wake_at = self
                    .parked
                    .values()
                    .filter_map(|j| j.reserve_at)
                    .chain(self.wake_all_at)
                    .min();
            }
        }
        let last = *self.last_flush.get_or_insert(now_ms);
        if now_ms >= last.saturating_add(self.flush_ms) {
            self.last_flush = Some(now_ms);
            if !self.parked.is_empty() {
                self.stats.flushes += 1;
                self.flushed = self.parked.keys().cloned().collect();
                self.wake_all();
            }
        }
        self.refresh_view();
        self.view.pod.resize(self.snap.pods.len(), false);
        self.refresh_index();
        if self.view.verdicts.is_none() {
            self.view.verdicts = Some(BTreeMap::new());
        }
        if self.view.capacity.is_none() {
            self.view.capacity = Some(crate::fairshare::schedulable_capacity(&self.snap));
        }
        let delta = std::mem::take(&mut self.delta);
        self.view.pods_changed = self.delta_valid.then_some(delta);
        self.delta_valid = true;
        let kept = Self::kept_state(
            &self.snap.nodes,
            self.state.take(),
            std::mem::take(&mut self.adjust),
        );
        let state = match kept {
            Some(cs) => (cs, Vec::new()),
            None => {
                self.stats.rebuilds += 1;
                ClusterState::from_snapshot(&self.snap)
            }
        };
        let clean = state.1.is_empty();
        let (out, parts, candidates, verdicts) =
            self.sched
                .cycle_on(&self.snap, state, &self.view, (now_ms, seed), true);
        self.state = clean.then_some(parts);
        if let Some(kept) = &mut self.view.verdicts {
            // bounded: a cluster of many pod shapes starts over rather
            // than keep every shape's verdicts on every node
            if kept.len() + verdicts.len() > MAX_KEPT_VERDICTS {
                kept.clear();
            }
            kept.extend(verdicts);
        }
        if !self.flushed.is_empty() {
            self.count_missed(&out);
        }
        if let Some(mut oracle) = self.oracle.take() {
            self.check(&mut oracle, &out, now_ms, seed);
            self.oracle = Some(oracle);
        }
        if self.park && clean {
            self.park_jobs(candidates, &out, now_ms);
        }
        out
    }

    /// Counts the jobs the flush woke that then got a decision: no change
    /// woke them, yet one could have.
    fn count_missed(&mut self, out: &CycleOutput) {
        let mut seen = std::collections::BTreeSet::new();
        for d in &out.decisions {
            let pod = match d {
                Decision::Bind { pod, .. } | Decision::Nominate { pod, .. } => *pod,
                _ => continue,
            };
            let p = &self.snap.pods[pod as usize].pod;
            let key = match &p.group {
                Some(g) => (true, g.clone()),
                None => (false, p.name.clone()),
            };
            if self.flushed.contains(&key) && seen.insert(key) {
                self.stats.missed_hints += 1;
            }
        }
    }

    /// The guard: the full pass over the same snapshot decides the same,
    /// and the kept capacity equals a fresh build.
    fn check(&mut self, oracle: &mut Scheduler, out: &CycleOutput, now_ms: u64, seed: u64) {
        let full = oracle.cycle(&self.snap, now_ms, seed);
        let c = self.stats.cycles;
        if full.decisions != out.decisions {
            // the parked jobs the full pass decided for: when and how long
            // they were parked (what the wake-up rules missed)
            let mut missed: Vec<String> = Vec::new();
            for d in &full.decisions {
                let (Decision::Bind { pod, .. } | Decision::Nominate { pod, .. }) = d else {
                    continue;
                };
                if self.view.pod.get(*pod as usize) != Some(&true) {
                    continue;
                }
                let p = &self.snap.pods[*pod as usize].pod;
                let key = match &p.group {
                    Some(g) => (true, g.clone()),
                    None => (false, p.name.clone()),
                };
                if let Some(j) = self.parked.get(&key) {
                    missed.push(format!(
                        "{} parked at {} ms, generation {} (now {now_ms}, generation {}, wake at {:?}; said then: {:?})",
                        key.1,
                        j.parked_ms,
                        j.parked_gen,
                        self.generation,
                        self.wake_at,
                        j.explained.first()
                    ));
                }
            }
            self.divergences.push(format!(
                "cycle {c}: decisions differ from the full pass: {:?} against {:?}; parked: {}",
                out.decisions,
                full.decisions,
                missed.join(", ")
            ));
        }
        // the counters, less the effort ones (parked and equivalent jobs
        // spare attempts a full pass makes)
        let effort = |s: &crate::decision::CycleStats| {
            let mut s = s.clone();
            s.nodes_scored = 0;
            s.jobs_skipped = 0;
            s.jobs_parked = 0;
            s
        };
        if effort(&full.stats) != effort(&out.stats) || full.warnings != out.warnings {
            self.divergences.push(format!(
                "cycle {c}: stats differ from the full pass: {:?} against {:?}; parked: {:?}; decisions {:?}",
                out.stats,
                full.stats,
                self.parked
                    .iter()
                    .map(|(k, j)| (k, &j.queue, j.priority, j.arrival, j.parked_ms))
                    .collect::<Vec<_>>(),
                out.decisions
            ));
        }
        // every pod the cycle explained, the full pass explains alike (but
        // for its place in the queue: parked jobs hold none); the pods it
        // did not explain are parked
        let mut theirs: BTreeMap<PodId, &crate::decision::Explanation> =
            full.explanations.iter().map(|e| (e.pod, e)).collect();
        for e in &out.explanations {
            match theirs.remove(&e.pod) {
                Some(f)
                    if f.verdict == e.verdict
                        && f.reasons == e.reasons
                        && f.evictions == e.evictions => {}
                f => {
                    self.divergences.push(format!(
                        "cycle {c}: pod {}: explained {e:?}, by the full pass {f:?}",
                        self.snap.pods[e.pod as usize].pod.name
                    ));
                    break;
                }
            }
        }
        if let Some(p) = theirs
            .keys()
            .find(|p| self.view.pod.get(**p as usize) != Some(&true))
        {
            self.divergences.push(format!(
                "cycle {c}: pod {} not explained, yet not parked",
                self.snap.pods[*p as usize].pod.name
            ));
        }

        if let Some(parts) = &self.state {
            let (fresh, _) = ClusterState::from_snapshot(&self.snap);
            let fresh = fresh.into_parts();
            for (i, (a, b)) in parts.state.iter().zip(&fresh.state).enumerate() {
                let mut a = a.clone();
                a.version = b.version;
                if a != *b {
                    self.divergences.push(format!(
                        "cycle {c}: node {}: kept capacity {:?} against rebuilt {:?}",
                        self.snap.nodes[i].name, a, b
                    ));
                    break;
                }
            }
        }
    }

    fn set_node(&mut self, n: Node) {
        match self.node_ix.get(&n.name) {
            Some(&i) => {
                let old = &self.snap.nodes[i as usize];
                // the free capacity depends on the allocatable and the GPUs
                // only; labels, taints and cordons keep it
                if old.allocatable != n.allocatable || old.gpus != n.gpus {
                    self.state = None;
                    self.adjust.clear();
                }
                self.snap.nodes[i as usize] = n;
            }
            None => {
                let i = self.snap.nodes.len() as NodeId;
                if let Some(p) = &mut self.state {
                    p.state.push(crate::state::NodeState::new(&n));
                }
                self.node_ix.insert(n.name.clone(), i);
                self.snap.nodes.push(n);
            }
        }
    }

    fn remove_node(&mut self, name: &str) -> Result<(), ChangeError> {
        let Some(&i) = self.node_ix.get(name) else {
            return Err(ChangeError::Unknown {
                kind: "node",
                name: name.to_string(),
            });
        };
        let mut holders = self
            .snap
            .pods
            .iter()
            .filter(|p| p.holding().is_some_and(|(n, _)| n == i));
        if let Some(first) = holders.next() {
            return Err(ChangeError::NodeInUse {
                node: name.to_string(),
                pods: 1 + holders.count(),
                first: first.pod.name.clone(),
            });
        }
        // the nodes keep their order: later ids move down by one (also in
        // the pending adjustments; none is on this node, it holds nothing)
        self.adjust.retain(|a| a.node != i);
        for a in &mut self.adjust {
            if a.node > i {
                a.node -= 1;
            }
        }
        self.snap.nodes.remove(i as usize);
        if let Some(p) = &mut self.state {
            p.state.remove(i as usize);
        }
        self.node_ix.remove(name);
        for v in self.node_ix.values_mut() {
            if *v > i {
                *v -= 1;
            }
        }
        for p in &mut self.snap.pods {
            match &mut p.phase {
                PodPhase::Pending { nominated, .. } => {
                    if *nominated == Some(i) {
                        *nominated = None;
                    } else if let Some(n) = nominated
                        && *n > i
                    {
                        *n -= 1;
                    }
                }
                PodPhase::Running { node, .. } | PodPhase::Terminating { node, .. } => {
                    if *node > i {
                        *node -= 1;
                    }
                }
            }
        }
        Ok(())
    }

    /// Adds (or takes out) a pod's demand to its queue's sums.
    fn sum(&mut self, p: &PodState, add: bool) {
        // the constraint plugins this pod is relevant to
        let counts = self
            .view
            .relevant
            .get_or_insert_with(|| vec![0; self.sched.constraint_count()]);
        self.sched.count_relevant(&p.pod, counts, add);
        let d = p.pod.demand();
        let e = self.sums.entry(p.pod.queue.clone()).or_default();
        let side = if p.holding().is_some() {
            &mut e.0
        } else {
            &mut e.1
        };
        if add {
            side.add(&d);
        } else {
            side.sub(&d);
            side.ext.retain(|_, v| *v != 0);
        }
    }

    /// Pod `i`'s queue and group positions (when the index is kept).
    fn set_index(&mut self, i: usize, pod: &Pod) {
        if self.index_dirty {
            return;
        }
        let q = self.queue_ix.get(&pod.queue).copied();
        let g = pod
            .group
            .as_ref()
            .and_then(|g| self.group_ix.get(g).copied());
        if let (Some(qs), Some(gs)) = (&mut self.view.pod_queue, &mut self.view.pod_group)
            && i < qs.len()
            && i < gs.len()
        {
            qs[i] = q;
            gs[i] = g;
        } else {
            self.index_dirty = true;
        }
    }

    /// What the cycle reads of the kept per-pod index and queue sums.
    fn refresh_index(&mut self) {
        let n = self.snap.pods.len();
        let stale = |v: &Option<Vec<Option<usize>>>| v.as_ref().is_none_or(|v| v.len() != n);
        if self.index_dirty || stale(&self.view.pod_queue) || stale(&self.view.pod_group) {
            self.view.pod_queue = Some(
                self.snap
                    .pods
                    .iter()
                    .map(|p| self.queue_ix.get(&p.pod.queue).copied())
                    .collect(),
            );
            self.view.pod_group = Some(
                self.snap
                    .pods
                    .iter()
                    .map(|p| {
                        p.pod
                            .group
                            .as_ref()
                            .and_then(|g| self.group_ix.get(g).copied())
                    })
                    .collect(),
            );
            self.index_dirty = false;
        }
        self.view.sums = Some(
            self.snap
                .queues
                .iter()
                .map(|q| self.sums.get(&q.name).cloned().unwrap_or_default())
                .collect(),
        );
    }

    /// Wakes every parked job (they are all tried in the next cycle).
    fn wake_all(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        self.parked.clear();
        self.view.pod = vec![false; self.snap.pods.len()];
        self.view.first.clear();
        self.view.jobs = 0;
        self.view.gangs = 0;
        self.summary.clear();
        self.wake_at = None;
        self.wake_all_at = None;
        self.view_dirty = false;
        self.stats.woken_all += 1;
        self.stats.parked = 0;
    }

    /// Wakes the parked jobs capacity freed since the last cycle may help.
    /// A job that could evict (a running pod of lower priority in its
    /// queue, with preemption; of another queue, with reclaim), or any job
    /// while a consolidation move is possible, is woken. The others are
    /// woken by shape — the jobs of one queue whose pods that must start
    /// together have the same scheduling keys, which the cycle treats as
    /// equivalent — in queue order, only as many as the free capacity
    /// (an upper bound: the kept capacity plus everything released since)
    /// can hold, and one more: a full pass would try those, and skip the
    /// rest as equivalent to the first that fails (`equiv`), so leaving
    /// them parked decides the same.
    fn wake_by_capacity(&mut self) {
        if self.parked.is_empty() {
            return;
        }
        let opts = &self.sched.opts;
        let Some(parts) = &self.state else {
            self.wake_all();
            return;
        };
        if opts.consolidation && self.movable_running > 0 {
            self.wake_all();
            return;
        }
        // free capacity, at most: kept, plus what was released since
        let mut free = ResourceVec::default();
        for st in &parts.state {
            free.cpu_milli += st.free.cpu_milli;
            free.memory += st.free.memory;
            free.gpu_milli += st.free.gpu_milli;
        }
        for a in self.adjust.iter().filter(|a| !a.assign) {
            free.cpu_milli += a.requests.cpu_milli;
            free.memory += a.requests.memory;
            free.gpu_milli += a.gpus.milli();
        }
        let fits = |d: &ResourceVec| -> Option<u64> {
            [
                (d.cpu_milli, free.cpu_milli),
                (d.memory, free.memory),
                (d.gpu_milli, free.gpu_milli),
            ]
            .into_iter()
            .filter(|(need, _)| *need > 0)
            .map(|(need, have)| have / need)
            .min()
        };
        let victims = |queue: &str, priority: i32| {
            self.holders.keys().any(|(q, p)| {
                (opts.preemption && q == queue && *p < priority) || (opts.reclaim && q != queue)
            })
        };
        // per (queue, shape): the jobs in queue order
        type Group<'k> = (&'k str, &'k [crate::plugin::SchedulingKey]);
        type Member<'k> = (std::cmp::Reverse<i32>, u64, &'k (bool, String));
        let mut groups: BTreeMap<Group<'_>, Vec<Member<'_>>> = BTreeMap::new();
        let mut wake: Vec<(bool, String)> = Vec::new();
        for (key, j) in &self.parked {
            if victims(&j.queue, j.priority) || j.shape.is_empty() {
                wake.push(key.clone());
                continue;
            }
            groups
                .entry((j.queue.as_str(), j.shape.as_slice()))
                .or_default()
                .push((std::cmp::Reverse(j.priority), j.arrival, key));
        }
        for (_, mut jobs) in groups {
            jobs.sort_by(|a, b| (a.0, a.1, &a.2.1).cmp(&(b.0, b.1, &b.2.1)));
            let demand = &self.parked[jobs[0].2].demand;
            let n = match fits(demand) {
                Some(k) => (k as usize).saturating_add(1),
                None => jobs.len(),
            };
            wake.extend(jobs.into_iter().take(n).map(|(_, _, k)| k.clone()));
        }
        if wake.len() == self.parked.len() {
            self.wake_all();
            return;
        }
        for key in &wake {
            self.wake(key);
        }
        self.stats.woken_by_capacity += 1;
    }

    /// Whether any queue has a quota that can refuse a job (a limit, or no
    /// borrowing beyond its guarantee).
    fn quotas(&self) -> bool {
        self.snap
            .queues
            .iter()
            .any(|q| q.limit.is_some() || !q.can_borrow)
    }

    /// Wakes one parked job.
    fn wake(&mut self, key: &(bool, String)) {
        if let Some(job) = self.parked.remove(key) {
            for name in &job.pods {
                if let Some(&i) = self.pod_ix.get(name)
                    && let Some(f) = self.view.pod.get_mut(i as usize)
                {
                    *f = false;
                }
            }
            self.view_dirty = true;
            self.stats.woken += 1;
            self.stats.parked = self.parked.len() as u64;
        }
    }

    /// Recounts what a cycle and the wake-up rules read of the parked jobs.
    fn refresh_view(&mut self) {
        if !self.view_dirty {
            return;
        }
        self.view_dirty = false;
        self.view.first.clear();
        self.summary.clear();
        self.view.jobs = self.parked.len() as u32;
        self.view.gangs = self.parked.values().filter(|j| j.counts_waiting).count() as u32;
        for ((_, name), j) in &self.parked {
            let key = (std::cmp::Reverse(j.priority), j.arrival, name.clone());
            match self.view.first.get_mut(&j.queue) {
                _ if !j.holds_place => {}
                Some(k) if *k <= key => {}
                Some(k) => *k = key,
                None => {
                    self.view.first.insert(j.queue.clone(), key);
                }
            }
            let e = self
                .summary
                .entry(j.queue.clone())
                .or_insert((i32::MIN, false));
            e.0 = e.0.max(j.priority);
            e.1 |= j.old;
        }
    }

    /// Keeps the running pods' start times by (queue, priority).
    fn holder_index(&mut self, p: &PodState, add: bool) {
        let PodPhase::Running { since_ms, .. } = p.phase else {
            return;
        };
        if p.pod.movable {
            self.movable_running = if add {
                self.movable_running + 1
            } else {
                self.movable_running.saturating_sub(1)
            };
        }
        let key = (p.pod.queue.clone(), p.pod.priority);
        if add {
            *self
                .holders
                .entry(key)
                .or_default()
                .entry(since_ms)
                .or_insert(0) += 1;
        } else if let Some(m) = self.holders.get_mut(&key) {
            if let Some(c) = m.get_mut(&since_ms) {
                *c -= 1;
                if *c == 0 {
                    m.remove(&since_ms);
                }
            }
            if m.is_empty() {
                self.holders.remove(&key);
            }
        }
    }

    /// When the first running pod that could be a victim of `c` (a lower
    /// priority in its queue; any pod of another queue, for reclaim)
    /// passes the shortest minimum runtime of any queue, if one has not
    /// yet.
    fn victim_ripens(&self, c: &ParkCandidate, now_ms: u64) -> Option<u64> {
        let opts = &self.sched.opts;
        let min_rt = self
            .snap
            .queues
            .iter()
            .filter_map(|q| q.min_runtime_ms)
            .fold(opts.min_runtime_ms, u64::min);
        // not yet of age: since + min_rt > now (a pod that started at 0
        // is not of age at 100 with a 150 minimum)
        let from = now_ms.saturating_add(1).saturating_sub(min_rt);
        self.holders
            .iter()
            .filter(|((q, p), _)| {
                (opts.preemption && *q == c.queue && *p < c.priority)
                    || (opts.reclaim && *q != c.queue)
            })
            .filter_map(|(_, m)| m.range(from..).next().map(|(s, _)| s + min_rt))
            .min()
    }

    /// Parks the jobs a cycle could not place (`Cycle::park_candidates`),
    /// with when they must be tried again whatever happens.
    fn park_jobs(&mut self, candidates: Vec<ParkCandidate>, out: &CycleOutput, now_ms: u64) {
        let said: BTreeMap<PodId, &crate::decision::Explanation> = if candidates.is_empty() {
            BTreeMap::new()
        } else {
            out.explanations.iter().map(|e| (e.pod, e)).collect()
        };
        for c in candidates {
            let reserve_at = c.arrival.saturating_add(self.sched.opts.reserve_after_ms);
            let old = now_ms >= reserve_at;
            let own = (!old).then_some(reserve_at);
            let all = [
                c.timeout_at,
                c.any_timeout_at,
                self.victim_ripens(&c, now_ms),
            ];
            if let Some(t) = all.into_iter().flatten().min() {
                self.wake_all_at = Some(self.wake_all_at.map_or(t, |w| w.min(t)));
            }
            if let Some(t) = own.into_iter().chain(self.wake_all_at).min() {
                self.wake_at = Some(self.wake_at.map_or(t, |w| w.min(t)));
            }
            let mut pods = Vec::with_capacity(c.pods.len());
            let mut explained = Vec::with_capacity(c.pods.len());
            for &p in &c.pods {
                if let Some(f) = self.view.pod.get_mut(p as usize) {
                    *f = true;
                }
                pods.push(self.snap.pods[p as usize].pod.name.clone());
                explained.push(said.get(&p).map(|e| crate::decision::Explanation {
                    queue_position: None,
                    ..(*e).clone()
                }));
            }
            self.parked.insert(
                (c.group.is_some(), c.name),
                ParkedJob {
                    queue: c.queue,
                    priority: c.priority,
                    arrival: c.arrival,
                    pods,
                    old,
                    counts_waiting: c.counts_waiting,
                    holds_place: c.holds_place,
                    explained,
                    parked_ms: now_ms,
                    parked_gen: self.generation,
                    shape: c.shape,
                    demand: c.demand,
                    reserve_at: own,
                },
            );
            self.view_dirty = true;
        }
        self.stats.parked = self.parked.len() as u64;
        self.refresh_view();
    }

    /// `at` with its node names as the engine's ids.
    fn phase_of(&self, pod: &str, at: &PodAt) -> Result<PodPhase, ChangeError> {
        let id = |node: &str| {
            self.node_ix
                .get(node)
                .copied()
                .ok_or_else(|| ChangeError::UnknownNode {
                    pod: pod.to_string(),
                    node: node.to_string(),
                })
        };
        Ok(match at {
            PodAt::Pending {
                nominated,
                nominated_at_ms,
            } => PodPhase::Pending {
                nominated: nominated.as_deref().map(id).transpose()?,
                nominated_at_ms: *nominated_at_ms,
            },
            PodAt::Running {
                node,
                gpus,
                since_ms,
            } => PodPhase::Running {
                node: id(node)?,
                gpus: gpus.clone(),
                since_ms: *since_ms,
            },
            PodAt::Terminating { node, gpus } => PodPhase::Terminating {
                node: id(node)?,
                gpus: gpus.clone(),
            },
        })
    }

    fn set_pod(&mut self, pod: Arc<Pod>, at: PodAt) -> Result<(), ChangeError> {
        let phase = self.phase_of(&pod.name, &at)?;
        let new = PodState { pod, phase };
        match self.pod_ix.get(&new.pod.name) {
            Some(&i) => {
                self.hint_change(Some(i), Some(&new));
                self.sum(&new, true);
                self.set_index(i as usize, &new.pod);
                if self.snap.pods[i as usize].pod != new.pod {
                    self.delta.added.push(new.pod.clone());
                    self.delta
                        .removed
                        .push(self.snap.pods[i as usize].pod.clone());
                }
                let old = std::mem::replace(&mut self.snap.pods[i as usize], new);
                self.sum(&old, false);
                self.holder_index(&old, false);
                self.holder_index(&self.snap.pods[i as usize].clone(), true);
                self.release(&old);
                self.hold(i);
            }
            None => {
                self.hint_change(None, Some(&new));
                let i = self.snap.pods.len() as PodId;
                self.pod_ix.insert(new.pod.name.clone(), i);
                self.holder_index(&new, true);
                self.sum(&new, true);
                self.delta.added.push(new.pod.clone());
                if let (Some(q), Some(g)) = (&mut self.view.pod_queue, &mut self.view.pod_group) {
                    q.push(None);
                    g.push(None);
                }
                self.set_index(i as usize, &new.pod);
                self.snap.pods.push(new);
                self.view.pod.push(false);
                self.hold(i);
            }
        }
        Ok(())
    }

    /// The wake-up rules for a pod change (`old`: the pod's id, if the
    /// engine has it; `new`: what it becomes, `None` when it goes).
    fn hint_change(&mut self, old: Option<PodId>, new: Option<&PodState>) {
        if self.parked.is_empty() {
            return;
        }
        let before = old.map(|i| self.snap.pods[i as usize].clone());
        let held = before.as_ref().is_some_and(|p| p.holding().is_some());
        let holds = new.is_some_and(|p| p.holding().is_some());
        let reserving = before.as_ref().is_some_and(|p| {
            matches!(
                p.phase,
                PodPhase::Pending {
                    nominated: Some(_),
                    ..
                }
            )
        });
        if held || reserving {
            // capacity freed, moved, or a holder changed; or a nomination
            // (the node it reserves for its job) kept, moved or dropped:
            // may help anyone the freed capacity can hold (woken at the
            // next cycle, by capacity), and the pod's own job
            if before.as_ref() != new {
                // a queue's usage moved: where a quota can refuse, who is
                // refused may change (and a job refused by quota holds no
                // place in its queue), so every parked job is tried
                if self.quotas() {
                    self.wake_all();
                    return;
                }
                self.capacity_freed = true;
                for p in [before.as_ref(), new].into_iter().flatten() {
                    let key = match &p.pod.group {
                        Some(g) => (true, g.clone()),
                        None => (false, p.pod.name.clone()),
                    };
                    self.wake(&key);
                }
            }
            return;
        }
        // a pod of a parked job bound by someone else: anything may follow
        let parked_pod = old.is_some_and(|i| self.view.pod.get(i as usize) == Some(&true));
        if parked_pod && holds {
            self.wake_all();
            return;
        }
        // a pod of a parked job changed or went, or a pod joins a parked
        // gang: that job is woken
        for p in [before.as_ref(), new].into_iter().flatten() {
            let key = match &p.pod.group {
                Some(g) => (true, g.clone()),
                None => (false, p.pod.name.clone()),
            };
            if self.parked.contains_key(&key) {
                self.wake(&key);
            }
        }
        self.refresh_view();
        let Some(pod) = new.or(before.as_ref()).map(|p| p.pod.clone()) else {
            return;
        };
        let opts = &self.sched.opts;
        let other_queue_parked = self.summary.keys().any(|q| *q != pod.queue);
        let (max_prio, old_in_queue) = self
            .summary
            .get(&pod.queue)
            .copied()
            .unwrap_or((i32::MIN, false));
        let wake = if holds {
            // a new running pod: a victim for a parked job of higher
            // priority in its queue, or for reclaim from another queue;
            // and it may move its queue's head
            (opts.preemption && max_prio > pod.priority)
                || (opts.reclaim && other_queue_parked)
                || old_in_queue
                || self.quotas()
        } else {
            // a pending pod added, changed or gone: its queue's demand, so
            // every queue's fair share — reclaim elsewhere, and reclaim by
            // its own queue's parked jobs when another queue runs pods they
            // could take back; and a gone one may have been its queue's head
            let own_queue_parked = self.summary.contains_key(&pod.queue);
            let victims_elsewhere = || self.holders.keys().any(|(q, _)| *q != pod.queue);
            (opts.reclaim && (other_queue_parked || (own_queue_parked && victims_elsewhere())))
                || (new.is_none() && old_in_queue)
        };
        if wake {
            self.wake_all();
        }
    }

    fn remove_pod(&mut self, name: &str) -> Result<(), ChangeError> {
        let Some(i) = self.pod_ix.remove(name) else {
            return Err(ChangeError::Unknown {
                kind: "pod",
                name: name.to_string(),
            });
        };
        self.hint_change(Some(i), None);
        // the last pod takes the gone one's id (pod ids order nothing but
        // the output: jobs are ordered by priority, arrival and name)
        let old = self.snap.pods.swap_remove(i as usize);
        if (i as usize) < self.view.pod.len() {
            self.view.pod.swap_remove(i as usize);
        }
        self.holder_index(&old, false);
        if let Some(moved) = self.snap.pods.get(i as usize) {
            self.pod_ix.insert(moved.pod.name.clone(), i);
        }
        self.sum(&old, false);
        self.delta.removed.push(old.pod.clone());
        if let (Some(q), Some(g)) = (&mut self.view.pod_queue, &mut self.view.pod_group)
            && (i as usize) < q.len()
            && (i as usize) < g.len()
        {
            q.swap_remove(i as usize);
            g.swap_remove(i as usize);
        }
        self.release(&old);
        Ok(())
    }

    /// Gives back what `old` held in the kept capacity (at the next
    /// cycle, in order with the other adjustments).
    fn release(&mut self, old: &PodState) {
        if self.state.is_some()
            && let Some((node, gpus)) = old.holding()
        {
            self.adjust.push(Adjust {
                assign: false,
                node,
                requests: old.pod.requests.clone(),
                gpus: gpus.clone(),
            });
        }
    }

    /// Places what pod `i` holds in the kept capacity (at the next cycle).
    fn hold(&mut self, i: PodId) {
        let p = &self.snap.pods[i as usize];
        if self.state.is_some()
            && let Some((node, gpus)) = p.holding()
        {
            self.adjust.push(Adjust {
                assign: true,
                node,
                requests: p.pod.requests.clone(),
                gpus: gpus.clone(),
            });
        }
    }

    /// The kept capacity with the adjustments since the last cycle applied
    /// (`None` when there is none, or one does not fit: then the cycle
    /// rebuilds from every pod and reports the pods that do not fit).
    fn kept_state<'a>(
        nodes: &'a [Node],
        parts: Option<StateParts>,
        adjust: Vec<Adjust>,
    ) -> Option<ClusterState<'a>> {
        let mut cs = ClusterState::from_parts(nodes, parts?)?;
        for a in adjust {
            if a.assign {
                cs.assign(a.node, &a.requests, &a.gpus).ok()?;
            } else {
                cs.release(a.node, &a.requests, &a.gpus);
            }
        }
        Some(cs)
    }
}

/// How many scheduling keys' filter verdicts the engine keeps (each is a
/// flag and an id per node: ≈ 25 KB at 5,000 nodes).
const MAX_KEPT_VERDICTS: usize = 512;

/// A change of the kept capacity, applied at the next cycle.
struct Adjust {
    assign: bool,
    node: NodeId,
    requests: ResourceVec,
    gpus: GpuAssignment,
}

fn set_named<T>(
    v: &mut Vec<T>,
    ix: &mut BTreeMap<String, usize>,
    x: T,
    name: impl Fn(&T) -> &String,
) {
    match ix.get(name(&x)) {
        Some(&i) => v[i] = x,
        None => {
            ix.insert(name(&x).clone(), v.len());
            v.push(x);
        }
    }
}

fn remove_named<T>(
    v: &mut Vec<T>,
    ix: &mut BTreeMap<String, usize>,
    key: &str,
    kind: &'static str,
    name: impl Fn(&T) -> &String,
) -> Result<(), ChangeError> {
    let Some(i) = ix.remove(key) else {
        return Err(ChangeError::Unknown {
            kind,
            name: key.to_string(),
        });
    };
    v.remove(i);
    *ix = index(v, name);
    Ok(())
}

/// The names, each once (else which is twice).
fn unique<'a>(
    kind: &'static str,
    names: impl Iterator<Item = &'a str>,
) -> Result<std::collections::BTreeSet<&'a str>, ChangeError> {
    let mut seen = std::collections::BTreeSet::new();
    for n in names {
        if !seen.insert(n) {
            return Err(ChangeError::Duplicate {
                kind,
                name: n.to_string(),
            });
        }
    }
    Ok(seen)
}

/// Each object's position by its name.
fn index<T>(v: &[T], name: impl Fn(&T) -> &String) -> BTreeMap<String, usize> {
    v.iter()
        .enumerate()
        .map(|(i, x)| (name(x).clone(), i))
        .collect()
}

fn keys_not_in<T>(
    ix: &BTreeMap<String, T>,
    keep: &std::collections::BTreeSet<&str>,
) -> Vec<String> {
    ix.keys()
        .filter(|k| !keep.contains(k.as_str()))
        .cloned()
        .collect()
}

/// A whole snapshot as changes: its nodes, queues and groups, then its pods
/// (each with its node named), in the snapshot's order. Applied to an empty
/// [`Engine`], they give the same snapshot.
pub fn changes_of(snap: &Snapshot) -> Result<Vec<Change>, ChangeError> {
    let mut v: Vec<Change> = Vec::with_capacity(
        snap.nodes.len() + snap.queues.len() + snap.groups.len() + snap.pods.len(),
    );
    v.extend(snap.nodes.iter().cloned().map(Change::Node));
    v.extend(snap.queues.iter().cloned().map(Change::Queue));
    v.extend(snap.groups.iter().cloned().map(Change::Group));
    for p in &snap.pods {
        v.push(Change::Pod(p.pod.clone(), pod_at(snap, p)?));
    }
    Ok(v)
}

/// Where pod `p` of `snap` is, its node named.
fn pod_at(snap: &Snapshot, p: &PodState) -> Result<PodAt, ChangeError> {
    let name = |pod: &str, n: NodeId| {
        snap.nodes
            .get(n as usize)
            .map(|x| x.name.clone())
            .ok_or_else(|| ChangeError::UnknownNode {
                pod: pod.to_string(),
                node: format!("#{n}"),
            })
    };
    Ok(match &p.phase {
        PodPhase::Pending {
            nominated,
            nominated_at_ms,
        } => PodAt::Pending {
            // a nomination of a node the snapshot lacks is no nomination
            nominated: nominated.and_then(|n| name(&p.pod.name, n).ok()),
            nominated_at_ms: *nominated_at_ms,
        },
        PodPhase::Running {
            node,
            gpus,
            since_ms,
        } => PodAt::Running {
            node: name(&p.pod.name, *node)?,
            gpus: gpus.clone(),
            since_ms: *since_ms,
        },
        PodPhase::Terminating { node, gpus } => PodAt::Terminating {
            node: name(&p.pod.name, *node)?,
            gpus: gpus.clone(),
        },
    })
}

/// Whether a snapshot's phase (its node ids mapped to the engine's by
/// `node_map`) is the engine's phase.
fn same_phase(theirs: &PodPhase, ours: &PodPhase, node_map: &[Option<NodeId>]) -> bool {
    let map = |n: &NodeId| node_map.get(*n as usize).copied().flatten();
    match (theirs, ours) {
        (
            PodPhase::Pending {
                nominated: a,
                nominated_at_ms: at,
            },
            PodPhase::Pending {
                nominated: b,
                nominated_at_ms: bt,
            },
        ) => {
            at == bt
                && match a {
                    // a nomination of a node the snapshot lacks is none
                    Some(n) if (*n as usize) < node_map.len() => map(n).is_some() && map(n) == *b,
                    _ => b.is_none(),
                }
        }
        (
            PodPhase::Running {
                node: a,
                gpus: ag,
                since_ms: at,
            },
            PodPhase::Running {
                node: b,
                gpus: bg,
                since_ms: bt,
            },
        ) => map(a) == Some(*b) && ag == bg && at == bt,
        (
            PodPhase::Terminating { node: a, gpus: ag },
            PodPhase::Terminating { node: b, gpus: bg },
        ) => map(a) == Some(*b) && ag == bg,
        _ => false,
    }
}

/// The binds of a cycle, as the changes a runner that carried them out
/// reports (each bound pod running on its node since `now_ms`).
pub fn binds_as_changes(engine: &Engine, out: &CycleOutput, now_ms: u64) -> Vec<Change> {
    let snap = engine.snapshot();
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, node, gpus } => {
                let p = snap.pods.get(*pod as usize)?;
                let n = snap.nodes.get(*node as usize)?;
                Some(Change::Pod(
                    p.pod.clone(),
                    PodAt::Running {
                        node: n.name.clone(),
                        gpus: gpus.clone(),
                        since_ms: now_ms,
                    },
                ))
            }
            _ => None,
        })
        .collect()
}

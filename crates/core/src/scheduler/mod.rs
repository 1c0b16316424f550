//! The scheduler: the action pipeline over one cycle.
//!
//! Where things go (see also docs/scheduling.md):
//!
//! - `cycle`: the mutable state of one cycle (`cycle::Cycle`) and its
//!   bookkeeping (placing and removing through a [`crate::Statement`],
//!   binding, the change log);
//! - `jobs`: grouping pending pods into jobs and ordering them;
//! - `candidates`: the candidate index: static filter verdicts cached per
//!   pod signature, and a lazy heap of node scores per signature;
//! - `actions`: one module per action behind the `actions::Action`
//!   seam; the pipeline is built from [`SchedulerOptions`].
//!
//! The pipeline: admit → allocate (with backfill and reservations)
//! → consolidate → preempt → reclaim → explain.
//!
//! - **admit**: pending pods are grouped into jobs (a pod group, or a lone
//!   pod). Queues are visited most-under-served first (see
//!   [`crate::fairshare`]); inside a queue, jobs go by priority (high first),
//!   then arrival, then name. A job that would break a queue limit or a
//!   no-borrow rule waits.
//! - **allocate**: a job is placed inside a [`crate::Statement`]; a gang
//!   commits only when `minMember` pods fit (else everything rolls back).
//!   Gangs with a topology constraint try one domain at a time (best fit
//!   first); a preferred constraint falls back to the whole cluster.
//! - **backfill**: when a job does not fit, later jobs still try (so small
//!   jobs use idle capacity). Once the head job has waited
//!   `reserve_after_ms`, nodes are reserved for it: nothing else is placed
//!   there, and they drain until it fits (no starvation).
//! - **consolidate**: a job that fits the cluster's free GPUs in total but
//!   no node gets room by moving the fewest pods that opted in (movable pod
//!   or queue, priority no higher, no exhausted disruption budget, not in a
//!   gang); the moves and the job's nominations commit together or not at
//!   all ([`moves`] is the planner, shared with the simulator's FGD method).
//! - **preempt**: a job that still does not fit may evict pods of its own
//!   queue with lower priority. Victims are chosen per node with the fewest
//!   and lowest-priority victims (greedy removal, then reprieve); a victim in
//!   a running gang takes its whole gang with it. Evictions are committed
//!   only if the preemptor then fits; the freed nodes are nominated for it.
//! - **reclaim**: a queue below what it deserves may evict pods of queues
//!   above what they deserve (if reclaimable), never pushing them below
//!   their deserved share or guarantee.
//! - **explain**: every pod left pending gets typed reasons
//!   ([`crate::PendingReason`]) rendered in kube-scheduler's style.

mod actions;
mod candidates;
mod cycle;
mod equiv;
mod jobs;
pub mod moves;

use crate::decision::CycleOutput;
use crate::plugin::{Filter, Packer, PodConstraint};
use crate::snapshot::Snapshot;
use crate::state::{ClusterState, StateError, StateParts};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// The longest a nomination (a pod's `PodPhase::Pending::nominated`,
    /// whoever wrote it) holds its node for the pod's job, from
    /// `nominated_at_ms` (ms). A nomination is also honoured only while
    /// the pod passes the static filters on that node and fits its
    /// allocatable; otherwise, or once older, the node is not held (the
    /// job may still be placed, reserve or preempt again).
    pub max_nomination_ms: u64,
    /// Preempt lower-priority pods of the same queue.
    pub preemption: bool,
    /// Reclaim borrowed capacity across queues.
    pub reclaim: bool,
    /// Upper bound on evictions per cycle.
    pub max_evictions_per_cycle: u32,
    /// A running pod is not chosen as a preemption or reclaim victim
    /// before it has run this long (ms, from its bind:
    /// `PodPhase::Running::since_ms`); a gang counts from its youngest
    /// running member. A queue may set its own
    /// (`Queue::min_runtime_ms`, inherited by its children).
    pub min_runtime_ms: u64,
    /// Upper bound on topology domains tried per gang.
    pub max_domains_per_gang: u32,
    /// Move pods that opted in (`gpusched.io/movable`, or a movable queue)
    /// so that a pending job that fits the free capacity in total, but no
    /// node, fits. Nothing moves unless pods opted in.
    pub consolidation: bool,
    /// Upper bound on pods moved per cycle (they count as evictions too).
    pub max_moves_per_cycle: u32,
    /// Upper bound on pods moved for one pending pod (the search depth).
    pub max_moves_per_job: u32,
    /// Candidate nodes examined per pending pod (smallest GPU shortfall
    /// first).
    pub consolidation_max_nodes: u32,
    /// Sets of pods tried per pending pod.
    pub consolidation_max_trials: u32,
    /// How preferences (the weighted, normalised scores of the
    /// [`PodConstraint`] plugins: preferred node and pod affinity,
    /// `PreferNoSchedule` taints, `ScheduleAnyway` spread) combine with the
    /// packing score (docs/scheduling.md).
    pub preferences: PreferenceOrder,
    /// Do not try again a job whose equivalent (same pods' signatures,
    /// count and, for evictions, queue and priority) failed earlier in the
    /// cycle with nothing committed since: it would fail the same way, and
    /// gets the same reasons ([`equiv`]). Exact; off only to compare.
    pub skip_equivalent_jobs: bool,
}

/// A job's place in its queue's order among jobs without nominations:
/// priority (high first), arrival, name.
pub(crate) type ParkedKey = (std::cmp::Reverse<i32>, u64, String);

/// What the incremental core keeps for a cycle ([`crate::engine`]): the
/// parked jobs (their pods' jobs are left out of the cycle) and what it
/// keeps instead of the cycle deriving it from every pod. The default (a
/// full pass) keeps nothing.
#[derive(Clone, Debug, Default)]
pub(crate) struct Parked {
    /// Pods of parked jobs, by pod id (shorter: the rest are not parked).
    pub pod: Vec<bool>,
    /// Per queue name, the order key of its first parked job.
    pub first: BTreeMap<String, ParkedKey>,
    /// Parked jobs, and how many of them are gangs a full pass would count
    /// as waiting (tried and short).
    pub jobs: u32,
    pub gangs: u32,
    /// Kept by the engine across cycles (`None`: the cycle derives them
    /// from every pod): each pod's queue (its position in the snapshot's
    /// queues) and group (position in its groups), by pod id ...
    pub pod_queue: Option<Vec<Option<usize>>>,
    pub pod_group: Option<Vec<Option<usize>>>,
    /// ... and per queue position, the demand of its own pods that hold
    /// resources (usage) and of those that do not (pending).
    pub sums: Option<Vec<(gpusched_model::ResourceVec, gpusched_model::ResourceVec)>>,
    /// The pods added and removed since the last cycle (for the packer).
    pub pods_changed: Option<crate::plugin::PodsChanged>,
    /// The schedulable capacity ([`crate::fairshare::schedulable_capacity`]),
    /// kept while no node changes.
    pub capacity: Option<gpusched_model::ResourceVec>,
    /// The static filters' verdicts per scheduling key, kept while no node
    /// changes (`None`: a full pass, computed per cycle).
    pub verdicts: Option<BTreeMap<crate::plugin::SchedulingKey, std::sync::Arc<Verdicts>>>,
    /// Per constraint plugin, how many pods are relevant to it
    /// (`PodConstraint::relevant`), kept from the changes (`None`: a full
    /// pass, counted per cycle).
    pub relevant: Option<Vec<u32>>,
}

/// The static filters' verdicts on every node for one scheduling key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Verdicts {
    /// Whether the filters pass each node.
    pub ok: Vec<bool>,
    /// The nodes they pass, in id order.
    pub ok_list: Vec<crate::snapshot::NodeId>,
    /// How many nodes each refusal was given by.
    pub rejects: BTreeMap<crate::reason::NodeReason, u32>,
}

/// The verdicts a cycle computed for scheduling keys it did not find kept.
pub(crate) type NewVerdicts = Vec<(crate::plugin::SchedulingKey, std::sync::Arc<Verdicts>)>;

/// A job a cycle could not place and did nothing for: the engine may park
/// it until a change may help it.
#[derive(Clone, Debug)]
pub(crate) struct ParkCandidate {
    /// Its pending pods.
    pub pods: Vec<crate::snapshot::PodId>,
    /// The group's name for a gang, else `None` (a lone pod).
    pub group: Option<String>,
    pub queue: String,
    pub priority: i32,
    pub arrival: u64,
    /// Its name (the group's or the pod's).
    pub name: String,
    /// When the gang times out, if it has a schedule timeout.
    pub timeout_at: Option<u64>,
    /// The earliest time any gang this cycle left unplaced times out (the
    /// same for every candidate): a queue head that times out leaves the
    /// head to a job behind it, in the cycle it times out.
    pub any_timeout_at: Option<u64>,
    /// A gang counted in `CycleStats::gangs_waiting` (tried and short, not
    /// stopped by its quota): a parked one is counted the same way.
    pub counts_waiting: bool,
    /// Its shape for the equivalent-job skip (`equiv::Shape`): the
    /// scheduling keys of the pods that must start together, in order.
    pub shape: Vec<crate::plugin::SchedulingKey>,
    /// What those pods ask together.
    pub demand: gpusched_model::ResourceVec,
    /// It failed to fit (not refused by its queue's quota): as the full
    /// pass tries it, it waits in its queue — later jobs of the queue are
    /// not its head, and without backfill they wait behind it. A job the
    /// quota refused holds no such place.
    pub holds_place: bool,
}

/// Where preferences rank against the packing score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PreferenceOrder {
    /// Preferences first, packing breaks their ties (a weight-100
    /// preference always wins; kube-scheduler's weights make preferences
    /// dominate its resource scores in the same way).
    #[default]
    BeforePacking,
    /// Packing first, preferences break its ties.
    AfterPacking,
    /// Preferences are not scored (required constraints still hold).
    Ignore,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            backfill: true,
            reserve_after_ms: 300_000,
            max_reservations: 1,
            max_nomination_ms: 600_000,
            preemption: true,
            reclaim: true,
            max_evictions_per_cycle: 256,
            min_runtime_ms: 30_000,
            max_domains_per_gang: 32,
            consolidation: true,
            max_moves_per_cycle: 16,
            max_moves_per_job: 2,
            consolidation_max_nodes: 64,
            consolidation_max_trials: 512,
            preferences: PreferenceOrder::BeforePacking,
            skip_equivalent_jobs: true,
        }
    }
}

/// The scheduler: the action pipeline plus explicitly registered plugins.
pub struct Scheduler {
    /// The pipeline's knobs (read at every cycle).
    pub opts: SchedulerOptions,
    filters: Vec<Box<dyn Filter>>,
    packer: Box<dyn Packer>,
    constraints: Vec<Box<dyn PodConstraint>>,
}

impl Scheduler {
    /// A scheduler with these knobs, filters (ANDed in this order) and
    /// packer.
    pub fn new(
        opts: SchedulerOptions,
        filters: Vec<Box<dyn Filter>>,
        packer: Box<dyn Packer>,
    ) -> Self {
        Scheduler {
            opts,
            filters,
            packer,
            constraints: Vec::new(),
        }
    }

    /// Registers the stateful constraint plugins (evaluated in this order;
    /// filters ANDed, scores summed with their weights).
    pub fn with_constraints(mut self, constraints: Vec<Box<dyn PodConstraint>>) -> Self {
        self.constraints = constraints;
        self
    }

    /// The constraint plugins' names, in order.
    pub fn constraint_names(&self) -> Vec<&'static str> {
        self.constraints.iter().map(|c| c.name()).collect()
    }

    /// How many constraint plugins are registered.
    pub(crate) fn constraint_count(&self) -> usize {
        self.constraints.len()
    }

    /// Adds `pod` to (or takes it from) `counts`, per constraint plugin it
    /// is relevant to (`PodConstraint::relevant`).
    pub(crate) fn count_relevant(&self, pod: &gpusched_model::Pod, counts: &mut [u32], add: bool) {
        for (c, n) in self.constraints.iter().zip(counts.iter_mut()) {
            if c.relevant(pod) {
                *n = if add { *n + 1 } else { n.saturating_sub(1) };
            }
        }
    }

    /// The packer's name.
    pub fn packer_name(&self) -> &'static str {
        self.packer.name()
    }

    /// The filters' names, in order.
    pub fn filter_names(&self) -> Vec<&'static str> {
        self.filters.iter().map(|f| f.name()).collect()
    }

    /// One scheduling cycle over `snap` at virtual time `now_ms`: the full
    /// pass, every derived structure built from the snapshot (the
    /// incremental core, [`crate::engine::Engine`], runs the same pipeline
    /// on state it keeps, and this as its oracle).
    pub fn cycle(&mut self, snap: &Snapshot, now_ms: u64, seed: u64) -> CycleOutput {
        let state = ClusterState::from_snapshot(snap);
        self.cycle_on(snap, state, &Parked::default(), (now_ms, seed), false)
            .0
    }

    /// One cycle over `snap` with its cluster state already built (`state`:
    /// the free capacity with every holding pod placed, and the pods whose
    /// holdings did not fit, as [`ClusterState::from_snapshot`] gives
    /// them). Returns the output and the state as the cycle left it:
    /// everything it tried rolled back, its binds placed unless
    /// `undo_binds` (then it is the state it was given).
    pub(crate) fn cycle_on(
        &mut self,
        snap: &Snapshot,
        state: (ClusterState<'_>, Vec<(usize, StateError)>),
        parked: &Parked,
        (now_ms, seed): (u64, u64),
        undo_binds: bool,
    ) -> (CycleOutput, StateParts, Vec<ParkCandidate>, NewVerdicts) {
        let (mut cs, errors) = state;
        if undo_binds {
            cs.keep_originals();
        }
        let (mut c, jobs) = cycle::Cycle::new(
            (snap, cs, errors, parked),
            &self.filters,
            &mut *self.packer,
            &self.constraints,
            &self.opts,
            now_ms,
            seed,
        );
        for action in actions::pipeline(&self.opts) {
            action.run(&mut c, &jobs);
        }
        if undo_binds {
            // binds, held destinations of moves, any trial left placed:
            // the state goes back as it was given
            c.cs.restore_originals();
        }
        let candidates = if undo_binds {
            c.park_candidates(&jobs)
        } else {
            Vec::new()
        };
        let verdicts = std::mem::take(&mut c.new_verdicts);
        (c.out, c.cs.into_parts(), candidates, verdicts)
    }
}

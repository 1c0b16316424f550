//! Extension points. One small trait per point; each states its contract.
//!
//! Combining rules: filters are ANDed in registration order (the first
//! refusal is the node's reason); one packer scores and picks GPUs; scores
//! are integers, higher is better, ties go to the lower node id.

use crate::snapshot::{GpuAssignment, NodeId, PodId, Snapshot};
use crate::state::ClusterState;
use gpusched_model::{Node, Pod};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::hash::{Hash, Hasher};

/// What a pod's cached verdicts and scores depend on: the fields the core
/// reads (requests, GPU request, allowed GPU models, minimum GPU memory,
/// DRA claim constraints on GPUs)
/// plus every field each filter (and the packer) declares through
/// `scheduling_key`. Pods with equal keys share one entry of the core's
/// per-cycle cache (filter verdicts, score heap), like kube-scheduler's
/// `SignPlugin`.
///
/// Fields are written exactly (their `Hash` encoding, which is prefix-free),
/// not hashed, so equal keys mean equal fields. A plugin must add the same
/// sequence of fields for every pod (what it adds may not depend on the
/// pod's values, only the values themselves).
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SchedulingKey {
    bytes: Vec<u8>,
}

impl SchedulingKey {
    /// An empty key.
    pub fn new() -> Self {
        SchedulingKey::default()
    }

    /// Adds one field the verdict depends on.
    pub fn add<T: Hash + ?Sized>(&mut self, field: &T) {
        field.hash(&mut KeyWriter(&mut self.bytes));
    }
}

/// Writes a value's `Hash` encoding into a byte buffer.
struct KeyWriter<'a>(&'a mut Vec<u8>);

impl Hasher for KeyWriter<'_> {
    fn write(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }
    fn finish(&self) -> u64 {
        0
    }
}

/// A filter's verdict for one pod on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterResult {
    /// The node suits the pod.
    Pass,
    /// The node does not suit the pod now; preemption cannot change that
    /// either, but another node may suit. The reason is a short phrase in
    /// kube-scheduler style, e.g. `node(s) had untolerated taint(s)`.
    Reject(Cow<'static, str>),
}

/// The filters that can be registered (`gpusched_plugins::config` builds
/// them; the pending-pod classification, [`crate::report::classify`], tells
/// their refusals apart by name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FilterName {
    /// Refuse nodes marked unschedulable.
    NodeUnschedulable,
    /// The pod's node selector and required node affinity.
    NodeAffinity,
    /// Taints the pod does not tolerate.
    TaintToleration,
    /// GPU count, share, memory and model fit.
    GpuFit,
}

impl FilterName {
    /// The name (what the filter's [`Filter::name`] returns, and its YAML
    /// form).
    pub const fn as_str(self) -> &'static str {
        match self {
            FilterName::NodeUnschedulable => "node-unschedulable",
            FilterName::NodeAffinity => "node-affinity",
            FilterName::TaintToleration => "taint-toleration",
            FilterName::GpuFit => "gpu-fit",
        }
    }
}

/// Filter extension point: static node suitability.
///
/// Contract: the verdict depends only on the pod fields the filter declares
/// in [`Filter::scheduling_key`] and the node's spec (labels, taints, GPU
/// models, schedulable flag), never on what runs there; the core caches
/// verdicts per [`SchedulingKey`] within a cycle. Capacity is checked by the
/// core, not by filters.
pub trait Filter: Send + Sync {
    /// The filter's name (in configuration and in typed reasons).
    fn name(&self) -> &'static str;
    /// Adds to `key` every pod field [`Filter::filter`] reads (nothing if it
    /// reads none). A field read but not declared makes the core reuse
    /// another pod's verdicts.
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey);
    /// Whether `node` suits `pod`.
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult;
}

/// A packer's score of one placement: keys compared in order
/// (lexicographically), higher is better. Most policies use one key
/// ([`Score::new`]); a policy with a tie-break states it as further keys
/// ([`Score::keys`]) instead of packing them into one integer.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Score {
    /// The policy's main score.
    pub primary: i64,
    /// Compared when the primary keys are equal.
    pub secondary: i64,
    /// Compared when both are equal (then the lower node id wins).
    pub tie: i64,
}

impl Score {
    /// A one-key score.
    pub const fn new(primary: i64) -> Self {
        Score {
            primary,
            secondary: 0,
            tie: 0,
        }
    }

    /// A score of three keys, compared in this order.
    pub const fn keys(primary: i64, secondary: i64, tie: i64) -> Self {
        Score {
            primary,
            secondary,
            tie,
        }
    }
}

impl From<i64> for Score {
    fn from(v: i64) -> Self {
        Score::new(v)
    }
}

/// A one-key score equals its key (convenient in tests).
impl PartialEq<i64> for Score {
    fn eq(&self, other: &i64) -> bool {
        *self == Score::new(*other)
    }
}

/// A packer's choice on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Higher is better.
    pub score: Score,
    /// The GPUs the pod gets.
    pub gpus: GpuAssignment,
}

/// What a packer may look at when it prepares a cycle.
pub struct PackEnv<'s, 'c> {
    /// The cycle's snapshot.
    pub snapshot: &'s Snapshot,
    /// The cluster state at the start of the cycle.
    pub state: &'c ClusterState<'s>,
    /// The cycle's seed (the only source of randomness).
    pub seed: u64,
    /// The pods added and removed (by spec: a pod whose spec changed is
    /// removed as it was and added as it is) since the packer's last
    /// `prepare`, when the caller keeps track (the incremental core,
    /// [`crate::engine`]); `None` in a full pass. A packer that derives
    /// something from every pod may update it from these instead.
    pub pods_changed: Option<&'c PodsChanged>,
}

/// Pods added and removed between two `prepare` calls ([`PackEnv`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodsChanged {
    /// Pods that came (or whose spec became this).
    pub added: Vec<std::sync::Arc<gpusched_model::Pod>>,
    /// Pods that went (or whose spec was this).
    pub removed: Vec<std::sync::Arc<gpusched_model::Pod>>,
}

/// Packing extension point: choose GPUs on a node and score the result.
///
/// Contract:
/// - `place` returns `None` when the pod's GPU request cannot be met on the
///   node (CPU, memory and extended resources are checked by the core);
///   otherwise a GPU assignment that [`ClusterState::assign`] accepts.
/// - The result depends only on the pod's requests, GPU request, allowed
///   GPU models and minimum GPU memory (which the core keys its cache on),
///   any other pod field declared in [`Packer::scheduling_key`], the node's
///   current state and what `prepare` computed: the core caches results per
///   pod key and node version.
/// - Deterministic: randomness only from the seed given to `prepare`.
pub trait Packer: Send + Sync {
    /// The policy's name.
    fn name(&self) -> &'static str;
    /// Called once at the start of every cycle.
    fn prepare(&mut self, _env: &PackEnv<'_, '_>) {}
    /// Adds to `key` the pod fields `place` reads beyond those the core
    /// keys on already (see the contract); most packers read none.
    fn scheduling_key(&self, _pod: &Pod, _key: &mut SchedulingKey) {}
    /// Where `pod` would go on `node` and how good that is.
    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement>;
    /// What `prepare` computed, as a number a caller may cache `place` by
    /// across cycles: two `place` calls for pods of one scheduling key on
    /// one node version give equal results when `generation` returned the
    /// same `Some` value after each one's `prepare`. A packer bumps it
    /// whenever `prepare` changes something `place` reads. `None` (the
    /// default): no promise beyond the cycle.
    fn generation(&self) -> Option<u64> {
        None
    }
}

/// What a pod needs from a [`ConstraintState`] (its pre-filter result).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Needs {
    /// [`ConstraintState::filter`] must pass on the chosen node.
    pub filter: bool,
    /// [`ConstraintState::score`] ranks the nodes.
    pub score: bool,
}

impl Needs {
    /// Neither filter nor score: the pod takes the cached fast path.
    pub const NONE: Needs = Needs {
        filter: false,
        score: false,
    };

    /// Whether nothing is needed.
    pub fn is_none(&self) -> bool {
        !self.filter && !self.score
    }

    /// Both needs together.
    pub fn or(self, o: Needs) -> Needs {
        Needs {
            filter: self.filter || o.filter,
            score: self.score || o.score,
        }
    }
}

/// Stateful constraint extension point: constraints that depend on what
/// runs where (inter-pod affinity, topology spread, host ports) or that
/// rank nodes (preferences). kube-scheduler's PreFilter state with its
/// `AddPod`/`RemovePod` extensions, then Filter and Score on that state.
///
/// Contract:
/// - [`PodConstraint::start`] is called once per cycle; the core then
///   calls [`ConstraintState::add_pod`] for every pod of the snapshot that
///   holds resources, and `add_pod`/`remove_pod` for every change a
///   [`crate::Statement`] makes (placements, tentative evictions, their
///   rollback), so the state always describes the cluster state the core
///   is trying a pod against (gang members placed so far, victims removed
///   in a preemption what-if, consolidation moves).
/// - Before it evaluates a pod the core calls
///   [`ConstraintState::pre_filter`] (the pod is pending); the state may
///   keep per-pod data from it, which `add_pod`/`remove_pod` must keep
///   current. A pod for which every state answers [`Needs::NONE`] keeps
///   the core's cached fast path (filter verdicts per
///   [`SchedulingKey`], lazy score heap), so the common pod pays nothing.
/// - `filter` and `score` are deterministic functions of the state.
pub trait PodConstraint: Send + Sync {
    /// The plugin's name (in configuration and in typed reasons).
    fn name(&self) -> &'static str;
    /// The weight of its normalised score (0–100 per node) in the
    /// preference sum.
    fn weight(&self) -> i64 {
        1
    }
    /// A fresh state for one cycle over `snapshot`.
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's>;
    /// Whether `pod` can make this plugin matter, as the pod being placed
    /// or as one already placed. `false` promises: in a snapshot where no
    /// pod is relevant, `pre_filter` asks nothing for any pod (so no pod is
    /// filtered or scored by it); the core then builds no state for the
    /// cycle (no `start`, no `add_pod` per running pod). Default: always
    /// relevant.
    fn relevant(&self, _pod: &Pod) -> bool {
        true
    }
}

/// The per-cycle state of a [`PodConstraint`] (see its contract).
pub trait ConstraintState {
    /// Pod `pod` now holds a place on `node`.
    fn add_pod(&mut self, pod: PodId, node: NodeId);
    /// Pod `pod` no longer holds its place on `node`.
    fn remove_pod(&mut self, pod: PodId, node: NodeId);
    /// Prepares the evaluation of pending pod `pod`; says what it needs.
    fn pre_filter(&mut self, pod: PodId) -> Needs;
    /// Whether `node` suits `pod` now (called only after `pre_filter`
    /// asked for filtering). The reason is kube-scheduler's phrase.
    fn filter(&self, pod: PodId, node: NodeId) -> FilterResult;
    /// How much `pod` likes `node` now, higher is better (called only after
    /// `pre_filter` asked for scoring); `None`: the node is the least
    /// liked. The core normalises the scores over the candidate nodes to
    /// 0–100 and weighs them with [`PodConstraint::weight`].
    fn score(&self, pod: PodId, node: NodeId) -> Option<i64>;
}

/// Where `pod` would go on `node` and how good that is: the packer's
/// answer (its GPUs replaced by [`ClusterState::default_gpu_choice`] when
/// they break the pod's DRA claim constraints), except for a pod asking MIG instances, which the core places
/// itself by instances ([`ClusterState::mig_choice`]; a packer only knows
/// whole GPUs and shares). Its score prefers the GPU, then the node, with
/// the fewest free instances of the profile left (best fit keeps whole
/// partitions free for larger asks).
pub fn place(
    packer: &dyn Packer,
    pod: &Pod,
    node: NodeId,
    state: &ClusterState<'_>,
) -> Option<Placement> {
    let Some(ask) = &pod.mig else {
        let mut pl = packer.place(pod, node, state)?;
        // DRA claim constraints: a packer's choice that breaks them (GPUs
        // of two NVLink domains for a claim asking one) is replaced by the
        // core's choice within one group, keeping the packer's score
        if !state.claim_gpus_admit(pod, node, &pl.gpus) {
            pl.gpus = state.default_gpu_choice(pod, node)?;
        }
        return Some(pl);
    };
    let gpus = state.mig_choice(pod, node)?;
    let GpuAssignment::Mig { gpu, .. } = &gpus else {
        return None;
    };
    let n = state.node(node);
    let st = state.get(node);
    let left_gpu = st
        .free_mig(n, *gpu as usize, &ask.resource, &ask.profile)
        .len() as i64
        - i64::from(ask.count);
    let left_node: i64 = (0..n.gpus.len())
        .map(|g| st.free_mig(n, g, &ask.resource, &ask.profile).len() as i64)
        .sum::<i64>()
        - i64::from(ask.count);
    Some(Placement {
        score: Score::keys(-left_gpu, -left_node, 0),
        gpus,
    })
}

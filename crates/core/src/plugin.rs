//! Extension points. One small trait per point; each states its contract.
//!
//! Combining rules: filters are ANDed in registration order (the first
//! refusal is the node's reason); one packer scores and picks GPUs; scores
//! are integers, higher is better, ties go to the lower node id.

use crate::snapshot::{GpuAssignment, NodeId, Snapshot};
use crate::state::ClusterState;
use gpusched_model::{Node, Pod};
use std::borrow::Cow;

/// A filter's verdict for one pod on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FilterResult {
    Pass,
    /// The node does not suit the pod now; preemption cannot change that
    /// either, but another node may suit. The reason is a short phrase in
    /// kube-scheduler style, e.g. `node(s) had untolerated taint(s)`.
    Reject(Cow<'static, str>),
}

/// Filter extension point: static node suitability.
///
/// Contract: the verdict depends only on the pod's scheduling fields and the
/// node's spec (labels, taints, GPU models, schedulable flag), never on
/// what runs there; the core caches verdicts per pod signature within a
/// cycle. Capacity is checked by the core, not by filters.
pub trait Filter: Send + Sync {
    fn name(&self) -> &'static str;
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult;
}

/// A packer's choice on one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Higher is better.
    pub score: i64,
    pub gpus: GpuAssignment,
}

/// What a packer may look at when it prepares a cycle.
pub struct PackEnv<'s, 'c> {
    pub snapshot: &'s Snapshot,
    pub state: &'c ClusterState<'s>,
    pub seed: u64,
}

/// Packing extension point: choose GPUs on a node and score the result.
///
/// Contract:
/// - `place` returns `None` when the pod's GPU request cannot be met on the
///   node (CPU, memory and extended resources are checked by the core);
///   otherwise a GPU assignment that [`ClusterState::assign`] accepts.
/// - The result depends only on the pod's scheduling fields (not its name),
///   the node's current state and what `prepare` computed: the core caches
///   results per node version.
/// - Deterministic: randomness only from the seed given to `prepare`.
pub trait Packer: Send + Sync {
    fn name(&self) -> &'static str;
    /// Called once at the start of every cycle.
    fn prepare(&mut self, _env: &PackEnv<'_, '_>) {}
    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement>;
}

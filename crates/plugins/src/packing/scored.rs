//! The shape the stateless baselines share (`spread`, `binpack`,
//! `dot-prod`, `best-fit`, `gpu-packing`): a share goes on the GPU a
//! [`ShareChoice`] picks, whole GPUs on the topology choice
//! ([`WholeChooser`]), and the placement is scored by one function of the
//! node's state before placing. A new stateless policy is a score function
//! and one [`ScoredPacker::new`] line.

use super::names::PolicyName;
use super::util::WholeChooser;
use gpusched_core::{ClusterState, GpuAssignment, NodeId, Packer, Placement};
use gpusched_model::Pod;

/// Which GPU of `node` a share of `pod` takes (`None`: it fits on none).
pub type ShareChoice = fn(&ClusterState<'_>, &Pod, NodeId) -> Option<GpuAssignment>;

/// A stateless policy: its name, where a share goes and the score of a
/// placement (`score(state, pod, node, gpus)`, the state before placing).
pub struct ScoredPacker<F> {
    name: PolicyName,
    share: ShareChoice,
    score: F,
    whole: WholeChooser,
}

impl<F> ScoredPacker<F>
where
    F: Fn(&ClusterState<'_>, &Pod, NodeId, &GpuAssignment) -> i64 + Send + Sync,
{
    /// The policy `name` placing shares by `share` and scoring by `score`.
    pub fn new(name: PolicyName, share: ShareChoice, score: F) -> Self {
        ScoredPacker {
            name,
            share,
            score,
            whole: WholeChooser::new(),
        }
    }
}

impl<F> Packer for ScoredPacker<F>
where
    F: Fn(&ClusterState<'_>, &Pod, NodeId, &GpuAssignment) -> i64 + Send + Sync,
{
    fn name(&self) -> &'static str {
        self.name.as_str()
    }

    /// `place` reads the pod and the node's state only.
    fn generation(&self) -> Option<u64> {
        Some(0)
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let gpus = self
            .whole
            .assignment(state, pod, node, || (self.share)(state, pod, node))?;
        Some(Placement {
            score: (self.score)(state, pod, node, &gpus).into(),
            gpus,
        })
    }
}

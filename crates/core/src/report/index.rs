//! One index of a cycle the reports read ([`CycleIndex`]): each pod's gang
//! and queue, its explanation, whether the cycle placed it, and the label
//! of its main reason. The queue report and the pending list count and
//! list pods from it, so they cannot disagree about a pod.

use super::*;
use std::collections::BTreeSet;

/// The maps of one [`CycleView`] the reports share.
pub(super) struct CycleIndex<'a> {
    groups: BTreeMap<&'a str, &'a gpusched_model::PodGroup>,
    explained: BTreeMap<PodId, &'a Explanation>,
    placed: BTreeSet<PodId>,
}

impl<'a> CycleIndex<'a> {
    /// The index of `view`.
    pub(super) fn new(view: &CycleView<'a>) -> Self {
        let snap = view.snapshot;
        CycleIndex {
            groups: snap.groups.iter().map(|g| (g.name.as_str(), g)).collect(),
            explained: view
                .output
                .explanations
                .iter()
                .map(|e| (e.pod, e))
                .collect(),
            placed: view
                .output
                .decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Bind { pod, .. } => Some(*pod),
                    _ => None,
                })
                .collect(),
        }
    }

    /// The gang `pod` belongs to (`None`: none, or one the snapshot lacks).
    pub(super) fn group(&self, pod: &gpusched_model::Pod) -> Option<&'a gpusched_model::PodGroup> {
        pod.group
            .as_deref()
            .and_then(|g| self.groups.get(g).copied())
    }

    /// The queue `pod` waits in: its gang's, else its own.
    pub(super) fn queue_of<'p>(&self, pod: &'p gpusched_model::Pod) -> &'p str
    where
        'a: 'p,
    {
        self.group(pod)
            .map_or(pod.queue.as_str(), |g| g.queue.as_str())
    }

    /// The cycle's explanation of pod `id`.
    pub(super) fn explanation(&self, id: PodId) -> Option<&'a Explanation> {
        self.explained.get(&id).copied()
    }

    /// Whether the cycle bound pod `id` (binding in flight: not pending).
    pub(super) fn placed(&self, id: PodId) -> bool {
        self.placed.contains(&id)
    }
}

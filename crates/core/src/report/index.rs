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
    positions: BTreeMap<PodId, QueuePosition>,
}

impl<'a> CycleIndex<'a> {
    /// The index of `view`.
    pub(super) fn new(view: &CycleView<'a>) -> Self {
        let snap = view.snapshot;
        let mut index = CycleIndex {
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
            positions: BTreeMap::new(),
        };
        index.positions = queue_positions(snap, &index.explained, &index.placed);
        index
    }

    /// Where pod `id`'s job stands in its queue's order now.
    pub(super) fn position(&self, id: PodId) -> Option<QueuePosition> {
        self.positions.get(&id).copied()
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

/// Each explained pending pod's job's place in its queue, computed when a
/// report asks (the cycle does not keep it: parked jobs are not tried, and
/// every job behind an admitted one moves). The order is the cycle's:
/// jobs with a nomination first, then priority (high first), arrival (a
/// gang's earliest pending member), name; a job is a gang's pending
/// members, or a lone pod. Pods the cycle placed are not counted.
pub fn queue_positions(
    snap: &Snapshot,
    explained: &BTreeMap<PodId, &Explanation>,
    placed: &BTreeSet<PodId>,
) -> BTreeMap<PodId, QueuePosition> {
    let groups: BTreeMap<&str, &gpusched_model::PodGroup> =
        snap.groups.iter().map(|g| (g.name.as_str(), g)).collect();
    // (queue, (gang?, name)) → (nominated, priority, arrival, pods)
    type JobKey<'s> = (&'s str, (bool, &'s str));
    let mut jobs: BTreeMap<JobKey<'_>, (bool, i32, u64, Vec<PodId>)> = BTreeMap::new();
    for &id in explained.keys() {
        let Some(ps) = snap.pods.get(id as usize) else {
            continue;
        };
        let PodPhase::Pending { nominated, .. } = ps.phase else {
            continue;
        };
        if placed.contains(&id) {
            continue;
        }
        let pod = &ps.pod;
        let (queue, key, priority) = match pod.group.as_deref().and_then(|g| groups.get(g)) {
            Some(g) => (g.queue.as_str(), (true, g.name.as_str()), g.priority),
            None => (pod.queue.as_str(), (false, pod.name.as_str()), pod.priority),
        };
        let e = jobs
            .entry((queue, key))
            .or_insert((false, priority, u64::MAX, Vec::new()));
        e.0 |= nominated.is_some();
        e.2 = e.2.min(pod.arrival_ms);
        e.3.push(id);
    }
    let mut per_queue: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for ((queue, (_, name)), (nominated, priority, arrival, pods)) in jobs {
        per_queue.entry(queue).or_default().push((
            (
                std::cmp::Reverse(nominated),
                std::cmp::Reverse(priority),
                arrival,
                name,
            ),
            pods,
        ));
    }
    let mut out = BTreeMap::new();
    for (_, mut list) in per_queue {
        list.sort_by(|a, b| a.0.cmp(&b.0));
        let n = list.len() as u32;
        for (i, (_, pods)) in list.into_iter().enumerate() {
            for p in pods {
                out.insert(
                    p,
                    QueuePosition {
                        position: i as u32 + 1,
                        jobs: n,
                    },
                );
            }
        }
    }
    out
}

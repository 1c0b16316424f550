//! What a Queue's status should be: its allocation, fair share and pending
//! pods by reason ([`queue_figures`]).

use super::*;
use gpusched_core::report::classify::roll_up;

/// One queue's figures: what its status and metrics show.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueFigures {
    /// Held by its subtree's pods.
    pub allocated: ResourceVec,
    /// Deserved now.
    pub fair_share: ResourceVec,
    /// Pods waiting in its subtree (its own and its descendants', as
    /// `allocated` is its subtree's).
    pub pending: u32,
    /// Those pods by why they wait ([`PendingClass::reason_name`]).
    pub pending_by_reason: BTreeMap<String, u32>,
}

/// Figures of every valid queue, and the error of every invalid one.
/// `waiting`: the pending pods by queue and class (the cycle's explained
/// ones, and those the core never sees); each queue's figures count its
/// subtree's.
pub fn queue_figures(
    built: &Built,
    waiting: &[&BTreeMap<String, BTreeMap<PendingClass, u32>>],
) -> (BTreeMap<String, QueueFigures>, BTreeMap<String, String>) {
    let snap = &built.snapshot;
    // the fair shares the cycle computes at its start (one rule for the
    // capacity: gpusched_core::fairshare::schedulable_capacity)
    let (tree, _) = gpusched_core::report::queue_tree(snap);
    let mut invalid: BTreeMap<String, String> = BTreeMap::new();
    for p in &built.problems {
        if let Problem::InvalidQueue { queue, error } = p
            && !queue.is_empty()
        {
            invalid
                .entry(queue.clone())
                .or_insert_with(|| error.clone());
        }
    }
    // a parent's pending pods include its children's
    let own: BTreeMap<&str, BTreeMap<(), u32>> = built
        .pending_by_queue
        .iter()
        .map(|(q, n)| (q.as_str(), BTreeMap::from([((), *n)])))
        .collect();
    let pending = roll_up(&tree, own.iter().map(|(q, m)| (*q, m)));
    let by_reason = roll_up(
        &tree,
        waiting
            .iter()
            .flat_map(|w| w.iter().map(|(q, m)| (q.as_str(), m))),
    );
    let mut figures = BTreeMap::new();
    for q in &snap.queues {
        let Some(i) = tree.idx(&q.name) else { continue };
        let a = &tree.acct[i];
        figures.insert(
            q.name.clone(),
            QueueFigures {
                allocated: a.usage.clone(),
                fair_share: a.deserved.clone(),
                pending: pending
                    .get(&q.name)
                    .and_then(|m| m.get(&()))
                    .copied()
                    .unwrap_or(0),
                pending_by_reason: by_reason
                    .get(&q.name)
                    .into_iter()
                    .flatten()
                    .map(|(c, n)| (c.reason_name().to_string(), *n))
                    .collect(),
            },
        );
    }
    (figures, invalid)
}

pub(super) fn resources(r: &ResourceVec) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu".to_string(), format!("{}m", r.cpu_milli)),
        ("memory".to_string(), r.memory.to_string()),
        ("nvidia.com/gpu".to_string(), gpus_text(r.gpu_milli)),
    ])
}

/// The status a queue should have (conditions still to be settled).
/// `figures` is `None` for a queue left out of the tree (invalid).
pub fn wanted_queue(figures: Option<&QueueFigures>, error: Option<&str>) -> QueueStatus {
    let mut st = QueueStatus {
        conditions: vec![valid_condition(error)],
        ..Default::default()
    };
    if let Some(f) = figures {
        st.allocated = resources(&f.allocated);
        st.fair_share = resources(&f.fair_share);
        st.allocated_gpus = Some(gpus_text(f.allocated.gpu_milli));
        st.fair_share_gpus = Some(gpus_text(f.fair_share.gpu_milli));
        st.pending_pods = f.pending;
        st.pending_by_reason = f.pending_by_reason.clone();
    }
    st
}

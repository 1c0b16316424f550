//! A queue's report ([`queue_report`]) and the queue tree the reports
//! read ([`queue_tree`]).

use super::*;

/// The queue tree of a snapshot with usage, pending demand and fair shares
/// computed against the schedulable capacity (healthy GPUs of schedulable
/// nodes), as the cycle computes them at its start.
pub fn queue_tree(snap: &Snapshot) -> (QueueTree, Vec<QueueProblem>) {
    let (mut tree, problems) = QueueTree::build(&snap.queues);
    tree.account(snap);
    tree.compute_deserved(&schedulable_capacity(snap));
    (tree, problems)
}

pub(super) fn queue_state(tree: &QueueTree, q: QueueIdx) -> QueueState {
    let queue = &tree.queues[q];
    let a = &tree.acct[q];
    let over = |u: u64, g: u64| u.saturating_sub(g);
    let mut borrowed = ResourceVec {
        cpu_milli: over(a.usage.cpu_milli, a.guarantee.cpu_milli),
        memory: over(a.usage.memory, a.guarantee.memory),
        gpu_milli: over(a.usage.gpu_milli, a.guarantee.gpu_milli),
        gpu_mem_mib: over(a.usage.gpu_mem_mib, a.guarantee.gpu_mem_mib),
        ..Default::default()
    };
    for (k, v) in &a.usage.ext {
        let b = over(*v, a.guarantee.ext_get(k));
        if b > 0 {
            borrowed.ext.insert(k.clone(), b);
        }
    }
    QueueState {
        name: queue.name.clone(),
        parent: tree.parent[q].map(|p| tree.queues[p].name.clone()),
        weight: queue.weight,
        guarantee: a.guarantee.clone(),
        limit: queue.limit.clone(),
        can_borrow: queue.can_borrow,
        reclaimable: queue.reclaimable,
        usage: a.usage.clone(),
        pending: a.pending.clone(),
        fair_share: a.deserved.clone(),
        borrowed,
        share_ppm: tree.share_ppm(q),
    }
}

/// The report of the queue named `name` (`None`: no such queue).
pub fn queue_report(view: &CycleView<'_>, name: &str) -> Option<QueueReport> {
    let snap = view.snapshot;
    let (tree, problems) = queue_tree(snap);
    let q = tree.idx(name)?;
    let index = CycleIndex::new(view);
    let mut running_pods = 0;
    for (i, p) in snap.pods.iter().enumerate() {
        if index.queue_of(&p.pod) == name && (p.holding().is_some() || index.placed(i as PodId)) {
            running_pods += 1;
        }
    }
    // one classification: the reason names the Queue's status, events and
    // metrics show
    let classes = classify::classify_cycle(view.output, snap);
    let pending_by_reason = classify::queue_pending_by_reason(&classes, snap, name);
    Some(QueueReport {
        queue: queue_state(&tree, q),
        ancestors: tree.path(q)[1..]
            .iter()
            .map(|&a| queue_state(&tree, a))
            .collect(),
        children: tree.children[q]
            .iter()
            .map(|&c| tree.queues[c].name.clone())
            .collect(),
        running_pods,
        pending_by_reason,
        problems: problems.into_iter().filter(|p| p.queue() == name).collect(),
        at_ms: view.now_ms,
    })
}

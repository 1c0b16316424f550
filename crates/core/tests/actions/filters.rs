//! The filter-verdict cache: what a filter declares decides what is shared.

use super::*;

/// A filter that reads a pod field the core does not key on (the queue),
/// matched against a node label: pods of queue `x` only on nodes labelled
/// `pool=x`.
struct QueuePool {
    declare: bool,
}

impl Filter for QueuePool {
    fn name(&self) -> &'static str {
        "queue-pool"
    }
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
        if self.declare {
            key.add(&pod.queue);
        }
    }
    fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
        if node.labels.get("pool") == Some(&pod.queue) {
            FilterResult::Pass
        } else {
            FilterResult::Reject("node(s) belong to another queue's pool".into())
        }
    }
}

fn pool_snapshot() -> Snapshot {
    snapshot(
        vec![
            node("na").gpus(1).label("pool", "a").build(),
            node("nb").gpus(1).label("pool", "b").build(),
        ],
        vec![queue("a"), queue("b")],
        vec![],
        vec![
            pod("pa").gpus(1).queue("a").build(),
            pod("pb").gpus(1).queue("b").build(),
        ],
    )
}

#[test]
fn filter_verdicts_are_cached_by_what_the_filter_declares() {
    let snap = pool_snapshot();
    let mut s = Scheduler::new(
        SchedulerOptions::default(),
        vec![Box::new(QueuePool { declare: true })],
        Box::new(TestBestFit),
    );
    let out = run(&mut s, &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b["pa"].0, "na", "{b:?}");
    assert_eq!(b["pb"].0, "nb", "{b:?}");
}

#[test]
fn an_undeclared_field_shares_verdicts() {
    // The contract's other side: a filter that reads the queue without
    // declaring it gets the first pod's verdicts for the second.
    let snap = pool_snapshot();
    let mut s = Scheduler::new(
        SchedulerOptions::default(),
        vec![Box::new(QueuePool { declare: false })],
        Box::new(TestBestFit),
    );
    let out = s.cycle(&snap, 0, 7);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 1, "pb reused pa's verdicts (only na): {b:?}");
}

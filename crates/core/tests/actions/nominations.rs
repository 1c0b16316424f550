//! Nominations (issue 38, item 1): a node is held for a nominated pod's
//! job only while the pod could fit there, and for a bounded time.

use super::*;

fn nominate(snap: &mut Snapshot, pod: &str, node: &str, at_ms: u64) {
    let n = snap.nodes.iter().position(|x| x.name == node).unwrap() as NodeId;
    let p = snap.pods.iter_mut().find(|p| p.pod.name == pod).unwrap();
    p.phase = PodPhase::Pending {
        nominated: Some(n),
        nominated_at_ms: Some(at_ms),
    };
}

/// Three pods that can never fit (a GPU model no node has), each nominated
/// to a different node by whoever may write pod status, kept every other
/// pod off those nodes for as long as they existed.
#[test]
fn never_fitting_nominated_pods_do_not_close_their_nodes() {
    let mut snap = snapshot(
        vec![
            node("a").gpus(4).build(),
            node("b").gpus(4).build(),
            node("c").gpus(4).build(),
        ],
        vec![queue("default")],
        vec![],
        vec![
            pod("never-a").gpus(1).models(&["B200"]).build(),
            pod("never-b").gpus(1).models(&["B200"]).build(),
            pod("never-c").gpus(1).models(&["B200"]).build(),
            pod("w1").gpus(4).arrival(1).build(),
            pod("w2").gpus(4).arrival(1).build(),
            pod("w3").gpus(4).arrival(1).build(),
        ],
    );
    nominate(&mut snap, "never-a", "a", 0);
    nominate(&mut snap, "never-b", "b", 0);
    nominate(&mut snap, "never-c", "c", 0);
    let out = run(&mut sched(), &snap, 1000);
    let b = binds(&snap, &out);
    assert_eq!(
        b.keys().collect::<Vec<_>>(),
        vec!["w1", "w2", "w3"],
        "{:?}",
        explanation(&snap, &out, "w1")
    );
}

/// A nomination of the scheduler's own that went stale (the pod now asks
/// more than the node has) no longer holds the node.
#[test]
fn stale_nomination_of_a_pod_that_changed_size_is_dropped() {
    let mut snap = snapshot(
        vec![node("a").gpus(4).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("grown").gpus(8).build(),
            pod("small").gpus(2).arrival(1).build(),
        ],
    );
    nominate(&mut snap, "grown", "a", 0);
    let out = run(&mut sched(), &snap, 1000);
    let b = binds(&snap, &out);
    assert_eq!(
        b.keys().collect::<Vec<_>>(),
        vec!["small"],
        "{:?}",
        explanation(&snap, &out, "small")
    );
}

/// A nomination that could fit holds its node, but only for
/// `max_nomination_ms`.
#[test]
fn a_nomination_holds_its_node_for_a_bounded_time() {
    let mut snap = snapshot(
        vec![node("a").gpus(4).build()],
        vec![queue("default")],
        vec![],
        vec![pod("runner").gpus(2).build()],
    );
    let opts = SchedulerOptions {
        min_runtime_ms: 0,
        // no fresh reservation for the waiting pod: only the nomination
        // is under test
        reserve_after_ms: u64::MAX,
        ..Default::default()
    };
    let max = opts.max_nomination_ms;
    let mut s = Scheduler::new(opts, gpusched_testkit_filters(), Box::new(TestBestFit));
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("waiting").gpus(4).arrival(1).build()));
    snap.pods
        .push(PodState::pending(pod("other").gpus(2).arrival(2).build()));
    nominate(&mut snap, "waiting", "a", 10);
    let out = run(&mut s, &snap, 10 + max);
    assert!(
        binds(&snap, &out).is_empty(),
        "held while young: {:?}",
        binds(&snap, &out)
    );
    let out = run(&mut s, &snap, 11 + max);
    assert_eq!(
        binds(&snap, &out).keys().collect::<Vec<_>>(),
        vec!["other"],
        "{:?}",
        explanation(&snap, &out, "other")
    );
}

//! Evictions against a runner whose evictions take time: a victim keeps
//! its GPUs until it is gone (Kubernetes' graceful deletion), so no bind
//! may use them, in the cycle that evicts it or in the cycles after.

use gpusched_core::*;
use gpusched_testkit::*;

/// The default options, except that a pod may be a victim as soon as it
/// runs (the minimum runtime is tested on its own below).
fn sched() -> Scheduler {
    with_min_runtime(0)
}

fn with_min_runtime(ms: u64) -> Scheduler {
    Scheduler::new(
        SchedulerOptions {
            min_runtime_ms: ms,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    )
}

fn run(s: &mut Scheduler, snap: &Snapshot, now: u64) -> CycleOutput {
    let out = s.cycle(snap, now, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "t={now}: invariants violated: {v:?}");
    out
}

fn nominated(snap: &Snapshot, out: &CycleOutput) -> Vec<(String, String)> {
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Nominate { pod, node } => Some((
                snap.pods[*pod as usize].pod.name.clone(),
                snap.nodes[*node as usize].name.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// A borrowing queue `train` runs a 2-member gang across nodes a and b
/// (4 GPUs each); `prod` (guaranteed the whole cluster) then asks for two
/// 4-GPU pods.
fn gang_across_two_nodes() -> (Scheduler, Snapshot) {
    let mut prod = queue("prod");
    prod.guarantee.gpu_milli = 8000;
    let mut snap = snapshot(
        vec![node("a").gpus(4).build(), node("b").gpus(4).build()],
        vec![queue("train"), prod],
        vec![gang("g", "train", 2)],
        vec![
            pod("g-0").queue("train").gpus(4).group("g").build(),
            pod("g-1").queue("train").gpus(4).group("g").build(),
        ],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    assert_eq!(binds(&snap, &out).len(), 2);
    apply(&mut snap, &out, 0);
    for name in ["p1", "p2"] {
        snap.pods.push(PodState::pending(
            pod(name).queue("prod").gpus(4).arrival(1000).build(),
        ));
    }
    (s, snap)
}

/// Issue #22, item 5 (the executor refused "GPU 6 of b-03 would be
/// overbooked" in the millisecond of the reclaim): reclaiming one member
/// of a running gang evicts the whole gang, which freed its other node in
/// the cycle's state; the next job of the reclaim pass "fitted without
/// evictions" there and was bound onto GPUs whose pod was still running.
#[test]
fn a_reclaimed_gangs_other_node_is_not_bound_in_the_same_cycle() {
    let (mut s, mut snap) = gang_across_two_nodes();
    let out = run(&mut s, &snap, 2000);
    let mut ev = evictions(&snap, &out);
    ev.sort();
    assert_eq!(ev, ["g-0", "g-1"], "the gang goes whole");
    assert!(binds(&snap, &out).is_empty(), "{:?}", binds(&snap, &out));
    // both wait for the gang's GPUs: p2 on the node p1 does not take
    let mut nom = nominated(&snap, &out);
    nom.sort();
    assert_eq!(nom.len(), 2, "{nom:?}");
    assert_ne!(nom[0].1, nom[1].1, "{nom:?}");
    // the gang terminates over its grace period: nothing binds, nothing
    // more is evicted, both stay nominated
    terminate_evicted(&mut snap, &out);
    apply_nominations(&mut snap, &out);
    for t in [3000, 4000] {
        let out = run(&mut s, &snap, t);
        assert!(binds(&snap, &out).is_empty(), "t={t}");
        assert!(evictions(&snap, &out).is_empty(), "t={t}");
        assert_eq!(nominated(&snap, &out).len(), 2, "t={t}");
        apply_nominations(&mut snap, &out);
    }
    // gone: both bind where they were nominated
    finish_terminating(&mut snap);
    let out = run(&mut s, &snap, 5000);
    let b = binds(&snap, &out);
    assert!(b.contains_key("p1") && b.contains_key("p2"), "{b:?}");
}

/// The same through preemption: a high-priority pod evicts a low gang of
/// its own queue, and a second high-priority pod must not be bound onto
/// the gang's other node while it terminates.
#[test]
fn a_preempted_gangs_other_node_is_not_bound_in_the_same_cycle() {
    let mut snap = snapshot(
        vec![node("a").gpus(4).build(), node("b").gpus(4).build()],
        vec![queue("default")],
        vec![gang("g", "default", 2)],
        vec![
            pod("g-0").gpus(4).group("g").build(),
            pod("g-1").gpus(4).group("g").build(),
        ],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    for name in ["hi-1", "hi-2"] {
        snap.pods.push(PodState::pending(
            pod(name).gpus(4).priority(10).arrival(1000).build(),
        ));
    }
    let out = run(&mut s, &snap, 2000);
    assert_eq!(evictions(&snap, &out).len(), 2);
    assert!(binds(&snap, &out).is_empty(), "{:?}", binds(&snap, &out));
    assert_eq!(nominated(&snap, &out).len(), 2);
}

/// A 2-GPU victim evicted for a 1-GPU preemptor leaves a GPU over; it is
/// not free until the victim is gone, for the preemptor's own queue or
/// any other.
#[test]
fn a_victims_leftover_gpu_is_not_bound_in_the_same_cycle() {
    let mut snap = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default"), queue("other")],
        vec![],
        vec![pod("low").gpus(2).priority(1).build()],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("hi").gpus(1).priority(10).arrival(1000).build(),
    ));
    snap.pods.push(PodState::pending(
        pod("small").queue("other").gpus(1).arrival(1000).build(),
    ));
    let out = run(&mut s, &snap, 2000);
    assert_eq!(evictions(&snap, &out), ["low"]);
    assert!(binds(&snap, &out).is_empty(), "{:?}", binds(&snap, &out));
}

/// A pod whose deletion is in progress (the adapter passes a pod with a
/// deletionTimestamp as `Terminating`) holds its GPUs: a pending pod waits
/// for it (nominated), nothing is evicted for it, and it binds once the
/// pod is gone.
#[test]
fn a_deleted_pod_holds_its_gpus_until_gone() {
    let mut snap = snapshot(
        vec![node("a").gpus(4).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("old").gpus(4).build(),
            pod("other").gpus(1).priority(0).build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Terminating {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
    };
    snap.pods[1].phase = PodPhase::Pending {
        nominated: None,
        nominated_at_ms: None,
    };
    snap.pods
        .push(PodState::pending(pod("new").gpus(2).priority(5).build()));
    let mut s = sched();
    let out = run(&mut s, &snap, 1000);
    assert!(binds(&snap, &out).is_empty());
    assert!(evictions(&snap, &out).is_empty());
    assert_eq!(nominated(&snap, &out), [("new".into(), "a".into())]);
    finish_terminating(&mut snap);
    snap.pods.remove(0);
    apply_nominations(&mut snap, &out_shifted(&out, 1));
    let out = run(&mut s, &snap, 2000);
    assert!(binds(&snap, &out).contains_key("new"));
}

/// Keeps the nominations of a cycle for the next one (a runner's one-cycle
/// hold), without applying binds or evictions.
fn apply_nominations(snap: &mut Snapshot, out: &CycleOutput) {
    for p in &mut snap.pods {
        if let PodPhase::Pending { nominated, .. } = &mut p.phase {
            *nominated = None;
        }
    }
    for d in &out.decisions {
        if let Decision::Nominate { pod, node } = d
            && let Some(p) = snap.pods.get_mut(*pod as usize)
            && p.is_pending()
        {
            p.phase = PodPhase::Pending {
                nominated: Some(*node),
                nominated_at_ms: None,
            };
        }
    }
}

/// The decisions of `out` with pod ids shifted down by `by` (the first
/// `by` pods were removed from the snapshot).
fn out_shifted(out: &CycleOutput, by: u32) -> CycleOutput {
    let mut o = out.clone();
    for d in &mut o.decisions {
        match d {
            Decision::Nominate { pod, .. }
            | Decision::Bind { pod, .. }
            | Decision::Evict { pod, .. } => *pod -= by,
            Decision::Group { .. } => {}
        }
    }
    o
}

/// A low pod bound at t=0 and a high pod of its queue that arrives later.
fn low_then_high() -> Snapshot {
    let mut snap = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![pod("low").gpus(2).priority(1).build()],
    );
    let out = with_min_runtime(0).cycle(&snap, 0, 7);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("high").gpus(2).priority(10).arrival(1000).build(),
    ));
    snap
}

/// Issue #22, item 6: a pod is not a victim before its minimum runtime
/// (from its bind); the pending pod says why; at the minimum it is.
/// #39 item 6: its message (event, condition), not only explain, names
/// the wait and when it ends.
#[test]
fn a_victim_is_protected_for_its_minimum_runtime() {
    let snap = low_then_high();
    let mut s = with_min_runtime(60_000);
    for (t, left) in [(1000, "59s"), (30_000, "30s"), (59_999, "1ms")] {
        let out = run(&mut s, &snap, t);
        assert!(evictions(&snap, &out).is_empty(), "t={t}");
        let e = out.explanations.iter().find(|e| e.pod == 1).unwrap();
        let why: Vec<String> = e.evictions.iter().map(|a| a.to_string()).collect();
        let want = format!(
            "preemption: 0/1 nodes are available: 1 node(s) had only victims that started less than their minimum runtime ago (the first reaches it in {left})."
        );
        assert!(why.contains(&want), "t={t}: {why:?}");
        let message = e.message();
        assert!(message.ends_with(&want), "t={t}: {message}");
    }
    let out = run(&mut s, &snap, 60_000);
    assert_eq!(evictions(&snap, &out), ["low"]);
}

/// A PodDisruptionBudget is broken only as a last resort: when another
/// node's victims are merely younger than their minimum runtime, the
/// preemptor waits for them instead of evicting the protected pod; once
/// they are old enough they go, and the protected pod stays.
#[test]
fn a_budget_is_not_broken_while_younger_victims_will_do() {
    let mut snap = snapshot(
        vec![node("a").gpus(2).build(), node("b").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("guarded")
                .gpus(2)
                .priority(1)
                .budget_exhausted()
                .build(),
            pod("fresh").gpus(2).priority(1).arrival(1).build(),
        ],
    );
    // guarded runs from t=0 on a, fresh from t=50 s on b
    let out = with_min_runtime(0).cycle(&snap, 0, 7);
    apply(&mut snap, &out, 0);
    let fresh = snap
        .pods
        .iter()
        .position(|p| p.pod.name == "fresh")
        .unwrap();
    if let PodPhase::Running { since_ms, .. } = &mut snap.pods[fresh].phase {
        *since_ms = 50_000;
    }
    snap.pods.push(PodState::pending(
        pod("high").gpus(2).priority(10).arrival(60_000).build(),
    ));
    let mut s = with_min_runtime(30_000);
    // at 60 s fresh has run 10 s: evicting guarded would fit now but break
    // its budget; the preemptor waits and says so
    let out = run(&mut s, &snap, 60_000);
    assert!(
        evictions(&snap, &out).is_empty(),
        "{:?}",
        evictions(&snap, &out)
    );
    let why: Vec<String> = out
        .explanations
        .iter()
        .find(|e| snap.pods[e.pod as usize].pod.name == "high")
        .map(|e| e.evictions.iter().map(|a| a.to_string()).collect())
        .unwrap_or_default();
    assert!(
        why.iter()
            .any(|w| w.contains("would break a PodDisruptionBudget")),
        "{why:?}"
    );
    // at 80 s fresh has run its 30 s: it goes, guarded stays
    let out = run(&mut s, &snap, 80_000);
    assert_eq!(evictions(&snap, &out), ["fresh"]);
    // with no younger candidate at all the budget is broken as before
    // (kube-scheduler's last resort): fresh is not preemptible here
    let mut only = snap.clone();
    std::sync::Arc::make_mut(&mut only.pods[fresh].pod).preemptible = false;
    let out = run(&mut s, &only, 60_000);
    assert_eq!(evictions(&only, &out), ["guarded"]);
}

/// A queue's own minimum runtime overrides the scheduler's, and a child
/// queue without one inherits its parent's.
#[test]
fn a_queue_sets_the_minimum_runtime_of_its_pods() {
    let mut snap = low_then_high();
    let mut s = with_min_runtime(60_000);
    // the queue allows eviction after 5 s
    snap.queues[0].min_runtime_ms = Some(5_000);
    assert!(evictions(&snap, &run(&mut s, &snap, 4_999)).is_empty());
    assert_eq!(evictions(&snap, &run(&mut s, &snap, 5_000)), ["low"]);
    // the queue hangs under a parent that protects for 10 minutes
    let mut parent = queue("org");
    parent.min_runtime_ms = Some(600_000);
    snap.queues[0].min_runtime_ms = None;
    snap.queues[0].parent = Some("org".into());
    snap.queues.push(parent);
    assert!(evictions(&snap, &run(&mut s, &snap, 599_999)).is_empty());
    assert_eq!(evictions(&snap, &run(&mut s, &snap, 600_000)), ["low"]);
    // reclaim obeys it too: a guaranteed queue cannot take the pod back
    // before the minimum runtime of the pod's queue
    let mut prod = queue("prod");
    prod.guarantee.gpu_milli = 2000;
    snap.queues.push(prod);
    std::sync::Arc::make_mut(&mut snap.pods[1].pod).queue = "prod".into();
    std::sync::Arc::make_mut(&mut snap.pods[1].pod).priority = 0;
    let out = run(&mut s, &snap, 599_999);
    assert!(evictions(&snap, &out).is_empty());
    let out = run(&mut s, &snap, 600_000);
    assert_eq!(evictions(&snap, &out), ["low"]);
    assert!(matches!(
        out.decisions
            .iter()
            .find(|d| matches!(d, Decision::Evict { .. })),
        Some(Decision::Evict {
            reason: EvictionReason::Reclaimed { .. },
            ..
        })
    ));
}

/// A gang is evicted whole, so it counts from its youngest running member:
/// an old member on the node the preemptor wants does not make the gang a
/// victim while a member restarted recently.
#[test]
fn a_gang_counts_its_runtime_from_its_youngest_member() {
    let mut snap = snapshot(
        vec![node("a").gpus(4).build(), node("b").gpus(4).build()],
        vec![queue("default")],
        vec![gang("g", "default", 2)],
        vec![
            pod("g-0").gpus(4).group("g").build(),
            pod("g-1").gpus(4).group("g").build(),
            pod("hi").gpus(4).priority(10).build(),
        ],
    );
    for (i, since) in [(0, 0u64), (1, 50_000)] {
        snap.pods[i].phase = PodPhase::Running {
            node: i as NodeId,
            gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
            since_ms: since,
        };
    }
    let mut s = with_min_runtime(60_000);
    assert!(evictions(&snap, &run(&mut s, &snap, 70_000)).is_empty());
    let mut ev = evictions(&snap, &run(&mut s, &snap, 110_000));
    ev.sort();
    assert_eq!(ev, ["g-0", "g-1"]);
}

/// Issue #22, item 6: what a queue's terminating pods hold is already on
/// its way out, so it does not count toward what may still be reclaimed
/// from the queue. `train` (guaranteed 4 of 12 GPUs) borrowed all 12;
/// `prod` (guaranteed all 12) reclaimed 4 for p1, still terminating. p2
/// and p3 arrive: only 4 more may go, or train would end below its
/// guarantee once the first 4 are gone.
#[test]
fn terminating_pods_are_not_reclaimed_twice() {
    let mut train = queue("train");
    train.guarantee.gpu_milli = 4000;
    let mut prod = queue("prod");
    prod.guarantee.gpu_milli = 12_000;
    let mut snap = snapshot(
        (0..3)
            .map(|i| node(&format!("n{i}")).gpus(4).build())
            .collect(),
        vec![train, prod],
        vec![],
        (0..12)
            .map(|i| pod(&format!("t{i}")).queue("train").gpus(1).build())
            .collect(),
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("p1").queue("prod").gpus(4).arrival(1000).build(),
    ));
    let out = run(&mut s, &snap, 1000);
    assert_eq!(evictions(&snap, &out).len(), 4);
    terminate_evicted(&mut snap, &out);
    apply_nominations(&mut snap, &out);
    for name in ["p2", "p3"] {
        snap.pods.push(PodState::pending(
            pod(name).queue("prod").gpus(4).arrival(2000).build(),
        ));
    }
    let out = run(&mut s, &snap, 2000);
    assert_eq!(
        evictions(&snap, &out).len(),
        4,
        "train keeps its guarantee: {:?}",
        evictions(&snap, &out)
    );
    let running_after = snap
        .pods
        .iter()
        .filter(|p| p.pod.queue == "train" && matches!(p.phase, PodPhase::Running { .. }))
        .count()
        - 4;
    assert_eq!(running_after, 4);
}

/// A victim takes its whole gang, so the gang's GPUs, not the member's,
/// must come out of its queue's surplus: `train` (guaranteed 4 of 8 GPUs)
/// runs one 2×4-GPU gang; `prod` reclaiming 4 would take all 8 and leave
/// train below its guarantee (which it would then reclaim back).
#[test]
fn a_gang_is_reclaimed_only_if_its_queue_can_spare_all_of_it() {
    let mut train = queue("train");
    train.guarantee.gpu_milli = 4000;
    let mut prod = queue("prod");
    prod.guarantee.gpu_milli = 4000;
    let mut snap = snapshot(
        vec![node("a").gpus(4).build(), node("b").gpus(4).build()],
        vec![train, prod],
        vec![gang("g", "train", 2)],
        vec![
            pod("g-0").queue("train").gpus(4).group("g").build(),
            pod("g-1").queue("train").gpus(4).group("g").build(),
        ],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("p").queue("prod").gpus(4).arrival(1000).build(),
    ));
    let out = run(&mut s, &snap, 2000);
    assert!(
        evictions(&snap, &out).is_empty(),
        "{:?}",
        evictions(&snap, &out)
    );
    // a lone 4-GPU pod of train in the gang's place may go
    let mut snap2 = snap.clone();
    std::sync::Arc::make_mut(&mut snap2.pods[0].pod).group = None;
    std::sync::Arc::make_mut(&mut snap2.pods[1].pod).group = None;
    snap2.groups.clear();
    let out = run(&mut s, &snap2, 2000);
    assert_eq!(evictions(&snap2, &out).len(), 1);
}

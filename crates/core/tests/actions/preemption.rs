//! Preemption and reclaim: minimal victims, whole gangs, terminating victims, budgets.

use super::*;

#[test]
fn preemption_evicts_minimal_lower_priority_victims() {
    let nodes = vec![node("a").gpus(4).build(), node("b").gpus(4).build()];
    let mut snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![],
        vec![
            pod("low-1").gpus(2).priority(1).build(),
            pod("low-2").gpus(2).priority(1).build(),
            pod("low-3").gpus(4).priority(0).build(),
            pod("vip").gpus(2).priority(10).not_preemptible().build(),
        ],
    );
    // place the three low pods first
    snap.pods[3].phase = PodPhase::Pending {
        nominated: None,
        nominated_at_ms: None,
    };
    let vip = snap.pods.remove(3);
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    assert_eq!(binds(&snap, &out).len(), 3);
    apply(&mut snap, &out, 0);
    snap.pods.push(vip);
    let out = run(&mut s, &snap, 1000);
    let ev = evictions(&snap, &out);
    assert_eq!(ev.len(), 1, "one 2-GPU victim is enough: {ev:?}");
    assert!(ev[0].starts_with("low-"), "{ev:?}");
    assert!(
        out.decisions
            .iter()
            .any(|d| matches!(d, Decision::Nominate { pod: 3, .. }))
    );
    // the next cycle binds the preemptor where the victim was
    apply(&mut snap, &out, 1000);
    let out = run(&mut s, &snap, 2000);
    assert_eq!(binds(&snap, &out).keys().collect::<Vec<_>>(), vec!["vip"]);
}

#[test]
fn preemption_never_for_equal_priority_or_useless() {
    let nodes = vec![node("a").gpus(2).build()];
    let mut snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![],
        vec![pod("x").gpus(2).priority(5).build()],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("same").gpus(1).priority(5).build()));
    snap.pods
        .push(PodState::pending(pod("huge").gpus(4).priority(9).build()));
    let out = run(&mut s, &snap, 1);
    assert!(
        evictions(&snap, &out).is_empty(),
        "equal priority is not preempted; a 4-GPU pod never fits a 2-GPU node"
    );
    assert!(
        out.explanations
            .iter()
            .any(|e| e.verdict == Verdict::Unresolvable)
    );
}

#[test]
fn preemption_takes_whole_gangs() {
    let nodes = vec![node("a").gpus(4).build(), node("b").gpus(4).build()];
    let pods: Vec<Pod> = (0..2)
        .map(|i| {
            pod(&format!("g-{i}"))
                .gpus(4)
                .group("g")
                .priority(0)
                .build()
        })
        .collect();
    let mut snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![gang("g", "default", 2)],
        pods,
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("hi").gpus(2).priority(10).build()));
    let out = run(&mut s, &snap, 1);
    let mut ev = evictions(&snap, &out);
    ev.sort();
    assert_eq!(ev, vec!["g-0", "g-1"], "a gang is evicted whole");
}

#[test]
fn reclaim_restores_guarantee_but_not_below_victims_share() {
    let nodes: Vec<Node> = (0..4)
        .map(|i| node(&format!("n{i}")).gpus(2).build())
        .collect();
    let mut borrower = queue("borrower");
    borrower.guarantee.gpu_milli = 2000;
    let mut owner = queue("owner");
    owner.guarantee.gpu_milli = 4000;
    let pods: Vec<Pod> = (0..8)
        .map(|i| {
            pod(&format!("b{i}"))
                .gpus(1)
                .queue("borrower")
                .priority(100)
                .build()
        })
        .collect();
    let mut snap = snapshot(nodes, vec![borrower, owner], vec![], pods);
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    assert_eq!(
        binds(&snap, &out).len(),
        8,
        "borrows the idle guarantee of owner"
    );
    apply(&mut snap, &out, 0);
    for i in 0..8 {
        snap.pods.push(PodState::pending(
            pod(&format!("o{i}")).gpus(1).queue("owner").build(),
        ));
    }
    let out = run(&mut s, &snap, 10);
    let ev = evictions(&snap, &out);
    // owner deserves 4 (its guarantee, then split of the rest 1:1 — 6000 vs 2000 guaranteed/…)
    assert!(
        !ev.is_empty(),
        "reclaim happens even against higher priority in another queue"
    );
    assert!(
        ev.len() <= 6,
        "borrower keeps at least its guarantee of 2 GPUs: {ev:?}"
    );
    assert!(ev.iter().all(|e| e.starts_with('b')));
}

/// Regression (found on a real apiserver): evicted pods stay Terminating for
/// their grace period, still holding their GPUs. The preemptor must wait for
/// them rather than evict a second node's worth every cycle meanwhile.
#[test]
fn preemption_waits_for_terminating_victims_instead_of_evicting_more() {
    let nodes = vec![node("a").gpus(4).build(), node("b").gpus(4).build()];
    let mut snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![],
        (0..8)
            .map(|i| pod(&format!("low-{i}")).gpus(1).priority(1).build())
            .collect(),
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    assert_eq!(binds(&snap, &out).len(), 8);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("vip").gpus(4).priority(10).build()));
    let out = run(&mut s, &snap, 1000);
    let ev = evictions(&snap, &out);
    assert_eq!(ev.len(), 4, "one node's worth: {ev:?}");
    // the victims are now terminating (still holding), not gone
    for d in &out.decisions {
        if let Decision::Evict { pod, .. } = d {
            let (node, gpus) = match &snap.pods[*pod as usize].phase {
                PodPhase::Running { node, gpus, .. } => (*node, gpus.clone()),
                other => panic!("{other:?}"),
            };
            snap.pods[*pod as usize].phase = PodPhase::Terminating { node, gpus };
        }
    }
    // a second high-priority pod arrives while the victims terminate: it
    // must neither take their GPUs (still held) nor over-evict
    snap.pods
        .push(PodState::pending(pod("vip2").gpus(2).priority(10).build()));
    for cycle in 2..5 {
        let out = run(&mut s, &snap, cycle * 1000);
        let bad = check_invariants(&snap, &out);
        assert!(bad.is_empty(), "cycle {cycle}: {bad:?}");
        assert!(
            !binds(&snap, &out).contains_key("vip2"),
            "cycle {cycle}: nothing is free for vip2 until the victims leave"
        );
        assert!(
            evictions(&snap, &out).len() <= 2,
            "cycle {cycle}: at most vip2's own victims"
        );
        if cycle == 2 {
            // vip2's victims (if any) terminate too
            for d in &out.decisions {
                if let Decision::Evict { pod, .. } = d
                    && let PodPhase::Running { node, gpus, .. } =
                        snap.pods[*pod as usize].phase.clone()
                {
                    snap.pods[*pod as usize].phase = PodPhase::Terminating { node, gpus };
                }
            }
            continue;
        }
        assert!(
            evictions(&snap, &out).is_empty(),
            "cycle {cycle}: no further victims while the first ones terminate"
        );
        assert!(
            out.decisions
                .iter()
                .any(|d| matches!(d, Decision::Nominate { pod: 8, .. })),
            "the preemptor stays nominated"
        );
        assert!(binds(&snap, &out).is_empty());
    }
}

/// Kubernetes' `preemptionPolicy: Never`: a high-priority pod waits instead
/// of evicting.
#[test]
fn a_pod_that_never_evicts_waits() {
    let mut snap = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![pod("low").gpus(2).priority(1).build()],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("polite").gpus(2).priority(10).never_evicts().build(),
    ));
    let out = run(&mut s, &snap, 1000);
    assert!(evictions(&snap, &out).is_empty());
    std::sync::Arc::make_mut(&mut snap.pods[1].pod).may_evict = true;
    let out = run(&mut s, &snap, 2000);
    assert_eq!(
        evictions(&snap, &out).len(),
        1,
        "the same pod allowed to preempt does"
    );
}

/// PodDisruptionBudgets the way kube-scheduler's preemption treats them:
/// victims whose budget is exhausted are avoided when others free enough,
/// and taken when nothing else does.
#[test]
fn preemption_prefers_victims_whose_budget_allows_it() {
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
            pod("free").gpus(2).priority(5).build(),
        ],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("vip").gpus(2).priority(10).build()));
    let out = run(&mut s, &snap, 1000);
    assert_eq!(
        evictions(&snap, &out),
        vec!["free".to_string()],
        "the unguarded victim goes although its priority is higher"
    );
    // with both guarded, preemption still happens (budgets are best effort)
    let mut snap2 = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("guarded")
                .gpus(2)
                .priority(1)
                .budget_exhausted()
                .build(),
        ],
    );
    let out = run(&mut s, &snap2, 0);
    apply(&mut snap2, &out, 0);
    snap2
        .pods
        .push(PodState::pending(pod("vip").gpus(2).priority(10).build()));
    let out = run(&mut s, &snap2, 1000);
    assert_eq!(evictions(&snap2, &out), vec!["guarded".to_string()]);
}

//! Behaviour of the action pipeline on small hand-made clusters.

use gpusched_core::*;
use gpusched_model::*;
use gpusched_testkit::*;

/// The default options, except that a pod may be a victim as soon as it
/// runs (these tests bind and evict a few milliseconds apart; the minimum
/// runtime has its own tests in `evictions.rs`).
fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerOptions {
            min_runtime_ms: 0,
            ..Default::default()
        },
        gpusched_testkit_filters(),
        Box::new(TestBestFit),
    )
}

/// The filters the core tests need (the real ones live in plugins, which
/// depends on core; these are equivalent minimal checks).
fn gpusched_testkit_filters() -> Vec<Box<dyn Filter>> {
    struct Basic;
    impl Filter for Basic {
        fn name(&self) -> &'static str {
            "basic"
        }
        fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
            key.add(&pod.tolerations);
            key.add(&pod.gpu_models);
        }
        fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
            if node.unschedulable {
                return FilterResult::Reject("node(s) were unschedulable".into());
            }
            if !pod.tolerates_all(node) {
                return FilterResult::Reject("node(s) had untolerated taint(s)".into());
            }
            if !pod.gpu.is_none() && !node.gpus.iter().any(|g| pod.allows_model(&g.model)) {
                return FilterResult::Reject("node(s) didn't have the requested GPU model".into());
            }
            FilterResult::Pass
        }
    }
    vec![Box::new(Basic)]
}

fn run(s: &mut Scheduler, snap: &Snapshot, now: u64) -> CycleOutput {
    let out = s.cycle(snap, now, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    out
}

#[test]
fn binds_with_topology_and_no_overcommit() {
    let snap = snapshot(
        vec![
            node("a").gpus(4).pcie(2).build(),
            node("b").gpus(8).nvswitch().build(),
        ],
        vec![queue("default")],
        vec![],
        vec![
            pod("p1").gpus(2).build(),
            pod("p2").gpus(2).build(),
            pod("p3").gpus(8).build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 3, "{b:?}");
    assert_eq!(b["p3"].0, "b");
    // the two 2-GPU pods fill node a, one PCIe switch each
    let mut sets: Vec<_> = ["p1", "p2"].iter().map(|p| b[*p].1.clone()).collect();
    sets.sort_by_key(|g| format!("{g:?}"));
    assert_eq!(
        sets,
        vec![
            GpuAssignment::Whole(vec![0, 1]),
            GpuAssignment::Whole(vec![2, 3])
        ]
    );
}

#[test]
fn gang_is_all_or_nothing() {
    let nodes = vec![node("a").gpus(8).build(), node("b").gpus(8).build()];
    let pods: Vec<Pod> = (0..3)
        .map(|i| pod(&format!("w{i}")).gpus(8).group("g").build())
        .collect();
    let snap = snapshot(
        nodes.clone(),
        vec![queue("default")],
        vec![gang("g", "default", 3)],
        pods.clone(),
    );
    let out = run(&mut sched(), &snap, 0);
    assert!(binds(&snap, &out).is_empty());
    let msg = explanation(&snap, &out, "w0").unwrap();
    assert!(msg.contains("only 2 of the 3 required pods fit"), "{msg}");
    // with minMember 2 the gang starts with two and the third waits
    let snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![gang("g", "default", 2)],
        pods,
    );
    let out = run(&mut sched(), &snap, 0);
    assert_eq!(binds(&snap, &out).len(), 2);
    assert!(out.decisions.iter().any(|d| matches!(
        d,
        Decision::Group {
            phase: GroupPhase::Running,
            ..
        }
    )));
}

#[test]
fn gang_waits_for_members() {
    let snap = snapshot(
        vec![node("a").gpus(8).build()],
        vec![queue("default")],
        vec![gang("g", "default", 4)],
        vec![pod("w0").gpus(1).group("g").build()],
    );
    let out = run(&mut sched(), &snap, 0);
    assert!(binds(&snap, &out).is_empty());
    assert!(
        explanation(&snap, &out, "w0")
            .unwrap()
            .contains("1 of minMember 4")
    );
}

#[test]
fn gang_topology_required_rack() {
    let nodes = vec![
        node("r1a").gpus(8).rack("r1").build(),
        node("r1b").gpus(4).rack("r1").build(),
        node("r2a").gpus(8).rack("r2").build(),
        node("r2b").gpus(8).rack("r2").build(),
    ];
    let mut g = gang("g", "default", 2);
    g.topology = Some(TopologyConstraint {
        level: TopologyLevel::Rack,
        required: true,
    });
    let pods: Vec<Pod> = (0..2)
        .map(|i| pod(&format!("w{i}")).gpus(8).group("g").build())
        .collect();
    let snap = snapshot(nodes, vec![queue("default")], vec![g], pods);
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 2);
    assert!(b.values().all(|(n, _)| n.starts_with("r2")), "{b:?}");
}

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
    snap.pods[3].phase = PodPhase::Pending { nominated: None };
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

#[test]
fn quota_limit_and_no_borrow() {
    let nodes = vec![node("a").gpus(8).build()];
    let mut capped = queue("capped");
    capped.limit = Some(ResourceLimit::gpus(2000));
    let mut strict = queue("strict");
    strict.guarantee.gpu_milli = 1000;
    strict.can_borrow = false;
    let snap = snapshot(
        nodes,
        vec![capped, strict],
        vec![],
        vec![
            pod("c1").gpus(2).queue("capped").build(),
            pod("c2").gpus(1).queue("capped").build(),
            pod("s1").gpus(1).queue("strict").build(),
            pod("s2").gpus(1).queue("strict").build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert!(
        b.contains_key("c1")
            && b.contains_key("s1")
            && !b.contains_key("c2")
            && !b.contains_key("s2"),
        "{b:?}"
    );
    assert!(explanation(&snap, &out, "c2").unwrap().contains("limit"));
    assert!(
        explanation(&snap, &out, "s2")
            .unwrap()
            .contains("may not borrow")
    );
}

#[test]
fn fair_share_orders_queues_by_weight() {
    let nodes = vec![node("a").gpus(8).build()];
    let mut heavy = queue("heavy");
    heavy.weight = 3;
    let light = queue("light");
    let mut pods = Vec::new();
    for i in 0..8 {
        pods.push(
            pod(&format!("h{i}"))
                .gpus(1)
                .queue("heavy")
                .arrival(i)
                .build(),
        );
        pods.push(
            pod(&format!("l{i}"))
                .gpus(1)
                .queue("light")
                .arrival(i)
                .build(),
        );
    }
    let snap = snapshot(nodes, vec![heavy, light], vec![], pods);
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    let h = b.keys().filter(|k| k.starts_with('h')).count();
    let l = b.keys().filter(|k| k.starts_with('l')).count();
    assert_eq!((h, l), (6, 2), "8 GPUs split 3:1");
}

#[test]
fn backfill_then_reservation_for_a_waiting_gang() {
    let nodes: Vec<Node> = (0..2)
        .map(|i| node(&format!("n{i}")).gpus(8).build())
        .collect();
    let mut snap = snapshot(
        nodes,
        vec![queue("default")],
        vec![gang("big", "default", 2)],
        vec![pod("blocker").gpus(4).build()],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    for i in 0..2 {
        snap.pods.push(PodState::pending(
            pod(&format!("big-{i}"))
                .gpus(8)
                .group("big")
                .arrival(10)
                .build(),
        ));
    }
    snap.pods
        .push(PodState::pending(pod("small").gpus(2).arrival(20).build()));
    // before the threshold: the gang waits, the small job backfills
    let out = run(&mut s, &snap, 1000);
    assert_eq!(binds(&snap, &out).keys().collect::<Vec<_>>(), vec!["small"]);
    assert_eq!(out.stats.backfilled, 1);
    // after the threshold: nodes are reserved for the gang; a new small job waits
    snap.pods.push(PodState::pending(
        pod("small-2").gpus(1).arrival(30).build(),
    ));
    let out = run(&mut s, &snap, 10 + 400_000);
    let b = binds(&snap, &out);
    assert!(!b.contains_key("small-2"), "{b:?}");
    assert!(
        out.decisions
            .iter()
            .any(|d| matches!(d, Decision::Nominate { .. }))
    );
    let msg = explanation(&snap, &out, "small-2").unwrap();
    assert!(msg.contains("reserved"), "{msg}");
}

#[test]
fn explanations_in_kube_scheduler_style() {
    let snap = snapshot(
        vec![
            node("a").gpus(2).model("A100").build(),
            node("b")
                .gpus(8)
                .taint("dedicated", "x", TaintEffect::NoSchedule)
                .build(),
            node("c").gpus(2).unschedulable().build(),
        ],
        vec![queue("default")],
        vec![],
        vec![
            pod("p").gpus(4).build(),
            pod("m").gpus(1).models(&["B200"]).build(),
            pod("q").gpus(1).queue("nope").build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let msg = explanation(&snap, &out, "p").unwrap();
    assert_eq!(
        msg,
        "0/3 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint(s), 1 node(s) were unschedulable."
    );
    let e = out.explanations.iter().find(|e| e.pod == 0).unwrap();
    assert_eq!(e.verdict, Verdict::Unresolvable);
    assert!(
        explanation(&snap, &out, "m").unwrap().contains("3 node(s)")
            || explanation(&snap, &out, "m").unwrap().contains("GPU model")
    );
    assert!(
        explanation(&snap, &out, "q")
            .unwrap()
            .contains("does not exist")
    );
}

#[test]
fn shares_pack_onto_one_gpu() {
    let snap = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("s1").share(500).build(),
            pod("s2").share(300).build(),
            pod("s3").share(400).build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 3);
    let gpu_of = |n: &str| match b[n].1 {
        GpuAssignment::Share { gpu, .. } => gpu,
        _ => panic!("not a share"),
    };
    assert_eq!(gpu_of("s1"), gpu_of("s2"), "best fit stacks 0.5 + 0.3");
    assert_ne!(gpu_of("s1"), gpu_of("s3"));
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
/// The reason of a pending pod by name (typed).
fn reasons_of(snap: &Snapshot, out: &CycleOutput, name: &str) -> Vec<PendingReason> {
    let id = snap.pods.iter().position(|p| p.pod.name == name).unwrap() as PodId;
    out.explanations
        .iter()
        .find(|e| e.pod == id)
        .map(|e| e.reasons.to_vec())
        .unwrap_or_default()
}

#[test]
fn reasons_are_typed_with_their_facts() {
    let mut capped = queue("capped");
    capped.limit = Some(ResourceLimit::gpus(2000));
    let snap = snapshot(
        vec![
            node("a").gpus(2).build(),
            node("t")
                .gpus(8)
                .taint("x", "y", TaintEffect::NoSchedule)
                .build(),
        ],
        vec![capped],
        vec![],
        vec![
            pod("c1").gpus(2).queue("capped").build(),
            pod("c2").gpus(1).queue("capped").build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let r = reasons_of(&snap, &out, "c2");
    assert_eq!(
        r.last(),
        Some(&PendingReason::Quota(QuotaViolation {
            queue: "capped".into(),
            rule: QuotaRule::Limit,
            dimension: ResourceKind::Gpu,
            would_use: 3000,
            cap: 2000,
            needs: 1000,
        })),
        "{r:?}"
    );
    let PendingReason::Nodes(summary) = &r[0] else {
        panic!("node summary first: {r:?}");
    };
    assert_eq!(summary.total, 2);
    assert!(summary.counts.contains(&(
        NodeReason::Filter {
            plugin: "basic".into(),
            reason: "node(s) had untolerated taint(s)".into()
        },
        1
    )));
    assert!(
        summary
            .counts
            .contains(&(NodeReason::Insufficient(ResourceKind::Gpu), 1))
    );
    let e = out.explanations.iter().find(|e| e.pod == 1).unwrap();
    assert_eq!(
        e.message(),
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) had untolerated taint(s). \
         queue \"capped\" would exceed its limit on nvidia.com/gpu (3 GPU of 2 GPU)"
    );
    assert_eq!(e.to_string(), e.message());
}

/// A job asking more than its queue's limit alone never fits: it is
/// Unresolvable and says so, not "fits once the queue uses less"
/// (issue #22, 11).
#[test]
fn a_job_larger_than_its_queues_limit_is_unresolvable() {
    let mut capped = queue("research");
    capped.limit = Some(ResourceLimit::gpus(6000));
    let snap = snapshot(
        vec![node("a").gpus(8).build(), node("b").gpus(8).build()],
        vec![capped],
        vec![gang("g", "research", 4)],
        (0..4)
            .map(|i| {
                pod(&format!("m{i}"))
                    .gpus(2)
                    .queue("research")
                    .group("g")
                    .build()
            })
            .collect(),
    );
    let out = run(&mut sched(), &snap, 0);
    assert!(binds(&snap, &out).is_empty());
    let e = out.explanations.iter().find(|e| e.pod == 0).unwrap();
    assert_eq!(e.verdict, Verdict::Unresolvable, "{}", e.message());
    let m = e.message();
    assert!(
        m.contains("queue \"research\"'s limit on nvidia.com/gpu is 6 GPU and the job alone asks 8 GPU: it never fits"),
        "{m}"
    );
    // the same limit with room to free later stays Unschedulable
    let mut capped = queue("research");
    capped.limit = Some(ResourceLimit::gpus(6000));
    let mut pods = vec![pod("running").gpus(4).queue("research").build()];
    pods.push(pod("later").gpus(4).queue("research").build());
    let mut snap = snapshot(vec![node("a").gpus(8).build()], vec![capped], vec![], pods);
    snap.pods[0].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
        since_ms: 0,
    };
    let out = run(&mut sched(), &snap, 0);
    let e = out.explanations.iter().find(|e| e.pod == 1).unwrap();
    assert_eq!(e.verdict, Verdict::Unschedulable, "{}", e.message());
}

#[test]
fn queue_tree_problems_are_warnings() {
    let mut orphan = queue("orphan");
    orphan.parent = Some("nope".into());
    let snap = snapshot(
        vec![node("a").gpus(1).build()],
        vec![orphan, queue("dup"), queue("dup")],
        vec![],
        vec![pod("p").gpus(1).queue("orphan").build()],
    );
    let out = run(&mut sched(), &snap, 0);
    assert_eq!(binds(&snap, &out).len(), 1, "the cycle goes on");
    assert_eq!(
        out.warnings,
        vec![
            QueueProblem::Duplicate {
                queue: "dup".into()
            },
            QueueProblem::MissingParent {
                queue: "orphan".into(),
                parent: "nope".into()
            },
        ]
    );
    assert_eq!(out.warnings[1].queue(), "orphan");
    assert_eq!(
        out.warnings[1].to_string(),
        "queue \"orphan\": parent \"nope\" does not exist"
    );
}

#[test]
fn eviction_reasons_are_typed() {
    let mut snap = snapshot(
        vec![node("a").gpus(1).build()],
        vec![queue("default")],
        vec![],
        vec![pod("low").gpus(1).priority(1).build()],
    );
    let mut s = sched();
    let out = run(&mut s, &snap, 0);
    apply(&mut snap, &out, 0);
    snap.pods
        .push(PodState::pending(pod("high").gpus(1).priority(9).build()));
    let out = run(&mut s, &snap, 1000);
    let ev: Vec<&EvictionReason> = out
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Evict { reason, .. } => Some(reason),
            _ => None,
        })
        .collect();
    assert_eq!(
        ev,
        vec![&EvictionReason::Preempted {
            by: "high".into(),
            priority: 9
        }]
    );
    assert_eq!(ev[0].kind(), EvictionKind::Preempt);
    assert_eq!(
        ev[0].to_string(),
        "preempted by higher-priority \"high\" (priority 9)"
    );
}

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
    snap.pods[1].pod.may_evict = true;
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

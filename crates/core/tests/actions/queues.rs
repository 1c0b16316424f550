//! Queues: quota limits, fair share, unresolvable jobs, queue-tree problems.

use super::*;

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

//! Explanations and typed reasons (pending and eviction).

use super::*;

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

//! Gangs: all or nothing, waiting for members, topology, backfill and reservation.

use super::*;

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
    // two nodes of 8 GPUs never hold three 8-GPU members at once: the
    // gang never fits (#39), not "2 of 3 fit now"
    assert!(
        msg.contains("can hold at most 2 such pods even when empty"),
        "{msg}"
    );
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

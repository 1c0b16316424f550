//! The consolidate action: moving pods that opted in so that a pending pod
//! which fits the free capacity in total, but no node, fits.

use gpusched_core::*;
use gpusched_model::*;
use gpusched_testkit::*;

fn sched() -> Scheduler {
    Scheduler::new(SchedulerOptions::default(), vec![], Box::new(TestBestFit))
}

fn run(s: &mut Scheduler, snap: &Snapshot) -> CycleOutput {
    let out = s.cycle(snap, 0, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    out
}

fn movable(mut p: Pod) -> Pod {
    p.movable = true;
    p
}

fn on(p: Pod, node: NodeId, gpus: GpuAssignment) -> PodState {
    PodState {
        pod: p.into(),
        phase: PodPhase::Running {
            node,
            gpus,
            since_ms: 0,
        },
    }
}

fn whole(g: &[u32]) -> GpuAssignment {
    GpuAssignment::Whole(g.to_vec())
}

fn share(gpu: u32, milli: u32) -> GpuAssignment {
    GpuAssignment::Share {
        gpu,
        milli,
        memory_mib: 0,
    }
}

fn id(snap: &Snapshot, name: &str) -> PodId {
    snap.pods.iter().position(|p| p.pod.name == name).unwrap() as PodId
}

/// Two 4-GPU nodes, one free GPU on each: `m` (1 GPU) on a, pending `p`
/// asks for 2 GPUs.
fn fragmented(m: Pod, p: Pod) -> Snapshot {
    Snapshot {
        nodes: vec![node("a").gpus(4).build(), node("b").gpus(4).build()],
        queues: vec![queue("default")],
        groups: vec![],
        pods: vec![
            on(m, 0, whole(&[0])),
            on(pod("x").gpus(2).build(), 0, whole(&[1, 2])),
            on(pod("y").gpus(3).build(), 1, whole(&[0, 1, 2])),
            PodState::pending(p),
        ],
    }
}

fn moved(out: &CycleOutput) -> Vec<(PodId, EvictionReason)> {
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Evict { pod, reason } => Some((*pod, reason.clone())),
            _ => None,
        })
        .collect()
}

fn nominations(out: &CycleOutput) -> Vec<(PodId, NodeId)> {
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Nominate { pod, node } => Some((*pod, *node)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_pod_that_fits_only_after_a_move_gets_it_and_binds_next_cycle() {
    let mut snap = fragmented(movable(pod("m").gpus(1).build()), pod("p").gpus(2).build());
    let mut s = sched();
    let out = run(&mut s, &snap);
    let (m, p) = (id(&snap, "m"), id(&snap, "p"));
    assert_eq!(
        moved(&out),
        vec![(
            m,
            EvictionReason::Moved {
                for_pod: "p".into(),
                to_node: "b".into()
            }
        )]
    );
    assert_eq!(moved(&out)[0].1.kind(), EvictionKind::Consolidate);
    assert_eq!(
        moved(&out)[0].1.to_string(),
        "moved to make room for p (planned to restart on b)"
    );
    // the pending pod is nominated where room was made, the moved pod to
    // its planned node
    let mut noms = nominations(&out);
    noms.sort();
    assert_eq!(noms, vec![(m, 1), (p, 0)]);
    assert_eq!(out.stats.evicted, 1);
    let msg = explanation(&snap, &out, "p").unwrap();
    assert!(msg.contains("1 pod(s) moved to make room"), "{msg}");

    // the runner applies it: both land where planned
    apply(&mut snap, &out, 1);
    let out2 = run(&mut s, &snap);
    let b = binds(&snap, &out2);
    assert_eq!(b["p"].0, "a", "{b:?}");
    assert_eq!(b["m"].0, "b", "{b:?}");
    assert!(moved(&out2).is_empty(), "nothing more moves");
}

#[test]
fn a_movable_queue_opts_in_all_its_pods() {
    let mut snap = fragmented(pod("m").gpus(1).build(), pod("p").gpus(2).build());
    let out = run(&mut sched(), &snap);
    assert!(moved(&out).is_empty(), "not opted in: nothing moves");
    snap.queues[0].movable = true;
    let out = run(&mut sched(), &snap);
    assert_eq!(moved(&out).len(), 1);
}

#[test]
fn never_moves_higher_priority_non_movable_budgeted_or_gang_pods() {
    // higher priority than the pending pod
    let snap = fragmented(
        movable(pod("m").gpus(1).priority(5).build()),
        pod("p").gpus(2).build(),
    );
    let out = run(&mut sched(), &snap);
    assert!(moved(&out).is_empty());
    assert!(nominations(&out).is_empty());
    // equal priority may move
    let snap = fragmented(
        movable(pod("m").gpus(1).priority(5).build()),
        pod("p").gpus(2).priority(5).build(),
    );
    assert_eq!(moved(&run(&mut sched(), &snap)).len(), 1);
    // protected by an exhausted disruption budget
    let snap = fragmented(
        movable(pod("m").gpus(1).budget_exhausted().build()),
        pod("p").gpus(2).build(),
    );
    assert!(moved(&run(&mut sched(), &snap)).is_empty());
    // never preempted
    let snap = fragmented(
        movable(pod("m").gpus(1).not_preemptible().build()),
        pod("p").gpus(2).build(),
    );
    assert!(moved(&run(&mut sched(), &snap)).is_empty());
    // the pending pod may not evict (preemptionPolicy: Never)
    let snap = fragmented(
        movable(pod("m").gpus(1).build()),
        pod("p").gpus(2).never_evicts().build(),
    );
    assert!(moved(&run(&mut sched(), &snap)).is_empty());
    // a member of a running gang (moving it would restart the gang)
    let mut snap = fragmented(
        movable(pod("m").gpus(1).group("g").build()),
        pod("p").gpus(2).build(),
    );
    snap.groups.push(gang("g", "default", 1));
    assert!(moved(&run(&mut sched(), &snap)).is_empty());
    // switched off
    let snap = fragmented(movable(pod("m").gpus(1).build()), pod("p").gpus(2).build());
    let mut off = Scheduler::new(
        SchedulerOptions {
            consolidation: false,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    );
    assert!(moved(&run(&mut off, &snap)).is_empty());
}

#[test]
fn nothing_moves_when_the_moved_pod_has_nowhere_to_go() {
    // b is full: m cannot restart anywhere else, so it stays
    let mut snap = fragmented(movable(pod("m").gpus(1).build()), pod("p").gpus(2).build());
    snap.pods.push(on(pod("z").gpus(1).build(), 1, whole(&[3])));
    // free capacity elsewhere only as halves of GPUs: 2 GPUs free in
    // total, but no whole GPU for m
    snap.nodes.push(node("c").gpus(2).build());
    snap.pods
        .push(on(pod("s0").share(500).build(), 2, share(0, 500)));
    snap.pods
        .push(on(pod("s1").share(500).build(), 2, share(1, 500)));
    let out = run(&mut sched(), &snap);
    assert!(moved(&out).is_empty(), "{:?}", out.decisions);
    assert!(nominations(&out).is_empty());
}

#[test]
fn the_fewest_moves_win() {
    // no whole GPU is free anywhere; a needs two moves (two small shares),
    // b one (one big share); c can host the moved shares.
    let snap = Snapshot {
        nodes: vec![
            node("a").gpus(2).build(),
            node("b").gpus(2).build(),
            node("c").gpus(2).build(),
        ],
        queues: vec![queue("default")],
        groups: vec![],
        pods: vec![
            on(movable(pod("s1").share(300).build()), 0, share(0, 300)),
            on(movable(pod("s2").share(300).build()), 0, share(0, 300)),
            on(pod("x").gpus(1).build(), 0, whole(&[1])),
            on(movable(pod("s3").share(800).build()), 1, share(0, 800)),
            on(pod("y").gpus(1).build(), 1, whole(&[1])),
            on(pod("z").share(200).build(), 2, share(0, 200)),
            on(pod("w").gpus(1).build(), 2, whole(&[1])),
            PodState::pending(pod("p").gpus(1).build()),
        ],
    };
    let out = run(&mut sched(), &snap);
    let ev = moved(&out);
    assert_eq!(ev.len(), 1, "{ev:?}");
    assert_eq!(ev[0].0, id(&snap, "s3"));
    assert!(nominations(&out).contains(&(id(&snap, "p"), 1)));
}

/// Four 4-GPU nodes with one free GPU each; `m1` on n2 and `m2` on n3 hold
/// one GPU each; n0 and n1 can host a moved pod; the gang asks for two
/// pods of 2 GPUs.
fn gang_case(m2_movable: bool) -> Snapshot {
    let mut m2 = pod("m2").gpus(1).build();
    m2.movable = m2_movable;
    Snapshot {
        nodes: (0..4)
            .map(|i| node(&format!("n{i}")).gpus(4).build())
            .collect(),
        queues: vec![queue("default")],
        groups: vec![gang("g", "default", 2)],
        pods: vec![
            on(pod("x0").gpus(3).build(), 0, whole(&[0, 1, 2])),
            on(pod("x1").gpus(3).build(), 1, whole(&[0, 1, 2])),
            on(movable(pod("m1").gpus(1).build()), 2, whole(&[0])),
            on(pod("x2").gpus(2).build(), 2, whole(&[1, 2])),
            on(m2, 3, whole(&[0])),
            on(pod("x3").gpus(2).build(), 3, whole(&[1, 2])),
            PodState::pending(pod("g-0").gpus(2).group("g").build()),
            PodState::pending(pod("g-1").gpus(2).group("g").build()),
        ],
    }
}

#[test]
fn a_gang_gets_room_for_all_its_members_at_once() {
    let mut snap = gang_case(true);
    let mut s = sched();
    let out = run(&mut s, &snap);
    let ev = moved(&out);
    assert_eq!(ev.len(), 2, "{ev:?}");
    for (_, r) in &ev {
        assert_eq!(r.kind(), EvictionKind::Consolidate);
    }
    let (g0, g1) = (id(&snap, "g-0"), id(&snap, "g-1"));
    let noms = nominations(&out);
    assert!(noms.iter().any(|&(p, _)| p == g0), "{noms:?}");
    assert!(noms.iter().any(|&(p, _)| p == g1), "{noms:?}");
    apply(&mut snap, &out, 1);
    let out2 = run(&mut s, &snap);
    let b = binds(&snap, &out2);
    assert!(b.contains_key("g-0") && b.contains_key("g-1"), "{b:?}");
}

#[test]
fn a_gang_that_cannot_get_room_for_every_member_moves_nothing() {
    // room for g-0 (move m1), none for g-1 (m2 did not opt in): the whole
    // statement rolls back
    let snap = gang_case(false);
    let out = run(&mut sched(), &snap);
    assert!(moved(&out).is_empty(), "{:?}", out.decisions);
    assert!(nominations(&out).is_empty(), "{:?}", out.decisions);
    assert!(binds(&snap, &out).is_empty());
    let msg = explanation(&snap, &out, "g-0").unwrap();
    assert!(msg.contains("0/4 nodes are available"), "{msg}");
}

#[test]
fn moves_per_cycle_are_bounded() {
    // two pending pods, each needs one move; at most one move per cycle
    let mut snap = gang_case(true);
    snap.groups.clear();
    for p in &mut snap.pods {
        std::sync::Arc::make_mut(&mut p.pod).group = None;
    }
    let mut s = Scheduler::new(
        SchedulerOptions {
            max_moves_per_cycle: 1,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    );
    let out = run(&mut s, &snap);
    assert_eq!(moved(&out).len(), 1);
    let out = run(&mut sched(), &snap);
    assert_eq!(moved(&out).len(), 2);
}

/// `fragmented` with b full and a third node c whose two GPUs each hold a
/// half share (`s0` movable, `s1` not): `m` has no free whole GPU to go to
/// unless `s0` first joins `s1` on c's other GPU.
fn chain_case() -> Snapshot {
    let mut snap = fragmented(movable(pod("m").gpus(1).build()), pod("p").gpus(2).build());
    snap.pods.push(on(pod("z").gpus(1).build(), 1, whole(&[3])));
    snap.nodes.push(node("c").gpus(2).build());
    snap.pods
        .push(on(movable(pod("s0").share(500).build()), 2, share(0, 500)));
    snap.pods
        .push(on(pod("s1").share(500).build(), 2, share(1, 500)));
    snap
}

#[test]
fn a_moved_pod_may_make_room_for_itself_by_moving_a_smaller_one() {
    let mut snap = chain_case();
    let mut s = sched();
    let out = run(&mut s, &snap);
    let (m, p, s0) = (id(&snap, "m"), id(&snap, "p"), id(&snap, "s0"));
    // two moves: m to c, and s0 to the other half GPU on c
    let ev = moved(&out);
    assert_eq!(ev.len(), 2, "{:?}", out.decisions);
    assert_eq!(ev[0].0, m);
    assert_eq!(ev[1].0, s0);
    for (_, r) in &ev {
        assert_eq!(
            r,
            &EvictionReason::Moved {
                for_pod: "p".into(),
                to_node: "c".into()
            }
        );
    }
    let noms = nominations(&out);
    assert!(noms.contains(&(p, 0)), "{noms:?}");
    assert!(noms.contains(&(m, 2)), "{noms:?}");
    assert!(noms.contains(&(s0, 2)), "{noms:?}");
    // the runner applies it: everything lands where planned, no GPU shared
    // beyond its capacity (check_invariants in `run`)
    apply(&mut snap, &out, 1);
    let out2 = run(&mut s, &snap);
    let b = binds(&snap, &out2);
    assert_eq!(b["p"].0, "a", "{b:?}");
    assert_eq!(b["m"].0, "c", "{b:?}");
    assert!(moved(&out2).is_empty(), "nothing more moves");
    // s0 was nominated to c too; c is held for m until m binds, so s0
    // binds there one cycle later
    apply(&mut snap, &out2, 2);
    let out3 = run(&mut s, &snap);
    let b = binds(&snap, &out3);
    assert_eq!(b["s0"], ("c".to_string(), share(1, 500)), "{b:?}");
    assert!(moved(&out3).is_empty());
}

#[test]
fn a_chain_counts_both_moves_against_the_limit() {
    // the chain needs two moves; with one allowed per pod nothing moves
    let snap = chain_case();
    let mut one = Scheduler::new(
        SchedulerOptions {
            max_moves_per_job: 1,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    );
    let out = run(&mut one, &snap);
    assert!(moved(&out).is_empty(), "{:?}", out.decisions);
    assert!(nominations(&out).is_empty());
    // a chain only displaces a pod holding fewer GPUs than the moved one:
    // with s0 holding a whole GPU there is no chain (and no plan)
    let mut snap = chain_case();
    let s0 = id(&snap, "s0") as usize;
    snap.pods[s0] = on(movable(pod("s0").gpus(1).build()), 2, whole(&[0]));
    assert!(moved(&run(&mut sched(), &snap)).is_empty());
}

/// Through the incremental core: a cycle that plans a move holds the moved
/// pod's destination only within the cycle; the engine's kept capacity
/// after it is the capacity it started with (the oracle rebuilds it and
/// compares), and the next cycles decide as the full pass.
#[test]
fn a_planned_move_leaves_the_kept_capacity_as_it_was() {
    let snap = fragmented(movable(pod("m").gpus(1).build()), pod("p").gpus(2).build());
    let mut engine = Engine::new(sched());
    engine.verify_with(sched());
    engine.sync(&snap).unwrap();
    let out = engine.cycle(0, 7);
    assert_eq!(moved(&out).len(), 1, "{:?}", out.decisions);
    // the same state again (the runner has not carried the move out yet)
    let again = engine.cycle(10, 7);
    assert!(
        engine.divergences().is_empty(),
        "{:?}",
        engine.divergences()
    );
    assert_eq!(
        again.decisions.len(),
        out.decisions.len(),
        "{:?}",
        again.decisions
    );
}

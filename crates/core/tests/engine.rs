//! The incremental core ([`Engine`]) decides what the full pass decides:
//! random workloads, then random change sequences between cycles (pods
//! arriving, finishing, evicted and terminating, nodes added, relabelled,
//! cordoned, resized and removed, queues and gangs changed), each cycle
//! checked against [`Scheduler::cycle`] over the same state.

use gpusched_core::engine::{Change, PodAt, binds_as_changes, changes_of};
use gpusched_core::*;
use gpusched_testkit::strategies::workload;
use gpusched_testkit::*;
use proptest::prelude::*;

fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerOptions {
            reserve_after_ms: 50,
            min_runtime_ms: 150,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    )
}

/// The default knobs (no reservation for minutes).
fn default_sched() -> Scheduler {
    Scheduler::new(SchedulerOptions::default(), vec![], Box::new(TestBestFit))
}

/// One random change of the runner's snapshot between cycles.
fn mutate(snap: &mut Snapshot, op: u8, k: usize, round: u64, uniq: usize) {
    let np = snap.pods.len();
    let nn = snap.nodes.len();
    match op {
        // a running pod finishes (gone)
        0 if np > 0 => {
            if let Some(i) = (0..np)
                .map(|j| (k + j) % np)
                .find(|&j| snap.pods[j].holding().is_some())
            {
                snap.pods.remove(i);
            }
        }
        // a pending pod is deleted
        1 if np > 0 => {
            if let Some(i) = (0..np)
                .map(|j| (k + j) % np)
                .find(|&j| snap.pods[j].is_pending())
            {
                snap.pods.remove(i);
            }
        }
        // a new pod arrives
        2 => {
            let mut b = pod(&format!("new-{round}-{uniq}"))
                .queue(["a", "b", "c"][k % 3])
                .arrival(round * 100 + k as u64)
                .cpu_milli(500);
            b = match k % 4 {
                0 => b.gpus(1),
                1 => b.gpus(2),
                2 => b.share(500),
                _ => b.gpus(8),
            };
            snap.pods.push(PodState::pending(b.build()));
        }
        // a running pod starts terminating (keeps what it holds)
        3 if np > 0 => {
            let i = k % np;
            if let PodPhase::Running { node, gpus, .. } = snap.pods[i].phase.clone() {
                snap.pods[i].phase = PodPhase::Terminating { node, gpus };
            }
        }
        // a node is relabelled or cordoned
        4 if nn > 0 => {
            let n = &mut snap.nodes[k % nn];
            if k.is_multiple_of(2) {
                n.unschedulable = !n.unschedulable;
            } else {
                n.labels.insert("extra".into(), format!("v{round}"));
            }
        }
        // a node is added
        5 => {
            let name = format!("added-{round}-{uniq}");
            snap.nodes
                .push(node(&name).gpus(4).model("H100").cpu("32").build());
        }
        // an empty node is removed (its pending pods' nominations go)
        6 if nn > 1 => {
            let i = k % nn;
            let used = snap
                .pods
                .iter()
                .any(|p| p.holding().is_some_and(|(n, _)| n as usize == i));
            if !used {
                snap.nodes.remove(i);
                for p in &mut snap.pods {
                    match &mut p.phase {
                        PodPhase::Pending { nominated, .. } => {
                            if *nominated == Some(i as NodeId) {
                                *nominated = None;
                            } else if let Some(x) = nominated
                                && *x as usize > i
                            {
                                *x -= 1;
                            }
                        }
                        PodPhase::Running { node, .. } | PodPhase::Terminating { node, .. } => {
                            if *node as usize > i {
                                *node -= 1;
                            }
                        }
                    }
                }
            }
        }
        // a GPU of a node turns unhealthy (its capacity changes)
        7 if nn > 0 => {
            let n = &mut snap.nodes[k % nn];
            if let Some(g) = n.gpus.last_mut() {
                g.health = gpusched_model::GpuHealth::Unhealthy;
            }
            n.sync_gpu_allocatable();
        }
        // a queue's weight changes
        8 => {
            let nq = snap.queues.len();
            let q = &mut snap.queues[k % nq];
            q.weight = 1 + (round as u32 + k as u32) % 4;
        }
        // a gang's minimum changes
        _ => {
            if !snap.groups.is_empty() {
                let ng = snap.groups.len();
                let g = &mut snap.groups[k % ng];
                g.min_member = 1 + (k as u32) % 3;
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, .. ProptestConfig::default() })]

    /// Random workloads and random changes between cycles: the engine (kept
    /// state, fed the snapshot as changes) decides exactly what a full pass
    /// over the runner's snapshot decides, and its own oracle finds nothing.
    #[test]
    fn the_engine_decides_as_the_full_pass(
        (snap, seed) in workload(),
        ops in prop::collection::vec((0u8..10, 0usize..64), 0..40),
    ) {
        let mut snap = snap;
        let mut engine = Engine::new(sched());
        engine.verify_with(sched());
        let mut full = sched();
        let mut ops = ops.into_iter();
        for round in 0..6u64 {
            let now = round * 100;
            engine.sync(&snap).unwrap();
            let a = engine.cycle(now, seed);
            let b = full.cycle(&snap, now, seed);
            // synced from the runner's snapshot, the engine holds it in its
            // order: the decisions are equal, ids and all; parked jobs are
            // left out of the explanations (the engine's oracle checks the
            // rest against the full pass over the same snapshot)
            prop_assert_eq!(engine.snapshot(), &snap, "round {}", round);
            prop_assert_eq!(
                &a.decisions,
                &b.decisions,
                "round {}: {:?}",
                round,
                engine.divergences()
            );
            prop_assert!(engine.divergences().is_empty(), "{:?}", engine.divergences());
            apply(&mut snap, &b, now);
            for (u, (op, k)) in ops.by_ref().take(7).enumerate() {
                mutate(&mut snap, op, k, round, u);
            }
        }
    }
}

/// The runner's own changes (no snapshot): arrivals one at a time beside a
/// backlog that cannot fit, each bind reported back as a change; the kept
/// capacity is rebuilt only once, and every cycle agrees with the full pass.
#[test]
fn arrivals_fed_as_changes_keep_the_capacity_without_rebuilds() {
    let mut engine = Engine::new(default_sched());
    engine.verify_with(default_sched());
    let mut changes = Vec::new();
    for i in 0..6 {
        changes.push(Change::Node(
            node(&format!("n{i}")).gpus(8).cpu("64").build(),
        ));
    }
    changes.push(Change::Queue(queue("a")));
    engine.apply_all(changes).unwrap();
    // fill every node but one GPU of n0..n2
    for i in 0..6u32 {
        let used = if i < 3 { 7 } else { 8 };
        for g in 0..used {
            let p = pod(&format!("r{i}-{g}")).queue("a").gpus(1).build();
            engine
                .apply(Change::Pod(
                    std::sync::Arc::new(p),
                    PodAt::Running {
                        node: format!("n{i}"),
                        gpus: GpuAssignment::Whole(vec![g]),
                        since_ms: 0,
                    },
                ))
                .unwrap();
        }
    }
    for b in 0..20 {
        let p = pod(&format!("big{b:02}"))
            .queue("a")
            .gpus(8)
            .arrival(b)
            .build();
        engine
            .apply(Change::Pod(std::sync::Arc::new(p), PodAt::pending()))
            .unwrap();
    }
    let out = engine.cycle(100, 1);
    assert!(
        out.decisions
            .iter()
            .all(|d| !matches!(d, Decision::Bind { .. }))
    );
    // the backlog is parked: left out of the next cycles
    assert_eq!(engine.stats().parked, 20, "{:?}", engine.stats());
    // a refused change wakes nothing
    assert!(engine.apply(Change::QueueGone("none".into())).is_err());
    assert_eq!(engine.stats().parked, 20, "{:?}", engine.stats());
    assert_eq!(out.explanations.len(), 20);
    for k in 0..3u64 {
        let now = 200 + k * 100;
        let p = pod(&format!("new{k}"))
            .queue("a")
            .gpus(1)
            .arrival(now)
            .build();
        engine
            .apply(Change::Pod(std::sync::Arc::new(p), PodAt::pending()))
            .unwrap();
        let out = engine.cycle(now, 1);
        assert_eq!(out.stats.jobs_parked, 20);
        let binds = binds_as_changes(&engine, &out, now);
        assert_eq!(binds.len(), 1, "arrival {k}: {:?}", out.decisions);
        engine.apply_all(binds).unwrap();
    }
    // binding the arrivals (same queue, same priority: no victims for the
    // backlog) woke nothing
    assert_eq!(engine.stats().woken_all, 0, "{:?}", engine.stats());
    // a running pod finishes: its GPU is free again for the next arrival;
    // the backlog's 8-GPU pods (one shape, no victims) are woken by
    // capacity at the next cycle, only as many as the free GPUs can hold
    // and one more — one — not all 20
    engine.apply(Change::PodGone("r5-0".into())).unwrap();
    assert_eq!(engine.stats().woken_all, 0, "{:?}", engine.stats());
    assert_eq!(engine.stats().parked, 20);
    let p = pod("last").queue("a").gpus(1).arrival(999).build();
    engine
        .apply(Change::Pod(std::sync::Arc::new(p), PodAt::pending()))
        .unwrap();
    let out = engine.cycle(1000, 1);
    let snap = engine.snapshot();
    let bound: Vec<_> = out
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, node, .. } => Some((
                snap.pods[*pod as usize].pod.name.as_str(),
                snap.nodes[*node as usize].name.as_str(),
            )),
            _ => None,
        })
        .collect();
    assert_eq!(bound, vec![("last", "n5")]);
    assert_eq!(engine.stats().woken_by_capacity, 1, "{:?}", engine.stats());
    assert_eq!(engine.stats().woken, 1, "{:?}", engine.stats());
    assert_eq!(out.stats.jobs_parked, 19);
    assert_eq!(engine.stats().rebuilds, 0, "{:?}", engine.stats());
    assert!(
        engine.divergences().is_empty(),
        "{:?}",
        engine.divergences()
    );
}

/// Bad changes are refused with what and where, and change nothing.
#[test]
fn refused_changes_name_the_object_and_change_nothing() {
    let mut engine = Engine::new(sched());
    engine
        .apply(Change::Node(node("n0").gpus(2).build()))
        .unwrap();
    let p = pod("p").gpus(1).build();
    let e = engine
        .apply(Change::Pod(
            std::sync::Arc::new(p.clone()),
            PodAt::Running {
                node: "nope".into(),
                gpus: GpuAssignment::Whole(vec![0]),
                since_ms: 0,
            },
        ))
        .unwrap_err();
    assert!(
        e.to_string().contains("\"nope\"") && e.to_string().contains("\"p\""),
        "{e}"
    );
    assert!(engine.snapshot().pods.is_empty());
    let e = engine.apply(Change::PodGone("ghost".into())).unwrap_err();
    assert!(e.to_string().contains("pod \"ghost\""), "{e}");
    engine
        .apply(Change::Pod(
            std::sync::Arc::new(p),
            PodAt::Running {
                node: "n0".into(),
                gpus: GpuAssignment::Whole(vec![0]),
                since_ms: 0,
            },
        ))
        .unwrap();
    let e = engine.apply(Change::NodeGone("n0".into())).unwrap_err();
    assert!(
        e.to_string().contains("1 pod(s)") && e.to_string().contains("\"p\""),
        "{e}"
    );
    assert_eq!(engine.snapshot().nodes.len(), 1);
    let g = engine.generation();
    assert!(engine.apply(Change::QueueGone("none".into())).is_err());
    assert_eq!(engine.generation(), g);
}

/// A whole snapshot and the changes it becomes give the same snapshot.
#[test]
fn a_snapshot_is_the_same_changes() {
    let mut snap = snapshot(
        vec![node("n0").gpus(4).build(), node("n1").gpus(4).build()],
        vec![queue("a")],
        vec![gang("g", "a", 2)],
        vec![
            pod("x").queue("a").gpus(1).group("g").build(),
            pod("y").queue("a").gpus(1).group("g").build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 1,
        gpus: GpuAssignment::Whole(vec![2]),
        since_ms: 5,
    };
    let mut engine = Engine::new(sched());
    engine.apply_all(changes_of(&snap).unwrap()).unwrap();
    assert_eq!(engine.snapshot(), &snap);
    // syncing the same snapshot again is no change at all
    let g = engine.generation();
    engine.sync(&snap).unwrap();
    assert_eq!(engine.generation(), g);
}

/// `sync` checks the whole snapshot before it changes anything, and maps a
/// nomination of a node it adds in the same sync.
#[test]
fn sync_refuses_a_bad_snapshot_whole_and_maps_new_nodes() {
    let base = snapshot(
        vec![node("n0").gpus(4).build()],
        vec![queue("a")],
        vec![],
        vec![pod("x").queue("a").gpus(1).build()],
    );
    let mut engine = Engine::new(sched());
    engine.sync(&base).unwrap();
    let g = engine.generation();

    // two pods of one name: refused, nothing applied (not even the node)
    let mut dup = base.clone();
    dup.nodes.push(node("n1").gpus(4).build());
    let mut again = dup.pods[0].clone();
    std::sync::Arc::make_mut(&mut again.pod).gpu = pod("x").gpus(2).build().gpu;
    dup.pods.push(again);
    let e = engine.sync(&dup).unwrap_err();
    assert!(e.to_string().contains("\"x\""), "{e}");
    assert_eq!(engine.generation(), g);
    assert_eq!(engine.snapshot(), &base);

    // a running pod on a node the snapshot lacks: refused likewise
    let mut lost = base.clone();
    lost.pods[0].phase = PodPhase::Running {
        node: 7,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    assert!(engine.sync(&lost).is_err());
    assert_eq!(engine.snapshot(), &base);

    // a node added before the one the engine has, and the pod nominated
    // to it in the same snapshot: the engine ends equal to the snapshot
    let mut grown = base.clone();
    grown.nodes.insert(0, node("n1").gpus(4).build());
    grown.pods[0].phase = PodPhase::Pending {
        nominated: Some(0),
        nominated_at_ms: Some(3),
    };
    engine.sync(&grown).unwrap();
    assert_eq!(engine.snapshot(), &grown);
    // and back: the node gone, the nomination with it
    engine.sync(&base).unwrap();
    assert_eq!(engine.snapshot(), &base);
}

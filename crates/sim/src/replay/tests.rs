use super::*;
use gpusched_core::PodState;
use gpusched_model::{Gpu, GpuHealth, GpuRequest, Node, Pod, Queue, ResourceVec};

fn node(name: &str) -> Node {
    let gpus = (0..4)
        .map(|i| Gpu {
            index: i,
            uuid: format!("{name}-GPU-{i}"),
            model: "H100".into(),
            memory_mib: 81_920,
            health: GpuHealth::Healthy,
            topo: Default::default(),
            mig: Vec::new(),
        })
        .collect();
    Node::new(name, ResourceVec::new(64_000, 512 << 30, 0), gpus)
}

fn pod(name: &str, gpus: u32) -> Pod {
    let mut p = Pod::new(format!("ml/{name}"), "default");
    p.gpu = GpuRequest::Whole(gpus);
    p.arrival_ms = 1_000;
    p
}

fn input(duration: Option<u64>) -> ReplayInput {
    let mut running = PodState::pending(pod("r", 4));
    running.phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
        since_ms: 5_000,
    };
    ReplayInput {
        name: "t".into(),
        snapshot: Snapshot {
            nodes: vec![node("a"), node("b")],
            queues: vec![Queue::new("default")],
            groups: Vec::new(),
            pods: vec![
                running,
                PodState::pending(pod("p1", 4)),
                PodState::pending(pod("p2", 4)),
            ],
        },
        durations_ms: vec![duration, None, None],
        default_duration_ms: None,
        start_ms: 10_000,
        cycle_interval_ms: 1_000,
        max_cycles: 100,
    }
}

fn run(i: &ReplayInput) -> ReplayOutput {
    replay(i, &mut crate::sched::default_scheduler())
}

#[test]
fn pending_pods_are_placed_and_finishing_pods_free_their_gpus() {
    let out = run(&input(Some(60_000)));
    let binds: Vec<(&str, &str, &[u32], u64)> = out
        .decisions
        .iter()
        .filter(|d| d.action == "bind")
        .map(|d| (d.pod.as_str(), d.node.as_str(), d.gpus.as_slice(), d.at_ms))
        .collect();
    // p1 fits on b at once; p2 waits for r (started at 5 s, runs 60 s:
    // done at 65 s, 55 s after the capture)
    assert_eq!(binds.len(), 2, "{:#?}", out.decisions);
    assert_eq!(binds[0], ("ml/p1", "b", &[0, 1, 2, 3][..], 0));
    assert_eq!((binds[1].0, binds[1].1), ("ml/p2", "a"));
    assert_eq!(binds[1].3, 55_000);
    assert_eq!(out.decisions[0].gpu_uuids[0], "b-GPU-0");
    assert_eq!(out.result.totals.binds, 2);
    assert_eq!(out.result.totals.pods_succeeded, 1);
    // nothing left pending: the replay is done
    assert_eq!(out.result.ended_by, "done");
    assert!(out.pending.is_empty());
    // deterministic, and the report renders
    assert_eq!(run(&input(Some(60_000))), out);
    let html = crate::report::render(&out.result, None);
    assert!(html.contains("<svg"), "no chart in the report");
}

#[test]
fn a_default_run_time_applies_to_pods_without_one() {
    // r has no run time of its own: with a default of 60 s it ends at
    // 65 s (started at 5 s), and p2 gets its GPUs then
    let mut i = input(None);
    i.default_duration_ms = Some(60_000);
    let out = run(&i);
    let p2 = out
        .decisions
        .iter()
        .find(|d| d.action == "bind" && d.pod == "ml/p2")
        .expect("p2 bound once r ends");
    assert_eq!((p2.node.as_str(), p2.at_ms), ("a", 55_000));
    // the placed pods end too: every pod succeeds and the replay ends
    assert_eq!(out.result.totals.pods_succeeded, 3);
    assert_eq!(out.result.ended_by, "done");
    // a pod's own run time wins over the default
    let mut own = input(Some(20_000));
    own.default_duration_ms = Some(60_000);
    let out = run(&own);
    let p2 = out
        .decisions
        .iter()
        .find(|d| d.action == "bind" && d.pod == "ml/p2")
        .unwrap();
    assert_eq!(p2.at_ms, 15_000);
}

/// The per-queue columns of a replay are filled in (they once showed
/// 0.0 whatever happened), and a gang's timeout is counted.
#[test]
fn queues_show_what_they_held_finished_and_lost() {
    let mut i = input(None);
    i.default_duration_ms = Some(60_000);
    let out = run(&i);
    let q = &out.result.queues[0];
    assert_eq!(q.name, "default");
    assert_eq!(q.jobs_completed, 3);
    assert_eq!(q.jobs_completed, out.result.totals.jobs_completed);
    // 4 then 8 GPUs held, then 4: between the extremes, never zero
    assert!(q.avg_gpus > 3.0 && q.avg_gpus < 8.0, "{q:?}");
    // alone in the cluster, its fair share is its demand
    assert!(q.fair_gpus >= q.avg_gpus, "{q:?}");
    assert!(q.fairness_ratio > 0.0 && q.fairness_ratio <= 1.0, "{q:?}");

    // a gang of 3 with 2 members, timing out after 5 s
    let mut i = input(Some(60_000));
    i.snapshot.groups.push(gpusched_model::PodGroup {
        name: "ml/trio".into(),
        queue: "default".into(),
        min_member: 3,
        priority: 0,
        topology: None,
        schedule_timeout_ms: Some(5_000),
    });
    for name in ["t0", "t1"] {
        let mut p = pod(name, 1);
        p.group = Some("ml/trio".into());
        i.snapshot.pods.push(PodState::pending(p));
        i.durations_ms.push(None);
    }
    let out = run(&i);
    assert_eq!(out.result.totals.groups_timed_out, 1, "{:#?}", out.pending);
    assert!(
        out.pending
            .iter()
            .any(|(p, why)| p == "ml/t0" && why.contains("timed out")),
        "{:?}",
        out.pending
    );
}

#[test]
fn running_pods_without_a_run_time_keep_their_gpus() {
    let out = run(&input(None));
    let binds = out.decisions.iter().filter(|d| d.action == "bind").count();
    assert_eq!(binds, 1);
    assert_eq!(out.pending.len(), 1);
    assert_eq!(out.pending[0].0, "ml/p2");
    assert!(
        out.pending[0].1.contains("Insufficient"),
        "{}",
        out.pending[0].1
    );
    assert_eq!(out.result.ended_by, "idle");
}

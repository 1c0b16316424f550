//! `gpusched explain`'s reports, built from real cycles on small clusters.

use gpusched_core::report::{CycleView, Hint, PodStatus, classify, pod_report, queue_report};
use gpusched_core::*;
use gpusched_model::*;
use gpusched_testkit::*;

fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerOptions::default(),
        Vec::new(),
        Box::new(TestBestFit),
    )
}

fn report(snap: &Snapshot, out: &CycleOutput, now: u64, name: &str) -> report::PodReport {
    let r = pod_report(
        &CycleView {
            snapshot: snap,
            output: out,
            now_ms: now,
        },
        name,
    )
    .unwrap_or_else(|| panic!("no report for {name}"));
    // the report survives JSON (the debug endpoint's format) unchanged
    let back: report::PodReport =
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
    r
}

#[test]
fn a_pod_pending_on_quota_names_the_queue_and_the_dimension() {
    let mut org = queue("org");
    org.limit = Some(ResourceLimit::gpus(4000));
    let mut team = queue("team");
    team.parent = Some("org".into());
    let mut snap = snapshot(
        vec![node("a").gpus(8).build()],
        vec![org, team],
        vec![],
        vec![
            pod("r1").gpus(3).queue("team").build(),
            pod("big").gpus(2).queue("team").arrival(5).build(),
        ],
    );
    let mut s = sched();
    let out = s.cycle(&snap, 0, 1);
    apply(&mut snap, &out, 0);
    let out = s.cycle(&snap, 10, 2);
    let r = report(&snap, &out, 10, "big");
    let PodStatus::Pending {
        reasons,
        queue_position,
        evictions,
        ..
    } = &r.status
    else {
        panic!("{r:?}")
    };
    let Some(PendingReason::Quota(v)) = reasons.last() else {
        panic!("{reasons:?}")
    };
    assert_eq!(v.queue, "org");
    assert_eq!(v.dimension, ResourceKind::Gpu);
    assert_eq!((v.would_use, v.cap), (5000, 4000));
    assert_eq!(
        *queue_position,
        Some(QueuePosition {
            position: 1,
            jobs: 1
        })
    );
    // neither pass evicts for a job whose own queue's quota blocks it
    assert!(
        evictions
            .iter()
            .all(|a| matches!(&a.outcome, EvictionOutcome::Skipped(EvictionSkip::Quota(q)) if q.queue == "org")),
        "{evictions:?}"
    );
    assert_eq!(evictions.len(), 2, "{evictions:?}");
    // the queue, then its parent, with the parent's usage and limit
    let names: Vec<&str> = r.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(names, vec!["team", "org"]);
    assert_eq!(r.queues[1].usage.gpu_milli, 3000);
    assert_eq!(r.queues[1].limit.as_ref().unwrap().gpu_milli, Some(4000));
    assert!(r.hints.contains(&Hint::QueueFrees {
        queue: "org".into(),
        dimension: ResourceKind::Gpu,
        amount: 1000,
    }));
    let text = r.to_string();
    assert!(
        text.contains("fits once queue \"org\" uses 1 GPU less"),
        "{text}"
    );
    assert!(text.contains("queue position: 1 of 1"), "{text}");

    let q = queue_report(
        &CycleView {
            snapshot: &snap,
            output: &out,
            now_ms: 10,
        },
        "team",
    )
    .unwrap();
    assert_eq!(q.running_pods, 1);
    // the labels are the core's classification, what the Queue's status,
    // events and metrics show (each pending pod's main class)
    assert_eq!(q.pending_by_reason.get("QueueQuota"), Some(&1));
    let mut by_class: std::collections::BTreeMap<String, u32> = Default::default();
    for e in &out.explanations {
        let ps = &snap.pods[e.pod as usize];
        if ps.is_pending() && ps.pod.queue == "team" {
            let c = classify::classify(e, &ps.pod, &snap);
            let name = c.first().map_or("FitsNow", |c| c.reason_name());
            *by_class.entry(name.to_string()).or_default() += 1;
        }
    }
    assert_eq!(q.pending_by_reason, by_class);
    assert_eq!(q.ancestors.len(), 1);
    assert_eq!(q.queue.usage.gpu_milli, 3000);
    assert_eq!(
        q.queue.borrowed.gpu_milli, 3000,
        "no guarantee: all borrowed"
    );
}

#[test]
fn gang_reports_members_present_and_needed_and_timeout_left() {
    let mut g = gang("g", "default", 4);
    g.schedule_timeout_ms = Some(60_000);
    let snap = snapshot(
        vec![node("a").gpus(8).build()],
        vec![queue("default")],
        vec![g],
        vec![
            pod("g-0").gpus(1).group("g").arrival(1000).build(),
            pod("g-1").gpus(1).group("g").arrival(2000).build(),
        ],
    );
    let out = sched().cycle(&snap, 11_000, 1);
    let r = report(&snap, &out, 11_000, "g-1");
    let PodStatus::Pending { reasons, .. } = &r.status else {
        panic!("{r:?}")
    };
    assert_eq!(
        reasons.last(),
        Some(&PendingReason::GangIncomplete {
            group: "g".into(),
            have: 2,
            need: 4
        })
    );
    let gs = r.gang.as_ref().unwrap();
    assert_eq!((gs.min_member, gs.pending, gs.running), (4, 2, 0));
    assert_eq!(gs.phase, Some(GroupPhase::Pending));
    // 60 s from the first member's arrival at 1 s, seen at 11 s
    assert_eq!(gs.timeout_left_ms, Some(50_000));
    assert!(r.hints.contains(&Hint::MoreMembers {
        group: "g".into(),
        missing: 2
    }));
    assert!(r.to_string().contains("times out in 50s"), "{r}");
    // past its timeout the text says so (not "times out in 0ms")
    let out = sched().cycle(&snap, 70_000, 2);
    let r = report(&snap, &out, 70_000, "g-1");
    let text = r.to_string();
    assert!(text.contains("timed out (timeout 1m00s)"), "{text}");
    assert!(!text.contains("times out in"), "{text}");
}

#[test]
fn gang_short_on_a_topology_domain_says_how_many_gpus_on_one_domain() {
    let mut g = gang("g", "default", 2);
    g.topology = Some(TopologyConstraint {
        level: TopologyLevel::NvlinkDomain,
        required: true,
    });
    let mut snap = snapshot(
        vec![
            node("a").gpus(4).nvlink_domain("d1").build(),
            node("b").gpus(4).nvlink_domain("d2").build(),
        ],
        vec![queue("default")],
        vec![g],
        vec![pod("x").gpus(3).build(), pod("y").gpus(3).build()],
    );
    let mut s = sched();
    let out = s.cycle(&snap, 0, 1);
    apply(&mut snap, &out, 0);
    for n in ["g-0", "g-1"] {
        snap.pods.push(PodState::pending(
            pod(n).gpus(2).group("g").arrival(5).build(),
        ));
    }
    let out = s.cycle(&snap, 10, 2);
    let r = report(&snap, &out, 10, "g-0");
    let PodStatus::Pending {
        reasons, evictions, ..
    } = &r.status
    else {
        panic!("{r:?}")
    };
    assert!(
        reasons
            .iter()
            .any(|x| matches!(x, PendingReason::NoTopologyDomain { need: 2, .. })),
        "{reasons:?}"
    );
    assert!(
        evictions.iter().any(|a| a.kind == EvictionKind::Preempt
            && a.outcome == EvictionOutcome::Skipped(EvictionSkip::RequiredTopology)),
        "{evictions:?}"
    );
    let h = r
        .hints
        .iter()
        .find(|h| matches!(h, Hint::FreeGpusInOneDomain { .. }))
        .unwrap();
    assert_eq!(
        h,
        &Hint::FreeGpusInOneDomain {
            level: TopologyLevel::NvlinkDomain,
            gpus: 4000,
            best: Some(("d1".into(), 1000)),
        }
    );
    assert!(
        h.to_string()
            .starts_with("fits if 4 GPU(s) are free on one NVLink domain"),
        "{h}"
    );
}

#[test]
fn a_rejected_preemption_candidate_reports_why() {
    // node a: a higher-priority pod (no victim); node b: a lower-priority
    // 1-GPU pod, but b has only 2 GPUs (evicting it cannot make room for 4)
    let mut s = sched();
    // a pod too big for b: a has no victims, b not enough even if empty
    let mut snap = snapshot(
        vec![node("a").gpus(4).build(), node("b").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("high").gpus(4).priority(20).build(),
            pod("low").gpus(1).priority(0).build(),
        ],
    );
    let out = s.cycle(&snap, 0, 1);
    apply(&mut snap, &out, 0);
    snap.pods.push(PodState::pending(
        pod("wide").gpus(3).priority(10).arrival(5).build(),
    ));
    let out = s.cycle(&snap, 10, 2);
    assert!(evictions(&snap, &out).is_empty());
    let r = report(&snap, &out, 10, "wide");
    let PodStatus::Pending {
        evictions, verdict, ..
    } = &r.status
    else {
        panic!("{r:?}")
    };
    assert_eq!(*verdict, Some(Verdict::Unschedulable));
    let pre = evictions
        .iter()
        .find(|a| a.kind == EvictionKind::Preempt)
        .unwrap();
    assert_eq!(
        pre.outcome,
        EvictionOutcome::NoNode {
            pod: "wide".into(),
            considered: 2,
            counts: vec![
                (CandidateRejection::NoVictims, 1),
                (CandidateRejection::NotEnoughGpus, 1)
            ],
            wait_ms: None,
        }
    );
    assert_eq!(
        pre.to_string(),
        "preemption: 0/2 nodes are available: 1 No preemption victims found for incoming pod, \
         1 Preemption is not helpful for scheduling (too few GPUs even with every candidate victim evicted)."
    );
    // reclaim: one queue only, so nothing is below its share for it
    assert!(
        evictions.iter().any(|a| a.kind == EvictionKind::Reclaim),
        "{evictions:?}"
    );
    let h = r
        .hints
        .iter()
        .find(|h| matches!(h, Hint::FreeGpusOnOneNode { .. }))
        .unwrap();
    let Hint::FreeGpusOnOneNode { gpus, nearest } = h else {
        unreachable!()
    };
    assert_eq!(*gpus, 3);
    let nearest = nearest.as_ref().unwrap();
    assert_eq!((nearest.node.as_str(), nearest.free_gpus), ("b", 1));
}

#[test]
fn a_bound_pod_reports_node_gpus_and_topology_score() {
    let snap = snapshot(
        vec![node("a").gpus(8).nvswitch().build()],
        vec![queue("default")],
        vec![],
        vec![pod("p").gpus(4).build()],
    );
    let mut s = sched();
    let out = s.cycle(&snap, 0, 1);
    // the cycle's own decision: binding
    let r = report(&snap, &out, 0, "p");
    assert!(matches!(r.status, PodStatus::Binding { .. }), "{r:?}");
    let mut snap2 = snap.clone();
    apply(&mut snap2, &out, 0);
    let out2 = s.cycle(&snap2, 5, 2);
    let r = report(&snap2, &out2, 5, "p");
    let PodStatus::Bound { placement, .. } = &r.status else {
        panic!("{r:?}")
    };
    assert_eq!(placement.node, "a");
    assert_eq!(placement.gpus.len(), 4);
    let t = placement.topology.unwrap();
    assert_eq!(t.cost, t.ideal, "four GPUs of one NVSwitch domain");
    assert!(r.hints.is_empty());
    assert!(r.to_string().contains("status: Bound"), "{r}");
}

/// The surfaces the core renders, for one pod: its `explain` report (and
/// the text), its `pending` row, and the classification the scheduler's
/// condition, event, Queue status, doctor and metrics take theirs from.
struct Surfaces {
    explain_class: String,
    explain_text: String,
    explain_condition: Option<String>,
    pending_row: String,
    class: String,
    condition: &'static str,
    event_note: String,
}

fn surfaces(snap: &Snapshot, out: &CycleOutput, name: &str) -> Surfaces {
    let view = CycleView {
        snapshot: snap,
        output: out,
        now_ms: 10,
    };
    let r = report(snap, out, 10, name);
    let PodStatus::Pending {
        classes, condition, ..
    } = &r.status
    else {
        panic!("{r:?}")
    };
    let list = report::pending_list(&view, None, &|_| None).unwrap();
    let row = list.pods.iter().find(|p| p.pod == name).unwrap();
    let (id, ps) = snap
        .pods
        .iter()
        .enumerate()
        .find(|(_, p)| p.pod.name == name)
        .unwrap();
    let e = out
        .explanations
        .iter()
        .find(|e| e.pod as usize == id)
        .unwrap();
    let cs = classify::classify(e, &ps.pod, snap);
    Surfaces {
        explain_class: classes[0].reason_name().to_string(),
        explain_text: r.to_string(),
        explain_condition: condition.clone(),
        pending_row: row.reason.clone(),
        class: cs[0].reason_name().to_string(),
        condition: classify::condition_reason(e, &cs),
        event_note: classify::tagged_message(&e.message(), cs[0]),
    }
}

/// #39: the same pod reads one name in explain, pending, the Queue status,
/// doctor, the metrics, its event and its condition: a pod bigger than any
/// node, a missing queue, a GPU model no node has, a pod waiting for GPUs.
/// A parent queue's pending pods include its children's.
#[test]
fn one_name_for_one_reason_on_every_surface() {
    let org = queue("org");
    let mut team = queue("team");
    team.parent = Some("org".into());
    let mut snap = snapshot(
        vec![
            node("a").gpus(8).model("NVIDIA-H100-80GB-HBM3").build(),
            node("b").gpus(8).model("NVIDIA-H100-80GB-HBM3").build(),
        ],
        vec![org, team],
        vec![],
        vec![
            pod("run").gpus(8).queue("team").build(),
            pod("run2").gpus(8).queue("team").build(),
        ],
    );
    let mut s = sched();
    let out = s.cycle(&snap, 0, 1);
    apply(&mut snap, &out, 0);
    for p in [
        pod("huge").gpus(16).queue("team").arrival(5).build(),
        pod("lost").gpus(1).queue("nosuch").arrival(5).build(),
        pod("a100")
            .gpus(1)
            .models(&["NVIDIA-A100-SXM4-80GB"])
            .queue("team")
            .arrival(5)
            .build(),
        pod("waits").gpus(2).queue("team").arrival(5).build(),
    ] {
        snap.pods.push(PodState::pending(p));
    }
    let out = s.cycle(&snap, 10, 2);
    for (name, want, condition) in [
        ("huge", "NeverFits", "Unschedulable"),
        ("lost", "MissingQueueOrGroup", "MissingQueueOrGroup"),
        ("a100", "NoGpuModel", "Unschedulable"),
        ("waits", "InsufficientGpus", "Unschedulable"),
    ] {
        let f = surfaces(&snap, &out, name);
        assert_eq!(f.class, want, "{name}: {}", f.explain_text);
        assert_eq!(f.explain_class, want, "{name}: explain");
        assert!(
            f.explain_text.contains(&format!("status: Pending: {want}")),
            "{name}: {}",
            f.explain_text
        );
        assert!(
            f.explain_text.contains(&format!(
                "condition: PodScheduled=False, reason {condition}"
            )),
            "{name}: {}",
            f.explain_text
        );
        // no other reason label of the old vocabulary
        for old in [
            "[NoNodeFits]",
            "[QueueMissing]",
            "Unresolvable",
            "never-fits",
        ] {
            assert!(!f.explain_text.contains(old), "{name}: {}", f.explain_text);
        }
        assert_eq!(f.pending_row, want, "{name}: pending");
        assert_eq!(f.condition, condition, "{name}: condition");
        assert_eq!(f.explain_condition.as_deref(), Some(condition), "{name}");
        assert!(
            f.event_note.ends_with(&format!("[{want}]")),
            "{name}: {}",
            f.event_note
        );
        // JSON (doctor's and the debug endpoint's) and the metrics label
        // are the same name
        let c = classify::PendingClass::from_name(want).unwrap();
        assert_eq!(serde_json::to_value(c).unwrap(), want);
        assert_eq!(c.as_str(), want);
    }
    // a GPU-model mismatch names the models asked and those the nodes have
    let a100 = surfaces(&snap, &out, "a100");
    assert!(
        a100.event_note.contains(
            "2 node(s) had no GPU of the requested model(s) NVIDIA-A100-SXM4-80GB (they have NVIDIA-H100-80GB-HBM3)"
        ),
        "{}",
        a100.event_note
    );
    // the Queue status and `explain queue`: the child's, and the parent's
    // with its children's
    let view = CycleView {
        snapshot: &snap,
        output: &out,
        now_ms: 10,
    };
    let team = queue_report(&view, "team").unwrap();
    let org = queue_report(&view, "org").unwrap();
    for q in [&team, &org] {
        assert_eq!(q.pending_by_reason.get("NeverFits"), Some(&1), "{q:?}");
        assert_eq!(q.pending_by_reason.get("NoGpuModel"), Some(&1), "{q:?}");
        assert_eq!(
            q.pending_by_reason.get("InsufficientGpus"),
            Some(&1),
            "{q:?}"
        );
        assert_eq!(q.pending_by_reason.values().sum::<u32>(), 3, "{q:?}");
    }
    assert!(org.to_string().contains("pending     3 pod(s)"), "{org}");
}

/// #39: a gang that can never fit (9 members of 8 GPUs, six 8-GPU nodes)
/// reads as a pod bigger than any node does — class, message, verdict,
/// hint and condition — not "waits for capacity".
#[test]
fn a_gang_that_can_never_fit_reads_as_a_pod_that_never_fits() {
    let nodes: Vec<Node> = (0..6)
        .map(|i| node(&format!("n{i}")).gpus(8).build())
        .collect();
    let mut pods: Vec<Pod> = (0..9)
        .map(|i| {
            pod(&format!("w-{i}"))
                .gpus(8)
                .group("big")
                .queue("q")
                .build()
        })
        .collect();
    pods.push(pod("huge").gpus(16).queue("q").build());
    // a gang that fits once the cluster is free is still short, not never
    let mut short: Vec<Pod> = (0..6)
        .map(|i| {
            pod(&format!("s-{i}"))
                .gpus(8)
                .group("short")
                .queue("q")
                .build()
        })
        .collect();
    pods.append(&mut short);
    pods.push(
        pod("hog")
            .gpus(8)
            .queue("q")
            .priority(100)
            .not_preemptible()
            .build(),
    );
    let snap = snapshot(
        nodes,
        vec![queue("q")],
        vec![gang("big", "q", 9), gang("short", "q", 6)],
        pods,
    );
    let mut s = sched();
    let out = s.cycle(&snap, 10, 1);
    let single = surfaces(&snap, &out, "huge");
    let member = surfaces(&snap, &out, "w-0");
    assert_eq!(single.class, "NeverFits");
    assert_eq!(member.class, single.class);
    assert_eq!(member.condition, single.condition);
    assert_eq!(member.pending_row, "NeverFits");
    let r = report(&snap, &out, 10, "w-0");
    let PodStatus::Pending { verdict, .. } = &r.status else {
        panic!("{r:?}")
    };
    assert_eq!(*verdict, Some(Verdict::Unresolvable));
    assert_eq!(r.hints, vec![Hint::NeverFits], "{r:#?}");
    assert!(
        member
            .explain_text
            .contains("at most 6 such pods even when empty: it never fits"),
        "{}",
        member.explain_text
    );
    assert!(
        !member.explain_text.contains("fit at once"),
        "{}",
        member.explain_text
    );
    let short = surfaces(&snap, &out, "s-0");
    assert_eq!(short.class, "GangShort", "{}", short.explain_text);
}

/// #39 item 9: a 4-GPU pod on a whole 4-GPU PCIe node read "link cost 160
/// (best possible 60)" — the all-NVLink ideal, not what that node allows;
/// and every queue line carried "cpu 0m, memory 0".
#[test]
fn link_cost_is_judged_against_the_best_on_that_node_and_zeros_are_left_out() {
    let snap = snapshot(
        vec![node("l").gpus(4).pcie(2).build()],
        vec![queue("default")],
        vec![],
        vec![pod("p").gpus(4).build()],
    );
    let mut s = sched();
    let out = s.cycle(&snap, 0, 1);
    let mut snap2 = snap.clone();
    apply(&mut snap2, &out, 0);
    let out2 = s.cycle(&snap2, 5, 2);
    let r = report(&snap2, &out2, 5, "p");
    let PodStatus::Bound { placement, .. } = &r.status else {
        panic!("{r:?}")
    };
    let t = placement.topology.unwrap();
    assert!(t.cost > t.ideal, "PCIe: above the all-NVLink ideal {t:?}");
    assert_eq!(t.cost, t.node_best, "the whole node: its best {t:?}");
    let text = r.to_string();
    assert!(
        text.contains(&format!(
            "topology: link cost {}: the best 4 GPUs of this node allow\n",
            t.cost
        )),
        "{text}"
    );
    assert!(!text.contains("best possible"), "{text}");
    assert!(
        !text.contains("cpu 0m") && !text.contains("memory 0"),
        "{text}"
    );
    assert!(text.contains("guarantee   gpu 0\n"), "{text}");
}

/// #39 item 9: "preemption: 0/0 nodes are available." said nothing.
#[test]
fn an_eviction_pass_with_no_candidate_node_says_why() {
    let a = EvictionAttempt {
        kind: EvictionKind::Preempt,
        outcome: EvictionOutcome::NoNode {
            pod: "p".into(),
            considered: 0,
            counts: Vec::new(),
            wait_ms: None,
        },
    };
    assert_eq!(
        a.to_string(),
        "preemption: no node passes the pod's filters, so evicting pods would not help."
    );
}

//! PersistentVolumeClaims through the core (VolumeBinding, VolumeZone,
//! ReadWriteOncePod): resolved claims decide the node; pods placed in one
//! cycle, gang members included, never count on one volume twice.

use gpusched_core::*;
use gpusched_model::*;
use gpusched_plugins::{SchedulerConfig, build};
use gpusched_testkit::*;
use std::collections::BTreeMap;

const HOST: &str = "kubernetes.io/hostname";

fn sched() -> Scheduler {
    let mut cfg = SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    build(&cfg).unwrap()
}

fn nodes(n: usize) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let name = format!("n{i}");
            node(&name).gpus(8).label(HOST, &name).build()
        })
        .collect()
}

fn on(host: &str) -> Vec<NodeSelectorTerm> {
    vec![NodeSelectorTerm {
        match_expressions: vec![NodeSelectorRequirement {
            key: HOST.into(),
            operator: NodeSelectorOp::In,
            values: vec![host.into()],
        }],
        ..Default::default()
    }]
}

fn local(name: &str, host: &str) -> PvChoice {
    PvChoice {
        name: name.into(),
        nodes: on(host),
    }
}

fn delayed(claim: &str, pvs: Vec<PvChoice>) -> ClaimNeed {
    ClaimNeed::Delayed {
        claim: claim.into(),
        pvs,
        provision: None,
        selected_node: None,
        capacity: None,
    }
}

fn with_volumes(mut p: Pod, needs: Vec<ClaimNeed>) -> Pod {
    p.constraints_mut().volumes = needs;
    p
}

fn run(snap: &Snapshot) -> (CycleOutput, BTreeMap<String, String>) {
    let out = sched().cycle(snap, 1_000, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    let placed = binds(snap, &out)
        .into_iter()
        .map(|(p, (n, _))| (p, n))
        .collect();
    (out, placed)
}

#[test]
fn a_delayed_claim_with_a_local_volume_only_on_n3_goes_to_n3() {
    let p = with_volumes(
        pod("train").gpus(1).build(),
        vec![delayed("ml/data", vec![local("pv-n3", "n3")])],
    );
    let snap = snapshot(nodes(4), vec![queue("default")], vec![], vec![p]);
    let (_, placed) = run(&snap);
    assert_eq!(placed["train"], "n3");
}

#[test]
fn one_volume_is_never_counted_on_by_two_claims_in_one_cycle() {
    let pods = (0..2)
        .map(|i| {
            with_volumes(
                pod(&format!("p{i}")).gpus(1).build(),
                vec![delayed(&format!("ml/c{i}"), vec![local("only", "n2")])],
            )
        })
        .collect();
    let snap = snapshot(nodes(3), vec![queue("default")], vec![], pods);
    let (out, placed) = run(&snap);
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_eq!(placed.values().next().unwrap(), "n2");
    let pending = if placed.contains_key("p0") {
        "p1"
    } else {
        "p0"
    };
    let why = explanation(&snap, &out, pending).unwrap();
    assert!(
        why.contains("didn't find available persistent volumes to bind"),
        "{why}"
    );
}

#[test]
fn gang_members_take_distinct_volumes_inside_the_statement() {
    // two members, each its own claim, volumes on n1 (one) and n2 (one):
    // both fit, on different nodes; with a single volume, neither binds
    for (pvs, fits) in [
        (vec![local("a", "n1"), local("b", "n2")], true),
        (vec![local("a", "n1")], false),
    ] {
        let pods = (0..2)
            .map(|i| {
                with_volumes(
                    pod(&format!("t{i}")).gpus(1).group("train").build(),
                    vec![delayed(&format!("ml/t{i}"), pvs.clone())],
                )
            })
            .collect();
        let snap = snapshot(
            nodes(3),
            vec![queue("default")],
            vec![gang("train", "default", 2)],
            pods,
        );
        let (_, placed) = run(&snap);
        if fits {
            assert_eq!(placed.len(), 2, "{placed:?}");
            assert_ne!(placed["t0"], placed["t1"]);
        } else {
            assert!(placed.is_empty(), "all or nothing: {placed:?}");
        }
    }
}

#[test]
fn pods_sharing_a_delayed_claim_follow_the_first_ones_volume() {
    // a ReadWriteMany claim shared by two pods: the second goes where the
    // first one's volume is, not to the other volume
    let pvs = vec![local("v1", "n1"), local("v2", "n2")];
    let pods = (0..2)
        .map(|i| {
            with_volumes(
                pod(&format!("p{i}")).gpus(5).build(),
                vec![delayed("ml/shared", pvs.clone())],
            )
        })
        .collect();
    let snap = snapshot(nodes(3), vec![queue("default")], vec![], pods);
    let (_, placed) = run(&snap);
    // 5 + 5 GPUs do not fit one 8-GPU node: the second stays pending
    // rather than taking the other volume for the same claim
    assert_eq!(placed.len(), 1, "{placed:?}");
}

#[test]
fn bound_volumes_restrict_nodes_and_blocked_claims_wait_with_their_reason() {
    let bound = with_volumes(
        pod("zonal").gpus(1).build(),
        vec![ClaimNeed::Bound {
            claim: "ml/disk".into(),
            nodes: on("n1"),
        }],
    );
    let missing = with_volumes(
        pod("missing").gpus(1).build(),
        vec![ClaimNeed::Blocked {
            reason: "persistentvolumeclaim \"data\" not found".into(),
        }],
    );
    let snap = snapshot(
        nodes(3),
        vec![queue("default")],
        vec![],
        vec![bound, missing],
    );
    let (out, placed) = run(&snap);
    assert_eq!(placed.get("zonal").map(String::as_str), Some("n1"));
    assert!(!placed.contains_key("missing"));
    let why = explanation(&snap, &out, "missing").unwrap();
    assert!(
        why.contains("persistentvolumeclaim \"data\" not found"),
        "{why}"
    );
}

#[test]
fn a_read_write_once_pod_claim_in_use_keeps_the_next_user_pending() {
    let mut holder = pod("holder").gpus(1).build();
    holder.constraints_mut().exclusive_claims = vec!["ml/solo".into()];
    let mut next = pod("next").gpus(1).build();
    next.constraints_mut().exclusive_claims = vec!["ml/solo".into()];
    let mut other = pod("other").gpus(1).build();
    other.constraints_mut().exclusive_claims = vec!["ml/different".into()];
    let mut snap = snapshot(
        nodes(2),
        vec![queue("default")],
        vec![],
        vec![holder, next, other],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    let (out, placed) = run(&snap);
    assert!(!placed.contains_key("next"), "{placed:?}");
    assert!(placed.contains_key("other"), "{placed:?}");
    let why = explanation(&snap, &out, "next").unwrap();
    assert!(
        why.contains(gpusched_plugins::podapi::RWOP_CONFLICT),
        "{why}"
    );
}

#[test]
fn provisioning_is_limited_to_the_classes_allowed_topologies() {
    let p = with_volumes(
        pod("fresh").gpus(1).build(),
        vec![ClaimNeed::Delayed {
            claim: "ml/new".into(),
            pvs: vec![],
            provision: Some(on("n2")),
            selected_node: None,
            capacity: None,
        }],
    );
    let snap = snapshot(nodes(3), vec![queue("default")], vec![], vec![p]);
    let (_, placed) = run(&snap);
    assert_eq!(placed["fresh"], "n2");
}

const DRIVER: &str = "csi.example.com";

fn csi(mut p: Pod, handles: &[&str]) -> Pod {
    p.constraints_mut().csi_volumes = handles
        .iter()
        .map(|h| CsiVolume {
            driver: DRIVER.into(),
            handle: h.to_string(),
        })
        .collect();
    p
}

fn limited(n: usize, max: u32) -> Vec<Node> {
    let mut ns = nodes(n);
    for n in &mut ns {
        n.attach_limits.insert(DRIVER.into(), max);
    }
    ns
}

fn running_on(snap: &mut Snapshot, pod: usize, node: NodeId) {
    snap.pods[pod].phase = PodPhase::Running {
        node,
        gpus: GpuAssignment::Whole(vec![pod as u32]),
        since_ms: 0,
    };
}

#[test]
fn a_node_at_its_csi_attach_limit_takes_no_new_volume_but_a_shared_one() {
    // one node, limit 2 for the driver: the running pod uses a; the next
    // pods bring b (fits: 2 of 2), then c (would be 3: refused), and a
    // pod sharing a and b (nothing new: fits); another driver is not limited
    let running = csi(pod("running").gpus(1).build(), &["a"]);
    let b = csi(pod("b").gpus(1).arrival(1).build(), &["b"]);
    let c = csi(pod("c").gpus(1).arrival(2).build(), &["c"]);
    let shared = csi(pod("shared").gpus(1).arrival(3).build(), &["a", "b", "b"]);
    let mut other = pod("other").gpus(1).arrival(4).build();
    other.constraints_mut().csi_volumes = vec![CsiVolume {
        driver: "other.csi".into(),
        handle: "x".into(),
    }];
    let mut snap = snapshot(
        limited(1, 2),
        vec![queue("default")],
        vec![],
        vec![running, b, c, shared, other],
    );
    running_on(&mut snap, 0, 0);
    let (out, placed) = run(&snap);
    assert!(placed.contains_key("b"), "{placed:?}");
    assert!(!placed.contains_key("c"), "{placed:?}");
    assert!(placed.contains_key("shared"), "{placed:?}");
    assert!(placed.contains_key("other"), "{placed:?}");
    let why = explanation(&snap, &out, "c").unwrap();
    assert!(why.contains(MAX_VOLUME_COUNT), "{why}");
    // without the limit every pod fits
    snap.nodes[0].attach_limits.clear();
    let (_, placed) = run(&snap);
    assert_eq!(placed.len(), 4, "{placed:?}");
}

#[test]
fn gang_members_count_against_the_limit_inside_the_statement() {
    // two members with a volume each, nodes with limit 1: one per node; on
    // one such node the gang does not fit at all
    for (n, fits) in [(2, true), (1, false)] {
        let pods = (0..2)
            .map(|i| {
                csi(
                    pod(&format!("t{i}")).gpus(1).group("train").build(),
                    &[&format!("v{i}")],
                )
            })
            .collect();
        let snap = snapshot(
            limited(n, 1),
            vec![queue("default")],
            vec![gang("train", "default", 2)],
            pods,
        );
        let (_, placed) = run(&snap);
        if fits {
            assert_eq!(placed.len(), 2, "{placed:?}");
            assert_ne!(placed["t0"], placed["t1"]);
        } else {
            assert!(placed.is_empty(), "all or nothing: {placed:?}");
        }
    }
}

#[test]
fn preemption_frees_an_attach_slot_for_a_higher_priority_pod() {
    let low = csi(pod("low").gpus(1).priority(0).build(), &["old"]);
    let high = csi(pod("high").gpus(1).priority(100).build(), &["new"]);
    let mut snap = snapshot(
        limited(1, 1),
        vec![queue("default")],
        vec![],
        vec![low, high],
    );
    running_on(&mut snap, 0, 0);
    let out = sched().cycle(&snap, 1_000, 7);
    assert!(check_invariants(&snap, &out).is_empty());
    assert_eq!(evictions(&snap, &out), vec!["low".to_string()]);
}

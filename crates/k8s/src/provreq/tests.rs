use super::*;
use crate::world::PodRef;
use gpusched_testkit as tk;
use serde_json::json;

fn cfg() -> Config {
    Config {
        retry_base: Duration::from_secs(10),
        retry_max: Duration::from_secs(60),
        ..Config::default()
    }
}

fn gang(blocked: Blocked) -> GangState {
    GangState {
        namespace: "ml".into(),
        blocked,
        pending: vec![
            Member {
                uid: "u0".into(),
                name: "w-0".into(),
            },
            Member {
                uid: "u1".into(),
                name: "w-1".into(),
            },
        ],
    }
}

fn pr(attempt: u32, phase: PrPhase) -> PrState {
    PrState {
        name: pr_name("ml/train", attempt),
        attempt,
        created_ms: 5_000,
        phase,
    }
}

fn failed(at_ms: u64) -> PrPhase {
    PrPhase::Failed {
        condition: "Failed".into(),
        why: "NoCapacity: no node group fits".into(),
        at_ms,
    }
}

#[test]
fn a_capacity_blocked_gang_without_a_request_gets_the_first() {
    let p = decide(Some(&gang(Blocked::Capacity)), &[], 0, &cfg());
    assert_eq!(p.delete, vec![]);
    assert_eq!(p.next, Next::Create { attempt: 1 });
}

#[test]
fn a_gang_that_fits_or_is_held_never_gets_one() {
    for b in [Blocked::Waiting, Blocked::Held("QueueQuota".into())] {
        let p = decide(Some(&gang(b.clone())), &[], 0, &cfg());
        assert_eq!(p.next, Next::Nothing, "{b:?}");
        assert!(p.delete.is_empty());
    }
    assert_eq!(decide(None, &[], 0, &cfg()).next, Next::Nothing);
}

#[test]
fn a_pending_request_is_waited_for_and_a_provisioned_one_reserves() {
    let g = gang(Blocked::Capacity);
    let p = decide(Some(&g), &[pr(1, PrPhase::Waiting)], 0, &cfg());
    assert_eq!(
        p.next,
        Next::Pending {
            pr: pr_name("ml/train", 1)
        }
    );
    // provisioned: reserved while the members wait for the new nodes
    for b in [Blocked::Capacity, Blocked::Waiting] {
        let p = decide(Some(&gang(b)), &[pr(1, PrPhase::Provisioned)], 0, &cfg());
        assert_eq!(
            p.next,
            Next::Reserve {
                pr: pr_name("ml/train", 1),
                since_ms: 5_000
            }
        );
        assert!(p.delete.is_empty());
    }
}

#[test]
fn a_request_goes_when_the_gang_runs_is_gone_or_is_held() {
    for phase in [PrPhase::Waiting, PrPhase::Provisioned, failed(0)] {
        let p = decide(None, &[pr(2, phase.clone())], 0, &cfg());
        assert_eq!(p.next, Next::Nothing);
        assert_eq!(p.delete.len(), 1);
        assert_eq!(p.delete[0].0, pr_name("ml/train", 2));
        let p = decide(
            Some(&gang(Blocked::Held("QueueQuota".into()))),
            &[pr(2, phase)],
            0,
            &cfg(),
        );
        assert_eq!(p.next, Next::Nothing);
        assert!(p.delete[0].1.contains("QueueQuota"), "{:?}", p.delete);
    }
}

#[test]
fn a_failed_request_is_kept_through_its_backoff_then_replaced() {
    let g = gang(Blocked::Capacity);
    // attempt 1 failed at t=100 s: 10 s backoff
    let prs = [pr(1, failed(100_000))];
    let p = decide(Some(&g), &prs, 105_000, &cfg());
    assert!(p.delete.is_empty());
    match &p.next {
        Next::Backoff { pr, why, until_ms } => {
            assert_eq!(pr, &pr_name("ml/train", 1));
            assert_eq!(*until_ms, 110_000);
            assert!(
                why.contains("Failed") && why.contains("NoCapacity"),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    let p = decide(Some(&g), &prs, 110_000, &cfg());
    assert_eq!(p.next, Next::Create { attempt: 2 });
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].0, pr_name("ml/train", 1));
    // attempt 3 waits 40 s, attempt 5 the 60 s cap
    assert_eq!(cfg().backoff(3), Duration::from_secs(40));
    assert_eq!(cfg().backoff(5), Duration::from_secs(60));
    assert_eq!(cfg().backoff(u32::MAX), Duration::from_secs(60));
    // a gang that no longer needs capacity is not given a new request
    let p = decide(Some(&gang(Blocked::Waiting)), &prs, 500_000, &cfg());
    assert!(matches!(p.next, Next::Backoff { .. }), "{:?}", p.next);
}

#[test]
fn expired_and_revoked_bookings_count_as_failures() {
    for t in ["BookingExpired", "CapacityRevoked", "Failed"] {
        let s = ProvisioningRequestStatus {
            conditions: Some(vec![
                PrCondition {
                    type_: "Provisioned".into(),
                    status: "True".into(),
                    ..Default::default()
                },
                PrCondition {
                    type_: t.into(),
                    status: "True".into(),
                    reason: Some("R".into()),
                    message: Some("m".into()),
                    last_transition_time: Some("2026-01-01T00:00:10Z".into()),
                },
            ]),
        };
        match phase(Some(&s)) {
            PrPhase::Failed {
                condition,
                why,
                at_ms,
            } => {
                assert_eq!(condition, t);
                assert_eq!(why, "R: m");
                assert_eq!(at_ms, 1_767_225_610_000);
            }
            other => panic!("{t}: {other:?}"),
        }
    }
    let provisioned = ProvisioningRequestStatus {
        conditions: Some(vec![
            PrCondition {
                type_: "Accepted".into(),
                status: "True".into(),
                ..Default::default()
            },
            PrCondition {
                type_: "Provisioned".into(),
                status: "True".into(),
                ..Default::default()
            },
            PrCondition {
                type_: "Failed".into(),
                status: "False".into(),
                ..Default::default()
            },
        ]),
    };
    assert_eq!(phase(Some(&provisioned)), PrPhase::Provisioned);
    assert_eq!(phase(None), PrPhase::Waiting);
}

#[test]
fn superseded_requests_are_deleted() {
    let g = gang(Blocked::Capacity);
    let p = decide(
        Some(&g),
        &[pr(1, failed(0)), pr(2, PrPhase::Waiting)],
        0,
        &cfg(),
    );
    assert_eq!(p.delete.len(), 1);
    assert_eq!(p.delete[0].0, pr_name("ml/train", 1));
    assert_eq!(
        p.next,
        Next::Pending {
            pr: pr_name("ml/train", 2)
        }
    );
}

#[test]
fn names_are_dns_labels_and_keep_gangs_apart() {
    let a = pr_name("ml/js:train:restart-1:workers", 3);
    assert!(a.starts_with("gpusched-js-train-restart-1-workers-"), "{a}");
    assert!(a.ends_with("-3"));
    let long = format!("ml/{}", "X".repeat(300));
    let n = pr_name(&long, 1);
    assert!(n.len() <= 63, "{n}");
    assert!(
        n.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    );
    assert_ne!(pr_name("ml/a.b", 1), pr_name("ml/a-b", 1));
    assert!(pr_name("ml/:::", 1).starts_with("gpusched-"));
    // a PodTemplate name per pod set stays within 63 characters too
    assert!(format!("{n}-31").len() <= 63);
}

fn pod(name: &str, gpus: &str, index: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "labels": {"app": "train", "batch.kubernetes.io/job-completion-index": index}},
        "spec": {"schedulerName": "gpusched", "hostname": name,
                 "nodeSelector": {"nvidia.com/gpu.product": "H100"},
                 "containers": [{"name": "c", "image": "cuda",
                                 "env": [{"name": "RANK", "value": index}],
                                 "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}
    }))
    .unwrap()
}

#[test]
fn members_of_one_shape_count_together() {
    let pods = [
        pod("w-0", "8", "0"),
        pod("w-1", "8", "1"),
        pod("launcher", "1", "0"),
        pod("w-2", "8", "2"),
    ];
    let sets = pod_sets(&pods).unwrap();
    assert_eq!(sets.len(), 2);
    assert_eq!(sets[0].1, 3);
    assert_eq!(sets[1].1, 1);
    let spec = sets[0].0.spec.as_ref().unwrap();
    assert_eq!(
        spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "8"
    );
    assert_eq!(
        spec.node_selector.as_ref().unwrap()["nvidia.com/gpu.product"],
        "H100"
    );
    // per-pod fields are left out
    assert!(spec.containers[0].env.is_none());
    assert!(spec.hostname.is_none() && spec.scheduler_name.is_none());
    let labels = sets[0]
        .0
        .metadata
        .as_ref()
        .unwrap()
        .labels
        .as_ref()
        .unwrap();
    assert_eq!(labels.get("app").map(String::as_str), Some("train"));
    assert!(!labels.contains_key("batch.kubernetes.io/job-completion-index"));
}

#[test]
fn too_many_shapes_or_a_pod_without_spec_is_an_error() {
    let pods: Vec<Pod> = (0..33)
        .map(|i| pod(&format!("p{i}"), &format!("{}", i + 1), "0"))
        .collect();
    let e = pod_sets(&pods).unwrap_err();
    assert!(e.contains("33 distinct shapes"), "{e}");
    let bare: Pod = serde_json::from_value(json!({"metadata": {"name": "bare"}})).unwrap();
    let e = pod_sets(&[bare]).unwrap_err();
    assert!(e.contains("bare"), "{e}");
}

fn node(name: &str, created: &str, ready: bool) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": created},
        "status": {"conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}
    }))
    .unwrap()
}

#[test]
fn nodes_created_since_the_request_are_its_nodes() {
    let nodes = [
        node("old", "2026-01-01T00:00:09Z", true),
        node("new-b", "2026-01-01T00:00:10Z", true),
        node("new-a", "2026-01-01T00:01:00Z", true),
        node("booting", "2026-01-01T00:01:00Z", false),
    ];
    // the request was made at 00:00:10.400 (whole seconds on the API)
    let got = new_nodes(&nodes, 1_767_225_610_400);
    assert_eq!(got, vec!["new-a".to_string(), "new-b".to_string()]);
}

#[test]
fn provisioned_nodes_are_reserved_one_per_member_as_they_come() {
    let mut r = Reservations::default();
    let members = vec!["u0".to_string(), "u1".to_string(), "u2".to_string()];
    // the request was made at 00:00:10.400; one node was there already
    let since = 1_767_225_610_400;
    let noms = r.reserve("ml/train", since, members.clone(), &["a".to_string()]);
    assert_eq!(noms, vec![("u0".to_string(), "a".to_string())]);
    // the same again adds nothing
    assert!(
        r.reserve("ml/train", since, members.clone(), &["a".to_string()])
            .is_empty()
    );
    // a node older than the request is not its node
    assert_eq!(r.on_new_node("old", 1_767_225_609_999), None);
    // nodes registering later are (from the start of the request's second)
    assert_eq!(
        r.on_new_node("b", 1_767_225_610_000),
        Some(("u1".to_string(), "b".to_string()))
    );
    assert_eq!(
        r.on_new_node("c", 1_767_225_700_000),
        Some(("u2".to_string(), "c".to_string()))
    );
    // one node per member: a fourth is not held
    assert_eq!(r.on_new_node("d", 1_767_225_700_000), None);
    // the reservation ends: its nominations go
    let mut gone = r.retain(&BTreeSet::new());
    gone.sort();
    assert_eq!(gone, members);
    assert_eq!(r.on_new_node("e", 1_767_225_700_000), None);
    // members bound (no longer pending): the held nodes go to those left,
    // without listing the nodes again
    let mut r = Reservations::default();
    r.reserve(
        "ml/train",
        since,
        members.clone(),
        &["a".to_string(), "b".to_string()],
    );
    assert_eq!(
        r.reserve("ml/train", since, vec!["u1".into(), "u2".into()], &[]),
        vec![
            ("u1".to_string(), "a".to_string()),
            ("u2".to_string(), "b".to_string())
        ]
    );
    // a gang whose pending members changed keeps its nodes for them
    let mut r = Reservations::default();
    r.reserve(
        "ml/train",
        since,
        members.clone(),
        &["a".to_string(), "b".to_string()],
    );
    let noms = r.reserve(
        "ml/train",
        since,
        vec!["u2".to_string()],
        &["a".to_string(), "b".to_string()],
    );
    assert_eq!(noms, vec![("u2".to_string(), "a".to_string())]);
    assert_eq!(
        r.retain(&BTreeSet::from(["ml/train".to_string()])),
        Vec::<String>::new()
    );
}

#[test]
fn the_request_state_comes_from_its_annotations() {
    let mut pr: ProvisioningRequest = serde_json::from_value(json!({
        "apiVersion": "autoscaling.x-k8s.io/v1", "kind": "ProvisioningRequest",
        "metadata": {"name": "gpusched-train-1", "namespace": "ml",
                     "creationTimestamp": "2026-01-01T00:00:10Z",
                     "annotations": {ANNOTATION_GANG: "ml/train", ANNOTATION_ATTEMPT: "1"}},
        "spec": {"provisioningClassName": CLASS_BEST_EFFORT_ATOMIC,
                 "podSets": [{"podTemplateRef": {"name": "t"}, "count": 2}]},
        "status": {"conditions": [{"type": "Provisioned", "status": "True",
                   "reason": "Provisioned", "message": "", "lastTransitionTime": "2026-01-01T00:00:20Z"}]}
    }))
    .unwrap();
    let (g, s) = pr_state(&pr).unwrap();
    assert_eq!(g, "ml/train");
    assert_eq!(s.attempt, 1);
    assert_eq!(s.created_ms, 1_767_225_610_000);
    assert_eq!(s.phase, PrPhase::Provisioned);
    // not ours (no annotations) or unreadable: left alone
    pr.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_ATTEMPT.into(), "x".into());
    assert!(pr_state(&pr).is_none());
    pr.metadata.annotations = None;
    assert!(pr_state(&pr).is_none());
}

/// A cycle of the real scheduler over: one 8-GPU node; gang `big` (2 × 8
/// GPUs: more nodes would help), gang `capped` in a queue limited to one
/// GPU (quota), gang `short` (min 3, 2 members), gang `small` (fits).
#[test]
fn the_gangs_of_a_cycle_say_which_need_capacity() {
    let mut capped = tk::queue("capped");
    capped.limit = Some(gpusched_model::ResourceLimit {
        gpu_milli: Some(1000),
        ..Default::default()
    });
    let nodes = vec![tk::node("n0").gpus(8).build()];
    let groups = vec![
        tk::gang("ml/big", "default", 2),
        tk::gang("ml/capped", "capped", 2),
        tk::gang("ml/short", "default", 3),
        tk::gang("ml/small", "default", 1),
    ];
    let pods = vec![
        tk::pod("ml/big-0").gpus(8).group("ml/big").build(),
        tk::pod("ml/big-1").gpus(8).group("ml/big").build(),
        tk::pod("ml/capped-0")
            .gpus(1)
            .queue("capped")
            .group("ml/capped")
            .build(),
        tk::pod("ml/capped-1")
            .gpus(1)
            .queue("capped")
            .group("ml/capped")
            .build(),
        tk::pod("ml/short-0").gpus(1).group("ml/short").build(),
        tk::pod("ml/short-1").gpus(1).group("ml/short").build(),
        tk::pod("ml/small-0").gpus(1).group("ml/small").build(),
    ];
    let refs = pods
        .iter()
        .map(|p| {
            let name = p.name.split_once('/').unwrap().1.to_string();
            PodRef {
                uid: format!("uid-{name}"),
                namespace: "ml".into(),
                name,
            }
        })
        .collect();
    let snapshot = tk::snapshot(nodes, vec![tk::queue("default"), capped], groups, pods);
    let built = Built {
        snapshot,
        pods: refs,
        ..Default::default()
    };
    let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
    let out = s.cycle(&built.snapshot, 0, 1);
    let classes = gpusched_core::report::classify::classify_cycle(&out, &built.snapshot);
    let g = gangs(&built, &out, &classes);
    assert_eq!(g["ml/big"].blocked, Blocked::Capacity, "{g:?}");
    assert_eq!(g["ml/big"].namespace, "ml");
    assert_eq!(
        g["ml/big"]
            .pending
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        vec!["big-0", "big-1"]
    );
    assert_eq!(g["ml/capped"].blocked, Blocked::Held("QueueQuota".into()));
    assert_eq!(
        g["ml/short"].blocked,
        Blocked::Held("GangIncomplete".into())
    );
    // bound this cycle: not pending
    assert!(!g.contains_key("ml/small"), "{g:?}");
    // and the plans: only the capacity-blocked gang gets a request
    for (k, st) in &g {
        let want = if k == "ml/big" {
            Next::Create { attempt: 1 }
        } else {
            Next::Nothing
        };
        assert_eq!(decide(Some(st), &[], 0, &cfg()).next, want, "{k}");
    }
}

fn gpu_node(name: &str, created: &str) -> Node {
    let mut n = crate::kwok::node_object(&tk::node(name).gpus(8).build());
    n.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        created.parse().unwrap(),
    ));
    n.status
        .get_or_insert_with(Default::default)
        .conditions
        .get_or_insert_with(Vec::new)
        .push(serde_json::from_value(json!({"type": "Ready", "status": "True"})).unwrap());
    n
}

/// The race the reservation closes: a node that registers after the
/// request is provisioned is nominated to the gang by the same world update
/// that adds it, so the first snapshot that has the node already holds it
/// for the gang.
#[test]
fn a_node_that_registers_for_a_provisioned_gang_is_its_in_the_first_snapshot() {
    let mut w = crate::world::World::default();
    for i in 0..2 {
        let mut p = pod(&format!("w-{i}"), "8", &i.to_string());
        p.metadata.creation_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            "2026-01-01T00:00:00Z".parse().unwrap(),
        ));
        w.upsert_pod(&p);
    }
    // provisioned; one node was there already, the other registers later
    assert!(w.reserve_provisioned(
        "ml/train",
        1_767_225_610_400,
        vec!["uid-w-0".into(), "uid-w-1".into()],
        &["n-a".to_string()],
    ));
    w.upsert_node(&gpu_node("n-a", "2026-01-01T00:00:10Z"));
    w.upsert_node(&gpu_node("old", "2026-01-01T00:00:05Z"));
    w.upsert_node(&gpu_node("n-b", "2026-01-01T00:01:00Z"));
    let built = w.build();
    let node_id = |name: &str| {
        built
            .snapshot
            .nodes
            .iter()
            .position(|n| n.name == name)
            .unwrap() as u32
    };
    let nominated: BTreeMap<String, Option<u32>> = built
        .pods
        .iter()
        .zip(&built.snapshot.pods)
        .map(|(r, ps)| match ps.phase {
            gpusched_core::PodPhase::Pending { nominated, .. } => (r.name.clone(), nominated),
            _ => (r.name.clone(), None),
        })
        .collect();
    assert_eq!(nominated["w-0"], Some(node_id("n-a")), "{nominated:?}");
    assert_eq!(nominated["w-1"], Some(node_id("n-b")), "{nominated:?}");
    // the request goes: so do the reservations
    assert!(w.retain_provisioned(&BTreeSet::new()));
    let built = w.build();
    assert!(built.snapshot.pods.iter().all(|ps| matches!(
        ps.phase,
        gpusched_core::PodPhase::Pending {
            nominated: None,
            nominated_at_ms: None
        }
    )));
}

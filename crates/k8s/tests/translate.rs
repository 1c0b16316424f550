//! Fixture tests of the pure translation: Kubernetes objects (as the API
//! serves them) → the core's vocabulary, and the world → snapshot.

use gpusched_core::{GpuAssignment, PodPhase};
use gpusched_k8s::crd::{PodGroup, Queue, SpPodGroup};
use gpusched_k8s::decision::ANNOTATION_DECISION;
use gpusched_k8s::translate::{self, PodKind};
use gpusched_k8s::world::{Assumed, Problem, World};
use gpusched_model::{GpuHealth, GpuRequest, NodeNameRequirement};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use serde_json::{Value, json};

fn pod(v: Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

fn gpu_pod(name: &str, limits: Value, requests: Value) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z",
                     "labels": {"gpusched.io/queue": "research"}},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": limits, "requests": requests}}]},
        "status": {"phase": "Pending"}
    })
}

fn node(name: &str, gpus: u32, ready: bool) -> Value {
    json!({
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100-SXM5-80GB", "nvidia.com/gpu.memory": "81559"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
            "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]
        }
    })
}

#[test]
fn pending_gpu_pod_limits_only() {
    let v = translate::pod(&pod(gpu_pod(
        "a",
        json!({"nvidia.com/gpu": "2", "cpu": "4"}),
        json!({}),
    )));
    let PodKind::Pending { pod, nominated } = v.kind else {
        panic!("{:?}", v.kind)
    };
    assert_eq!(pod.gpu, GpuRequest::Whole(2));
    assert_eq!(pod.requests.cpu_milli, 4000);
    assert_eq!(pod.queue, "research");
    assert_eq!(pod.name, "ml/a");
    assert_eq!(nominated, None);
    assert_eq!(pod.arrival_ms, 1_796_119_200_000);
}

#[test]
fn fractional_gpu_and_unequal_requests_are_refused_naming_the_field() {
    let v = translate::pod(&pod(gpu_pod(
        "f",
        json!({"nvidia.com/gpu": "0.5"}),
        json!({}),
    )));
    let PodKind::Invalid { error } = v.kind else {
        panic!("{:?}", v.kind)
    };
    // the pod is named where the error is shown (its event, condition,
    // explain, doctor, the log line): not again in the error (#39: "pod
    // ml/f: pod ml/f: container …")
    assert!(
        !error.contains("ml/f") && error.contains("\"main\"") && error.contains("nvidia.com/gpu"),
        "{error}"
    );
    assert!(error.starts_with("container \"main\""), "{error}");
    let v = translate::pod(&pod(gpu_pod(
        "u",
        json!({"nvidia.com/gpu": "2"}),
        json!({"nvidia.com/gpu": "1"}),
    )));
    let PodKind::Invalid { error } = v.kind else {
        panic!("{:?}", v.kind)
    };
    assert!(error.contains("must equal limit"), "{error}");
}

#[test]
fn gated_pods_wait() {
    let mut p = gpu_pod("g", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["schedulingGates"] = json!([{"name": "kueue.x-k8s.io/admission"}]);
    let v = translate::pod(&pod(p));
    assert_eq!(
        v.kind,
        PodKind::Gated {
            gates: vec!["kueue.x-k8s.io/admission".into()]
        }
    );
}

#[test]
fn pods_of_other_schedulers_count_when_bound_only() {
    let mut p = gpu_pod("o", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["schedulerName"] = json!("default-scheduler");
    p["metadata"]["labels"] = json!({});
    assert_eq!(translate::pod(&pod(p.clone())).kind, PodKind::Ignored);
    p["spec"]["nodeName"] = json!("n1");
    p["status"]["phase"] = json!("Running");
    let v = translate::pod(&pod(p.clone()));
    let PodKind::Bound {
        pod: mp,
        node,
        terminating,
        decision,
    } = v.kind
    else {
        panic!()
    };
    assert_eq!(node, "n1");
    assert_eq!(mp.queue, "");
    assert!(!mp.preemptible);
    assert!(!terminating);
    assert!(decision.is_none());
    // finished: holds nothing unless its node's agent still lists it
    // (the world decides; issue 38, item 6)
    p["status"]["phase"] = json!("Succeeded");
    assert!(matches!(
        translate::pod(&pod(p)).kind,
        PodKind::Finished { node, pod } if node == "n1" && !pod.preemptible
    ));
}

#[test]
fn init_containers_take_the_max_and_sidecars_add() {
    let p = pod(json!({
        "metadata": {"name": "i", "namespace": "ml", "uid": "u"},
        "spec": {"schedulerName": "gpusched",
            "initContainers": [
                {"name": "warm", "resources": {"limits": {"nvidia.com/gpu": "4"}, "requests": {"cpu": "8"}}},
                {"name": "side", "restartPolicy": "Always", "resources": {"requests": {"cpu": "1"}}}
            ],
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": "2"}, "requests": {"cpu": "2"}}}]}
    }));
    let (r, g) = translate::effective_resources(&p).unwrap();
    assert_eq!(g, GpuRequest::Whole(4));
    assert_eq!(r.cpu_milli, 8000);
}

#[test]
fn nodes_not_ready_are_unschedulable_and_gpus_follow_allocatable() {
    let n: Node = serde_json::from_value(node("n1", 8, false)).unwrap();
    let v = translate::node(&n);
    assert!(!v.ready && v.node.unschedulable);
    assert_eq!(v.node.gpus.len(), 8);
    assert_eq!(v.node.gpus[0].memory_mib, 81559);
    // the agent's annotation lists 8 GPUs, GPU 3 unhealthy; the kubelet
    // reports 6 allocatable: one more is taken out, from the top
    let mut raw = node("n2", 6, true);
    let gpus: Vec<Value> = (0..8)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100", "memoryMiB": 81920, "nvlink": 0, "healthy": i != 3}))
        .collect();
    raw["metadata"]["annotations"] =
        json!({"gpusched.io/gpus": serde_json::to_string(&gpus).unwrap()});
    let v = translate::node(&serde_json::from_value(raw).unwrap());
    let with = |h: GpuHealth| -> Vec<u32> {
        v.node
            .gpus
            .iter()
            .filter(|g| g.health == h)
            .map(|g| g.index)
            .collect()
    };
    // GPU 3 failed; GPU 7 is not offered by the kubelet (not "unhealthy")
    assert_eq!(with(GpuHealth::Unhealthy), vec![3]);
    assert_eq!(with(GpuHealth::NotAllocatable), vec![7]);
    assert_eq!(v.node.allocatable.gpu_milli, 6000);
    // a broken annotation is a warning, not a lost node
    let mut raw = node("n3", 4, true);
    raw["metadata"]["annotations"] = json!({"gpusched.io/gpus": "[{"});
    let v = translate::node(&serde_json::from_value(raw).unwrap());
    assert_eq!(v.node.gpus.len(), 4);
    assert!(
        v.warnings[0].contains("gpusched.io/gpus"),
        "{:?}",
        v.warnings
    );
}

#[test]
fn world_builds_a_snapshot_with_decisions_assumptions_and_others() {
    let mut w = World::default();
    w.upsert_node(&serde_json::from_value(node("n1", 8, true)).unwrap());
    // a pod placed by gpusched on GPUs 6,7
    let mut placed = gpu_pod("placed", json!({"nvidia.com/gpu": "2"}), json!({}));
    placed["spec"]["nodeName"] = json!("n1");
    let snap_node = translate::node(&serde_json::from_value(node("n1", 8, true)).unwrap()).node;
    let d = gpusched_k8s::decision::make(
        "uid-placed",
        &snap_node,
        1,
        &GpuAssignment::Whole(vec![6, 7]),
    );
    placed["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
    w.upsert_pod(&pod(placed));
    // a pod of another scheduler: gets the lowest free GPUs
    let mut other = gpu_pod("other", json!({"nvidia.com/gpu": "3"}), json!({}));
    other["spec"]["schedulerName"] = json!("default-scheduler");
    other["spec"]["nodeName"] = json!("n1");
    w.upsert_pod(&pod(other));
    // a pending pod, assumed on GPU 3
    w.upsert_pod(&pod(gpu_pod(
        "pending",
        json!({"nvidia.com/gpu": "1"}),
        json!({}),
    )));
    w.assume(
        "uid-pending",
        Assumed {
            node: "n1".into(),
            decision: gpusched_k8s::decision::make(
                "uid-pending",
                &snap_node,
                2,
                &GpuAssignment::Whole(vec![3]),
            ),
            gpus: GpuAssignment::Whole(vec![3]),
        },
    );
    // a forged decision (another pod's uid)
    let mut forged = gpu_pod("forged", json!({"nvidia.com/gpu": "1"}), json!({}));
    forged["spec"]["nodeName"] = json!("n1");
    forged["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
    w.upsert_pod(&pod(forged));
    let b = w.build();
    let by_name = |n: &str| {
        let i = b.pods.iter().position(|p| p.name == n).unwrap();
        &b.snapshot.pods[i]
    };
    assert_eq!(
        by_name("placed").phase,
        PodPhase::Running {
            node: 0,
            gpus: GpuAssignment::Whole(vec![6, 7]),
            since_ms: 1_796_119_200_000
        }
    );
    assert!(
        matches!(&by_name("pending").phase, PodPhase::Running { gpus: GpuAssignment::Whole(g), .. } if g == &vec![3])
    );
    let PodPhase::Running {
        gpus: GpuAssignment::Whole(og),
        ..
    } = &by_name("other").phase
    else {
        panic!()
    };
    let PodPhase::Running {
        gpus: GpuAssignment::Whole(fg),
        ..
    } = &by_name("forged").phase
    else {
        panic!()
    };
    let mut all: Vec<u32> = og.iter().chain(fg).copied().chain([3, 6, 7]).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 7, "no GPU counted twice: {og:?} {fg:?}");
    assert!(b.problems.iter().any(|p| matches!(p, Problem::BadDecision { pod, error } if pod.name == "forged" && error.contains("pod uid"))), "{:?}", b.problems);
    // the default queue exists implicitly; research does not
    assert!(b.snapshot.queues.iter().any(|q| q.name == "default"));
    // confirming the binding drops the assumption
    let mut bound = gpu_pod("pending", json!({"nvidia.com/gpu": "1"}), json!({}));
    bound["spec"]["nodeName"] = json!("n1");
    w.upsert_pod(&pod(bound));
    assert_eq!(w.assumed_len(), 0);
}

#[test]
fn queues_groups_and_priorities() {
    let mut w = World::default();
    let q: Queue = serde_json::from_value(json!({"metadata": {"name": "research"},
        "spec": {"weight": 2, "guaranteed": {"nvidia.com/gpu": "8", "cpu": "100"}, "limit": {"nvidia.com/gpu": "16"}}})).unwrap();
    w.upsert_queue(&q);
    let bad: Queue = serde_json::from_value(json!({"metadata": {"name": "bad"},
        "spec": {"guaranteed": {"nvidia.com/gpu": "1.5"}}}))
    .unwrap();
    w.upsert_queue(&bad);
    let cyc_a: Queue =
        serde_json::from_value(json!({"metadata": {"name": "a"}, "spec": {"parent": "b"}}))
            .unwrap();
    let cyc_b: Queue =
        serde_json::from_value(json!({"metadata": {"name": "b"}, "spec": {"parent": "a"}}))
            .unwrap();
    w.upsert_queue(&cyc_a);
    w.upsert_queue(&cyc_b);
    let pc: PriorityClass =
        serde_json::from_value(json!({"metadata": {"name": "high"}, "value": 1000})).unwrap();
    w.upsert_priority_class(&pc);
    let g: PodGroup = serde_json::from_value(json!({"metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 4, "priorityClassName": "high", "topology": {"level": "nvlink-domain"}, "scheduleTimeoutSeconds": 60}})).unwrap();
    w.upsert_group(&g);
    let sp: SpPodGroup = serde_json::from_value(
        json!({"metadata": {"name": "legacy", "namespace": "ml"}, "spec": {"minMember": 2}}),
    )
    .unwrap();
    w.upsert_sp_group(&sp);
    let zero: PodGroup = serde_json::from_value(
        json!({"metadata": {"name": "zero", "namespace": "ml"}, "spec": {"minMember": 0}}),
    )
    .unwrap();
    w.upsert_group(&zero);
    let mut member = gpu_pod("m0", json!({"nvidia.com/gpu": "1"}), json!({}));
    member["metadata"]["labels"]["gpusched.io/pod-group"] = json!("train");
    w.upsert_pod(&pod(member));
    let b = w.build();
    let rq = b
        .snapshot
        .queues
        .iter()
        .find(|q| q.name == "research")
        .unwrap();
    assert_eq!(rq.weight, 2);
    assert_eq!(rq.guarantee.gpu_milli, 8000);
    assert_eq!(rq.limit.as_ref().unwrap().gpu_milli, Some(16000));
    // The limit names only GPUs: CPU and memory stay uncapped.
    assert_eq!(rq.limit.as_ref().unwrap().cpu_milli, None);
    assert_eq!(rq.limit.as_ref().unwrap().memory, None);
    let problems = format!("{:?}", b.problems);
    assert!(
        problems.contains("queue bad") && problems.contains("spec.guaranteed[nvidia.com/gpu]"),
        "{problems}"
    );
    assert!(
        problems.contains("cycle") || problems.contains("\"a\""),
        "{problems}"
    );
    assert!(problems.contains("spec.minMember"), "{problems}");
    let train = b
        .snapshot
        .groups
        .iter()
        .find(|g| g.name == "ml/train")
        .unwrap();
    assert_eq!(train.priority, 1000);
    assert_eq!(train.queue, "research", "the members' queue label");
    assert_eq!(train.schedule_timeout_ms, Some(60_000));
    assert!(train.topology.unwrap().required);
    assert!(
        b.snapshot
            .groups
            .iter()
            .any(|g| g.name == "ml/legacy" && g.min_member == 2)
    );
    assert_eq!(b.pending_by_queue.get("research"), Some(&1));
}

#[test]
fn disruption_budgets_allowed_like_the_disruption_controller() {
    let p: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "b", "namespace": "ml", "generation": 1},
        "spec": {"minAvailable": "50%", "selector": {"matchLabels": {"app": "x"}}}}))
    .unwrap();
    let v = translate::pdb(&p);
    assert_eq!(v.allowed(4, 4), 2);
    assert_eq!(v.allowed(4, 2), 0);
    assert_eq!(v.allowed(3, 3), 1, "50% of 3 rounds up to 2");
    let p: k8s_openapi::api::policy::v1::PodDisruptionBudget = serde_json::from_value(json!({
        "metadata": {"name": "b", "namespace": "ml", "generation": 2},
        "spec": {"maxUnavailable": 1, "selector": {"matchExpressions": [{"key": "app", "operator": "In", "values": ["x"]}]}},
        "status": {"observedGeneration": 2, "disruptionsAllowed": 0, "currentHealthy": 5, "desiredHealthy": 4, "expectedPods": 5}})).unwrap();
    let v = translate::pdb(&p);
    assert_eq!(v.allowed(5, 5), 0, "the controller's current figure wins");
    let sel = v.selector.unwrap();
    let mut labels = std::collections::BTreeMap::new();
    assert!(!translate::selects(&sel, &labels));
    labels.insert("app".to_string(), "x".to_string());
    assert!(translate::selects(&sel, &labels));
}

#[test]
fn movable_comes_from_the_label_or_annotation_and_the_queue() {
    let model = |p: Value| translate::model_pod(&pod(p));
    let base = gpu_pod("mv", json!({"nvidia.com/gpu": "1"}), json!({}));
    assert!(!model(base.clone()).unwrap().movable, "opt-in only");
    let mut by_label = base.clone();
    by_label["metadata"]["labels"]["gpusched.io/movable"] = json!("true");
    assert!(model(by_label.clone()).unwrap().movable);
    let mut by_annotation = base.clone();
    by_annotation["metadata"]["annotations"] = json!({"gpusched.io/movable": "true"});
    assert!(model(by_annotation).unwrap().movable);
    let mut off = base.clone();
    off["metadata"]["labels"]["gpusched.io/movable"] = json!("false");
    assert!(!model(off).unwrap().movable);
    // a typo is an error naming the field (the pod is named where it is
    // shown), never a silent no
    let mut bad = base;
    bad["metadata"]["annotations"] = json!({"gpusched.io/movable": "yes"});
    let PodKind::Invalid { error } = translate::pod(&pod(bad)).kind else {
        panic!("a bad flag must be refused")
    };
    assert!(
        !error.contains("ml/mv")
            && error.contains("metadata.annotations[gpusched.io/movable]")
            && error.contains("\"yes\""),
        "{error}"
    );
    // the queue's field
    let q: Queue =
        serde_json::from_value(json!({"metadata": {"name": "batch"}, "spec": {"movable": true}}))
            .unwrap();
    assert!(translate::queue(&q).unwrap().movable);
    let q: Queue =
        serde_json::from_value(json!({"metadata": {"name": "batch"}, "spec": {}})).unwrap();
    assert!(!translate::queue(&q).unwrap().movable, "default false");
}

#[test]
fn scheduler_names_decide_which_pods_are_ours() {
    let mut p = gpu_pod("n", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["schedulerName"] = json!("gpusched-batch");
    let p = pod(p);
    // the default name does not take it, a scheduler named so does
    assert_eq!(translate::pod(&p).kind, PodKind::Ignored);
    assert!(!translate::pod(&p).ours);
    let v = translate::pod_for(&p, &["gpusched", "gpusched-batch"]);
    assert!(v.ours);
    assert!(matches!(v.kind, PodKind::Pending { .. }), "{:?}", v.kind);
    // and a world built for that name sees it pending
    let mut w = World::for_scheduler_names(vec!["gpusched-batch".into()]);
    w.upsert_pod(&p);
    assert!(w.pod("uid-n").is_some_and(|v| v.ours));
    let mut w = World::default();
    w.upsert_pod(&p);
    assert!(w.pod("uid-n").is_some_and(|v| !v.ours));
}

/// Regression (seen in the try-out: a 4 × 8-GPU gang of queue research
/// counted in the queue default): a gang member is in its group's queue,
/// pending or bound, whatever its own label says.
#[test]
fn gang_members_count_in_their_groups_queue() {
    let mut w = World::default();
    for name in ["research", "default"] {
        let q: Queue =
            serde_json::from_value(json!({"metadata": {"name": name}, "spec": {}})).unwrap();
        w.upsert_queue(&q);
    }
    let g: PodGroup =
        serde_json::from_value(json!({"metadata": {"name": "train", "namespace": "ml"},
        "spec": {"minMember": 2, "queue": "research"}}))
        .unwrap();
    w.upsert_group(&g);
    let mut n = node("n1", 8, true);
    n["metadata"]["name"] = json!("n1");
    w.upsert_node(&serde_json::from_value::<Node>(n).unwrap());
    for (name, bound) in [("m0", true), ("m1", false)] {
        let mut p = gpu_pod(name, json!({"nvidia.com/gpu": "1"}), json!({}));
        p["metadata"]["labels"] = json!({"gpusched.io/pod-group": "train"});
        if bound {
            p["spec"]["nodeName"] = json!("n1");
            p["status"]["phase"] = json!("Running");
        }
        w.upsert_pod(&pod(p));
    }
    // a pod without a group keeps its own queue
    let mut lone = gpu_pod("lone", json!({"nvidia.com/gpu": "1"}), json!({}));
    lone["metadata"]["labels"] = json!({});
    w.upsert_pod(&pod(lone));
    let b = w.build();
    let queue_of = |n: &str| {
        b.snapshot
            .pods
            .iter()
            .find(|p| p.pod.name == format!("ml/{n}"))
            .map(|p| p.pod.queue.clone())
            .unwrap()
    };
    assert_eq!(queue_of("m0"), "research");
    assert_eq!(queue_of("m1"), "research");
    assert_eq!(queue_of("lone"), "default");
}

/// Required node affinity goes through the one node-term reader: an
/// operator gpusched does not understand, or a `matchFields` entry
/// Kubernetes does not define (a field other than `metadata.name`, an
/// operator other than In/NotIn, other than one value), is refused naming
/// the term and the entry.
#[test]
fn unsupported_node_affinity_operators_are_refused_naming_the_term() {
    let mut v = gpu_pod("g", json!({"nvidia.com/gpu": "1"}), json!({}));
    let term = |e: Value| {
        json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}, e]}}})
    };
    v["spec"]["affinity"] = term(json!({"matchExpressions": [
        {"key": "gpus", "operator": "Foo", "values": ["4"]}]}));
    let PodKind::Invalid { error } = translate::pod(&pod(v.clone())).kind else {
        panic!("accepted")
    };
    assert!(
        error.contains("nodeSelectorTerms[1].matchExpressions[0]") && error.contains("\"Foo\""),
        "{error}"
    );
    // Gt and Lt need exactly one integer
    for bad in [json!(["4", "5"]), json!(["four"]), json!([])] {
        v["spec"]["affinity"] = term(json!({"matchExpressions": [
            {"key": "gpus", "operator": "Gt", "values": bad}]}));
        let PodKind::Invalid { error } = translate::pod(&pod(v.clone())).kind else {
            panic!("accepted {bad}")
        };
        assert!(
            error.contains("nodeSelectorTerms[1].matchExpressions[0].values")
                && error.contains("exactly one integer"),
            "{error}"
        );
    }
    for (field, bad, says) in [
        (
            "key",
            json!({"key": "metadata.namespace", "operator": "In", "values": ["n1"]}),
            "\"metadata.namespace\" is not a node field selector key",
        ),
        (
            "operator",
            json!({"key": "metadata.name", "operator": "Exists"}),
            "\"Exists\" is not valid for a node field selector",
        ),
        (
            "values",
            json!({"key": "metadata.name", "operator": "In", "values": ["n1", "n2"]}),
            "exactly one value",
        ),
        (
            "values",
            json!({"key": "metadata.name", "operator": "NotIn"}),
            "exactly one value",
        ),
    ] {
        v["spec"]["affinity"] = term(json!({"matchFields": [
            {"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}, bad]}));
        let PodKind::Invalid { error } = translate::pod(&pod(v.clone())).kind else {
            panic!("accepted {field}")
        };
        assert!(
            error.contains(&format!("nodeSelectorTerms[1].matchFields[1].{field}"))
                && error.contains(says),
            "{error}"
        );
    }
    // matchFields on the node's name translates: In / NotIn with one value,
    // ANDed with the term's expressions
    v["spec"]["affinity"] = term(json!({
        "matchExpressions": [{"key": "zone", "operator": "Exists"}],
        "matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n1"]},
            {"key": "metadata.name", "operator": "NotIn", "values": ["n2"]}]}));
    let PodKind::Pending { pod: p, .. } = translate::pod(&pod(v.clone())).kind else {
        panic!("refused")
    };
    assert_eq!(p.affinity.len(), 2);
    assert_eq!(
        p.affinity[1].match_fields,
        vec![
            NodeNameRequirement {
                is_in: true,
                name: "n1".into()
            },
            NodeNameRequirement {
                is_in: false,
                name: "n2".into()
            }
        ]
    );
    let zone: std::collections::BTreeMap<String, String> =
        [("zone".to_string(), "b".to_string())].into();
    assert!(p.affinity[1].matches("n1", &zone));
    assert!(!p.affinity[1].matches("n2", &zone), "NotIn");
    assert!(!p.affinity[1].matches("n3", &zone), "In");
    assert!(
        !p.affinity[1].matches("n1", &Default::default()),
        "ANDed with the expressions"
    );
    // the supported ones translate
    for (op, values) in [
        ("NotIn", json!(["b"])),
        ("Gt", json!(["4"])),
        ("Lt", json!(["-2"])),
    ] {
        v["spec"]["affinity"] = term(json!({"matchExpressions": [
            {"key": "zone", "operator": op, "values": values}]}));
        assert!(
            matches!(
                translate::pod(&pod(v.clone())).kind,
                PodKind::Pending { .. }
            ),
            "{op} refused"
        );
    }
}

#[test]
fn affinity_namespace_selectors_resolve_to_the_namespaces_watched() {
    let mut w = World::default();
    w.upsert_node(&serde_json::from_value(node("n1", 8, true)).unwrap());
    for (ns, team) in [("team-a1", "a"), ("team-a2", "a"), ("team-b", "b")] {
        w.upsert_namespace(
            &serde_json::from_value(json!({"metadata": {"name": ns, "labels": {"team": team}}}))
                .unwrap(),
        );
    }
    let mut p = gpu_pod("picky", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "kubernetes.io/hostname",
         "namespaceSelector": {"matchLabels": {"team": "a"}}}]}});
    w.upsert_pod(&pod(p));
    let selected = |w: &World| {
        let b = w.build();
        b.snapshot.pods[0].pod.constraints().required_affinity[0]
            .selected_namespaces
            .clone()
    };
    assert_eq!(selected(&w), ["team-a1", "team-a2"]);
    // a namespace relabelled: the next snapshot follows
    w.upsert_namespace(
        &serde_json::from_value(json!({"metadata": {"name": "team-b", "labels": {"team": "a"}}}))
            .unwrap(),
    );
    assert_eq!(selected(&w), ["team-a1", "team-a2", "team-b"]);
    w.remove(gpusched_k8s::world::ObjectKind::Namespace, "team-a1");
    assert_eq!(selected(&w), ["team-a2", "team-b"]);
}

/// Node `n1` (8 GPUs) whose agent lists `held` (pod uid, name, GPU
/// positions) in its allocations annotation.
fn node_listing(held: &[(&str, &str, &[usize])]) -> Node {
    use gpusched_model::protocol::{ALLOCATIONS_VERSION, NodeAllocations, PodAllocation};
    let mut n: Node = serde_json::from_value(node("n1", 8, true)).unwrap();
    let gpus = translate::node(&n).node.gpus;
    let a = NodeAllocations {
        v: ALLOCATIONS_VERSION,
        agent: String::new(),
        pods: held
            .iter()
            .map(|(uid, name, g)| PodAllocation {
                uid: uid.to_string(),
                namespace: "ml".into(),
                name: name.to_string(),
                gpus: g.iter().map(|&i| gpus[i].uuid.clone()).collect(),
                milli: None,
                mig: Vec::new(),
            })
            .collect(),
    };
    n.metadata.annotations = Some(
        [(
            gpusched_model::protocol::ANNOTATION_NODE_ALLOCATIONS.to_string(),
            a.to_annotation(),
        )]
        .into(),
    );
    n
}

fn phase_of(w: &World, name: &str) -> Option<PodPhase> {
    let b = w.build();
    let i = b.pods.iter().position(|p| p.name == name)?;
    Some(b.snapshot.pods[i].phase.clone())
}

/// Issue 38, item 5: a pod created with `spec.nodeName` (no decision) is
/// counted on the GPUs its node's agent says the kubelet gave it, not on
/// the lowest free ones.
#[test]
fn a_bypassing_pod_is_counted_on_the_gpus_its_node_says_it_holds() {
    let mut w = World::default();
    let mut p = gpu_pod("bypass", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["nodeName"] = json!("n1");
    p["status"]["phase"] = json!("Running");
    w.upsert_node(&node_listing(&[("uid-bypass", "bypass", &[5])]));
    w.upsert_pod(&pod(p));
    assert!(
        matches!(
            phase_of(&w, "bypass"),
            Some(PodPhase::Running { gpus: GpuAssignment::Whole(g), .. }) if g == vec![5]
        ),
        "{:?}",
        phase_of(&w, "bypass")
    );
}

/// Issue 38, item 6: `status.phase: Failed` (anyone's with pods/status)
/// does not free the GPUs of a pod its node's agent still lists; once the
/// agent no longer lists it, they are free.
#[test]
fn a_failed_status_frees_nothing_the_node_still_lists() {
    let mut w = World::default();
    let n: Node = serde_json::from_value(node("n1", 8, true)).unwrap();
    let snap_node = translate::node(&n).node;
    let mut p = gpu_pod("runner", json!({"nvidia.com/gpu": "2"}), json!({}));
    p["spec"]["nodeName"] = json!("n1");
    let d = gpusched_k8s::decision::make(
        "uid-runner",
        &snap_node,
        1,
        &GpuAssignment::Whole(vec![2, 3]),
    );
    p["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
    p["status"]["phase"] = json!("Failed");
    w.upsert_node(&node_listing(&[("uid-runner", "runner", &[2, 3])]));
    w.upsert_pod(&pod(p));
    let s = w.snapshot();
    assert_eq!(gpusched_k8s::world::first_difference(&s, &w.build()), None);
    assert!(
        matches!(
            phase_of(&w, "runner"),
            Some(PodPhase::Running { gpus: GpuAssignment::Whole(g), .. }) if g == vec![2, 3]
        ),
        "{:?}",
        phase_of(&w, "runner")
    );
    // the agent no longer lists it: it holds nothing
    w.upsert_node(&node_listing(&[]));
    let s = w.snapshot();
    assert_eq!(gpusched_k8s::world::first_difference(&s, &w.build()), None);
    assert_eq!(phase_of(&w, "runner"), None);
}

/// Issue 38, item 6: a `PodScheduled` time in the future does not make a
/// pod "younger than its minimum runtime" for ever: its start is never
/// later than when the scheduler first saw it bound.
#[test]
fn a_scheduled_time_in_the_future_is_clamped_to_when_it_was_seen() {
    let mut w = World::default();
    w.upsert_node(&serde_json::from_value(node("n1", 8, true)).unwrap());
    let mut p = gpu_pod("forever-young", json!({"nvidia.com/gpu": "1"}), json!({}));
    p["spec"]["nodeName"] = json!("n1");
    p["status"] = json!({"phase": "Running", "conditions": [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2100-01-01T00:00:00Z"}]});
    w.upsert_pod(&pod(p));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    let Some(PodPhase::Running { since_ms, .. }) = phase_of(&w, "forever-young") else {
        panic!("{:?}", phase_of(&w, "forever-young"))
    };
    assert!(since_ms <= now, "since {since_ms} > now {now}");
}

/// #39 item 4: a typo in a gpusched.io/ key (`gpusched.io/gpu-model`) was
/// ignored in silence; it is a problem of the pod, named with the key
/// meant (a warning event on the pod, once, and doctor's config finding).
#[test]
fn an_unknown_gpusched_key_on_our_pod_is_a_problem_naming_the_nearest_key() {
    use gpusched_k8s::world::Problem;
    let mut w = World::default();
    w.upsert_node(&serde_json::from_value(node("n1", 8, true)).unwrap());
    let mut typo = gpu_pod("typo", json!({"nvidia.com/gpu": "1"}), json!({}));
    typo["metadata"]["annotations"] = json!({"gpusched.io/gpu-model": "NVIDIA-A100"});
    w.upsert_pod(&pod(typo));
    // another scheduler's pod: not ours to warn about
    let mut other = gpu_pod("other", json!({"nvidia.com/gpu": "1"}), json!({}));
    other["spec"]["schedulerName"] = json!("default-scheduler");
    other["metadata"]["annotations"] = json!({"gpusched.io/gpu-model": "x"});
    w.upsert_pod(&pod(other));
    let b = w.build();
    let warnings: Vec<(&str, &str)> = b
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::PodKeyWarning { pod, warning } => Some((pod.name.as_str(), warning.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(warnings.len(), 1, "{:#?}", b.problems);
    assert_eq!(warnings[0].0, "typo");
    assert!(
        warnings[0].1.contains("gpusched.io/gpu-model")
            && warnings[0]
                .1
                .ends_with("did you mean gpusched.io/gpu-models?"),
        "{warnings:?}"
    );
}

/// #39 item 4: a known key with a value outside its vocabulary was read
/// as something else in silence (`gpusched.io/gang: "yes"` lost the gang,
/// `gpusched.io/preemptible: "no"` left the pod evictable). A pending pod
/// with such a value is refused: its error names the key, the value and
/// the values accepted. A pod already bound keeps its place, read on the
/// safe side (not evicted).
#[test]
fn a_value_outside_its_keys_vocabulary_is_refused_naming_key_value_and_accepted_values() {
    let with = |name: &str, labels: Value, annotations: Value| {
        let mut p = gpu_pod(name, json!({"nvidia.com/gpu": "1"}), json!({}));
        p["metadata"]["labels"] = labels;
        p["metadata"]["annotations"] = annotations;
        p
    };
    let cases = [
        (
            with("gang", json!({"gpusched.io/gang": "yes"}), json!({})),
            "metadata.labels[gpusched.io/gang]: \"yes\"",
            "use \"true\" or \"false\"",
        ),
        (
            with("gang-a", json!({}), json!({"gpusched.io/gang": "on"})),
            "metadata.annotations[gpusched.io/gang]: \"on\"",
            "use \"true\" or \"false\"",
        ),
        (
            with("keep", json!({}), json!({"gpusched.io/preemptible": "no"})),
            "metadata.annotations[gpusched.io/preemptible]: \"no\"",
            "use \"true\" or \"false\"",
        ),
        (
            with("move", json!({"gpusched.io/movable": "maybe"}), json!({})),
            "metadata.labels[gpusched.io/movable]: \"maybe\"",
            "use \"true\" or \"false\"",
        ),
        (
            with(
                "mem",
                json!({}),
                json!({"gpusched.io/min-gpu-memory": "lots"}),
            ),
            "metadata.annotations[gpusched.io/min-gpu-memory]: invalid quantity \"lots\"",
            "a memory quantity, such as 40Gi",
        ),
    ];
    for (p, field, accepted) in cases {
        let v = translate::pod(&pod(p));
        let PodKind::Invalid { error } = &v.kind else {
            panic!("{}: {:?}", v.name, v.kind)
        };
        assert!(
            error.contains(field) && error.contains(accepted),
            "{}: {error}",
            v.name
        );
    }
    // the values of the vocabulary are read as before
    let ok = translate::pod(&pod(with(
        "ok",
        json!({"gpusched.io/gang": "false", "gpusched.io/movable": "true"}),
        json!({"gpusched.io/preemptible": "false", "gpusched.io/min-gpu-memory": "40Gi"}),
    )));
    let PodKind::Pending { pod: p, .. } = ok.kind else {
        panic!("{:?}", ok.kind)
    };
    assert!(!p.preemptible && p.movable && p.min_gpu_memory_mib == 40 * 1024);
    // bound: kept where it is, and not evicted for a value it meant as "no"
    let mut bound = with("bound", json!({}), json!({"gpusched.io/preemptible": "no"}));
    bound["spec"]["nodeName"] = json!("n1");
    bound["status"]["phase"] = json!("Running");
    let v = translate::pod(&pod(bound));
    let PodKind::Bound { pod: p, .. } = v.kind else {
        panic!("{:?}", v.kind)
    };
    assert!(!p.preemptible);
    assert_eq!(p.queue, "default");
}

/// #39 item 4: a Job labelled `gpusched.io/gang: "yes"` got no PodGroup
/// (only `"true"` makes one) and its pods ran as independent pods. Its
/// pending pods now wait, their problem naming the Job, the key, the value
/// and the values accepted; the Job is reported; fixed (or gone), they are
/// scheduled again. The incremental snapshot follows each change.
#[test]
fn the_pods_of_a_job_whose_gang_label_is_not_a_flag_wait_naming_it() {
    use k8s_openapi::api::batch::v1::Job;
    let job = |value: &str| -> Job {
        serde_json::from_value(json!({
            "apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": "ddp", "namespace": "ml", "labels": {"gpusched.io/gang": value}},
            "spec": {"template": {"spec": {"containers": []}}}
        }))
        .unwrap()
    };
    let mut w = World::default();
    w.upsert_node(&serde_json::from_value(node("n1", 8, true)).unwrap());
    for i in 0..2 {
        let mut p = gpu_pod(
            &format!("ddp-{i}"),
            json!({"nvidia.com/gpu": "1"}),
            json!({}),
        );
        p["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!("ddp");
        w.upsert_pod(&pod(p));
    }
    // another Job's pod, and a pod of no Job: not concerned
    let mut other = gpu_pod("other-0", json!({"nvidia.com/gpu": "1"}), json!({}));
    other["metadata"]["labels"]["batch.kubernetes.io/job-name"] = json!("other");
    w.upsert_pod(&pod(other));
    let pending = |w: &mut World| -> Vec<String> {
        let b = w.snapshot();
        assert_eq!(
            gpusched_k8s::world::first_difference(&b, &w.build()),
            None,
            "incremental = full"
        );
        b.pods.iter().map(|p| p.name.clone()).collect()
    };
    assert_eq!(pending(&mut w), ["ddp-0", "ddp-1", "other-0"]);
    w.upsert_gang_job(&job("yes"));
    assert_eq!(pending(&mut w), ["other-0"]);
    let b = w.build();
    let refused: Vec<(&str, &str)> = b
        .problems
        .iter()
        .filter_map(|p| match p {
            Problem::InvalidPod { pod, error } => Some((pod.name.as_str(), error.as_str())),
            _ => None,
        })
        .collect();
    assert_eq!(refused.len(), 2, "{:#?}", b.problems);
    for (name, error) in &refused {
        assert!(name.starts_with("ddp-"));
        assert!(
            error.starts_with("Job ml/ddp: metadata.labels[gpusched.io/gang]: \"yes\"")
                && error.contains("use \"true\" or \"false\"")
                && error.contains("never placed as independent pods"),
            "{error}"
        );
    }
    assert!(b.problems.iter().any(|p| matches!(p,
        Problem::InvalidGroup { group, error } if group == "Job ml/ddp" && error.contains("\"yes\""))));
    assert_eq!(
        b.unseen_by_queue["research"][&gpusched_core::report::classify::PendingClass::InvalidSpec],
        2
    );
    // fixed to "false": placed one by one again
    w.upsert_gang_job(&job("false"));
    assert_eq!(pending(&mut w), ["ddp-0", "ddp-1", "other-0"]);
    // broken again, then deleted
    w.upsert_gang_job(&job("True"));
    assert_eq!(pending(&mut w), ["other-0"]);
    w.remove(gpusched_k8s::world::ObjectKind::Job, "ml/ddp");
    assert_eq!(pending(&mut w), ["ddp-0", "ddp-1", "other-0"]);
}

//! The incremental snapshot (`World::snapshot`) equals a snapshot built
//! from scratch (`World::build`) after any sequence of watch events and
//! scheduler actions, and recomputes only what a change touched.

use gpusched_core::GpuAssignment;
use gpusched_k8s::crd::{PodGroup, Queue};
use gpusched_k8s::kwok::node_object;
use gpusched_k8s::world::{Assumed, World, first_difference};
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolumeClaim, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use proptest::prelude::*;
use serde_json::{Value, json};

const NODES: usize = 4;
const PODS: usize = 14;

/// Model nodes `n-0`.. with `gpus` GPUs each.
fn model_nodes(gpus: u32) -> Vec<gpusched_model::Node> {
    let yaml = format!(
        "nodes:\n  - name: n\n    count: {NODES}\n    cpu: \"64\"\n    memory: 512Gi\n    gpus: {{count: {gpus}, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}}\n"
    );
    let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
    spec.build().unwrap().into_iter().map(|b| b.node).collect()
}

/// Node `i` in one of a few shapes: 4 or 8 GPUs, its agent listing pod
/// `u{listed}` on GPUs 1 (and 2), or an unreadable allocations annotation.
fn node(i: usize, shape: u8, listed: usize) -> Node {
    let nodes = model_nodes(if shape.is_multiple_of(2) { 4 } else { 8 });
    let m = &nodes[i % nodes.len()];
    let mut n = node_object(m);
    let ann = n.metadata.annotations.get_or_insert_with(Default::default);
    match shape % 4 {
        2 => {
            let doc = json!({"v": 1, "agent": "t", "pods": [{"uid": format!("u{listed}"),
                "namespace": "a", "name": format!("p{listed}"),
                "gpus": [m.gpus[1].uuid, m.gpus[2].uuid]}]});
            ann.insert("gpusched.io/allocations".into(), doc.to_string());
        }
        3 => {
            ann.insert("gpusched.io/allocations".into(), "{not json".into());
        }
        _ => {}
    }
    n
}

fn node_name(i: usize) -> String {
    model_nodes(4)[i % NODES].name.clone()
}

/// Pod `j` in one of many shapes (bits of `shape`).
fn pod(j: usize, shape: u32, on: usize, decision: u8) -> Pod {
    let ns = if j.is_multiple_of(3) { "b" } else { "a" };
    let mut labels = json!({"app": format!("app{}", j % 2)});
    if shape & 1 != 0 {
        labels["gpusched.io/pod-group"] = json!(format!("g{}", j % 3));
    }
    if shape & 2 != 0 {
        labels["gpusched.io/queue"] = json!(format!("q{}", j % 3));
    }
    if shape & 12 == 12 {
        labels["batch.kubernetes.io/job-name"] = json!("job0");
    }
    let gpus = match (shape >> 3) % 4 {
        0 => json!("1"),
        1 => json!("2"),
        2 => json!("0"),
        _ if shape & (1 << 14) != 0 => json!("0.5"), // invalid
        _ => json!("1"),
    };
    let mut spec = json!({
        "schedulerName": if shape & (32 | 1 << 15) == 32 | 1 << 15 { "other" } else { "gpusched" },
        "containers": [{"name": "main", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": gpus}, "requests": {"cpu": "1"}}}]
    });
    let bound = shape & 64 != 0;
    if bound {
        spec["nodeName"] = json!(node_name(on));
    }
    if shape & 384 == 384 {
        spec["schedulingGates"] = json!([{"name": "wait"}]);
    }
    if shape & 256 != 0 {
        spec["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": {"matchLabels": {"app": "app0"}},
             "namespaceSelector": {"matchLabels": {"team": "x"}},
             "topologyKey": "kubernetes.io/hostname"}]}});
    }
    if shape & 512 != 0 {
        spec["volumes"] =
            json!([{"name": "v", "persistentVolumeClaim": {"claimName": format!("c{}", j % 2)}}]);
    }
    let mut meta = json!({
        "name": format!("p{j}"), "namespace": ns, "uid": format!("u{j}"),
        "creationTimestamp": format!("2026-12-01T10:00:0{}Z", (j * 7) % 4),
        "labels": labels,
    });
    if bound && decision != 0 {
        let m = &model_nodes(4)[on % NODES];
        let d = match decision {
            1 => json!({"v": 1, "uid": format!("u{j}"), "node": m.name, "seq": 1,
                "indices": [1], "gpus": [m.gpus[1].uuid]}),
            2 => json!({"v": 1, "uid": format!("u{j}"), "node": m.name, "seq": 2,
                "indices": [0, 3], "gpus": [m.gpus[0].uuid, m.gpus[3].uuid]}),
            3 => json!({"v": 1, "uid": format!("u{j}"), "node": m.name, "seq": 3,
                "indices": [5], "gpus": [""]}),
            _ => json!("garbage"),
        };
        meta["annotations"] = json!({"gpusched.io/decision": d.to_string()});
    }
    if shape & 3072 == 3072 {
        meta["deletionTimestamp"] = json!("2026-12-01T11:00:00Z");
    }
    let phase = match (bound, shape >> 11 & 7) {
        (_, 1) => "Succeeded",
        (true, _) => "Running",
        _ => "Pending",
    };
    let mut status = json!({"phase": phase});
    if shape & (1 << 13) != 0 {
        status["nominatedNodeName"] = json!(node_name(on + 1));
    }
    serde_json::from_value(json!({"metadata": meta, "spec": spec, "status": status})).unwrap()
}

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

#[derive(Clone, Debug)]
enum Ev {
    Node(usize, u8, usize),
    DelNode(usize),
    Pod(usize, u32, usize, u8),
    DelPod(usize),
    Assume(usize, usize, bool),
    Forget(usize),
    Nominate(usize, usize),
    Evict(usize),
    ForgetEviction(usize),
    Queue(usize, u8),
    DelQueue(usize),
    Group(usize, u8),
    DelGroup(usize),
    JobGroup(bool),
    Namespace(usize, bool),
    Pdb(usize, u8),
    Priority(i32),
    Pvc(usize, bool),
    Snapshot,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        3 => (0..NODES, any::<u8>(), 0usize..4).prop_map(|(i, s, l)| Ev::Node(i, s, l)),
        1 => (0..NODES).prop_map(Ev::DelNode),
        8 => (0..PODS, 0u32..(1 << 16), 0..NODES, 0u8..5).prop_map(|(j, s, o, d)| Ev::Pod(j, s, o, d)),
        2 => (0..PODS).prop_map(Ev::DelPod),
        2 => (0..PODS, 0..NODES, any::<bool>()).prop_map(|(j, n, w)| Ev::Assume(j, n, w)),
        1 => (0..PODS).prop_map(Ev::Forget),
        1 => (0..PODS, 0..NODES).prop_map(|(j, n)| Ev::Nominate(j, n)),
        1 => (0..PODS).prop_map(Ev::Evict),
        1 => (0..PODS).prop_map(Ev::ForgetEviction),
        1 => (0usize..3, any::<u8>()).prop_map(|(q, s)| Ev::Queue(q, s)),
        1 => (0usize..3).prop_map(Ev::DelQueue),
        2 => (0usize..3, any::<u8>()).prop_map(|(g, s)| Ev::Group(g, s)),
        1 => (0usize..3).prop_map(Ev::DelGroup),
        1 => any::<bool>().prop_map(Ev::JobGroup),
        1 => (0usize..2, any::<bool>()).prop_map(|(n, x)| Ev::Namespace(n, x)),
        1 => (0usize..2, any::<u8>()).prop_map(|(a, m)| Ev::Pdb(a, m)),
        1 => (0i32..3).prop_map(Ev::Priority),
        1 => (0usize..2, any::<bool>()).prop_map(|(c, b)| Ev::Pvc(c, b)),
        4 => Just(Ev::Snapshot),
    ]
}

fn apply(w: &mut World, e: &Ev) {
    match e {
        Ev::Node(i, s, l) => w.upsert_node(&node(*i, *s, *l)),
        Ev::DelNode(i) => w.delete_node(&node_name(*i)),
        Ev::Pod(j, s, o, d) => w.upsert_pod(&pod(*j, *s, *o, *d)),
        Ev::DelPod(j) => w.delete_pod(&format!("u{j}")),
        Ev::Assume(j, n, whole) => w.assume(
            &format!("u{j}"),
            Assumed {
                node: node_name(*n),
                decision: gpusched_k8s::decision::make(
                    &format!("u{j}"),
                    &model_nodes(4)[*n],
                    1,
                    &GpuAssignment::Whole(vec![0]),
                ),
                gpus: if *whole {
                    GpuAssignment::Whole(vec![0])
                } else {
                    GpuAssignment::None
                },
            },
        ),
        Ev::Forget(j) => w.forget(&format!("u{j}")),
        Ev::Nominate(j, n) => w.nominate(&format!("u{j}"), &node_name(*n)),
        Ev::Evict(j) => w.assume_evicted(&format!("u{j}")),
        Ev::ForgetEviction(j) => w.forget_eviction(&format!("u{j}")),
        Ev::Queue(q, s) => {
            if s % 5 == 4 {
                w.invalid_queue(&format!("q{q}"), "spec.weight: bad".into());
            } else {
                let mut spec = json!({"weight": 1 + (s % 3)});
                if s % 5 == 3 {
                    spec["parent"] = json!(format!("q{}", (q + 1) % 3));
                }
                w.upsert_queue(&obj::<Queue>(json!({"apiVersion": "gpusched.io/v1alpha1",
                    "kind": "Queue", "metadata": {"name": format!("q{q}")}, "spec": spec})));
            }
        }
        Ev::DelQueue(q) => w.delete_queue(&format!("q{q}")),
        Ev::Group(g, s) => {
            let mut spec = json!({"minMember": 1 + (s % 3)});
            if s & 4 != 0 {
                spec["queue"] = json!(format!("q{}", s % 3));
            }
            if s & 8 != 0 {
                spec["priorityClassName"] = json!("high");
            }
            let ns = if s & 16 != 0 { "b" } else { "a" };
            w.upsert_group(&obj::<PodGroup>(
                json!({"apiVersion": "gpusched.io/v1alpha1",
                "kind": "PodGroup", "metadata": {"name": format!("g{g}"), "namespace": ns},
                "spec": spec}),
            ));
        }
        Ev::DelGroup(g) => w.delete_group(&format!("a/g{g}")),
        Ev::JobGroup(on) => {
            if *on {
                w.upsert_group(&obj::<PodGroup>(
                    json!({"apiVersion": "gpusched.io/v1alpha1",
                    "kind": "PodGroup", "metadata": {"name": "job0", "namespace": "a",
                    "annotations": {"gpusched.io/job": "job0"}}, "spec": {"minMember": 2}}),
                ));
            } else {
                w.delete_group("a/job0");
            }
        }
        Ev::Namespace(n, x) => {
            let (name, team) = (["a", "b"][*n], if *x { "x" } else { "y" });
            w.upsert_namespace(&obj::<Namespace>(
                json!({"metadata": {"name": name, "labels": {"team": team}}}),
            ))
        }
        Ev::Pdb(a, m) => w.upsert_pdb(&obj::<PodDisruptionBudget>(json!({"metadata": {
            "name": format!("pdb{a}"), "namespace": "a"}, "spec": {"minAvailable": m % 3,
            "selector": {"matchLabels": {"app": format!("app{a}")}}}}))),
        Ev::Priority(v) => w.upsert_priority_class(&obj::<PriorityClass>(json!({
            "metadata": {"name": "high"}, "value": v * 100}))),
        Ev::Pvc(c, bound) => {
            let mut v = json!({"metadata": {"name": format!("c{c}"), "namespace": "a"},
                "spec": {"accessModes": ["ReadWriteOncePod"], "resources": {"requests": {"storage": "1Gi"}}}});
            if *bound {
                v["spec"]["volumeName"] = json!(format!("pv{c}"));
                v["status"] = json!({"phase": "Bound"});
            }
            w.upsert_pvc(&obj::<PersistentVolumeClaim>(v))
        }
        Ev::Snapshot => {}
    }
}

fn check(w: &mut World, step: usize) -> Result<(), TestCaseError> {
    let inc = w.snapshot();
    let full = w.build();
    if let Some(d) = first_difference(&inc, &full) {
        return Err(TestCaseError::fail(format!("after step {step}: {d}")));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 128,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// After any events, the incremental snapshot equals a full build
    /// (compared at random points, so changes also pile up between
    /// snapshots, and at the end).
    #[test]
    fn the_incremental_snapshot_equals_a_full_build(
        start in prop::collection::vec((0u32..(1 << 16), 0..NODES, 0u8..5), PODS),
        events in prop::collection::vec(ev(), 1..80),
    ) {
        let mut w = World::default();
        for i in 0..NODES {
            w.upsert_node(&node(i, i as u8 % 2, 0));
        }
        for (j, (s, o, d)) in start.iter().enumerate() {
            w.upsert_pod(&pod(j, *s, *o, *d));
        }
        check(&mut w, 0)?;
        for (step, e) in events.iter().enumerate() {
            apply(&mut w, e);
            if matches!(e, Ev::Snapshot) {
                check(&mut w, step)?;
            }
        }
        check(&mut w, events.len())?;
    }
}

/// A cluster of `nodes` nodes and `pods` pods, half bound.
fn cluster(nodes: usize, pods: usize) -> World {
    let ms = {
        let yaml = format!(
            "nodes:\n  - name: n\n    count: {nodes}\n    cpu: \"64\"\n    memory: 512Gi\n    gpus: {{count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}}\n"
        );
        let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
        spec.build()
            .unwrap()
            .into_iter()
            .map(|b| b.node)
            .collect::<Vec<_>>()
    };
    let mut w = World::default();
    for m in &ms {
        w.upsert_node(&node_object(m));
    }
    for j in 0..pods {
        let mut spec = json!({"schedulerName": "gpusched", "containers": [{"name": "main", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]});
        if j.is_multiple_of(2) {
            spec["nodeName"] = json!(ms[j % ms.len()].name);
        }
        w.upsert_pod(&obj::<Pod>(
            json!({"metadata": {"name": format!("p{j}"), "namespace": "a",
            "uid": format!("u{j}"), "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": spec, "status": {"phase": if j.is_multiple_of(2) { "Running" } else { "Pending" }}}),
        ));
    }
    w
}

#[test]
fn a_cycle_recomputes_only_the_pods_a_change_touched() {
    let mut w = cluster(20, 400);
    let first = w.snapshot();
    assert_eq!(
        w.last_snapshot_work(),
        400,
        "the first snapshot computes every pod"
    );
    // nothing changed: nothing recomputed, same snapshot
    let again = w.snapshot();
    assert_eq!(w.last_snapshot_work(), 0);
    assert_eq!(first_difference(&first, &again), None);
    // one pod arrives: one entry
    w.upsert_pod(&obj::<Pod>(
        json!({"metadata": {"name": "new", "namespace": "a", "uid": "new",
        "creationTimestamp": "2026-12-01T10:00:01Z"},
        "spec": {"schedulerName": "gpusched", "containers": [{"name": "main", "image": "x",
            "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}, "status": {"phase": "Pending"}}),
    ));
    let s = w.snapshot();
    assert_eq!(w.last_snapshot_work(), 1);
    assert_eq!(s.snapshot.pods.len(), 401);
    // it is bound by the scheduler: one entry again
    w.assume(
        "new",
        Assumed {
            node: s.snapshot.nodes[2].name.clone(),
            decision: gpusched_k8s::decision::make(
                "new",
                &s.snapshot.nodes[2],
                1,
                &GpuAssignment::Whole(vec![7]),
            ),
            gpus: GpuAssignment::Whole(vec![7]),
        },
    );
    let s = w.snapshot();
    assert_eq!(w.last_snapshot_work(), 1);
    assert!(s.snapshot.pods.iter().any(|p| {
        p.holding()
            .is_some_and(|(n, g)| n == 2 && *g == GpuAssignment::Whole(vec![7]))
    }));
    // a node's labels change: the pods on it (the new one among them)
    let on_2 = s
        .snapshot
        .pods
        .iter()
        .filter(|p| p.holding().is_some_and(|(n, _)| n == 2))
        .count();
    assert!(on_2 >= 2, "{on_2}");
    let mut n = w.node(&s.snapshot.nodes[2].name).unwrap().node.clone();
    n.labels.insert("zone".into(), "b".into());
    w.upsert_node(&node_object(&n));
    w.snapshot();
    assert_eq!(w.last_snapshot_work(), on_2);
    // a node joins: ids shift, every entry
    let mut extra = n.clone();
    extra.name = "a-first".into();
    w.upsert_node(&node_object(&extra));
    let s = w.snapshot();
    assert_eq!(w.last_snapshot_work(), 401);
    assert_eq!(first_difference(&s, &w.build()), None);
}

#[test]
fn a_nomination_and_a_node_change_show_in_the_next_snapshot() {
    let mut w = World::default();
    for i in 0..NODES {
        w.upsert_node(&node(i, 0, 0));
    }
    w.upsert_pod(&pod(1, 0, 0, 0));
    w.upsert_pod(&pod(2, 64, 1, 3));
    let s = w.snapshot();
    assert_eq!(first_difference(&s, &w.build()), None);
    w.nominate("u1", &node_name(2));
    let s = w.snapshot();
    assert_eq!(first_difference(&s, &w.build()), None);
    assert!(s.snapshot.pods.iter().any(|p| matches!(
        p.phase,
        gpusched_core::PodPhase::Pending {
            nominated: Some(_),
            ..
        }
    )));
    // pod 2's decision names GPU 5: unusable on 4 GPUs, usable on 8
    w.upsert_node(&node(1, 1, 0));
    let s = w.snapshot();
    assert_eq!(first_difference(&s, &w.build()), None);
}

/// Issue 38, item 1: a `status.nominatedNodeName` anyone with pods/status
/// may write does not replace the scheduler's own nomination, and every
/// nomination reaches the core with the time it was first seen (the core
/// bounds how long it holds the node).
#[test]
fn a_status_nomination_is_timed_and_does_not_replace_the_schedulers_own() {
    let mut w = World::default();
    for i in 0..NODES {
        w.upsert_node(&node(i, 0, 0));
    }
    let mut p = pod(1, 0, 0, 0);
    w.upsert_pod(&p);
    w.nominate("u1", &node_name(2));
    // a tenant writes another node into the status
    p.status.get_or_insert_default().nominated_node_name = Some(node_name(3));
    w.upsert_pod(&p);
    let s = w.snapshot();
    assert_eq!(first_difference(&s, &w.build()), None);
    let node2 = s
        .snapshot
        .nodes
        .iter()
        .position(|n| n.name == node_name(2))
        .unwrap() as u32;
    let phase = &s
        .snapshot
        .pods
        .iter()
        .find(|x| x.pod.name.ends_with("p1"))
        .unwrap()
        .phase;
    assert!(
        matches!(
            phase,
            gpusched_core::PodPhase::Pending { nominated: Some(n), nominated_at_ms: Some(t) }
                if *n == node2 && *t > 0
        ),
        "{phase:?}"
    );
}

#[test]
fn a_new_pod_group_recomputes_only_its_members() {
    let mut w = World::default();
    for i in 0..NODES {
        w.upsert_node(&node(i, 1, 0));
    }
    for j in 0..300 {
        w.upsert_pod(&obj::<Pod>(
            json!({"metadata": {"name": format!("p{j}"), "namespace": "a",
            "uid": format!("u{j}"), "creationTimestamp": "2026-12-01T10:00:00Z",
            "labels": {"gpusched.io/pod-group": format!("g{}", j % 10)}},
            "spec": {"schedulerName": "gpusched", "containers": [{"name": "main", "image": "x",
                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}}),
        ));
    }
    w.snapshot();
    assert_eq!(w.last_snapshot_work(), 300);
    w.upsert_group(&obj::<PodGroup>(
        json!({"apiVersion": "gpusched.io/v1alpha1",
        "kind": "PodGroup", "metadata": {"name": "g3", "namespace": "a"},
        "spec": {"minMember": 30, "queue": "q1"}}),
    ));
    let s = w.snapshot();
    assert_eq!(w.last_snapshot_work(), 30, "the 30 members of g3");
    assert_eq!(first_difference(&s, &w.build()), None);
    let in_q1 = s
        .snapshot
        .pods
        .iter()
        .filter(|p| p.pod.queue == "q1")
        .count();
    assert_eq!(in_q1, 30);
}

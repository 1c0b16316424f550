//! A decision changed after binding is ignored and reported (issue #22, 4):
//! the scheduler keeps the decision a pod was bound with, so a forged
//! annotation cannot hand that pod's GPU to another.

use gpusched_core::{GpuAssignment, PodPhase};
use gpusched_k8s::decision::{ANNOTATION_DECISION, GpuDecision};
use gpusched_k8s::world::{Problem, World};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::json;

fn node() -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": "n1", "labels": {"nvidia.com/gpu.product": "H100-SXM5-80GB"}},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn bound(index: u32) -> Pod {
    let d = GpuDecision {
        v: 1,
        uid: "u1".into(),
        node: "n1".into(),
        seq: 1,
        indices: vec![index],
        gpus: vec![String::new()],
        share: None,
        mig: None,
    };
    serde_json::from_value(json!({
        "metadata": {"name": "a", "namespace": "ml", "uid": "u1",
                     "creationTimestamp": "2026-12-01T10:00:00Z",
                     "annotations": {ANNOTATION_DECISION: d.to_annotation()}},
        "spec": {"schedulerName": "gpusched", "nodeName": "n1", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Running"}
    }))
    .unwrap()
}

fn held(w: &World) -> GpuAssignment {
    let b = w.build();
    match &b.snapshot.pods[0].phase {
        PodPhase::Running { gpus, .. } => gpus.clone(),
        p => panic!("{p:?}"),
    }
}

#[test]
fn a_decision_changed_after_binding_is_ignored_and_reported() {
    let mut w = World::default();
    w.upsert_node(&node());
    w.upsert_pod(&bound(3));
    assert_eq!(held(&w), GpuAssignment::Whole(vec![3]));
    assert!(w.build().problems.is_empty());
    // someone patches the annotation (pods/status let it through before)
    w.upsert_pod(&bound(5));
    assert_eq!(
        held(&w),
        GpuAssignment::Whole(vec![3]),
        "the forged GPU is not believed"
    );
    let problems = w.build().problems;
    assert!(
        problems.iter().any(|p| matches!(p, Problem::BadDecision { error, .. }
            if error.contains("changed after binding") && error.contains("[5]") && error.contains("[3]"))),
        "{problems:?}"
    );
    // gone: forgotten
    w.delete_pod("u1");
    w.upsert_pod(&bound(5));
    assert_eq!(held(&w), GpuAssignment::Whole(vec![5]));
    assert!(w.build().problems.is_empty());
}

/// A pod the kubelet put on other GPUs than decided (a same-size swap the
/// agent reports in `gpusched.io/allocations`) holds those GPUs for the
/// scheduler, so the next decision is made on what is really free
/// (issue #29, 1).
#[test]
fn the_agents_served_gpus_win_over_the_decision() {
    use gpusched_model::protocol::{
        ALLOCATIONS_VERSION, ANNOTATION_NODE_ALLOCATIONS, NodeAllocations, PodAllocation,
    };
    let mut w = World::default();
    let mut n = node();
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100", "memoryMiB": 81920}))
        .collect();
    let served = NodeAllocations {
        v: ALLOCATIONS_VERSION,
        agent: "test".into(),
        pods: vec![PodAllocation {
            uid: "u1".into(),
            namespace: "ml".into(),
            name: "a".into(),
            gpus: vec!["GPU-5".into()],
            milli: None,
            mig: Vec::new(),
        }],
    };
    n.metadata.annotations = Some(
        [
            (
                gpusched_k8s::translate::ANNOTATION_NODE_GPUS.to_string(),
                json!(gpus).to_string(),
            ),
            (
                ANNOTATION_NODE_ALLOCATIONS.to_string(),
                served.to_annotation(),
            ),
        ]
        .into(),
    );
    w.upsert_node(&n);
    let v = gpusched_k8s::translate::node(&n);
    assert!(v.warnings.is_empty(), "{:?}", v.warnings);
    let mut p = bound(3);
    // the decision names the GPU by the uuid of index 3
    let d = GpuDecision {
        v: 1,
        uid: "u1".into(),
        node: "n1".into(),
        seq: 1,
        indices: vec![3],
        gpus: vec!["GPU-3".into()],
        share: None,
        mig: None,
    };
    p.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANNOTATION_DECISION.into(), d.to_annotation());
    w.upsert_pod(&p);
    assert_eq!(held(&w), GpuAssignment::Whole(vec![5]));
}

/// A swap in progress (issue #29, seen on a real kubelet): b (decided GPU
/// 3) was admitted onto GPU 2, a's decided GPU, before a; the agent lists b
/// on GPU 2 and will give a GPU 3. Counting a on its decision would count
/// GPU 2 twice and leave GPU 3 looking free for the next decision.
#[test]
fn a_swap_in_progress_counts_the_waiting_pod_on_the_gpu_it_will_get() {
    use gpusched_model::protocol::{
        ALLOCATIONS_VERSION, ANNOTATION_NODE_ALLOCATIONS, NodeAllocations, PodAllocation,
    };
    let mut w = World::default();
    let mut n = node();
    let gpus: Vec<serde_json::Value> = (0..8)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100", "memoryMiB": 81920}))
        .collect();
    let served = NodeAllocations {
        v: ALLOCATIONS_VERSION,
        agent: "test".into(),
        pods: vec![PodAllocation {
            uid: "ub".into(),
            namespace: "ml".into(),
            name: "b".into(),
            gpus: vec!["GPU-2".into()],
            milli: None,
            mig: Vec::new(),
        }],
    };
    n.metadata.annotations = Some(
        [
            (
                gpusched_k8s::translate::ANNOTATION_NODE_GPUS.to_string(),
                json!(gpus).to_string(),
            ),
            (
                ANNOTATION_NODE_ALLOCATIONS.to_string(),
                served.to_annotation(),
            ),
        ]
        .into(),
    );
    w.upsert_node(&n);
    for (name, uid, idx) in [("a", "ua", 2u32), ("b", "ub", 3)] {
        let mut p = bound(idx);
        p.metadata.name = Some(name.into());
        p.metadata.uid = Some(uid.into());
        let d = GpuDecision {
            v: 1,
            uid: uid.into(),
            node: "n1".into(),
            seq: 1,
            indices: vec![idx],
            gpus: vec![format!("GPU-{idx}")],
            share: None,
            mig: None,
        };
        p.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANNOTATION_DECISION.into(), d.to_annotation());
        w.upsert_pod(&p);
    }
    let b = w.build();
    let mut counted: Vec<(String, GpuAssignment)> = b
        .pods
        .iter()
        .zip(&b.snapshot.pods)
        .map(|(r, p)| match &p.phase {
            PodPhase::Running { gpus, .. } => (r.name.clone(), gpus.clone()),
            x => panic!("{x:?}"),
        })
        .collect();
    counted.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        counted,
        vec![
            ("a".to_string(), GpuAssignment::Whole(vec![3])),
            ("b".to_string(), GpuAssignment::Whole(vec![2])),
        ]
    );
}

/// A victim's minimum runtime counts from when it was bound: the
/// `PodScheduled=True` transition, else `status.startTime`, not its
/// creation (a pod that waited an hour to be placed is not "old").
#[test]
fn a_bound_pod_runs_since_its_binding_not_its_creation() {
    let mut w = World::default();
    w.upsert_node(&node());
    let mut p = bound(3);
    p.status = Some(
        serde_json::from_value(json!({"phase": "Running",
            "startTime": "2026-12-01T11:00:05Z",
            "conditions": [{"type": "PodScheduled", "status": "True",
                            "lastTransitionTime": "2026-12-01T11:00:00Z"}]}))
        .unwrap(),
    );
    w.upsert_pod(&p);
    let b = w.build();
    let PodPhase::Running { since_ms, .. } = b.snapshot.pods[0].phase else {
        panic!()
    };
    // created 10:00:00, bound 11:00:00
    assert_eq!(since_ms, 1_796_119_200_000 + 3_600_000);
    p.status = Some(
        serde_json::from_value(json!({"phase": "Running", "startTime": "2026-12-01T11:00:05Z"}))
            .unwrap(),
    );
    w.delete_pod("u1");
    w.upsert_pod(&p);
    let PodPhase::Running { since_ms, .. } = w.build().snapshot.pods[0].phase else {
        panic!()
    };
    assert_eq!(since_ms, 1_796_119_200_000 + 3_605_000);
}

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

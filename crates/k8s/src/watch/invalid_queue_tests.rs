//! A pod in an invalid queue is told so.

use super::*;
use crate::world::Problem;
use serde_json::json;

#[test]
fn a_pod_in_an_invalid_queue_is_told_it_is_invalid_and_why() {
    let mut w = World::default();
    w.invalid_queue("research", "spec.weight: out of range".into());
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                     "creationTimestamp": "2026-12-01T10:00:00Z",
                     "labels": {"gpusched.io/queue": "research"}},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    w.upsert_pod(&pod);
    let b = w.build();
    assert!(b.snapshot.pods.is_empty(), "not handed to the core");
    let msg = b
        .problems
        .iter()
        .find_map(|p| match p {
            Problem::InvalidPod { error, .. } => Some(error.clone()),
            _ => None,
        })
        .expect("the pod is told");
    assert!(msg.contains("queue \"research\" is invalid"), "{msg}");
    assert!(msg.contains("spec.weight: out of range"), "{msg}");
    assert!(!msg.contains("does not exist"), "{msg}");
    assert_eq!(b.pending_by_queue.get("research"), Some(&1));
}

//! The watches' decoding, health and failure-log tests.

use super::*;
use serde_json::json;

fn obj(v: serde_json::Value) -> DynamicObject {
    serde_json::from_value(v).unwrap()
}

#[test]
fn one_bad_object_is_named_and_the_others_decode() {
    let good = obj(
        json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
        "metadata": {"name": "a"}, "spec": {"weight": 2}}),
    );
    let bad = obj(
        json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
        "metadata": {"name": "b"}, "spec": {"weight": 4_294_967_296u64}}),
    );
    let q: Queue = decode(&good).unwrap();
    assert_eq!(q.spec.weight, 2);
    let e = decode::<Queue>(&bad).unwrap_err();
    assert!(e.starts_with("spec.weight: "), "{e}");
    assert!(e.contains("4294967296"), "{e}");
    let g = obj(
        json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": -1}}),
    );
    let e = decode::<PodGroup>(&g).unwrap_err();
    assert!(e.starts_with("spec.minMember: "), "{e}");
    assert_eq!(dyn_key(&g), "ml/g");
    assert_eq!(dyn_key(&bad), "b");
}

#[test]
fn a_queues_minimum_runtime_reaches_the_core() {
    let q: Queue = decode(&obj(json!({"apiVersion": "gpusched.io/v1alpha1",
        "kind": "Queue", "metadata": {"name": "a"}, "spec": {"minRuntimeSeconds": 600}})))
    .unwrap();
    assert_eq!(
        crate::translate::queue(&q).unwrap().min_runtime_ms,
        Some(600_000)
    );
    let q: Queue = decode(&obj(json!({"apiVersion": "gpusched.io/v1alpha1",
        "kind": "Queue", "metadata": {"name": "a"}, "spec": {}})))
    .unwrap();
    assert_eq!(crate::translate::queue(&q).unwrap().min_runtime_ms, None);
}

#[test]
fn a_bad_queue_is_invalid_in_the_world_and_the_others_work() {
    let mut w = World::default();
    let good: Queue = decode(&obj(json!({"apiVersion": "gpusched.io/v1alpha1",
        "kind": "Queue", "metadata": {"name": "a"}, "spec": {}})))
    .unwrap();
    w.upsert_queue(&good);
    w.invalid_queue("b", "spec.weight: out of range".into());
    let built = w.build();
    assert!(built.snapshot.queues.iter().any(|q| q.name == "a"));
    assert!(!built.snapshot.queues.iter().any(|q| q.name == "b"));
    assert!(built.problems.iter().any(|p| matches!(p,
        crate::world::Problem::InvalidQueue { queue, error } if queue == "b" && error.contains("spec.weight"))));
}

#[test]
fn forbidden_and_missing_resources_are_told_apart() {
    let status = |code: u16| {
        let mut s = kube::core::Status::failure("m", "r");
        s.code = code;
        s
    };
    let e = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(status(403))));
    assert_eq!(classify(&e), Failure::Forbidden("m".into()));
    let e = watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status(404))));
    assert_eq!(classify(&e), Failure::NotServed);
    let e = watcher::Error::WatchError(Box::new(status(500)));
    assert!(matches!(classify(&e), Failure::Other(_)));
}

#[test]
fn a_repeated_problem_is_logged_once_a_minute() {
    let mut t = Throttled::new();
    assert_eq!(t.due(), Some(0));
    assert_eq!(t.due(), None);
    assert_eq!(t.due(), None);
    t.last = Some(std::time::Instant::now() - Throttled::EVERY);
    assert_eq!(t.due(), Some(2));
}

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

/// #39 item 7: one list of the kinds the scheduler reads, shared by the
/// watches and the tools: every kind the world keeps is in it once (a new
/// kind fails to compile here until it is placed), and an object listed
/// by a tool reaches the world through the watch's own function.
#[test]
fn every_kind_the_world_keeps_is_in_the_one_list_and_read_through_it() {
    use ObjectKind::*;
    let all = [
        Pod,
        Node,
        Queue,
        PodGroup,
        SpPodGroup,
        PriorityClass,
        Pdb,
        Job,
        JobSet,
        LeaderWorkerSet,
        UpstreamPodGroup,
        RayCluster,
        PyTorchJob,
        TfJob,
        MpiJob,
        MpiJobV1,
        Namespace,
        Pvc,
        Pv,
        StorageClass,
        CsiNode,
        CsiDriver,
        CsiStorageCapacity,
        ResourceClaim,
        ResourceSlice,
        DeviceClass,
        DeviceTaintRule,
    ];
    // exhaustive: a kind added to ObjectKind must be added above
    for k in all {
        match k {
            Pod | Node | Queue | PodGroup | SpPodGroup | PriorityClass | Pdb | Job | JobSet
            | LeaderWorkerSet | UpstreamPodGroup | RayCluster | PyTorchJob | TfJob | MpiJob
            | MpiJobV1 | Namespace | Pvc | Pv | StorageClass | CsiNode | CsiDriver
            | CsiStorageCapacity | ResourceClaim | ResourceSlice | DeviceClass
            | DeviceTaintRule => {}
        }
    }
    let listed: Vec<ObjectKind> = kinds().iter().map(|k| k.kind).collect();
    for k in all {
        assert_eq!(
            listed.iter().filter(|l| **l == k).count(),
            1,
            "{k:?} in {listed:?}"
        );
    }
    assert_eq!(listed.len(), all.len());
    // a JobSet listed as a tool lists it: the world keeps it as the watch
    let ks = kinds();
    let js = ks.iter().find(|k| k.kind == JobSet).unwrap();
    assert!(js.optional() && js.resource.plural == "jobsets");
    let mut w = World::default();
    js.read(
        &mut w,
        &obj(
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ml"},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 2}]}}),
        ),
    )
    .unwrap();
    assert_eq!(w.keys(JobSet), ["ml/train"]);
    // a core kind that does not decode is named
    let pvc = ks.iter().find(|k| k.kind == Pvc).unwrap();
    let e = pvc
        .read(
            &mut w,
            &obj(json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": "ml"}, "spec": {"accessModes": 3}})),
        )
        .unwrap_err();
    assert!(
        e.contains("ml/data") && e.contains("spec.accessModes"),
        "{e}"
    );
    // Jobs: only those labelled gpusched.io/gang
    let job = ks.iter().find(|k| k.kind == Job).unwrap();
    assert_eq!(job.selector, Some("gpusched.io/gang"));
}

use super::*;
use crate::world::World;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn pod(name: &str, labels: Value, priority: i32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z", "labels": labels},
        "spec": {"schedulerName": "gpusched", "priority": priority, "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn train(annotations: Value) -> JobSet {
    serde_json::from_value(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "ml", "annotations": annotations,
                     "labels": {"gpusched.io/queue": "research"}},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 2,
                 "template": {"spec": {"parallelism": 2}}}]}
    }))
    .unwrap()
}

fn jobset_pod(name: &str, priority: i32) -> Pod {
    pod(
        name,
        json!({LABEL_JOBSET_NAME: "train", LABEL_JOBSET_REPLICATED_JOB: "w",
               LABEL_JOBSET_RESTART: "0", "batch.kubernetes.io/job-name": "train-w-0"}),
        priority,
    )
}

#[test]
fn a_jobsets_pods_are_one_gang_in_its_queue_at_their_priority() {
    let mut w = World::default();
    for (i, prio) in [(0, 5), (1, 7), (2, 5), (3, 5)] {
        w.upsert_pod(&jobset_pod(&format!("train-w-{i}"), prio));
    }
    w.upsert_pod(&pod("loose", json!({"app": "x"}), 0));
    // the JobSet not seen yet: its pods wait for their group
    let b = w.build();
    assert!(b.snapshot.groups.is_empty());
    assert!(
        b.snapshot
            .pods
            .iter()
            .filter(|p| p.pod.name.starts_with("ml/train"))
            .all(|p| p.pod.group.as_deref() == Some("ml/jobset:train"))
    );
    w.upsert_workload(WorkloadKind::JobSet, "ml/train", jobset(&train(json!({}))));
    let b = w.build();
    assert_eq!(b.snapshot.groups.len(), 1);
    let g = &b.snapshot.groups[0];
    assert_eq!(
        (g.name.as_str(), g.min_member, g.queue.as_str(), g.priority),
        ("ml/jobset:train", 4, "research", 7)
    );
    for p in &b.snapshot.pods {
        if p.pod.name == "ml/loose" {
            assert_eq!(
                (p.pod.group.as_deref(), p.pod.queue.as_str()),
                (None, "default")
            );
        } else {
            // no queue label of their own: charged to the JobSet's queue
            assert_eq!(p.pod.queue, "research");
        }
    }
    assert_eq!(b.pending_by_queue.get("research"), Some(&4));
    // opted out: each pod on its own
    w.upsert_workload(
        WorkloadKind::JobSet,
        "ml/train",
        jobset(&train(json!({ANNOTATION_GANG: "false"}))),
    );
    let b = w.build();
    assert!(b.snapshot.groups.is_empty());
    assert!(b.snapshot.pods.iter().all(|p| p.pod.group.is_none()));
    // (still charged to the JobSet's queue)
    assert!(
        b.snapshot
            .pods
            .iter()
            .filter(|p| p.pod.name.starts_with("ml/train"))
            .all(|p| p.pod.queue == "research")
    );
    // gone again (a relist without it): its pods wait once more
    w.retain_only(
        crate::world::ObjectKind::JobSet,
        &std::collections::BTreeSet::new(),
    );
    assert!(
        w.build()
            .snapshot
            .pods
            .iter()
            .any(|p| p.pod.group.is_some())
    );
}

#[test]
fn finished_members_count_as_started() {
    let mut w = World::default();
    w.upsert_workload(WorkloadKind::JobSet, "ml/train", jobset(&train(json!({}))));
    for i in 0..4 {
        w.upsert_pod(&jobset_pod(&format!("train-w-{i}"), 0));
    }
    assert_eq!(w.build().snapshot.groups[0].min_member, 4);
    // two finished, one failed and was replaced (pending): the
    // replacement needs only the one still running... and itself
    for i in 0..2 {
        let mut p = jobset_pod(&format!("train-w-{i}"), 0);
        p.status.as_mut().unwrap().phase = Some("Succeeded".into());
        w.upsert_pod(&p);
    }
    assert_eq!(w.build().snapshot.groups[0].min_member, 2);
}

#[test]
fn an_unusable_workload_is_reported_and_its_pods_wait() {
    let mut w = World::default();
    w.upsert_pod(&jobset_pod("train-w-0", 0));
    w.upsert_workload(
        WorkloadKind::JobSet,
        "ml/train",
        jobset(&train(json!({ANNOTATION_GANG: "perhaps"}))),
    );
    let b = w.build();
    assert!(b.snapshot.groups.is_empty());
    assert_eq!(
        b.snapshot.pods[0].pod.group.as_deref(),
        Some("ml/jobset:train")
    );
    assert!(b.problems.iter().any(|p| matches!(p,
        crate::world::Problem::InvalidGroup { group, error }
            if group == "JobSet ml/train" && error.contains("gpusched.io/gang"))));
}

#[test]
fn leader_worker_groups_are_separate_gangs() {
    let mut w = World::default();
    for g in 0..2 {
        for i in 0..3 {
            w.upsert_pod(&pod(
                &format!("serve-{g}-{i}"),
                json!({LABEL_LWS_NAME: "serve", LABEL_LWS_GROUP_INDEX: g.to_string(),
                       "gpusched.io/queue": "inference"}),
                0,
            ));
        }
    }
    let l: LeaderWorkerSet = serde_json::from_value(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "namespace": "ml"},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 3}}
    }))
    .unwrap();
    w.upsert_workload(
        WorkloadKind::LeaderWorkerSet,
        "ml/serve",
        leader_worker_set(&l),
    );
    let b = w.build();
    let gs: Vec<(&str, u32, &str)> = b
        .snapshot
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.min_member, g.queue.as_str()))
        .collect();
    assert_eq!(
        gs,
        [
            ("ml/leaderworkerset:serve:0", 3, "inference"),
            ("ml/leaderworkerset:serve:1", 3, "inference")
        ]
    );
}

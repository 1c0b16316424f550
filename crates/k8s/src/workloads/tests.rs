use super::*;
use serde_json::json;

fn js(v: serde_json::Value) -> JobSet {
    serde_json::from_value(v).unwrap()
}

fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
    v.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn a_jobset_is_one_gang_of_every_replicated_jobs_pods() {
    let j = js(json!({
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
        "metadata": {"name": "train", "namespace": "ml", "labels": {"gpusched.io/queue": "research"}},
        "spec": {"replicatedJobs": [
            {"name": "leader", "template": {"spec": {"template": {"spec": {"containers": []}}}}},
            {"name": "workers", "replicas": 3,
             "template": {"spec": {"parallelism": 4, "completions": 4, "template": {}}}},
            {"name": "short", "replicas": 2,
             "template": {"spec": {"parallelism": 4, "completions": 1}}}
        ]},
        "status": {"restarts": 0}
    }));
    let w = jobset(&j).unwrap();
    assert_eq!(w.queue.as_deref(), Some("research"));
    assert_eq!(
        w.gang,
        Gang::Whole {
            min_member: 1 + 12 + 2
        }
    );
    let m = member(&labels(&[
        (LABEL_JOBSET_NAME, "train"),
        (LABEL_JOBSET_REPLICATED_JOB, "workers"),
        (LABEL_JOBSET_RESTART, "0"),
    ]))
    .unwrap();
    assert_eq!(
        group_of("ml", &m, Some(&w)),
        Some(("ml/jobset:train".into(), Some(15)))
    );
    // a restart is a fresh gang
    let m = member(&labels(&[
        (LABEL_JOBSET_NAME, "train"),
        (LABEL_JOBSET_RESTART, "2"),
    ]))
    .unwrap();
    assert_eq!(
        group_of("ml", &m, Some(&w)).unwrap().0,
        "ml/jobset:train:restart-2"
    );
}

#[test]
fn replicated_jobs_that_start_in_turn_are_a_gang_each() {
    for spec in [
        json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
            {"name": "a", "replicas": 2}, {"name": "b", "template": {"spec": {"parallelism": 3}}}]}),
        json!({"replicatedJobs": [
            {"name": "a", "replicas": 2},
            {"name": "b", "template": {"spec": {"parallelism": 3}},
             "dependsOn": [{"name": "a", "status": "Ready"}]}]}),
    ] {
        let w = jobset(&js(json!({"metadata": {"name": "s", "namespace": "ml"},
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": spec})))
        .unwrap();
        let m = member(&labels(&[
            (LABEL_JOBSET_NAME, "s"),
            (LABEL_JOBSET_REPLICATED_JOB, "b"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&w)),
            Some(("ml/jobset:s:b".into(), Some(3)))
        );
    }
}

#[test]
fn opting_out_and_bad_sizes() {
    let base = |ann: serde_json::Value, rjobs: serde_json::Value| {
        js(
            json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "s", "namespace": "ml", "annotations": ann},
            "spec": {"replicatedJobs": rjobs}}),
        )
    };
    let w = jobset(&base(
        json!({"gpusched.io/gang": "false"}),
        json!([{"name": "a"}]),
    ))
    .unwrap();
    assert!(matches!(w.gang, Gang::Off(_)));
    let m = member(&labels(&[(LABEL_JOBSET_NAME, "s")])).unwrap();
    assert_eq!(group_of("ml", &m, Some(&w)), None);
    let e = jobset(&base(json!({"gpusched.io/gang": "maybe"}), json!([]))).unwrap_err();
    assert!(
        e.starts_with("jobset ml/s: metadata.annotations[gpusched.io/gang]"),
        "{e}"
    );
    let e = jobset(&base(json!({}), json!([{"name": "a", "replicas": -1}]))).unwrap_err();
    assert!(e.contains("spec.replicatedJobs[0].replicas"), "{e}");
    let e = jobset(&base(
        json!({}),
        json!([{"name": "a", "replicas": 70000, "template": {"spec": {"parallelism": 70000}}}]),
    ))
    .unwrap_err();
    assert!(e.contains("more pods than one gang can hold"), "{e}");
    let w = jobset(&base(json!({}), json!([{"name": "a", "replicas": 0}]))).unwrap();
    assert_eq!(w.gang, Gang::Off("no pods"));
}

#[test]
fn each_leader_worker_group_is_a_gang() {
    let l: LeaderWorkerSet = serde_json::from_value(json!({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": "serve", "namespace": "inf"},
        "spec": {"replicas": 3, "startupPolicy": "LeaderCreated",
                 "leaderWorkerTemplate": {"size": 4, "workerTemplate": {"spec": {}}}}
    }))
    .unwrap();
    let w = leader_worker_set(&l).unwrap();
    let leader = member(&labels(&[
        (LABEL_LWS_NAME, "serve"),
        (LABEL_LWS_GROUP_INDEX, "2"),
        ("leaderworkerset.sigs.k8s.io/worker-index", "0"),
    ]))
    .unwrap();
    assert_eq!(
        group_of("inf", &leader, Some(&w)),
        Some(("inf/leaderworkerset:serve:2".into(), Some(4)))
    );
    // not seen yet: still named, so the pod waits for its group
    assert_eq!(
        group_of("inf", &leader, None),
        Some(("inf/leaderworkerset:serve:2".into(), None))
    );
    let mut ready = l.clone();
    ready.spec.startup_policy = Some("LeaderReady".into());
    assert!(matches!(
        leader_worker_set(&ready).unwrap().gang,
        Gang::Off(_)
    ));
    let mut zero = l;
    zero.spec.leader_worker_template.size = Some(0);
    let e = leader_worker_set(&zero).unwrap_err();
    assert_eq!(
        e,
        "leaderworkerset inf/serve: spec.leaderWorkerTemplate.size: must be 1 or more, is 0"
    );
}

#[test]
fn an_upstream_pod_group_is_a_gang_of_min_count() {
    let g: k8s_openapi::api::scheduling::v1beta1::PodGroup = serde_json::from_value(json!({
        "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
        "metadata": {"name": "g", "namespace": "ml"},
        "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}
    }))
    .unwrap();
    let w = upstream_pod_group(&g).unwrap();
    let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {"containers": [], "schedulingGroup": {"podGroupName": "g"}}
    }))
    .unwrap();
    let m = scheduling_group_member(&pod).unwrap();
    assert_eq!(
        group_of("ml", &m, Some(&w)),
        Some(("ml/scheduling.k8s.io:g".into(), Some(3)))
    );
    let mut basic = g.clone();
    basic.spec.scheduling_policy.gang = None;
    assert_eq!(
        upstream_pod_group(&basic).unwrap().gang,
        Gang::Off("basic scheduling policy")
    );
    let mut bad = g;
    bad.spec.scheduling_policy.gang.as_mut().unwrap().min_count = 0;
    assert!(
        upstream_pod_group(&bad)
            .unwrap_err()
            .contains("spec.schedulingPolicy.gang.minCount: must be 1 or more, is 0")
    );
}

#[test]
fn a_ray_cluster_is_its_head_and_workers() {
    let r = |autoscaling: bool| -> RayCluster {
        serde_json::from_value(json!({
            "apiVersion": "ray.io/v1", "kind": "RayCluster",
            "metadata": {"name": "rc", "namespace": "ml"},
            "spec": {"enableInTreeAutoscaling": autoscaling,
                "headGroupSpec": {"template": {}},
                "workerGroupSpecs": [
                    {"groupName": "gpu", "replicas": 3, "minReplicas": 1, "maxReplicas": 4,
                     "numOfHosts": 2, "template": {}},
                    {"groupName": "cpu", "replicas": 9, "maxReplicas": 2, "template": {}},
                    {"groupName": "off", "replicas": 5, "suspend": true, "template": {}}
                ]}
        }))
        .unwrap()
    };
    // 1 head + 3 × 2 + min(9, 2)
    assert_eq!(
        ray_cluster(&r(false)).unwrap().gang,
        Gang::Whole { min_member: 9 }
    );
    // with the autoscaler: 1 head + 1 × 2 + 0
    assert_eq!(
        ray_cluster(&r(true)).unwrap().gang,
        Gang::Whole { min_member: 3 }
    );
    let m = member(&labels(&[
        (LABEL_RAY_CLUSTER, "rc"),
        ("ray.io/node-type", "worker"),
        ("ray.io/group", "gpu"),
    ]))
    .unwrap();
    assert_eq!(
        group_of("ml", &m, Some(&ray_cluster(&r(false)).unwrap())),
        Some(("ml/raycluster:rc".into(), Some(9)))
    );
}

#[test]
fn kubeflow_jobs_are_gangs_of_all_their_replicas() {
    let pt: PyTorchJob = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": {"name": "pt", "namespace": "ml"},
        "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": {}},
            "Worker": {"replicas": 3, "template": {}}}}
    }))
    .unwrap();
    let w = kubeflow_job(WorkloadKind::PyTorchJob, &pt.metadata, &pt.spec).unwrap();
    assert_eq!(w.gang, Gang::Whole { min_member: 4 });
    let m = member(&labels(&[
        (LABEL_KUBEFLOW_JOB_NAME, "pt"),
        (LABEL_KUBEFLOW_OPERATOR, "pytorchjob-controller"),
        ("training.kubeflow.org/replica-type", "worker"),
    ]))
    .unwrap();
    assert_eq!(
        group_of("ml", &m, Some(&w)),
        Some(("ml/pytorchjob:pt".into(), Some(4)))
    );
    let mut min = pt.clone();
    min.spec.run_policy =
        serde_json::from_value(json!({"schedulingPolicy": {"minAvailable": 2}})).unwrap();
    assert_eq!(
        kubeflow_job(WorkloadKind::PyTorchJob, &min.metadata, &min.spec)
            .unwrap()
            .gang,
        Gang::Whole { min_member: 2 }
    );
    // MPI Operator: workers + launcher, or the workers alone when the
    // launcher waits for them
    let mpi = |policy: &str| -> MpiJob {
        serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
            "metadata": {"name": "m", "namespace": "ml"},
            "spec": {"launcherCreationPolicy": policy, "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {}},
                "Worker": {"replicas": 4, "template": {}}}}
        }))
        .unwrap()
    };
    let j = mpi("AtStartup");
    assert_eq!(
        kubeflow_job(WorkloadKind::MpiJob, &j.metadata, &j.spec)
            .unwrap()
            .gang,
        Gang::Whole { min_member: 5 }
    );
    let j = mpi("WaitForWorkersReady");
    assert_eq!(
        kubeflow_job(WorkloadKind::MpiJob, &j.metadata, &j.spec)
            .unwrap()
            .gang,
        Gang::Whole { min_member: 4 }
    );
    let m = member(&labels(&[
        (LABEL_KUBEFLOW_JOB_NAME, "m"),
        (LABEL_KUBEFLOW_OPERATOR, "mpi-operator"),
        ("training.kubeflow.org/job-role", "launcher"),
    ]))
    .unwrap();
    assert_eq!(m.kind, WorkloadKind::MpiJob);
    // the training-operator's v1 MPIJob: the launcher and the workers
    // (none unless given), made together; no launcher policy
    let v1: MpiJobV1 = serde_json::from_value(json!({
        "apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
        "metadata": {"name": "m1", "namespace": "ml"},
        "spec": {"mpiReplicaSpecs": {
            "Launcher": {"replicas": 1, "template": {}},
            "Worker": {"replicas": 3, "template": {}}}}
    }))
    .unwrap();
    assert_eq!(
        kubeflow_job(WorkloadKind::MpiJobV1, &v1.metadata, &v1.spec)
            .unwrap()
            .gang,
        Gang::Whole { min_member: 4 }
    );
    let mut no_workers = v1.clone();
    no_workers.spec.rest.insert(
        "mpiReplicaSpecs".into(),
        json!({"Launcher": {"template": {}}, "Worker": {"template": {}}}),
    );
    assert_eq!(
        kubeflow_job(
            WorkloadKind::MpiJobV1,
            &no_workers.metadata,
            &no_workers.spec
        )
        .unwrap()
        .gang,
        Gang::Whole { min_member: 1 }
    );
    let m = member(&labels(&[
        (LABEL_KUBEFLOW_JOB_NAME, "m1"),
        (LABEL_KUBEFLOW_OPERATOR, "mpijob-controller"),
    ]))
    .unwrap();
    assert_eq!(m.kind, WorkloadKind::MpiJobV1);
    assert_eq!(
        group_of("ml", &m, None).unwrap().0,
        "ml/mpijob:m1",
        "one group name for both MPIJob versions"
    );
    // an operator not known here: not a member of anything
    assert_eq!(
        member(&labels(&[
            (LABEL_KUBEFLOW_JOB_NAME, "x"),
            (LABEL_KUBEFLOW_OPERATOR, "xgboostjob-controller"),
        ])),
        None
    );
    let mut bad = pt;
    bad.spec.rest.insert(
        "pytorchReplicaSpecs".into(),
        json!({"Worker": {"replicas": -2}}),
    );
    assert!(
        kubeflow_job(WorkloadKind::PyTorchJob, &bad.metadata, &bad.spec)
            .unwrap_err()
            .contains("spec.pytorchReplicaSpecs.Worker.replicas: must not be negative")
    );
}

#[test]
fn pods_of_other_owners_are_nobodys_members() {
    assert_eq!(member(&labels(&[("app", "x")])), None);
    assert_eq!(member(&labels(&[(LABEL_LWS_NAME, "serve")])), None);
    assert_eq!(member(&labels(&[(LABEL_JOBSET_NAME, "")])), None);
}

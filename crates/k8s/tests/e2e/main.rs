//! End-to-end: gpusched against a real kube-apiserver + etcd, nodes played
//! by kwok. Needs the control plane binaries: run `e2e/run` (builds them,
//! cached, then runs these tests).

#[path = "../common/mod.rs"]
mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

// the tests, by topic (this file: binding, bad pods, gates)
mod gangs;
mod preemption;
mod reasons;
mod restarts;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn one_gpu_pods_are_bound_with_their_gpus_recorded() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    let pods = c.pods("ml");
    for i in 0..12 {
        create(&pods, gpu_pod(&format!("p{i}"), 1)).await;
    }
    let s = c.scheduler(opts()).await;
    let all = wait_for(Duration::from_secs(60), || async {
        let b = bound(&pods).await;
        (b.len() == 12).then_some(b)
    })
    .await
    .expect("all 12 pods bound");
    for (name, p) in &all {
        let d = decision(p);
        assert_eq!(d.uid, p.metadata.uid.clone().unwrap(), "{name}");
        assert_eq!(d.indices.len(), 1);
        assert_eq!(d.gpus.len(), 1);
        assert!(d.gpus[0].starts_with("GPU-"), "{:?}", d.gpus);
    }
    assert_no_double_booking(&c.client).await;
    let ev = wait_event(
        &c,
        "ml",
        "p0",
        "Scheduled: Successfully assigned ml/p0 to ",
        10,
    )
    .await;
    assert!(ev.is_some(), "Scheduled event for p0");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn bad_pods_get_clear_events_and_the_scheduler_keeps_going() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    let pods = c.pods("ml");
    // the apiserver itself refuses fractional GPUs and requests != limits
    // for extended resources; gpusched's own rules come after it
    for (name, field, value) in [
        ("fractional", "limits", "500m"),
        ("unequal", "requests", "1"),
    ] {
        let mut p = gpu_pod(name, 2);
        p["spec"]["containers"][0]["resources"][field]["nvidia.com/gpu"] = json!(value);
        let refused = pods
            .create(&Default::default(), &serde_json::from_value(p).unwrap())
            .await;
        assert!(refused.is_err(), "apiserver validation of {name}");
    }
    let mut frac = gpu_pod("fractional", 1);
    frac["spec"]["containers"][0]["resources"]["limits"] = json!({"gpusched.io/gpu-milli": "1500"});
    create(&pods, frac).await;
    let mut unknown_q = gpu_pod("lost", 1);
    unknown_q["metadata"]["labels"] = json!({"gpusched.io/queue": "nope"});
    create(&pods, unknown_q).await;
    create(&pods, gpu_pod("good", 1)).await;
    // PodGroups: minMember 0 is refused by the CRD schema; a group of an
    // unknown queue leaves its members pending with the reason
    let groups: kube::Api<gpusched_k8s::crd::PodGroup> =
        kube::Api::namespaced(c.client.clone(), "ml");
    let zero = groups
        .create(
            &Default::default(),
            &serde_json::from_value(
                json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "zero"}, "spec": {"minMember": 0}}),
            )
            .unwrap(),
        )
        .await;
    assert!(zero.is_err(), "schema validation of minMember");
    c.group("ml", "ghostly", json!({"minMember": 1, "queue": "ghost"}))
        .await;
    let mut member = gpu_pod("ghost-member", 1);
    member["metadata"]["labels"] = json!({"gpusched.io/pod-group": "ghostly"});
    create(&pods, member).await;
    let s = c.scheduler(opts()).await;
    wait_for(Duration::from_secs(30), || async {
        bound(&pods).await.contains_key("good").then_some(())
    })
    .await
    .expect("the good pod is bound");
    let ev = wait_event(&c, "ml", "fractional", "FailedScheduling:", 20)
        .await
        .expect("FailedScheduling for the fractional pod");
    assert!(
        ev.iter()
            .any(|e| e.contains("gpusched.io/gpu-milli") && e.contains("\"main\"")),
        "{ev:?}"
    );
    let ev = wait_event(&c, "ml", "lost", "FailedScheduling:", 20)
        .await
        .expect("FailedScheduling for the pod of an unknown queue");
    assert!(ev.iter().any(|e| e.contains("nope")), "{ev:?}");
    let ev = wait_event(&c, "ml", "ghost-member", "FailedScheduling:", 20)
        .await
        .expect("FailedScheduling for the member of a group of an unknown queue");
    assert!(ev.iter().any(|e| e.contains("ghost")), "{ev:?}");
    // PodScheduled=False, with a reason autoscalers do not scale up for
    // (a bad spec is not fixed by new nodes)
    let p = pods.get("fractional").await.unwrap();
    let cond = p
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .unwrap();
    assert_eq!(
        (cond.status.as_str(), cond.reason.as_deref()),
        ("False", Some("InvalidSpec"))
    );
    assert!(!bound(&pods).await.contains_key("fractional"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn gates_models_and_pods_of_other_schedulers() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(
        "nodes:
  - name: h100
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}
  - name: l40s
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 4, model: L40S, memory: 48Gi}
",
    )
    .await;
    let pods = c.pods("ml");
    // kube-scheduler's pod placed by hand on the L40S node: holds 3 of its 4 GPUs
    let mut other = gpu_pod("theirs", 3);
    other["spec"]["schedulerName"] = json!("default-scheduler");
    other["spec"]["nodeName"] = json!("l40s");
    create(&pods, other).await;
    // asks for an L40S by GFD label: 2 GPUs do not fit next to theirs
    let mut want_l40s = gpu_pod("want-l40s", 2);
    want_l40s["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "L40S"});
    create(&pods, want_l40s).await;
    let mut one_l40s = gpu_pod("one-l40s", 1);
    one_l40s["spec"]["nodeSelector"] = json!({"nvidia.com/gpu.product": "L40S"});
    create(&pods, one_l40s).await;
    let mut gated = gpu_pod("gated", 1);
    gated["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}]);
    create(&pods, gated).await;
    let s = c.scheduler(opts()).await;
    let b = wait_for(Duration::from_secs(30), || async {
        let b = bound(&pods).await;
        b.contains_key("one-l40s").then_some(b)
    })
    .await
    .expect("one-l40s bound");
    assert_eq!(
        b["one-l40s"].spec.as_ref().unwrap().node_name.as_deref(),
        Some("l40s")
    );
    let d = decision(&b["one-l40s"]);
    assert_eq!(
        d.indices,
        vec![3],
        "the GPU kube-scheduler's pod does not hold"
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    let b = bound(&pods).await;
    assert!(!b.contains_key("want-l40s"), "no room on the L40S node");
    assert!(!b.contains_key("gated"), "gated pods wait");
    let ev = events_for(&c.client, "ml", "want-l40s").await;
    assert!(
        ev.iter()
            .any(|e| e.starts_with("FailedScheduling: 0/2 nodes are available")),
        "{ev:?}"
    );
    let g = pods.get("gated").await.unwrap();
    let cond = g.status.unwrap().conditions.unwrap_or_default();
    assert!(
        cond.iter()
            .any(|c| c.reason.as_deref() == Some("SchedulingGated")),
        "{cond:?}"
    );
    // lifting the gate lets it through; freeing the L40S lets want-l40s in
    pods.patch(
        "gated",
        &Default::default(),
        &kube::api::Patch::Merge(json!({"spec": {"schedulingGates": null}})),
    )
    .await
    .unwrap();
    pods.delete("theirs", &Default::default()).await.unwrap();
    wait_for(Duration::from_secs(30), || async {
        let b = bound(&pods).await;
        (b.contains_key("gated") && b.contains_key("want-l40s")).then_some(())
    })
    .await
    .expect("gate lifted and L40S freed");
    assert_no_double_booking(&c.client).await;
    s.stop().await;
}

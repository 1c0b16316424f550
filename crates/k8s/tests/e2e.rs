//! End-to-end: gpusched against a real kube-apiserver + etcd, nodes played
//! by kwok. Needs the control plane binaries: run `e2e/run` (builds them,
//! cached, then runs these tests).

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

const H100: &str = "nodes:
  - name: h100
    count: 2
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}
";

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
    let ev = wait_for(Duration::from_secs(10), || async {
        let e = events_for(&c.client, "ml", "p0").await;
        e.iter()
            .any(|e| e.starts_with("Scheduled: Successfully assigned ml/p0 to "))
            .then_some(e)
    })
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
    let s = c.scheduler(opts()).await;
    wait_for(Duration::from_secs(30), || async {
        bound(&pods).await.contains_key("good").then_some(())
    })
    .await
    .expect("the good pod is bound");
    let ev = wait_for(Duration::from_secs(20), || async {
        let e = events_for(&c.client, "ml", "fractional").await;
        e.iter()
            .any(|e| e.starts_with("FailedScheduling:"))
            .then_some(e)
    })
    .await
    .expect("FailedScheduling for the fractional pod");
    assert!(
        ev.iter()
            .any(|e| e.contains("gpusched.io/gpu-milli") && e.contains("\"main\"")),
        "{ev:?}"
    );
    let ev = wait_for(Duration::from_secs(20), || async {
        let e = events_for(&c.client, "ml", "lost").await;
        e.iter()
            .any(|e| e.starts_with("FailedScheduling:"))
            .then_some(e)
    })
    .await
    .expect("FailedScheduling for the pod of an unknown queue");
    assert!(ev.iter().any(|e| e.contains("nope")), "{ev:?}");
    // the condition is set the way kube-scheduler sets it
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
        ("False", Some("Unschedulable"))
    );
    assert!(!bound(&pods).await.contains_key("fractional"));
    s.stop().await;
}

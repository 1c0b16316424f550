//! End-to-end consolidation on a real kube-apiserver + etcd (nodes played by
//! kwok): a 2-GPU pod pending on a fragmented cluster is bound after a
//! movable 1-GPU pod is moved (deleted, with an event naming the pod it
//! makes room for). Run by `e2e/run`.

mod common;

use common::*;
use serde_json::json;
use std::time::Duration;

/// Two 4-GPU nodes told apart by a `pool` label.
const TWO_POOLS: &str = "nodes:
  - name: a
    count: 1
    cpu: \"32\"
    memory: 256Gi
    labels: {pool: a}
    gpus: {count: 4, model: L40S, memory: 48Gi, interconnect: pcie, pcie_switches: 2, numa_nodes: 1}
  - name: b
    count: 1
    cpu: \"32\"
    memory: 256Gi
    labels: {pool: b}
    gpus: {count: 4, model: L40S, memory: 48Gi, interconnect: pcie, pcie_switches: 2, numa_nodes: 1}
";

fn pinned(name: &str, gpus: u32, pool: &str) -> serde_json::Value {
    let mut p = gpu_pod(name, gpus);
    p["spec"]["nodeSelector"] = json!({ "pool": pool });
    p
}

fn node_of(p: &k8s_openapi::api::core::v1::Pod) -> String {
    p.spec.as_ref().unwrap().node_name.clone().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_pending_pod_is_bound_after_a_movable_pod_is_moved() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(TWO_POOLS).await;
    let pods = c.pods("ml");
    let s = c.scheduler(opts()).await;

    // node b full, node a half used: the movable pod can only land on a
    create(&pods, pinned("xa", 2, "a")).await;
    create(&pods, pinned("fill-b", 4, "b")).await;
    wait_for(Duration::from_secs(60), || async {
        (bound(&pods).await.len() == 2).then_some(())
    })
    .await
    .expect("xa and fill-b bound");
    let mut m = gpu_pod("m", 1);
    m["metadata"]["labels"] = json!({"gpusched.io/movable": "true"});
    create(&pods, m).await;
    let b = wait_for(Duration::from_secs(60), || async {
        let b = bound(&pods).await;
        b.contains_key("m").then_some(b)
    })
    .await
    .expect("m bound");
    let node_a = node_of(&b["xa"]);
    assert_eq!(node_of(&b["m"]), node_a);

    // b now keeps one GPU free: one free GPU on each node
    pods.delete("fill-b", &Default::default()).await.unwrap();
    wait_for(Duration::from_secs(60), || async {
        let l = pods.list(&Default::default()).await.ok()?;
        (!l.items
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("fill-b")))
        .then_some(())
    })
    .await
    .expect("fill-b gone");
    create(&pods, pinned("xb", 3, "b")).await;
    wait_for(Duration::from_secs(60), || async {
        bound(&pods).await.contains_key("xb").then_some(())
    })
    .await
    .expect("xb bound");

    // 2 GPUs free in total, none on one node: m moves, p binds on a
    create(&pods, gpu_pod("p", 2)).await;
    let b = wait_for(Duration::from_secs(90), || async {
        let b = bound(&pods).await;
        b.contains_key("p").then_some(b)
    })
    .await
    .expect("the pending pod is bound after the move");
    assert_eq!(node_of(&b["p"]), node_a, "bound where room was made");
    assert!(!b.contains_key("m"), "the moved pod was deleted");
    assert!(
        b.contains_key("xa") && b.contains_key("xb"),
        "nothing else moved"
    );
    let ev = events_for(&c.client, "ml", "m").await;
    assert!(
        ev.iter()
            .any(|e| e.starts_with("Preempted:") && e.contains("moved to make room for ml/p")),
        "{ev:?}"
    );
    assert_no_double_booking(&c.client).await;
    s.stop().await;
}

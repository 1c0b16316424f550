//! The upstream Workload API as a gang source: kube-apiserver v1.37 with
//! the `GenericWorkload` gate on serves `scheduling.k8s.io/v1beta1`
//! PodGroups, and pods name theirs in `spec.schedulingGroup.podGroupName`.
//! A gang PodGroup's pods start all together or none; a `basic` one's pods
//! start one by one; with the API not served the scheduler runs as before.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::scheduling::v1beta1::PodGroup as UpstreamPodGroup;
use kube::Api;
use kube::api::ListParams;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn member(name: &str, group: &str, gpus: u32) -> Value {
    let mut p = gpu_pod(name, gpus);
    p["spec"]["schedulingGroup"] = json!({"podGroupName": group});
    p
}

/// Bound pods whose name starts with `prefix`.
async fn bound_with(api: &Api<Pod>, prefix: &str) -> usize {
    bound(api)
        .await
        .keys()
        .filter(|k| k.starts_with(prefix))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn upstream_pod_groups_are_gangs() {
    // SAFETY: this test binary holds one test, which sets the variable
    // before any thread reads it; the cluster script reads it once.
    unsafe {
        std::env::set_var(
            "GPUSCHED_E2E_APISERVER_ARGS",
            "--feature-gates=GenericWorkload=true --runtime-config=scheduling.k8s.io/v1beta1=true",
        );
    }
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    let groups: Api<UpstreamPodGroup> = Api::namespaced(c.client.clone(), "ml");
    for (name, policy) in [
        ("fits", json!({"gang": {"minCount": 3}})),
        ("toobig", json!({"gang": {"minCount": 3}})),
        ("basic", json!({"basic": {}})),
    ] {
        create_obj(
            &groups,
            json!({"apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
                   "metadata": {"name": name, "labels": {"gpusched.io/queue": "a"}},
                   "spec": {"schedulingPolicy": policy}}),
        )
        .await;
    }
    let pods = c.pods("ml");
    // two of three members exist: the gang waits for the third
    for i in 0..2 {
        create(&pods, member(&format!("fits-{i}"), "fits", 4)).await;
    }
    let p: Pod = pods.get("fits-0").await.unwrap();
    assert_eq!(
        p.spec
            .as_ref()
            .and_then(|s| s.scheduling_group.as_ref())
            .and_then(|g| g.pod_group_name.as_deref()),
        Some("fits"),
        "the apiserver keeps spec.schedulingGroup with the gate on"
    );
    let s = c.scheduler(opts()).await;
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        assert_eq!(bound_with(&pods, "fits-").await, 0, "a partial gang");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    create(&pods, member("fits-2", "fits", 4)).await;
    wait_for(Duration::from_secs(60), || async {
        (bound_with(&pods, "fits-").await == 3).then_some(())
    })
    .await
    .expect("the gang starts whole once its third member exists");
    // 3 × 4 GPUs with 4 free: none starts
    for i in 0..3 {
        create(&pods, member(&format!("toobig-{i}"), "toobig", 4)).await;
    }
    let until = Instant::now() + Duration::from_secs(8);
    while Instant::now() < until {
        assert_eq!(bound_with(&pods, "toobig-").await, 0, "a partial gang");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // basic policy: one by one (two 2-GPU pods fit the 4 free GPUs, the
    // third waits alone)
    for i in 0..3 {
        create(&pods, member(&format!("basic-{i}"), "basic", 2)).await;
    }
    wait_for(Duration::from_secs(60), || async {
        (bound_with(&pods, "basic-").await == 2).then_some(())
    })
    .await
    .expect("the basic group's pods start one by one");
    assert_eq!(bound_with(&pods, "toobig-").await, 0);
    // the pods were charged to the PodGroup's queue
    let api: Api<gpusched_k8s::crd::Queue> = Api::all(c.client.clone());
    let st = wait_for(Duration::from_secs(20), || async {
        let q = api.get("a").await.ok()?;
        q.status
            .filter(|s| s.allocated_gpus.as_deref() == Some("16"))
    })
    .await;
    assert!(
        st.is_some(),
        "queue a holds the 16 GPUs of its PodGroups' pods: {:?}",
        api.get("a").await.unwrap().status
    );
    assert_no_double_booking(&c.client).await;
    let n = pods.list(&ListParams::default()).await.unwrap().items.len();
    assert_eq!(n, 9);
    s.stop().await;
}

//! DRA shares in the core's count on a real kube-apiserver v1.37.2 (issue
//! 25, "one world"): a node whose GPU is published for sharing (as the
//! agent's `--shares` does: `allowMultipleAllocations`, capacity
//! `gpu.gpusched.io/milli` 1000) takes two 500-milli claims on its one GPU,
//! their queue's status counts them as one GPU, and a third claim of 600
//! pends with the core's reason (never allocated).

mod common;

use common::*;
use gpusched_model::dra;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use serde_json::{Value, json};
use std::time::Duration;

const NODES: &str = "nodes:
  - name: shares
    count: 1
    cpu: \"64\"
    memory: 512Gi
";

fn claim(name: &str, milli: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name},
           "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
               "deviceClassName": dra::DEVICE_CLASS,
               "capacity": {"requests": {dra::CAPACITY_MILLI: milli.to_string()}}}}]}}})
}

fn pod(name: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpusched.io/queue": "team"}},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                 "resourceClaims": [{"name": "c", "resourceClaimName": claim}],
                 "containers": [{"name": "main", "image": "x",
                    "resources": {"claims": [{"name": "c"}], "requests": {"cpu": "100m"}}}]}
    })
}

async fn bound(pods: &Api<Pod>, name: &str, secs: u64) -> Option<String> {
    wait_for(Duration::from_secs(secs), || async {
        pods.get(name).await.ok()?.spec?.node_name
    })
    .await
}

async fn allocated(claims: &Api<ResourceClaim>, name: &str) -> Value {
    wait_for(Duration::from_secs(30), || async {
        let c = claims.get(name).await.ok()?;
        c.status.as_ref()?.allocation.as_ref()?;
        let v = serde_json::to_value(&c).ok()?;
        Some(v["status"]["allocation"]["devices"]["results"][0].clone())
    })
    .await
    .unwrap_or_else(|| panic!("claim {name} not allocated"))
}

#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/run)"]
async fn two_half_shares_bind_on_one_gpu_count_one_gpu_and_a_third_pends() {
    let c = Cluster::up().await;
    let nodes = c.nodes_from_yaml(NODES).await;
    let node = &nodes[0];
    let client = c.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    create_obj(
        &classes,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": dra::DEVICE_CLASS},
               "spec": {"selectors": [{"cel": {"expression":
                   format!("device.driver == \"{}\"", dra::DRIVER)}}]}}),
    )
    .await;
    // one GPU, published for sharing as the agent's --shares does
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    create_obj(
        &slices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-{}", dra::DRIVER)},
               "spec": {"driver": dra::DRIVER, "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": [{"name": dra::gpu_device_name(0),
                            "allowMultipleAllocations": true,
                            "attributes": {dra::ATTR_INDEX: {"int": 0},
                                           dra::ATTR_MODEL: {"string": "H100"},
                                           dra::ATTR_UUID: {"string": "GPU-0"}},
                            "capacity": {
                                dra::CAPACITY_MEMORY: {"value": "80Gi", "requestPolicy": {
                                    "default": "0", "validRange": {"min": "0"}}},
                                dra::CAPACITY_MILLI: {"value": "1k", "requestPolicy": {
                                    "default": "1k",
                                    "validRange": {"min": "1", "step": "1", "max": "1k"}}}}}]}}),
    )
    .await;
    c.queue("team", json!({})).await;
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let pods = c.pods("ml");
    let _s = c.scheduler(opts()).await;

    for (p, cl) in [("half-a", "a"), ("half-b", "b")] {
        create_obj(&claims, claim(cl, 500)).await;
        create(&pods, pod(p, cl)).await;
    }
    for p in ["half-a", "half-b"] {
        let got = bound(&pods, p, 30).await;
        if got.is_none() {
            let why = pods.get(p).await.ok().and_then(|x| scheduled_reason(&x));
            panic!("{p} not bound; PodScheduled: {why:?}");
        }
        assert_eq!(got.as_deref(), Some(node.as_str()));
    }
    // both on gpu-0, 500 milli each, distinct shares
    let (ra, rb) = (allocated(&claims, "a").await, allocated(&claims, "b").await);
    let milli = |r: &Value| {
        gpusched_model::Quantity::parse(r["consumedCapacity"][dra::CAPACITY_MILLI].as_str()?)
            .ok()
            .map(|q| q.units())
    };
    for r in [&ra, &rb] {
        assert_eq!(r["device"], "gpu-0", "{r}");
        assert_eq!(milli(r), Some(500), "{r}");
    }
    assert_ne!(ra["shareID"], rb["shareID"]);
    // the queue holds one GPU (two halves), as its status says
    let queues: Api<gpusched_k8s::crd::Queue> = Api::all(client.clone());
    let st = wait_for(Duration::from_secs(15), || async {
        queues
            .get("team")
            .await
            .ok()?
            .status
            .filter(|s| s.allocated_gpus.as_deref() == Some("1"))
    })
    .await;
    assert!(
        st.is_some(),
        "queue team status: {:?}",
        queues.get("team").await.ok().and_then(|q| q.status)
    );
    // a third of 600 does not fit beside them: pending with the core's
    // reason, its claim never allocated
    create_obj(&claims, claim("c", 600)).await;
    create(&pods, pod("big", "c")).await;
    let why = wait_for(Duration::from_secs(30), || async {
        scheduled_reason(&pods.get("big").await.ok()?).filter(|(r, _)| r == "Unschedulable")
    })
    .await
    .expect("big pending with PodScheduled=False");
    assert!(why.1.contains("GPU"), "{why:?}");
    assert_eq!(bound(&pods, "big", 3).await, None);
    let big = claims.get("c").await.unwrap();
    assert!(
        big.status.and_then(|s| s.allocation).is_none(),
        "the pending pod's claim was allocated"
    );
}

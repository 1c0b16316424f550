//! The allocator's newer DRA features on a real kube-apiserver v1.37.2:
//! shared counters (a whole device and its partitions in one pool never
//! both given), consumable capacity (one device shared by claims up to its
//! capacity, with `consumedCapacity` and `shareID` in the results) and
//! binding conditions (the Binding waits until the device's conditions are
//! true on the claim's status). Slices are published by the test, as a
//! driver would, on a kwok node.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use std::time::Duration;

const NODES: &str = "nodes:
  - name: ext
    count: 1
    cpu: \"64\"
    memory: 512Gi
";

const DRIVER: &str = "parts.example.com";

fn class(name: &str, expr: String) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
           "metadata": {"name": name},
           "spec": {"selectors": [{"cel": {"expression": expr}}]}})
}

fn kind_class(kind: &str) -> Value {
    class(
        kind,
        format!(
            "device.driver == \"{DRIVER}\" && device.attributes[\"{DRIVER}\"].kind == \"{kind}\""
        ),
    )
}

fn claim(name: &str, class: &str, count: u32, capacity: Option<&str>) -> Value {
    let mut exactly = json!({"deviceClassName": class, "count": count});
    if let Some(c) = capacity {
        exactly["capacity"] = json!({"requests": {"memory": c}});
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name},
           "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}})
}

fn pod(name: &str, claim: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
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

async fn pending_because(pods: &Api<Pod>, name: &str, text: &str) -> String {
    wait_for(Duration::from_secs(30), || async {
        scheduled_reason(&pods.get(name).await.ok()?)
            .filter(|(_, m)| m.contains(text))
            .map(|(_, m)| m)
    })
    .await
    .unwrap_or_else(|| panic!("{name}: no PodScheduled message containing {text:?}"))
}

fn results(c: &ResourceClaim) -> Vec<Value> {
    let v = serde_json::to_value(c).unwrap();
    v["status"]["allocation"]["devices"]["results"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

async fn allocated(claims: &Api<ResourceClaim>, name: &str) -> ResourceClaim {
    wait_for(Duration::from_secs(30), || async {
        let c = claims.get(name).await.ok()?;
        c.status.as_ref()?.allocation.as_ref()?;
        Some(c)
    })
    .await
    .unwrap_or_else(|| panic!("claim {name} not allocated"))
}

#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/run)"]
async fn shared_counters_consumable_capacity_and_binding_conditions() {
    let c = Cluster::up().await;
    let nodes = c.nodes_from_yaml(NODES).await;
    let node = &nodes[0];
    let client = c.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    for k in ["whole", "half", "shared", "link"] {
        create_obj(&classes, kind_class(k)).await;
    }
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    create_obj(
        &slices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-counters")},
               "spec": {"driver": DRIVER, "nodeName": node, "pool": pool,
                        "sharedCounters": [{"name": "gpu-0", "counters": {
                            "memory": {"value": "80Gi"}}}]}}),
    )
    .await;
    let part = |name: &str, kind: &str, mem: &str| {
        json!({"name": name, "attributes": {"kind": {"string": kind}},
               "consumesCounters": [{"counterSet": "gpu-0",
                                     "counters": {"memory": {"value": mem}}}]})
    };
    let devices = json!([
        part("gpu-0", "whole", "80Gi"),
        part("gpu-0-half-0", "half", "40Gi"),
        part("gpu-0-half-1", "half", "40Gi"),
        {"name": "shared-0", "allowMultipleAllocations": true,
         "attributes": {"kind": {"string": "shared"}},
         "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
             "default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}},
        {"name": "link-0", "attributes": {"kind": {"string": "link"}},
         "bindingConditions": ["Attached"], "bindingFailureConditions": ["AttachFailed"],
         "bindsToNode": true}
    ]);
    let made = create_obj(
        &slices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-parts")},
               "spec": {"driver": DRIVER, "nodeName": node, "pool": pool, "devices": devices}}),
    )
    .await;
    // the API server keeps the fields (their feature gates are on in 1.37)
    let kept = serde_json::to_value(&made).unwrap();
    let kept = &kept["spec"]["devices"];
    assert!(kept[0]["consumesCounters"].is_array(), "{kept}");
    assert_eq!(kept[3]["allowMultipleAllocations"], true, "{kept}");
    assert!(kept[4]["bindingConditions"].is_array(), "{kept}");

    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let pods = c.pods("ml");
    let _s = c.scheduler(opts()).await;

    // shared counters: two halves run; the whole GPU then cannot
    create_obj(&claims, claim("halves", "half", 2, None)).await;
    create(&pods, pod("p-halves", "halves")).await;
    assert_eq!(
        bound(&pods, "p-halves", 30).await.as_deref(),
        Some(node.as_str())
    );
    let halves = allocated(&claims, "halves").await;
    let got: Vec<Value> = results(&halves)
        .iter()
        .map(|r| r["device"].clone())
        .collect();
    assert_eq!(got, vec![json!("gpu-0-half-0"), json!("gpu-0-half-1")]);
    create_obj(&claims, claim("whole", "whole", 1, None)).await;
    create(&pods, pod("p-whole", "whole")).await;
    let why = pending_because(&pods, "p-whole", "shared counters").await;
    assert!(why.contains("ResourceClaim ml/whole"), "{why}");

    // consumable capacity: 50Gi and 20Gi share the device, 40Gi more
    // does not fit beside them
    create_obj(&claims, claim("big", "shared", 1, Some("50Gi"))).await;
    create(&pods, pod("p-big", "big")).await;
    assert!(bound(&pods, "p-big", 30).await.is_some());
    create_obj(&claims, claim("small", "shared", 1, Some("19.5Gi"))).await;
    create(&pods, pod("p-small", "small")).await;
    assert!(bound(&pods, "p-small", 30).await.is_some());
    let (big, small) = (
        allocated(&claims, "big").await,
        allocated(&claims, "small").await,
    );
    let (rb, rs) = (&results(&big)[0], &results(&small)[0]);
    assert_eq!(rb["device"], "shared-0");
    assert_eq!(rs["device"], "shared-0");
    // 19.5Gi rounds up to the 1Gi step: 20Gi (as the API server writes it)
    let q = |v: &Value| {
        gpusched_model::Quantity::parse(v.as_str().unwrap())
            .unwrap()
            .units()
    };
    assert_eq!(q(&rb["consumedCapacity"]["memory"]), 50 << 30);
    assert_eq!(q(&rs["consumedCapacity"]["memory"]), 20 << 30);
    assert_ne!(rb["shareID"], rs["shareID"]);
    create_obj(&claims, claim("more", "shared", 1, Some("40Gi"))).await;
    create(&pods, pod("p-more", "more")).await;
    pending_because(&pods, "p-more", "request r").await;

    // binding conditions: allocated and reserved, but not bound until the
    // driver says the device is attached
    create_obj(&claims, claim("link", "link", 1, None)).await;
    create(&pods, pod("p-link", "link")).await;
    let link = allocated(&claims, "link").await;
    assert_eq!(results(&link)[0]["bindingConditions"], json!(["Attached"]));
    assert_eq!(
        bound(&pods, "p-link", 4).await,
        None,
        "bound before Attached"
    );
    let mut link = claims.get("link").await.unwrap();
    let mut v = serde_json::to_value(&link).unwrap();
    v["status"]["devices"] = json!([{"driver": DRIVER, "pool": node, "device": "link-0",
        "conditions": [{"type": "Attached", "status": "True", "reason": "Done", "message": "",
                        "lastTransitionTime": "2026-12-06T10:00:00Z"}]}]);
    link = serde_json::from_value(v).unwrap();
    claims
        .replace_status("link", &PostParams::default(), &link)
        .await
        .unwrap();
    assert_eq!(
        bound(&pods, "p-link", 30).await.as_deref(),
        Some(node.as_str())
    );
}

#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/run)"]
async fn kep_5004_a_pod_asking_nvidia_gpu_on_a_dra_node_gets_its_special_claim() {
    use gpusched_model::dra;
    let c = Cluster::up().await;
    let nodes = c.nodes_from_yaml(NODES).await;
    let node = &nodes[0];
    let client = c.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    create_obj(
        &classes,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": dra::DEVICE_CLASS},
               "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel":
                   {"expression": format!("device.driver == \"{}\"", dra::DRIVER)}}]}}),
    )
    .await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices: Vec<Value> = (0..4u32)
        .map(|i| {
            json!({"name": dra::gpu_device_name(i), "attributes": {
                dra::ATTR_INDEX: {"int": i}, dra::ATTR_MODEL: {"string": "H100"},
                dra::ATTR_UUID: {"string": format!("GPU-{i}")}},
                "capacity": {dra::CAPACITY_MEMORY: {"value": "80Gi"}}})
        })
        .collect();
    create_obj(
        &slices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-{}", dra::DRIVER)},
               "spec": {"driver": dra::DRIVER, "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices}}),
    )
    .await;
    let pods = c.pods("ml");
    let _s = c.scheduler(opts()).await;
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
               "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "cuda", "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": "2"},
                            "limits": {"nvidia.com/gpu": "2"}}}]}}),
    )
    .await;
    let bound_to = bound(&pods, "train", 30).await;
    if bound_to.is_none() {
        let why = pods
            .get("train")
            .await
            .ok()
            .and_then(|p| scheduled_reason(&p));
        panic!("train not bound; PodScheduled: {why:?}");
    }
    assert_eq!(bound_to.as_deref(), Some(node.as_str()));
    let p = pods.get("train").await.unwrap();
    let st = p
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .expect("status.extendedResourceClaimStatus written before the Binding");
    assert!(
        st.resource_claim_name
            .starts_with("train-extended-resources-"),
        "{st:?}"
    );
    assert_eq!(st.request_mappings.len(), 1);
    let m = &st.request_mappings[0];
    assert_eq!(
        (
            m.container_name.as_str(),
            m.resource_name.as_str(),
            m.request_name.as_str()
        ),
        ("main", "nvidia.com/gpu", "container-0-request-1")
    );
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let claim = allocated(&claims, &st.resource_claim_name).await;
    let meta = &claim.metadata;
    assert_eq!(
        meta.annotations.as_ref().unwrap()["resource.kubernetes.io/extended-resource-claim"],
        "true"
    );
    let owner = &meta.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Pod", "train"));
    assert_eq!(owner.uid, p.metadata.uid.clone().unwrap());
    assert_eq!(owner.controller, Some(true));
    let r = results(&claim);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(
        r.iter().all(|r| r["request"] == "container-0-request-1"),
        "{r:?}"
    );
    let reserved = claim
        .status
        .as_ref()
        .unwrap()
        .reserved_for
        .as_ref()
        .unwrap();
    assert_eq!(reserved[0].uid, p.metadata.uid.clone().unwrap());
    // a second pod asking 3 does not fit beside it on the 4 GPUs
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "more"},
               "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "cuda", "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": "3"},
                            "limits": {"nvidia.com/gpu": "3"}}}]}}),
    )
    .await;
    assert_eq!(bound(&pods, "more", 5).await, None);
}

/// #39 item 8, on a real API server: NVIDIA's DRA driver publishes the
/// GPUs (`gpu.nvidia.com`) and its DeviceClass maps `nvidia.com/gpu` to
/// them. gpusched, started without `--dra-gpu-driver`, said "node(s) had
/// no GPUs"; the class now makes those devices GPUs: the pod is bound with
/// its special claim allocated from NVIDIA's devices.
#[tokio::test]
#[ignore = "needs the e2e control plane (e2e/run)"]
async fn another_drivers_class_mapping_nvidia_gpu_serves_it_without_the_flag() {
    const NV: &str = "gpu.nvidia.com";
    let c = Cluster::up().await;
    let nodes = c.nodes_from_yaml(NODES).await;
    let node = &nodes[0];
    let client = c.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    create_obj(
        &classes,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
               "metadata": {"name": NV},
               "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression":
                   format!("device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'")}}]}}),
    )
    .await;
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let devices: Vec<Value> = (0..4u32)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"}, "index": {"int": i},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "uuid": {"string": format!("GPU-nv-{i}")}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    create_obj(
        &slices,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
               "metadata": {"name": format!("{node}-{NV}")},
               "spec": {"driver": NV, "nodeName": node,
                        "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                        "devices": devices}}),
    )
    .await;
    let pods = c.pods("ml");
    let mut o = opts();
    o.dra_gpu_drivers = Vec::new();
    let _s = c.scheduler(o).await;
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train"},
               "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "cuda", "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": "2"},
                            "limits": {"nvidia.com/gpu": "2"}}}]}}),
    )
    .await;
    if bound(&pods, "train", 30).await.as_deref() != Some(node.as_str()) {
        let why = pods
            .get("train")
            .await
            .ok()
            .and_then(|p| scheduled_reason(&p));
        panic!("train not bound to {node}; PodScheduled: {why:?}");
    }
    let p = pods.get("train").await.unwrap();
    let st = p
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .expect("status.extendedResourceClaimStatus written before the Binding");
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "ml");
    let claim = allocated(&claims, &st.resource_claim_name).await;
    let r = results(&claim);
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r.iter().all(|r| r["driver"] == NV), "{r:?}");
    // the node's 4 GPUs: 2 left, so a pod asking 3 waits, told why
    create(
        &pods,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "more"},
               "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 0,
                        "containers": [{"name": "main", "image": "cuda", "resources": {
                            "requests": {"cpu": "100m", "nvidia.com/gpu": "3"},
                            "limits": {"nvidia.com/gpu": "3"}}}]}}),
    )
    .await;
    let why = pending_because(&pods, "more", "Insufficient nvidia.com/gpu").await;
    assert!(!why.contains("had no GPUs"), "{why}");
}

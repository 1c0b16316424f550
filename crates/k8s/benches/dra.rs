//! DRA claim allocation in-process (issue 25): a world of N nodes × 8 GPUs
//! published as ResourceSlices of gpusched's driver, and P pods each with
//! its own 1-GPU ResourceClaim (a CEL selector on the model). Measured:
//!
//! - **feasibility**: one `World::build` with all P pods pending — for each
//!   pod, on which nodes its claim can be allocated (the allocator over
//!   every node), as a cycle does; pods whose claims ask the same share one
//!   answer per build, so this is one allocator pass over the nodes plus
//!   the per-pod bookkeeping;
//! - **allocations**: `World::allocate_claims` for every pod on a node
//!   (round robin), as the executor does at bind time: claim allocations
//!   per second, each checked against the devices held by the earlier ones.
//!
//! ```text
//! cargo bench -p gpusched-k8s --bench dra -- [nodes] [pods]   # default 1000 5000
//! ```

use gpusched_k8s::world::World;
use gpusched_model::dra;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let nodes: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let pods: u32 = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(5000);
    let mut w = World::default();
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": dra::DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{}\"", dra::DRIVER)}}]}
    }))
    .unwrap();
    w.upsert_device_class(&class);
    let t0 = Instant::now();
    for n in 0..nodes {
        let name = format!("node-{n:05}");
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                       "conditions": [{"type": "Ready", "status": "True"}]}
        }))
        .unwrap();
        w.upsert_node(&node);
        let devices: Vec<Value> = (0..8u32)
            .map(|i| {
                json!({"name": dra::gpu_device_name(i), "attributes": {
                    dra::ATTR_INDEX: {"int": i},
                    dra::ATTR_MODEL: {"string": "H100"},
                    dra::ATTR_NVLINK_DOMAIN: {"string": format!("{name}-{}", i / 4)},
                }, "capacity": {dra::CAPACITY_MEMORY: {"value": "80Gi"}}})
            })
            .collect();
        let s: ResourceSlice = serde_json::from_value(json!({
            "metadata": {"name": format!("{name}-gpus")},
            "spec": {"driver": dra::DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap();
        w.upsert_slice(&s);
    }
    for p in 0..pods {
        let c: ResourceClaim = serde_json::from_value(json!({
            "metadata": {"name": format!("c{p}"), "namespace": "ml", "uid": format!("uc{p}")},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": dra::DEVICE_CLASS,
                "selectors": [{"cel": {"expression": "device.attributes[\"gpu.gpusched.io\"].model == \"H100\""}}]}}]}}
        }))
        .unwrap();
        w.upsert_claim(&c);
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("p{p}"), "namespace": "ml", "uid": format!("up{p}"),
                         "creationTimestamp": "2026-12-01T10:00:00Z"},
            "spec": {"schedulerName": "gpusched",
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": format!("c{p}")}],
                     "containers": [{"name": "main", "image": "x", "resources": {"claims": [{"name": "gpu"}]}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap();
        w.upsert_pod(&pod);
    }
    println!(
        "world: {nodes} nodes x 8 GPUs, {pods} pods with one 1-GPU claim each (set up in {:.2} s)",
        t0.elapsed().as_secs_f64()
    );
    // first build: every selector evaluated once per device (cold cache)
    for round in ["cold", "warm"] {
        let t = Instant::now();
        let b = w.build();
        let s = t.elapsed().as_secs_f64();
        let placed = b
            .snapshot
            .pods
            .iter()
            .filter(|p| p.pod.constraints().claim_nodes.is_some())
            .count();
        assert_eq!(placed, pods as usize, "every pod has nodes");
        println!(
            "feasibility ({round} selector cache): one build with {pods} pending pods over {nodes} nodes in {s:.3} s (the pods ask alike: their nodes are computed once per build and shared)"
        );
    }
    let t = Instant::now();
    let mut ok = 0u32;
    for p in 0..pods {
        let node = format!("node-{:05}", p % nodes);
        if w.allocate_claims(&format!("up{p}"), &node).is_ok() {
            ok += 1;
        }
    }
    let s = t.elapsed().as_secs_f64();
    assert_eq!(
        ok,
        pods.min(nodes * 8),
        "every pod allocated while GPUs last"
    );
    println!(
        "allocations at bind time: {ok} claims in {s:.3} s = {:.0} claim allocations/s",
        f64::from(ok) / s
    );
}

//! DRA in the scheduler's world, without an API server: a pod's claims
//! must exist and be allocatable; the core sees only the nodes where they
//! are; allocations at bind time never give a device twice; a shared
//! claim is allocated once.

use gpusched_core::report::classify::PendingClass;
use gpusched_k8s::world::{Problem, World};
use gpusched_model::dra;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

// the tests, by topic (this file: the world's DRA objects, claims that
// wait or are refused, allocation at bind, and the helpers they share)
mod core_gpus;
mod devices;
mod extended;
mod tenant;

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn slice(node: &str, gpus: u32, model: &str) -> ResourceSlice {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"name": dra::gpu_device_name(i), "attributes": {
                dra::ATTR_INDEX: {"int": i},
                dra::ATTR_MODEL: {"string": model},
                dra::ATTR_NVLINK_DOMAIN: {"string": format!("{node}-{}", i / 4)},
            }, "capacity": {dra::CAPACITY_MEMORY: {"value": "80Gi"}}})
        })
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": dra::DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
    .unwrap()
}

fn device_class() -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": dra::DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{}\"", dra::DRIVER)}}]}
    }))
    .unwrap()
}

fn claim(name: &str, requests: Value) -> ResourceClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": requests}}
    }))
    .unwrap()
}

fn gpus(n: u32) -> Value {
    json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS, "count": n}}])
}

fn pod(name: &str, claims: &[&str]) -> Pod {
    let rc: Vec<Value> = claims
        .iter()
        .enumerate()
        .map(|(i, c)| json!({"name": format!("c{i}"), "resourceClaimName": c}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"schedulerName": "gpusched", "resourceClaims": rc, "containers": [
            {"name": "main", "image": "x", "resources": {"claims": [{"name": "c0"}]}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

fn claims_problem(w: &World, pod: &str) -> Option<(PendingClass, String)> {
    w.build().problems.into_iter().find_map(|p| match p {
        Problem::ClaimsPending {
            pod: r,
            class,
            message,
        } if r.name == pod => Some((class, message)),
        _ => None,
    })
}

fn claim_nodes(w: &World, pod: &str) -> Option<Vec<String>> {
    let b = w.build();
    let i = b.pods.iter().position(|p| p.name == pod)?;
    b.snapshot.pods[i].pod.constraints().claim_nodes.clone()
}

#[test]
fn a_pod_waits_for_its_claim_then_sees_only_nodes_that_can_allocate_it() {
    let mut w = World::default();
    for n in ["a", "b", "c"] {
        w.upsert_node(&node(n));
    }
    w.upsert_pod(&pod("p", &["one"]));
    let (class, msg) = claims_problem(&w, "p").expect("waits");
    assert_eq!(class, PendingClass::WaitingForClaim);
    assert!(msg.contains("ResourceClaim ml/one"), "{msg}");
    assert!(
        w.build().pods.iter().all(|p| p.name != "p"),
        "not given to the core"
    );

    w.upsert_claim(&claim("one", gpus(4)));
    w.upsert_device_class(&device_class());
    let (class_, msg) = claims_problem(&w, "p").expect("no devices yet");
    assert_eq!(class_, PendingClass::UnallocatableClaim);
    assert!(msg.contains("cannot be allocated"), "{msg}");

    w.upsert_slice(&slice("a", 2, "H100"));
    w.upsert_slice(&slice("b", 8, "H100"));
    assert_eq!(claims_problem(&w, "p"), None);
    assert_eq!(claim_nodes(&w, "p"), Some(vec!["b".to_string()]));
}

#[test]
fn devices_allocated_at_bind_time_are_never_given_twice() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    w.upsert_claim(&claim("x", gpus(6)));
    w.upsert_claim(&claim("y", gpus(4)));
    w.upsert_pod(&pod("px", &["x"]));
    w.upsert_pod(&pod("py", &["y"]));
    // each alone fits on a
    assert_eq!(claim_nodes(&w, "px"), Some(vec!["a".to_string()]));
    assert_eq!(claim_nodes(&w, "py"), Some(vec!["a".to_string()]));
    let wx = w.allocate_claims("uid-px", "a").unwrap();
    assert_eq!(wx.len(), 1);
    let got = wx[0].allocate.as_ref().unwrap();
    assert_eq!(got.node.as_deref(), Some("a"));
    assert_eq!(got.devices.len(), 6);
    // the second cannot have the 6 held tentatively
    let e = w.allocate_claims("uid-py", "a").unwrap_err();
    assert!(e.contains("2 of 4 device(s) available"), "{e}");
    let (class, _) = claims_problem(&w, "py").expect("py waits now");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    // the binding failed: the devices are free again
    w.forget("uid-px");
    assert!(w.allocate_claims("uid-py", "a").is_ok());
}

#[test]
fn a_shared_claim_is_allocated_once_and_pins_its_pods_to_its_node() {
    let mut w = World::default();
    for n in ["a", "b"] {
        w.upsert_node(&node(n));
        w.upsert_slice(&slice(n, 8, "H100"));
    }
    w.upsert_device_class(&device_class());
    w.upsert_claim(&claim("shared", gpus(1)));
    w.upsert_pod(&pod("p1", &["shared"]));
    w.upsert_pod(&pod("p2", &["shared"]));
    assert_eq!(
        claim_nodes(&w, "p1"),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    let w1 = w.allocate_claims("uid-p1", "b").unwrap();
    assert!(w1[0].allocate.is_some());
    // p2 now follows the claim to b and only reserves it
    assert_eq!(claim_nodes(&w, "p2"), Some(vec!["b".to_string()]));
    let w2 = w.allocate_claims("uid-p2", "b").unwrap();
    assert_eq!(w2[0].allocate, None);
    assert!(w.allocate_claims("uid-p2", "a").is_err());
    // the status shows it allocated: the same from the claim itself
    let mut c = claim("shared", gpus(1));
    let alloc = gpusched_k8s::exec::claims::allocation_result(w1[0].allocate.as_ref().unwrap());
    c.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(alloc),
        reserved_for: None,
        devices: None,
    });
    w.upsert_claim(&c);
    assert_eq!(w.dra().tentative_len(), 0);
    assert_eq!(claim_nodes(&w, "p2"), Some(vec!["b".to_string()]));
}

#[test]
fn a_bad_claim_is_unallocatable_naming_the_field() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    w.upsert_claim(&claim(
        "bad",
        json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS, "count": 0}}]),
    ));
    w.upsert_pod(&pod("p", &["bad"]));
    let (class, msg) = claims_problem(&w, "p").unwrap();
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(
        msg.contains("ResourceClaim ml/bad: spec.devices.requests[0].exactly.count"),
        "{msg}"
    );
    // a selector on the model: no H200 anywhere
    w.upsert_claim(&claim(
        "bad",
        json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS,
            "selectors": [{"cel": {"expression": "device.attributes[\"gpu.gpusched.io\"].model == \"H200\""}}]}}]),
    ));
    let (_, msg) = claims_problem(&w, "p").unwrap();
    assert!(msg.contains("0 match the class and selectors"), "{msg}");
}

fn gpu_pod(name: &str, gpus: u32) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {
                "requests": {"cpu": "1", "nvidia.com/gpu": gpus.to_string()},
                "limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap()
}

/// A pod of ours bound to `node`.
fn bound_pod(name: &str, claims: &[&str], node: &str) -> Pod {
    let mut p = pod(name, claims);
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.status.as_mut().unwrap().phase = Some("Running".into());
    p
}

/// A claim allocated on `node` to these devices, reserved for these pods.
fn allocated(
    name: &str,
    requests: Value,
    node: &str,
    devices: &[u32],
    pods: &[&str],
) -> ResourceClaim {
    let mut c = claim(name, requests);
    c.status = Some(
        serde_json::from_value(json!({
            "allocation": {
                "devices": {"results": devices.iter().map(|i| json!({
                    "request": "gpu", "driver": dra::DRIVER, "pool": node,
                    "device": dra::gpu_device_name(*i)})).collect::<Vec<_>>()},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
            },
            "reservedFor": pods.iter().map(|p| json!({
                "resource": "pods", "name": p, "uid": format!("uid-{p}")})).collect::<Vec<_>>()
        }))
        .unwrap(),
    );
    c
}

fn snap_pod<'a>(b: &'a gpusched_k8s::world::Built, name: &str) -> &'a gpusched_core::PodState {
    let i = b.pods.iter().position(|p| p.name == name).unwrap();
    &b.snapshot.pods[i]
}

/// One cycle of the default scheduler on the world's snapshot: the pods it
/// binds with their GPU positions, and each pending pod's explanation.
type Binds = Vec<(String, Vec<u32>)>;

fn cycle(w: &World) -> (Binds, Vec<(String, String)>) {
    use gpusched_core::{Decision, GpuAssignment};
    let b = w.build();
    let mut cfg = gpusched_plugins::SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    let out = gpusched_plugins::build(&cfg)
        .unwrap()
        .cycle(&b.snapshot, 1_000, 7);
    let name = |p: u32| b.snapshot.pods[p as usize].pod.name.clone();
    let binds = out
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind {
                pod,
                gpus: GpuAssignment::Whole(g),
                ..
            } => Some((name(*pod), g.clone())),
            _ => None,
        })
        .collect();
    let why = out
        .explanations
        .iter()
        .map(|e| (name(e.pod), e.message()))
        .collect();
    (binds, why)
}

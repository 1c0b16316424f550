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

fn taint_rule(name: &str, selector: Value, effect: &str) -> DeviceTaintRule {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"deviceSelector": selector,
                 "taint": {"key": "example.com/maintenance", "value": "rack-7", "effect": effect}}
    }))
    .unwrap()
}

#[test]
fn device_taint_rules_taint_the_devices_they_select_until_removed() {
    let mut w = World::default();
    for n in ["a", "b"] {
        w.upsert_node(&node(n));
        w.upsert_slice(&slice(n, 4, "H100"));
    }
    w.upsert_device_class(&device_class());
    w.upsert_claim(&claim("four", gpus(4)));
    w.upsert_pod(&pod("p", &["four"]));
    let both = Some(vec!["a".to_string(), "b".to_string()]);
    assert_eq!(claim_nodes(&w, "p"), both);

    // one device of node a's pool: a cannot give 4 untainted GPUs
    w.upsert_device_taint_rule(&taint_rule(
        "gpu1-of-a",
        json!({"driver": dra::DRIVER, "pool": "a", "device": dra::gpu_device_name(1)}),
        "NoSchedule",
    ));
    assert_eq!(claim_nodes(&w, "p"), Some(vec!["b".to_string()]));
    // a slice published again keeps the rule's taint
    w.upsert_slice(&slice("a", 4, "H100"));
    assert_eq!(claim_nodes(&w, "p"), Some(vec!["b".to_string()]));
    // an informational rule (effect None) over every device changes nothing
    w.upsert_device_taint_rule(&taint_rule(
        "all-info",
        json!({"driver": dra::DRIVER}),
        "None",
    ));
    assert_eq!(claim_nodes(&w, "p"), Some(vec!["b".to_string()]));
    // a rule on another driver's devices does not touch ours
    w.upsert_device_taint_rule(&taint_rule(
        "other-driver",
        json!({"driver": "nic.example.com"}),
        "NoExecute",
    ));
    assert_eq!(claim_nodes(&w, "p"), Some(vec!["b".to_string()]));
    // every device of ours, NoExecute: no node, and the reason says taints
    w.upsert_device_taint_rule(&taint_rule(
        "all",
        json!({"driver": dra::DRIVER}),
        "NoExecute",
    ));
    let (class, msg) = claims_problem(&w, "p").expect("unallocatable");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(msg.contains("untolerated taints"), "{msg}");
    // a claim that tolerates the taint sees both nodes again
    let mut tolerant = gpus(4);
    tolerant[0]["exactly"]["tolerations"] =
        json!([{"key": "example.com/maintenance", "operator": "Exists"}]);
    w.upsert_claim(&claim("four", tolerant));
    assert_eq!(claim_nodes(&w, "p"), both);
    // rules removed: the devices are as their slices say
    w.upsert_claim(&claim("four", gpus(4)));
    for r in ["all", "gpu1-of-a", "all-info", "other-driver"] {
        w.remove(gpusched_k8s::world::ObjectKind::DeviceTaintRule, r);
    }
    assert_eq!(claim_nodes(&w, "p"), both);
}

fn kind_class(kind: &str) -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": kind},
        "spec": {"selectors": [{"cel": {"expression":
            format!("device.attributes[\"{}\"].kind == \"{kind}\"", dra::DRIVER)}}]}
    }))
    .unwrap()
}

fn of_kind(kind: &str, n: u32) -> Value {
    json!([{"name": "p", "exactly": {"deviceClassName": kind, "count": n}}])
}

/// One GPU's counters in a slice of their own, its whole and half
/// partitions in another (one pool, as a MIG driver may publish them).
fn partitioned(node: &str) -> (ResourceSlice, ResourceSlice) {
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    let counters: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-counters")},
        "spec": {"driver": dra::DRIVER, "nodeName": node, "pool": pool,
                 "sharedCounters": [{"name": "gpu-0", "counters": {
                     "memory": {"value": "80Gi"}, "slices": {"value": "2"}}}]}
    }))
    .unwrap();
    let dev = |name: &str, kind: &str, mem: &str, slices: u32| {
        json!({"name": name, "attributes": {"kind": {"string": kind}},
               "consumesCounters": [{"counterSet": "gpu-0", "counters": {
                   "memory": {"value": mem}, "slices": {"value": slices.to_string()}}}]})
    };
    let devices: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-parts")},
        "spec": {"driver": dra::DRIVER, "nodeName": node, "pool": pool, "devices": [
            dev("gpu-0", "whole", "80Gi", 2),
            dev("gpu-0-half-0", "half", "40Gi", 1),
            dev("gpu-0-half-1", "half", "40Gi", 1)]}
    }))
    .unwrap();
    (counters, devices)
}

#[test]
fn partitions_and_the_whole_gpu_never_exceed_their_shared_counters() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&kind_class("whole"));
    w.upsert_device_class(&kind_class("half"));
    let (counters, parts) = partitioned("a");
    w.upsert_slice(&parts);
    w.upsert_claim(&claim("halves", of_kind("half", 2)));
    w.upsert_claim(&claim("whole", of_kind("whole", 1)));
    w.upsert_pod(&pod("ph", &["halves"]));
    w.upsert_pod(&pod("pw", &["whole"]));
    // the counter set is not published yet: nothing consuming it is given
    let (_, msg) = claims_problem(&w, "pw").expect("no counters");
    assert!(
        msg.contains("counter set gpu.gpusched.io/a/gpu-0 is not published"),
        "{msg}"
    );
    w.upsert_slice(&counters);
    assert_eq!(claim_nodes(&w, "pw"), Some(vec!["a".to_string()]));
    assert_eq!(claim_nodes(&w, "ph"), Some(vec!["a".to_string()]));
    // the halves are allocated (tentatively): the whole GPU is not free
    let wh = w.allocate_claims("uid-ph", "a").unwrap();
    let got: Vec<&str> = wh[0]
        .allocate
        .as_ref()
        .unwrap()
        .devices
        .iter()
        .map(|d| d.id.device.as_str())
        .collect();
    assert_eq!(got, ["gpu-0-half-0", "gpu-0-half-1"]);
    let e = w.allocate_claims("uid-pw", "a").unwrap_err();
    assert!(e.contains("1 without enough shared counters left"), "{e}");
    let (_, msg) = claims_problem(&w, "pw").expect("pw waits");
    assert!(msg.contains("shared counters"), "{msg}");
    // seen in the claim's status: still held
    let mut c = claim("halves", of_kind("half", 2));
    c.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(gpusched_k8s::exec::claims::allocation_result(
            wh[0].allocate.as_ref().unwrap(),
        )),
        reserved_for: None,
        devices: None,
    });
    w.upsert_claim(&c);
    assert_eq!(w.dra().tentative_len(), 0);
    assert!(w.allocate_claims("uid-pw", "a").is_err());
    // deallocated: the whole GPU can go
    w.upsert_claim(&claim("halves", of_kind("half", 2)));
    let ww = w.allocate_claims("uid-pw", "a").unwrap();
    assert_eq!(
        ww[0].allocate.as_ref().unwrap().devices[0].id.device,
        "gpu-0"
    );
    // and now no half fits
    w.upsert_claim(&claim("one-half", of_kind("half", 1)));
    w.upsert_pod(&pod("p1", &["one-half"]));
    assert!(w.allocate_claims("uid-p1", "a").is_err());
}

fn shareable_slice(node: &str) -> ResourceSlice {
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-shared")},
        "spec": {"driver": dra::DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "allowMultipleAllocations": true,
                    "attributes": {"kind": {"string": "shared"}},
                    "capacity": {"memory": {"value": "80Gi", "requestPolicy": {
                        "default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}}]}
    }))
    .unwrap()
}

fn memory(gi: &str) -> Value {
    json!([{"name": "m", "exactly": {"deviceClassName": "shared",
        "capacity": {"requests": {"memory": gi}}}}])
}

#[test]
fn consumable_capacity_is_shared_up_to_the_device_capacity_across_pods() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&kind_class("shared"));
    w.upsert_slice(&shareable_slice("a"));
    w.upsert_claim(&claim("x", memory("50Gi")));
    w.upsert_claim(&claim("y", memory("40Gi")));
    w.upsert_claim(&claim("z", memory("29.5Gi")));
    for p in ["x", "y", "z"] {
        w.upsert_pod(&pod(&format!("p{p}"), &[p]));
    }
    let wx = w.allocate_claims("uid-px", "a").unwrap();
    let ax = wx[0].allocate.clone().unwrap();
    let api = serde_json::to_value(gpusched_k8s::exec::claims::allocation_result(&ax)).unwrap();
    let r = &api["devices"]["results"][0];
    assert_eq!(r["device"], "gpu-0");
    assert_eq!(
        r["consumedCapacity"],
        json!({"memory": (50u64 << 30).to_string()})
    );
    assert_eq!(r["shareID"].as_str().map(str::len), Some(36));
    // 50 + 40 > 80: y waits; 50 + 29.5 rounded up to 30 fits
    let e = w.allocate_claims("uid-py", "a").unwrap_err();
    assert!(e.contains("1 in use"), "{e}");
    let (_, msg) = claims_problem(&w, "py").expect("py waits");
    assert!(msg.contains("request m"), "{msg}");
    let wz = w.allocate_claims("uid-pz", "a").unwrap();
    let az = wz[0].allocate.as_ref().unwrap();
    assert_eq!(az.devices[0].consumed["memory"], (30i128 << 30) * 1000);
    assert_ne!(az.devices[0].share, ax.devices[0].share);
    // x seen in its status (amounts read back from it), z forgotten:
    // y still does not fit beside x, and fits once x is deallocated
    let mut c = claim("x", memory("50Gi"));
    c.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(gpusched_k8s::exec::claims::allocation_result(&ax)),
        reserved_for: None,
        devices: None,
    });
    w.upsert_claim(&c);
    w.forget("uid-pz");
    assert_eq!(w.dra().tentative_len(), 0);
    assert!(w.allocate_claims("uid-py", "a").is_err());
    w.upsert_claim(&claim("x", memory("50Gi")));
    assert!(w.allocate_claims("uid-py", "a").is_ok());
    // more than the device's capacity: no node, named
    w.upsert_claim(&claim("huge", memory("100Gi")));
    w.upsert_pod(&pod("ph", &["huge"]));
    let (_, msg) = claims_problem(&w, "ph").expect("never fits");
    assert!(msg.contains("capacity gpu.gpusched.io/memory"), "{msg}");
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

#[test]
fn kep_5004_a_pod_asking_a_mapped_extended_resource_gets_a_special_claim_on_a_dra_node() {
    let mut w = World::default();
    w.upsert_node(&node("dra"));
    // a device-plugin node: its allocatable has nvidia.com/gpu
    let mut dp = node("dp");
    if let Some(a) = dp.status.as_mut().and_then(|s| s.allocatable.as_mut()) {
        a.insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
        );
    }
    w.upsert_node(&dp);
    w.upsert_slice(&slice("dra", 8, "H100"));
    w.upsert_pod(&gpu_pod("p", 2));
    // no class maps nvidia.com/gpu yet: nothing to allocate anywhere
    assert!(w.allocate_claims("uid-p", "dra").unwrap().is_empty());
    let mut class = device_class();
    class.spec.as_mut().unwrap().extended_resource_name = Some("nvidia.com/gpu".into());
    w.upsert_device_class(&class);
    // the device plugin serves it on dp
    assert!(w.allocate_claims("uid-p", "dp").unwrap().is_empty());
    // on the DRA node: one special claim of 2 GPUs, named as upstream
    let writes = w.allocate_claims("uid-p", "dra").unwrap();
    assert_eq!(writes.len(), 1);
    let sw = &writes[0];
    assert_eq!(sw.name, "<extended-resources>");
    let reqs = sw.extended.as_ref().expect("a claim to create");
    assert_eq!(reqs.len(), 1);
    assert_eq!(reqs[0].request, "container-0-request-1");
    assert_eq!(reqs[0].resource, "nvidia.com/gpu");
    assert_eq!(reqs[0].class, dra::DEVICE_CLASS);
    assert_eq!(reqs[0].count, 2);
    let a = sw.allocate.as_ref().unwrap();
    assert_eq!(a.node.as_deref(), Some("dra"));
    let devs: Vec<&str> = a.devices.iter().map(|d| d.id.device.as_str()).collect();
    assert_eq!(devs, ["gpu-0", "gpu-1"]);
    assert!(
        a.devices
            .iter()
            .all(|d| d.request == "container-0-request-1")
    );
    // held: a second pod asking 7 does not fit beside it
    w.upsert_pod(&gpu_pod("q", 7));
    let e = w.allocate_claims("uid-q", "dra").unwrap_err();
    assert!(e.contains("6 of 7 device(s) available"), "{e}");
    // the claim created (annotated, owned by p) shows its allocation:
    // the in-memory hold goes, the claim's allocation holds the devices
    let mut made = gpusched_k8s::dra::extended::claim_object("ml", "p", "uid-p", reqs);
    made.metadata.name = Some("p-extended-resources-x7k2p".into());
    made.metadata.uid = Some("uid-made".into());
    made.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(gpusched_k8s::exec::claims::allocation_result(a)),
        reserved_for: None,
        devices: None,
    });
    w.upsert_claim(&made);
    assert_eq!(w.dra().tentative_len(), 0);
    assert!(w.allocate_claims("uid-q", "dra").is_err());
    // the pod names it in its status: it is one of the pod's claims, so
    // a retry only reserves it, and no second claim is made
    let mut p = gpu_pod("p", 2);
    p.status.as_mut().unwrap().extended_resource_claim_status = Some(
        gpusched_k8s::dra::extended::pod_status("p-extended-resources-x7k2p", reqs),
    );
    w.upsert_pod(&p);
    let again = w.allocate_claims("uid-p", "dra").unwrap();
    assert_eq!(again.len(), 1);
    assert_eq!(again[0].name, "p-extended-resources-x7k2p");
    assert_eq!(again[0].allocate, None);
    assert_eq!(again[0].extended, None);
    // the claim deleted (say a rollback): a new one is made
    w.forget("uid-p");
    w.remove(
        gpusched_k8s::world::ObjectKind::ResourceClaim,
        "ml/p-extended-resources-x7k2p",
    );
    let fresh = w.allocate_claims("uid-p", "dra").unwrap();
    assert!(fresh[0].extended.is_some());
}

#[test]
fn kep_5004_a_bad_extended_amount_is_refused_naming_the_container() {
    let mut w = World::default();
    w.upsert_node(&node("dra"));
    w.upsert_slice(&slice("dra", 8, "H100"));
    let mut class = device_class();
    class.spec.as_mut().unwrap().extended_resource_name = Some("example.com/fpga".into());
    w.upsert_device_class(&class);
    let p: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"requests": {"example.com/fpga": "200"}}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    w.upsert_pod(&p);
    let e = w.allocate_claims("uid-p", "dra").unwrap_err();
    assert!(
        e.contains("pod ml/p: container main: extended resource example.com/fpga"),
        "{e}"
    );
    // nine: more than the node has
    let p9: Pod = serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "uid-p"},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"requests": {"example.com/fpga": "9"}}}]},
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    w.upsert_pod(&p9);
    let e = w.allocate_claims("uid-p", "dra").unwrap_err();
    assert!(e.contains("8 of 9 device(s) available"), "{e}");
    assert_eq!(w.dra().tentative_len(), 0);
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

fn node_of<'a>(b: &'a gpusched_k8s::world::Built, name: &str) -> &'a gpusched_model::Node {
    b.snapshot.nodes.iter().find(|n| n.name == name).unwrap()
}

#[test]
fn slice_gpus_are_the_core_gpus_and_claims_count_on_their_pods() {
    use gpusched_core::{GpuAssignment, PodPhase};
    use gpusched_model::{GpuHealth, GpuRequest};
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_node(&node("b"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    let b = w.build();
    let a = node_of(&b, "a");
    assert_eq!(a.gpus.len(), 8);
    assert!(
        a.gpus
            .iter()
            .all(|g| g.model == "H100" && g.memory_mib == 80 * 1024)
    );
    assert_eq!(
        a.gpus.iter().map(|g| g.topo.nvlink).collect::<Vec<_>>(),
        [0, 0, 0, 0, 1, 1, 1, 1].map(Some).to_vec()
    );
    assert_eq!(a.allocatable.gpu_milli, 8000);
    assert!(node_of(&b, "b").gpus.is_empty());

    // pending: the claim's GPUs are the pod's demand
    w.upsert_claim(&claim("two", gpus(2)));
    w.upsert_pod(&pod("p", &["two"]));
    // bound: its claim's devices are its GPUs
    w.upsert_claim(&allocated("q", gpus(2), "a", &[5, 6], &["q"]));
    w.upsert_pod(&bound_pod("q", &["q"], "a"));
    // a shared claim counts once, on the first pod it is reserved for
    w.upsert_claim(&allocated("s", gpus(1), "a", &[1], &["s1", "s2"]));
    w.upsert_pod(&bound_pod("s1", &["s"], "a"));
    w.upsert_pod(&bound_pod("s2", &["s"], "a"));
    // allocated for no pod we know (another scheduler's, or its pod is
    // gone): the GPU is used, on nobody
    w.upsert_claim(&allocated("orphan", gpus(1), "a", &[7], &[]));
    let b = w.build();
    assert_eq!(snap_pod(&b, "p").pod.gpu, GpuRequest::Whole(2));
    let q = snap_pod(&b, "q");
    assert_eq!(q.pod.gpu, GpuRequest::Whole(2));
    assert!(
        matches!(&q.phase, PodPhase::Running { gpus: GpuAssignment::Whole(v), .. } if *v == vec![5, 6]),
        "{:?}",
        q.phase
    );
    assert!(
        matches!(&snap_pod(&b, "s1").phase, PodPhase::Running { gpus: GpuAssignment::Whole(v), .. } if *v == vec![1])
    );
    assert_eq!(snap_pod(&b, "s2").pod.gpu, GpuRequest::None);
    let a = node_of(&b, "a");
    assert_eq!(a.gpus[7].health, GpuHealth::NotAllocatable);
    assert_eq!(a.allocatable.gpu_milli, 7000);
    assert!(
        b.problems
            .iter()
            .all(|p| !matches!(p, Problem::BadDecision { .. })),
        "{:?}",
        b.problems
    );
    // the incremental snapshot agrees, also after the claim is released
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &b),
        None
    );
    w.upsert_claim(&claim("orphan", gpus(1)));
    let b = w.build();
    assert_eq!(node_of(&b, "a").gpus[7].health, GpuHealth::Healthy);
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &b),
        None
    );
    // the slice gone: no GPUs
    w.remove(gpusched_k8s::world::ObjectKind::ResourceSlice, "a-gpus");
    let b = w.build();
    assert!(node_of(&b, "a").gpus.is_empty());
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &b),
        None
    );
}

#[test]
fn the_core_gpus_go_to_the_claim_when_its_constraints_allow_them() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    let mut one_domain = claim("c", gpus(2));
    one_domain
        .spec
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .constraints = Some(vec![
        serde_json::from_value(
            json!({"matchAttribute": format!("{}/{}", dra::DRIVER, dra::ATTR_NVLINK_DOMAIN)}),
        )
        .unwrap(),
    ]);
    w.upsert_claim(&one_domain);
    w.upsert_pod(&pod("p", &["c"]));
    let devices = |w: &mut World, core: &[u32]| -> Vec<String> {
        let r = w.allocate_claims_at("uid-p", "a", core).unwrap();
        w.forget("uid-p");
        r[0].allocate
            .as_ref()
            .unwrap()
            .devices
            .iter()
            .map(|d| d.id.device.clone())
            .collect()
    };
    // the core's choice, in one domain: given
    assert_eq!(devices(&mut w, &[5, 6]), ["gpu-5", "gpu-6"]);
    // across domains: the claim's constraint wins, the allocator chooses
    assert_eq!(devices(&mut w, &[3, 4]), ["gpu-0", "gpu-1"]);
    // a different count (the core did not count this pod's GPUs): the
    // allocator chooses
    assert_eq!(devices(&mut w, &[6]), ["gpu-0", "gpu-1"]);
}

#[test]
fn gpus_held_by_pods_are_left_to_the_core_so_it_can_preempt_them() {
    use gpusched_model::GpuRequest;
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    w.upsert_claim(&allocated(
        "low",
        gpus(8),
        "a",
        &[0, 1, 2, 3, 4, 5, 6, 7],
        &["low"],
    ));
    w.upsert_pod(&bound_pod("low", &["low"], "a"));
    w.upsert_claim(&claim("high", gpus(8)));
    w.upsert_pod(&pod("high", &["high"]));
    // the core sees a, full of low's GPUs: its question whether to preempt
    assert_eq!(claims_problem(&w, "high"), None);
    assert_eq!(claim_nodes(&w, "high"), Some(vec!["a".to_string()]));
    assert_eq!(snap_pod(&w.build(), "high").pod.gpu, GpuRequest::Whole(8));
    // low is gone but its claim is not deallocated yet: not the core's
    w.delete_pod("uid-low");
    let (class, msg) = claims_problem(&w, "high").expect("waits for the devices");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(msg.contains("8 in use"), "{msg}");
}

#[test]
fn kep_5004_the_special_claim_gets_the_gpus_the_core_chose() {
    let mut w = World::default();
    w.upsert_node(&node("dra"));
    w.upsert_slice(&slice("dra", 8, "H100"));
    let mut class = device_class();
    class.spec.as_mut().unwrap().extended_resource_name = Some("nvidia.com/gpu".into());
    w.upsert_device_class(&class);
    w.upsert_pod(&gpu_pod("p", 2));
    let writes = w.allocate_claims_at("uid-p", "dra", &[4, 6]).unwrap();
    let devs: Vec<&str> = writes[0]
        .allocate
        .as_ref()
        .unwrap()
        .devices
        .iter()
        .map(|d| d.id.device.as_str())
        .collect();
    assert_eq!(devs, ["gpu-4", "gpu-6"]);
}

fn with_constraint(mut c: ResourceClaim, attribute: &str) -> ResourceClaim {
    c.spec
        .as_mut()
        .unwrap()
        .devices
        .as_mut()
        .unwrap()
        .constraints = Some(vec![
        serde_json::from_value(json!({"matchAttribute": attribute})).unwrap(),
    ]);
    c
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

/// Issue 25: a claim's selectors and `matchAttribute` constraint reach
/// the core, which never places the pod on GPUs the claim cannot take (it
/// used to place 2 GPUs in two NVLink domains, then the allocator refused
/// at bind time, every cycle).
#[test]
fn claim_selectors_and_match_attribute_constrain_the_core_choice() {
    use gpusched_model::GpuRequest;
    let nvlink = format!("{}/{}", dra::DRIVER, dra::ATTR_NVLINK_DOMAIN);
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    // domains a-0 (GPUs 0-3) and a-1 (4-7); 0,1,2 and 4,5,6 held by pods
    w.upsert_slice(&slice("a", 8, "H100"));
    w.upsert_claim(&allocated("x", gpus(3), "a", &[0, 1, 2], &["x"]));
    w.upsert_pod(&bound_pod("x", &["x"], "a"));
    w.upsert_claim(&allocated("y", gpus(3), "a", &[4, 5, 6], &["y"]));
    w.upsert_pod(&bound_pod("y", &["y"], "a"));
    w.upsert_claim(&with_constraint(claim("c", gpus(2)), &nvlink));
    w.upsert_pod(&pod("p", &["c"]));
    let b = w.build();
    let p = snap_pod(&b, "p");
    assert_eq!(p.pod.gpu, GpuRequest::Whole(2));
    let c = p.pod.constraints().claim_gpus.clone().expect("constrained");
    assert_eq!(c.claim, "ml/c");
    assert_eq!(c.attributes, std::slice::from_ref(&nvlink));
    assert_eq!(c.nodes["a"], [0, 0, 0, 0, 1, 1, 1, 1].map(Some).to_vec());
    // one GPU free in each domain: the core leaves it pending, saying why
    let (binds, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    let (_, msg) = why.iter().find(|(n, _)| n == "ml/p").unwrap();
    assert!(
        msg.contains(&format!(
            "no 2 free GPUs with one {nvlink} for ResourceClaim ml/c"
        )),
        "{msg}"
    );
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &w.build()),
        None
    );
    // y ends and its claim is released: domain a-1 is whole
    w.delete_pod("uid-y");
    w.upsert_claim(&claim("y", gpus(3)));
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &w.build()),
        None
    );
    let (binds, _) = cycle(&w);
    let got = &binds.iter().find(|(n, _)| n == "ml/p").unwrap().1;
    assert_eq!(got.len(), 2);
    assert!(got.iter().all(|g| (4..8).contains(g)), "{got:?}");
    // and the allocator gives exactly those GPUs
    let r = w.allocate_claims_at("uid-p", "a", got).unwrap();
    let devs: Vec<String> = r[0]
        .allocate
        .as_ref()
        .unwrap()
        .devices
        .iter()
        .map(|d| d.id.device.clone())
        .collect();
    assert_eq!(
        devs,
        got.iter()
            .map(|g| dra::gpu_device_name(*g))
            .collect::<Vec<_>>()
    );
}

#[test]
fn a_claim_selector_keeps_the_core_to_the_gpus_it_matches() {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 8, "H100"));
    let high = json!([{"name": "gpu", "exactly": {
        "deviceClassName": dra::DEVICE_CLASS, "count": 2,
        "selectors": [{"cel": {"expression":
            format!("device.attributes[\"{}\"].index >= 6", dra::DRIVER)}}]}}]);
    w.upsert_claim(&claim("hi", high));
    w.upsert_pod(&pod("p", &["hi"]));
    let b = w.build();
    let c = snap_pod(&b, "p")
        .pod
        .constraints()
        .claim_gpus
        .clone()
        .unwrap();
    assert!(c.attributes.is_empty());
    assert_eq!(
        c.nodes["a"],
        [None, None, None, None, None, None, Some(0), Some(0)]
    );
    let (binds, _) = cycle(&w);
    assert_eq!(binds, [("ml/p".to_string(), vec![6, 7])]);
    // a claim that tells no GPU apart gives the core nothing to read
    w.upsert_claim(&claim("any", gpus(2)));
    w.upsert_pod(&pod("q", &["any"]));
    assert_eq!(snap_pod(&w.build(), "q").pod.constraints().claim_gpus, None);
}

/// KEP-5004, a retry after a failed cleanup: the pod's status names its
/// special claim, which still exists (allocated and reserved for it, or
/// allocated for nobody, or not allocated). Its `nvidia.com/gpu` stays its
/// demand — the claim is how it gets those GPUs, not a second ask — and
/// it is placed (on the claim's node when allocated) and bound reusing it.
#[test]
fn kep_5004_a_retry_whose_special_claim_exists_is_placed_not_refused() {
    use gpusched_model::GpuRequest;
    let mut class = device_class();
    class.spec.as_mut().unwrap().extended_resource_name = Some("nvidia.com/gpu".into());
    let reqs = vec![gpusched_k8s::dra::extended::ExtendedRequest {
        request: "container-0-request-1".into(),
        container: "main".into(),
        resource: "nvidia.com/gpu".into(),
        class: dra::DEVICE_CLASS.into(),
        count: 2,
    }];
    for state in ["reserved", "allocated", "unallocated"] {
        let mut w = World::default();
        w.upsert_node(&node("dra"));
        w.upsert_node(&node("dra2"));
        w.upsert_slice(&slice("dra", 8, "H100"));
        w.upsert_slice(&slice("dra2", 8, "H100"));
        w.upsert_device_class(&class);
        let mut made = gpusched_k8s::dra::extended::claim_object("ml", "p", "uid-p", &reqs);
        made.metadata.name = Some("p-extended-resources-x7k2p".into());
        made.metadata.uid = Some("uid-made".into());
        if state != "unallocated" {
            let mut a = allocated("x", gpus(2), "dra", &[3, 4], &[]);
            if state == "reserved" {
                a = allocated("x", gpus(2), "dra", &[3, 4], &["p"]);
            }
            let mut st = a.status.unwrap();
            for r in st
                .allocation
                .as_mut()
                .unwrap()
                .devices
                .as_mut()
                .unwrap()
                .results
                .as_mut()
                .unwrap()
            {
                r.request = "container-0-request-1".into();
            }
            made.status = Some(st);
        }
        w.upsert_claim(&made);
        let mut p = gpu_pod("p", 2);
        p.status.as_mut().unwrap().extended_resource_claim_status = Some(
            gpusched_k8s::dra::extended::pod_status("p-extended-resources-x7k2p", &reqs),
        );
        w.upsert_pod(&p);
        let b = w.build();
        assert!(
            b.problems
                .iter()
                .all(|p| !format!("{p:?}").contains("both")),
            "{state}: {:?}",
            b.problems
        );
        let sp = snap_pod(&b, "p");
        assert_eq!(sp.pod.gpu, GpuRequest::Whole(2), "{state}");
        let (binds, why) = cycle(&w);
        let got = binds.iter().find(|(n, _)| n == "ml/p");
        assert!(got.is_some(), "{state}: {why:?} {:?}", b.problems);
        if state != "unallocated" {
            // pinned to the claim's node, and the retry only reserves it
            assert_eq!(
                sp.pod.constraints().claim_nodes,
                Some(vec!["dra".to_string()]),
                "{state}"
            );
            let again = w.allocate_claims("uid-p", "dra").unwrap();
            assert_eq!(again.len(), 1, "{state}");
            assert_eq!(again[0].name, "p-extended-resources-x7k2p");
            assert_eq!(again[0].allocate, None, "{state}");
            assert_eq!(again[0].extended, None, "{state}");
        } else {
            let again = w.allocate_claims("uid-p", "dra2").unwrap();
            assert_eq!(again[0].name, "p-extended-resources-x7k2p");
            assert!(again[0].allocate.is_some(), "{state}");
            assert_eq!(again[0].extended, None, "{state}");
        }
    }
}

/// Issue 25: a slice with `spec.nodeSelector` offers its devices on every
/// node the selector matches (by label or name, as the labels are now),
/// to the allocator only; `perDeviceNodeSelection` places each device on
/// its own; a slice that says nowhere is not used, with a warning.
#[test]
fn slices_with_node_selectors_offer_their_devices_on_the_nodes_they_select() {
    let mut w = World::default();
    for (n, rack) in [("a", "r1"), ("b", "r1"), ("c", "r2")] {
        let mut node = node(n);
        node.metadata
            .labels
            .as_mut()
            .unwrap()
            .insert("rack".into(), rack.into());
        w.upsert_node(&node);
    }
    let fabric: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "fabric-r1"},
        "spec": {"driver": "fabric.example.com",
                 "pool": {"name": "r1", "generation": 1, "resourceSliceCount": 1},
                 "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "rack", "operator": "In", "values": ["r1"]}]}]},
                 "devices": [{"name": "ch-0"}, {"name": "ch-1"}]}
    }))
    .unwrap();
    w.upsert_slice(&fabric);
    w.upsert_device_class(
        &serde_json::from_value(json!({
            "metadata": {"name": "fabric"},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"fabric.example.com\""}}]}
        }))
        .unwrap(),
    );
    let channels =
        |n: u32| json!([{"name": "ch", "exactly": {"deviceClassName": "fabric", "count": n}}]);
    w.upsert_claim(&claim("x", channels(1)));
    w.upsert_pod(&pod("p", &["x"]));
    assert_eq!(
        claim_nodes(&w, "p"),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    // not the core's GPUs
    assert!(w.build().snapshot.nodes.iter().all(|n| n.gpus.is_empty()));
    // allocated on b: the allocation is for b, and the device is held
    // for every node the selector matches
    let r = w.allocate_claims("uid-p", "b").unwrap();
    let a = r[0].allocate.as_ref().unwrap();
    assert_eq!(a.node.as_deref(), Some("b"));
    assert_eq!(a.devices[0].id.device, "ch-0");
    w.upsert_claim(&claim("y", channels(2)));
    w.upsert_pod(&pod("q", &["y"]));
    let (class, msg) = claims_problem(&w, "q").expect("one channel left");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(
        msg.contains("1 of 2 device(s) available") || msg.contains("in use"),
        "{msg}"
    );
    assert!(w.allocate_claims("uid-q", "a").is_err());
    // c joins rack r1: the devices are offered there too
    w.forget("uid-p");
    let mut c = node("c");
    c.metadata
        .labels
        .as_mut()
        .unwrap()
        .insert("rack".into(), "r1".into());
    w.upsert_node(&c);
    assert_eq!(
        claim_nodes(&w, "p"),
        Some(vec!["a".to_string(), "b".to_string(), "c".to_string()])
    );
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &w.build()),
        None
    );
    // per device: ch-a on a by name, ch-any everywhere; a device that says
    // nowhere is left out with a warning
    let per: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "per-device"},
        "spec": {"driver": "fabric.example.com", "perDeviceNodeSelection": true,
                 "pool": {"name": "per", "generation": 1, "resourceSliceCount": 1},
                 "devices": [
                     {"name": "ch-a", "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                         {"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}},
                     {"name": "ch-any", "allNodes": true},
                     {"name": "ch-lost"}]}
    }))
    .unwrap();
    w.upsert_slice(&per);
    let on = |w: &World, n: &str| -> Vec<String> {
        w.dra()
            .devices_on(n)
            .iter()
            .filter(|d| d.id.pool == "per")
            .map(|d| d.id.device.clone())
            .collect()
    };
    assert_eq!(on(&w, "a"), ["ch-a", "ch-any"]);
    assert_eq!(on(&w, "b"), ["ch-any"]);
    assert!(
        w.dra()
            .warnings()
            .any(|m| m.contains("per-device") && m.contains("ch-lost")),
        "{:?}",
        w.dra().warnings().collect::<Vec<_>>()
    );
}

/// `firstAvailable` [2 GPUs, else 1] on a node where another pod's claim
/// holds 3 of 4 GPUs: the pod asks the core for the 1 it can have now (as
/// kube-scheduler would allocate it), not the first alternative's 2 that
/// only preempting could give; with nothing free it asks the first
/// alternative (the core's question whether to preempt), and with room it
/// asks 2 again.
#[test]
fn first_available_asks_the_core_for_what_a_node_can_give_now() {
    use gpusched_model::GpuRequest;
    let two_else_one = json!([{"name": "gpu", "firstAvailable": [
        {"name": "two", "deviceClassName": dra::DEVICE_CLASS, "count": 2},
        {"name": "one", "deviceClassName": dra::DEVICE_CLASS, "count": 1}]}]);
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&slice("a", 4, "H100"));
    w.upsert_claim(&claim("fa", two_else_one));
    w.upsert_pod(&pod("fa", &["fa"]));
    // all 4 free: the first alternative
    assert_eq!(snap_pod(&w.build(), "fa").pod.gpu, GpuRequest::Whole(2));
    // 3 held by a bound pod: the second alternative fits now
    w.upsert_claim(&allocated("busy", gpus(3), "a", &[0, 1, 2], &["busy"]));
    w.upsert_pod(&bound_pod("busy", &["busy"], "a"));
    assert_eq!(claims_problem(&w, "fa"), None);
    assert_eq!(claim_nodes(&w, "fa"), Some(vec!["a".to_string()]));
    assert_eq!(snap_pod(&w.build(), "fa").pod.gpu, GpuRequest::Whole(1));
    // the core's one free GPU is what the claim gets at bind time
    let writes = w.allocate_claims_at("uid-fa", "a", &[3]).unwrap();
    let a = writes[0].allocate.as_ref().unwrap();
    let devs: Vec<&str> = a.devices.iter().map(|d| d.id.device.as_str()).collect();
    assert_eq!(devs, [dra::gpu_device_name(3)]);
    w.forget("uid-fa");
    // all 4 held: nothing fits now, so the first alternative (preemption)
    w.upsert_claim(&allocated("busy", gpus(4), "a", &[0, 1, 2, 3], &["busy"]));
    assert_eq!(snap_pod(&w.build(), "fa").pod.gpu, GpuRequest::Whole(2));
}

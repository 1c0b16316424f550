//! Devices: taint rules, partitions and their shared counters, consumable
//! capacity, slices that select their nodes.

use super::*;

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

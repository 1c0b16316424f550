//! Issue 38: one device is never given to two claims, wherever it is
//! offered; a `perDeviceNodeSelection` slice offers each device on its
//! own node (placement and bind agree).

use super::*;

/// One channel every node offers (`allNodes`); `multiple`: shared by
/// capacity (`allowMultipleAllocations`, 10 units).
fn fabric(multiple: bool) -> ResourceSlice {
    let dev = if multiple {
        json!({"name": "ch-0", "allowMultipleAllocations": true,
               "capacity": {"bw": {"value": "10"}}})
    } else {
        json!({"name": "ch-0"})
    };
    serde_json::from_value(json!({
        "metadata": {"name": "fabric"},
        "spec": {"driver": "fabric.example.com", "allNodes": true,
                 "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
                 "devices": [dev]}
    }))
    .unwrap()
}

fn fabric_class() -> DeviceClass {
    serde_json::from_value(json!({
        "metadata": {"name": "fabric"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == \"fabric.example.com\""}}]}
    }))
    .unwrap()
}

fn channel() -> Value {
    json!({"name": "ch", "exactly": {"deviceClassName": "fabric"}})
}

fn bandwidth(units: &str) -> Value {
    json!({"name": "ch", "exactly": {"deviceClassName": "fabric",
        "capacity": {"requests": {"bw": units}}}})
}

fn gpu_request() -> Value {
    json!({"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS}})
}

/// Nodes a and b with 8 GPUs each, the `allNodes` fabric and both classes.
fn two_nodes(multiple: bool) -> World {
    let mut w = World::default();
    for n in ["a", "b"] {
        w.upsert_node(&node(n));
        w.upsert_slice(&slice(n, 8, "H100"));
    }
    w.upsert_device_class(&device_class());
    w.upsert_device_class(&fabric_class());
    w.upsert_slice(&fabric(multiple));
    w
}

#[test]
fn a_device_of_an_all_nodes_slice_allocated_on_node_a_is_not_free_on_node_b() {
    // x takes only the channel (a pod on a, where GPUs are node-local):
    // the allocation is not pinned to a, and b sees the channel held
    let mut w = two_nodes(false);
    w.upsert_claim(&claim("x", json!([channel()])));
    w.upsert_claim(&claim("y", json!([channel()])));
    w.upsert_pod(&pod("px", &["x"]));
    w.upsert_pod(&pod("py", &["y"]));
    let ax = w.allocate_claims("uid-px", "a").unwrap();
    let ax = ax[0].allocate.as_ref().unwrap();
    assert_eq!(ax.devices[0].id.device, "ch-0");
    assert_eq!(ax.node, None, "only an allNodes device: not pinned to a");
    let e = w.allocate_claims("uid-py", "b").unwrap_err();
    assert!(e.contains("in use"), "{e}");
    assert!(w.allocate_claims("uid-py", "a").is_err());
}

#[test]
fn a_claim_pinned_to_a_by_a_gpu_still_holds_its_all_nodes_device_on_b() {
    // x takes a GPU of a and the channel: pinned to a (rightly); the
    // channel is still held on b — tentatively, and once seen in status
    let mut w = two_nodes(false);
    w.upsert_claim(&claim("x", json!([gpu_request(), channel()])));
    w.upsert_claim(&claim("y", json!([channel()])));
    w.upsert_pod(&pod("px", &["x"]));
    w.upsert_pod(&pod("py", &["y"]));
    let wx = w.allocate_claims("uid-px", "a").unwrap();
    let ax = wx[0].allocate.clone().unwrap();
    assert_eq!(ax.node.as_deref(), Some("a"));
    let e = w.allocate_claims("uid-py", "b").unwrap_err();
    assert!(e.contains("in use"), "tentative on a, asked on b: {e}");
    // seen in the claim's status (an older scheduler may have pinned a
    // channel-only allocation to a: the same)
    let mut c = claim("x", json!([gpu_request(), channel()]));
    c.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(gpusched_k8s::exec::claims::allocation_result(&ax)),
        reserved_for: None,
        devices: None,
    });
    w.upsert_claim(&c);
    assert_eq!(w.dra().tentative_len(), 0);
    let e = w.allocate_claims("uid-py", "b").unwrap_err();
    assert!(e.contains("in use"), "allocated on a, asked on b: {e}");
    let (class, _) = claims_problem(&w, "py").expect("py waits");
    assert_eq!(class, PendingClass::UnallocatableClaim);
}

#[test]
fn a_shared_all_nodes_device_counts_what_allocations_for_other_nodes_consume() {
    let mut w = two_nodes(true);
    w.upsert_claim(&claim("x", json!([gpu_request(), bandwidth("8")])));
    w.upsert_claim(&claim("y", json!([bandwidth("8")])));
    w.upsert_pod(&pod("px", &["x"]));
    w.upsert_pod(&pod("py", &["y"]));
    let wx = w.allocate_claims("uid-px", "a").unwrap();
    assert_eq!(wx[0].allocate.as_ref().unwrap().node.as_deref(), Some("a"));
    // 8 + 8 > 10, on whichever node
    let e = w.allocate_claims("uid-py", "b").unwrap_err();
    assert!(e.contains("in use"), "{e}");
}

#[test]
fn a_per_device_node_selection_slice_offers_each_device_on_its_own_node_at_bind() {
    let mut w = World::default();
    for n in ["a", "b"] {
        w.upsert_node(&node(n));
    }
    w.upsert_device_class(&fabric_class());
    let per: ResourceSlice = serde_json::from_value(json!({
        "metadata": {"name": "per-device"},
        "spec": {"driver": "fabric.example.com", "perDeviceNodeSelection": true,
                 "pool": {"name": "per", "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "ch-a", "nodeName": "a"},
                             {"name": "ch-b", "nodeName": "b"}]}
    }))
    .unwrap();
    w.upsert_slice(&per);
    let on = |w: &World, n: &str| -> Vec<String> {
        w.dra()
            .devices_on(n)
            .iter()
            .map(|d| d.id.device.clone())
            .collect()
    };
    assert_eq!(on(&w, "a"), ["ch-a"]);
    assert_eq!(on(&w, "b"), ["ch-b"], "b's device is offered on b");
    w.upsert_claim(&claim("x", json!([channel()])));
    w.upsert_pod(&pod("p", &["x"]));
    assert_eq!(
        claim_nodes(&w, "p"),
        Some(vec!["a".to_string(), "b".to_string()])
    );
    // placed on b: bound with b's device (not a retry every cycle)
    let r = w.allocate_claims("uid-p", "b").unwrap();
    let a = r[0].allocate.as_ref().unwrap();
    assert_eq!(a.devices[0].id.device, "ch-b");
    assert_eq!(a.node.as_deref(), Some("b"));
    // gone: no longer offered anywhere
    w.forget("uid-p");
    w.remove(gpusched_k8s::world::ObjectKind::ResourceSlice, "per-device");
    assert!(on(&w, "a").is_empty() && on(&w, "b").is_empty());
}

#[test]
fn a_negative_capacity_request_is_refused_naming_the_claim_and_request() {
    // a device without a request policy: the amount was passed through
    // (a negative consumption frees capacity for others)
    let mut w = two_nodes(true);
    w.upsert_claim(&claim("neg", json!([bandwidth("-5")])));
    w.upsert_pod(&pod("p", &["neg"]));
    let (class, msg) = claims_problem(&w, "p").expect("refused");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(
        msg.contains(
            "ResourceClaim ml/neg: spec.devices.requests[0].exactly.capacity.requests[bw]"
        ) && msg.contains("negative"),
        "{msg}"
    );
    assert!(w.allocate_claims("uid-p", "a").is_err());
}

/// `n` nodes of 8 GPUs, with the fabric.
fn many_nodes(n: usize) -> World {
    let mut w = World::default();
    for i in 0..n {
        let name = format!("n{i:04}");
        w.upsert_node(&node(&name));
        w.upsert_slice(&slice(&name, 8, "H100"));
    }
    w.upsert_device_class(&device_class());
    w.upsert_device_class(&fabric_class());
    w.upsert_slice(&fabric(false));
    w
}

fn one_gpu(name: &str) -> Value {
    json!({"name": name, "exactly": {"deviceClassName": dra::DEVICE_CLASS, "count": 1}})
}

/// #38 item 4: 9 requests of one GPU on 8-GPU nodes searched 10⁵
/// device choices per node, on every node, for every change.
#[test]
fn nine_one_gpu_requests_on_eight_gpu_nodes_are_answered_without_a_search() {
    let mut w = many_nodes(200);
    let requests: Vec<Value> = (0..9).map(|i| one_gpu(&format!("g{i}"))).collect();
    w.upsert_claim(&claim("nine", Value::Array(requests)));
    w.upsert_pod(&pod("p", &["nine"]));
    let t = std::time::Instant::now();
    let (class, msg) = claims_problem(&w, "p").expect("never fits");
    let took = t.elapsed();
    eprintln!("9 x 1 GPU on 200 nodes of 8: {took:?}: {msg}");
    assert_eq!(class, PendingClass::UnallocatableClaim);
    assert!(
        msg.contains("ask 9 devices") && msg.contains("only 8"),
        "{msg}"
    );
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}

/// A claim the cheap checks cannot answer (8 GPUs and the channel, the
/// channel to share the first GPU's model, which it has not): the search
/// stops at the claim's bound per cycle, and the pod is told so.
#[test]
fn a_claim_over_the_allocators_bound_is_unallocatable_saying_so() {
    let mut w = many_nodes(200);
    let ask = |prefix: &str| -> Value {
        let mut r: Vec<Value> = (0..8).map(|i| one_gpu(&format!("{prefix}{i}"))).collect();
        r.push(json!({"name": format!("{prefix}ch"), "exactly": {"deviceClassName": "fabric"}}));
        Value::Array(r)
    };
    let constrained = |name: &str, prefix: &str| -> ResourceClaim {
        let mut c = claim(name, ask(prefix));
        c.spec
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .constraints = Some(vec![
            serde_json::from_value(
                json!({"requests": [format!("{prefix}0"), format!("{prefix}ch")],
                "matchAttribute": format!("{}/{}", dra::DRIVER, dra::ATTR_MODEL)}),
            )
            .unwrap(),
        ]);
        c
    };
    w.upsert_claim(&constrained("x", "g"));
    w.upsert_claim(&constrained("y", "other"));
    w.upsert_pod(&pod("px", &["x"]));
    w.upsert_pod(&pod("py", &["y"]));
    let t = std::time::Instant::now();
    let b = w.build();
    let took = t.elapsed();
    let why = |pod: &str| -> String {
        b.problems
            .iter()
            .find_map(|p| match p {
                Problem::ClaimsPending {
                    pod: r, message, ..
                } if r.name == pod => Some(message.clone()),
                _ => None,
            })
            .expect("unallocatable")
    };
    let (mx, my) = (why("px"), why("py"));
    eprintln!("two pods, 200 nodes: {took:?}: {mx}");
    assert!(
        mx.contains("bound of 300000 device choices per scheduling cycle")
            && mx.contains("of 200 node(s) tried"),
        "{mx}"
    );
    // the same ask under other names: answered from the memo, named its own
    assert!(my.contains("bound of 300000"), "{my}");
    assert!(!my.contains("ml/x") && !mx.contains("ml/y"), "{mx} / {my}");
    assert!(took < std::time::Duration::from_secs(20), "{took:?}");
}

//! A slice's GPUs are the core's GPUs: claims count on their pods, the claim
//! gets the GPUs the core chose within its constraints and selectors.

use super::*;

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

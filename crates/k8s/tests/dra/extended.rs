//! KEP-5004: extended resources (`nvidia.com/gpu`) on a DRA node become a
//! special claim.

use super::*;

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

/// #39 item 8: NVIDIA's driver (`gpu.nvidia.com`) publishes the GPUs, and
/// its DeviceClass maps `nvidia.com/gpu` to them. kube-scheduler serves a
/// pod asking `nvidia.com/gpu` there; gpusched said "node(s) had no GPUs"
/// unless started with `--dra-gpu-driver gpu.nvidia.com`. The class
/// itself makes its driver's devices the node's GPUs: the pod is placed
/// and its special claim gets the GPUs the core chose; without the class
/// they are not GPUs (MIG devices of that driver never are whole GPUs).
#[test]
fn a_class_mapping_nvidia_gpu_to_another_driver_makes_its_devices_gpus() {
    const NV: &str = "gpu.nvidia.com";
    let mut w = World::default();
    w.upsert_node(&node("nv"));
    let mut devices: Vec<Value> = (0..4)
        .map(|i| {
            json!({"name": format!("gpu-{i}"), "attributes": {
                "type": {"string": "gpu"}, "index": {"int": i},
                "productName": {"string": "NVIDIA H100 80GB HBM3"},
                "uuid": {"string": format!("GPU-nv-{i}")}},
                "capacity": {"memory": {"value": "80Gi"}}})
        })
        .collect();
    devices.push(json!({"name": "nic-0", "attributes": {"type": {"string": "nic"}}}));
    w.upsert_slice(
        &serde_json::from_value(json!({
            "metadata": {"name": "nv-gpus"},
            "spec": {"driver": NV, "nodeName": "nv",
                     "pool": {"name": "nv", "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}
        }))
        .unwrap(),
    );
    w.upsert_pod(&gpu_pod("p", 2));
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": NV},
        "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel": {"expression":
            format!("device.driver == '{NV}' && device.attributes['{NV}'].type == 'gpu'")}}]}
    }))
    .unwrap();
    let gpus_of = |w: &mut World| {
        let b = w.snapshot();
        assert_eq!(
            gpusched_k8s::world::first_difference(&b, &w.build()),
            None,
            "incremental = full"
        );
        b.snapshot.nodes[0].gpus.len()
    };
    // no class: not GPUs, and the pod cannot be placed
    assert_eq!(gpus_of(&mut w), 0);
    let (binds, why) = cycle(&w);
    assert!(binds.is_empty());
    assert!(why[0].1.contains("had no GPUs"), "{why:?}");
    // the class: its driver's whole GPUs are the node's GPUs
    w.upsert_device_class(&class);
    assert_eq!(gpus_of(&mut w), 4);
    let (binds, _) = cycle(&w);
    assert_eq!(binds, [("ml/p".to_string(), vec![0, 1])]);
    let writes = w.allocate_claims_at("uid-p", "nv", &[0, 1]).unwrap();
    let a = writes[0].allocate.as_ref().unwrap();
    let devs: Vec<(&str, &str)> = a
        .devices
        .iter()
        .map(|d| (d.id.driver.as_str(), d.id.device.as_str()))
        .collect();
    assert_eq!(devs, [(NV, "gpu-0"), (NV, "gpu-1")]);
    w.forget("uid-p");
    // the class gone: not GPUs again
    w.remove(gpusched_k8s::world::ObjectKind::DeviceClass, NV);
    assert_eq!(gpus_of(&mut w), 0);
}

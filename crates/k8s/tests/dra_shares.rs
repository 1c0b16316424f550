//! DRA shares and MIG instances in the core's count ("one world", issue
//! 25), without an API server: a GPU published for sharing
//! (`allowMultipleAllocations`, capacity `gpu.gpusched.io/milli` 1000) is a
//! core GPU and a claim's `capacity.requests[milli]` a core share of it; a
//! MIG instance is a share of its parent GPU of `mig_milli(g, G)`. Queues,
//! quotas, packing and preemption count them like device-plugin GPUs.

use gpusched_core::fairshare::QueueTree;
use gpusched_core::{Decision, GpuAssignment, PodPhase};
use gpusched_k8s::crd::Queue;
use gpusched_k8s::world::{Built, World};
use gpusched_model::{GpuHealth, GpuRequest, dra};
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use serde_json::{Value, json};

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn node(name: &str) -> Node {
    obj(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
}

/// A node's GPUs published for sharing, as the agent's `--shares` does.
fn shared_slice(node: &str, gpus: u32) -> ResourceSlice {
    let devices: Vec<Value> = (0..gpus)
        .map(|i| {
            json!({"name": dra::gpu_device_name(i), "allowMultipleAllocations": true,
            "attributes": {
                dra::ATTR_INDEX: {"int": i},
                dra::ATTR_MODEL: {"string": "H100"},
                dra::ATTR_UUID: {"string": format!("GPU-{node}-{i}")},
            }, "capacity": {
                dra::CAPACITY_MEMORY: {"value": "80Gi", "requestPolicy": {
                    "default": "0", "validRange": {"min": "0"}}},
                dra::CAPACITY_MILLI: {"value": "1k", "requestPolicy": {
                    "default": "1k", "validRange": {"min": "1", "step": "1", "max": "1k"}}},
            }})
        })
        .collect();
    obj(json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": dra::DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
}

fn device_class() -> DeviceClass {
    obj(json!({
        "metadata": {"name": dra::DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == \"{}\" && !(\"type\" in device.attributes[\"{}\"])",
            dra::DRIVER, dra::DRIVER)}}]}
    }))
}

fn claim(name: &str, requests: Value) -> ResourceClaim {
    obj(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"devices": {"requests": requests}}
    }))
}

/// A request for a share of `milli` of one GPU.
fn share(milli: u32) -> Value {
    json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS,
        "capacity": {"requests": {dra::CAPACITY_MILLI: milli.to_string()}}}}])
}

/// A request for one device of the GPU class, no capacity asked.
fn one_gpu() -> Value {
    json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS}}])
}

fn pod(name: &str, claim: &str, queue: &str, priority_class: Option<&str>) -> Pod {
    let mut spec = json!({"schedulerName": "gpusched",
        "resourceClaims": [{"name": "c0", "resourceClaimName": claim}],
        "containers": [{"name": "main", "image": "x",
            "resources": {"requests": {"cpu": "1"}, "claims": [{"name": "c0"}]}}]});
    if let Some(pc) = priority_class {
        // as the API server's admission resolves the class
        spec["priorityClassName"] = json!(pc);
        spec["priority"] = json!(1000);
    }
    obj(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "labels": {"gpusched.io/queue": queue},
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": spec,
        "status": {"phase": "Pending"}
    }))
}

fn snap_pod<'a>(b: &'a Built, name: &str) -> &'a gpusched_core::PodState {
    let i = b.pods.iter().position(|p| p.name == name).unwrap();
    &b.snapshot.pods[i]
}

/// The claim's status as the scheduler wrote it for `pods` (the first
/// owning it), from an allocation made by [`World::allocate_claims_at`].
fn written(
    name: &str,
    requests: Value,
    a: &gpusched_k8s::dra::Allocation,
    pods: &[&str],
) -> ResourceClaim {
    let mut c = claim(name, requests);
    c.status = Some(k8s_openapi::api::resource::v1::ResourceClaimStatus {
        allocation: Some(gpusched_k8s::exec::claims::allocation_result(a)),
        reserved_for: Some(
            pods.iter()
                .map(|p| obj(json!({"resource": "pods", "name": p, "uid": format!("uid-{p}")})))
                .collect(),
        ),
        devices: None,
    });
    c
}

/// Binds pending pod `p` (asking claim `claim_name` with `requests`) on
/// `node` as the scheduler would: allocates its claim with the core's
/// GPUs, writes the claim's status, binds the pod. Returns the
/// allocation's devices with the milli each takes.
fn bind(
    w: &mut World,
    mut p: Pod,
    claim_name: &str,
    requests: Value,
    node: &str,
    gpus: &GpuAssignment,
) -> Vec<(String, u32)> {
    let name = p.metadata.name.clone().unwrap();
    let core: Vec<u32> = match gpus {
        GpuAssignment::Whole(v) => v.clone(),
        GpuAssignment::Share { gpu, .. } | GpuAssignment::Mig { gpu, .. } => vec![*gpu],
        GpuAssignment::None => vec![],
    };
    let writes = w
        .allocate_claims_at(&format!("uid-{name}"), node, &core)
        .unwrap();
    let a = writes[0].allocate.clone().unwrap();
    w.upsert_claim(&written(claim_name, requests, &a, &[&name]));
    p.spec.as_mut().unwrap().node_name = Some(node.into());
    p.status.as_mut().unwrap().phase = Some("Running".into());
    w.upsert_pod(&p);
    a.devices
        .iter()
        .map(|d| {
            (
                d.id.device.clone(),
                gpusched_k8s::dra::gpus::result_milli(d),
            )
        })
        .collect()
}

/// One cycle of the default scheduler: (pod, node, GPUs) bound, pods
/// evicted, and each pending pod's explanation.
#[allow(clippy::type_complexity)]
fn cycle(
    w: &World,
) -> (
    Vec<(String, String, GpuAssignment)>,
    Vec<String>,
    Vec<(String, String)>,
) {
    let b = w.build();
    let mut cfg = gpusched_plugins::SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    let out = gpusched_plugins::build(&cfg)
        .unwrap()
        .cycle(&b.snapshot, 1_796_119_300_000, 7);
    let name = |p: u32| b.pods[p as usize].name.clone();
    let mut binds = Vec::new();
    let mut evicts = Vec::new();
    for d in &out.decisions {
        match d {
            Decision::Bind { pod, node, gpus } => binds.push((
                name(*pod),
                b.snapshot.nodes[*node as usize].name.clone(),
                gpus.clone(),
            )),
            Decision::Evict { pod, .. } => evicts.push(name(*pod)),
            _ => {}
        }
    }
    let why = out
        .explanations
        .iter()
        .map(|e| (name(e.pod), e.message()))
        .collect();
    (binds, evicts, why)
}

fn queue_usage(b: &Built, queue: &str) -> u64 {
    let (mut t, _) = QueueTree::build(&b.snapshot.queues);
    t.account(&b.snapshot);
    let q = t.idx(queue).unwrap();
    t.acct[q].usage.gpu_milli
}

/// Milli held per GPU position of `node` by the snapshot's placed pods.
fn used_milli(b: &Built, node: &str) -> Vec<u64> {
    let n = b
        .snapshot
        .nodes
        .iter()
        .position(|x| x.name == node)
        .unwrap();
    let mut used = vec![0u64; b.snapshot.nodes[n].gpus.len()];
    for p in &b.snapshot.pods {
        if let Some((pn, gpus)) = p.holding()
            && pn as usize == n
        {
            match gpus {
                GpuAssignment::Whole(v) => v.iter().for_each(|g| used[*g as usize] += 1000),
                GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
                    used[*gpu as usize] += u64::from(*milli)
                }
                GpuAssignment::None => {}
            }
        }
    }
    used
}

fn world(gpus: u32) -> World {
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&shared_slice("a", gpus));
    w
}

#[test]
fn a_share_claim_counts_its_milli_in_the_queue_and_on_its_gpu() {
    let mut w = world(2);
    let b = w.build();
    let a = &b.snapshot.nodes[0];
    assert_eq!(a.gpus.len(), 2, "shared GPUs are the core's GPUs");
    assert_eq!(a.allocatable.gpu_milli, 2000);
    // pending: a share of 500 is its demand
    w.upsert_claim(&claim("half", share(500)));
    w.upsert_pod(&pod("p", "half", "default", None));
    let b = w.build();
    assert_eq!(
        snap_pod(&b, "p").pod.gpu,
        GpuRequest::Share {
            milli: 500,
            memory_mib: 0
        }
    );
    // a request without capacity takes the whole capacity: a whole GPU
    w.upsert_claim(&claim("all", one_gpu()));
    w.upsert_pod(&pod("q", "all", "default", None));
    assert_eq!(snap_pod(&w.build(), "q").pod.gpu, GpuRequest::Whole(1));
    w.delete_pod("uid-q");
    // bound with the core's GPU 1: the allocation consumes 500 of gpu-1,
    // the pod holds a share of 500 of GPU 1, its queue uses 0.5 GPU
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?}");
    let got = bind(
        &mut w,
        pod("p", "half", "default", None),
        "half",
        share(500),
        "a",
        &GpuAssignment::Share {
            gpu: 1,
            milli: 500,
            memory_mib: 0,
        },
    );
    assert_eq!(got, [("gpu-1".to_string(), 500)]);
    let b = w.build();
    assert_eq!(
        snap_pod(&b, "p").phase,
        PodPhase::Running {
            node: 0,
            gpus: GpuAssignment::Share {
                gpu: 1,
                milli: 500,
                memory_mib: 0
            },
            since_ms: match snap_pod(&b, "p").phase {
                PodPhase::Running { since_ms, .. } => since_ms,
                _ => unreachable!(),
            }
        }
    );
    assert_eq!(queue_usage(&b, "default"), 500);
    assert_eq!(used_milli(&b, "a"), [0, 500]);
    assert!(b.snapshot.nodes[0].gpus.iter().all(|g| g.is_healthy()));
    // the incremental snapshot agrees
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &b),
        None
    );
    // a share of 300 held for nobody beside p's on GPU 1 (another pod's,
    // gone): GPU 1 stays usable (p's share still counted in the core's
    // state), and the allocator keeps the real sum within 1000 — a 400
    // the core would put there goes to GPU 0
    w.upsert_claim(&claim("orphan", share(300)));
    w.upsert_pod(&pod("o", "orphan", "default", None));
    let wo = w.allocate_claims_at("uid-o", "a", &[1]).unwrap();
    let ao = wo[0].allocate.clone().unwrap();
    assert_eq!(ao.devices[0].id.device, "gpu-1");
    w.delete_pod("uid-o");
    w.upsert_claim(&written("orphan", share(300), &ao, &[]));
    let b = w.build();
    assert!(b.snapshot.nodes[0].gpus.iter().all(|g| g.is_healthy()));
    assert_eq!(used_milli(&b, "a"), [0, 500]);
    let (_, errors) = gpusched_core::ClusterState::from_snapshot(&b.snapshot);
    assert!(errors.is_empty(), "{errors:?}");
    w.upsert_claim(&claim("more", share(400)));
    w.upsert_pod(&pod("more", "more", "default", None));
    let wm = w.allocate_claims_at("uid-more", "a", &[1]).unwrap();
    assert_eq!(
        wm[0].allocate.as_ref().unwrap().devices[0].id.device,
        "gpu-0"
    );
    w.delete_pod("uid-more");
    w.upsert_claim(&claim("orphan", share(300)));
    // the pod gone, its claim not deallocated yet: held for nobody, the
    // GPU is out (never less than is held) until it is
    w.delete_pod("uid-p");
    let b = w.build();
    assert_eq!(queue_usage(&b, "default"), 0);
    assert_eq!(
        b.snapshot.nodes[0].gpus[1].health,
        GpuHealth::NotAllocatable
    );
    w.upsert_claim(&claim("half", share(500)));
    let b = w.build();
    assert!(b.snapshot.nodes[0].gpus.iter().all(|g| g.is_healthy()));
}

#[test]
fn two_halves_pack_on_one_gpu_and_a_third_goes_to_another() {
    let mut w = world(2);
    for c in ["x", "y", "z"] {
        w.upsert_claim(&claim(c, share(500)));
        w.upsert_pod(&pod(&format!("p{c}"), c, "default", None));
    }
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 3, "{binds:?}");
    let gpu_of = |a: &GpuAssignment| match a {
        GpuAssignment::Share {
            gpu, milli: 500, ..
        } => *gpu,
        other => panic!("not a 500 share: {other:?}"),
    };
    let gpus: Vec<u32> = binds.iter().map(|(_, _, a)| gpu_of(a)).collect();
    // gpusched packs: two on one GPU, the third on the other
    let mut sorted = gpus.clone();
    sorted.sort_unstable();
    assert!(sorted == [0, 0, 1] || sorted == [0, 1, 1], "{gpus:?}");
    // bound as decided, the allocator gives exactly those devices; the
    // sum on each GPU stays within 1000
    for (name, node, a) in &binds {
        let c = name.trim_start_matches('p');
        let p = pod(name, c, "default", None);
        let got = bind(&mut w, p, c, share(500), node, a);
        assert_eq!(got, [(format!("gpu-{}", gpu_of(a)), 500)], "{name}");
    }
    let b = w.build();
    let mut used = used_milli(&b, "a");
    used.sort_unstable();
    assert_eq!(used, [500, 1000]);
    assert_eq!(queue_usage(&b, "default"), 1500);
    // a fourth of 600 fits nowhere: pending with a reason, not allocated
    w.upsert_claim(&claim("big", share(600)));
    w.upsert_pod(&pod("big", "big", "default", None));
    let (binds, _, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    let (_, msg) = why.iter().find(|(p, _)| p == "big").expect("explained");
    assert!(
        msg.contains("nvidia.com/gpu") || msg.contains("GPU"),
        "{msg}"
    );
    // 400 fits beside the lone 500
    w.upsert_claim(&claim("small", share(400)));
    w.upsert_pod(&pod("small", "small", "default", None));
    let (binds, _, _) = cycle(&w);
    let single = gpus
        .iter()
        .copied()
        .find(|g| gpus.iter().filter(|x| *x == g).count() == 1)
        .unwrap();
    assert_eq!(
        binds
            .iter()
            .map(|(n, _, a)| (n.as_str(), a.clone()))
            .collect::<Vec<_>>(),
        [(
            "small",
            GpuAssignment::Share {
                gpu: single,
                milli: 400,
                memory_mib: 0
            }
        )]
    );
}

#[test]
fn a_quota_of_one_gpu_admits_two_halves_and_not_a_third() {
    let mut w = world(4);
    w.upsert_queue(&obj::<Queue>(json!({"apiVersion": "gpusched.io/v1alpha1",
        "kind": "Queue", "metadata": {"name": "capped"},
        "spec": {"limit": {"nvidia.com/gpu": "1"}}})));
    for c in ["x", "y", "z"] {
        w.upsert_claim(&claim(c, share(500)));
        w.upsert_pod(&pod(&format!("p{c}"), c, "capped", None));
    }
    let (binds, _, why) = cycle(&w);
    assert_eq!(binds.len(), 2, "{binds:?}");
    for (name, node, a) in &binds {
        let c = name.trim_start_matches('p');
        bind(&mut w, pod(name, c, "capped", None), c, share(500), node, a);
    }
    let b = w.build();
    assert_eq!(queue_usage(&b, "capped"), 1000);
    let pending: Vec<&(String, String)> = why
        .iter()
        .filter(|(p, _)| !binds.iter().any(|(n, _, _)| n == p))
        .collect();
    assert_eq!(pending.len(), 1, "{why:?}");
    // the next cycle still holds it back, by the queue's limit
    let (binds, _, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    let msg = &why.iter().find(|(p, _)| p == &pending[0].0).unwrap().1;
    assert!(msg.contains("capped") || msg.contains("limit"), "{msg}");
}

#[test]
fn preemption_frees_a_share_for_a_higher_priority_claim() {
    let mut w = world(1);
    w.upsert_claim(&claim("low", share(600)));
    w.upsert_pod(&pod("low", "low", "default", None));
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 1);
    let low = pod("low", "low", "default", None);
    bind(&mut w, low, "low", share(600), "a", &binds[0].2);
    // 600 + 600 > 1000: the high one is not refused as unallocatable (the
    // low share is the core's to preempt) and evicts the low pod
    w.upsert_claim(&claim("high", share(600)));
    w.upsert_pod(&pod("high", "high", "default", Some("high")));
    let b = w.build();
    assert_eq!(
        snap_pod(&b, "high").pod.gpu,
        GpuRequest::Share {
            milli: 600,
            memory_mib: 0
        }
    );
    let (binds, evicts, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    assert_eq!(evicts, ["low"], "{why:?}");
    // the victim gone and its claim deallocated: the high one binds there
    w.delete_pod("uid-low");
    w.upsert_claim(&claim("low", share(600)));
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?}");
    assert_eq!(binds[0].0, "high");
    let high = pod("high", "high", "default", Some("high"));
    let got = bind(&mut w, high, "high", share(600), "a", &binds[0].2);
    assert_eq!(got, [("gpu-0".to_string(), 600)]);
}

/// A node as the agent publishes it with GPU 0 in MIG mode (a 3g.40gb
/// and two 1g.10gb instances consuming GPU 0's counter set, in a second
/// slice) and GPU 1 whole.
fn mig_slices(node: &str) -> (ResourceSlice, ResourceSlice) {
    let pool = json!({"name": node, "generation": 1, "resourceSliceCount": 2});
    let instance = |k: usize, profile: &str, g: u32, mem: &str| {
        json!({"name": dra::mig_device_name(0, k), "attributes": {
            "type": {"string": "mig"},
            dra::ATTR_MIG_PROFILE: {"string": profile},
            dra::ATTR_UUID: {"string": format!("MIG-{k}")},
            dra::ATTR_PARENT_UUID: {"string": "GPU-0"},
            dra::ATTR_PARENT_INDEX: {"int": 0},
            dra::ATTR_PRODUCT_NAME: {"string": "NVIDIA A100-SXM4-80GB"},
        }, "capacity": {dra::CAPACITY_MEMORY: {"value": mem}},
        "consumesCounters": [{"counterSet": dra::counter_set_name(0), "counters": {
            dra::COUNTER_COMPUTE_SLICES: {"value": g.to_string()},
            dra::COUNTER_MEMORY: {"value": mem}}}]})
    };
    let devices = json!([
        {"name": dra::gpu_device_name(1), "attributes": {
            dra::ATTR_INDEX: {"int": 1},
            dra::ATTR_PRODUCT_NAME: {"string": "NVIDIA A100-SXM4-80GB"},
            dra::ATTR_UUID: {"string": "GPU-1"}},
         "capacity": {dra::CAPACITY_MEMORY: {"value": "80Gi"}}},
        instance(0, "3g.40gb", 3, "40Gi"),
        instance(1, "1g.10gb", 1, "10Gi"),
        instance(2, "1g.10gb", 1, "10Gi"),
    ]);
    let devices_slice = obj(json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": dra::DRIVER, "nodeName": node, "pool": pool, "devices": devices}
    }));
    let counters = obj(json!({
        "metadata": {"name": format!("{node}-gpus-counters")},
        "spec": {"driver": dra::DRIVER, "nodeName": node, "pool": pool,
                 "sharedCounters": [{"name": dra::counter_set_name(0), "counters": {
                     dra::COUNTER_COMPUTE_SLICES: {"value": "7"},
                     "memory-slices": {"value": "8"},
                     dra::COUNTER_MEMORY: {"value": "80Gi"}}}]}
    }));
    (devices_slice, counters)
}

fn mig_class() -> DeviceClass {
    obj(json!({
        "metadata": {"name": dra::MIG_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": format!(
            "device.driver == \"{}\" && device.attributes[\"{}\"].type == \"mig\"",
            dra::DRIVER, dra::DRIVER)}}]}
    }))
}

fn mig_request(profile: &str) -> Value {
    json!([{"name": "mig", "exactly": {"deviceClassName": dra::MIG_DEVICE_CLASS,
        "selectors": [{"cel": {"expression": format!(
            "device.attributes[\"{}\"].profile == \"{profile}\"", dra::DRIVER)}}]}}])
}

#[test]
fn a_mig_instance_counts_its_measure_on_its_gpu_which_no_whole_gpu_claim_takes() {
    let mut w = World::default();
    w.upsert_node(&node("m"));
    w.upsert_device_class(&device_class());
    w.upsert_device_class(&mig_class());
    let (devices, counters) = mig_slices("m");
    w.upsert_slice(&devices);
    w.upsert_slice(&counters);
    // GPU 1 whole at position 0, GPU 0 in MIG mode at position 1
    let b = w.build();
    let gpus = &b.snapshot.nodes[0].gpus;
    assert_eq!(gpus.len(), 2);
    assert_eq!((gpus[0].index, gpus[0].is_mig()), (1, false));
    assert_eq!((gpus[1].index, gpus[1].uuid.as_str()), (0, "GPU-0"));
    assert_eq!(gpus[1].memory_mib, 80 * 1024);
    assert_eq!(
        gpus[1]
            .mig
            .iter()
            .map(|s| (s.id.as_str(), s.profile.as_str(), s.milli))
            .collect::<Vec<_>>(),
        [
            ("gpu-0-mig-0", "3g.40gb", 428),
            ("gpu-0-mig-1", "1g.10gb", 142),
            ("gpu-0-mig-2", "1g.10gb", 142)
        ]
    );
    // a claim of the 3g.40gb profile: an ask of one such instance, 428
    w.upsert_claim(&claim("big", mig_request("3g.40gb")));
    let p = pod("pmig", "big", "default", None);
    w.upsert_pod(&p);
    let b = w.build();
    let s = snap_pod(&b, "pmig");
    assert_eq!(
        s.pod.gpu,
        GpuRequest::Share {
            milli: 428,
            memory_mib: 0
        }
    );
    let ask = s.pod.mig.as_deref().expect("a MIG ask");
    assert_eq!((ask.profile.as_str(), ask.count), ("3g.40gb", 1));
    let (binds, _, why) = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?} {why:?}");
    let mig = GpuAssignment::Mig {
        gpu: 1,
        instances: vec![0],
        milli: 428,
    };
    assert_eq!(binds[0].2, mig);
    let got = bind(&mut w, p, "big", mig_request("3g.40gb"), "m", &mig);
    assert_eq!(got, [("gpu-0-mig-0".to_string(), 1000)]);
    let b = w.build();
    assert!(
        matches!(&snap_pod(&b, "pmig").phase, PodPhase::Running { gpus, .. } if *gpus == mig),
        "{:?}",
        snap_pod(&b, "pmig").phase
    );
    assert_eq!(used_milli(&b, "m"), [0, 428]);
    assert_eq!(queue_usage(&b, "default"), 428);
    assert_eq!(
        gpusched_k8s::world::first_difference(&w.snapshot(), &b),
        None
    );
    // a whole-GPU claim gets GPU 1; a second one cannot take GPU 0 (in
    // MIG mode, an instance held): it waits
    w.upsert_claim(&claim("w1", one_gpu()));
    let p = pod("w1", "w1", "default", None);
    w.upsert_pod(&p);
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 1);
    assert_eq!(binds[0].2, GpuAssignment::Whole(vec![0]));
    let got = bind(&mut w, p, "w1", one_gpu(), "m", &binds[0].2);
    assert_eq!(got, [("gpu-1".to_string(), 1000)]);
    w.upsert_claim(&claim("w2", one_gpu()));
    w.upsert_pod(&pod("w2", "w2", "default", None));
    let (binds, _, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    let (_, msg) = why.iter().find(|(p, _)| p == "w2").expect("w2 explained");
    assert!(msg.contains("Insufficient nvidia.com/gpu"), "{msg}");
    // a 1g.10gb fits beside the 3g.40gb on GPU 0
    w.upsert_claim(&claim("small", mig_request("1g.10gb")));
    w.upsert_pod(&pod("small", "small", "default", None));
    let (binds, _, _) = cycle(&w);
    assert_eq!(
        binds
            .iter()
            .map(|(n, _, a)| (n.as_str(), a.clone()))
            .collect::<Vec<_>>(),
        [(
            "small",
            GpuAssignment::Mig {
                gpu: 1,
                instances: vec![1],
                milli: 142
            }
        )]
    );
}

/// A node of 4 whole GPUs, 0 and 1 on PCIe root `r0`, 2 and 3 on `r1`.
fn roots_slice(node: &str) -> ResourceSlice {
    let devices: Vec<Value> = (0..4u32)
        .map(|i| {
            json!({"name": dra::gpu_device_name(i), "attributes": {
                dra::ATTR_INDEX: {"int": i},
                dra::ATTR_MODEL: {"string": "H100"},
                dra::ATTR_PCIE_ROOT: {"string": format!("r{}", i / 2)},
            }, "capacity": {dra::CAPACITY_MEMORY: {"value": "80Gi"}}})
        })
        .collect();
    obj(json!({
        "metadata": {"name": format!("{node}-gpus")},
        "spec": {"driver": dra::DRIVER, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}
    }))
}

fn gpus(n: u32) -> Value {
    json!([{"name": "gpu", "exactly": {"deviceClassName": dra::DEVICE_CLASS, "count": n}}])
}

/// Issue 25: a claim's `distinctAttribute` reaches the core, which gives
/// the pod GPUs of distinct values only (it used to be re-checked at bind
/// time alone).
#[test]
fn distinct_attribute_keeps_the_core_to_gpus_of_distinct_values() {
    let root = dra::ATTR_PCIE_ROOT.to_string();
    let apart = || {
        let mut c = claim("apart", gpus(2));
        c.spec
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .constraints = Some(vec![obj(json!({"distinctAttribute": root}))]);
        c
    };
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&roots_slice("a"));
    w.upsert_claim(&apart());
    let p = pod("apart", "apart", "default", None);
    w.upsert_pod(&p);
    let b = w.build();
    let c = snap_pod(&b, "apart")
        .pod
        .constraints()
        .claim_gpus
        .clone()
        .expect("the constraint reaches the core");
    assert_eq!(c.distinct, [dra::ATTR_PCIE_ROOT]);
    let (binds, _, _) = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?}");
    let GpuAssignment::Whole(chosen) = &binds[0].2 else {
        panic!("{binds:?}")
    };
    assert_eq!(chosen.len(), 2);
    assert_ne!(chosen[0] / 2, chosen[1] / 2, "one GPU per root: {chosen:?}");
    let got = bind(&mut w, p, "apart", gpus(2), "a", &binds[0].2);
    let want: Vec<(String, u32)> = chosen
        .iter()
        .map(|g| (dra::gpu_device_name(*g), 1000))
        .collect();
    assert_eq!(got, want, "the claim gets the core's GPUs");
    // another pod holding both GPUs of root r1: the two free GPUs are on
    // one root, so the claim waits with the core's reason
    let mut w = World::default();
    w.upsert_node(&node("a"));
    w.upsert_device_class(&device_class());
    w.upsert_slice(&roots_slice("a"));
    w.upsert_claim(&claim("pair", gpus(2)));
    let pair = pod("pair", "pair", "default", None);
    w.upsert_pod(&pair);
    bind(
        &mut w,
        pair,
        "pair",
        gpus(2),
        "a",
        &GpuAssignment::Whole(vec![2, 3]),
    );
    w.upsert_claim(&apart());
    w.upsert_pod(&pod("apart", "apart", "default", None));
    let (binds, _, why) = cycle(&w);
    assert!(binds.is_empty(), "{binds:?}");
    let (_, msg) = why.iter().find(|(p, _)| p == "apart").expect("explained");
    assert!(
        msg.contains("no 2 free GPUs with distinct resource.kubernetes.io/pcieRoot for ResourceClaim ml/apart"),
        "{msg}"
    );
}

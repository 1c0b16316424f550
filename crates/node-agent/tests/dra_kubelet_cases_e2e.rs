//! The scheduler's DRA cases on a **real kubelet** (v1.37.2) through the
//! agent's DRA mode (`tests/dra_node`: the kubelet with a fake CRI runtime
//! that records every container's config, the agent as the chart installs
//! it, 4 fake H100s): gpusched's scheduler runs in-process with the chart's
//! flags and kube-controller-manager's resourceclaim controller, and after
//! every case the container's CDI devices are checked against the devices
//! gpusched wrote into the claim's allocation, and no device is in two
//! claims.
//!
//! One control plane for all the cases, in an order where each case starts
//! from what the previous left: single- and multi-GPU claims, a
//! `firstAvailable` claim that gets its second choice, a gang whose members
//! each hold a claim (bound whole or not at all), preemption freeing
//! claimed devices, a KEP-5004 pod asking `nvidia.com/gpu: 2`, and a
//! tainted device that only a claim tolerating the taint gets.
//!
//! Needs root and the binaries of `e2e/cluster/build`; run by `e2e/run`.

mod dra_node;
#[path = "../../k8s/tests/common/mod.rs"]
mod k8s;
mod real_kubelet;

use dra_node::*;
use gpusched_model::dra;
use k8s::{Cluster, wait_for};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::time::Duration;

/// The DeviceClass mapping `nvidia.com/gpu` to the agent's GPUs (KEP-5004).
const EXTENDED_CLASS: &str = "gpu-extended";

async fn create<K>(api: &Api<K>, v: Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = serde_json::from_value(v).unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap()
}

/// The claim's allocated device results as (request, device), sorted.
fn results(claim: &ResourceClaim) -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| (r.request, r.device))
        .collect();
    v.sort();
    v
}

/// Waits until pod `name` has a `PodScheduled=False` reason (other than
/// waiting for its claims and `skip`), then checks it stays unbound for
/// `hold`; returns the reason.
async fn pending(pods: &Api<Pod>, name: &str, hold: Duration, skip: &[&str]) -> (String, String) {
    let why = wait_for(Duration::from_secs(30), || async {
        k8s::scheduled_reason(&pods.get(name).await.ok()?)
            .filter(|(r, _)| r != "WaitingForResourceClaim" && !skip.contains(&r.as_str()))
    })
    .await
    .unwrap_or_else(|| panic!("{name} never got a PodScheduled reason"));
    tokio::time::sleep(hold).await;
    let p = pods.get(name).await.unwrap();
    assert!(
        p.spec.as_ref().unwrap().node_name.is_none(),
        "{name} bound although it should wait: {why:?}"
    );
    why
}

async fn delete(pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn scheduler_dra_cases_run_on_a_real_kubelet_with_exactly_the_allocated_gpus() {
    let c = Cluster::up().await;
    let _kcm = k8s::controllers::kube_controller_manager_with(&c, "resourceclaim-controller");
    let n = RealNode::up(&c).await;
    let slice = published_slice(&c, &n).await;
    let client = c.client.clone();
    let classes: Api<DeviceClass> = Api::all(client.clone());
    create(
        &classes,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": EXTENDED_CLASS},
            "spec": {"extendedResourceName": "nvidia.com/gpu", "selectors": [{"cel":
                {"expression": format!("device.driver == \"{DRIVER}\"")}}]}}),
    )
    .await;
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [("low", 100), ("high", 1000)] {
        create(
            &pcs,
            json!({"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                "metadata": {"name": name}, "value": value}),
        )
        .await;
    }
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let _s = c.scheduler(k8s::opts()).await;
    let all: BTreeSet<String> = (0..4)
        .map(|i| format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(i)))
        .collect();

    // single- and multi-GPU claims: 1 + 2 GPUs, disjoint
    create(&claims, claim_spec("single", 1)).await;
    create(&claims, claim_spec("multi", 2)).await;
    for (pod, claim) in [("single", "single"), ("multi", "multi")] {
        let p: Pod = serde_json::from_value(scheduled_pod(pod, &[("gpus", Ok(claim))])).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let single = running(&c, &n, "single").await;
    let multi = running(&c, &n, "multi").await;
    let single_gpus =
        assert_cdi_is_allocation(&n, &single, &claims.get("single").await.unwrap(), &slice);
    let multi_gpus =
        assert_cdi_is_allocation(&n, &multi, &claims.get("multi").await.unwrap(), &slice);
    assert_eq!((single_gpus.len(), multi_gpus.len()), (1, 2));
    assert_no_device_twice(&c).await;

    // firstAvailable [2 GPUs, else 1] with 1 of 4 free (single and multi
    // hold 3): the second choice wins, as under kube-scheduler, and the
    // result names its subrequest (the pending pod's demand is what a node
    // gives it now, not the first choice's 2; docs/dra.md)
    create(
        &claims,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "either", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpus", "firstAvailable": [
                {"name": "two", "deviceClassName": DRIVER, "count": 2},
                {"name": "one", "deviceClassName": DRIVER, "count": 1}]}]}}}),
    )
    .await;
    let p: Pod =
        serde_json::from_value(scheduled_pod("either", &[("gpus", Ok("either"))])).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let either = running(&c, &n, "either").await;
    let either_claim = claims.get("either").await.unwrap();
    let r = results(&either_claim);
    assert_eq!(r.len(), 1, "{r:?}");
    assert_eq!(r[0].0, "gpus/one", "{r:?}");
    assert_cdi_is_allocation(&n, &either, &either_claim, &slice);
    assert_no_device_twice(&c).await;

    // a gang of two whose members each claim 2 GPUs: while fewer than 4
    // are free neither is bound, then both run on disjoint GPUs
    c.group(NS, "duo", json!({"minMember": 2})).await;
    for i in 0..2 {
        create(&claims, claim_spec(&format!("duo-{i}"), 2)).await;
        let mut p = scheduled_pod(&format!("duo-{i}"), &[("gpus", Ok(&format!("duo-{i}")))]);
        p["metadata"]["labels"] = json!({"gpusched.io/pod-group": "duo"});
        let p: Pod = serde_json::from_value(p).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    delete(&pods, "either").await;
    delete(&pods, "multi").await;
    // 3 free: one member would fit, the gang does not
    gone(&c, &n, "multi").await;
    let why = pending(&pods, "duo-0", Duration::from_secs(3), &["GangIncomplete"]).await;
    eprintln!("gang pending with 3 of 4 GPUs free: {why:?}");
    assert!(
        pods.get("duo-1")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "duo-1 bound alone"
    );
    delete(&pods, "single").await;
    let mut duo_gpus = BTreeSet::new();
    for i in 0..2 {
        let name = format!("duo-{i}");
        let p = running(&c, &n, &name).await;
        let got = assert_cdi_is_allocation(&n, &p, &claims.get(&name).await.unwrap(), &slice);
        assert_eq!(got.len(), 2);
        duo_gpus.extend(got);
    }
    assert_eq!(
        duo_gpus, all,
        "the gang's members hold all 4 GPUs, disjoint"
    );
    assert_no_device_twice(&c).await;
    delete(&pods, "duo-0").await;
    delete(&pods, "duo-1").await;

    // preemption: a low-priority pod holds all 4 GPUs; a high-priority
    // pod's claim of 2 evicts it, kube-controller-manager deallocates the
    // victim's claim, and the preemptor runs on devices the victim held
    create(&claims, claim_spec("low", 4)).await;
    let mut p = scheduled_pod("low", &[("gpus", Ok("low"))]);
    p["spec"]["priorityClassName"] = json!("low");
    pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let low = running(&c, &n, "low").await;
    let low_gpus = assert_cdi_is_allocation(&n, &low, &claims.get("low").await.unwrap(), &slice);
    assert_eq!(low_gpus.len(), 4);
    create(&claims, claim_spec("high", 2)).await;
    let mut p = scheduled_pod("high", &[("gpus", Ok("high"))]);
    p["spec"]["priorityClassName"] = json!("high");
    pods.create(&PostParams::default(), &serde_json::from_value(p).unwrap())
        .await
        .unwrap();
    let high = running(&c, &n, "high").await;
    let high_gpus = assert_cdi_is_allocation(&n, &high, &claims.get("high").await.unwrap(), &slice);
    assert_eq!(high_gpus.len(), 2);
    assert!(
        high_gpus.iter().all(|g| low_gpus.contains(g)),
        "the preemptor runs on devices the victim held"
    );
    let low_now = pods.get_opt("low").await.unwrap();
    assert!(
        low_now.is_none_or(|p| p.metadata.deletion_timestamp.is_some()),
        "the victim is gone"
    );
    let low_claim = claims.get("low").await.unwrap();
    assert!(
        low_claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none(),
        "the victim's claim is deallocated: {:?}",
        low_claim.status
    );
    assert_no_device_twice(&c).await;

    // KEP-5004: a pod asking nvidia.com/gpu: 2 on the DRA node (2 free)
    // gets its special claim; the kubelet admits it (the DRA-backed
    // resource is not in the node's allocatable) and prepares the special
    // claim, and the container's CDI devices are its allocation
    let ext: Pod = serde_json::from_value(json!({"metadata": {"name": "ext", "namespace": NS},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": "100m", "nvidia.com/gpu": "2"},
                    "limits": {"nvidia.com/gpu": "2"}}}]}}))
    .unwrap();
    pods.create(&PostParams::default(), &ext).await.unwrap();
    let ext = running(&c, &n, "ext").await;
    let st = ext
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.clone())
        .expect("status.extendedResourceClaimStatus");
    let ext_claim = claims.get(&st.resource_claim_name).await.unwrap();
    let r = results(&ext_claim);
    assert!(
        r.len() == 2 && r.iter().all(|(req, _)| req == "container-0-request-1"),
        "{r:?}"
    );
    let ext_gpus = assert_cdi_is_allocation(&n, &ext, &ext_claim, &slice);
    assert!(ext_gpus.iter().all(|g| !high_gpus.contains(g)));
    assert_no_device_twice(&c).await;

    // a tainted device: the high pod goes (2 free), one of the free GPUs
    // gets a NoSchedule taint; a claim of 2 without a toleration waits, a
    // claim tolerating the taint and selecting that GPU gets it
    delete(&pods, "high").await;
    let tainted = (0..4u32)
        .find(|i| high_gpus.contains(&format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(*i))))
        .unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(n.dir.path().join("control"))
        .and_then(|mut f| {
            std::io::Write::write_all(&mut f, format!("unhealthy {tainted} diag\n").as_bytes())
        })
        .unwrap();
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let tainted_dev = dra::gpu_device_name(tainted);
    wait_for(Duration::from_secs(30), || async {
        let s = slices.get(&format!("{NODE}-{DRIVER}")).await.ok()?;
        s.spec
            .devices?
            .into_iter()
            .find(|d| d.name == tainted_dev)?
            .taints?
            .into_iter()
            .any(|t| t.effect == "NoSchedule")
            .then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("{tainted_dev} never tainted\n{}", n.logs()));
    gone(&c, &n, "high").await;
    create(&claims, claim_spec("untolerated", 2)).await;
    let p: Pod =
        serde_json::from_value(scheduled_pod("untolerated", &[("gpus", Ok("untolerated"))]))
            .unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let why = pending(&pods, "untolerated", Duration::from_secs(2), &[]).await;
    eprintln!("untolerated pending: {why:?}");
    create(
        &claims,
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "tolerant", "namespace": NS},
            "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
                "deviceClassName": DRIVER, "count": 1,
                "selectors": [{"cel": {"expression": format!(
                    "device.attributes[\"{DRIVER}\"].index == {tainted}")}}],
                "tolerations": [{"key": "gpu.gpusched.io/unhealthy", "operator": "Exists"}]}}]}}}),
    )
    .await;
    let p: Pod =
        serde_json::from_value(scheduled_pod("tolerant", &[("gpus", Ok("tolerant"))])).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let tolerant = running(&c, &n, "tolerant").await;
    let got = assert_cdi_is_allocation(
        &n,
        &tolerant,
        &claims.get("tolerant").await.unwrap(),
        &slice,
    );
    assert_eq!(
        got,
        vec![format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(tainted))],
        "the tolerating claim gets the tainted GPU"
    );
    assert!(
        pods.get("untolerated")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "a claim without the toleration never gets the tainted GPU"
    );
    assert_no_device_twice(&c).await;
}

/// A claim of one share of GPU 0 (`milli` of its 1000).
fn share_claim(name: &str, milli: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "count": 1,
            "selectors": [{"cel": {"expression": format!(
                "device.attributes[\"{DRIVER}\"].index == 0")}}],
            "capacity": {"requests": {format!("{DRIVER}/milli"): milli.to_string()}}}}]}}})
}

/// Shares on the real kubelet: the agent with `--shares` publishes each GPU
/// for sharing; two pods' claims of 300 and 500 milli of GPU 0 both run on
/// it, each container with its own share's CDI device (and the spec's
/// `GPUSCHED_GPU_MILLI`), and a third claim of 300 on GPU 0 waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn two_shares_of_one_gpu_run_on_a_real_kubelet() {
    let c = Cluster::up().await;
    let _kcm = k8s::controllers::kube_controller_manager_with(&c, "resourceclaim-controller");
    let n = RealNode::up_with(&c, &["--shares"]).await;
    let slice = published_slice(&c, &n).await;
    let gpu0 = &slice.spec.devices.as_ref().unwrap()[0];
    assert_eq!(gpu0.allow_multiple_allocations, Some(true), "{gpu0:?}");
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let _s = c.scheduler(k8s::opts()).await;
    let uuid0 = n.uuid(0);
    let mut ids = BTreeSet::new();
    for (name, milli) in [("s300", 300), ("s500", 500)] {
        create(&claims, share_claim(name, milli)).await;
        let p: Pod = serde_json::from_value(scheduled_pod(name, &[("gpus", Ok(name))])).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for (name, milli) in [("s300", 300), ("s500", 500)] {
        let p = running(&c, &n, name).await;
        let claim = claims.get(name).await.unwrap();
        let results = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        assert_eq!(results.len(), 1, "{claim:?}");
        let r = &results[0];
        assert_eq!(r.device, "gpu-0");
        let share = r.share_id.clone().expect("a share has a shareID");
        let got = assert_cdi_is_allocation(&n, &p, &claim, &slice);
        assert_eq!(
            got,
            vec![format!("k8s.gpu.gpusched.io/gpu={uuid0}-share-{share}")]
        );
        ids.insert(share);
        let spec: Value = serde_json::from_slice(
            &std::fs::read(n.cdi_dir().join(format!(
                "k8s.gpu.gpusched.io-claim_{}.json",
                claim.metadata.uid.as_deref().unwrap()
            )))
            .unwrap(),
        )
        .unwrap();
        let env = spec["containerEdits"]["env"].to_string();
        assert!(
            env.contains(&format!("GPUSCHED_GPU_MILLI={milli}")),
            "{env}"
        );
        assert!(
            env.contains(&format!("NVIDIA_VISIBLE_DEVICES={uuid0}")),
            "{env}"
        );
    }
    assert_eq!(ids.len(), 2, "two shares, two share IDs");
    // 800 of GPU 0 taken: 300 more waits, unbound
    create(&claims, share_claim("s300b", 300)).await;
    let p: Pod = serde_json::from_value(scheduled_pod("s300b", &[("gpus", Ok("s300b"))])).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let why = pending(&pods, "s300b", Duration::from_secs(2), &[]).await;
    eprintln!("third share pending: {why:?}");
    // the 500 goes: the third share runs beside the first
    delete(&pods, "s500").await;
    let p = running(&c, &n, "s300b").await;
    assert_cdi_is_allocation(&n, &p, &claims.get("s300b").await.unwrap(), &slice);
}

/// 2 A100s; GPU 0 in MIG mode with a 3g.40gb and two 1g.10gb instances.
fn mig_node_yaml() -> String {
    format!(
        "nodes:\n  - name: {NODE}\n    cpu: \"64\"\n    memory: 512Gi\n    gpus:\n      count: 2\n      model: A100-SXM4-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      devices:\n        - index: 0\n          mig:\n            - {{profile: 3g.40gb}}\n            - {{profile: 1g.10gb}}\n            - {{profile: 1g.10gb}}\n"
    )
}

/// A claim of `count` devices of `class`, with a CEL selector if given.
fn class_claim(name: &str, class: &str, count: u32, cel: Option<&str>) -> Value {
    let mut r = json!({"deviceClassName": class, "count": count});
    if let Some(e) = cel {
        r["selectors"] = json!([{"cel": {"expression": e}}]);
    }
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": r}]}}})
}

/// MIG instances on the real kubelet: the API server accepts the pool's
/// two slices (the devices, and the GPU's shared counter set) and keeps
/// them as published (no rewrite); claims of the chart's `mig.gpusched.io`
/// class get instances by profile and their containers exactly those
/// instances' MIG UUIDs; a claim of the whole-GPU class gets the one GPU
/// not in MIG mode; a claim for a fourth instance waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn mig_instances_run_on_a_real_kubelet() {
    let c = Cluster::up().await;
    let _kcm = k8s::controllers::kube_controller_manager_with(&c, "resourceclaim-controller");
    let n = RealNode::up_node(&c, &mig_node_yaml(), &[]).await;
    // gpu-1 whole and GPU 0's three instances
    let slice = published_slice(&c, &n).await;
    let slices: Api<ResourceSlice> = Api::all(c.client.clone());
    let counters_name = format!("{NODE}-{DRIVER}-counters");
    let counters = slices
        .get(&counters_name)
        .await
        .unwrap_or_else(|e| panic!("{counters_name}: {e}\n{}", n.logs()));
    let sets = counters.spec.shared_counters.clone().unwrap();
    assert_eq!(sets.len(), 1);
    assert_eq!(sets[0].name, "gpu-0-counters");
    assert_eq!(sets[0].counters["memory"].value.0, "80Gi");
    assert_eq!(
        (
            slice.spec.pool.resource_slice_count,
            counters.spec.pool.resource_slice_count
        ),
        (2, 2)
    );
    // what the agent publishes is what the API server keeps
    let gens = (slice.spec.pool.generation, counters.spec.pool.generation);
    assert_eq!(gens.0, gens.1);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = slices.get(&format!("{NODE}-{DRIVER}")).await.unwrap();
    assert_eq!(
        again.spec.pool.generation,
        gens.0,
        "the slices are rewritten without a change\n{}",
        n.logs()
    );

    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let _s = c.scheduler(k8s::opts()).await;
    let profile = |p: &str| format!("device.attributes[\"{DRIVER}\"].profile == \"{p}\"");
    create(
        &claims,
        class_claim("big", dra::MIG_DEVICE_CLASS, 1, Some(&profile("3g.40gb"))),
    )
    .await;
    create(
        &claims,
        class_claim("small", dra::MIG_DEVICE_CLASS, 2, Some(&profile("1g.10gb"))),
    )
    .await;
    create(&claims, class_claim("whole", dra::DEVICE_CLASS, 1, None)).await;
    for name in ["big", "small", "whole"] {
        let p: Pod = serde_json::from_value(scheduled_pod(name, &[("gpus", Ok(name))])).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    for (name, count) in [("big", 1), ("small", 2)] {
        let p = running(&c, &n, name).await;
        let claim = claims.get(name).await.unwrap();
        let got = assert_cdi_is_allocation(&n, &p, &claim, &slice);
        assert_eq!(got.len(), count);
        assert!(
            got.iter()
                .all(|g| g.starts_with("k8s.gpu.gpusched.io/gpu=MIG-")),
            "{got:?}"
        );
        assert!(
            results(&claim)
                .iter()
                .all(|(_, d)| d.starts_with("gpu-0-mig-")),
            "{:?}",
            results(&claim)
        );
    }
    let p = running(&c, &n, "whole").await;
    let got = assert_cdi_is_allocation(&n, &p, &claims.get("whole").await.unwrap(), &slice);
    assert_eq!(got, vec![format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(1))]);
    assert_no_device_twice(&c).await;
    // every instance is taken: one more waits
    create(&claims, class_claim("more", dra::MIG_DEVICE_CLASS, 1, None)).await;
    let p: Pod = serde_json::from_value(scheduled_pod("more", &[("gpus", Ok("more"))])).unwrap();
    pods.create(&PostParams::default(), &p).await.unwrap();
    let why = pending(&pods, "more", Duration::from_secs(2), &[]).await;
    eprintln!("fourth instance pending: {why:?}");
}

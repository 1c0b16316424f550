//! The DRA mode end to end on a **real kubelet** (v1.37.2,
//! `e2e/cluster/kubelet`, fake CRI runtime recording every container's
//! config) and a real kube-apiserver: `gpusched-node-agent --mode dra` (a
//! separate process, fake backend, 4 H100s) registers on the kubelet's
//! plugin registry and publishes the node's ResourceSlice; a claim the test
//! allocates by hand (status.allocation + reservedFor, as a scheduler
//! would) and a pod bound to the node run, and the container's CDI devices
//! are exactly the allocated GPUs; a claim allocated on another node's pool
//! fails to prepare with the agent's error in the pod's events; the agent
//! restarts without losing what it prepared, and deleting the pod
//! unprepares it. Then the whole path: gpusched's scheduler allocates the
//! claims (a template with `matchAttribute`, a shared claim, a pod waiting
//! for freed devices) and the kubelet prepares exactly those GPUs.
//!
//! The agent runs as the chart installs it in DRA mode (`helm template
//! --set agent.mode=dra`): its ServiceAccount (a token bound to a pod on the
//! node), ClusterRole, the admission policy limiting it to its own node's
//! ResourceSlice, and the chart's DeviceClass.
//!
//! Needs root (the kubelet runs in a private mount namespace) and the
//! binaries of `e2e/cluster/build`; run by `e2e/run`.
//! `GPUSCHED_E2E_KEEP=1` keeps the node's directory.

mod dra_node;
#[path = "../../k8s/tests/common/mod.rs"]
mod k8s;
mod real_kubelet;

use dra_node::*;
use gpusched_model::dra;
use k8s::{Cluster, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use serde_json::json;
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn a_claimed_pod_runs_on_a_real_kubelet_with_exactly_its_gpus() {
    let c = Cluster::up().await;
    let mut n = RealNode::up(&c).await;

    // The agent registers and publishes the node's slice (again after the
    // kubelet wipes the node's slices at its start).
    let slices: Api<ResourceSlice> = Api::all(c.client.clone());
    let slice_name = format!("{NODE}-{DRIVER}");
    let s = published_slice(&c, &n).await;
    assert_eq!(s.spec.driver, DRIVER);
    // With the agent's own credentials, a slice offering devices on
    // another node is refused by the chart's admission policy.
    let as_agent = k8s::client_for(n.kubeconfig.to_str().unwrap()).await;
    let forged: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "forged"},
        "spec": {"driver": DRIVER, "nodeName": "another-node",
            "pool": {"name": "another-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}]}}))
    .unwrap();
    // (an admission policy takes effect once the API server has loaded
    // it, a moment after it is created: a forged slice accepted before
    // then is deleted and the write tried again)
    let as_agent: Api<ResourceSlice> = Api::all(as_agent);
    let refused = wait_for(Duration::from_secs(30), || async {
        let why = match as_agent.create(&PostParams::default(), &forged).await {
            Err(e) => e.to_string(),
            Ok(_) => {
                let _ = slices.delete("forged", &DeleteParams::default()).await;
                String::new()
            }
        };
        if why.contains("only publish the ResourceSlice of the node it runs on") {
            return Some(why);
        }
        eprintln!("forged slice not refused by the policy yet: {why:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        None
    })
    .await;
    assert!(
        refused.is_some(),
        "the agent published a slice for another node for 30 s"
    );
    assert_eq!(s.spec.pool.name, NODE);
    let devs = s.spec.devices.unwrap();
    assert_eq!(
        devs[2].attributes.as_ref().unwrap()["uuid"]
            .string
            .as_deref(),
        Some(n.uuid(2).as_str())
    );
    assert_eq!(devs[2].capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
    // What the agent publishes is what the API server keeps (no canonical
    // form differs): the periodic check (1 s) does not write again.
    let gen0 = s.spec.pool.generation;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = slices.get(&slice_name).await.unwrap();
    assert_eq!(
        again.spec.pool.generation,
        gen0,
        "the slice is rewritten without a change\n{}",
        n.logs()
    );

    // A claim of two GPUs, allocated by hand, and its pod.
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let claim: ResourceClaim = serde_json::from_value(claim_spec("two", 2)).unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod: Pod = serde_json::from_value(pod_spec("trainer", "two")).unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();
    allocate_and_bind(&c, "two", NODE, &["gpu-1", "gpu-3"], &pod).await;

    wait_for(Duration::from_secs(90), || async {
        let p = pods.get("trainer").await.ok()?;
        (phase(&p) == "Running").then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!("pod trainer never ran\n{}", n.logs());
    });
    let mut want = vec![
        format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(1)),
        format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(3)),
    ];
    want.sort();
    assert_eq!(
        n.cdi_devices(&pod_uid, "main"),
        Some(want),
        "the container's CDI devices are the allocated GPUs\n{}",
        n.logs()
    );
    assert_eq!(
        n.cdi_devices(&pod_uid, "side"),
        Some(vec![]),
        "a container without the claim gets no GPU"
    );
    // A fatal XID on gpu-3: the health stream tells the kubelet, which
    // shows it in the container's status (ResourceHealthStatus, beta and
    // on in 1.37).
    std::fs::OpenOptions::new()
        .append(true)
        .open(n.dir.path().join("control"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"xid 3 79\n"))
        .unwrap();
    let gpu3 = format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(3));
    let statuses = wait_for(Duration::from_secs(60), || async {
        let p = pods.get("trainer").await.ok()?;
        let cs = p.status?.container_statuses?;
        let main = cs.into_iter().find(|c| c.name == "main")?;
        let ars = main.allocated_resources_status?;
        let health: Vec<(String, String)> = ars
            .iter()
            .flat_map(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .map(|h| (h.resource_id.clone(), h.health.clone().unwrap_or_default()))
            })
            .collect();
        health
            .iter()
            .any(|(id, h)| id == &gpu3 && h == "Unhealthy")
            .then_some((ars, health))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "gpu-3 never showed Unhealthy in the pod status\n{}",
            n.logs()
        )
    });
    assert!(
        statuses.0.iter().any(|r| r.name == "claim:gpus"),
        "{:?}",
        statuses.0
    );
    let gpu1 = format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(1));
    assert!(
        statuses
            .1
            .iter()
            .any(|(id, h)| id == &gpu1 && h == "Healthy"),
        "{:?}",
        statuses.1
    );

    let spec_file = n
        .cdi_dir()
        .join(format!("k8s.gpu.gpusched.io-claim_{claim_uid}.json"));
    assert!(spec_file.exists(), "CDI spec {}", spec_file.display());

    // A claim allocated in another node's pool: the kubelet's prepare
    // fails with the agent's reason, and the pod does not run.
    let bad: ResourceClaim = serde_json::from_value(claim_spec("elsewhere", 1)).unwrap();
    claims.create(&PostParams::default(), &bad).await.unwrap();
    let bad_pod: Pod = serde_json::from_value(pod_spec("stray", "elsewhere")).unwrap();
    let bad_pod = pods.create(&PostParams::default(), &bad_pod).await.unwrap();
    allocate_and_bind(&c, "elsewhere", "other-node", &["gpu-0"], &bad_pod).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    let msg = wait_for(Duration::from_secs(60), || async {
        let l = events
            .list(&ListParams::default().fields("involvedObject.name=stray"))
            .await
            .ok()?;
        l.items
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("not in this node's pool"))
    })
    .await
    .unwrap_or_else(|| panic!("no prepare failure event for pod stray\n{}", n.logs()));
    assert!(msg.contains("ml/elsewhere"), "{msg}");
    assert_ne!(phase(&pods.get("stray").await.unwrap()), "Running");

    // The agent restarts: what it prepared is still prepared.
    n.stop_agent();
    n.start_agent();
    assert!(spec_file.exists());

    // Deleting the pod unprepares the claim: its CDI spec goes, and the
    // checkpoint forgets it.
    pods.delete("trainer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let checkpoint = n.plugin_dir().join("checkpoint.json");
    wait_for(Duration::from_secs(90), || async {
        let cp = std::fs::read_to_string(&checkpoint).ok()?;
        (!spec_file.exists() && !cp.contains(&claim_uid)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("claim two never unprepared\n{}", n.logs()));
}

/// gpusched's scheduler (in-process, the chart's flags) allocates the
/// claims — from a template with a `matchAttribute` constraint, a claim
/// shared by two pods, one that must wait for devices to be freed — and
/// the real kubelet prepares them through the agent's DRA service: every
/// container's CDI devices are exactly the devices gpusched allocated, and
/// no GPU is in two claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn claims_gpusched_allocates_run_on_a_real_kubelet_with_exactly_those_gpus() {
    let c = Cluster::up().await;
    // claims from templates, and reservations of deleted pods released
    let _kcm = k8s::controllers::kube_controller_manager_with(&c, "resourceclaim-controller");
    let n = RealNode::up(&c).await;
    let slice = published_slice(&c, &n).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client.clone(), NS);
    let pair: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "pair", "namespace": NS},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {
                "deviceClassName": dra::DEVICE_CLASS, "count": 2}}],
            "constraints": [{"matchAttribute": format!("{DRIVER}/{}", dra::ATTR_NVLINK_DOMAIN)}]}}}}))
    .unwrap();
    templates
        .create(&PostParams::default(), &pair)
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let shared: ResourceClaim = serde_json::from_value(claim_spec("shared", 1)).unwrap();
    claims
        .create(&PostParams::default(), &shared)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let _s = c.scheduler(k8s::opts()).await;

    // a pod with a claim from the template: 2 GPUs, both in one NVLink domain
    let trainer =
        serde_json::from_value(scheduled_pod("trainer", &[("gpus", Err("pair"))])).unwrap();
    pods.create(&PostParams::default(), &trainer).await.unwrap();
    let t = running(&c, &n, "trainer").await;
    let t_claim = claim_of(&c, "trainer", "gpus")
        .await
        .expect("trainer's claim");
    let t_gpus = allocated_cdi(&t_claim, &slice);
    assert_eq!(t_gpus.len(), 2, "{t_claim:?}");
    assert_eq!(
        n.cdi_devices(t.metadata.uid.as_deref().unwrap(), "main"),
        Some(t_gpus.clone()),
        "the container's CDI devices are the GPUs gpusched allocated\n{}",
        n.logs()
    );

    // one claim, two pods: allocated once, reserved for both, the same GPU
    // in both containers
    for name in ["reader-a", "reader-b"] {
        let p = serde_json::from_value(scheduled_pod(name, &[("gpu", Ok("shared"))])).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let a = running(&c, &n, "reader-a").await;
    let b = running(&c, &n, "reader-b").await;
    let sh = claims.get("shared").await.unwrap();
    let sh_gpus = allocated_cdi(&sh, &slice);
    assert_eq!(sh_gpus.len(), 1);
    assert_eq!(
        sh.status
            .as_ref()
            .unwrap()
            .reserved_for
            .as_ref()
            .map(Vec::len),
        Some(2),
        "{sh:?}"
    );
    for p in [&a, &b] {
        assert_eq!(
            n.cdi_devices(p.metadata.uid.as_deref().unwrap(), "main"),
            Some(sh_gpus.clone()),
            "{}",
            n.logs()
        );
    }
    assert!(!t_gpus.contains(&sh_gpus[0]), "a GPU in two claims");

    // 2 more GPUs in one NVLink domain: 1 is free, so the pod waits,
    // unbound, with a reason; when the trainer goes, its GPUs are given
    // again and the pod runs on exactly what it was allocated
    let late = serde_json::from_value(scheduled_pod("late", &[("gpus", Err("pair"))])).unwrap();
    pods.create(&PostParams::default(), &late).await.unwrap();
    let why = wait_for(Duration::from_secs(30), || async {
        k8s::scheduled_reason(&pods.get("late").await.ok()?)
    })
    .await
    .expect("late pending with a PodScheduled reason");
    eprintln!("late pending: {why:?}");
    assert!(
        pods.get("late")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "bound without devices"
    );
    pods.delete("trainer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let l = running(&c, &n, "late").await;
    let l_claim = claim_of(&c, "late", "gpus").await.expect("late's claim");
    let l_gpus = allocated_cdi(&l_claim, &slice);
    assert_eq!(l_gpus.len(), 2);
    assert!(!l_gpus.contains(&sh_gpus[0]), "a GPU in two claims");
    assert_eq!(
        n.cdi_devices(l.metadata.uid.as_deref().unwrap(), "main"),
        Some(l_gpus),
        "{}",
        n.logs()
    );
}

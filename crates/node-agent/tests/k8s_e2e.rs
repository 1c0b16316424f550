//! End-to-end: the scheduler (in-process) and the node agent against a real
//! kube-apiserver + etcd (kwok keeps the node Ready), with our fake kubelet
//! playing the node side (`docs/protocol.md`). Needs the control plane:
//! `e2e/run` builds it (cached) and runs these tests.

mod common;
#[path = "../../k8s/tests/common/mod.rs"]
mod k8s;

use common::{FakeKubelet, FakePodResources, RunningAgent, fixture};
use gpusched_model::protocol::{
    ANNOTATION_NODE_ALLOCATIONS, ANNOTATION_NODE_GPUS, GpuDecision, NodeAllocations, NodeGpu,
};
use gpusched_node_agent::api;
use gpusched_node_agent::coord::KubeSide;
use gpusched_node_agent::kube::{KubeEvents, KubeNode, KubePods};
use k8s::{Cluster, bound, create, decision, events_for, opts, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tonic::Code;

/// 16 H100s in two NVLink domains of 8.
const NODE: &str = "gpu16";
fn node_yaml() -> String {
    let mut s = String::from(
        "nodes:\n  - name: gpu16\n    cpu: \"128\"\n    memory: 1Ti\n    gpus:\n      count: 16\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      pcie_switches: 4\n      numa_nodes: 2\n      devices:\n",
    );
    for i in 0..16 {
        s.push_str(&format!("        - {{index: {i}, nvlink: {}}}\n", i / 8));
    }
    s
}

const SHARE_SOCK: &str = "gpusched-gpusched.io-gpu-milli.sock";
const GPU_SOCK: &str = "gpusched-nvidia.com-gpu.sock";

/// The Node as a kubelet without our agent would register it: capacity,
/// no GPU annotation, no GFD labels.
async fn create_bare_node(c: &Cluster, file: &Path) {
    let spec: gpusched_model::spec::ClusterSpec =
        serde_saphyr::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
    let b = spec.build().unwrap().remove(0);
    let mut n = gpusched_k8s::kwok::node_object(&b.node);
    if let Some(a) = n.metadata.annotations.as_mut() {
        a.remove(ANNOTATION_NODE_GPUS);
    }
    if let Some(l) = n.metadata.labels.as_mut() {
        l.retain(|k, _| !k.starts_with("nvidia.com/") && !k.starts_with("gpusched.io/"));
    }
    let api: Api<Node> = Api::all(c.client.clone());
    api.create(&PostParams::default(), &n).await.unwrap();
}

struct NodeSide {
    dir: tempfile::TempDir,
    kubelet: FakeKubelet,
    pr: FakePodResources,
    node_file: PathBuf,
    control: PathBuf,
    agent: Option<RunningAgent>,
    used: BTreeSet<String>,
    unhealthy: BTreeSet<usize>,
}

impl NodeSide {
    async fn new() -> NodeSide {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = FakeKubelet::start(dir.path()).await;
        let pr = FakePodResources::start(&dir.path().join("pod-resources.sock"));
        let node_file = dir.path().join("node.yaml");
        std::fs::write(&node_file, node_yaml()).unwrap();
        let control = dir.path().join("control");
        std::fs::write(&control, "").unwrap();
        NodeSide {
            dir,
            kubelet,
            pr,
            node_file,
            control,
            agent: None,
            used: BTreeSet::new(),
            unhealthy: BTreeSet::new(),
        }
    }

    async fn start_agent(&mut self, c: &Cluster) {
        let client = k8s::client_for(&c.env["GPUSCHED_E2E_KUBECONFIG"]).await;
        let mut s = common::settings(self.dir.path(), "dgx-h100.yaml");
        s.node_file = Some(self.node_file.clone());
        s.control_file = Some(self.control.clone());
        s.node_name = Some(NODE.into());
        s.shares = true;
        s.pod_resources_socket = self.dir.path().join("pod-resources.sock");
        let side = KubeSide {
            node: NODE.into(),
            pods: Arc::new(KubePods::new(client.clone(), NODE)),
            events: Arc::new(KubeEvents::new(client.clone(), NODE)),
            node_sink: Some(Arc::new(KubeNode::new(client, NODE))),
            require_decision: true,
        };
        self.agent = Some(common::start_agent_with(s, side));
        for _ in 0..2 {
            self.kubelet
                .next_registration(Duration::from_secs(20))
                .await;
        }
    }

    async fn stop_agent(&mut self) {
        if let Some(a) = self.agent.take() {
            a.shutdown().await.unwrap();
        }
    }

    fn uuids(&self) -> Vec<String> {
        gpusched_node_agent::backend::fake::FakeBackend::from_file(&self.node_file, None)
            .unwrap()
            .inventory_ref()
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect()
    }

    /// What the kubelet does to admit `p`: GetPreferredAllocation over the
    /// ids it has free, then Allocate with its choice (`ids` overrides the
    /// choice, as a kubelet that ignores the preference would).
    async fn admit(
        &mut self,
        p: &Pod,
        ids: Option<Vec<String>>,
    ) -> Result<api::ContainerAllocateResponse, tonic::Status> {
        let limits = p.spec.as_ref().unwrap().containers[0]
            .resources
            .as_ref()
            .and_then(|r| r.limits.clone())
            .unwrap_or_default();
        let (sock, resource, size, avail): (&str, &str, usize, Vec<String>) =
            if let Some(q) = limits.get("gpusched.io/gpu-milli") {
                let n: usize = q.0.parse().unwrap();
                let mut all = Vec::new();
                for (i, u) in self.uuids().iter().enumerate() {
                    if !self.unhealthy.contains(&i) {
                        all.extend((0..1000).map(|k| format!("{u}::{k}")));
                    }
                }
                (SHARE_SOCK, "gpusched.io/gpu-milli", n, all)
            } else {
                let n: usize = limits["nvidia.com/gpu"].0.parse().unwrap();
                let all = self
                    .uuids()
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| !self.unhealthy.contains(i))
                    .map(|(_, u)| u)
                    .collect();
                (GPU_SOCK, "nvidia.com/gpu", n, all)
            };
        let avail: Vec<String> = avail
            .into_iter()
            .filter(|i| !self.used.contains(i))
            .collect();
        let mut c = self.kubelet.client(sock).await;
        let pick = match ids {
            Some(v) => v,
            None => {
                c.get_preferred_allocation(api::PreferredAllocationRequest {
                    container_requests: vec![api::ContainerPreferredAllocationRequest {
                        available_device_i_ds: avail,
                        must_include_device_i_ds: vec![],
                        allocation_size: size as i32,
                    }],
                })
                .await?
                .into_inner()
                .container_responses
                .remove(0)
                .device_i_ds
            }
        };
        let r = c
            .allocate(api::AllocateRequest {
                container_requests: vec![api::ContainerAllocateRequest {
                    devices_ids: pick.clone(),
                }],
            })
            .await?
            .into_inner()
            .container_responses
            .remove(0);
        self.used.extend(pick.iter().cloned());
        let m = &p.metadata;
        self.pr.hold(
            m.namespace.as_deref().unwrap(),
            m.name.as_deref().unwrap(),
            resource,
            &pick,
        );
        Ok(r)
    }

    fn control(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

fn pod(name: &str, limits: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM5-80GB"},
            "containers": [{"name": "main", "image": "cuda",
                "resources": {"limits": limits, "requests": {"cpu": "100m"}}}]}
    })
}

fn env(r: &api::ContainerAllocateResponse, k: &str) -> String {
    r.envs.get(k).cloned().unwrap_or_default()
}

async fn wait_bound(api: &Api<Pod>, names: &[&str]) -> Vec<Pod> {
    let b = wait_for(Duration::from_secs(60), || async {
        let b = bound(api).await;
        names.iter().all(|n| b.contains_key(*n)).then_some(b)
    })
    .await
    .unwrap_or_else(|| panic!("{names:?} not all bound"));
    names.iter().map(|n| b[*n].clone()).collect()
}

async fn node_gpus(c: &Cluster) -> Option<Vec<NodeGpu>> {
    let api: Api<Node> = Api::all(c.client.clone());
    let n = api.get(NODE).await.ok()?;
    let text = n.metadata.annotations?.get(ANNOTATION_NODE_GPUS)?.clone();
    serde_json::from_str(&text).ok()
}

/// The agent's `gpusched.io/allocations` annotation on the Node.
async fn node_allocations(c: &Cluster) -> Option<NodeAllocations> {
    let api: Api<Node> = Api::all(c.client.clone());
    let n = api.get(NODE).await.ok()?;
    let text = n
        .metadata
        .annotations?
        .get(ANNOTATION_NODE_ALLOCATIONS)?
        .clone();
    Some(NodeAllocations::parse(&text).expect("a well-formed allocations annotation"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn scheduler_and_agent_agree_on_gpus() {
    let c = Cluster::up().await;
    let mut ns = NodeSide::new().await;
    create_bare_node(&c, &ns.node_file).await;
    let pods = c.pods("ml");
    let s = c.scheduler(opts()).await;

    // Labels: a pod selecting the GPU model waits until the agent
    // publishes the GFD labels on the Node.
    create(&pods, pod("early", json!({"nvidia.com/gpu": "1"}))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !bound(&pods).await.contains_key("early"),
        "bound before the agent published labels"
    );
    let t0 = Instant::now();
    ns.start_agent(&c).await;
    let gpus = wait_for(Duration::from_secs(20), || node_gpus(&c))
        .await
        .expect("agent publishes gpusched.io/gpus");
    eprintln!("node GPUs published {:?} after agent start", t0.elapsed());
    assert_eq!(gpus.len(), 16);
    assert_eq!(gpus[9].nvlink, Some(1));
    let api: Api<Node> = Api::all(c.client.clone());
    let labels = api.get(NODE).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.product"], "H100-SXM5-80GB");
    assert_eq!(labels["nvidia.com/gpu.count"], "16");
    let early = wait_bound(&pods, &["early"]).await.remove(0);
    eprintln!("early pod bound {:?} after agent start", t0.elapsed());
    let r = ns.admit(&early, None).await.unwrap();
    assert_eq!(env(&r, "NVIDIA_VISIBLE_DEVICES"), decision(&early).gpus[0]);
    // What each admitted pod was given, as the kubelet would list it.
    let mut given: BTreeMap<String, Vec<String>> = BTreeMap::new();
    given.insert("early".into(), vec![env(&r, "NVIDIA_VISIBLE_DEVICES")]);

    // Two 1-GPU pods at once: each gets the GPU the scheduler chose.
    create(&pods, pod("a1", json!({"nvidia.com/gpu": "1"}))).await;
    create(&pods, pod("a2", json!({"nvidia.com/gpu": "1"}))).await;
    let got = wait_bound(&pods, &["a1", "a2"]).await;
    let (d1, d2) = (decision(&got[0]), decision(&got[1]));
    assert_ne!(d1.gpus, d2.gpus);
    // The kubelet admits a2 first (another order than bind order).
    let r2 = ns.admit(&got[1], None).await.unwrap();
    let r1 = ns.admit(&got[0], None).await.unwrap();
    let v1 = env(&r1, "NVIDIA_VISIBLE_DEVICES");
    let v2 = env(&r2, "NVIDIA_VISIBLE_DEVICES");
    assert_ne!(v1, v2);
    given.insert("a1".into(), vec![v1.clone()]);
    given.insert("a2".into(), vec![v2.clone()]);
    let mut want = vec![d1.gpus[0].clone(), d2.gpus[0].clone()];
    let mut have = vec![v1, v2];
    want.sort();
    have.sort();
    assert_eq!(have, want, "the two GPUs the scheduler chose");

    // An 8-GPU pod gets one NVLink domain, the one the scheduler chose.
    create(&pods, pod("big", json!({"nvidia.com/gpu": "8"}))).await;
    let big = wait_bound(&pods, &["big"]).await.remove(0);
    let d = decision(&big);
    let domains: BTreeSet<Option<u32>> =
        d.indices.iter().map(|&i| gpus[i as usize].nvlink).collect();
    assert_eq!(domains.len(), 1, "one NVLink domain: {:?}", d.indices);
    let r = ns.admit(&big, None).await.unwrap();
    let mut v: Vec<String> = env(&r, "NVIDIA_VISIBLE_DEVICES")
        .split(',')
        .map(String::from)
        .collect();
    v.sort();
    let mut w = d.gpus.clone();
    w.sort();
    assert_eq!(v, w);
    given.insert("big".into(), v);

    // A fractional pod gets the recorded GPU and the share env.
    create(
        &pods,
        pod(
            "frac",
            json!({"gpusched.io/gpu-milli": "300", "gpusched.io/gpu-memory-mib": "8192"}),
        ),
    )
    .await;
    let frac = wait_bound(&pods, &["frac"]).await.remove(0);
    let d = decision(&frac);
    assert_eq!(d.share.as_ref().map(|s| s.milli), Some(300));
    let r = ns.admit(&frac, None).await.unwrap();
    assert_eq!(env(&r, "NVIDIA_VISIBLE_DEVICES"), d.gpus[0]);
    assert_eq!(env(&r, "GPUSCHED_GPU_MILLI"), "300");
    assert_eq!(env(&r, "GPUSCHED_GPU_MEMORY_LIMIT_MIB"), "8192");
    given.insert("frac".into(), d.gpus.clone());

    // The agent publishes what the kubelet was given: each admitted pod
    // with the GPUs it holds (PodResources; a1 and a2, admitted in another
    // order than guessed, may hold each other's decided GPUs) and the share
    // of a shared GPU.
    let admitted = [&early, &got[0], &got[1], &big, &frac];
    let published = wait_for(Duration::from_secs(20), || async {
        node_allocations(&c)
            .await
            .filter(|a| a.pods.len() == admitted.len())
    })
    .await
    .expect("allocations of the five admitted pods on the Node");
    for p in admitted {
        let uid = p.metadata.uid.as_deref().unwrap();
        let a = published
            .pods
            .iter()
            .find(|a| a.uid == uid)
            .unwrap_or_else(|| panic!("{uid} in {published:?}"));
        assert_eq!(Some(a.name.as_str()), p.metadata.name.as_deref());
        let mut have = a.gpus.clone();
        let mut want = given[&a.name].clone();
        have.sort();
        want.sort();
        assert_eq!(have, want, "{}", a.name);
        let milli = decision(p).share.map(|s| s.milli);
        assert_eq!(a.milli, milli, "{}", a.name);
    }

    // A pod carrying a copy of another pod's decision (placed by hand on
    // the node) is refused with a clear error and an event.
    let mut forged = pod("forged", json!({"nvidia.com/gpu": "1"}));
    forged["spec"]["nodeName"] = json!(NODE);
    forged["metadata"]["annotations"] = json!({"gpusched.io/decision": GpuDecision { uid: "someone-else".into(), ..d1.clone() }.to_annotation()});
    let forged = create(&pods, forged).await;
    let ev = wait_for(Duration::from_secs(15), || async {
        let e = events_for(&c.client, "ml", "forged").await;
        e.iter()
            .any(|e| e.starts_with("GpuDecisionRefused:"))
            .then_some(e)
    })
    .await
    .expect("GpuDecisionRefused event");
    assert!(ev.iter().any(|e| e.contains("copied or forged")), "{ev:?}");
    let free = ns
        .uuids()
        .into_iter()
        .find(|u| !ns.used.contains(u))
        .unwrap();
    let e = ns.admit(&forged, Some(vec![free])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("ml/forged: decision was made for pod uid \"someone-else\""),
        "{}",
        e.message()
    );
    pods.delete(
        "forged",
        &kube::api::DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();

    // Agent restart between bind and Allocate.
    ns.stop_agent().await;
    create(&pods, pod("during", json!({"nvidia.com/gpu": "2"}))).await;
    let during = wait_bound(&pods, &["during"]).await.remove(0);
    ns.start_agent(&c).await;
    let r = ns.admit(&during, None).await.unwrap();
    assert_eq!(
        env(&r, "NVIDIA_VISIBLE_DEVICES"),
        decision(&during).gpus.join(",")
    );

    // A GPU marked unhealthy reaches the Node; no new pod is placed on it.
    let held: BTreeSet<u32> = bound(&pods)
        .await
        .values()
        .filter(|p| p.metadata.name.as_deref() != Some("forged"))
        .flat_map(|p| decision(p).indices)
        .collect();
    let sick = (0..16u32).rev().find(|i| !held.contains(i)).unwrap();
    let t1 = Instant::now();
    ns.control(&format!("unhealthy {sick}"));
    ns.unhealthy.insert(sick as usize);
    wait_for(Duration::from_secs(10), || async {
        let g = node_gpus(&c).await?;
        (!g[sick as usize].healthy).then_some(())
    })
    .await
    .expect("unhealthy GPU reaches the Node");
    eprintln!(
        "GPU {sick} unhealthy on the Node {:?} after the fault",
        t1.elapsed()
    );
    let free = 16 - held.len() - 1;
    let names: Vec<String> = (0..free).map(|i| format!("fill{i}")).collect();
    for n in &names {
        create(&pods, pod(n, json!({"nvidia.com/gpu": "1"}))).await;
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let filled = wait_bound(&pods, &refs).await;
    for p in &filled {
        assert_ne!(
            decision(p).indices,
            vec![sick],
            "placed on the unhealthy GPU"
        );
    }
    create(&pods, pod("one-too-many", json!({"nvidia.com/gpu": "1"}))).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!bound(&pods).await.contains_key("one-too-many"));
    k8s::assert_no_double_booking(&c.client).await;

    // With the agent down, a pod deleted behind its back stays in the
    // published allocations: doctor names it as a leak with the capacity
    // that would come back.
    ns.stop_agent().await;
    pods.delete("big", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let report = wait_for(Duration::from_secs(20), || async {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .ok()?;
        let v = serde_json::to_value(&r).unwrap();
        (v["summary"]["leakedMilli"] == 8000).then_some((v, r.render()))
    })
    .await;
    let (v, text) = report.expect("doctor reports big's 8 GPUs as leaked");
    let leaks: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "leaks" && f["status"] != "ok")
        .collect();
    assert_eq!(leaks.len(), 1, "{text}");
    assert!(
        leaks[0]["message"].as_str().unwrap().contains("ml/big"),
        "{text}"
    );
    s.stop().await;
    let _ = fixture("dgx-h100.yaml");
}

/// Documents of a multi-document YAML file, as JSON values.
fn documents(text: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut flush = |cur: &mut String| {
        let has_content = cur
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if has_content {
            let v: serde_json::Value =
                serde_saphyr::from_str(cur).unwrap_or_else(|e| panic!("{e}\n{cur}"));
            out.push(v);
        }
        cur.clear();
    };
    for line in text.lines() {
        if line.trim_end() == "---" {
            flush(&mut cur);
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    flush(&mut cur);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn deploy_manifests_apply_to_the_apiserver() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::{Discovery, Scope};
    let c = Cluster::up().await;
    let root = k8s::repo_root();
    let mut docs = documents(
        &std::fs::read_to_string(root.join("deploy/helm/gpusched/crds/crds.yaml")).unwrap(),
    );
    let rendered = documents(&std::fs::read_to_string(root.join("deploy/gpusched.yaml")).unwrap());
    assert!(rendered.len() >= 15, "{} documents", rendered.len());
    docs.extend(rendered);
    // (the harness already made gpusched-system for the scheduler's
    // ServiceAccount; the manifests are applied over what it made)
    let discovery = Discovery::new(c.client.clone()).run().await.unwrap();
    let pp = PatchParams::apply("gpusched-deploy-test").force();
    let mut kinds = BTreeSet::new();
    for d in &docs {
        let (group, version) = match d["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), d["apiVersion"].as_str().unwrap().to_string()),
        };
        let kind = d["kind"].as_str().unwrap();
        let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the apiserver does not serve {gvk:?}"));
        let name = d["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                c.client.clone(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("gpusched-system"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(c.client.clone(), &ar),
        };
        api.patch(name, &pp, &Patch::Apply(d))
            .await
            .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
        kinds.insert(kind.to_string());
    }
    for k in [
        "Deployment",
        "DaemonSet",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
        "CustomResourceDefinition",
    ] {
        assert!(
            kinds.contains(k),
            "{k} missing from the manifests: {kinds:?}"
        );
    }
    // The agent's Node policy, with a token bound to an agent pod on a
    // node (it carries the node name): its own labels and annotations pass
    // (so every expression evaluates; a broken one fails closed), what the
    // kubelet's NodeRestriction forbids does not.
    let node_name = c.nodes_from_yaml(k8s::H100).await.remove(0);
    let agent_pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(c.client.clone(), "gpusched-system");
    let ap = k8s::create(
        &agent_pods,
        json!({"metadata": {"name": "agent-x"}, "spec": {"nodeName": node_name,
               "serviceAccountName": "gpusched-agent",
               "containers": [{"name": "a", "image": "gpusched"}]}}),
    )
    .await;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(c.client.clone(), "gpusched-system");
    let tr: k8s_openapi::api::authentication::v1::TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": null, "expirationSeconds": 3600, "boundObjectRef":
            {"kind": "Pod", "apiVersion": "v1", "name": "agent-x", "uid": ap.metadata.uid}}}))
    .unwrap();
    let token = sas
        .create_token_request("gpusched-agent", &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let agent_nodes: Api<k8s_openapi::api::core::v1::Node> =
        Api::all(kube::Client::try_from(cfg).unwrap());
    let patch = |v: serde_json::Value| {
        let agent_nodes = agent_nodes.clone();
        let node_name = node_name.clone();
        async move {
            agent_nodes
                .patch(&node_name, &PatchParams::default(), &Patch::Merge(&v))
                .await
                .map(|_| ())
        }
    };
    // (the policy may take a moment to be in force after it is created)
    // (a new value each try: one that got through before the policy was in
    // force would be "unchanged" afterwards)
    let tries = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for(Duration::from_secs(20), || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        patch(json!({"spec": {"taints": [{"key": "x", "value": n.to_string(), "effect": "NoSchedule"}]}}))
            .await
            .err()
    })
    .await
    .expect("the agent may not cordon its node");
    assert!(
        denied
            .to_string()
            .contains("may not change its Node's spec"),
        "{denied}"
    );
    patch(
        json!({"metadata": {"labels": {"nvidia.com/gpu.family": "hopper"},
                               "annotations": {"gpusched.io/allocations": "{}"}}}),
    )
    .await
    .expect("the agent writes its own labels and annotations");
    agent_nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"capacity": {"gpusched.io/gpu-memory-mib": "655360"}}}),
            ),
        )
        .await
        .expect("the agent publishes its gpusched.io/ capacity");
    for (v, msg) in [
        (
            json!({"status": {"capacity": {"nvidia.com/gpu": "99"}}}),
            "only publish gpusched.io/ capacity",
        ),
        (
            json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "x", "message": "x"}]}}),
            "may not change its Node's conditions",
        ),
    ] {
        let e = agent_nodes
            .patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&v))
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(msg), "{v}: {e}");
    }
    for (v, msg) in [
        (
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}}),
            "labels under nvidia.com/ and gpusched.io/",
        ),
        (
            json!({"metadata": {"annotations": {"other.io/x": "y"}}}),
            "annotations under gpusched.io/",
        ),
    ] {
        let e = patch(v.clone()).await.expect_err("refused");
        assert!(e.to_string().contains(msg), "{v}: {e}");
    }
    // Least privilege, as the API server's authorizer sees it.
    let sar: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> =
        Api::all(c.client.clone());
    let can = |who: &str, verb: &str, resource: &str, sub: &str| {
        let sar = sar.clone();
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": format!("system:serviceaccount:gpusched-system:{who}"),
                "groups": ["system:serviceaccounts", "system:serviceaccounts:gpusched-system", "system:authenticated"],
                "resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub,
                    "group": if resource == "events" { "events.k8s.io" } else { "" },
                    "namespace": if resource == "nodes" { "" } else { "ml" }}}
        });
        async move {
            let r = sar
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(body).unwrap(),
                )
                .await
                .unwrap();
            r.status.map(|s| s.allowed).unwrap_or(false)
        }
    };
    for (who, verb, res, sub, want) in [
        ("gpusched-agent", "patch", "nodes", "", true),
        ("gpusched-agent", "patch", "nodes", "status", true),
        ("gpusched-agent", "watch", "pods", "", true),
        ("gpusched-agent", "create", "events", "", true),
        ("gpusched-agent", "update", "pods", "", false),
        ("gpusched-agent", "patch", "pods", "", false),
        ("gpusched-agent", "delete", "nodes", "", false),
        ("gpusched-agent", "create", "pods", "binding", false),
        ("gpusched-agent", "get", "secrets", "", false),
        ("gpusched-scheduler", "create", "pods", "binding", true),
        ("gpusched-scheduler", "patch", "pods", "status", true),
        ("gpusched-scheduler", "delete", "pods", "", true),
        ("gpusched-scheduler", "patch", "nodes", "", false),
        ("gpusched-scheduler", "get", "secrets", "", false),
    ] {
        assert_eq!(
            can(who, verb, res, sub).await,
            want,
            "{who} {verb} {res}/{sub}"
        );
    }
    // The decision policy is in force: a pod with a decision made by
    // anyone but the scheduler is refused at admission.
    let pods = c.pods("ml");
    let mut p = pod("sneaky", json!({"nvidia.com/gpu": "1"}));
    p["metadata"]["annotations"] = json!({"gpusched.io/decision": "{}"});
    let refused = wait_for(Duration::from_secs(20), || {
        let pods = pods.clone();
        let p = p.clone();
        async move {
            match pods
                .create(&PostParams::default(), &serde_json::from_value(p).unwrap())
                .await
            {
                Err(kube::Error::Api(s))
                    if s.message
                        .contains("only the gpusched scheduler may set gpusched.io/decision") =>
                {
                    Some(s.message)
                }
                Ok(_) => {
                    let _ = pods
                        .delete(
                            "sneaky",
                            &kube::api::DeleteParams::default().grace_period(0),
                        )
                        .await;
                    None
                }
                Err(_) => None,
            }
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "the admission policy never refused a forged decision"
    );
}

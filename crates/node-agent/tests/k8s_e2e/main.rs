//! End-to-end: the scheduler (in-process) and the node agent against a real
//! kube-apiserver + etcd (kwok keeps the node Ready), with our fake kubelet
//! playing the node side (`docs/protocol.md`). Needs the control plane:
//! `e2e/run` builds it (cached) and runs these tests.

#[path = "../common/mod.rs"]
mod common;
#[path = "../../../k8s/tests/common/mod.rs"]
mod k8s;

// the tests, by topic (this file: the node side and the helpers they share)
mod agree;
mod deploy;

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

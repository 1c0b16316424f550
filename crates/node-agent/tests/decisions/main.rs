//! The scheduler ↔ agent protocol (`docs/protocol.md`) with a fake
//! kubelet, a fake PodResources server and pods injected by the test.

#[path = "../common/mod.rs"]
mod common;

// the tests, by topic (this file: the rig and the helpers they share)
mod allocate;
mod mig;
mod published;
mod rounds;

use common::*;
use gpusched_model::protocol::{DECISION_VERSION, GpuDecision, NodeGpu, ShareDecision};
use gpusched_node_agent::api;
use gpusched_node_agent::api::device_plugin_client::DevicePluginClient;
use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::decisions::PodInfo;
use std::io::Write;
use std::time::{Duration, Instant};
use tonic::Code;
use tonic::transport::Channel;

const NODE: &str = "dgx-h100";
const GPU_SOCK: &str = "gpusched-nvidia.com-gpu.sock";
const SHARE_SOCK: &str = "gpusched-gpusched.io-gpu-milli.sock";

fn uuids() -> Vec<String> {
    static U: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    U.get_or_init(|| {
        FakeBackend::from_file(&fixture("dgx-h100.yaml"), None)
            .unwrap()
            .inventory_ref()
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect()
    })
    .clone()
}

fn decision(uid: &str, idx: &[u32], share: Option<(u32, u64)>) -> String {
    let u = uuids();
    GpuDecision {
        v: DECISION_VERSION,
        uid: uid.into(),
        node: NODE.into(),
        seq: 1,
        indices: idx.to_vec(),
        gpus: idx.iter().map(|&i| u[i as usize].clone()).collect(),
        share: share.map(|(milli, memory_mib)| ShareDecision {
            milli,
            memory_mib,
            resource: None,
            replicas: None,
        }),
        mig: None,
    }
    .to_annotation()
}

fn pod(name: &str, created: &str, decision: Option<String>) -> PodInfo {
    PodInfo {
        namespace: "default".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        node: NODE.into(),
        created: created.into(),
        decision,
        terminal: false,
        ..Default::default()
    }
}

fn whole(name: &str, created: &str, idx: &[u32]) -> PodInfo {
    pod(
        name,
        created,
        Some(decision(&format!("uid-{name}"), idx, None)),
    )
}

struct Rig {
    _dir: tempfile::TempDir,
    kubelet: FakeKubelet,
    pr: FakePodResources,
    t: TestSide,
    agent: Option<RunningAgent>,
    control: std::path::PathBuf,
    replication: Vec<gpusched_node_agent::config::Replication>,
    /// Node fixture, MIG strategy and how many resources register.
    fixture: &'static str,
    mig: gpusched_node_agent::config::MigStrategy,
    regs: usize,
}

impl Rig {
    async fn start(pods: Vec<PodInfo>, watch: bool, require: bool) -> Rig {
        Rig::start_with(pods, watch, require, Vec::new()).await
    }

    async fn start_with(
        pods: Vec<PodInfo>,
        watch: bool,
        require: bool,
        replication: Vec<gpusched_node_agent::config::Replication>,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = FakeKubelet::start(dir.path()).await;
        let pr = FakePodResources::start(&dir.path().join("pod-resources.sock"));
        let t = TestSide::new(watch);
        t.pods.set(pods);
        let control = dir.path().join("control");
        std::fs::write(&control, "").unwrap();
        let mut r = Rig {
            _dir: dir,
            kubelet,
            pr,
            t,
            agent: None,
            control,
            replication,
            fixture: "dgx-h100.yaml",
            mig: gpusched_node_agent::config::MigStrategy::None,
            regs: 2,
        };
        r.boot(require).await;
        r
    }

    /// An agent on a MIG fixture under `mig` whose `regs` resources
    /// register (shares on: `gpusched.io/gpu-milli` registers where a GPU
    /// is not in MIG mode).
    async fn start_mig(
        fixture: &'static str,
        mig: gpusched_node_agent::config::MigStrategy,
        regs: usize,
    ) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let kubelet = FakeKubelet::start(dir.path()).await;
        let pr = FakePodResources::start(&dir.path().join("pod-resources.sock"));
        let t = TestSide::new(true);
        let control = dir.path().join("control");
        std::fs::write(&control, "").unwrap();
        let mut r = Rig {
            _dir: dir,
            kubelet,
            pr,
            t,
            agent: None,
            control,
            replication: Vec::new(),
            fixture,
            mig,
            regs,
        };
        r.boot(true).await;
        r
    }

    fn settings(&self) -> gpusched_node_agent::config::Settings {
        let dir = self._dir.path();
        let mut s = settings(dir, self.fixture);
        s.mig_strategy = self.mig;
        s.node_name = Some(NODE.into());
        s.shares = true;
        s.pod_resources_socket = dir.join("pod-resources.sock");
        s.control_file = Some(self.control.clone());
        s.replication = self.replication.clone();
        s
    }

    async fn boot(&mut self, require: bool) {
        let a = start_agent_with(self.settings(), self.t.side(NODE, require));
        self.agent = Some(a);
        // Every resource registers.
        for _ in 0..self.regs {
            self.kubelet
                .next_registration(Duration::from_secs(10))
                .await;
        }
    }

    async fn restart(&mut self) {
        if let Some(a) = self.agent.take() {
            a.shutdown().await.unwrap();
        }
        self.boot(true).await;
    }

    async fn gpu(&self) -> DevicePluginClient<Channel> {
        self.kubelet.client(GPU_SOCK).await
    }

    async fn share(&self) -> DevicePluginClient<Channel> {
        self.kubelet.client(SHARE_SOCK).await
    }

    fn control(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .unwrap();
        writeln!(f, "{line}").unwrap();
    }
}

async fn allocate(
    c: &mut DevicePluginClient<Channel>,
    ids: &[String],
) -> Result<api::ContainerAllocateResponse, tonic::Status> {
    c.allocate(api::AllocateRequest {
        container_requests: vec![api::ContainerAllocateRequest {
            devices_ids: ids.to_vec(),
        }],
    })
    .await
    .map(|r| r.into_inner().container_responses.remove(0))
}

async fn preferred(
    c: &mut DevicePluginClient<Channel>,
    available: &[String],
    size: i32,
) -> Vec<String> {
    c.get_preferred_allocation(api::PreferredAllocationRequest {
        container_requests: vec![api::ContainerPreferredAllocationRequest {
            available_device_i_ds: available.to_vec(),
            must_include_device_i_ds: vec![],
            allocation_size: size,
        }],
    })
    .await
    .unwrap()
    .into_inner()
    .container_responses
    .remove(0)
    .device_i_ds
}

fn ids(idx: &[usize]) -> Vec<String> {
    let u = uuids();
    idx.iter().map(|&i| u[i].clone()).collect()
}

fn tokens(gpu: usize, from: u32, n: u32) -> Vec<String> {
    let u = uuids();
    (from..from + n)
        .map(|k| format!("{}::{k}", u[gpu]))
        .collect()
}

fn visible(r: &api::ContainerAllocateResponse) -> String {
    r.envs
        .get("NVIDIA_VISIBLE_DEVICES")
        .cloned()
        .unwrap_or_default()
}

/// A small deterministic generator (xorshift64*) for seeded orders.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n.max(1)
    }
    fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.below(i + 1);
            v.swap(i, j);
        }
    }
}

/// Hands the pods to the agent through its watch and waits until it has
/// taken them in.
async fn sync_pods(r: &Rig, pods: Vec<PodInfo>) {
    use std::sync::atomic::Ordering::SeqCst;
    let before = r.t.pods.applied.load(SeqCst);
    r.t.pods.set(pods);
    let t = Instant::now();
    while r.t.pods.applied.load(SeqCst) == before {
        assert!(t.elapsed() < Duration::from_secs(5), "watch did not apply");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn decided(name: &str, seq: u64, idx: &[u32], share: Option<(u32, u64)>) -> PodInfo {
    let u = uuids();
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("uid-{name}"),
        node: NODE.into(),
        seq,
        indices: idx.to_vec(),
        gpus: idx.iter().map(|&i| u[i as usize].clone()).collect(),
        share: share.map(|(milli, memory_mib)| ShareDecision {
            milli,
            memory_mib,
            resource: None,
            replicas: None,
        }),
        mig: None,
    };
    // Created in the same second: the kubelet's order is the bindings'.
    pod(name, "2026-01-01T00:00:01Z", Some(d.to_annotation()))
}

/// The node's published facts once there are some.
async fn published(r: &Rig) -> gpusched_node_agent::coord::NodeFacts {
    let t0 = Instant::now();
    loop {
        if let Some(f) = r.t.node.0.lock().unwrap().last().cloned() {
            return f.1;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

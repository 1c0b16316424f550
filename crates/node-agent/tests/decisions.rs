//! The scheduler ↔ agent protocol (`docs/protocol.md`) with a fake
//! kubelet, a fake PodResources server and pods injected by the test.

mod common;

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

#[tokio::test]
async fn two_pods_same_size_get_their_own_gpus() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[2]),
            whole("b", "2026-01-01T00:00:02Z", &[5]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    // The kubelet admits `a` first (older): steered to a's GPU.
    assert_eq!(preferred(&mut c, &all, 1).await, ids(&[2]));
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[2])).await.unwrap()),
        ids(&[2])[0]
    );
    // Then `b`: GPU 2 is no longer available to the kubelet.
    let rest = ids(&[0, 1, 3, 4, 5, 6, 7]);
    assert_eq!(preferred(&mut c, &rest, 1).await, ids(&[5]));
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[5])).await.unwrap()),
        ids(&[5])[0]
    );
    // A third container asking a GPU nobody was given: fail closed.
    let e = allocate(&mut c, &ids(&[3])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("no pod placed on node dgx-h100 by gpusched holds GPUs [3"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn admitted_in_reverse_order_still_one_owner_per_gpu() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[2]),
            whole("b", "2026-01-01T00:00:02Z", &[5]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // The kubelet ignores the preference and picks b's GPU first.
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[5])).await.unwrap()),
        ids(&[5])[0]
    );
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[2])).await.unwrap()),
        ids(&[2])[0]
    );
    // Nothing else is free: both decisions are served.
    let e = allocate(&mut c, &ids(&[0])).await.unwrap_err();
    assert!(
        e.message().contains("pending decisions: none"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn allocate_retry_is_idempotent() {
    let r = Rig::start(
        vec![whole("a", "2026-01-01T00:00:01Z", &[0, 1])],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let first = allocate(&mut c, &ids(&[0, 1])).await.unwrap();
    let again = allocate(&mut c, &ids(&[1, 0])).await.unwrap();
    assert_eq!(
        visible(&first),
        visible(&again)
            .split(',')
            .rev()
            .collect::<Vec<_>>()
            .join(",")
    );
    // One of the pod's GPUs alone (an init container reused by an app
    // container) is the same pod's too.
    assert!(allocate(&mut c, &ids(&[1])).await.is_ok());
}

#[tokio::test]
async fn eight_gpu_pod_is_steered_to_its_decision() {
    let r = Rig::start(
        vec![whole(
            "big",
            "2026-01-01T00:00:01Z",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        )],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let all = ids(&[7, 6, 5, 4, 3, 2, 1, 0]);
    let mut p = preferred(&mut c, &all, 8).await;
    p.sort();
    let mut want = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    want.sort();
    assert_eq!(p, want);
    assert!(allocate(&mut c, &all).await.is_ok());
}

#[tokio::test]
async fn tampered_decision_is_refused() {
    let a = whole("a", "2026-01-01T00:00:01Z", &[2]);
    // `c` carries a copy of a's decision (another pod's uid).
    let copied = pod("c", "2026-01-01T00:00:02Z", a.decision.clone());
    let garbage = pod("d", "2026-01-01T00:00:03Z", Some("{not json".into()));
    let wrong_uuid = pod(
        "e",
        "2026-01-01T00:00:04Z",
        Some(decision("uid-e", &[6], None).replace(&uuids()[6], "GPU-forged")),
    );
    let r = Rig::start(vec![a, copied, garbage, wrong_uuid], true, true).await;
    let ev = r.t.events();
    let refused: Vec<&str> = ev
        .iter()
        .filter(|e| e.1 == "GpuDecisionRefused")
        .map(|e| e.0.as_str())
        .collect();
    assert!(refused.contains(&"default/c"), "{ev:?}");
    assert!(refused.contains(&"default/d"), "{ev:?}");
    assert!(refused.contains(&"default/e"), "{ev:?}");
    let mut c = r.gpu().await;
    // The kubelet gives the forged pods some free GPU: refused, and the
    // message names the refused decisions.
    let e = allocate(&mut c, &ids(&[6])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("default/c: decision was made for pod uid \"uid-a\""),
        "{}",
        e.message()
    );
    assert!(
        e.message()
            .contains("default/d: annotation gpusched.io/decision is malformed"),
        "{}",
        e.message()
    );
    assert!(e.message().contains("is GPU-"), "{}", e.message());
    // The real owner still gets its GPU.
    assert!(allocate(&mut c, &ids(&[2])).await.is_ok());
}

#[tokio::test]
async fn overlapping_decisions_first_wins() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[3]),
            whole("b", "2026-01-01T00:00:02Z", &[3, 4]),
        ],
        true,
        true,
    )
    .await;
    let ev = r.t.events();
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/b" && e.2.contains("GPU 3 is already held by pod default/a")),
        "{ev:?}"
    );
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[3])).await.is_ok());
    assert!(allocate(&mut c, &ids(&[4])).await.is_err());
}

#[tokio::test]
async fn unhealthy_decided_gpu_is_refused() {
    let r = Rig::start(vec![whole("a", "2026-01-01T00:00:01Z", &[1])], true, true).await;
    r.control("unhealthy 1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = r.gpu().await;
    let e = allocate(&mut c, &ids(&[1])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("unhealthy"), "{}", e.message());
}

#[tokio::test]
async fn allocate_refreshes_on_miss() {
    // No watch: the pod bound after start is only seen by a fresh LIST.
    let r = Rig::start(vec![], false, true).await;
    r.t.pods.add(whole("late", "2026-01-01T00:00:01Z", &[4]));
    let before = r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
    assert_eq!(
        r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
}

/// Issue 29, seen on a real kubelet: it admitted a pod before the agent's
/// watch had the pod; the preference, made without the decision, named a
/// GPU the decision's `Allocate` then refused. A miss takes a fresh LIST.
#[tokio::test]
async fn preferred_allocation_refreshes_on_miss() {
    let r = Rig::start(vec![], false, true).await;
    r.t.pods.add(whole("late", "2026-01-01T00:00:01Z", &[4]));
    let before = r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = r.gpu().await;
    let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(preferred(&mut c, &all, 1).await, ids(&[4]));
    assert_eq!(
        r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
}

/// Issue 29, seen on a real kubelet (bursts of mixed shares): a 500-milli
/// call came before the watch had the 500-milli pod and was charged to the
/// 600-milli decision (it had that much left); the 600 call then went to
/// the 700 decision and the 700 call found nothing. A call no decision
/// expects exactly takes a fresh LIST first.
#[tokio::test]
async fn a_call_no_decision_expects_exactly_lists_the_pods_first() {
    let s6 = pod(
        "s6",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s6", &[7], Some((600, 0)))),
    );
    let r = Rig::start(vec![s6], false, true).await;
    r.t.pods.add(pod(
        "s1",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s1", &[3], Some((500, 0)))),
    ));
    let mut c = r.share().await;
    let resp = allocate(&mut c, &tokens(0, 0, 500)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[3], "the 500 call gets s1's GPU");
    let resp = allocate(&mut c, &tokens(1, 0, 600)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[7], "the 600 call gets s6's GPU");
    // whole GPUs likewise: a 1-GPU call is not charged to a 2-GPU decision
    let r = Rig::start(
        vec![whole("two", "2026-01-01T00:00:01Z", &[4, 5])],
        false,
        true,
    )
    .await;
    r.t.pods.add(whole("one", "2026-01-01T00:00:02Z", &[6]));
    let mut c = r.gpu().await;
    allocate(&mut c, &ids(&[6])).await.unwrap();
    allocate(&mut c, &ids(&[4, 5])).await.unwrap();
}

#[tokio::test]
async fn without_require_decision_unmatched_calls_are_served() {
    let r = Rig::start(vec![], true, false).await;
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
}

#[tokio::test]
async fn share_gets_the_recorded_gpu_and_env() {
    let s = pod(
        "s",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s", &[3], Some((300, 8192)))),
    );
    let r = Rig::start(vec![s], true, true).await;
    let mut c = r.share().await;
    let mut all = Vec::new();
    for g in 0..8 {
        all.extend(tokens(g, 0, 1000));
    }
    let p = preferred(&mut c, &all, 300).await;
    assert_eq!(p, tokens(3, 0, 300));
    // Even tokens of another GPU (the kubelet ignoring us) give GPU 3.
    let resp = allocate(&mut c, &tokens(0, 0, 300)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[3]);
    assert_eq!(resp.envs["GPUSCHED_GPU_MILLI"], "300");
    assert_eq!(resp.envs["GPUSCHED_GPU_MEMORY_LIMIT_MIB"], "8192");
    assert_eq!(resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "8192m");
    assert_eq!(resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    // Served: a second share of 300 has no decision.
    let e = allocate(&mut c, &tokens(3, 300, 300)).await.unwrap_err();
    assert!(
        e.message().contains(
            "no pod placed on node dgx-h100 by gpusched has a pending GPU share of 300 milli"
        ),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn shares_never_exceed_a_gpu() {
    let r = Rig::start(
        vec![
            pod(
                "s1",
                "2026-01-01T00:00:01Z",
                Some(decision("uid-s1", &[1], Some((600, 0)))),
            ),
            pod(
                "s2",
                "2026-01-01T00:00:02Z",
                Some(decision("uid-s2", &[1], Some((600, 0)))),
            ),
            pod(
                "w",
                "2026-01-01T00:00:03Z",
                Some(decision("uid-w", &[1], None)),
            ),
        ],
        true,
        true,
    )
    .await;
    let ev = r.t.events();
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/s2" && e.2.contains("GPU 1 has 600 milli")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/w" && e.2.contains("GPU 1 is already held")),
        "{ev:?}"
    );
    let mut c = r.share().await;
    assert!(allocate(&mut c, &tokens(1, 0, 600)).await.is_ok());
    assert!(allocate(&mut c, &tokens(1, 600, 600)).await.is_err());
    let mut g = r.gpu().await;
    assert!(allocate(&mut g, &ids(&[1])).await.is_err());
}

#[tokio::test]
async fn restart_rebuilds_from_pod_resources() {
    let s1 = pod(
        "s1",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s1", &[3], Some((300, 0)))),
    );
    let mut r = Rig::start(vec![s1.clone()], true, true).await;
    let mut c = r.share().await;
    let got = tokens(3, 0, 300);
    assert_eq!(visible(&allocate(&mut c, &got).await.unwrap()), uuids()[3]);
    r.pr.hold("default", "s1", "gpusched.io/gpu-milli", &got);
    // While the agent is down, a second pod with the same size is bound.
    let s2 = pod(
        "s2",
        "2026-01-01T00:00:02Z",
        Some(decision("uid-s2", &[4], Some((300, 0)))),
    );
    r.t.pods.set(vec![s1, s2]);
    r.restart().await;
    let mut c = r.share().await;
    // s1 is served (PodResources), so 300 more tokens belong to s2 (GPU 4),
    // not again to the older s1 (GPU 3).
    assert_eq!(
        visible(&allocate(&mut c, &tokens(3, 300, 300)).await.unwrap()),
        uuids()[4]
    );
}

#[tokio::test]
async fn restart_between_bind_and_allocate() {
    let mut r = Rig::start(vec![], true, true).await;
    if let Some(a) = r.agent.take() {
        a.shutdown().await.unwrap();
    }
    r.t.pods
        .set(vec![whole("a", "2026-01-01T00:00:01Z", &[6, 7])]);
    r.boot(true).await;
    let mut c = r.gpu().await;
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[6, 7])).await.unwrap()),
        ids(&[6, 7]).join(",")
    );
}

fn published_health(f: &gpusched_node_agent::coord::NodeFacts) -> Vec<bool> {
    let v: Vec<NodeGpu> = serde_json::from_str(&f.annotations["gpusched.io/gpus"]).unwrap();
    v.iter().map(|g| g.healthy).collect()
}

#[tokio::test]
async fn node_facts_and_health_are_published() {
    let r = Rig::start(vec![], true, true).await;
    let first = {
        let t = Instant::now();
        loop {
            if let Some(f) = r.t.node.0.lock().unwrap().first().cloned() {
                break f.1;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "nothing published");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert_eq!(first.labels["nvidia.com/gpu.product"], "H100-SXM5-80GB");
    assert_eq!(first.labels["nvidia.com/gpu.count"], "8");
    assert_eq!(published_health(&first), vec![true; 8]);
    assert_eq!(
        first.capacity["gpusched.io/gpu-memory-mib"],
        (8 * 81920).to_string()
    );
    let t0 = Instant::now();
    r.control("unhealthy 2");
    let latency = loop {
        let last = r.t.node.0.lock().unwrap().last().cloned().unwrap();
        if !published_health(&last.1)[2] {
            break last.0 - t0;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "health not published"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("unhealthy GPU published after {latency:?}");
    let last = r.t.node.0.lock().unwrap().last().cloned().unwrap().1;
    assert_eq!(
        last.capacity["gpusched.io/gpu-memory-mib"],
        (7 * 81920).to_string()
    );
    assert!(latency < Duration::from_secs(1));
}

/// MIG layout and time-slicing replicas reach the Node as GFD labels.
#[tokio::test]
async fn mig_layout_and_replicas_are_published() {
    use gpusched_node_agent::config::{MigStrategy, Replication};
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let t = TestSide::new(true);
    let mut s = settings(dir.path(), "mig-a100.yaml");
    s.node_name = Some("a100".into());
    s.mig_strategy = MigStrategy::Mixed;
    s.replication = vec![Replication {
        name: "nvidia.com/mig-1g.10gb".into(),
        replicas: 4,
        advertised: "nvidia.com/mig-1g.10gb".into(),
    }];
    s.pod_resources_socket = dir.path().join("none.sock");
    let agent = start_agent_with(s, t.side("a100", true));
    k.next_registration(Duration::from_secs(10)).await;
    let t0 = Instant::now();
    let facts = loop {
        if let Some(f) = t.node.0.lock().unwrap().first().cloned() {
            break f.1;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let l = &facts.labels;
    assert_eq!(l["nvidia.com/mig.strategy"], "mixed", "{l:?}");
    assert_eq!(l["nvidia.com/mig-1g.10gb.count"], "7", "{l:?}");
    assert_eq!(l["nvidia.com/mig-1g.10gb.replicas"], "4", "{l:?}");
    assert_eq!(l["nvidia.com/mig-3g.40gb.count"], "2", "{l:?}");
    agent.shutdown().await.unwrap();
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

#[derive(Default, Debug)]
struct Tally {
    refused: Vec<String>,
    twice: usize,
    not_decided: Vec<String>,
    wrong_size: Vec<String>,
    ignored_preference: usize,
}

/// Issue 29 item 1: whole-GPU pods of 2,1,1,2,1,1 GPUs bound at once and
/// admitted by the kubelet in any order. Per pod the stand-in kubelet calls
/// GetPreferredAllocation on the GPUs it has not handed out, takes the
/// answer (or, with `follow` false, GPUs of its own choice), and calls
/// Allocate. No call may be refused, no GPU handed out twice, and when the
/// kubelet follows the preference every pod gets exactly the GPUs of a
/// decision of its size (the kubelet does not say which pod calls, so two
/// pods of one size may get each other's: each set still has one owner).
async fn mixed_whole_rounds(rounds: u64, follow: bool) -> Tally {
    let r = Rig::start(vec![], true, true).await;
    let mut c = r.gpu().await;
    let sizes = [2u32, 1, 1, 2, 1, 1];
    let mut t = Tally::default();
    for round in 0..rounds {
        let mut rng = Rng::new(round + if follow { 0 } else { 1000 });
        let mut gpus: Vec<u32> = (0..8).collect();
        rng.shuffle(&mut gpus);
        let mut pods = Vec::new();
        let mut want: Vec<Vec<u32>> = Vec::new();
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let mut idx = gpus[at..at + n as usize].to_vec();
            at += n as usize;
            idx.sort_unstable();
            pods.push(decided(&format!("w{round}-{i}"), i as u64 + 1, &idx, None));
            want.push(idx);
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut handed: Vec<u32> = Vec::new();
        let mut got: Vec<Vec<u32>> = Vec::new();
        for &p in &order {
            let n = sizes[p] as usize;
            let free: Vec<usize> = (0..8).filter(|g| !handed.contains(&(*g as u32))).collect();
            let avail = ids(&free);
            let pref = preferred(&mut c, &avail, n as i32).await;
            let pick: Vec<String> =
                if follow && pref.len() == n && pref.iter().all(|i| avail.contains(i)) {
                    pref
                } else {
                    if follow {
                        t.ignored_preference += 1;
                    }
                    let mut f = free.clone();
                    rng.shuffle(&mut f);
                    ids(&f[..n])
                };
            match allocate(&mut c, &pick).await {
                Ok(resp) => {
                    let u = uuids();
                    let mut mine: Vec<u32> = visible(&resp)
                        .split(',')
                        .filter_map(|v| u.iter().position(|x| x == v).map(|i| i as u32))
                        .collect();
                    mine.sort_unstable();
                    for g in &mine {
                        if handed.contains(g) {
                            t.twice += 1;
                        }
                    }
                    handed.extend(&mine);
                    if follow && !want.contains(&mine) {
                        t.not_decided
                            .push(format!("round {round}: pod {p} got {mine:?}"));
                    }
                    got.push(mine);
                }
                Err(e) => t.refused.push(format!(
                    "round {round} order {order:?} pod {p}: {}",
                    e.message()
                )),
            }
        }
        if follow && t.refused.is_empty() {
            got.sort();
            want.sort();
            assert_eq!(got, want, "round {round}: decisions used once each");
        }
    }
    t
}

#[tokio::test]
async fn mixed_whole_sizes_in_any_admission_order() {
    let t = mixed_whole_rounds(100, true).await;
    eprintln!(
        "kubelet follows the preference: {} refused, {} twice, {} not a decision",
        t.refused.len(),
        t.twice,
        t.not_decided.len()
    );
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0);
    assert_eq!(t.ignored_preference, 0, "the preference was unusable");
    assert!(t.not_decided.is_empty(), "{:#?}", t.not_decided);
    let t = mixed_whole_rounds(100, false).await;
    eprintln!("kubelet ignores the preference: {t:?}");
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0);
}

/// Issue 29 item 2: shares of 300,500,300,200,700,400,600,300 milli bound
/// at once (placed first-fit, as a scheduler packs them) and admitted in any
/// order. The stand-in kubelet counts 1000 tokens per GPU. Every pod must be
/// served a decision of exactly its milli, no GPU past 1000 milli, and when
/// the kubelet follows the preference, the decisions are used once each.
async fn mixed_share_rounds(rounds: u64, follow: bool) -> Tally {
    let r = Rig::start(vec![], true, true).await;
    let mut c = r.share().await;
    let sizes = [300u32, 500, 300, 200, 700, 400, 600, 300];
    let mut t = Tally::default();
    for round in 0..rounds {
        let mut rng = Rng::new(round + if follow { 500 } else { 1500 });
        let mut gpu_order: Vec<u32> = (0..8).collect();
        rng.shuffle(&mut gpu_order);
        let mut used = [0u32; 8];
        let mut pods = Vec::new();
        let mut want: Vec<(u32, u32)> = Vec::new();
        for (i, &m) in sizes.iter().enumerate() {
            let g = *gpu_order
                .iter()
                .find(|&&g| used[g as usize] + m <= 1000)
                .unwrap();
            used[g as usize] += m;
            pods.push(decided(
                &format!("s{round}-{i}"),
                i as u64 + 1,
                &[g],
                Some((m, u64::from(m) * 80)),
            ));
            want.push((g, m));
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut taken: Vec<u32> = vec![0; 8];
        let mut granted = [0u32; 8];
        let mut got: Vec<(u32, u32)> = Vec::new();
        for &p in &order {
            let n = sizes[p];
            let mut avail = Vec::new();
            for (g, &k) in taken.iter().enumerate() {
                avail.extend(tokens(g, k, 1000 - k));
            }
            let pref = preferred(&mut c, &avail, n as i32).await;
            let free: std::collections::HashSet<&String> = avail.iter().collect();
            let follow_this =
                follow && pref.len() == n as usize && pref.iter().all(|i| free.contains(i));
            let pick: Vec<String> = if follow_this {
                pref
            } else {
                if follow {
                    t.ignored_preference += 1;
                }
                // The kubelet's own choice: tokens from GPUs in a random order.
                let mut gs: Vec<usize> = (0..8).collect();
                rng.shuffle(&mut gs);
                let mut v = Vec::new();
                for g in gs {
                    let k = taken[g];
                    v.extend(tokens(g, k, (1000 - k).min(n - v.len() as u32)));
                    if v.len() as u32 == n {
                        break;
                    }
                }
                v
            };
            // Which tokens the kubelet now counts as taken.
            let u = uuids();
            for id in &pick {
                if let Some(g) = u.iter().position(|x| id.starts_with(x.as_str())) {
                    taken[g] += 1;
                }
            }
            match allocate(&mut c, &pick).await {
                Ok(resp) => {
                    let g = u.iter().position(|x| *x == visible(&resp)).unwrap() as u32;
                    // The milli and memory of the decision charged.
                    let mib: u64 = resp.envs["GPUSCHED_GPU_MEMORY_LIMIT_MIB"].parse().unwrap();
                    let m = u32::try_from(mib / 80).unwrap();
                    if m != n {
                        t.wrong_size.push(format!(
                            "round {round} order {order:?}: pod {p} asked {n} milli, served the decision of {m}"
                        ));
                    }
                    granted[g as usize] += m;
                    if granted[g as usize] > 1000 {
                        t.twice += 1;
                    }
                    if follow && !want.contains(&(g, m)) {
                        t.not_decided
                            .push(format!("round {round}: pod {p} got {m} of GPU {g}"));
                    }
                    got.push((g, m));
                }
                Err(e) => t.refused.push(format!(
                    "round {round} order {order:?} pod {p}: {}",
                    e.message()
                )),
            }
        }
        if follow && t.refused.is_empty() {
            got.sort();
            want.sort();
            assert_eq!(got, want, "round {round}: decisions used once each");
        }
    }
    t
}

#[tokio::test]
async fn mixed_share_sizes_in_any_admission_order() {
    let t = mixed_share_rounds(100, true).await;
    eprintln!(
        "kubelet follows the preference: {} refused, {} served another size, {} not a decision",
        t.refused.len(),
        t.wrong_size.len(),
        t.not_decided.len()
    );
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0, "a GPU past 1000 milli");
    assert_eq!(t.ignored_preference, 0, "the preference was unusable");
    assert!(t.not_decided.is_empty(), "{:#?}", t.not_decided);
    assert!(
        t.wrong_size.is_empty(),
        "{} wrong: {:#?}",
        t.wrong_size.len(),
        t.wrong_size
    );
    let t = mixed_share_rounds(100, false).await;
    eprintln!("kubelet ignores the preference: {t:?}");
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert!(
        t.wrong_size.is_empty(),
        "{} wrong: {:#?}",
        t.wrong_size.len(),
        t.wrong_size
    );
    assert_eq!(t.twice, 0, "a GPU past 1000 milli");
}

/// The pods in the last published `gpusched.io/allocations`, as
/// (name, GPU indices), waiting up to 10 s for `ok` to hold.
async fn published_allocations(
    r: &Rig,
    ok: impl Fn(&[(String, Vec<usize>)]) -> bool,
) -> Vec<(String, Vec<usize>)> {
    let u = uuids();
    let t = Instant::now();
    loop {
        let got: Vec<(String, Vec<usize>)> = r
            .t
            .node
            .0
            .lock()
            .unwrap()
            .last()
            .and_then(|f| f.1.annotations.get("gpusched.io/allocations").cloned())
            .map(|a| {
                let v: serde_json::Value = serde_json::from_str(&a).unwrap();
                v["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let mut g: Vec<usize> = p["gpus"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter_map(|x| u.iter().position(|y| Some(y.as_str()) == x.as_str()))
                            .collect();
                        g.sort_unstable();
                        (p["name"].as_str().unwrap().to_string(), g)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if ok(&got) || t.elapsed() > Duration::from_secs(10) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 29 item 3: an agent restart lost swapped pods. Pods of one size
/// admitted onto each other's decided GPUs (and a pending pod whose
/// decided GPU a swapped pod holds) are rebuilt from PodResources exactly:
/// the published allocations list every admitted pod with the GPUs it
/// really holds, and the pending pod is served the GPU left free.
#[tokio::test]
async fn restart_rebuilds_swapped_pods_from_pod_resources() {
    let pods = vec![
        whole("a", "2026-01-01T00:00:01Z", &[0]),
        whole("b", "2026-01-01T00:00:01Z", &[1]),
        whole("c", "2026-01-01T00:00:01Z", &[2, 3]),
        whole("d", "2026-01-01T00:00:01Z", &[4, 5]),
        whole("e", "2026-01-01T00:00:01Z", &[6]),
        whole("f", "2026-01-01T00:00:01Z", &[7]),
    ];
    let mut r = Rig::start(pods, true, true).await;
    // What the kubelet had handed out before the restart: a got f's GPU,
    // c and d each other's; f is not admitted yet.
    for (name, idx) in [
        ("a", &[7][..]),
        ("b", &[1]),
        ("c", &[4, 5]),
        ("d", &[2, 3]),
        ("e", &[6]),
    ] {
        r.pr.hold("default", name, "nvidia.com/gpu", &ids(idx));
    }
    r.restart().await;
    let want = vec![
        ("a".to_string(), vec![7]),
        ("b".to_string(), vec![1]),
        ("c".to_string(), vec![4, 5]),
        ("d".to_string(), vec![2, 3]),
        ("e".to_string(), vec![6]),
    ];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
    let mut c = r.gpu().await;
    // f is steered to the GPU nobody holds, and served.
    let free = ids(&[0]);
    assert_eq!(preferred(&mut c, &free, 1).await, free);
    assert!(allocate(&mut c, &free).await.is_ok());
    let mut want = want;
    want.push(("f".to_string(), vec![0]));
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
}

/// Issue 29 item 1 (the scheduler must learn where pods really are): two
/// 1-GPU pods admitted in the order other than the agent guessed are
/// charged to each other's decision. PodResources, read after each
/// Allocate, tells who holds what: the published allocations name each
/// pod's real GPU, and when one pod ends the GPU it really held is free for
/// the next decision (no conflict with the other pod's charge).
#[tokio::test]
async fn swapped_pods_are_published_as_they_are_and_free_their_real_gpus() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("b", "2026-01-01T00:00:01Z", &[1]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // b's binding arrived first: the agent guesses a (older seq / name).
    let p = preferred(&mut c, &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "b", "nvidia.com/gpu", &p);
    let p = preferred(&mut c, &ids(&[1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[1]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "a", "nvidia.com/gpu", &p);
    let t0 = Instant::now();
    let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0])];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
    let took = t0.elapsed();
    eprintln!("real holders published {took:?} after the second Allocate");
    // Read ~200 ms after the call and published at once, not at the next
    // 5 s refresh: the scheduler's next decision should see it.
    assert!(took < Duration::from_secs(2), "{took:?}");
    // b ends; the scheduler, reading the allocations, decides GPU 0 (the
    // one b really held) for pod n.
    r.pr.held.lock().unwrap().retain(|p| p.name != "b");
    sync_pods(
        &r,
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("n", "2026-01-01T00:00:09Z", &[0]),
        ],
    )
    .await;
    // a's decision says GPU 0 but a holds GPU 1: n's decision is not a
    // conflict, and n is served GPU 0.
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[0, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "n", "nvidia.com/gpu", &p);
    let want = vec![("a".to_string(), vec![1]), ("n".to_string(), vec![0])];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
}

/// Issue 29 item 4: a refused Allocate posted no GpuAllocationRefused on the
/// pod that could have called it when its decision was partly served by a
/// call of another size: every pending pod that could be the caller gets
/// the event.
#[tokio::test]
async fn refused_allocate_is_reported_on_a_partly_served_pod() {
    let r = Rig::start(
        vec![whole("d", "2026-01-01T00:00:01Z", &[6, 7])],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // A call of 1 GPU on GPU 6 (no decision expects 1: charged to d).
    allocate(&mut c, &ids(&[6])).await.unwrap();
    // Then 2 GPUs nobody decided: refused, reported on d.
    let e = allocate(&mut c, &ids(&[2, 3])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let ev = r.t.events();
    assert!(
        ev.iter().any(|x| x.0 == "default/d"
            && x.1 == "GpuAllocationRefused"
            && x.2.contains("holds GPUs [2")),
        "{ev:?}"
    );
}

/// Until the scheduler counts pods by `gpusched.io/allocations`, it frees a
/// swapped pod's decided GPUs when it ends, and decides them again while
/// the other pod of the swap really holds them. Such a decision is not
/// refused: it is served the GPU really free, which the scheduler still
/// counts as held by the other pod.
#[tokio::test]
async fn decision_onto_a_gpu_a_swapped_pod_holds_gets_the_free_one() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("b", "2026-01-01T00:00:01Z", &[1]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // b first, charged to a's decision: b holds 0, then a holds 1.
    allocate(&mut c, &ids(&[0])).await.unwrap();
    r.pr.hold("default", "b", "nvidia.com/gpu", &ids(&[0]));
    allocate(&mut c, &ids(&[1])).await.unwrap();
    r.pr.hold("default", "a", "nvidia.com/gpu", &ids(&[1]));
    let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0])];
    assert_eq!(
        published_allocations(&r, |g| g == want.as_slice()).await,
        want
    );
    // b ends; a scheduler counting by decisions frees GPU 1 and decides it
    // for n, though a holds it.
    r.pr.held.lock().unwrap().retain(|p| p.name != "b");
    sync_pods(
        &r,
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("n", "2026-01-01T00:00:09Z", &[1]),
        ],
    )
    .await;
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[0, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "n", "nvidia.com/gpu", &p);
    let want = vec![("a".to_string(), vec![1]), ("n".to_string(), vec![0])];
    assert_eq!(
        published_allocations(&r, |g| g == want.as_slice()).await,
        want
    );
    // a ends: the scheduler frees GPU 0 (a's decision) and decides it for
    // m; n really holds 0, so m is served GPU 1.
    r.pr.held.lock().unwrap().retain(|p| p.name != "a");
    sync_pods(
        &r,
        vec![
            whole("n", "2026-01-01T00:00:09Z", &[1]),
            whole("m", "2026-01-01T00:00:10Z", &[0]),
        ],
    )
    .await;
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[1]));
    allocate(&mut c, &p).await.unwrap();
}

/// A pod asking `k` replicas of `resource` (time-sliced `n` ways), decided
/// onto GPU `gpu` as the scheduler does: a share of `k·⌊1000/n⌋` milli.
fn replica_pod(name: &str, seq: u64, gpu: u32, k: u32, n: u32, resource: &str) -> PodInfo {
    let u = uuids();
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("uid-{name}"),
        node: NODE.into(),
        seq,
        indices: vec![gpu],
        gpus: vec![u[gpu as usize].clone()],
        share: Some(ShareDecision {
            milli: k * gpusched_model::sharing::replica_milli(n),
            memory_mib: 0,
            resource: Some(resource.into()),
            replicas: Some(k),
        }),
        mig: None,
    };
    pod(name, "2026-01-01T00:00:01Z", Some(d.to_annotation()))
}

/// Issue 29 item 5: time-sliced replicas of 1 and 2 bound at once onto two
/// GPUs shared 4 ways (filling both), admitted in any order, the kubelet
/// following the preference or picking replica ids of its own (of GPUs no
/// decision names). Every call must be served a decision of exactly its
/// size, each decision once, so that each GPU gets exactly the replicas
/// decided onto it; a ninth replica is refused.
async fn replica_rounds(resource: &str, sock: &str, follow: bool) {
    use gpusched_node_agent::config::Replication;
    let r = Rig::start_with(
        vec![],
        true,
        true,
        vec![Replication {
            name: "nvidia.com/gpu".into(),
            replicas: 4,
            advertised: resource.into(),
        }],
    )
    .await;
    let mut c = r.kubelet.client(sock).await;
    let u = uuids();
    let rid = |g: usize, k: usize| format!("{}::{k}", u[g]);
    // GPU 1: 2+1+1, GPU 6: 1+2+1
    let layout = [(1u32, 2u32), (1, 1), (1, 1), (6, 1), (6, 2), (6, 1)];
    for round in 0..20u64 {
        let mut rng = Rng::new(round + if follow { 2000 } else { 3000 });
        let pods: Vec<PodInfo> = layout
            .iter()
            .enumerate()
            .map(|(i, &(g, k))| {
                replica_pod(&format!("r{round}-{i}"), i as u64 + 1, g, k, 4, resource)
            })
            .collect();
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..layout.len()).collect();
        rng.shuffle(&mut order);
        // the kubelet's view: replica ids in use
        let mut used: std::collections::BTreeSet<String> = Default::default();
        let mut got: Vec<(u32, u32)> = Vec::new();
        for &p in &order {
            let k = layout[p].1 as usize;
            let avail: Vec<String> = (0..8)
                .flat_map(|g| (0..4).map(move |j| (g, j)))
                .map(|(g, j)| rid(g, j))
                .filter(|id| !used.contains(id))
                .collect();
            let pick: Vec<String> = if follow {
                let pref = preferred(&mut c, &avail, k as i32).await;
                assert_eq!(pref.len(), k, "round {round}: preference {pref:?}");
                pref
            } else {
                // its own choice: the lowest free ids (GPU 0 first, which no
                // decision names)
                avail[..k].to_vec()
            };
            let resp = allocate(&mut c, &pick).await.unwrap_or_else(|e| {
                panic!(
                    "round {round}: pod {p} ({k} replicas) refused: {}",
                    e.message()
                )
            });
            let g = u
                .iter()
                .position(|x| *x == visible(&resp))
                .unwrap_or_else(|| {
                    panic!("round {round}: answer names no single GPU: {:?}", resp.envs)
                });
            assert_eq!(resp.envs.get("GPUSCHED_GPU_UUID"), Some(&u[g]));
            if follow {
                assert!(
                    pick.iter().all(|id| id.starts_with(&u[g])),
                    "{pick:?} not of GPU {g}"
                );
            }
            got.push((g as u32, k as u32));
            used.extend(pick);
        }
        got.sort();
        let mut want = layout.to_vec();
        want.sort();
        assert_eq!(
            got, want,
            "round {round}: each decision served once, on its GPU"
        );
        // both GPUs are full as decided: a ninth replica has no decision
        let avail: Vec<String> = (0..8)
            .flat_map(|g| (0..4).map(move |j| (g, j)))
            .map(|(g, j)| rid(g, j))
            .filter(|id| !used.contains(id))
            .collect();
        let e = allocate(&mut c, &avail[..1]).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "round {round}");
        assert!(
            e.message()
                .contains(&format!("share of {resource} replicas of 250 milli")),
            "{}",
            e.message()
        );
    }
}

#[tokio::test]
async fn time_sliced_replicas_under_their_own_name_follow_the_decisions() {
    replica_rounds("nvidia.com/gpu", GPU_SOCK, true).await;
    replica_rounds("nvidia.com/gpu", GPU_SOCK, false).await;
}

#[tokio::test]
async fn renamed_time_sliced_replicas_follow_the_decisions() {
    let sock = "gpusched-nvidia.com-gpu.shared.sock";
    replica_rounds("nvidia.com/gpu.shared", sock, true).await;
    replica_rounds("nvidia.com/gpu.shared", sock, false).await;
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

/// A pod decided onto MIG instances `ids` of GPU `gpu` (index, uuid).
fn mig_pod(
    name: &str,
    seq: u64,
    gpu: (u32, &str),
    resource: &str,
    ids: &[String],
    milli: u32,
) -> PodInfo {
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("uid-{name}"),
        node: NODE.into(),
        seq,
        indices: vec![gpu.0],
        gpus: vec![gpu.1.to_string()],
        share: None,
        mig: Some(Box::new(gpusched_model::protocol::MigDecision {
            resource: resource.into(),
            profile: String::new(),
            instances: ids.to_vec(),
            milli: milli * ids.len() as u32,
        })),
    };
    pod(name, "2026-01-01T00:00:01Z", Some(d.to_annotation()))
}

/// MIG instances (#29): the agent publishes its layout; pods of mixed
/// sizes decided onto instances of one profile, admitted in any order,
/// the kubelet following the preference or picking ids of its own, are
/// each answered with exactly their decided instances (each once); a call
/// past the decisions is refused; PodResources rebuilds them on restart.
async fn mig_rounds(
    fixture: &'static str,
    strategy: gpusched_node_agent::config::MigStrategy,
    regs: usize,
    resource: &str,
    sizes: &[usize],
    follow: bool,
) {
    use gpusched_model::sharing::NodeSharing;
    let mut r = Rig::start_mig(fixture, strategy, regs).await;
    let facts = published(&r).await;
    let sh = NodeSharing::parse(&facts.annotations["gpusched.io/sharing"]).unwrap();
    let gpus: Vec<NodeGpu> = serde_json::from_str(&facts.annotations["gpusched.io/gpus"]).unwrap();
    // the instances of `resource`, per GPU, as the scheduler reads them
    let mut layout: Vec<(u32, String, Vec<String>, u32)> = Vec::new();
    for g in &sh.mig {
        let of: Vec<&gpusched_model::sharing::MigInstance> = g
            .instances
            .iter()
            .filter(|m| m.resource == resource)
            .collect();
        if let Some(m) = of.first() {
            assert_eq!(m.of, 7, "A100: 7 compute slices");
            let uuid = gpus
                .iter()
                .find(|x| x.index == g.index)
                .unwrap()
                .uuid
                .clone();
            layout.push((
                g.index,
                uuid,
                of.iter().map(|m| m.id.clone()).collect(),
                m.milli(),
            ));
        }
    }
    let all: Vec<String> = layout.iter().flat_map(|l| l.2.clone()).collect();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        all.len(),
        "the sizes fill the node"
    );
    let sock = format!("gpusched-{}.sock", resource.replace('/', "-"));
    let mut c = r.kubelet.client(&sock).await;
    let mut last: Vec<(String, Vec<String>)> = Vec::new();
    for round in 0..10u64 {
        let mut rng = Rng::new(round + if follow { 4000 } else { 5000 });
        // the scheduler's decisions: each pod k instances of one GPU
        let mut pods = Vec::new();
        let mut want: Vec<Vec<String>> = Vec::new();
        let mut free: Vec<Vec<String>> = layout.iter().map(|l| l.2.clone()).collect();
        for (i, &k) in sizes.iter().enumerate() {
            let g = (0..layout.len())
                .find(|&g| free[g].len() >= k)
                .expect("sizes fit");
            let ids: Vec<String> = free[g].drain(..k).collect();
            pods.push(mig_pod(
                &format!("m{round}-{i}"),
                i as u64 + 1,
                (layout[g].0, &layout[g].1),
                resource,
                &ids,
                layout[g].3,
            ));
            want.push(ids);
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut used: std::collections::BTreeSet<String> = Default::default();
        let mut got: Vec<Vec<String>> = Vec::new();
        last.clear();
        for &p in &order {
            let k = sizes[p];
            let avail: Vec<String> = all
                .iter()
                .filter(|id| !used.contains(*id))
                .cloned()
                .collect();
            let pick: Vec<String> = if follow {
                let pref = preferred(&mut c, &avail, k as i32).await;
                assert_eq!(pref.len(), k, "round {round}: preference {pref:?}");
                pref
            } else {
                avail[..k].to_vec()
            };
            let resp = allocate(&mut c, &pick).await.unwrap_or_else(|e| {
                panic!(
                    "round {round}: pod {p} ({k} instances) refused: {}",
                    e.message()
                )
            });
            let mut told: Vec<String> = visible(&resp).split(',').map(String::from).collect();
            told.sort();
            if follow {
                let mut p2 = pick.clone();
                p2.sort();
                assert_eq!(
                    told, p2,
                    "round {round}: the kubelet's ids are the decided ones"
                );
            }
            last.push((format!("m{round}-{p}"), pick.clone()));
            used.extend(pick);
            got.push(told);
        }
        got.sort();
        for w in &mut want {
            w.sort();
        }
        want.sort();
        assert_eq!(
            got, want,
            "round {round}: each decision served once, as decided"
        );
        // the node is full as decided: one more instance has no decision
        let e = allocate(&mut c, &all[..1]).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "round {round}");
        if round < 9 {
            sync_pods(&r, Vec::new()).await;
        }
    }
    if !follow {
        return;
    }
    // restart: PodResources lists what each pod holds; the agent rebuilds
    // it and publishes each pod with its instances
    for (name, ids) in &last {
        r.pr.hold("default", name, resource, ids);
    }
    r.restart().await;
    let want: std::collections::BTreeMap<String, Vec<String>> = last
        .iter()
        .map(|(n, ids)| {
            let mut ids = ids.clone();
            ids.sort();
            (n.clone(), ids)
        })
        .collect();
    let t0 = Instant::now();
    loop {
        let got: std::collections::BTreeMap<String, Vec<String>> = r
            .t
            .node
            .0
            .lock()
            .unwrap()
            .last()
            .and_then(|f| f.1.annotations.get("gpusched.io/allocations").cloned())
            .map(|a| {
                let v: serde_json::Value = serde_json::from_str(&a).unwrap();
                v["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let mut ids: Vec<String> = p["mig"]
                            .as_array()
                            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                            .unwrap_or_default();
                        ids.sort();
                        (p["name"].as_str().unwrap().to_string(), ids)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if got == want {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "published {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // nothing is left to serve after the rebuild
    let mut c = r.kubelet.client(&sock).await;
    let e = allocate(&mut c, &all[..1]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn mixed_mig_instances_follow_the_decisions() {
    use gpusched_node_agent::config::MigStrategy;
    // mig-a100: GPU 0 7×1g.10gb, GPU 1 2×3g.40gb, GPUs 2–7 whole; gpu,
    // gpu-milli and two MIG resources register
    for follow in [true, false] {
        mig_rounds(
            "mig-a100.yaml",
            MigStrategy::Mixed,
            4,
            "nvidia.com/mig-1g.10gb",
            &[2, 1, 3, 1],
            follow,
        )
        .await;
        mig_rounds(
            "mig-a100.yaml",
            MigStrategy::Mixed,
            4,
            "nvidia.com/mig-3g.40gb",
            &[1, 1],
            follow,
        )
        .await;
    }
}

#[tokio::test]
async fn single_mig_instances_follow_the_decisions() {
    use gpusched_node_agent::config::MigStrategy;
    // mig-single: 2 GPUs × 7×1g.10gb served as nvidia.com/gpu
    for follow in [true, false] {
        mig_rounds(
            "mig-single.yaml",
            MigStrategy::Single,
            1,
            "nvidia.com/gpu",
            &[3, 1, 2, 1, 2, 2, 1, 2],
            follow,
        )
        .await;
    }
}

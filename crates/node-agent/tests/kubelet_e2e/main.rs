//! End-to-end on a **real kubelet** (v1.37.2, `e2e/cluster/kubelet`): the
//! gpusched scheduler (in-process, under the chart's ServiceAccount) on a
//! real kube-apiserver + etcd, the kubelet registered as node `kgpu` with
//! its own node credentials, `gpusched-node-agent` (the same program as
//! `gpusched agent`, fake backend, 16 H100s) as a separate process under
//! the chart's agent ServiceAccount, serving the kubelet's device-plugin
//! directory, and our fake CRI runtime (`e2e/cluster/fakecri`) recording
//! every container's config. Each container's `NVIDIA_VISIBLE_DEVICES`, as
//! the runtime was told, is checked against the scheduler's decision or,
//! for a swap `docs/protocol.md` allows, against exclusivity and the
//! agent's published `gpusched.io/allocations`.
//!
//! Needs root (the kubelet runs in a private mount namespace) and the
//! binaries of `e2e/cluster/build`; run by `e2e/run`.
//! `GPUSCHED_KUBELET_ROUNDS` sets the number of seeded burst rounds
//! (default 5), `GPUSCHED_KUBELET_SEED` their base seed; `GPUSCHED_E2E_KEEP=1`
//! keeps the node's directory (kubelet, fakecri and agent logs, records).

#[path = "../../../k8s/tests/common/mod.rs"]
mod k8s;
#[path = "../real_kubelet/mod.rs"]
mod real_kubelet;

// the tests, by topic (this file: the real node and the helpers they
// share; audit.rs: what every test checks)
mod audit;
mod placement;
mod restarts;
mod shares;

use audit::*;
use gpusched_model::mix::mix_indexed;
use gpusched_model::protocol::{ANNOTATION_NODE_ALLOCATIONS, NodeAllocations};
use k8s::{Cluster, create, decision, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use real_kubelet::{kubelet_down, kubelet_up, script};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const NODE: &str = "kgpu";
const GPUS: usize = 16;
const NS: &str = "ml";

/// `gpus` H100s in NVLink domains of 8 (the fake backend's node file; 16
/// for most tests).
fn node_yaml(gpus: usize) -> String {
    let mut s = format!(
        "nodes:\n  - name: {NODE}\n    cpu: \"128\"\n    memory: 1Ti\n    gpus:\n      count: {gpus}\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      pcie_switches: {}\n      numa_nodes: {}\n      devices:\n",
        gpus.div_ceil(4).min(4),
        gpus.div_ceil(8).min(2)
    );
    for i in 0..gpus {
        s.push_str(&format!("        - {{index: {i}, nvlink: {}}}\n", i / 8));
    }
    s
}

/// One container as the runtime was asked to create it.
#[derive(Debug, Clone)]
struct Record {
    pod_uid: String,
    container: String,
    attempt: u64,
    env: BTreeMap<String, String>,
    /// File name order = creation order is not guaranteed; kept for messages.
    id: String,
}

/// The real node: kubelet + fake CRI (script-managed) and the agent process.
struct RealNode {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    node_file: PathBuf,
    control: PathBuf,
    agent_kubeconfig: PathBuf,
    agent: Option<Child>,
    agent_starts: u32,
    /// Extra agent flags (`--config FILE`).
    agent_args: Vec<String>,
}

impl RealNode {
    async fn up(c: &Cluster) -> RealNode {
        RealNode::up_with(c, GPUS, None).await
    }

    /// A node of `gpus` GPUs whose agent reads `config` (YAML) if given.
    async fn up_with(c: &Cluster, gpus: usize, config: Option<&str>) -> RealNode {
        RealNode::up_file(c, &node_yaml(gpus), config).await
    }

    /// A node from a fake-backend node file (`nodes[0].name` is replaced
    /// by this node's name) whose agent reads `config` if given.
    async fn up_file(c: &Cluster, yaml: &str, config: Option<&str>) -> RealNode {
        let (dir, env) = kubelet_up(c, "gpusched-kubelet-", NODE);
        let node_file = dir.path().join("node.yaml");
        let mut spec: Value = serde_saphyr::from_str(yaml).unwrap();
        spec["nodes"][0]["name"] = json!(NODE);
        std::fs::write(&node_file, serde_json::to_string(&spec).unwrap()).unwrap();
        let mut agent_args = Vec::new();
        if let Some(text) = config {
            let f = dir.path().join("agent-config.yaml");
            std::fs::write(&f, text).unwrap();
            agent_args = vec!["--config".to_string(), f.to_str().unwrap().to_string()];
        }
        let control = dir.path().join("control");
        std::fs::write(&control, "").unwrap();
        c.install_chart_docs(&[
            ("ServiceAccount", "gpusched-agent"),
            ("ClusterRole", "gpusched-agent"),
            ("ClusterRoleBinding", "gpusched-agent"),
        ])
        .await;
        // The DaemonSet's pod on this node, as the chart makes it (its
        // labels, ServiceAccount and priority): the real kubelet runs it on
        // the fake runtime while the agent itself runs as a process here
        // with a token bound to that pod, as the DaemonSet's would be.
        let ds = k8s::chart_docs()
            .into_iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "gpusched-agent")
            .expect("deploy/gpusched.yaml has the agent DaemonSet");
        let t = &ds["spec"]["template"];
        let agent_pod = create(
            &Api::namespaced(c.client.clone(), k8s::CHART_NAMESPACE),
            json!({"metadata": {"name": format!("gpusched-agent-{NODE}"),
                    "labels": t["metadata"]["labels"]},
                "spec": {"nodeName": NODE,
                    "serviceAccountName": t["spec"]["serviceAccountName"],
                    "priorityClassName": t["spec"]["priorityClassName"],
                    "containers": [{"name": "agent",
                        "image": t["spec"]["containers"][0]["image"]}]}}),
        )
        .await;
        let agent_kubeconfig = dir.path().join("agent.kubeconfig");
        k8s::write_token_kubeconfig(c, "gpusched-agent", &agent_pod, &agent_kubeconfig).await;
        let mut n = RealNode {
            dir,
            env,
            node_file,
            control,
            agent_kubeconfig,
            agent: None,
            agent_starts: 0,
            agent_args,
        };
        n.start_agent();
        n
    }

    fn kdir(&self) -> &str {
        &self.env["GPUSCHED_KUBELET_DIR"]
    }

    fn start_agent(&mut self) {
        assert!(self.agent.is_none());
        self.agent_starts += 1;
        let log = std::fs::File::create(
            self.dir
                .path()
                .join(format!("agent-{}.log", self.agent_starts)),
        )
        .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpusched-node-agent"))
            .args(["--backend", "fake", "--node-name", NODE, "--shares"])
            .arg("--node-file")
            .arg(&self.node_file)
            .arg("--control-file")
            .arg(&self.control)
            .arg("--plugin-dir")
            .arg(&self.env["GPUSCHED_KUBELET_PLUGIN_DIR"])
            .arg("--pod-resources-socket")
            .arg(&self.env["GPUSCHED_KUBELET_POD_RESOURCES"])
            .args(["--metrics-address", "", "--feature-file", ""])
            .args(&self.agent_args)
            .env("KUBECONFIG", &self.agent_kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting gpusched-node-agent");
        self.agent = Some(child);
    }

    /// Stops the agent: SIGTERM (clean) or SIGKILL (a crash).
    fn stop_agent(&mut self, crash: bool) {
        if let Some(mut ch) = self.agent.take() {
            let sig = if crash { "-KILL" } else { "-TERM" };
            let _ = Command::new("kill")
                .args([sig, &ch.id().to_string()])
                .status();
            let _ = ch.wait();
        }
    }

    fn agent_log(&self) -> String {
        std::fs::read_to_string(
            self.dir
                .path()
                .join(format!("agent-{}.log", self.agent_starts)),
        )
        .unwrap_or_default()
    }

    /// The agent's log and the end of the kubelet's, for a failure message.
    fn logs(&self) -> String {
        let k =
            std::fs::read_to_string(Path::new(self.kdir()).join("kubelet.log")).unwrap_or_default();
        let tail: Vec<&str> = k.lines().rev().take(60).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        format!(
            "---- agent log ----\n{}\n---- kubelet log (last 60 lines) ----\n{}",
            self.agent_log(),
            tail.join("\n")
        )
    }

    fn kubelet_stop(&self) {
        script(&["stop", self.kdir()]);
    }

    fn kubelet_start(&self) {
        script(&["start", self.kdir()]);
    }

    fn control(&self, line: &str) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.control)
            .unwrap();
        writeln!(f, "{line}").unwrap();
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

    /// Every container the runtime created, latest attempt per (pod, container).
    fn records(&self) -> BTreeMap<(String, String), Record> {
        let mut out: BTreeMap<(String, String), Record> = BTreeMap::new();
        let dir = Path::new(&self.env["GPUSCHED_KUBELET_RECORDS"]);
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            let r = Record {
                pod_uid: v["pod"]["uid"].as_str().unwrap().to_string(),
                container: v["config"]["metadata"]["name"]
                    .as_str()
                    .unwrap()
                    .to_string(),
                attempt: v["config"]["metadata"]["attempt"].as_u64().unwrap_or(0),
                env: serde_json::from_value(v["env"].clone()).unwrap_or_default(),
                id: v["id"].as_str().unwrap().to_string(),
            };
            let key = (r.pod_uid.clone(), r.container.clone());
            if out.get(&key).is_none_or(|o| o.attempt <= r.attempt) {
                out.insert(key, r);
            }
        }
        out
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop_agent(false);
        let kdir = self.kdir().to_string();
        kubelet_down(&mut self.dir, &kdir);
    }
}

/// A pod of ours: `containers` are (name, limits) pairs; `init` the same
/// for init containers (they exit at once). `FAKECRI_EXIT_AFTER_MS` in
/// `run_ms` makes the app containers exit too (with `restartPolicy: Never`).
fn pod_spec(
    name: &str,
    init: &[(&str, Value)],
    containers: &[(&str, Value)],
    run_ms: Option<u64>,
) -> Value {
    let c = |(n, limits): &(&str, Value), exit_ms: Option<u64>| {
        let mut v = json!({"name": n, "image": "cuda",
            "resources": {"limits": limits, "requests": {"cpu": "10m"}}});
        if let Some(ms) = exit_ms {
            v["env"] = json!([{"name": "FAKECRI_EXIT_AFTER_MS", "value": ms.to_string()}]);
        }
        v
    };
    let mut p = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
            "containers": containers.iter().map(|x| c(x, run_ms)).collect::<Vec<_>>()}
    });
    if !init.is_empty() {
        p["spec"]["initContainers"] = init.iter().map(|x| c(x, Some(100))).collect();
    }
    if run_ms.is_some() {
        p["spec"]["restartPolicy"] = json!("Never");
    }
    p
}

fn whole(n: u32) -> Value {
    json!({"nvidia.com/gpu": n.to_string()})
}

fn milli(m: u32) -> Value {
    json!({"gpusched.io/gpu-milli": m.to_string()})
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

/// A pod the kubelet refused at admission (phase Failed, e.g.
/// `UnexpectedAdmissionError`), with its reason and message.
fn failed_admission(p: &Pod) -> Option<String> {
    let s = p.status.as_ref()?;
    let containers_ran = s
        .container_statuses
        .as_ref()
        .is_some_and(|c| c.iter().any(|c| c.container_id.is_some()));
    (s.phase.as_deref() == Some("Failed") && !containers_ran).then(|| {
        format!(
            "{}: {} {}",
            p.metadata.name.as_deref().unwrap_or("?"),
            s.reason.as_deref().unwrap_or(""),
            s.message.as_deref().unwrap_or("")
        )
    })
}

/// Waits until every named pod is Running (or, with `done`, Succeeded);
/// returns them, or the failed admissions seen / a timeout description.
async fn wait_phase(api: &Api<Pod>, names: &[String], want: &str) -> Result<Vec<Pod>, String> {
    let t0 = Instant::now();
    loop {
        let all: BTreeMap<String, Pod> = api
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| (p.metadata.name.clone().unwrap(), p))
            .collect();
        let failed: Vec<String> = names
            .iter()
            .filter_map(|n| all.get(n).and_then(failed_admission))
            .collect();
        if !failed.is_empty() {
            return Err(format!("failed admission: {failed:?}"));
        }
        if names
            .iter()
            .all(|n| all.get(n).is_some_and(|p| phase(p) == want))
        {
            return Ok(names.iter().map(|n| all[n].clone()).collect());
        }
        if t0.elapsed() > Duration::from_secs(90) {
            let state: Vec<String> = names
                .iter()
                .map(|n| match all.get(n) {
                    Some(p) => format!(
                        "{n}: {} node={:?} {:?}",
                        phase(p),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        p.status.as_ref().and_then(|s| s.conditions.clone())
                    ),
                    None => format!("{n}: gone"),
                })
                .collect();
            return Err(format!("not all {want} after 90 s: {state:#?}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn node_obj(c: &Cluster) -> Option<Node> {
    Api::<Node>::all(c.client.clone()).get(NODE).await.ok()
}

/// A capacity or allocatable quantity of the Node as an integer (`16k` is 16000).
fn quantity(n: &Node, which: &str, res: &str) -> Option<u64> {
    let s = n.status.as_ref()?;
    let m = if which == "capacity" {
        s.capacity.as_ref()?
    } else {
        s.allocatable.as_ref()?
    };
    gpusched_model::quantity::parse_integer(&m.get(res)?.0).ok()
}

async fn allocations(c: &Cluster) -> Option<NodeAllocations> {
    let n = node_obj(c).await?;
    let text = n
        .metadata
        .annotations?
        .get(ANNOTATION_NODE_ALLOCATIONS)?
        .clone();
    Some(NodeAllocations::parse(&text).expect("a well-formed allocations annotation"))
}

/// Waits until the kubelet advertises `gpus` allocatable whole GPUs (the
/// agent registered and its device list reached the Node).
async fn wait_allocatable(c: &Cluster, n: &RealNode, gpus: usize) -> Duration {
    let t0 = Instant::now();
    wait_for(Duration::from_secs(60), || async {
        let n = node_obj(c).await?;
        let ready = n
            .status
            .as_ref()?
            .conditions
            .as_ref()?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        (ready
            && quantity(&n, "allocatable", "nvidia.com/gpu") == Some(gpus as u64)
            && quantity(&n, "allocatable", "gpusched.io/gpu-milli") == Some(gpus as u64 * 1000))
        .then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "node {NODE} never had {gpus} allocatable GPUs\n{}",
            n.logs()
        )
    });
    t0.elapsed()
}

async fn setup() -> (Cluster, RealNode, k8s::RunningScheduler) {
    let c = Cluster::up().await;
    let n = RealNode::up(&c).await;
    let took = wait_allocatable(&c, &n, GPUS).await;
    eprintln!("kubelet advertises {GPUS} GPUs {took:?} after the agent started");
    let s = c.scheduler(k8s::opts()).await;
    (c, n, s)
}

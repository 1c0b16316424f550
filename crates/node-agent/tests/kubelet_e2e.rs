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

#[path = "../../k8s/tests/common/mod.rs"]
mod k8s;

use gpusched_model::mix::mix_indexed;
use gpusched_model::protocol::{ANNOTATION_NODE_ALLOCATIONS, NodeAllocations};
use k8s::{Cluster, create, decision, wait_for};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
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

fn kubelet_script() -> PathBuf {
    k8s::repo_root().join("e2e/cluster/kubelet")
}

fn script(args: &[&str]) -> BTreeMap<String, String> {
    let out = Command::new(kubelet_script())
        .args(args)
        .output()
        .expect("running e2e/cluster/kubelet (build first: e2e/cluster/build)");
    assert!(
        out.status.success(),
        "e2e/cluster/kubelet {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
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
        // (short path: unix socket paths are limited to 108 bytes)
        let dir = tempfile::Builder::new()
            .prefix("gpusched-kubelet-")
            .tempdir_in("/tmp")
            .unwrap();
        let kdir = dir.path().join("k");
        let env = script(&[
            "up",
            kdir.to_str().unwrap(),
            "--cluster",
            c.dir.path().to_str().unwrap(),
            "--node",
            NODE,
        ]);
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
        // GPUSCHED_E2E_KEEP=1 keeps the kubelet's and the agent's logs
        // and state for a look after a failure.
        if std::env::var_os("GPUSCHED_E2E_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
        let _ = Command::new(kubelet_script())
            .args(["down", self.kdir()])
            .output();
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

/// What the containers of the live pods on the node hold, checked.
#[derive(Debug, Default)]
struct Audit {
    /// Pods whose containers hold other GPUs than decided (same size).
    swaps: Vec<String>,
    /// Violations: a GPU held twice, a share over a GPU, a wrong size, a
    /// swap not published, a container without its env.
    errors: Vec<String>,
    /// Whole GPUs / share GPUs in use, by UUID.
    whole: BTreeMap<String, String>,
    shares: BTreeMap<String, u32>,
    /// GPUs each pod's containers hold (whole) or its share GPU, by pod name.
    held: BTreeMap<String, Vec<String>>,
}

impl Audit {
    fn double(&self) -> usize {
        self.errors
            .iter()
            .filter(|e| e.starts_with("held twice"))
            .count()
    }
}

fn visible(r: &Record) -> Vec<String> {
    r.env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default()
}

/// Checks every live pod of `pods` (Running, with a decision) against the
/// runtime's records and the agent's published allocations.
fn audit(
    pods: &[Pod],
    records: &BTreeMap<(String, String), Record>,
    alloc: &NodeAllocations,
) -> Audit {
    let mut a = Audit::default();
    let published: BTreeMap<&str, &gpusched_model::protocol::PodAllocation> =
        alloc.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    for p in pods {
        if phase(p) != "Running" {
            continue;
        }
        let name = p.metadata.name.clone().unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        let d = decision(p);
        let spec = p.spec.as_ref().unwrap();
        let mut held: BTreeSet<String> = BTreeSet::new();
        let mut share_gpu: Option<(String, u32)> = None;
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for c in all {
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default();
            let Some(r) = records.get(&(uid.clone(), c.name.clone())) else {
                a.errors
                    .push(format!("{name}/{}: no container created", c.name));
                continue;
            };
            let v = visible(r);
            if let Some(q) = limits.get("nvidia.com/gpu") {
                let n: usize = q.0.parse().unwrap();
                if v.len() != n || v.iter().collect::<BTreeSet<_>>().len() != n {
                    a.errors.push(format!(
                        "{name}/{}: asked {n} GPUs, NVIDIA_VISIBLE_DEVICES={v:?} ({})",
                        c.name, r.id
                    ));
                }
                held.extend(v);
            } else if let Some(q) = limits.get("gpusched.io/gpu-milli") {
                let m: u32 = q.0.parse().unwrap();
                let got = r.env.get("GPUSCHED_GPU_MILLI").cloned().unwrap_or_default();
                if v.len() != 1 || got != m.to_string() {
                    a.errors.push(format!(
                        "{name}/{}: asked {m} milli, NVIDIA_VISIBLE_DEVICES={v:?} GPUSCHED_GPU_MILLI={got:?}",
                        c.name
                    ));
                } else {
                    let (g, sum) = share_gpu.get_or_insert((v[0].clone(), 0));
                    if *g != v[0] {
                        a.errors
                            .push(format!("{name}: containers on two share GPUs"));
                    }
                    *sum += m;
                }
            } else if !v.is_empty() {
                a.errors.push(format!(
                    "{name}/{}: asked no GPU but NVIDIA_VISIBLE_DEVICES={v:?}",
                    c.name
                ));
            }
        }
        let want: BTreeSet<String> = d.gpus.iter().cloned().collect();
        if let Some((g, m)) = share_gpu {
            let dm = d.share.as_ref().map(|s| s.milli).unwrap_or(0);
            if dm != m {
                a.errors
                    .push(format!("{name}: served {m} milli, decided {dm}"));
            }
            if !want.contains(&g) {
                // a same-milli share admitted in another order (docs/protocol.md, shares 4)
                a.swaps
                    .push(format!("{name}: share on {g}, decided {:?}", d.gpus));
            }
            *a.shares.entry(g.clone()).or_default() += m;
            a.held.insert(name.clone(), vec![g]);
        } else {
            if held.len() != want.len() {
                a.errors.push(format!(
                    "{name}: holds {} GPUs {held:?}, decided {}",
                    held.len(),
                    want.len()
                ));
            }
            if held != want {
                a.swaps
                    .push(format!("{name}: holds {held:?}, decided {want:?}"));
                // a swap must be what the agent publishes
                let pubd: BTreeSet<String> = published
                    .get(uid.as_str())
                    .map(|p| p.gpus.iter().cloned().collect())
                    .unwrap_or_default();
                if pubd != held {
                    a.errors.push(format!(
                        "swap not published: {name} holds {held:?}, allocations say {pubd:?}"
                    ));
                }
            }
            for g in &held {
                if let Some(prev) = a.whole.insert(g.clone(), name.clone()) {
                    a.errors
                        .push(format!("held twice: GPU {g} by {prev} and {name}"));
                }
            }
            a.held.insert(name.clone(), held.into_iter().collect());
        }
    }
    for (g, m) in &a.shares {
        if *m > 1000 {
            a.errors
                .push(format!("held twice: GPU {g} shared {m} milli > 1000"));
        }
        if let Some(owner) = a.whole.get(g) {
            a.errors.push(format!(
                "held twice: GPU {g} whole by {owner} and shared ({m} milli)"
            ));
        }
    }
    a
}

/// Audits the live pods of the namespace, retrying a few seconds while
/// only the agent's publication lags (it follows PodResources).
async fn audit_now(c: &Cluster, n: &RealNode) -> Audit {
    let pods = c.pods(NS);
    let t0 = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let alloc = allocations(c).await.unwrap_or_default();
        let a = audit(&list, &n.records(), &alloc);
        let lagging = a.errors.iter().all(|e| e.starts_with("swap not published"));
        if a.errors.is_empty() || !lagging || t0.elapsed() > Duration::from_secs(15) {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the named pods and waits until they are gone and the agent no
/// longer lists them: the kubelet and the agent gave their devices back.
async fn delete_and_reclaim(c: &Cluster, names: &[String]) {
    let pods = c.pods(NS);
    for n in names {
        let _ = pods.delete(n, &DeleteParams::default()).await;
    }
    let gone = wait_for(Duration::from_secs(60), || async {
        let left: BTreeSet<String> = pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .filter(|p| names.contains(p))
            .collect();
        let alloc = allocations(c).await.unwrap_or_default();
        let listed = alloc.pods.iter().any(|p| names.contains(&p.name));
        (left.is_empty() && !listed).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "pods {names:?} not deleted and reclaimed within 60 s"
    );
}

/// `gpusched doctor` finds nothing wrong.
async fn doctor_clean(c: &Cluster) {
    let r = wait_for(Duration::from_secs(20), || async {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .ok()?;
        r.healthy.then_some(r)
    })
    .await;
    if r.is_none() {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .unwrap();
        panic!("doctor is not clean:\n{}", r.render());
    }
}

async fn setup() -> (Cluster, RealNode, k8s::RunningScheduler) {
    let c = Cluster::up().await;
    let n = RealNode::up(&c).await;
    let took = wait_allocatable(&c, &n, GPUS).await;
    eprintln!("kubelet advertises {GPUS} GPUs {took:?} after the agent started");
    let s = c.scheduler(k8s::opts()).await;
    (c, n, s)
}

fn assert_clean(a: &Audit, what: &str) {
    assert!(a.errors.is_empty(), "{what}: {:#?}", a.errors);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn pods_on_a_real_kubelet_get_their_decided_gpus() {
    let (c, n, s) = setup().await;
    let pods = c.pods(NS);
    let uuids = n.uuids();

    // The seed's cuda-check pod (restartPolicy Never; the container exits
    // after 1 s as nvidia-smi would): Running on its decided GPU, then
    // Succeeded, and its GPU is given back.
    let t0 = Instant::now();
    let mut check = pod_spec("cuda-check", &[], &[("cuda-check", whole(1))], Some(1000));
    check["spec"]["containers"][0]["image"] = json!("nvidia/cuda:12.6.0-base-ubuntu22.04");
    check["spec"]["containers"][0]["command"] = json!(["nvidia-smi"]);
    let check = create(&pods, check).await;
    let running = wait_phase(&pods, &["cuda-check".into()], "Running")
        .await
        .unwrap();
    eprintln!("cuda-check Running {:?} after create", t0.elapsed());
    let d = decision(&running[0]);
    let rec = n.records();
    let r = &rec[&(check.metadata.uid.clone().unwrap(), "cuda-check".into())];
    assert_eq!(visible(r), d.gpus, "cuda-check's NVIDIA_VISIBLE_DEVICES");
    assert_eq!(r.env.get("GPUSCHED_GPU_UUID"), None);
    wait_phase(&pods, &["cuda-check".into()], "Succeeded")
        .await
        .unwrap();
    wait_for(Duration::from_secs(20), || async {
        allocations(&c).await?.pods.is_empty().then_some(())
    })
    .await
    .expect("the finished pod's GPU is released from the published allocations");

    // Whole, multi-GPU, a share, a multi-container pod (one container asks
    // nothing) and a pod whose init container's GPU is reused.
    let specs = vec![
        pod_spec("one", &[], &[("main", whole(1))], None),
        pod_spec("two", &[], &[("main", whole(2))], None),
        pod_spec("four", &[], &[("main", whole(4))], None),
        pod_spec("share", &[], &[("main", milli(300))], None),
        pod_spec(
            "multi",
            &[],
            &[
                ("a", whole(1)),
                ("b", whole(2)),
                ("sidecar", json!({"cpu": "10m"})),
            ],
            None,
        ),
        pod_spec(
            "init",
            &[("setup", whole(1))],
            &[("main", whole(1)), ("helper", whole(1))],
            None,
        ),
        pod_spec(
            "share-multi",
            &[],
            &[("a", milli(200)), ("b", milli(100))],
            None,
        ),
    ];
    let mut created = Vec::new();
    for p in specs {
        created.push(create(&pods, p).await.metadata.name.unwrap());
    }
    let running = wait_phase(&pods, &created, "Running").await.unwrap();
    let a = audit_now(&c, &n).await;
    assert_clean(&a, "whole, multi-GPU, share, multi-container and init pods");
    let by_name: BTreeMap<String, Pod> = running
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    // each pod's size, as the kubelet counts it
    for (name, size) in [
        ("one", 1),
        ("two", 2),
        ("four", 4),
        ("multi", 3),
        ("init", 2),
    ] {
        assert_eq!(a.held[name].len(), size, "{name}: {:?}", a.held[name]);
        assert_eq!(decision(&by_name[name]).gpus.len(), size, "{name}");
    }
    // the init container's GPU is one of the pod's two
    let rec = n.records();
    let uid = by_name["init"].metadata.uid.clone().unwrap();
    let setup_gpu = visible(&rec[&(uid.clone(), "setup".into())]);
    let main = visible(&rec[&(uid.clone(), "main".into())]);
    let helper = visible(&rec[&(uid, "helper".into())]);
    assert_ne!(main, helper, "main and helper are two GPUs");
    assert!(
        setup_gpu == main || setup_gpu == helper,
        "init GPU {setup_gpu:?} reused by main {main:?} or helper {helper:?}"
    );
    eprintln!("audit: {} swaps {:?}", a.swaps.len(), a.swaps);

    // Deleting them gives every device back: a 16-GPU pod then fits.
    delete_and_reclaim(&c, &created).await;
    let all = create(&pods, pod_spec("all16", &[], &[("main", whole(16))], None)).await;
    let got = wait_phase(&pods, &["all16".into()], "Running")
        .await
        .unwrap();
    let rec = n.records();
    let mut v = visible(&rec[&(all.metadata.uid.clone().unwrap(), "main".into())]);
    v.sort();
    let mut want = uuids.clone();
    want.sort();
    assert_eq!(v, want, "the 16-GPU pod holds every GPU");
    assert_clean(&audit_now(&c, &n).await, "16-GPU pod");
    drop(got);
    delete_and_reclaim(&c, &["all16".into()]).await;

    // An unhealthy GPU: the kubelet's allocatable drops to 15, the
    // scheduler stops placing on it, a 16-GPU pod waits, a 15-GPU pod runs
    // on the others.
    let sick = 5usize;
    n.control(&format!("unhealthy {sick}"));
    let t1 = Instant::now();
    wait_for(Duration::from_secs(30), || async {
        let node = node_obj(&c).await?;
        (quantity(&node, "allocatable", "nvidia.com/gpu") == Some(15)).then_some(())
    })
    .await
    .expect("allocatable nvidia.com/gpu 16 -> 15");
    eprintln!("unhealthy GPU: allocatable 15 after {:?}", t1.elapsed());
    create(
        &pods,
        pod_spec("too-big", &[], &[("main", whole(16))], None),
    )
    .await;
    let p15 = create(
        &pods,
        pod_spec("fifteen", &[], &[("main", whole(15))], None),
    )
    .await;
    wait_phase(&pods, &["fifteen".into()], "Running")
        .await
        .unwrap();
    let rec = n.records();
    let v = visible(&rec[&(p15.metadata.uid.clone().unwrap(), "main".into())]);
    assert_eq!(v.len(), 15);
    assert!(!v.contains(&uuids[sick]), "placed on the unhealthy GPU");
    let tb = pods.get("too-big").await.unwrap();
    assert_eq!(phase(&tb), "Pending");
    assert!(tb.spec.unwrap().node_name.is_none(), "too-big was bound");
    assert_clean(&audit_now(&c, &n).await, "unhealthy GPU");
    delete_and_reclaim(&c, &["fifteen".into(), "too-big".into()]).await;
    n.control(&format!("healthy {sick}"));
    wait_allocatable(&c, &n, GPUS).await;

    doctor_clean(&c).await;
    s.stop().await;
}

/// The mixed sizes of issue 29, as one burst: whole GPUs and milli shares.
const BURST_WHOLE: [u32; 6] = [2, 1, 1, 2, 1, 1];
const BURST_MILLI: [u32; 8] = [300, 500, 300, 200, 700, 400, 600, 300];

fn env_u64(k: &str, default: u64) -> u64 {
    std::env::var(k)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{k}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

/// The burst's pods in a seeded order (Fisher–Yates on `mix_indexed`).
fn burst(round: u64, seed: u64) -> Vec<Value> {
    let mut v: Vec<Value> = BURST_WHOLE
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            pod_spec(
                &format!("r{round}-w{i}-{g}"),
                &[],
                &[("main", whole(g))],
                None,
            )
        })
        .chain(BURST_MILLI.iter().enumerate().map(|(i, &m)| {
            pod_spec(
                &format!("r{round}-s{i}-{m}"),
                &[],
                &[("main", milli(m))],
                None,
            )
        }))
        .collect();
    for i in (1..v.len()).rev() {
        let j = (mix_indexed(seed, i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn mixed_size_bursts_on_a_real_kubelet() {
    let rounds = env_u64("GPUSCHED_KUBELET_ROUNDS", 5);
    let base = env_u64("GPUSCHED_KUBELET_SEED", 29);
    let (c, n, s) = setup().await;
    let pods = c.pods(NS);
    let t0 = Instant::now();
    let (mut failed, mut double, mut swaps, mut passed) = (Vec::new(), 0usize, 0usize, 0u64);
    let mut other: Vec<String> = Vec::new();
    let (mut t_running, mut t_reclaim) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        let seed = mix_indexed(base, round);
        let specs = burst(round, seed);
        let names: Vec<String> = specs
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        let t_round = Instant::now();
        for p in specs {
            create(&pods, p).await;
        }
        let ok = match wait_phase(&pods, &names, "Running").await {
            Ok(_) => true,
            Err(e) => {
                eprintln!("round {round} (seed {seed}): {e}");
                failed.push(format!("round {round}: {e}"));
                false
            }
        };
        t_running += t_round.elapsed();
        let a = audit_now(&c, &n).await;
        double += a.double();
        swaps += a.swaps.len();
        if !a.errors.is_empty() {
            eprintln!("round {round} (seed {seed}): {:#?}", a.errors);
            other.extend(a.errors.iter().map(|e| format!("round {round}: {e}")));
        }
        if ok && a.errors.is_empty() {
            passed += 1;
        }
        let t_del = Instant::now();
        delete_and_reclaim(&c, &names).await;
        t_reclaim += t_del.elapsed();
        if (round + 1) % 10 == 0 {
            eprintln!(
                "{} rounds in {:?}: {passed} passed",
                round + 1,
                t0.elapsed()
            );
        }
    }
    eprintln!(
        "mixed-size bursts: {passed}/{rounds} rounds passed, {} failed admissions, {double} GPUs held twice, {swaps} same-size swaps, {:.1} s ({:.2} s/round)",
        failed.len(),
        t0.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64() / rounds.max(1) as f64
    );
    eprintln!(
        "per round: create to all Running {:.2} s, delete to reclaimed {:.2} s",
        t_running.as_secs_f64() / rounds.max(1) as f64,
        t_reclaim.as_secs_f64() / rounds.max(1) as f64
    );
    assert!(failed.is_empty(), "failed rounds: {failed:#?}");
    assert_eq!(double, 0, "GPUs held twice: {other:#?}");
    assert!(other.is_empty(), "{other:#?}");
    assert_eq!(passed, rounds);
    doctor_clean(&c).await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn kubelet_and_agent_restarts_keep_every_gpu_with_one_owner() {
    let (c, mut n, s) = setup().await;
    let pods = c.pods(NS);

    // A burst, then a kubelet restart under it: the pods keep running on
    // the same GPUs and nothing is created again.
    let specs = burst(0, 7);
    let first: Vec<String> = specs
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for p in specs {
        create(&pods, p).await;
    }
    wait_phase(&pods, &first, "Running").await.unwrap();
    let before = audit_now(&c, &n).await;
    assert_clean(&before, "burst");
    let containers = n.records().len();
    let t0 = Instant::now();
    n.kubelet_stop();
    n.kubelet_start();
    let took = wait_allocatable(&c, &n, GPUS).await;
    eprintln!(
        "kubelet restart: {GPUS} GPUs allocatable again {took:?} after start ({:?} in all)",
        t0.elapsed()
    );
    wait_phase(&pods, &first, "Running").await.unwrap();
    let after = audit_now(&c, &n).await;
    assert_clean(&after, "after a kubelet restart");
    assert_eq!(after.held, before.held, "the pods hold what they held");
    assert_eq!(
        n.records().len(),
        containers,
        "no container was created again"
    );
    // new pods after the restart land on the GPUs still free
    let more: Vec<String> = (0..2).map(|i| format!("after-{i}")).collect();
    for m in &more {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    wait_phase(&pods, &more, "Running").await.unwrap();
    assert_clean(&audit_now(&c, &n).await, "pods after the kubelet restart");
    let mut all: Vec<String> = first.clone();
    all.extend(more);
    delete_and_reclaim(&c, &all).await;

    // Swaps: with the kubelet down, four 1-GPU pods created within one
    // second are all bound; the restarted kubelet admits them in its own
    // order (ties of creationTimestamp), which the agent cannot know, so
    // most get another pod's decided GPUs (docs/protocol.md allows a swap
    // of same-size pods). More: the kubelet still counts the 10 GPUs of
    // the pods deleted above as in use (its checkpoint keeps them until
    // its pod sources are ready, after this first batch), so it cannot
    // give some of these pods their decided GPUs at all and picks free
    // ones, which the agent serves in their place. (Eight pods would not
    // fit in the 6 GPUs it sees free: "requested number of devices
    // unavailable", the kubelet's own limit, docs/agent.md.)
    n.kubelet_stop();
    let swapped: Vec<String> = (0..4).map(|i| format!("swap-{i}")).collect();
    for m in &swapped {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    wait_for(Duration::from_secs(60), || async {
        let b = k8s::bound(&pods).await;
        swapped.iter().all(|m| b.contains_key(m)).then_some(())
    })
    .await
    .expect("the eight pods bound");
    n.kubelet_start();
    wait_phase(&pods, &swapped, "Running").await.unwrap();
    let a = audit_now(&c, &n).await;
    assert_clean(&a, "swapped pods");
    eprintln!("{} of 4 pods swapped: {:?}", a.swaps.len(), a.swaps);

    // The agent crashes and comes back: it rebuilds from PodResources
    // exactly what each pod holds, swapped or not, and publishes it.
    n.stop_agent(true);
    n.start_agent();
    let held = a.held.clone();
    let rebuilt = wait_for(Duration::from_secs(30), || async {
        let al = allocations(&c).await?;
        let got: BTreeMap<String, Vec<String>> = al
            .pods
            .iter()
            .map(|p| {
                let mut g = p.gpus.clone();
                g.sort();
                (p.name.clone(), g)
            })
            .collect();
        (got == held).then_some(got)
    })
    .await;
    assert!(
        rebuilt.is_some(),
        "after an agent restart the allocations are not what the pods hold: {:?} vs {held:?}\nagent log:\n{}",
        allocations(&c).await,
        n.agent_log()
    );
    // The GPUs a swapped pod really held come back when it ends, and the
    // next pods are placed on GPUs that are really free.
    let gone: Vec<String> = swapped[..2].to_vec();
    delete_and_reclaim(&c, &gone).await;
    let next: Vec<String> = (0..4).map(|i| format!("next-{i}")).collect();
    for m in &next {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    let big = create(
        &pods,
        pod_spec("next-big", &[], &[("main", whole(4))], None),
    )
    .await;
    let mut all_next = next.clone();
    all_next.push(big.metadata.name.unwrap());
    wait_phase(&pods, &all_next, "Running").await.unwrap();
    assert_clean(
        &audit_now(&c, &n).await,
        "pods after the swapped pods ended",
    );
    let mut rest: Vec<String> = swapped[2..].to_vec();
    rest.extend(all_next);
    delete_and_reclaim(&c, &rest).await;
    doctor_clean(&c).await;
    s.stop().await;
}

/// Issue 29 item 5: time-sliced GPUs on the real kubelet, under their own
/// name and renamed `nvidia.com/gpu.shared`. Two GPUs shared 8 ways: the
/// kubelet advertises 16 replicas; pods asking 2,1,1,… replicas (16 in
/// all, created at once) in a queue limited to 2 GPUs all run — a replica
/// is ⌊1000/8⌋ = 125 milli-GPU (docs/scheduling.md, *One measure for
/// GPUs*), so 16 replicas are exactly the 2 GPUs of the limit — with 0
/// failed admissions; each container is told its decided GPU, each GPU
/// gets the 8 replicas decided onto it, the agent publishes each pod's
/// milli, the queue's status shows 2 GPUs, and a 17th replica waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn time_sliced_gpus_on_a_real_kubelet_are_filled_to_what_they_advertise() {
    for resource in ["nvidia.com/gpu", "nvidia.com/gpu.shared"] {
        time_sliced_round(resource).await;
    }
}

async fn time_sliced_round(resource: &str) {
    const TS_GPUS: usize = 2;
    const REPLICAS: u64 = 8;
    let rename = if resource == "nvidia.com/gpu" {
        String::new()
    } else {
        format!("\n        rename: {resource}")
    };
    let config = format!(
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: {REPLICAS}{rename}\n"
    );
    let c = Cluster::up().await;
    let n = RealNode::up_with(&c, TS_GPUS, Some(&config)).await;
    wait_for(Duration::from_secs(60), || async {
        let node = node_obj(&c).await?;
        (quantity(&node, "allocatable", resource) == Some(TS_GPUS as u64 * REPLICAS)).then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "{resource}: the kubelet never advertised {} replicas\n{}",
            TS_GPUS as u64 * REPLICAS,
            n.logs()
        )
    });
    let _s = c.scheduler(k8s::opts()).await;
    c.queue("research", json!({"limit": {"nvidia.com/gpu": "2"}}))
        .await;
    let pods = c.pods(NS);
    let uuids = n.uuids();
    let sizes = [2u32, 1, 1, 2, 1, 1, 2, 1, 1, 2, 1, 1];
    assert_eq!(sizes.iter().sum::<u32>() as u64, TS_GPUS as u64 * REPLICAS);
    let mut names = Vec::new();
    for (i, k) in sizes.iter().enumerate() {
        let name = format!("r{i:02}");
        let mut p = pod_spec(
            &name,
            &[],
            &[("main", json!({resource: k.to_string()}))],
            None,
        );
        p["metadata"]["labels"] = json!({"gpusched.io/queue": "research"});
        create(&pods, p).await;
        names.push(name);
    }
    let running = wait_phase(&pods, &names, "Running")
        .await
        .unwrap_or_else(|e| panic!("{resource}: {e}\n{}", n.logs()));
    // each pod: a replica decision of its size, its container told the
    // decided GPU; each GPU gets exactly its 8 replicas
    let rec = n.records();
    let mut per_gpu: BTreeMap<String, u64> = BTreeMap::new();
    let mut real_gpu: BTreeMap<String, u64> = BTreeMap::new();
    let mut swaps = 0;
    let mut want_alloc: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for (p, &k) in running.iter().zip(&sizes) {
        let name = p.metadata.name.clone().unwrap();
        let d = decision(p);
        let share = d
            .share
            .as_ref()
            .unwrap_or_else(|| panic!("{resource}: {name}: not a share decision: {d:?}"));
        assert_eq!(share.resource.as_deref(), Some(resource), "{name}");
        assert_eq!(share.replicas, Some(k), "{name}");
        assert_eq!(share.milli, k * 125, "{name}: k replicas of 125 milli");
        assert_eq!(d.gpus.len(), 1);
        let r = &rec[&(p.metadata.uid.clone().unwrap(), "main".to_string())];
        // Told one GPU of the node. Two pending replica decisions of one
        // size on different GPUs may be swapped (the kubelet does not say
        // which pod calls: docs/protocol.md, share swaps); each GPU still
        // gets exactly the replicas decided onto it (below).
        let told = visible(r);
        assert_eq!(told.len(), 1, "{resource}: {name}: {told:?}");
        assert!(uuids.contains(&told[0]), "{resource}: {name}: {told:?}");
        assert_eq!(r.env.get("GPUSCHED_GPU_UUID"), Some(&told[0]));
        assert!(uuids.contains(&d.gpus[0]));
        if told != d.gpus {
            swaps += 1;
        }
        *per_gpu.entry(d.gpus[0].clone()).or_default() += u64::from(k);
        *real_gpu.entry(told[0].clone()).or_default() += u64::from(k);
        // published where it really is (a swap corrected from PodResources)
        want_alloc.insert(p.metadata.uid.clone().unwrap(), (told[0].clone(), k * 125));
    }
    assert_eq!(per_gpu.len(), TS_GPUS, "{per_gpu:?}");
    assert!(
        per_gpu.values().all(|&r| r == REPLICAS),
        "{resource}: each GPU decided its replicas: {per_gpu:?}"
    );
    assert_eq!(
        real_gpu, per_gpu,
        "{resource}: the containers on each GPU hold exactly the replicas decided onto it"
    );
    eprintln!("{resource}: 12 pods, 16 replicas on 2 GPUs; {swaps} same-size swaps");
    // the agent publishes each pod's replicas as its milli of the GPU its
    // container was told
    let published = wait_for(Duration::from_secs(20), || async {
        let a = allocations(&c).await?;
        let got: BTreeMap<String, (String, u32)> = a
            .pods
            .iter()
            .filter_map(|p| Some((p.uid.clone(), (p.gpus.first()?.clone(), p.milli?))))
            .collect();
        (got == want_alloc).then_some(())
    })
    .await;
    assert!(
        published.is_some(),
        "{resource}: allocations {:?}, want {want_alloc:?}",
        allocations(&c).await
    );
    // one measure: 16 replicas are 2 GPUs in the queue's status
    let queues: Api<gpusched_k8s::crd::Queue> = Api::all(c.client.clone());
    let status = wait_for(Duration::from_secs(30), || async {
        let q = queues.get("research").await.ok()?;
        let s = q.status?;
        (s.allocated_gpus.as_deref() == Some("2")).then_some(())
    })
    .await;
    assert!(
        status.is_some(),
        "{resource}: queue research status {:?}",
        queues.get("research").await.ok().and_then(|q| q.status)
    );
    // nothing more is advertised (nor within the limit): a 17th waits
    let mut extra = pod_spec("r-extra", &[], &[("main", json!({resource: "1"}))], None);
    extra["metadata"]["labels"] = json!({"gpusched.io/queue": "research"});
    create(&pods, extra).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pods.get("r-extra").await.unwrap();
    assert!(
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "{resource}: a 17th replica was bound"
    );
    assert!(failed_admission(&p).is_none());
}

/// MIG on a real kubelet (#29), `migStrategy: mixed` on the mig-a100
/// fixture (GPU 0 7×1g.10gb, GPU 1 2×3g.40gb, 6 whole GPUs) and `single`
/// on mig-single (2 GPUs × 7×1g.10gb as `nvidia.com/gpu`): a burst of MIG
/// pods created at once fills the node to exactly what the kubelet
/// advertises, with 0 failed admissions and 0 instances held twice; every
/// container's NVIDIA_VISIBLE_DEVICES is MIG devices of its pod's size and
/// profile, on the GPU and of the instances the scheduler counts (the
/// agent's published allocations); the queue counts 142 milli per 1g; a
/// pod past capacity waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn mig_instances_on_a_real_kubelet_are_filled_to_what_they_advertise() {
    mig_round(
        "mig-a100.yaml",
        "mixed",
        &[
            ("nvidia.com/mig-1g.10gb", &[2, 1, 1, 3]),
            ("nvidia.com/mig-3g.40gb", &[1, 1]),
        ],
        7 * 142 + 2 * 428,
    )
    .await;
    mig_round(
        "mig-single.yaml",
        "single",
        &[("nvidia.com/gpu", &[2, 1, 3, 1, 2, 1, 1, 2, 1])],
        14 * 142,
    )
    .await;
}

async fn mig_round(fixture: &str, strategy: &str, asks: &[(&str, &[u32])], milli: u32) {
    use gpusched_model::sharing::NodeSharing;
    let yaml =
        std::fs::read_to_string(k8s::repo_root().join("fixtures/nodes").join(fixture)).unwrap();
    let config = format!("version: v1\nplugin:\n  migStrategy: {strategy}\n");
    let c = Cluster::up().await;
    let n = RealNode::up_file(&c, &yaml, Some(&config)).await;
    // the kubelet advertises every MIG resource, the agent its layout
    let layout = wait_for(Duration::from_secs(60), || async {
        let node = node_obj(&c).await?;
        for (r, sizes) in asks {
            let want: u32 = sizes.iter().sum();
            if quantity(&node, "allocatable", r) != Some(u64::from(want)) {
                return None;
            }
        }
        let text = node
            .metadata
            .annotations
            .as_ref()?
            .get("gpusched.io/sharing")?;
        let sh = NodeSharing::parse(text).ok()?;
        (!sh.mig.is_empty()).then_some(sh)
    })
    .await
    .unwrap_or_else(|| panic!("{strategy}: MIG resources never advertised\n{}", n.logs()));
    // instance id → (GPU uuid, resource, milli)
    let gpu_uuids = n.uuids();
    let mut inst: BTreeMap<String, (String, String, u32)> = BTreeMap::new();
    for g in &layout.mig {
        for m in &g.instances {
            inst.insert(
                m.id.clone(),
                (
                    gpu_uuids[g.index as usize].clone(),
                    m.resource.clone(),
                    m.milli(),
                ),
            );
        }
    }
    let _s = c.scheduler(k8s::opts()).await;
    c.queue("research", json!({})).await;
    let pods = c.pods(NS);
    let mut names = Vec::new();
    let mut want: BTreeMap<String, (String, u32)> = BTreeMap::new();
    for (r, sizes) in asks {
        for (i, k) in sizes.iter().enumerate() {
            let name = format!("m-{}-{i}", r.rsplit('/').next().unwrap().replace('.', "-"));
            let mut p = pod_spec(&name, &[], &[("main", json!({*r: k.to_string()}))], None);
            p["metadata"]["labels"] = json!({"gpusched.io/queue": "research"});
            create(&pods, p).await;
            want.insert(name.clone(), (r.to_string(), *k));
            names.push(name);
        }
    }
    let running = wait_phase(&pods, &names, "Running")
        .await
        .unwrap_or_else(|e| panic!("{strategy}: {e}\n{}", n.logs()));
    let rec = n.records();
    let mut held: BTreeMap<String, String> = BTreeMap::new();
    let mut told_of: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut swaps = 0;
    for p in &running {
        let name = p.metadata.name.clone().unwrap();
        assert!(failed_admission(p).is_none(), "{name}");
        let (r, k) = &want[&name];
        let d = decision(p);
        let m = d
            .mig
            .as_ref()
            .unwrap_or_else(|| panic!("{name}: not a MIG decision: {d:?}"));
        assert_eq!((&m.resource, m.instances.len()), (r, *k as usize), "{name}");
        let rr = &rec[&(p.metadata.uid.clone().unwrap(), "main".to_string())];
        let told = visible(rr);
        assert_eq!(told.len(), *k as usize, "{strategy}: {name}: {told:?}");
        for t in &told {
            let (gpu, res, _) = inst
                .get(t)
                .unwrap_or_else(|| panic!("{name}: told {t}, not a MIG device of the node"));
            assert_eq!(res, r, "{name}: told {t} of another resource");
            // one GPU; two pending decisions of one size on different
            // GPUs may be swapped (the kubelet does not say which pod
            // calls: docs/protocol.md), corrected from PodResources below
            assert_eq!(gpu, &inst[&told[0]].0, "{name}: told instances of two GPUs");
            if gpu != &d.gpus[0] {
                swaps += 1;
            }
            if let Some(other) = held.insert(t.clone(), name.clone()) {
                panic!("{strategy}: instance {t} held by {other} and {name}");
            }
        }
        told_of.insert(p.metadata.uid.clone().unwrap(), {
            let mut t = told.clone();
            t.sort();
            t
        });
    }
    let total: u32 = asks.iter().flat_map(|a| a.1.iter()).sum();
    assert_eq!(
        held.len() as u32,
        total,
        "{strategy}: every advertised instance held once"
    );
    // the agent publishes each pod with the instances its container holds
    let published = wait_for(Duration::from_secs(20), || async {
        let a = allocations(&c).await?;
        let got: BTreeMap<String, Vec<String>> = a
            .pods
            .iter()
            .map(|p| {
                let mut m = p.mig.clone();
                m.sort();
                (p.uid.clone(), m)
            })
            .collect();
        (got == told_of).then_some(())
    })
    .await;
    assert!(
        published.is_some(),
        "{strategy}: allocations {:?}, want {told_of:?}",
        allocations(&c).await
    );
    // one measure: the queue's status counts the instances' slices
    let queues: Api<gpusched_k8s::crd::Queue> = Api::all(c.client.clone());
    // GPUs as the status writes them (`1.85`, `1.988`)
    let want_gpus = format!(
        "{}.{}",
        milli / 1000,
        format!("{:03}", milli % 1000).trim_end_matches('0')
    );
    let status = wait_for(Duration::from_secs(30), || async {
        let s = queues.get("research").await.ok()?.status?;
        (s.allocated_gpus.as_deref() == Some(want_gpus.as_str())).then_some(())
    })
    .await;
    assert!(
        status.is_some(),
        "{strategy}: queue status {:?}, want {want_gpus}",
        queues.get("research").await.ok().and_then(|q| q.status)
    );
    // nothing more is advertised: one more waits
    let (r, _) = asks[0];
    let extra = pod_spec("m-extra", &[], &[("main", json!({r: "1"}))], None);
    create(&pods, extra).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let p = pods.get("m-extra").await.unwrap();
    assert!(
        p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none(),
        "{strategy}: a pod past capacity was bound"
    );
    eprintln!(
        "{strategy}: {} pods, {total} instances, {milli} milli, {swaps} instances told on another GPU than decided",
        running.len()
    );
}

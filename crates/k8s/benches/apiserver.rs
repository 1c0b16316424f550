//! Side-by-side API benchmark (issue 6): on a real kube-apiserver with kwok
//! nodes, how fast do pods get bound by gpusched, by the upstream
//! kube-scheduler of the same Kubernetes version, and by a round-robin
//! binder that decides nothing (the apiserver's bind ceiling)?
//!
//! Each (contender, QPS setting, mix) row gets a **fresh cluster** (etcd +
//! kube-apiserver + kwok from `e2e/cluster/cluster up`), so no row inherits
//! another's etcd history, watch cache or leftover objects. Per row:
//! nodes are created and made Ready by kwok, the contender is started and
//! given time to sync (mode `stream`, the default), then the pods are
//! created as fast as a bounded-concurrency creator can. A watch on the
//! pods records when each pod is first seen with `spec.nodeName`; the
//! creator records when each create call returned. Latency per pod = watch
//! bind time − local create completion (not `creationTimestamp`, which has
//! second resolution). Throughput = pods / (last bind seen − first create
//! started). Mode `backlog` creates every pod first and starts the
//! contender afterwards: pure drain rate, latencies then include the wait.
//!
//! ```text
//! cargo bench -p gpusched-k8s --bench apiserver -- --help
//! ```

use futures::StreamExt;
use gpusched_k8s::controller::{self, Options};
use gpusched_k8s::crd::{PodGroup, Queue, SpPodGroup};
use gpusched_k8s::exec::ExecOptions;
use gpusched_k8s::kwok::node_object;
use gpusched_k8s::limiter::Limiter;
use k8s_openapi::api::core::v1::{Binding, Namespace, Node, ObjectReference, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, CustomResourceExt};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const NS: &str = "bench";
const HELP: &str = "apiserver bench: gpusched vs kube-scheduler vs a round-robin binder on kube-apiserver + kwok

  --pods N              pods per row (default 1000)
  --nodes N             kwok nodes, 8 H100 each (default: pods/8 rounded up: exactly full)
  --throttled-pods N    pods for rows with qps > 0 (default: --pods)
  --contenders LIST     gpusched,kube-scheduler,rr,rr-ev (default: the first three;
                        rr-ev = rr plus one Scheduled event per pod, as the schedulers write)
  --qps LIST            0 = unthrottled (kube-scheduler: 5000/10000), else qps with burst 2*qps (default 0,50)
  --mix LIST            single (1-GPU pods), gang (60% in PodGroups of 8-32) (default single)
  --mode stream|backlog contender running while pods are created (default), or started after
  --queues N            gpusched Queues q-0..q-N-1 (weight 1, may borrow) with the pods spread over
                        them round-robin (default 0: every pod in queue default; kube-scheduler and rr
                        get the same pods, the label means nothing to them)
  --create-concurrency N  pod creations in flight (default 64)
  --bind-concurrency N  gpusched and rr bindings in flight (default 64)
  --gpusched-bin PATH   run gpusched as a process (RSS measured) instead of in-process;
                        GPUSCHED_BENCH_ARGS (whitespace-separated) adds flags, e.g. --debounce-ms 100
  --timeout S           give up on a row after S seconds (default 900)
  --probe N             gpusched only: after the drain, create N more 1-GPU pods one at a time
                        and report the duration of the first cycle after each (from gpusched's
                        cycle histogram: sum and count before and after)
  --keep                leave each cluster directory for inspection";

#[derive(Clone, Debug)]
struct Args {
    pods: usize,
    nodes: Option<usize>,
    throttled_pods: Option<usize>,
    contenders: Vec<String>,
    qps: Vec<f64>,
    mixes: Vec<String>,
    backlog: bool,
    queues: usize,
    create_concurrency: usize,
    bind_concurrency: usize,
    gpusched_bin: Option<PathBuf>,
    timeout: Duration,
    probe: usize,
    keep: bool,
}

fn list(s: &str) -> Vec<String> {
    s.split(',')
        .map(|x| x.trim().to_string())
        .filter(|x| !x.is_empty())
        .collect()
}

fn parse_args() -> Args {
    let mut a = Args {
        pods: 1000,
        nodes: None,
        throttled_pods: None,
        contenders: list("gpusched,kube-scheduler,rr"),
        qps: vec![0.0, 50.0],
        mixes: vec!["single".into()],
        backlog: false,
        queues: 0,
        create_concurrency: 64,
        bind_concurrency: 64,
        gpusched_bin: None,
        timeout: Duration::from_secs(900),
        probe: 0,
        keep: false,
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let mut i = 0;
    while i < argv.len() {
        let k = argv[i].as_str();
        let v = argv.get(i + 1).cloned().unwrap_or_default();
        let mut took = true;
        match k {
            "--pods" => a.pods = v.parse().expect("--pods"),
            "--nodes" => a.nodes = Some(v.parse().expect("--nodes")),
            "--throttled-pods" => a.throttled_pods = Some(v.parse().expect("--throttled-pods")),
            "--contenders" => a.contenders = list(&v),
            "--qps" => a.qps = list(&v).iter().map(|q| q.parse().expect("--qps")).collect(),
            "--mix" => a.mixes = list(&v),
            "--mode" => a.backlog = v == "backlog",
            "--queues" => a.queues = v.parse().expect("--queues"),
            "--create-concurrency" => a.create_concurrency = v.parse().expect("n"),
            "--bind-concurrency" => a.bind_concurrency = v.parse().expect("n"),
            "--gpusched-bin" => a.gpusched_bin = Some(resolve_bin(&v)),
            "--timeout" => a.timeout = Duration::from_secs(v.parse().expect("s")),
            "--probe" => a.probe = v.parse().expect("--probe"),
            "--keep" => {
                a.keep = true;
                took = false;
            }
            "--help" | "-h" => {
                println!("{HELP}");
                std::process::exit(0);
            }
            _ => took = false, // cargo's --bench and friends
        }
        i += if took { 2 } else { 1 };
    }
    a
}

/// `--gpusched-bin`: a relative path is taken from where the command was
/// typed if it exists there, else from the repository root (cargo runs a
/// bench in its crate's directory, where `target/release/gpusched` is not);
/// a path found nowhere stops the bench naming both places.
fn resolve_bin(v: &str) -> PathBuf {
    let p = PathBuf::from(v);
    if p.is_absolute() {
        return p;
    }
    let typed = std::env::var_os("PWD").map(PathBuf::from);
    let candidates: Vec<PathBuf> = typed
        .into_iter()
        .map(|d| d.join(&p))
        .chain([repo_root().join(&p)])
        .collect();
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .unwrap_or_else(|| {
            eprintln!(
                "--gpusched-bin {v}: not found (looked at {}); build it with `cargo build --release -p gpusched`",
                candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            std::process::exit(2)
        })
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// `VmHWM` and `VmRSS` of a process, in MiB.
fn rss_mib(pid: u32) -> Option<(f64, f64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
    };
    Some((get("VmHWM:")?, get("VmRSS:")?))
}

/// CPU seconds (user + system) a process has used.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cluster {
    dir: TmpDir,
    env: HashMap<String, String>,
    client: Client,
    keep: bool,
}

impl Cluster {
    async fn up(keep: bool) -> Cluster {
        let dir = TmpDir(
            tempfile::Builder::new()
                .prefix("gpusched-bench-")
                .tempdir()
                .unwrap()
                .keep(),
        );
        let out = Command::new(repo_root().join("e2e/cluster/cluster"))
            .arg("up")
            .arg(dir.path())
            .env("GPUSCHED_E2E_NODE_LEASE_SECONDS", "0")
            .output()
            .expect("e2e/cluster/cluster up");
        assert!(
            out.status.success(),
            "cluster up failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let env: HashMap<String, String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let client = client_for(&env["GPUSCHED_E2E_KUBECONFIG"]).await;
        Cluster {
            dir,
            env,
            client,
            keep,
        }
    }

    fn kubeconfig(&self) -> String {
        self.env["GPUSCHED_E2E_KUBECONFIG"].clone()
    }

    fn pid(&self, component: &str) -> Option<u32> {
        std::fs::read_to_string(self.dir.path().join(format!("{component}.pid")))
            .ok()?
            .trim()
            .parse()
            .ok()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("e2e/cluster/cluster"))
            .arg("down")
            .arg(self.dir.path())
            .output();
        if self.keep {
            eprintln!("kept {}", self.dir.path().display());
        } else {
            let _ = std::fs::remove_dir_all(self.dir.path());
        }
    }
}

struct TmpDir(PathBuf);
impl TmpDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

/// An admin client from the cluster's kubeconfig. kube-rs has no
/// client-side rate limit, so this client is unthrottled.
async fn client_for(kubeconfig: &str) -> Client {
    gpusched_k8s::client::client(Some(Path::new(kubeconfig)))
        .await
        .unwrap()
}

async fn install_crds(client: &Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [Queue::crd(), PodGroup::crd(), SpPodGroup::crd()] {
        let name = crd.metadata.name.clone().unwrap();
        api.create(&PostParams::default(), &crd).await.unwrap();
        let t0 = Instant::now();
        loop {
            let ok = api
                .get(&name)
                .await
                .ok()
                .and_then(|c| c.status)
                .and_then(|s| s.conditions)
                .is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c.type_ == "Established" && c.status == "True")
                });
            if ok {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(30), "CRD {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let ns: Api<Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
    )
    .await
    .unwrap();
}

/// Creates `n` kwok nodes with 8 H100 GPUs each; returns their names and
/// the seconds to create them and to see them all Ready.
async fn make_nodes(client: &Client, n: usize) -> (Vec<String>, f64, f64) {
    let yaml = format!(
        "nodes:\n  - name: gpu\n    count: {n}\n    cpu: \"256\"\n    memory: 2Ti\n    gpus: {{count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}\n"
    );
    let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
    let nodes: Vec<_> = spec.build().unwrap().into_iter().map(|b| b.node).collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let api: Api<Node> = Api::all(client.clone());
    let t0 = Instant::now();
    futures::stream::iter(nodes)
        .for_each_concurrent(32, |n| {
            let api = api.clone();
            async move {
                let obj = node_object(&n);
                api.create(&PostParams::default(), &obj).await.unwrap();
            }
        })
        .await;
    let created = t0.elapsed().as_secs_f64();
    loop {
        let l = api.list(&ListParams::default()).await.unwrap();
        let ready = l
            .items
            .iter()
            .filter(|n| gpusched_k8s::translate::node_ready(n))
            .count();
        if ready >= n {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(600),
            "kwok made {ready}/{n} nodes Ready"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    (names, created, t0.elapsed().as_secs_f64())
}

/// A tiny deterministic generator (no rand dependency for a bench).
struct Lcg(u64);
impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A pod to create: its name and its pod group, if any.
type PodSpec = (String, Option<String>);

/// The workload: pods (name, group) and groups (name, size). `gang`: 60 %
/// of the pods in groups of 8–32 (the last group may be smaller); a group's
/// members are created consecutively, as a job controller would, with
/// singles interleaved between groups in proportion (40:60).
fn workload(pods: usize, gang: bool) -> (Vec<PodSpec>, Vec<(String, usize)>) {
    let mut out = Vec::with_capacity(pods);
    let mut groups = Vec::new();
    if !gang {
        for i in 0..pods {
            out.push((format!("p-{i}"), None));
        }
        return (out, groups);
    }
    let mut rng = Lcg(42);
    let gang_pods = pods * 6 / 10;
    let mut g = 0;
    let mut placed = 0;
    let mut singles = 0;
    // interleave: after each group, singles in proportion (40:60)
    while placed < gang_pods {
        let size = (8 + (rng.next() % 25) as usize).min(gang_pods - placed);
        let name = format!("g-{g}");
        for m in 0..size {
            out.push((format!("{name}-{m}"), Some(name.clone())));
        }
        groups.push((name, size));
        placed += size;
        g += 1;
        let want_singles = (placed * 4).div_ceil(6).min(pods - gang_pods);
        while singles < want_singles {
            out.push((format!("s-{singles}"), None));
            singles += 1;
        }
    }
    while singles < pods - gang_pods {
        out.push((format!("s-{singles}"), None));
        singles += 1;
    }
    (out, groups)
}

/// The queue of a pod (`--queues N`): by its gang's name, else its own, so a
/// gang's members share one queue; a stable hash, the same for every row.
fn queue_of(name: &str, group: Option<&str>, queues: usize) -> Option<String> {
    if queues == 0 {
        return None;
    }
    let key = group.unwrap_or(name);
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    Some(format!("q-{}", h % queues as u64))
}

/// Creates the Queues q-0..q-`n`-1, equal weights, borrowing allowed.
async fn make_queues(client: &Client, n: usize) {
    let api: Api<Queue> = Api::all(client.clone());
    for i in 0..n {
        let q: Queue = serde_json::from_value(json!({
            "apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": format!("q-{i}")},
            "spec": {"weight": 1, "borrow": true}}))
        .unwrap();
        api.create(&PostParams::default(), &q).await.unwrap();
    }
}

fn pod_json(name: &str, group: Option<&str>, queue: Option<&str>, scheduler: &str) -> Value {
    let mut labels = json!({"app": "bench"});
    if let Some(g) = group {
        labels["gpusched.io/pod-group"] = json!(g);
    }
    if let Some(q) = queue {
        labels["gpusched.io/queue"] = json!(q);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0, "containers": [{
            "name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    })
}

/// Watch-observed bind times, by pod name.
#[derive(Default)]
struct Seen {
    bound: Mutex<HashMap<String, Instant>>,
    count: AtomicUsize,
}

fn start_watch(client: &Client, seen: Arc<Seen>) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    tokio::spawn(async move {
        let cfg = watcher::Config::default();
        let mut s = watcher::watcher(api, cfg).boxed();
        while let Some(ev) = s.next().await {
            let now = Instant::now();
            let pods: Vec<Pod> = match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for p in pods {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let mut b = seen.bound.lock().unwrap();
                if let std::collections::hash_map::Entry::Vacant(e) = b.entry(name) {
                    e.insert(now);
                    seen.count.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    })
}

/// Creates the pods (and PodGroups first); returns create-completion times
/// by name, the start instant and seconds taken.
async fn create_pods(
    client: &Client,
    pods: &[PodSpec],
    groups: &[(String, usize)],
    scheduler: &str,
    conc: usize,
    queues: usize,
) -> (HashMap<String, Instant>, Instant, f64) {
    if scheduler == "gpusched" {
        let api: Api<PodGroup> = Api::namespaced(client.clone(), NS);
        futures::stream::iter(groups)
            .for_each_concurrent(conc, |(name, size)| {
                let api = api.clone();
                let queue = queue_of(name, Some(name), queues);
                async move {
                    let g: PodGroup = serde_json::from_value(json!({
                        "apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
                        "metadata": {"name": name, "namespace": NS},
                        "spec": {"minMember": size, "queue": queue}}))
                    .unwrap();
                    api.create(&PostParams::default(), &g).await.unwrap();
                }
            })
            .await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let done: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let t0 = Instant::now();
    futures::stream::iter(pods)
        .for_each_concurrent(conc, |(name, group)| {
            let api = api.clone();
            let done = done.clone();
            // kube-scheduler and rr get the same pods without gang semantics
            let group = if scheduler == "gpusched" {
                group.as_deref()
            } else {
                None
            };
            let queue = queue_of(name, group, queues);
            let obj: Pod =
                serde_json::from_value(pod_json(name, group, queue.as_deref(), scheduler)).unwrap();
            async move {
                let mut tries = 0;
                loop {
                    match api.create(&PostParams::default(), &obj).await {
                        Ok(_) => break,
                        Err(e) if tries < 5 => {
                            tries += 1;
                            eprintln!("create {name}: {e} (retrying)");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => panic!("create {name}: {e}"),
                    }
                }
                done.lock().unwrap().insert(name.clone(), Instant::now());
            }
        })
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let m = std::mem::take(&mut *done.lock().unwrap());
    (m, t0, secs)
}

/// The ceiling: binds every pending pod of `schedulerName: bench-rr` to the
/// next node in turn, deciding nothing.
fn start_rr(
    client: &Client,
    nodes: Vec<String>,
    qps: f64,
    burst: u32,
    conc: usize,
    events: bool,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "bench-rr".into(),
            instance: None,
        },
    );
    tokio::spawn(async move {
        let limit = Arc::new(Limiter::new(qps, burst));
        let slots = Arc::new(tokio::sync::Semaphore::new(conc));
        let mut next = 0usize;
        let mut sent: std::collections::HashSet<String> = Default::default();
        let cfg = watcher::Config::default().fields("spec.nodeName=");
        let mut s = watcher::watcher(api.clone(), cfg).boxed();
        while let Some(ev) = s.next().await {
            let p = match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => p,
                _ => continue,
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            if !sent.insert(name.clone()) {
                continue;
            }
            let node = nodes[next % nodes.len()].clone();
            next += 1;
            let permit = slots.clone().acquire_owned().await.unwrap();
            let api = api.clone();
            let limit = limit.clone();
            let recorder = recorder.clone();
            let uid = p.metadata.uid.clone();
            tokio::spawn(async move {
                let _permit = permit;
                limit.acquire().await;
                let b = Binding {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(NS.into()),
                        ..Default::default()
                    },
                    target: ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(node.clone()),
                        ..Default::default()
                    },
                };
                let r = api
                    .create_subresource::<Binding, Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &b,
                    )
                    .await;
                if let Err(e) = r {
                    eprintln!("rr bind {name}: {e}");
                } else if events {
                    // the same second write per pod gpusched and
                    // kube-scheduler make: a Scheduled event
                    limit.acquire().await;
                    let ev = kube::runtime::events::Event {
                        type_: kube::runtime::events::EventType::Normal,
                        reason: "Scheduled".into(),
                        note: Some(format!("Successfully assigned {NS}/{name} to {node}")),
                        action: "Binding".into(),
                        secondary: None,
                    };
                    let r = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        namespace: Some(NS.into()),
                        name: Some(name.clone()),
                        uid,
                        ..Default::default()
                    };
                    let _ = recorder.publish(&ev, &r).await;
                }
            });
        }
    })
}

enum Running {
    InProcess {
        stop: tokio::sync::oneshot::Sender<()>,
        thread: std::thread::JoinHandle<()>,
        metrics_port: u16,
    },
    Process {
        child: Child,
        metrics_port: Option<u16>,
    },
    Task(tokio::task::JoinHandle<()>),
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Running::Process { child, .. } => Some(child.id()),
            _ => None,
        }
    }

    async fn stop(self) {
        match self {
            Running::InProcess { stop, thread, .. } => {
                let _ = stop.send(());
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
            Running::Process { mut child, .. } => {
                unsafe_kill(child.id());
                let _ = child.wait();
            }
            Running::Task(t) => t.abort(),
        }
    }
}

fn unsafe_kill(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

/// A plain HTTP GET on localhost (the metrics endpoint), no client crate.
async fn http_get(port: u16, path: &str) -> Option<String> {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
            .ok()?;
        let mut buf = String::new();
        s.read_to_string(&mut buf).ok()?;
        Some(buf.split_once("\r\n\r\n")?.1.to_string())
    })
    .await
    .ok()?
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The cycle histogram's (sum, count) now.
async fn cycle_totals(port: u16) -> Option<(f64, f64)> {
    let m = http_get(port, "/metrics").await?;
    Some((
        metric(&m, "gpusched_cycle_duration_seconds_sum"),
        metric(&m, "gpusched_cycle_duration_seconds_count"),
    ))
}

/// `--probe N`: one pod at a time on the drained cluster; per pod, the
/// first cycle(s) that end after it was created (the histogram's sum and
/// count before and after) and their mean duration. Returns the summary.
async fn probe_cycles(client: &Client, port: u16, n: usize, scheduler: &str) -> String {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut per_cycle_ms = Vec::new();
    let mut cycles = 0.0;
    for i in 0..n {
        let Some((s0, n0)) = cycle_totals(port).await else {
            return "probe: metrics unreadable".into();
        };
        let obj: Pod =
            serde_json::from_value(pod_json(&format!("probe-{i}"), None, None, scheduler)).unwrap();
        api.create(&PostParams::default(), &obj).await.unwrap();
        // the first cycle that ends after the pod was created (the loop
        // also cycles periodically, so waiting for quiet may never end)
        let t0 = Instant::now();
        let (mut s1, mut n1) = (s0, n0);
        while t0.elapsed() < Duration::from_secs(30) && n1 == n0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Some((s, c)) = cycle_totals(port).await {
                (s1, n1) = (s, c);
            }
        }
        let dn = n1 - n0;
        if dn > 0.0 {
            cycles += dn;
            per_cycle_ms.push(1000.0 * (s1 - s0) / dn);
        }
    }
    per_cycle_ms.sort_by(|x, y| x.total_cmp(y));
    format!(
        "probe: {n} pods one at a time on the drained cluster were followed by {cycles:.0} cycles; mean cycle per pod p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(&per_cycle_ms, 0.5),
        pct(&per_cycle_ms, 0.99),
        per_cycle_ms.last().copied().unwrap_or(f64::NAN)
    )
}

async fn start_contender(
    a: &Args,
    c: &Cluster,
    who: &str,
    qps: f64,
    nodes: &[String],
) -> (Running, Instant) {
    let burst = (qps * 2.0).max(1.0) as u32;
    match who {
        "gpusched" => {
            let port = free_port();
            if let Some(bin) = &a.gpusched_bin {
                let log = std::fs::File::create(c.dir.path().join("gpusched.log")).unwrap();
                let child = Command::new(bin)
                    .args(["scheduler", "--kubeconfig", &c.kubeconfig()])
                    .args(["--http-addr", &format!("127.0.0.1:{port}")])
                    .args(["--kube-api-qps", &qps.to_string()])
                    .args(["--kube-api-burst", &burst.to_string()])
                    .args(["--bind-concurrency", &a.bind_concurrency.to_string()])
                    .args(
                        std::env::var("GPUSCHED_BENCH_ARGS")
                            .unwrap_or_default()
                            .split_whitespace(),
                    )
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .expect("gpusched binary");
                let t = Instant::now();
                wait_ready(port).await;
                (
                    Running::Process {
                        child,
                        metrics_port: Some(port),
                    },
                    t,
                )
            } else {
                let kubeconfig = c.kubeconfig();
                let opts = Options {
                    http_addr: Some(([127, 0, 0, 1], port).into()),
                    exec: ExecOptions {
                        qps,
                        burst,
                        bind_concurrency: a.bind_concurrency,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let t = Instant::now();
                // its own runtime, so every task it spawned (watches,
                // writes) dies with it at the end of the row
                let thread = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let client = client_for(&kubeconfig).await;
                        if let Err(e) = controller::run_with_client(client, opts, async {
                            let _ = rx.await;
                        })
                        .await
                        {
                            eprintln!("gpusched: {e:#}");
                        }
                    });
                    rt.shutdown_timeout(Duration::from_secs(1));
                });
                wait_ready(port).await;
                (
                    Running::InProcess {
                        stop: tx,
                        thread,
                        metrics_port: port,
                    },
                    t,
                )
            }
        }
        "kube-scheduler" => {
            let bin = ks_bin();
            let (q, b) = if qps > 0.0 {
                (qps, burst as f64)
            } else {
                (5000.0, 10000.0)
            };
            let cfg = c.dir.path().join("kube-scheduler-bench.yaml");
            std::fs::write(
                &cfg,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\n  qps: {q}\n  burst: {b}\nleaderElection:\n  leaderElect: false\n",
                    c.kubeconfig()
                ),
            )
            .unwrap();
            let port = free_port();
            let log = std::fs::File::create(c.dir.path().join("kube-scheduler-bench.log")).unwrap();
            let kc = c.kubeconfig();
            let child = Command::new(bin)
                .arg(format!("--config={}", cfg.display()))
                .args(["--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &port.to_string()])
                .arg(format!(
                    "--cert-dir={}",
                    c.dir.path().join("ks-certs").display()
                ))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("kube-scheduler");
            let t = Instant::now();
            // ready: /healthz ok over TLS (curl, as the cluster script does)
            let t0 = Instant::now();
            loop {
                let out = Command::new("curl")
                    .args(["-ksS", "--max-time", "2"])
                    .arg(format!("https://127.0.0.1:{port}/healthz"))
                    .output();
                if out.is_ok_and(|o| o.stdout == b"ok") {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "kube-scheduler not healthy"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (
                Running::Process {
                    child,
                    metrics_port: None,
                },
                t,
            )
        }
        "rr" | "rr-ev" => {
            let t = Instant::now();
            (
                Running::Task(start_rr(
                    &c.client,
                    nodes.to_vec(),
                    qps,
                    burst,
                    a.bind_concurrency,
                    who == "rr-ev",
                )),
                t,
            )
        }
        other => panic!("unknown contender {other}"),
    }
}

fn ks_bin() -> String {
    let out = Command::new(repo_root().join("e2e/cluster/paths"))
        .output()
        .expect("e2e/cluster/paths");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("GPUSCHED_E2E_KUBE_SCHEDULER_BIN="))
        .expect("kube-scheduler binary (e2e/cluster/build)")
        .to_string()
}

async fn wait_ready(port: u16) {
    let t0 = Instant::now();
    loop {
        if http_get(port, "/readyz")
            .await
            .is_some_and(|b| b.starts_with("ready"))
        {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "gpusched not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

struct Row {
    contender: String,
    qps: String,
    mix: String,
    nodes: usize,
    pods: usize,
    bound: usize,
    create_rate: f64,
    throughput: f64,
    drain_rate: f64,
    p50: f64,
    p99: f64,
    max: f64,
    rss: Option<(f64, f64)>,
    cpu: Option<f64>,
    extra: String,
    load: String,
}

async fn run_row(a: &Args, who: &str, qps: f64, mix: &str) -> Row {
    let pods_n = if qps > 0.0 {
        a.throttled_pods.unwrap_or(a.pods)
    } else {
        a.pods
    };
    let nodes_n = a.nodes.unwrap_or(pods_n.div_ceil(8));
    let t_row = Instant::now();
    let c = Cluster::up(a.keep).await;
    install_crds(&c.client).await;
    make_queues(&c.client, a.queues).await;
    let (nodes, nodes_created, nodes_ready) = make_nodes(&c.client, nodes_n).await;
    eprintln!(
        "[{who} qps={qps} {mix}] cluster up, {nodes_n} nodes created in {nodes_created:.1}s, Ready after {nodes_ready:.1}s"
    );
    let (pods, groups) = workload(pods_n, mix == "gang");
    let scheduler_name = match who {
        "gpusched" => "gpusched",
        "kube-scheduler" => "default-scheduler",
        _ => "bench-rr",
    };
    let seen = Arc::new(Seen::default());
    let watch = start_watch(&c.client, seen.clone());
    let creator = client_for(&c.kubeconfig()).await;
    let mut running = None;
    let mut started = Instant::now();
    if !a.backlog {
        let (r, t) = start_contender(a, &c, who, qps, &nodes).await;
        running = Some(r);
        started = t;
        // let it settle (watches synced, first empty cycles)
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (done, t_create, create_secs) = create_pods(
        &creator,
        &pods,
        &groups,
        scheduler_name,
        a.create_concurrency,
        a.queues,
    )
    .await;
    eprintln!(
        "[{who} qps={qps} {mix}] {pods_n} pods created in {create_secs:.1}s ({:.0}/s); {} bound so far",
        pods_n as f64 / create_secs,
        seen.count.load(Ordering::SeqCst)
    );
    if a.backlog {
        let (r, t) = start_contender(a, &c, who, qps, &nodes).await;
        running = Some(r);
        started = t;
    }
    let running = running.unwrap();
    let cp_pids: Vec<(&str, Option<u32>)> = ["kube-apiserver", "etcd", "kwok"]
        .into_iter()
        .map(|k| (k, c.pid(k)))
        .collect();
    let cp_cpu0: Vec<f64> = cp_pids
        .iter()
        .map(|(_, p)| p.and_then(cpu_seconds).unwrap_or(0.0))
        .collect();
    let t_wait = Instant::now();
    let mut last = 0;
    let mut last_change = Instant::now();
    loop {
        let n = seen.count.load(Ordering::SeqCst);
        if n >= pods_n {
            break;
        }
        if n != last {
            last = n;
            last_change = Instant::now();
        }
        if t_wait.elapsed() > a.timeout || last_change.elapsed() > Duration::from_secs(120) {
            eprintln!("[{who}] giving up with {n}/{pods_n} bound");
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // settle a moment so in-flight writes (events) finish before reading RSS
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss = running.pid().and_then(rss_mib);
    let cpu = running.pid().and_then(cpu_seconds);
    let cp_cpu: Vec<String> = cp_pids
        .iter()
        .zip(&cp_cpu0)
        .map(|((k, p), c0)| format!("{k} {:.1}", p.and_then(cpu_seconds).unwrap_or(0.0) - c0))
        .collect();
    let api_rss = cp_pids[0].1.and_then(rss_mib).map(|r| r.0).unwrap_or(0.0);
    let mut extra = String::new();
    let metrics_port = match &running {
        Running::InProcess { metrics_port, .. } => Some(*metrics_port),
        Running::Process { metrics_port, .. } => *metrics_port,
        _ => None,
    };
    let bound: HashMap<String, Instant> = seen.bound.lock().unwrap().clone();
    let bound_n = bound.len();
    let first_bind = bound.values().min().copied();
    let last_bind = bound.values().max().copied();
    if let Some(port) = metrics_port
        && let Some(m) = http_get(port, "/metrics").await
    {
        let cyc_sum = metric(&m, "gpusched_cycle_duration_seconds_sum");
        let cyc_n = metric(&m, "gpusched_cycle_duration_seconds_count");
        let sched = metric(&m, "gpusched_schedule_attempts_total{result=\"scheduled\"}");
        let unsched = metric(
            &m,
            "gpusched_schedule_attempts_total{result=\"unschedulable\"}",
        );
        let bind_sum = metric(&m, "gpusched_binding_duration_seconds_sum");
        let bind_n = metric(&m, "gpusched_binding_duration_seconds_count");
        let window = match (first_bind, last_bind) {
            (Some(f), Some(l)) => l.duration_since(f).as_secs_f64().max(1e-3),
            _ => f64::NAN,
        };
        extra = format!(
            "{cyc_n:.0} cycles, {cyc_sum:.2} s in cycles ({:.1} ms/cycle); {sched:.0} bound + {unsched:.0} unschedulable attempts; decisions/s in cycles {:.0}; binds/s over bind window {:.0}; mean bind call {:.1} ms",
            1000.0 * cyc_sum / cyc_n.max(1.0),
            sched / cyc_sum.max(1e-9),
            bound_n as f64 / window,
            1000.0 * bind_sum / bind_n.max(1.0),
        );
    }
    // after the row's binds and metrics are read: probe pods that bind do not count
    let probe = match metrics_port {
        Some(port) if a.probe > 0 => probe_cycles(&creator, port, a.probe, scheduler_name).await,
        _ => String::new(),
    };
    if !probe.is_empty() {
        extra = format!("{extra}; {probe}");
    }
    extra = format!(
        "{extra}{}control-plane CPU s from end of creation to last bind: {}; kube-apiserver peak RSS {api_rss:.0} MiB; {:.1} s from contender start to last bind",
        if extra.is_empty() { "" } else { "; " },
        cp_cpu.join(", "),
        last_bind
            .map(|l| l.duration_since(started).as_secs_f64())
            .unwrap_or(f64::NAN),
    );
    let mut lat: Vec<f64> = pods
        .iter()
        .filter_map(|(name, _)| {
            let b = bound.get(name)?;
            let c = done.get(name)?;
            Some(b.saturating_duration_since(*c).as_secs_f64() * 1000.0)
        })
        .collect();
    lat.sort_by(|x, y| x.total_cmp(y));
    let throughput = match last_bind {
        Some(l) => bound_n as f64 / l.duration_since(t_create).as_secs_f64(),
        None => 0.0,
    };
    let drain_rate = match (first_bind, last_bind) {
        (Some(f), Some(l)) if bound_n > 1 => {
            (bound_n - 1) as f64 / l.duration_since(f.max(started)).as_secs_f64()
        }
        _ => 0.0,
    };
    running.stop().await;
    watch.abort();
    let load = loadavg();
    eprintln!(
        "[{who} qps={qps} {mix}] done in {:.0}s (load {load})",
        t_row.elapsed().as_secs_f64()
    );
    Row {
        contender: who.to_string(),
        qps: if qps > 0.0 {
            format!("{qps}/{}", (qps * 2.0) as u32)
        } else if who == "kube-scheduler" {
            "5000/10000".into()
        } else {
            "unthrottled".into()
        },
        mix: if a.queues > 0 {
            format!("{mix}, {} queues", a.queues)
        } else {
            mix.to_string()
        },
        nodes: nodes_n,
        pods: pods_n,
        bound: bound_n,
        create_rate: pods_n as f64 / create_secs,
        throughput,
        drain_rate,
        p50: pct(&lat, 0.5),
        p99: pct(&lat, 0.99),
        max: lat.last().copied().unwrap_or(f64::NAN),
        rss,
        cpu,
        extra,
        load,
    }
}

fn main() {
    let a = parse_args();
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        eprintln!("args: {a:?}; load {}", loadavg());
        let mut rows = Vec::new();
        for mix in &a.mixes {
            for qps in &a.qps {
                for who in &a.contenders {
                    let r = run_row(&a, who, *qps, mix).await;
                    print_rows(std::slice::from_ref(&r), rows.is_empty());
                    rows.push(r);
                }
            }
        }
        println!(
            "\n## all rows ({} mode)\n",
            if a.backlog { "backlog" } else { "stream" }
        );
        print_rows(&rows, true);
        println!();
        for r in &rows {
            if !r.extra.is_empty() {
                println!("- {} {} {}: {}", r.contender, r.qps, r.mix, r.extra);
            }
        }
    });
}

fn print_rows(rows: &[Row], header: bool) {
    if header {
        println!(
            "| contender | client QPS/burst | mix | nodes | pods | bound | create/s | pods/s (create→last bind) | bind-window pods/s | p50 ms | p99 ms | max ms | RSS peak/now MiB | CPU s | load |"
        );
        println!("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|");
    }
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
            r.contender,
            r.qps,
            r.mix,
            r.nodes,
            r.pods,
            r.bound,
            r.create_rate,
            r.throughput,
            r.drain_rate,
            r.p50,
            r.p99,
            r.max,
            r.rss
                .map(|(h, n)| format!("{h:.0}/{n:.0}"))
                .unwrap_or_else(|| "–".into()),
            r.cpu
                .map(|c| format!("{c:.1}"))
                .unwrap_or_else(|| "–".into()),
            r.load
        );
    }
}

//! Gangs of the real workload controllers: JobSet v0.12.0 and
//! LeaderWorkerSet v0.9.0, built from their Go modules (e2e/cluster/build),
//! with their webhooks served on loopback from a self-signed certificate,
//! their CRDs and webhook manifests from the same module versions, and
//! kube-controller-manager (Jobs, StatefulSets, garbage collection) on the
//! e2e control plane. For each kind: a workload that fits starts all its
//! pods; one that does not fit starts none; no gang is ever partly bound at
//! any poll; two queues share.

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, PostParams,
};
use kube::{Api, Client};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A process the test started; killed when dropped.
struct Proc {
    child: Child,
    name: String,
    log: PathBuf,
}

impl Proc {
    fn start(dir: &Path, name: &str, bin: &str, args: &[String]) -> Proc {
        let log = dir.join(format!("{name}.log"));
        let f = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(f.try_clone().unwrap())
            .stderr(f)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {bin}: {e} (run e2e/cluster/build)"));
        Proc {
            child,
            name: name.to_string(),
            log,
        }
    }

    /// Panics with its log's tail if it exited.
    fn check(&mut self) {
        if let Ok(Some(st)) = self.child.try_wait() {
            let text = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(30).collect();
            panic!(
                "{} exited ({st}):\n{}",
                self.name,
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            );
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `e2e/cluster/paths`: where each built binary is.
fn paths() -> BTreeMap<String, String> {
    let out = Command::new(repo_root().join("e2e/cluster/paths"))
        .output()
        .expect("running e2e/cluster/paths");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// kube-controller-manager with the controllers the workload controllers
/// build on: Jobs, StatefulSets, and garbage collection (deleting a
/// workload deletes its pods).
fn kube_controller_manager(c: &Cluster) -> Proc {
    let bin = paths()["GPUSCHED_E2E_KUBE_CONTROLLER_MANAGER_BIN"].clone();
    let kc = c.kubeconfig().display().to_string();
    let dir = c.dir.path();
    Proc::start(
        dir,
        "kube-controller-manager",
        &bin,
        &[
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()),
            format!("--cert-dir={}", dir.join("kcm-certs").display()),
            "--controllers=job-controller,statefulset-controller,garbage-collector-controller"
                .into(),
            "--use-service-account-credentials=false".into(),
            "--concurrent-job-syncs=5".into(),
        ],
    )
}

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    JobSet,
    Lws,
}

impl Kind {
    fn component(self) -> &'static str {
        match self {
            Kind::JobSet => "jobset",
            Kind::Lws => "lws",
        }
    }
    /// The label the controller's pod webhooks select on (their
    /// kustomize patch adds it as the objectSelector).
    fn pod_label(self) -> &'static str {
        match self {
            Kind::JobSet => "jobset.sigs.k8s.io/jobset-name",
            Kind::Lws => "leaderworkerset.sigs.k8s.io/name",
        }
    }
    fn config_api(self) -> &'static str {
        match self {
            Kind::JobSet => "config.jobset.x-k8s.io/v1alpha1",
            Kind::Lws => "config.lws.x-k8s.io/v1alpha1",
        }
    }
    /// CRD and webhook manifests under the module's `config/`.
    fn crd_dir(self) -> &'static str {
        match self {
            Kind::JobSet => "config/components/crd/bases",
            Kind::Lws => "config/crd/bases",
        }
    }
    fn webhooks(self) -> &'static str {
        match self {
            Kind::JobSet => "config/components/webhook/manifests.yaml",
            Kind::Lws => "config/webhook/manifests.yaml",
        }
    }
}

fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run e2e/cluster/build)", path.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

async fn create_dynamic(client: &Client, doc: &Value) {
    let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (
            String::new(),
            doc["apiVersion"].as_str().unwrap().to_string(),
        ),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, doc["kind"].as_str().unwrap());
    let ar = ApiResource::from_gvk(&gvk);
    let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    let api: Api<DynamicObject> = match obj.metadata.namespace.as_deref() {
        Some(n) => Api::namespaced_with(client.clone(), n, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("creating {} {}: {e}", gvk.kind, doc["metadata"]["name"]));
}

/// Starts the JobSet or LeaderWorkerSet controller: its CRDs, its webhook
/// server on loopback (a self-signed certificate for 127.0.0.1, the same
/// bytes as the webhook configurations' caBundle), its webhook
/// configurations from the module's manifests pointed at that server.
async fn workload_controller(c: &Cluster, kind: Kind) -> Proc {
    let comp = kind.component();
    let bin = paths()[&format!("GPUSCHED_E2E_{}_BIN", comp.to_uppercase())].clone();
    let home = Path::new(&bin).parent().unwrap().to_path_buf();
    let dir = c.dir.path();
    // CRDs
    let crds: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    let mut names = Vec::new();
    for e in std::fs::read_dir(home.join(kind.crd_dir())).unwrap() {
        let path = e.unwrap().path();
        for doc in yaml_docs(&path) {
            let crd: CustomResourceDefinition = serde_json::from_value(doc).unwrap();
            names.push(crd.metadata.name.clone().unwrap());
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
    }
    for name in names {
        wait_for(Duration::from_secs(30), || async {
            crds.get(&name)
                .await
                .ok()?
                .status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("CRD {name} not established"));
    }
    // serving certificate
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let certs = dir.join(format!("{comp}-certs"));
    std::fs::create_dir_all(&certs).unwrap();
    let pem = cert.cert.pem();
    std::fs::write(certs.join("tls.crt"), &pem).unwrap();
    std::fs::write(certs.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    let port = free_port();
    let probe = free_port();
    let config = dir.join(format!("{comp}-config.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: {}\nkind: Configuration\nleaderElection: {{leaderElect: false}}\n\
             internalCertManagement: {{enable: false}}\n\
             webhook: {{port: {port}, host: 127.0.0.1, certDir: {}}}\n\
             metrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{probe}\"}}\n",
            kind.config_api(),
            certs.display()
        ),
    )
    .unwrap();
    let kc = c.kubeconfig().display().to_string();
    let mut args = vec![
        format!("--kubeconfig={kc}"),
        format!("--config={}", config.display()),
    ];
    if kind == Kind::Lws {
        args.push("--leader-elect=false".into());
    }
    let mut p = Proc::start(dir, comp, &bin, &args);
    // webhook configurations, each webhook sent to the loopback server
    let ca = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes())).unwrap();
    for mut doc in yaml_docs(&home.join(kind.webhooks())) {
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        doc["metadata"] = json!({"name": format!("{comp}-{name}")});
        for w in doc["webhooks"].as_array_mut().unwrap() {
            let path = w["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap()
                .to_string();
            w["clientConfig"] =
                json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca});
            if path == "/mutate--v1-pod" || path == "/validate--v1-pod" {
                w["objectSelector"] =
                    json!({"matchExpressions": [{"key": kind.pod_label(), "operator": "Exists"}]});
            }
        }
        create_dynamic(&c.client, &doc).await;
    }
    // ready: the probe answers 200 once its webhook server listens
    let t0 = Instant::now();
    while !ready(probe) {
        p.check();
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{comp} not ready in 90 s; log {}",
            p.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p
}

/// Whether `GET /readyz` on the probe port answers 200.
fn ready(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /readyz HTTP/1.0\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200")
}

/// Creates a namespaced custom object, retrying while its webhook is not
/// answering yet.
async fn create_workload(client: &Client, ns: &str, doc: Value) {
    let mut doc = doc;
    doc["metadata"]["namespace"] = json!(ns);
    let t0 = Instant::now();
    loop {
        let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
        let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk));
        let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
        match api.create(&PostParams::default(), &obj).await {
            Ok(_) => return,
            Err(e) if t0.elapsed() < Duration::from_secs(30) => {
                eprintln!("retrying create: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => panic!("creating {}: {e}", doc["metadata"]["name"]),
        }
    }
}

async fn delete_workload(client: &Client, ns: &str, api_version: &str, kind: &str, name: &str) {
    let (group, version) = api_version.split_once('/').unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    api.delete(name, &DeleteParams::foreground()).await.unwrap();
}

fn gpu_container(gpus: u32) -> Value {
    json!({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": gpus.to_string()}, "requests": {"cpu": "100m"}}})
}

fn pod_template(gpus: u32) -> Value {
    json!({"spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
                    "restartPolicy": "Never", "containers": [gpu_container(gpus)]}})
}

/// A JobSet: `(name, replicas, parallelism, gpus per pod)` per replicated
/// job, in queue `queue` (the JobSet's label only: its pods inherit it).
fn jobset(name: &str, queue: &str, rjobs: &[(&str, u32, u32, u32)]) -> Value {
    let rj: Vec<Value> = rjobs
        .iter()
        .map(|&(n, replicas, par, gpus)| {
            json!({"name": n, "replicas": replicas, "template": {"spec": {
                "parallelism": par, "completions": par, "backoffLimit": 0,
                "template": pod_template(gpus)}}})
        })
        .collect();
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"replicatedJobs": rj, "network": {"enableDNSHostnames": false}}})
}

/// A LeaderWorkerSet: `replicas` groups of `size` pods of `gpus` GPUs.
fn lws(name: &str, queue: &str, replicas: u32, size: u32, gpus: u32) -> Value {
    let mut t = pod_template(gpus);
    t["spec"]["restartPolicy"] = json!("Always");
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, "workerTemplate": t}}})
}

/// The gang of a pod as the test knows it (JobSet name, or
/// LeaderWorkerSet name + group index).
fn gang_of(p: &Pod) -> Option<String> {
    let l = p.metadata.labels.as_ref()?;
    if let Some(j) = l.get("jobset.sigs.k8s.io/jobset-name") {
        return Some(j.clone());
    }
    Some(format!(
        "{}/{}",
        l.get("leaderworkerset.sigs.k8s.io/name")?,
        l.get("leaderworkerset.sigs.k8s.io/group-index")?
    ))
}

/// Bound and existing pods per gang, now.
async fn gangs(api: &Api<Pod>) -> BTreeMap<String, (usize, usize)> {
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for p in api.list(&ListParams::default()).await.unwrap().items {
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let Some(g) = gang_of(&p) else { continue };
        let e = out.entry(g).or_default();
        e.1 += 1;
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some() {
            e.0 += 1;
        }
    }
    out
}

/// How long a gang may be seen partly bound: its members' bindings are
/// separate API calls made in one cycle, so a poll can land between them;
/// a gang held partly bound is seen so for longer.
const BINDING_SPREAD: Duration = Duration::from_secs(3);

/// Polls until `done` holds of the gangs' (bound, existing) counts,
/// asserting at every poll that no gang is partly bound for longer than
/// [`BINDING_SPREAD`] and that none loses bound members while partly bound
/// (`size`: each gang's full size).
async fn poll_gangs(
    api: &Api<Pod>,
    size: &dyn Fn(&str) -> usize,
    secs: u64,
    what: &str,
    done: impl Fn(&BTreeMap<String, (usize, usize)>) -> bool,
) -> BTreeMap<String, (usize, usize)> {
    let t0 = Instant::now();
    let mut partial: BTreeMap<String, (Instant, usize)> = BTreeMap::new();
    loop {
        let g = gangs(api).await;
        for (name, &(b, _)) in &g {
            let n = size(name);
            if b == 0 || b == n {
                partial.remove(name);
                continue;
            }
            let (since, last) = partial.entry(name.clone()).or_insert((Instant::now(), b));
            assert!(
                b >= *last && since.elapsed() < BINDING_SPREAD,
                "gang {name} partly bound: {b} of {n} for {:?} ({g:?})",
                since.elapsed()
            );
            *last = b;
        }
        if done(&g) {
            return g;
        }
        assert!(t0.elapsed() < Duration::from_secs(secs), "{what}: {g:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn bound_of(g: &BTreeMap<String, (usize, usize)>, name: &str) -> usize {
    g.get(name).map_or(0, |x| x.0)
}

fn existing_of(g: &BTreeMap<String, (usize, usize)>, name: &str) -> usize {
    g.get(name).map_or(0, |x| x.1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn jobsets_start_whole_or_not_at_all_and_queues_share() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::JobSet).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    c.queue("b", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let sizes: BTreeMap<&str, usize> = [("fits", 4), ("toobig", 3)].into_iter().collect();
    let size = |n: &str| sizes.get(n).copied().unwrap_or(2);
    let s = c.scheduler(opts()).await;
    // 1 × 2 GPUs + 3 × 2 GPUs: all four pods start
    create_workload(
        &c.client,
        "ml",
        jobset("fits", "a", &[("leader", 1, 1, 2), ("workers", 3, 1, 2)]),
    )
    .await;
    poll_gangs(&pods, &size, 120, "fits starts whole", |g| {
        bound_of(g, "fits") == 4
    })
    .await;
    // 3 × 4 GPUs with 8 free: none starts, while its pods all exist
    create_workload(&c.client, "ml", jobset("toobig", "a", &[("w", 3, 1, 4)])).await;
    poll_gangs(&pods, &size, 60, "toobig's pods exist", |g| {
        existing_of(g, "toobig") == 3
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    poll_gangs(&pods, &size, 30, "toobig stays unbound", |g| {
        assert_eq!(bound_of(g, "toobig"), 0, "{g:?}");
        Instant::now() > until
    })
    .await;
    // the space frees: now it starts, whole
    delete_workload(
        &c.client,
        "ml",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "fits",
    )
    .await;
    poll_gangs(&pods, &size, 120, "toobig starts once fits is gone", |g| {
        bound_of(g, "toobig") == 3 && existing_of(g, "fits") == 0
    })
    .await;
    delete_workload(
        &c.client,
        "ml",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "toobig",
    )
    .await;
    poll_gangs(&pods, &size, 120, "all gone", |g| g.is_empty()).await;
    kcm.check();
    ctl.check();
    // two queues, four 4-GPU JobSets each, all pending before the scheduler
    // looks: each queue gets half of the 16 GPUs, in whole JobSets
    s.stop().await;
    for q in ["a", "b"] {
        for i in 0..4 {
            create_workload(
                &c.client,
                "ml",
                jobset(&format!("{q}{i}"), q, &[("w", 2, 1, 2)]),
            )
            .await;
        }
    }
    poll_gangs(&pods, &size, 120, "sixteen pods exist", |g| {
        g.values().map(|x| x.1).sum::<usize>() == 16
    })
    .await;
    let s = c.scheduler(opts()).await;
    let g = poll_gangs(&pods, &size, 120, "the cluster fills", |g| {
        g.values().map(|x| x.0).sum::<usize>() == 8
    })
    .await;
    let running = |q: char| {
        g.iter()
            .filter(|(n, x)| n.starts_with(q) && x.0 > 0)
            .count()
    };
    assert_eq!((running('a'), running('b')), (2, 2), "{g:?}");
    // and it stays so
    let until = Instant::now() + Duration::from_secs(5);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(g2.values().map(|x| x.0).sum::<usize>(), 8, "{g2:?}");
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn leader_worker_groups_start_whole_or_not_at_all_and_queues_share() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::Lws).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    c.queue("b", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let size = |n: &str| match n.split('/').next().unwrap_or("") {
        "serve" | "toobig" => 3,
        _ => 2,
    };
    let s = c.scheduler(opts()).await;
    // two groups of 3 × 2 GPUs: both start, whole
    create_workload(&c.client, "ml", lws("serve", "a", 2, 3, 2)).await;
    poll_gangs(&pods, &size, 120, "serve starts", |g| {
        bound_of(g, "serve/0") == 3 && bound_of(g, "serve/1") == 3
    })
    .await;
    // two groups of 2 × 2 GPUs with 4 free: exactly one starts (replicas are
    // independent gangs), the other starts none
    create_workload(&c.client, "ml", lws("pair", "a", 2, 2, 2)).await;
    let g = poll_gangs(&pods, &size, 120, "one pair group starts", |g| {
        existing_of(g, "pair/0") == 2
            && existing_of(g, "pair/1") == 2
            && bound_of(g, "pair/0") + bound_of(g, "pair/1") == 2
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(
        bound_of(&g2, "pair/0") + bound_of(&g2, "pair/1"),
        2,
        "{g:?} {g2:?}"
    );
    // a group that can never fit now: none of its pods starts
    create_workload(&c.client, "ml", lws("toobig", "a", 1, 3, 4)).await;
    poll_gangs(&pods, &size, 60, "toobig's pods exist", |g| {
        existing_of(g, "toobig/0") == 3
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    poll_gangs(&pods, &size, 30, "toobig stays unbound", |g| {
        assert_eq!(bound_of(g, "toobig/0"), 0, "{g:?}");
        Instant::now() > until
    })
    .await;
    for n in ["serve", "pair", "toobig"] {
        delete_workload(
            &c.client,
            "ml",
            "leaderworkerset.x-k8s.io/v1",
            "LeaderWorkerSet",
            n,
        )
        .await;
    }
    poll_gangs(&pods, &size, 120, "all gone", |g| g.is_empty()).await;
    kcm.check();
    ctl.check();
    // two queues, four groups of 2 × 2 GPUs each, all pending before the
    // scheduler looks: each queue gets half of the GPUs, in whole groups
    s.stop().await;
    create_workload(&c.client, "ml", lws("qa", "a", 4, 2, 2)).await;
    create_workload(&c.client, "ml", lws("qb", "b", 4, 2, 2)).await;
    poll_gangs(&pods, &size, 120, "sixteen pods exist", |g| {
        g.values().map(|x| x.1).sum::<usize>() == 16
    })
    .await;
    let s = c.scheduler(opts()).await;
    let g = poll_gangs(&pods, &size, 120, "the cluster fills", |g| {
        g.values().map(|x| x.0).sum::<usize>() == 16 / 2
    })
    .await;
    let running = |q: &str| {
        g.iter()
            .filter(|(n, x)| n.starts_with(q) && x.0 > 0)
            .count()
    };
    assert_eq!((running("qa/"), running("qb/")), (2, 2), "{g:?}");
    let until = Instant::now() + Duration::from_secs(5);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(g2.values().map(|x| x.0).sum::<usize>(), 8, "{g2:?}");
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

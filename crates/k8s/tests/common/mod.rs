//! The e2e harness: a real control plane (etcd + kube-apiserver + kwok,
//! started by `e2e/cluster/cluster`), fake GPU nodes from cluster files, and
//! gpusched schedulers running in-process against it.

#![allow(dead_code)]

mod chart;
pub mod controllers;
mod pods;

pub use chart::*;
pub use pods::*;

use gpusched_k8s::controller::{self, Options};
use gpusched_k8s::crd::{PodGroup, Queue};
use gpusched_k8s::decision::{ANNOTATION_DECISION, GpuDecision};
use gpusched_k8s::kwok::node_object;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, CustomResourceExt};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Two 8-GPU H100 nodes on NVSwitch, the cluster most e2e tests use.
pub const H100: &str = "nodes:
  - name: h100
    count: 2
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}
";

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// A running control plane in its own directory.
pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub env: BTreeMap<String, String>,
    pub client: Client,
}

fn script() -> PathBuf {
    repo_root().join("e2e/cluster/cluster")
}

/// Starts the control plane in `dir`. The script picks free ports at
/// random, but a test running beside this one may take a port between the
/// pick and the listen: a start that failed on "address already in use" is
/// tried again with fresh ports (and a fresh etcd data dir), up to 3 times.
fn up_in(dir: &Path, extra: &[String]) -> BTreeMap<String, String> {
    let mut attempt = 1;
    let out = loop {
        let out = Command::new(script())
            .arg("up")
            .arg(dir)
            .args(extra)
            .output()
            .expect("running e2e/cluster/cluster (build the control plane first: e2e/run)");
        let stderr = String::from_utf8_lossy(&out.stderr);
        if out.status.success() || attempt == 3 || !stderr.contains("address already in use") {
            break out;
        }
        eprintln!("cluster up: a port was taken meanwhile (attempt {attempt}); again");
        let _ = std::fs::remove_dir_all(dir.join("etcd-data"));
        attempt += 1;
    };
    assert!(
        out.status.success(),
        "cluster up failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub async fn client_for(kubeconfig: &str) -> Client {
    gpusched_k8s::client::client(Some(Path::new(kubeconfig)))
        .await
        .unwrap()
}

impl Cluster {
    /// Starts a fresh control plane and installs our CRDs.
    pub async fn up() -> Cluster {
        Cluster::up_with(&[]).await
    }

    /// [`Cluster::up`] with kube-scheduler v1.37.2 running beside
    /// (default configuration; it schedules `default-scheduler` pods only).
    pub async fn up_with_kube_scheduler() -> Cluster {
        Cluster::up_with(&["--with-kube-scheduler".to_string()]).await
    }

    async fn up_with(extra: &[String]) -> Cluster {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
            )
            .with_test_writer()
            .try_init();
        let dir = tempfile::Builder::new()
            .prefix("gpusched-e2e-")
            .tempdir()
            .unwrap();
        let env = up_in(dir.path(), extra);
        let client = client_for(&env["GPUSCHED_E2E_KUBECONFIG"]).await;
        let c = Cluster { dir, env, client };
        c.install_crds().await;
        c.install_chart_rbac().await;
        let ns: Api<Namespace> = Api::all(c.client.clone());
        for n in ["ml", "other"] {
            ns.create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": n}})).unwrap(),
            )
            .await
            .unwrap();
        }
        c
    }

    pub fn kubeconfig(&self) -> PathBuf {
        PathBuf::from(&self.env["GPUSCHED_E2E_KUBECONFIG"])
    }

    async fn install_crds(&self) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let mut crds = gpusched_k8s::crd::crds();
        crds.push(gpusched_k8s::crd::SpPodGroup::crd());
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap();
            // (409: a create the client retried after a slow first answer)
            match api.create(&PostParams::default(), &crd).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("creating CRD {name}: {e}"),
            }
            wait_for(Duration::from_secs(30), || async {
                let c = api.get(&name).await.ok()?;
                c.status?
                    .conditions?
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True")
                    .then_some(())
            })
            .await
            .unwrap_or_else(|| panic!("CRD {name} not established"));
        }
    }

    /// Installs what the chart grants the scheduler, from the rendered
    /// manifests (deploy/gpusched.yaml): its namespace, ServiceAccount,
    /// ClusterRole, lease Role and their bindings. Every e2e scheduler runs
    /// under that ServiceAccount ([`Cluster::scheduler_client`]), so the
    /// installed permissions are the tested ones.
    async fn install_chart_rbac(&self) {
        let ns: Api<Namespace> = Api::all(self.client.clone());
        create_obj(&ns, json!({"metadata": {"name": CHART_NAMESPACE}})).await;
        self.install_chart_docs(&[
            ("ServiceAccount", "gpusched-scheduler"),
            ("ClusterRole", "gpusched-scheduler"),
            ("ClusterRoleBinding", "gpusched-scheduler"),
            ("Role", "gpusched-scheduler-lease"),
            ("RoleBinding", "gpusched-scheduler-lease"),
        ])
        .await;
    }

    /// Creates these `(kind, name)` documents of the rendered chart.
    pub async fn install_chart_docs(&self, wanted: &[(&str, &str)]) {
        self.install_docs(&chart_docs(), wanted).await;
    }

    /// Creates these `(kind, name)` documents of `docs` (a rendering of
    /// the chart).
    pub async fn install_docs(&self, docs: &[Value], wanted: &[(&str, &str)]) {
        for &(kind, name) in wanted {
            let doc = docs
                .iter()
                .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("deploy/gpusched.yaml has no {kind} {name}"));
            let (group, version) = match doc["apiVersion"].as_str().unwrap().split_once('/') {
                Some((g, v)) => (g.to_string(), v.to_string()),
                None => (
                    String::new(),
                    doc["apiVersion"].as_str().unwrap().to_string(),
                ),
            };
            let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
            let ar = kube::api::ApiResource::from_gvk(&gvk);
            let obj: kube::api::DynamicObject = serde_json::from_value(doc.clone()).unwrap();
            let api: Api<kube::api::DynamicObject> = match obj.metadata.namespace.as_deref() {
                Some(n) => Api::namespaced_with(self.client.clone(), n, &ar),
                None => Api::all_with(self.client.clone(), &ar),
            };
            api.create(&PostParams::default(), &obj)
                .await
                .unwrap_or_else(|e| panic!("creating {kind} {name}: {e}"));
        }
    }

    /// A client with a token of the chart's scheduler ServiceAccount.
    pub async fn scheduler_client(&self) -> Client {
        use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
        use k8s_openapi::api::core::v1::ServiceAccount;
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), CHART_NAMESPACE);
        let tr = TokenRequest {
            spec: Some(TokenRequestSpec {
                expiration_seconds: Some(3600 * 4),
                ..Default::default()
            }),
            ..Default::default()
        };
        let token = api
            .create_token_request("gpusched-scheduler", &PostParams::default(), &tr)
            .await
            .unwrap()
            .status
            .and_then(|s| s.token)
            .expect("a token for gpusched-scheduler");
        let kc = kube::config::Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let mut cfg =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .unwrap();
        cfg.auth_info = kube::config::AuthInfo {
            token: Some(token.into()),
            ..Default::default()
        };
        Client::try_from(cfg).unwrap()
    }

    /// Stops the control plane (etcd data and certificates stay in `dir`).
    pub fn stop(&self) {
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .output();
    }

    /// Starts it again on the same ports and data.
    pub fn start_again(&self) {
        let port = self.env["GPUSCHED_E2E_APISERVER"]
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        let etcd = self.env["GPUSCHED_E2E_ETCD"]
            .rsplit(':')
            .next()
            .unwrap()
            .to_string();
        up_in(
            self.dir.path(),
            &["--port".into(), port, "--etcd-port".into(), etcd],
        );
    }

    /// Creates kwok nodes for a cluster file of the simulator's vocabulary.
    pub async fn nodes_from_yaml(&self, yaml: &str) -> Vec<String> {
        let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(yaml).unwrap();
        let api: Api<Node> = Api::all(self.client.clone());
        let mut names = Vec::new();
        for b in spec.build().unwrap() {
            api.create(&PostParams::default(), &node_object(&b.node))
                .await
                .unwrap();
            names.push(b.node.name.clone());
        }
        // wait for kwok to mark them Ready
        let n = names.len();
        wait_for(Duration::from_secs(60), || async {
            let l = api.list(&ListParams::default()).await.ok()?;
            let ready = l
                .items
                .iter()
                .filter(|n| gpusched_k8s::translate::node_ready(n))
                .count();
            (ready >= n).then_some(())
        })
        .await
        .expect("kwok did not make the nodes Ready");
        names
    }

    /// Creates the gpusched Queue `name` with `spec`.
    pub async fn queue(&self, name: &str, spec: Value) -> Queue {
        let api: Api<Queue> = Api::all(self.client.clone());
        create_obj(
            &api,
            json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
                   "metadata": {"name": name}, "spec": spec}),
        )
        .await
    }

    /// Creates the gpusched PodGroup `ns/name` with `spec`.
    pub async fn group(&self, ns: &str, name: &str, spec: Value) -> PodGroup {
        let api: Api<PodGroup> = Api::namespaced(self.client.clone(), ns);
        create_obj(
            &api,
            json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
                   "metadata": {"name": name}, "spec": spec}),
        )
        .await
    }

    pub fn pods(&self, ns: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// Starts a scheduler in-process under the chart's ServiceAccount;
    /// returns a handle that stops it.
    pub async fn scheduler(&self, opts: Options) -> RunningScheduler {
        let client = self.scheduler_client().await;
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            controller::run_with_client(client, opts, async {
                let _ = rx.await;
            })
            .await
        });
        RunningScheduler {
            stop: Some(tx),
            task,
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // The test is over and its data goes with the temporary directory:
        // no graceful stop (SIGTERM and a wait per process, 6–8 s a test,
        // ≈ 4 minutes of an e2e run), SIGKILL at once.
        let _ = Command::new(script())
            .arg("down")
            .arg(self.dir.path())
            .env("GPUSCHED_E2E_STOP_TIMEOUT", "0")
            .output();
    }
}

pub struct RunningScheduler {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<anyhow::Result<()>>,
}

impl RunningScheduler {
    /// Clean shutdown.
    pub async fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(30), &mut self.task).await;
    }

    /// Kills it abruptly (a crash).
    pub fn kill(self) {
        self.task.abort();
    }
}

/// The scheduler's options as the chart's Deployment sets them (its
/// flags, read from the rendered manifest), except what a test process
/// must change: no HTTP server unless the test asks for one (tests run in
/// parallel; the chart's port would collide) and a faster loop (debounce
/// 10 ms, a cycle at least every 500 ms). A flag the chart adds must be
/// mapped here, or every e2e test fails naming it.
pub fn opts() -> Options {
    let mut o = Options {
        debounce: Duration::from_millis(10),
        period: Duration::from_millis(500),
        ..Default::default()
    };
    let args = chart_scheduler_args();
    assert_eq!(
        args.first().map(String::as_str),
        Some("scheduler"),
        "{args:?}"
    );
    let mut leader_elect = false;
    let mut lease_name = "gpusched".to_string();
    let (mut cert, mut key) = (None, None);
    for a in &args[1..] {
        let (flag, value) = a.split_once('=').unwrap_or((a.as_str(), ""));
        match flag {
            "--leader-elect" => leader_elect = value.is_empty() || value == "true",
            "--lease-name" => lease_name = value.to_string(),
            "--lease-namespace" => o.lease_namespace = value.to_string(),
            "--http-addr" => {} // see above
            "--http-auth" => o.http_auth = value.parse().unwrap(),
            "--tls-cert-file" => cert = Some(value.into()),
            "--tls-private-key-file" => key = Some(value.into()),
            "--log-format" => {} // the test's own subscriber logs
            "--kube-api-qps" => o.exec.qps = value.parse().unwrap(),
            "--kube-api-burst" => o.exec.burst = value.parse().unwrap(),
            "--provisioning-requests" => {
                o.provisioning = Some(gpusched_k8s::provreq::Config {
                    class: value.to_string(),
                    ..o.provisioning.take().unwrap_or_default()
                })
            }
            "--provisioning-retry-seconds" | "--provisioning-max-retry-seconds" => {} // defaults
            "--dra-gpu-driver" => o
                .dra_gpu_drivers
                .extend(value.split(',').map(str::to_string)),
            "--scheduler-name" => o
                .scheduler_names
                .extend(value.split(',').map(str::to_string)),
            other => panic!(
                "the chart's scheduler runs with {other}: map it in crates/k8s/tests/common/mod.rs opts()"
            ),
        }
    }
    if leader_elect {
        o.lease_name = Some(lease_name);
    }
    // the chart's TLS: a self-signed certificate for delegated auth (the
    // chart's Secret paths exist only in its pod)
    o.tls = gpusched_k8s::tls::Tls::from_flags(o.http_auth, cert, key, vec![]).unwrap();
    if matches!(o.tls, gpusched_k8s::tls::Tls::Files { .. }) {
        o.tls = gpusched_k8s::tls::Tls::SelfSigned(vec![]);
    }
    o
}

/// The debug endpoint of a scheduler run with `o` on `addr`, as `gpusched
/// explain --endpoint` reaches it (its self-signed certificate unverified).
pub fn debug_target(
    o: &Options,
    addr: std::net::SocketAddr,
    token: Option<&str>,
) -> gpusched_k8s::tools::debug_client::Target {
    let scheme = if o.tls == gpusched_k8s::tls::Tls::Off {
        "http"
    } else {
        "https"
    };
    gpusched_k8s::tools::debug_client::Target::Endpoint {
        url: format!("{scheme}://{addr}"),
        token: token.map(str::to_string),
        ca: None,
        insecure: true,
    }
}

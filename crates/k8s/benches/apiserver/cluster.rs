//! The control plane of one row: etcd + kube-apiserver + kwok from
//! `e2e/cluster/cluster`, the CRDs, the kwok nodes; finding the binaries.

use super::*;

/// `--gpusched-bin`: a relative path is taken from where the command was
/// typed if it exists there, else from the repository root (cargo runs a
/// bench in its crate's directory, where `target/release/gpusched` is not);
/// a path found nowhere stops the bench naming both places.
pub(crate) fn resolve_bin(v: &str) -> PathBuf {
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

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

pub(crate) struct Cluster {
    pub(crate) dir: TmpDir,
    pub(crate) env: HashMap<String, String>,
    pub(crate) client: Client,
    pub(crate) keep: bool,
}

impl Cluster {
    pub(crate) async fn up(keep: bool) -> Cluster {
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

    pub(crate) fn kubeconfig(&self) -> String {
        self.env["GPUSCHED_E2E_KUBECONFIG"].clone()
    }

    pub(crate) fn pid(&self, component: &str) -> Option<u32> {
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

pub(crate) struct TmpDir(pub(crate) PathBuf);

impl TmpDir {
    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

/// An admin client from the cluster's kubeconfig. kube-rs has no
/// client-side rate limit, so this client is unthrottled.
pub(crate) async fn client_for(kubeconfig: &str) -> Client {
    gpusched_k8s::client::client(Some(Path::new(kubeconfig)))
        .await
        .unwrap()
}

pub(crate) async fn install_crds(client: &Client) {
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

/// Creates `n` kwok nodes with 8 H100 GPUs each (the bench's nodes,
/// `gpu-0`…); returns their names and the seconds to create them and to see
/// them all Ready.
pub(crate) async fn make_nodes(client: &Client, n: usize) -> (Vec<String>, f64, f64) {
    make_node_group(client, "gpu", n, "").await
}

/// `n` kwok nodes of the bench's one shape (8 H100, 256 CPUs, 2 TiB) named
/// `name-0`… (`name` alone when `n` is 1); `extra`: more fields of the
/// cluster file's node group (`labels`, `taints`), each line indented as one.
/// Returns their names and the seconds to create them and to see them all
/// Ready.
pub(crate) async fn make_node_group(
    client: &Client,
    name: &str,
    n: usize,
    extra: &str,
) -> (Vec<String>, f64, f64) {
    let yaml = format!(
        "nodes:\n  - name: {name}\n    count: {n}\n    cpu: \"256\"\n    memory: 2Ti\n    gpus: {{count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}\n{extra}"
    );
    let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
    let nodes: Vec<_> = spec.build().unwrap().into_iter().map(|b| b.node).collect();
    let names: Vec<String> = nodes.iter().map(|n| n.name.clone()).collect();
    let ours: std::collections::HashSet<&str> = names.iter().map(|s| s.as_str()).collect();
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
            .filter(|n| n.metadata.name.as_deref().is_some_and(|m| ours.contains(m)))
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

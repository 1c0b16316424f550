//! Real controllers beside the e2e control plane: processes the test
//! starts (kube-controller-manager, the workload controllers built by
//! e2e/cluster/build), their manifests, and polling workloads' gangs.

use super::{Cluster, repo_root, wait_for};
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

/// Which gang a pod belongs to, as a test knows it from the pod's labels.
pub type GangOf = &'static (dyn Fn(&Pod) -> Option<String> + Sync);

/// Installs every CRD in these YAML files and waits until each is
/// established and every served version is in discovery: an upstream
/// controller started before discovery lists its kinds can fail at once
/// (kubeflow trainer: "setting index on runtimeClass for TrainingRuntime"
/// under load, when Established came before discovery).
pub async fn install_crds(client: &Client, files: &[PathBuf]) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    // (group/version, plural) of every served version
    let mut served: Vec<(String, String)> = Vec::new();
    for path in files {
        for doc in yaml_docs(path) {
            if doc["kind"] != "CustomResourceDefinition" {
                continue;
            }
            let crd: CustomResourceDefinition = serde_json::from_value(doc).unwrap();
            names.push(crd.metadata.name.clone().unwrap());
            for v in crd.spec.versions.iter().filter(|v| v.served) {
                served.push((
                    format!("{}/{}", crd.spec.group, v.name),
                    crd.spec.names.plural.clone(),
                ));
            }
            crds.create(&PostParams::default(), &crd).await.unwrap();
        }
    }
    for (gv, plural) in &served {
        wait_for(Duration::from_secs(30), || async {
            client
                .list_api_group_resources(gv)
                .await
                .ok()?
                .resources
                .iter()
                .any(|r| &r.name == plural)
                .then_some(())
        })
        .await
        .unwrap_or_else(|| panic!("{plural} ({gv}) not in discovery"));
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
}

/// A process the test started; killed when dropped.
pub struct Proc {
    pub child: Child,
    pub name: String,
    pub log: PathBuf,
}

impl Proc {
    pub fn start(dir: &Path, name: &str, bin: &str, args: &[String]) -> Proc {
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
    pub fn check(&mut self) {
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
pub fn paths() -> BTreeMap<String, String> {
    let out = Command::new(repo_root().join("e2e/cluster/paths"))
        .output()
        .expect("running e2e/cluster/paths");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// kube-controller-manager with the controllers the workload controllers
/// build on: Jobs, StatefulSets, and garbage collection (deleting a
/// workload deletes its pods).
pub fn kube_controller_manager(c: &Cluster) -> Proc {
    kube_controller_manager_with(
        c,
        "job-controller,statefulset-controller,garbage-collector-controller",
    )
}

/// kube-controller-manager with only `controllers` (comma-separated;
/// `persistentvolume-binder-controller` is the PV controller that binds
/// PersistentVolumeClaims).
pub fn kube_controller_manager_with(c: &Cluster, controllers: &str) -> Proc {
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
            format!("--controllers={controllers}"),
            "--use-service-account-credentials=false".into(),
            "--concurrent-job-syncs=5".into(),
        ],
    )
}

pub fn yaml_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e} (run e2e/cluster/build)", path.display()));
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

pub async fn create_dynamic(client: &Client, doc: &Value) {
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
/// Waits until `p`'s probe port answers `/readyz` with 200 (panics with
/// its log's tail if it exits, or after `secs`).
pub async fn until_ready(p: &mut Proc, probe: u16, secs: u64) {
    let t0 = Instant::now();
    while !ready(probe) {
        p.check();
        assert!(
            t0.elapsed() < Duration::from_secs(secs),
            "{} not ready in {secs} s; log {}",
            p.name,
            p.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes a self-signed serving certificate for 127.0.0.1 (`tls.crt`,
/// `tls.key`) into `dir` for a controller's loopback webhook server;
/// returns the certificate's PEM (the webhook configurations' caBundle).
pub fn loopback_serving_cert(dir: &Path) -> String {
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    std::fs::create_dir_all(dir).unwrap();
    let pem = cert.cert.pem();
    std::fs::write(dir.join("tls.crt"), &pem).unwrap();
    std::fs::write(dir.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
    pem
}

/// Whether `GET /readyz` on the probe port answers 200.
pub fn ready(port: u16) -> bool {
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
pub async fn create_workload(client: &Client, ns: &str, doc: Value) {
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

pub async fn delete_workload(client: &Client, ns: &str, api_version: &str, kind: &str, name: &str) {
    let (group, version) = api_version.split_once('/').unwrap();
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
    api.delete(name, &DeleteParams::foreground()).await.unwrap();
}

/// Bound and existing pods per gang, now (pods that are terminating or
/// finished are left out).
pub async fn gangs(api: &Api<Pod>, gang_of: GangOf) -> BTreeMap<String, (usize, usize)> {
    let mut out: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for p in api.list(&ListParams::default()).await.unwrap().items {
        // a terminating or finished pod is no longer a member (a failed
        // member's replacement is)
        let finished = matches!(
            p.status.as_ref().and_then(|s| s.phase.as_deref()),
            Some("Failed" | "Succeeded")
        );
        if p.metadata.deletion_timestamp.is_some() || finished {
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
pub const BINDING_SPREAD: Duration = Duration::from_secs(3);

/// Polls until `done` holds of the gangs' (bound, existing) counts,
/// asserting at every poll that no gang with all its members present is
/// partly bound for longer than [`BINDING_SPREAD`], and that none loses
/// bound members while partly bound (`size`: each gang's full size). A gang
/// with members missing is going away (its workload deleted, members
/// terminating) or replacing a lost member beside its running ones: not a
/// partial start.
pub async fn poll_gangs_by(
    api: &Api<Pod>,
    gang_of: GangOf,
    size: &dyn Fn(&str) -> usize,
    secs: u64,
    what: &str,
    done: impl Fn(&BTreeMap<String, (usize, usize)>) -> bool,
) -> BTreeMap<String, (usize, usize)> {
    let t0 = Instant::now();
    let mut partial: BTreeMap<String, (Instant, usize)> = BTreeMap::new();
    loop {
        let g = gangs(api, gang_of).await;
        for (name, &(b, e)) in &g {
            let n = size(name);
            if b == 0 || b == n || e < n {
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

pub fn bound_of(g: &BTreeMap<String, (usize, usize)>, name: &str) -> usize {
    g.get(name).map_or(0, |x| x.0)
}

pub fn existing_of(g: &BTreeMap<String, (usize, usize)>, name: &str) -> usize {
    g.get(name).map_or(0, |x| x.1)
}

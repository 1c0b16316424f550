//! The DRA mode end to end on a **real kubelet** (v1.37.2,
//! `e2e/cluster/kubelet`, fake CRI runtime recording every container's
//! config) and a real kube-apiserver: `gpusched-node-agent --mode dra` (a
//! separate process, fake backend, 4 H100s) registers on the kubelet's
//! plugin registry and publishes the node's ResourceSlice; a claim the test
//! allocates by hand (status.allocation + reservedFor, as a scheduler
//! would) and a pod bound to the node run, and the container's CDI devices
//! are exactly the allocated GPUs; a claim allocated on another node's pool
//! fails to prepare with the agent's error in the pod's events; the agent
//! restarts without losing what it prepared, and deleting the pod
//! unprepares it. Then the whole path: gpusched's scheduler allocates the
//! claims (a template with `matchAttribute`, a shared claim, a pod waiting
//! for freed devices) and the kubelet prepares exactly those GPUs.
//!
//! The agent runs as the chart installs it in DRA mode (`helm template
//! --set agent.mode=dra`): its ServiceAccount (a token bound to a pod on the
//! node), ClusterRole, the admission policy limiting it to its own node's
//! ResourceSlice, and the chart's DeviceClass.
//!
//! Needs root (the kubelet runs in a private mount namespace) and the
//! binaries of `e2e/cluster/build`; run by `e2e/run`.
//! `GPUSCHED_E2E_KEEP=1` keeps the node's directory.

#[path = "../../k8s/tests/common/mod.rs"]
mod k8s;

use gpusched_model::dra;
use k8s::{Cluster, wait_for};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const NODE: &str = "kdra";
const NS: &str = "ml";
const DRIVER: &str = "gpu.gpusched.io";

fn node_yaml() -> String {
    format!(
        "nodes:\n  - name: {NODE}\n    cpu: \"64\"\n    memory: 512Gi\n    gpus:\n      count: 4\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      numa_nodes: 2\n"
    )
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

struct RealNode {
    dir: tempfile::TempDir,
    env: BTreeMap<String, String>,
    node_file: PathBuf,
    kubeconfig: PathBuf,
    agent: Option<Child>,
    starts: u32,
}

impl RealNode {
    async fn up(c: &Cluster) -> RealNode {
        // (short path: unix socket paths are limited to 108 bytes)
        let dir = tempfile::Builder::new()
            .prefix("gpusched-dra-")
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
        std::fs::write(&node_file, node_yaml()).unwrap();
        std::fs::write(dir.path().join("control"), "").unwrap();
        // What the chart installs for the agent in DRA mode (helm template
        // --set agent.mode=dra): its ServiceAccount and RBAC, the admission
        // policy that keeps it to its own node's slice, the DeviceClass.
        let docs = k8s::chart_docs_with(&["agent.mode=dra"]);
        c.install_docs(
            &docs,
            &[
                ("ServiceAccount", "gpusched-agent"),
                ("ClusterRole", "gpusched-agent"),
                ("ClusterRoleBinding", "gpusched-agent"),
                ("ValidatingAdmissionPolicy", "gpusched-agent-own-slice"),
                (
                    "ValidatingAdmissionPolicyBinding",
                    "gpusched-agent-own-slice",
                ),
                ("DeviceClass", dra::DEVICE_CLASS),
            ],
        )
        .await;
        // The DaemonSet's pod on this node (its ServiceAccount): the agent
        // runs as a process here with a token bound to that pod, so it
        // carries the node's name as a DaemonSet pod's token does.
        let ds = docs
            .iter()
            .find(|d| d["kind"] == "DaemonSet" && d["metadata"]["name"] == "gpusched-agent")
            .expect("the chart has the agent DaemonSet");
        let args = ds["spec"]["template"]["spec"]["containers"][0]["args"].to_string();
        assert!(args.contains("--mode=dra"), "{args}");
        let t = &ds["spec"]["template"];
        let pods: Api<Pod> = Api::namespaced(c.client.clone(), k8s::CHART_NAMESPACE);
        let agent_pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": format!("gpusched-agent-{NODE}"),
                "labels": t["metadata"]["labels"]},
            "spec": {"nodeName": NODE,
                "serviceAccountName": t["spec"]["serviceAccountName"],
                "priorityClassName": t["spec"]["priorityClassName"],
                "containers": [{"name": "agent",
                    "image": t["spec"]["containers"][0]["image"]}]}}))
        .unwrap();
        let agent_pod = pods
            .create(&PostParams::default(), &agent_pod)
            .await
            .unwrap();
        let kubeconfig = dir.path().join("agent.kubeconfig");
        k8s::write_token_kubeconfig(c, "gpusched-agent", &agent_pod, &kubeconfig).await;
        let mut n = RealNode {
            dir,
            env,
            node_file,
            kubeconfig,
            agent: None,
            starts: 0,
        };
        n.start_agent();
        n
    }

    fn kdir(&self) -> PathBuf {
        PathBuf::from(&self.env["GPUSCHED_KUBELET_DIR"])
    }

    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    fn plugin_dir(&self) -> PathBuf {
        self.kdir().join("root/plugins").join(DRIVER)
    }

    fn start_agent(&mut self) {
        assert!(self.agent.is_none());
        self.starts += 1;
        let log = std::fs::File::create(self.dir.path().join(format!("agent-{}.log", self.starts)))
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_gpusched-node-agent"))
            .args(["--mode", "dra", "--backend", "fake", "--node-name", NODE])
            .arg("--node-file")
            .arg(&self.node_file)
            .arg("--control-file")
            .arg(self.dir.path().join("control"))
            .arg("--dra-registry-dir")
            .arg(self.kdir().join("root/plugins_registry"))
            .arg("--dra-plugin-dir")
            .arg(self.plugin_dir())
            .arg("--dra-kubelet-plugin-dir")
            .arg(format!("/var/lib/kubelet/plugins/{DRIVER}"))
            .arg("--cdi-dir")
            .arg(self.cdi_dir())
            .args(["--dra-slice-resync", "1s"])
            .args([
                "--pass-device-specs",
                "--metrics-address",
                "",
                "--feature-file",
                "",
            ])
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting gpusched-node-agent");
        self.agent = Some(child);
    }

    fn stop_agent(&mut self) {
        if let Some(mut ch) = self.agent.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &ch.id().to_string()])
                .status();
            let _ = ch.wait();
        }
    }

    fn logs(&self) -> String {
        let agent =
            std::fs::read_to_string(self.dir.path().join(format!("agent-{}.log", self.starts)))
                .unwrap_or_default();
        let k = std::fs::read_to_string(self.kdir().join("kubelet.log")).unwrap_or_default();
        let tail: Vec<&str> = k
            .lines()
            .filter(|l| l.contains("dra") || l.contains("DRA") || l.contains("claim"))
            .collect();
        let tail = &tail[tail.len().saturating_sub(40)..];
        format!(
            "---- agent log ----\n{agent}\n---- kubelet log (DRA lines, last 40) ----\n{}",
            tail.join("\n")
        )
    }

    fn uuid(&self, index: u32) -> String {
        gpusched_node_agent::backend::fake::FakeBackend::from_file(&self.node_file, None)
            .unwrap()
            .inventory_ref()
            .gpus
            .iter()
            .find(|g| g.index == index)
            .unwrap()
            .uuid
            .clone()
    }

    /// The CDI device names the runtime was given for (pod uid, container).
    fn cdi_devices(&self, pod_uid: &str, container: &str) -> Option<Vec<String>> {
        let dir = Path::new(&self.env["GPUSCHED_KUBELET_RECORDS"]);
        let mut best: Option<(u64, Vec<String>)> = None;
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_none_or(|x| x != "json") {
                continue;
            }
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            if v["pod"]["uid"] != pod_uid || v["config"]["metadata"]["name"] != container {
                continue;
            }
            let attempt = v["config"]["metadata"]["attempt"].as_u64().unwrap_or(0);
            let cfg = &v["config"];
            let list = cfg.get("CDIDevices").or_else(|| cfg.get("cdiDevices"));
            let mut names: Vec<String> = list
                .and_then(|l| l.as_array())
                .into_iter()
                .flatten()
                .filter_map(|d| d["name"].as_str().map(String::from))
                .collect();
            names.sort();
            if best.as_ref().is_none_or(|(a, _)| *a <= attempt) {
                best = Some((attempt, names));
            }
        }
        best.map(|(_, n)| n)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.stop_agent();
        if std::env::var_os("GPUSCHED_E2E_KEEP").is_some() {
            self.dir.disable_cleanup(true);
            eprintln!("kept {}", self.dir.path().display());
        }
        let _ = Command::new(kubelet_script())
            .args(["down", self.kdir().to_str().unwrap()])
            .output();
    }
}

fn claim_spec(name: &str, count: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}}]}}})
}

/// A pod (not scheduled: no scheduler runs) with a container using claim
/// `claim` and one without.
fn pod_spec(name: &str, claim: &str) -> Value {
    json!({"metadata": {"name": name, "namespace": NS},
        "spec": {"schedulerName": "nobody",
            "resourceClaims": [{"name": "gpus", "resourceClaimName": claim}],
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"claims": [{"name": "gpus"}]}},
                {"name": "side", "image": "registry.k8s.io/pause:3.10"}]}})
}

/// Allocates `devices` of pool `pool` to the claim for `pod` (what a
/// scheduler writes before binding), then binds the pod to the node.
async fn allocate_and_bind(c: &Cluster, claim: &str, pool: &str, devices: &[&str], pod: &Pod) {
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let results: Vec<Value> = devices
        .iter()
        .map(|d| json!({"request": "gpus", "driver": DRIVER, "pool": pool, "device": d}))
        .collect();
    let status = json!({"status": {
        "allocation": {
            "devices": {"results": results},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
        "reservedFor": [{"resource": "pods",
            "name": pod.metadata.name, "uid": pod.metadata.uid}]}});
    claims
        .patch_status(claim, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap_or_else(|e| panic!("allocating claim {claim}: {e}"));
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let name = pod.metadata.name.clone().unwrap();
    let binding = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": name, "namespace": NS},
        "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}});
    let _: Value = pods
        .create_subresource("binding", &name, &PostParams::default(), &binding)
        .await
        .unwrap_or_else(|e| panic!("binding pod {name}: {e}"));
}

/// The node's ResourceSlice once the agent has published its 4 GPUs and
/// the slice is owned by the Node (a slice published before the kubelet
/// registered the Node is written again with its owner).
async fn published_slice(c: &Cluster, n: &RealNode) -> ResourceSlice {
    let slices: Api<ResourceSlice> = Api::all(c.client.clone());
    let slice_name = format!("{NODE}-{DRIVER}");
    wait_for(Duration::from_secs(60), || async {
        let s = slices.get_opt(&slice_name).await.ok()??;
        let owned = s
            .metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.kind == "Node" && o.name == NODE);
        (s.spec.devices.as_ref()?.len() == 4 && owned).then_some(s)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "no ResourceSlice {slice_name} with 4 devices, owned by the Node\n{}",
            n.logs()
        )
    })
}

fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn a_claimed_pod_runs_on_a_real_kubelet_with_exactly_its_gpus() {
    let c = Cluster::up().await;
    let mut n = RealNode::up(&c).await;

    // The agent registers and publishes the node's slice (again after the
    // kubelet wipes the node's slices at its start).
    let slices: Api<ResourceSlice> = Api::all(c.client.clone());
    let slice_name = format!("{NODE}-{DRIVER}");
    let s = published_slice(&c, &n).await;
    assert_eq!(s.spec.driver, DRIVER);
    // With the agent's own credentials, a slice offering devices on
    // another node is refused by the chart's admission policy.
    let as_agent = k8s::client_for(n.kubeconfig.to_str().unwrap()).await;
    let forged: ResourceSlice = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "forged"},
        "spec": {"driver": DRIVER, "nodeName": "another-node",
            "pool": {"name": "another-node", "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}]}}))
    .unwrap();
    // (an admission policy takes effect once the API server has loaded
    // it, a moment after it is created: a forged slice accepted before
    // then is deleted and the write tried again)
    let as_agent: Api<ResourceSlice> = Api::all(as_agent);
    let refused = wait_for(Duration::from_secs(30), || async {
        let why = match as_agent.create(&PostParams::default(), &forged).await {
            Err(e) => e.to_string(),
            Ok(_) => {
                let _ = slices.delete("forged", &DeleteParams::default()).await;
                String::new()
            }
        };
        if why.contains("only publish the ResourceSlice of the node it runs on") {
            return Some(why);
        }
        eprintln!("forged slice not refused by the policy yet: {why:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
        None
    })
    .await;
    assert!(
        refused.is_some(),
        "the agent published a slice for another node for 30 s"
    );
    assert_eq!(s.spec.pool.name, NODE);
    let devs = s.spec.devices.unwrap();
    assert_eq!(
        devs[2].attributes.as_ref().unwrap()["uuid"]
            .string
            .as_deref(),
        Some(n.uuid(2).as_str())
    );
    assert_eq!(devs[2].capacity.as_ref().unwrap()["memory"].value.0, "80Gi");
    // What the agent publishes is what the API server keeps (no canonical
    // form differs): the periodic check (1 s) does not write again.
    let gen0 = s.spec.pool.generation;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let again = slices.get(&slice_name).await.unwrap();
    assert_eq!(
        again.spec.pool.generation,
        gen0,
        "the slice is rewritten without a change\n{}",
        n.logs()
    );

    // A claim of two GPUs, allocated by hand, and its pod.
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let claim: ResourceClaim = serde_json::from_value(claim_spec("two", 2)).unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let claim_uid = claim.metadata.uid.clone().unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let pod: Pod = serde_json::from_value(pod_spec("trainer", "two")).unwrap();
    let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
    let pod_uid = pod.metadata.uid.clone().unwrap();
    allocate_and_bind(&c, "two", NODE, &["gpu-1", "gpu-3"], &pod).await;

    wait_for(Duration::from_secs(90), || async {
        let p = pods.get("trainer").await.ok()?;
        (phase(&p) == "Running").then_some(())
    })
    .await
    .unwrap_or_else(|| {
        panic!("pod trainer never ran\n{}", n.logs());
    });
    let mut want = vec![
        format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(1)),
        format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(3)),
    ];
    want.sort();
    assert_eq!(
        n.cdi_devices(&pod_uid, "main"),
        Some(want),
        "the container's CDI devices are the allocated GPUs\n{}",
        n.logs()
    );
    assert_eq!(
        n.cdi_devices(&pod_uid, "side"),
        Some(vec![]),
        "a container without the claim gets no GPU"
    );
    // A fatal XID on gpu-3: the health stream tells the kubelet, which
    // shows it in the container's status (ResourceHealthStatus, beta and
    // on in 1.37).
    std::fs::OpenOptions::new()
        .append(true)
        .open(n.dir.path().join("control"))
        .and_then(|mut f| std::io::Write::write_all(&mut f, b"xid 3 79\n"))
        .unwrap();
    let gpu3 = format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(3));
    let statuses = wait_for(Duration::from_secs(60), || async {
        let p = pods.get("trainer").await.ok()?;
        let cs = p.status?.container_statuses?;
        let main = cs.into_iter().find(|c| c.name == "main")?;
        let ars = main.allocated_resources_status?;
        let health: Vec<(String, String)> = ars
            .iter()
            .flat_map(|r| {
                r.resources
                    .iter()
                    .flatten()
                    .map(|h| (h.resource_id.clone(), h.health.clone().unwrap_or_default()))
            })
            .collect();
        health
            .iter()
            .any(|(id, h)| id == &gpu3 && h == "Unhealthy")
            .then_some((ars, health))
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "gpu-3 never showed Unhealthy in the pod status\n{}",
            n.logs()
        )
    });
    assert!(
        statuses.0.iter().any(|r| r.name == "claim:gpus"),
        "{:?}",
        statuses.0
    );
    let gpu1 = format!("k8s.gpu.gpusched.io/gpu={}", n.uuid(1));
    assert!(
        statuses
            .1
            .iter()
            .any(|(id, h)| id == &gpu1 && h == "Healthy"),
        "{:?}",
        statuses.1
    );

    let spec_file = n
        .cdi_dir()
        .join(format!("k8s.gpu.gpusched.io-claim_{claim_uid}.json"));
    assert!(spec_file.exists(), "CDI spec {}", spec_file.display());

    // A claim allocated in another node's pool: the kubelet's prepare
    // fails with the agent's reason, and the pod does not run.
    let bad: ResourceClaim = serde_json::from_value(claim_spec("elsewhere", 1)).unwrap();
    claims.create(&PostParams::default(), &bad).await.unwrap();
    let bad_pod: Pod = serde_json::from_value(pod_spec("stray", "elsewhere")).unwrap();
    let bad_pod = pods.create(&PostParams::default(), &bad_pod).await.unwrap();
    allocate_and_bind(&c, "elsewhere", "other-node", &["gpu-0"], &bad_pod).await;
    let events: Api<Event> = Api::namespaced(c.client.clone(), NS);
    let msg = wait_for(Duration::from_secs(60), || async {
        let l = events
            .list(&ListParams::default().fields("involvedObject.name=stray"))
            .await
            .ok()?;
        l.items
            .into_iter()
            .filter_map(|e| e.message)
            .find(|m| m.contains("not in this node's pool"))
    })
    .await
    .unwrap_or_else(|| panic!("no prepare failure event for pod stray\n{}", n.logs()));
    assert!(msg.contains("ml/elsewhere"), "{msg}");
    assert_ne!(phase(&pods.get("stray").await.unwrap()), "Running");

    // The agent restarts: what it prepared is still prepared.
    n.stop_agent();
    n.start_agent();
    assert!(spec_file.exists());

    // Deleting the pod unprepares the claim: its CDI spec goes, and the
    // checkpoint forgets it.
    pods.delete("trainer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let checkpoint = n.plugin_dir().join("checkpoint.json");
    wait_for(Duration::from_secs(90), || async {
        let cp = std::fs::read_to_string(&checkpoint).ok()?;
        (!spec_file.exists() && !cp.contains(&claim_uid)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("claim two never unprepared\n{}", n.logs()));
}

/// A pod of gpusched's whose container `main` uses the claims named in
/// `claims` (`(name in the pod, Ok(claim) | Err(template))`).
fn scheduled_pod(name: &str, claims: &[(&str, Result<&str, &str>)]) -> Value {
    let pod_claims: Vec<Value> = claims
        .iter()
        .map(|(n, src)| match src {
            Ok(c) => json!({"name": n, "resourceClaimName": c}),
            Err(t) => json!({"name": n, "resourceClaimTemplateName": t}),
        })
        .collect();
    let uses: Vec<Value> = claims.iter().map(|(n, _)| json!({"name": n})).collect();
    json!({"metadata": {"name": name, "namespace": NS},
        "spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
            "resourceClaims": pod_claims,
            "containers": [
                {"name": "main", "image": "registry.k8s.io/pause:3.10",
                 "resources": {"claims": uses, "requests": {"cpu": "100m"}}}]}})
}

/// The claim behind the pod's claim entry `entry` (a template's claim is
/// named in the pod's status by kube-controller-manager).
async fn claim_of(c: &Cluster, pod: &str, entry: &str) -> Option<ResourceClaim> {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let p = pods.get(pod).await.ok()?;
    let direct = p
        .spec
        .as_ref()?
        .resource_claims
        .iter()
        .flatten()
        .find(|r| r.name == entry)?
        .resource_claim_name
        .clone();
    let name = match direct {
        Some(n) => n,
        None => {
            p.status?
                .resource_claim_statuses?
                .into_iter()
                .find(|s| s.name == entry)?
                .resource_claim_name?
        }
    };
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    claims.get(&name).await.ok()
}

/// The CDI device names of the GPUs allocated to `claim` (its results'
/// devices, by the UUID the node's slice gives each), sorted.
fn allocated_cdi(claim: &ResourceClaim, slice: &ResourceSlice) -> Vec<String> {
    let results = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.clone())
        .unwrap_or_default();
    let mut out: Vec<String> = results
        .iter()
        .map(|r| {
            assert_eq!(r.driver, DRIVER);
            assert_eq!(r.pool, NODE, "allocated from the node's own pool");
            let dev = slice
                .spec
                .devices
                .iter()
                .flatten()
                .find(|d| d.name == r.device)
                .unwrap_or_else(|| panic!("allocated device {} not in the slice", r.device));
            let uuid = dev.attributes.as_ref().unwrap()[dra::ATTR_UUID]
                .string
                .clone()
                .unwrap();
            format!("k8s.gpu.gpusched.io/gpu={uuid}")
        })
        .collect();
    out.sort();
    out
}

async fn running(c: &Cluster, n: &RealNode, name: &str) -> Pod {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let ran = wait_for(Duration::from_secs(90), || async {
        let p = pods.get(name).await.ok()?;
        (phase(&p) == "Running").then_some(p)
    })
    .await;
    match ran {
        Some(p) => p,
        None => {
            let status = pods
                .get_opt(name)
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status);
            panic!("pod {name} never ran: {status:?}\n{}", n.logs())
        }
    }
}

/// gpusched's scheduler (in-process, the chart's flags) allocates the
/// claims — from a template with a `matchAttribute` constraint, a claim
/// shared by two pods, one that must wait for devices to be freed — and
/// the real kubelet prepares them through the agent's DRA service: every
/// container's CDI devices are exactly the devices gpusched allocated, and
/// no GPU is in two claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn claims_gpusched_allocates_run_on_a_real_kubelet_with_exactly_those_gpus() {
    let c = Cluster::up().await;
    // claims from templates, and reservations of deleted pods released
    let _kcm = k8s::controllers::kube_controller_manager_with(&c, "resourceclaim-controller");
    let n = RealNode::up(&c).await;
    let slice = published_slice(&c, &n).await;
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(c.client.clone(), NS);
    let pair: ResourceClaimTemplate = serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "pair", "namespace": NS},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "gpus", "exactly": {
                "deviceClassName": dra::DEVICE_CLASS, "count": 2}}],
            "constraints": [{"matchAttribute": format!("{DRIVER}/{}", dra::ATTR_NVLINK_DOMAIN)}]}}}}))
    .unwrap();
    templates
        .create(&PostParams::default(), &pair)
        .await
        .unwrap();
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let shared: ResourceClaim = serde_json::from_value(claim_spec("shared", 1)).unwrap();
    claims
        .create(&PostParams::default(), &shared)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    let _s = c.scheduler(k8s::opts()).await;

    // a pod with a claim from the template: 2 GPUs, both in one NVLink domain
    let trainer =
        serde_json::from_value(scheduled_pod("trainer", &[("gpus", Err("pair"))])).unwrap();
    pods.create(&PostParams::default(), &trainer).await.unwrap();
    let t = running(&c, &n, "trainer").await;
    let t_claim = claim_of(&c, "trainer", "gpus")
        .await
        .expect("trainer's claim");
    let t_gpus = allocated_cdi(&t_claim, &slice);
    assert_eq!(t_gpus.len(), 2, "{t_claim:?}");
    assert_eq!(
        n.cdi_devices(t.metadata.uid.as_deref().unwrap(), "main"),
        Some(t_gpus.clone()),
        "the container's CDI devices are the GPUs gpusched allocated\n{}",
        n.logs()
    );

    // one claim, two pods: allocated once, reserved for both, the same GPU
    // in both containers
    for name in ["reader-a", "reader-b"] {
        let p = serde_json::from_value(scheduled_pod(name, &[("gpu", Ok("shared"))])).unwrap();
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let a = running(&c, &n, "reader-a").await;
    let b = running(&c, &n, "reader-b").await;
    let sh = claims.get("shared").await.unwrap();
    let sh_gpus = allocated_cdi(&sh, &slice);
    assert_eq!(sh_gpus.len(), 1);
    assert_eq!(
        sh.status
            .as_ref()
            .unwrap()
            .reserved_for
            .as_ref()
            .map(Vec::len),
        Some(2),
        "{sh:?}"
    );
    for p in [&a, &b] {
        assert_eq!(
            n.cdi_devices(p.metadata.uid.as_deref().unwrap(), "main"),
            Some(sh_gpus.clone()),
            "{}",
            n.logs()
        );
    }
    assert!(!t_gpus.contains(&sh_gpus[0]), "a GPU in two claims");

    // 2 more GPUs in one NVLink domain: 1 is free, so the pod waits,
    // unbound, with a reason; when the trainer goes, its GPUs are given
    // again and the pod runs on exactly what it was allocated
    let late = serde_json::from_value(scheduled_pod("late", &[("gpus", Err("pair"))])).unwrap();
    pods.create(&PostParams::default(), &late).await.unwrap();
    let why = wait_for(Duration::from_secs(30), || async {
        k8s::scheduled_reason(&pods.get("late").await.ok()?)
    })
    .await
    .expect("late pending with a PodScheduled reason");
    eprintln!("late pending: {why:?}");
    assert!(
        pods.get("late")
            .await
            .unwrap()
            .spec
            .unwrap()
            .node_name
            .is_none(),
        "bound without devices"
    );
    pods.delete("trainer", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let l = running(&c, &n, "late").await;
    let l_claim = claim_of(&c, "late", "gpus").await.expect("late's claim");
    let l_gpus = allocated_cdi(&l_claim, &slice);
    assert_eq!(l_gpus.len(), 2);
    assert!(!l_gpus.contains(&sh_gpus[0]), "a GPU in two claims");
    assert_eq!(
        n.cdi_devices(l.metadata.uid.as_deref().unwrap(), "main"),
        Some(l_gpus),
        "{}",
        n.logs()
    );
}

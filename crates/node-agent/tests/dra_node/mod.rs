//! The real-kubelet DRA node shared by the `dra_kubelet*_e2e` tests: the
//! kubelet (v1.37.2, `e2e/cluster/kubelet`, fake CRI runtime recording every
//! container's config) with `gpusched-node-agent --mode dra` (a separate
//! process, fake backend, 4 H100s) installed as the chart installs it in DRA
//! mode, and helpers to allocate, schedule and compare CDI devices.
#![allow(dead_code)]

use crate::k8s::{self, Cluster, wait_for};
use crate::real_kubelet::{kubelet_down, kubelet_up};
use gpusched_model::dra;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub const NODE: &str = "kdra";
pub const NS: &str = "ml";
pub const DRIVER: &str = "gpu.gpusched.io";

pub fn node_yaml() -> String {
    format!(
        "nodes:\n  - name: {NODE}\n    cpu: \"64\"\n    memory: 512Gi\n    gpus:\n      count: 4\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n      numa_nodes: 2\n"
    )
}

pub struct RealNode {
    pub dir: tempfile::TempDir,
    pub env: BTreeMap<String, String>,
    pub node_file: PathBuf,
    pub kubeconfig: PathBuf,
    agent: Option<Child>,
    starts: u32,
    /// More agent flags (e.g. `--shares`).
    extra_args: Vec<String>,
}

impl RealNode {
    pub async fn up(c: &Cluster) -> RealNode {
        RealNode::up_node(c, &node_yaml(), &[]).await
    }

    /// A node whose agent runs with `extra_args` too.
    pub async fn up_with(c: &Cluster, extra_args: &[&str]) -> RealNode {
        RealNode::up_node(c, &node_yaml(), extra_args).await
    }

    /// A node of the fake backend's `yaml` (node name [`NODE`]) whose agent
    /// runs with `extra_args` too.
    pub async fn up_node(c: &Cluster, yaml: &str, extra_args: &[&str]) -> RealNode {
        let (dir, env) = kubelet_up(c, "gpusched-dra-", NODE);
        let node_file = dir.path().join("node.yaml");
        std::fs::write(&node_file, yaml).unwrap();
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
                ("DeviceClass", dra::MIG_DEVICE_CLASS),
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
            extra_args: extra_args.iter().map(|a| a.to_string()).collect(),
        };
        n.start_agent();
        n
    }

    pub fn kdir(&self) -> PathBuf {
        PathBuf::from(&self.env["GPUSCHED_KUBELET_DIR"])
    }

    pub fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    pub fn plugin_dir(&self) -> PathBuf {
        self.kdir().join("root/plugins").join(DRIVER)
    }

    pub fn start_agent(&mut self) {
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
            .args(&self.extra_args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("starting gpusched-node-agent");
        self.agent = Some(child);
    }

    pub fn stop_agent(&mut self) {
        if let Some(mut ch) = self.agent.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &ch.id().to_string()])
                .status();
            let _ = ch.wait();
        }
    }

    pub fn logs(&self) -> String {
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

    pub fn uuid(&self, index: u32) -> String {
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
    pub fn cdi_devices(&self, pod_uid: &str, container: &str) -> Option<Vec<String>> {
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
        let kdir = self.kdir();
        kubelet_down(&mut self.dir, kdir.to_str().unwrap());
    }
}

pub fn claim_spec(name: &str, count: u32) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpus", "exactly": {
            "deviceClassName": DRIVER, "allocationMode": "ExactCount", "count": count}}]}}})
}

/// A pod (not scheduled: no scheduler runs) with a container using claim
/// `claim` and one without.
pub fn pod_spec(name: &str, claim: &str) -> Value {
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
pub async fn allocate_and_bind(c: &Cluster, claim: &str, pool: &str, devices: &[&str], pod: &Pod) {
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
pub async fn published_slice(c: &Cluster, n: &RealNode) -> ResourceSlice {
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

pub fn phase(p: &Pod) -> String {
    p.status
        .as_ref()
        .and_then(|s| s.phase.clone())
        .unwrap_or_default()
}
/// A pod of gpusched's whose container `main` uses the claims named in
/// `claims` (`(name in the pod, Ok(claim) | Err(template))`).
pub fn scheduled_pod(name: &str, claims: &[(&str, Result<&str, &str>)]) -> Value {
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
pub async fn claim_of(c: &Cluster, pod: &str, entry: &str) -> Option<ResourceClaim> {
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
/// devices, by the UUID the node's slice gives each; a share's with its
/// share ID), sorted.
pub fn allocated_cdi(claim: &ResourceClaim, slice: &ResourceSlice) -> Vec<String> {
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
            // a share of a GPU is named after the GPU and the share
            match &r.share_id {
                Some(id) => format!("k8s.gpu.gpusched.io/gpu={uuid}-share-{id}"),
                None => format!("k8s.gpu.gpusched.io/gpu={uuid}"),
            }
        })
        .collect();
    out.sort();
    out
}

pub async fn running(c: &Cluster, n: &RealNode, name: &str) -> Pod {
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

/// Every claim's allocated devices: no device is in two allocated claims.
pub async fn assert_no_device_twice(c: &Cluster) {
    let claims: Api<ResourceClaim> = Api::namespaced(c.client.clone(), NS);
    let mut seen = BTreeSet::new();
    for cl in claims.list(&Default::default()).await.unwrap().items {
        let results = cl
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.clone())
            .unwrap_or_default();
        for r in results {
            let key = format!("{}/{}/{}", r.driver, r.pool, r.device);
            assert!(
                seen.insert(key.clone()),
                "{key} allocated twice (second: {:?})",
                cl.metadata.name
            );
        }
    }
}

/// The running pod `pod`'s container `main` got exactly the CDI devices of
/// `claim`'s allocation; returns them.
pub fn assert_cdi_is_allocation(
    n: &RealNode,
    pod: &Pod,
    claim: &ResourceClaim,
    slice: &ResourceSlice,
) -> Vec<String> {
    let want = allocated_cdi(claim, slice);
    assert!(
        !want.is_empty(),
        "claim {:?} has no devices",
        claim.metadata.name
    );
    assert_eq!(
        n.cdi_devices(pod.metadata.uid.as_deref().unwrap(), "main"),
        Some(want.clone()),
        "pod {:?}: the container's CDI devices are the GPUs gpusched allocated to claim {:?}\n{}",
        pod.metadata.name,
        claim.metadata.name,
        n.logs()
    );
    want
}

/// Waits until the pod is gone from the API server.
pub async fn gone(c: &Cluster, n: &RealNode, name: &str) {
    let pods: Api<Pod> = Api::namespaced(c.client.clone(), NS);
    wait_for(Duration::from_secs(60), || async {
        pods.get_opt(name)
            .await
            .ok()
            .and_then(|p| p.is_none().then_some(()))
    })
    .await
    .unwrap_or_else(|| panic!("pod {name} never went away\n{}", n.logs()));
}

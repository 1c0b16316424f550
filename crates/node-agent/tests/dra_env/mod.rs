//! The DRA mode's test harness over real unix sockets: in-memory claims
//! and slices, and an agent (`serve_dra`, fake backend) in a temp dir.
#![allow(dead_code)]

use crate::common::{fixture, settings};
use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::coord::BoxFuture;
use gpusched_node_agent::dra::DraSettings;
use gpusched_node_agent::dra::kube::SliceStore;
use gpusched_node_agent::dra::prepare::ClaimSource;
use gpusched_node_agent::server::unix_channel;
use gpusched_node_agent::{dra_v1 as v1, dra_v1beta1 as v1beta1, registration_api as reg};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSliceSpec};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

pub const NODE: &str = "dgx-1";

#[derive(Default)]
pub struct Claims(pub Mutex<BTreeMap<(String, String), ResourceClaim>>);

impl Claims {
    pub fn put(&self, c: ResourceClaim) {
        let k = (
            c.metadata.namespace.clone().unwrap(),
            c.metadata.name.clone().unwrap(),
        );
        self.0.lock().unwrap().insert(k, c);
    }
    pub fn clear(&self) {
        self.0.lock().unwrap().clear();
    }
}

impl ClaimSource for Claims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, String>> {
        let c = self
            .0
            .lock()
            .unwrap()
            .get(&(namespace.to_string(), name.to_string()))
            .cloned();
        Box::pin(async move { Ok(c) })
    }
}

#[derive(Default)]
pub struct Slices {
    /// Specs by slice name.
    pub cur: Mutex<BTreeMap<String, ResourceSliceSpec>>,
    pub applies: Mutex<u32>,
}

impl SliceStore for Slices {
    fn get<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSliceSpec>, String>> {
        let c = self.cur.lock().unwrap().get(name).cloned();
        Box::pin(async move { Ok(c) })
    }
    fn apply<'a>(
        &'a self,
        name: &'a str,
        spec: ResourceSliceSpec,
    ) -> BoxFuture<'a, Result<(), String>> {
        self.cur.lock().unwrap().insert(name.to_string(), spec);
        *self.applies.lock().unwrap() += 1;
        Box::pin(async { Ok(()) })
    }
}

impl Slices {
    /// The devices' slice.
    pub fn current(&self) -> Option<ResourceSliceSpec> {
        self.cur
            .lock()
            .unwrap()
            .get(&format!("{NODE}-gpu.gpusched.io"))
            .cloned()
    }
    /// The shared counters' slice.
    pub fn counters(&self) -> Option<ResourceSliceSpec> {
        self.cur
            .lock()
            .unwrap()
            .get(&format!("{NODE}-gpu.gpusched.io-counters"))
            .cloned()
    }
    pub async fn wait(
        &self,
        what: &str,
        f: impl Fn(&ResourceSliceSpec) -> bool,
    ) -> ResourceSliceSpec {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.current()
                && f(&s)
            {
                return s;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "slice never got {what}: {:?}",
                self.current()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A claim allocated `devices` (request, pool, device) and reserved for a pod.
pub fn claim(
    name: &str,
    uid: &str,
    devices: &[(&str, &str, &str)],
    reserved: bool,
) -> ResourceClaim {
    let results: Vec<_> = devices
        .iter()
        .map(|(req, pool, dev)| {
            json!({"request": req, "driver": "gpu.gpusched.io", "pool": pool, "device": dev})
        })
        .collect();
    let reserved_for = if reserved {
        json!([{"resource": "pods", "name": "p", "uid": "pod-uid"}])
    } else {
        json!([])
    };
    serde_json::from_value(json!({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"namespace": "ns", "name": name, "uid": uid},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpusched.io"}}]}},
        "status": {
            "allocation": {
                "devices": {"results": results},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}
            },
            "reservedFor": reserved_for
        }
    }))
    .unwrap()
}

pub struct Running {
    stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    pub async fn shutdown(mut self) {
        let _ = self.stop.take().unwrap().send(());
        self.task.await.unwrap().unwrap();
    }
}

pub struct Env {
    _tmp: tempfile::TempDir,
    pub dir: PathBuf,
    pub claims: Arc<Claims>,
    pub slices: Arc<Slices>,
    pub control: PathBuf,
    /// The node fixture (`fixtures/nodes/…`).
    pub fixture: &'static str,
    /// The agent's `--shares`.
    pub shares: bool,
}

impl Env {
    pub fn new() -> Env {
        Env::with("dgx-h100.yaml", false)
    }

    /// An agent on node fixture `fixture`, with `--shares` or not.
    pub fn with(fixture: &'static str, shares: bool) -> Env {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let control = dir.join("control");
        std::fs::write(&control, "").unwrap();
        Env {
            _tmp: tmp,
            dir,
            claims: Arc::new(Claims::default()),
            slices: Arc::new(Slices::default()),
            control,
            fixture,
            shares,
        }
    }

    pub fn dra(&self) -> DraSettings {
        let mut d = DraSettings::new(NODE);
        d.registry_dir = self.dir.join("plugins_registry");
        d.plugin_dir = self.dir.join("plugins/gpu.gpusched.io");
        d.kubelet_plugin_dir = PathBuf::from("/var/lib/kubelet/plugins/gpu.gpusched.io");
        d.cdi_dir = self.dir.join("cdi");
        d.slice_resync = Duration::from_millis(100);
        d
    }

    pub fn start(&self) -> Running {
        let mut s = settings(&self.dir.join("dp"), self.fixture);
        s.node_name = Some(NODE.into());
        s.shares = self.shares;
        s.pass_device_specs = true;
        s.control_file = Some(self.control.clone());
        let backend = Arc::new(
            FakeBackend::from_file(&fixture(self.fixture), Some(self.control.clone())).unwrap(),
        );
        let (tx, rx) = oneshot::channel::<()>();
        let task = tokio::spawn(gpusched_node_agent::cli::serve_dra(
            s,
            self.dra(),
            backend,
            self.claims.clone(),
            self.slices.clone(),
            async move {
                let _ = rx.await;
            },
        ));
        Running {
            stop: Some(tx),
            task,
        }
    }

    pub async fn wait_socket(&self, p: &Path) {
        let t0 = Instant::now();
        while !p.exists() {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "no socket {}",
                p.display()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn registration(
        &self,
    ) -> reg::registration_client::RegistrationClient<tonic::transport::Channel> {
        let p = self.dra().registration_socket();
        self.wait_socket(&p).await;
        reg::registration_client::RegistrationClient::new(unix_channel(&p).await.unwrap())
    }

    pub async fn v1(&self) -> v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        let p = self.dra().dra_socket();
        self.wait_socket(&p).await;
        v1::dra_plugin_client::DraPluginClient::new(unix_channel(&p).await.unwrap())
    }

    pub async fn v1beta1(
        &self,
    ) -> v1beta1::dra_plugin_client::DraPluginClient<tonic::transport::Channel> {
        let p = self.dra().dra_socket();
        self.wait_socket(&p).await;
        v1beta1::dra_plugin_client::DraPluginClient::new(unix_channel(&p).await.unwrap())
    }

    pub fn uuid(&self, index: u32) -> String {
        let inv = gpusched_node_agent::backend::DeviceBackend::discover(
            &FakeBackend::from_file(&fixture(self.fixture), None).unwrap(),
        )
        .unwrap();
        inv.gpus
            .iter()
            .find(|g| g.index == index)
            .unwrap()
            .uuid
            .clone()
    }

    pub fn cdi_spec(&self, uid: &str) -> Option<serde_json::Value> {
        let p = self
            .dra()
            .cdi_dir
            .join(format!("k8s.gpu.gpusched.io-claim_{uid}.json"));
        std::fs::read(p)
            .ok()
            .map(|b| serde_json::from_slice(&b).unwrap())
    }
}

pub fn v1_claim(name: &str, uid: &str) -> v1::Claim {
    v1::Claim {
        namespace: "ns".into(),
        name: name.into(),
        uid: uid.into(),
    }
}

pub async fn prepare(
    c: &mut v1::dra_plugin_client::DraPluginClient<tonic::transport::Channel>,
    claims: Vec<v1::Claim>,
) -> BTreeMap<String, v1::NodePrepareResourceResponse> {
    c.node_prepare_resources(v1::NodePrepareResourcesRequest { claims })
        .await
        .unwrap()
        .into_inner()
        .claims
        .into_iter()
        .collect()
}

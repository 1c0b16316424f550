//! A fake kubelet over real unix sockets in a temp dir, and helpers to run
//! the agent against it.
#![allow(dead_code)]

use gpusched_node_agent::api;
use gpusched_node_agent::api::device_plugin_client::DevicePluginClient;
use gpusched_node_agent::api::registration_server::{Registration, RegistrationServer};
use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::config::{BackendKind, Settings};
use gpusched_node_agent::server::unix_channel;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::UnixListener;
use tokio::sync::{Mutex, mpsc, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Channel;
use tonic::{Request, Response, Status};

pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/nodes")
        .join(name)
}

struct Reg {
    tx: mpsc::UnboundedSender<(Instant, api::RegisterRequest)>,
}

#[tonic::async_trait]
impl Registration for Reg {
    async fn register(
        &self,
        req: Request<api::RegisterRequest>,
    ) -> Result<Response<api::Empty>, Status> {
        let r = req.into_inner();
        if r.version != "v1beta1" {
            return Err(Status::invalid_argument("unsupported version"));
        }
        let _ = self.tx.send((Instant::now(), r));
        Ok(Response::new(api::Empty {}))
    }
}

/// The kubelet side: a Registration server on `<dir>/kubelet.sock`.
pub struct FakeKubelet {
    pub dir: PathBuf,
    stop: Option<oneshot::Sender<()>>,
    pub registrations: Arc<Mutex<mpsc::UnboundedReceiver<(Instant, api::RegisterRequest)>>>,
    tx: mpsc::UnboundedSender<(Instant, api::RegisterRequest)>,
}

impl FakeKubelet {
    pub async fn start(dir: &Path) -> FakeKubelet {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut k = FakeKubelet {
            dir: dir.to_path_buf(),
            stop: None,
            registrations: Arc::new(Mutex::new(rx)),
            tx,
        };
        k.listen();
        k
    }

    fn listen(&mut self) {
        let path = self.dir.join("kubelet.sock");
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).expect("bind kubelet.sock");
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let svc = RegistrationServer::new(Reg {
            tx: self.tx.clone(),
        });
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(UnixListenerStream::new(l), async {
                    let _ = stop_rx.await;
                })
                .await;
        });
        self.stop = Some(stop_tx);
    }

    /// What the real kubelet does when it restarts: stop, delete every
    /// socket in the plugin dir, listen on a fresh kubelet.sock.
    pub async fn restart(&mut self) -> Instant {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        for e in std::fs::read_dir(&self.dir).expect("read dir").flatten() {
            if e.path().extension().is_some_and(|x| x == "sock") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t = Instant::now();
        self.listen();
        t
    }

    /// A kubelet that died: its server stops but kubelet.sock stays behind.
    pub fn crash(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }

    /// Next registration, or panic after `timeout`.
    pub async fn next_registration(&self, timeout: Duration) -> (Instant, api::RegisterRequest) {
        let mut rx = self.registrations.lock().await;
        tokio::time::timeout(timeout, rx.recv())
            .await
            .expect("no registration in time")
            .expect("channel closed")
    }

    /// A DevicePlugin client for a registered endpoint.
    pub async fn client(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        let ch = unix_channel(&self.dir.join(endpoint))
            .await
            .expect("connect plugin");
        DevicePluginClient::new(ch)
    }
}

/// Settings for a test run against `dir`.
pub fn settings(dir: &Path, node: &str) -> Settings {
    Settings {
        plugin_dir: dir.to_path_buf(),
        backend: BackendKind::Fake,
        node_file: Some(fixture(node)),
        feature_file: None,
        metrics_address: None,
        ..Default::default()
    }
}

/// A running agent; dropping `stop` (or sending) shuts it down.
pub struct RunningAgent {
    pub stop: Option<oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl RunningAgent {
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        self.task.await.expect("agent task")
    }
}

pub fn start_agent(s: Settings) -> RunningAgent {
    let node = s.node_file.clone().expect("node file");
    let backend =
        Arc::new(FakeBackend::from_file(&node, s.control_file.clone()).expect("node file"));
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(gpusched_node_agent::cli::serve(s, backend, async move {
        let _ = rx.await;
    }));
    RunningAgent {
        stop: Some(tx),
        task,
    }
}

/// Reads the next ListAndWatch message within `timeout`.
pub async fn next_list(
    s: &mut tonic::Streaming<api::ListAndWatchResponse>,
    timeout: Duration,
) -> Option<api::ListAndWatchResponse> {
    tokio::time::timeout(timeout, s.message())
        .await
        .ok()
        .and_then(|r| r.ok())
        .flatten()
}

// ---------------------------------------------------------------------------
// The Kubernetes side without an apiserver: pods injected by the test, a
// fake PodResources server, recorded events and node facts.

use gpusched_node_agent::coord::{
    BoxFuture, Coordinator, EventSink, KubeSide, NodeFacts, NodeSink, PodSource,
};
use gpusched_node_agent::decisions::PodInfo;
use gpusched_node_agent::podresources_api as pr;
use gpusched_node_agent::podresources_api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};

/// Pods the test controls. `list` returns them; the watch pushes them to
/// the coordinator whenever `changed` is notified.
#[derive(Default)]
pub struct TestPods {
    pub pods: std::sync::Mutex<Vec<PodInfo>>,
    pub changed: tokio::sync::Notify,
    /// When false, the watch never delivers (only LISTs see changes).
    pub watch_enabled: std::sync::atomic::AtomicBool,
    pub lists: std::sync::atomic::AtomicUsize,
    /// Changes the watch has handed to the agent.
    pub applied: std::sync::atomic::AtomicUsize,
}

impl TestPods {
    pub fn new(watch: bool) -> Arc<Self> {
        let t = TestPods::default();
        t.watch_enabled
            .store(watch, std::sync::atomic::Ordering::SeqCst);
        Arc::new(t)
    }
    pub fn set(&self, pods: Vec<PodInfo>) {
        *self.pods.lock().unwrap() = pods;
        self.changed.notify_one();
    }
    pub fn add(&self, p: PodInfo) {
        self.pods.lock().unwrap().push(p);
        self.changed.notify_one();
    }
}

impl PodSource for TestPods {
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodInfo>, String>> {
        self.lists.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let v = self.pods.lock().unwrap().clone();
        Box::pin(async move { Ok(v) })
    }
    fn watch(
        self: Arc<Self>,
        coord: Arc<Coordinator>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()> {
        Box::pin(async move {
            loop {
                tokio::select! {
                    _ = self.changed.notified() => {}
                    _ = stop.changed() => return,
                }
                if self.watch_enabled.load(std::sync::atomic::Ordering::SeqCst) {
                    let v = self.pods.lock().unwrap().clone();
                    coord.replace_all(v);
                    self.applied
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
            }
        })
    }
}

/// Events as (pod, reason, message).
#[derive(Default)]
pub struct TestEvents(pub std::sync::Mutex<Vec<(String, String, String)>>);

impl EventSink for TestEvents {
    fn refused(&self, pod: &PodInfo, reason: &str, message: &str) {
        self.0
            .lock()
            .unwrap()
            .push((pod.key(), reason.into(), message.into()));
    }
}

/// Every publish, with the time it arrived.
#[derive(Default)]
pub struct TestNode(pub std::sync::Mutex<Vec<(Instant, NodeFacts)>>);

impl NodeSink for TestNode {
    fn publish(&self, f: NodeFacts) -> BoxFuture<'_, Result<(), String>> {
        self.0.lock().unwrap().push((Instant::now(), f));
        Box::pin(async { Ok(()) })
    }
}

/// A PodResources server on `path` answering `List` with `held`.
pub struct FakePodResources {
    pub held: Arc<std::sync::Mutex<Vec<pr::PodResources>>>,
}

struct PrSvc(Arc<std::sync::Mutex<Vec<pr::PodResources>>>);

#[tonic::async_trait]
impl PodResourcesLister for PrSvc {
    async fn list(
        &self,
        _req: Request<pr::ListPodResourcesRequest>,
    ) -> Result<Response<pr::ListPodResourcesResponse>, Status> {
        Ok(Response::new(pr::ListPodResourcesResponse {
            pod_resources: self.0.lock().unwrap().clone(),
        }))
    }
}

impl FakePodResources {
    pub fn start(path: &Path) -> FakePodResources {
        let _ = std::fs::remove_file(path);
        let l = UnixListener::bind(path).expect("bind pod-resources socket");
        let held = Arc::new(std::sync::Mutex::new(Vec::new()));
        let svc = PodResourcesListerServer::new(PrSvc(held.clone()));
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming(UnixListenerStream::new(l))
                .await;
        });
        FakePodResources { held }
    }

    /// Records what the kubelet would after a successful `Allocate`.
    pub fn hold(&self, ns: &str, name: &str, resource: &str, ids: &[String]) {
        self.held.lock().unwrap().push(pr::PodResources {
            name: name.into(),
            namespace: ns.into(),
            containers: vec![pr::ContainerResources {
                name: "main".into(),
                devices: vec![pr::ContainerDevices {
                    resource_name: resource.into(),
                    device_ids: ids.to_vec(),
                }],
            }],
        });
    }
}

/// The Kubernetes side for tests.
pub struct TestSide {
    pub pods: Arc<TestPods>,
    pub events: Arc<TestEvents>,
    pub node: Arc<TestNode>,
}

impl TestSide {
    pub fn new(watch: bool) -> TestSide {
        TestSide {
            pods: TestPods::new(watch),
            events: Arc::new(TestEvents::default()),
            node: Arc::new(TestNode::default()),
        }
    }
    pub fn side(&self, node: &str, require: bool) -> KubeSide {
        KubeSide {
            node: node.into(),
            pods: self.pods.clone(),
            events: self.events.clone(),
            node_sink: Some(self.node.clone()),
            require_decision: require,
        }
    }
    pub fn events(&self) -> Vec<(String, String, String)> {
        self.events.0.lock().unwrap().clone()
    }
}

pub fn start_agent_with(s: Settings, side: KubeSide) -> RunningAgent {
    let node = s.node_file.clone().expect("node file");
    let backend =
        Arc::new(FakeBackend::from_file(&node, s.control_file.clone()).expect("node file"));
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(gpusched_node_agent::cli::serve_with(
        s,
        backend,
        Some(side),
        async move {
            let _ = rx.await;
        },
    ));
    RunningAgent {
        stop: Some(tx),
        task,
    }
}

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

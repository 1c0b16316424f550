//! gRPC over unix sockets: one `DevicePlugin` server per resource, its
//! registration with the kubelet, and the watch that re-registers when the
//! kubelet restarts.

use crate::agent::Agent;
use crate::api;
use crate::api::device_plugin_server::{DevicePlugin, DevicePluginServer};
use crate::api::registration_client::RegistrationClient;
use crate::authority;
use crate::metrics::{RequestLabels, ResourceLabels};
use hyper_util::rt::TokioIo;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tokio_stream::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

/// API version sent in `Register`.
pub const API_VERSION: &str = "v1beta1";
/// How often sockets are checked for a kubelet restart.
pub const WATCH_PERIOD: Duration = Duration::from_millis(100);
/// Longest wait between failed registrations.
pub const MAX_BACKOFF: Duration = Duration::from_millis(400);
/// First wait after a failed registration (doubles up to [`MAX_BACKOFF`]).
const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// How long connecting to the kubelet's socket may take.
const KUBELET_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long one call to the kubelet may take.
const KUBELET_CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long in-flight calls get to finish when a resource stops, before its
/// connections (and open `ListAndWatch` streams) are dropped.
const STOP_GRACE: Duration = Duration::from_millis(300);

/// Serving or registering failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The plugin socket could not be bound.
    #[error("cannot bind plugin socket {path}: {source}")]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// Why binding failed.
        source: std::io::Error,
    },
    /// The kubelet socket could not be reached.
    #[error("cannot connect to kubelet socket {path}: {why}")]
    Connect {
        /// The kubelet socket.
        path: PathBuf,
        /// Why connecting failed.
        why: String,
    },
    /// The kubelet answered `Register` with an error.
    #[error("kubelet refused registration of {resource}: {status}")]
    Register {
        /// The resource.
        resource: String,
        /// The kubelet's answer.
        status: String,
    },
}

/// The `DevicePlugin` service of one resource.
#[derive(Clone)]
pub struct PluginService {
    agent: Arc<Agent>,
    res: usize,
}

impl PluginService {
    /// The service of resource `res` (index into [`Agent::plans`]).
    pub fn new(agent: Arc<Agent>, res: usize) -> Self {
        PluginService { agent, res }
    }

    fn count(&self, method: &str, code: tonic::Code) {
        self.agent
            .metrics
            .requests
            .get_or_create(&RequestLabels {
                resource: self.agent.plans[self.res].name.clone(),
                method: method.into(),
                code: format!("{code:?}"),
            })
            .inc();
    }

    /// `Allocate` without the transport, for tests and benchmarks.
    pub fn allocate_now(&self, req: api::AllocateRequest) -> Result<api::AllocateResponse, Status> {
        let plan = &self.agent.plans[self.res];
        let view = self.agent.view(self.res);
        if req.container_requests.is_empty() {
            return Err(Status::invalid_argument("allocate: no container requests"));
        }
        let mut out = api::AllocateResponse::default();
        for c in &req.container_requests {
            let r = plan
                .allocate(
                    &c.devices_ids,
                    &view.unit_healthy,
                    &self.agent.settings,
                    &self.agent.inventory,
                )
                .map_err(|e| e.into_status())?;
            out.container_responses.push(r);
        }
        for c in &req.container_requests {
            for id in &c.devices_ids {
                if let Some(&d) = plan.by_id.get(id) {
                    self.agent
                        .mark_allocated(plan.units[plan.devices[d].unit].gpu);
                }
            }
        }
        Ok(out)
    }

    /// `Allocate` honouring the scheduler's decisions (`docs/protocol.md`,
    /// [`crate::matching`]) when they govern the resource; otherwise
    /// [`Self::allocate_now`].
    pub async fn allocate_decided(
        &self,
        req: api::AllocateRequest,
    ) -> Result<api::AllocateResponse, Status> {
        match crate::matching::allocate(&self.agent, self.res, &req).await? {
            Some(out) => Ok(out),
            None => self.allocate_now(req),
        }
    }

    /// Steers the kubelet to the decision a call would be charged to.
    fn preferred_decided(
        &self,
        c: &api::ContainerPreferredAllocationRequest,
    ) -> Option<Vec<String>> {
        crate::matching::preferred(&self.agent, self.res, c)
    }

    /// `GetPreferredAllocation` without the transport.
    pub fn preferred_now(
        &self,
        req: api::PreferredAllocationRequest,
    ) -> Result<api::PreferredAllocationResponse, Status> {
        let plan = &self.agent.plans[self.res];
        let view = self.agent.view(self.res);
        let mut out = api::PreferredAllocationResponse::default();
        for c in &req.container_requests {
            if let Some(ids) = self.preferred_decided(c) {
                out.container_responses
                    .push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
                continue;
            }
            let ids = plan
                .preferred(
                    &c.available_device_i_ds,
                    &c.must_include_device_i_ds,
                    c.allocation_size,
                    &view.unit_healthy,
                )
                .map_err(|e| e.into_status())?;
            out.container_responses
                .push(api::ContainerPreferredAllocationResponse { device_i_ds: ids });
        }
        Ok(out)
    }
}

type ListStream = Pin<Box<dyn Stream<Item = Result<api::ListAndWatchResponse, Status>> + Send>>;

fn options() -> api::DevicePluginOptions {
    api::DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[tonic::async_trait]
impl DevicePlugin for PluginService {
    async fn get_device_plugin_options(
        &self,
        _req: Request<api::Empty>,
    ) -> Result<Response<api::DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = ListStream;

    async fn list_and_watch(
        &self,
        _req: Request<api::Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        let rx = self.agent.subscribe(self.res);
        let name = self.agent.plans[self.res].name.clone();
        tracing::info!(resource = %name, "kubelet opened ListAndWatch");
        let s = WatchStream::new(rx).map(|v| {
            Ok(api::ListAndWatchResponse {
                devices: v.devices.clone(),
            })
        });
        Ok(Response::new(Box::pin(s)))
    }

    async fn get_preferred_allocation(
        &self,
        req: Request<api::PreferredAllocationRequest>,
    ) -> Result<Response<api::PreferredAllocationResponse>, Status> {
        let req = req.into_inner();
        // A pod the agent's watch does not have yet, or no decision
        // expecting a call of exactly this size: one fresh LIST first
        // (crate::matching::preferred_misses).
        if crate::matching::preferred_misses(&self.agent, self.res, &req)
            && let Some(coord) = self.agent.coord.get()
            && let Err(e) = coord.refresh().await
        {
            tracing::warn!("pod list on a preferred-allocation miss failed: {e}");
        }
        let r = self.preferred_now(req);
        self.count(
            "GetPreferredAllocation",
            r.as_ref()
                .map(|_| tonic::Code::Ok)
                .unwrap_or_else(|e| e.code()),
        );
        if let Err(e) = &r {
            tracing::warn!(resource = %self.agent.plans[self.res].name, "preferred allocation refused: {}", e.message());
        }
        r.map(Response::new)
    }

    async fn allocate(
        &self,
        req: Request<api::AllocateRequest>,
    ) -> Result<Response<api::AllocateResponse>, Status> {
        let r = self.allocate_decided(req.into_inner()).await;
        self.count(
            "Allocate",
            r.as_ref()
                .map(|_| tonic::Code::Ok)
                .unwrap_or_else(|e| e.code()),
        );
        if let Err(e) = &r {
            tracing::warn!(resource = %self.agent.plans[self.res].name, "allocate refused: {}", e.message());
        }
        r.map(Response::new)
    }

    async fn pre_start_container(
        &self,
        _req: Request<api::PreStartContainerRequest>,
    ) -> Result<Response<api::PreStartContainerResponse>, Status> {
        Ok(Response::new(api::PreStartContainerResponse {}))
    }
}

/// A gRPC channel over a unix socket.
pub async fn unix_channel(path: &Path) -> Result<Channel, ServerError> {
    let p = path.to_path_buf();
    let endpoint = Endpoint::from_static("http://localhost")
        .connect_timeout(KUBELET_CONNECT_TIMEOUT)
        .timeout(KUBELET_CALL_TIMEOUT);
    endpoint
        .connect_with_connector(tower::service_fn(move |_| {
            let p = p.clone();
            async move { UnixStream::connect(p).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|e| ServerError::Connect {
            path: path.to_path_buf(),
            why: format!("{e}"),
        })
}

/// Calls `Register` on the kubelet.
pub async fn register(kubelet: &Path, endpoint: &str, resource: &str) -> Result<(), ServerError> {
    let ch = unix_channel(kubelet).await?;
    let mut c = RegistrationClient::new(ch);
    c.register(api::RegisterRequest {
        version: API_VERSION.into(),
        endpoint: endpoint.into(),
        resource_name: resource.into(),
        options: Some(options()),
    })
    .await
    .map_err(|s| ServerError::Register {
        resource: resource.into(),
        status: format!("{:?}: {}", s.code(), s.message()),
    })?;
    Ok(())
}

fn inode(p: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(p).ok().map(|m| (m.dev(), m.ino()))
}

/// Binds `path` (removing a stale file first) and serves the plugin until
/// `stop` fires. Returns the inode of the socket and the server task.
async fn bind_and_serve(
    agent: &Arc<Agent>,
    res: usize,
    path: &Path,
    stop: watch::Receiver<bool>,
) -> Result<((u64, u64), tokio::task::JoinHandle<()>), ServerError> {
    let _ = std::fs::remove_file(path);
    let listener = UnixListener::bind(path).map_err(|source| ServerError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    let ino = inode(path).unwrap_or((0, 0));
    let svc = DevicePluginServer::new(PluginService::new(agent.clone(), res));
    let mut stop = stop;
    let task = tokio::spawn(async move {
        // Clients that send the socket path as `:authority` (every gRPC
        // but grpc-go) are served too: see `crate::authority`.
        let r = authority::serve(listener, Routes::new(svc), async move {
            let _ = stop.wait_for(|s| *s).await;
        })
        .await;
        if let Err(e) = r {
            tracing::error!("plugin server: {e}");
        }
    });
    Ok((ino, task))
}

/// Serves resource `res` and keeps it registered until `stop` becomes true;
/// then removes the socket.
pub async fn run_resource(
    agent: Arc<Agent>,
    res: usize,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let plan = &agent.plans[res];
    let dir = agent.settings.plugin_dir.clone();
    let sock_name = plan.socket_name();
    let path = dir.join(&sock_name);
    let kubelet = dir.join(&agent.settings.kubelet_socket);
    let name = plan.name.clone();
    'outer: loop {
        // Each incarnation of our server gets its own stop signal, so that a
        // vanished socket can be replaced without stopping the agent.
        let (inner_tx, inner_rx) = watch::channel(false);
        let (ino, task) = bind_and_serve(&agent, res, &path, inner_rx).await?;
        tracing::info!(resource = %name, socket = %path.display(), "serving device plugin");
        let mut registered_with: Option<(u64, u64)> = None;
        let mut backoff = MIN_BACKOFF;
        let mut failures = 0u64;
        loop {
            if stop.has_changed().is_err() || *stop.borrow() {
                let _ = inner_tx.send(true);
                // Open ListAndWatch streams never end by themselves: give
                // in-flight calls a moment, then drop the connections.
                let abort = task.abort_handle();
                if tokio::time::timeout(STOP_GRACE, task).await.is_err() {
                    abort.abort();
                }
                let _ = std::fs::remove_file(&path);
                agent.set_registered(res, false);
                tracing::info!(resource = %name, "stopped; socket removed");
                return Ok(());
            }
            if inode(&path) != Some(ino) {
                tracing::warn!(resource = %name, "plugin socket vanished (kubelet restart?); serving again");
                agent.set_registered(res, false);
                // The old kubelet's connections are dead; do not wait on them.
                let _ = inner_tx.send(true);
                task.abort();
                continue 'outer;
            }
            let k = inode(&kubelet);
            if k.is_none() && registered_with.is_some() {
                tracing::warn!(resource = %name, "kubelet socket gone; waiting for it");
                registered_with = None;
                agent.set_registered(res, false);
            }
            if k.is_some() && k != registered_with {
                match register(&kubelet, &sock_name, &name).await {
                    Ok(()) => {
                        tracing::info!(resource = %name, "registered with kubelet");
                        registered_with = k;
                        backoff = MIN_BACKOFF;
                        failures = 0;
                        agent.set_registered(res, true);
                        agent
                            .metrics
                            .registrations
                            .get_or_create(&ResourceLabels {
                                resource: name.clone(),
                            })
                            .inc();
                    }
                    Err(e) => {
                        failures += 1;
                        if failures == 1 || failures.is_multiple_of(100) {
                            tracing::warn!(resource = %name, failures, "registration failed: {e}; retrying every {MAX_BACKOFF:?} at most");
                        } else {
                            tracing::debug!(resource = %name, "registration failed: {e}");
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(backoff) => {}
                            _ = stop.changed() => {}
                        }
                        // Capped low: a kubelet coming back must see us within a second,
                        // and a refused connect on a stale socket costs nothing.
                        backoff = (backoff * 2).min(MAX_BACKOFF);
                        continue;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(WATCH_PERIOD) => {}
                _ = stop.changed() => {}
            }
        }
    }
}

//! The kubelet-facing gRPC of the DRA mode, each on its own unix socket:
//! the plugin registration service (`pluginregistration.Registration`) in
//! the kubelet's plugin registry directory, and the DRA service in v1 and
//! v1beta1 (`k8s.io.kubelet.pkg.apis.dra.v1[beta1].DRAPlugin`) with the
//! resource-health service (`v1.DRAResourceHealth`) on the endpoint the
//! registration names.

use super::DraSettings;
use super::prepare::{ClaimRef, PreparedDevice, Preparer};
use crate::authority;
use crate::registration_api as reg;
use crate::server::ServerError;
use crate::{dra_v1 as v1, dra_v1beta1 as v1beta1};
use gpusched_model::dra::DRIVER;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::UnixListener;
use tokio::sync::watch;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// Plugin type of a DRA driver in `PluginInfo`.
pub const PLUGIN_TYPE: &str = "DRAPlugin";
/// The services this plugin serves, as the kubelet names them.
pub const SUPPORTED_SERVICES: [&str; 3] =
    ["v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth"];
/// How often the health stream repeats the full list without a change.
pub const HEALTH_HEARTBEAT: Duration = Duration::from_secs(10);
/// The timeout sent with each device's health (three heartbeats).
pub const HEALTH_TIMEOUT_SECONDS: i64 = 30;

/// The claims of a request, checked: every claim needs a namespace, a name
/// and a UID (responses are keyed by UID).
fn claim_refs<'a>(
    method: &str,
    claims: impl Iterator<Item = (&'a str, &'a str, &'a str)>,
) -> Result<Vec<ClaimRef>, Status> {
    let mut out = Vec::new();
    for (i, (namespace, name, uid)) in claims.enumerate() {
        let missing: Vec<&str> = [("namespace", namespace), ("name", name), ("uid", uid)]
            .iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| *k)
            .collect();
        if !missing.is_empty() {
            return Err(Status::invalid_argument(format!(
                "{method}: claim #{i} ({namespace:?}/{name:?}, uid {uid:?}) has no {}",
                missing.join(", ")
            )));
        }
        out.push(ClaimRef {
            namespace: namespace.into(),
            name: name.into(),
            uid: uid.into(),
        });
    }
    Ok(out)
}

/// Prepares every claim; a claim that fails gets its own error.
pub async fn prepare_all(
    p: &Preparer,
    claims: &[ClaimRef],
) -> HashMap<String, Result<Vec<PreparedDevice>, String>> {
    let mut out = HashMap::new();
    for c in claims {
        let r = p.prepare(c).await;
        if let Err(e) = &r {
            tracing::warn!("prepare: {e}");
        }
        out.insert(c.uid.clone(), r);
    }
    out
}

/// Unprepares every claim; a claim that fails gets its own error.
pub async fn unprepare_all(p: &Preparer, claims: &[ClaimRef]) -> HashMap<String, String> {
    let mut out = HashMap::new();
    for c in claims {
        let r = p.unprepare(c).await;
        if let Err(e) = &r {
            tracing::warn!("unprepare: {e}");
        }
        out.insert(c.uid.clone(), r.err().unwrap_or_default());
    }
    out
}

/// The DRA service (both versions).
#[derive(Clone)]
pub struct DraService {
    preparer: Arc<Preparer>,
}

impl DraService {
    /// A DRA plugin service preparing claims with `preparer`.
    pub fn new(preparer: Arc<Preparer>) -> Self {
        DraService { preparer }
    }
}

#[tonic::async_trait]
impl v1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<v1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1::NodePrepareResourcesResponse>, Status> {
        let r = req.into_inner();
        let claims = claim_refs(
            "NodePrepareResources",
            r.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.name.as_str(), c.uid.as_str())),
        )?;
        let done = prepare_all(&self.preparer, &claims).await;
        let claims = done
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devs) => v1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| v1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                                share_id: d.share_id,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => v1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(v1::NodePrepareResourcesResponse { claims }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1::NodeUnprepareResourcesResponse>, Status> {
        let r = req.into_inner();
        let claims = claim_refs(
            "NodeUnprepareResources",
            r.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.name.as_str(), c.uid.as_str())),
        )?;
        let claims = unprepare_all(&self.preparer, &claims)
            .await
            .into_iter()
            .map(|(uid, error)| (uid, v1::NodeUnprepareResourceResponse { error }))
            .collect();
        Ok(Response::new(v1::NodeUnprepareResourcesResponse { claims }))
    }
}

#[tonic::async_trait]
impl v1beta1::dra_plugin_server::DraPlugin for DraService {
    async fn node_prepare_resources(
        &self,
        req: Request<v1beta1::NodePrepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodePrepareResourcesResponse>, Status> {
        let r = req.into_inner();
        let claims = claim_refs(
            "NodePrepareResources",
            r.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.name.as_str(), c.uid.as_str())),
        )?;
        let done = prepare_all(&self.preparer, &claims).await;
        let claims = done
            .into_iter()
            .map(|(uid, r)| {
                let resp = match r {
                    Ok(devs) => v1beta1::NodePrepareResourceResponse {
                        devices: devs
                            .into_iter()
                            .map(|d| v1beta1::Device {
                                request_names: d.request_names,
                                pool_name: d.pool,
                                device_name: d.device,
                                cdi_device_ids: d.cdi_device_ids,
                            })
                            .collect(),
                        error: String::new(),
                    },
                    Err(e) => v1beta1::NodePrepareResourceResponse {
                        devices: Vec::new(),
                        error: e,
                    },
                };
                (uid, resp)
            })
            .collect();
        Ok(Response::new(v1beta1::NodePrepareResourcesResponse {
            claims,
        }))
    }

    async fn node_unprepare_resources(
        &self,
        req: Request<v1beta1::NodeUnprepareResourcesRequest>,
    ) -> Result<Response<v1beta1::NodeUnprepareResourcesResponse>, Status> {
        let r = req.into_inner();
        let claims = claim_refs(
            "NodeUnprepareResources",
            r.claims
                .iter()
                .map(|c| (c.namespace.as_str(), c.name.as_str(), c.uid.as_str())),
        )?;
        let claims = unprepare_all(&self.preparer, &claims)
            .await
            .into_iter()
            .map(|(uid, error)| (uid, v1beta1::NodeUnprepareResourceResponse { error }))
            .collect();
        Ok(Response::new(v1beta1::NodeUnprepareResourcesResponse {
            claims,
        }))
    }
}

/// The DRA resource-health service: every device of the node's slice with
/// its health, at once, on every health change and every
/// [`HEALTH_HEARTBEAT`].
#[derive(Clone)]
pub struct HealthService {
    agent: Arc<crate::agent::Agent>,
    node: String,
    heartbeat: Duration,
    /// Ends every stream (a graceful server shutdown waits for them).
    stop: watch::Receiver<bool>,
}

impl HealthService {
    /// A health service for `node` that repeats the full list every `heartbeat` until `stop`.
    pub fn new(
        agent: Arc<crate::agent::Agent>,
        node: &str,
        heartbeat: Duration,
        stop: watch::Receiver<bool>,
    ) -> Self {
        HealthService {
            agent,
            node: node.to_string(),
            heartbeat,
            stop,
        }
    }

    /// The health of every published device now.
    pub fn snapshot(&self) -> crate::dra_health_v1::NodeWatchResourcesResponse {
        use super::slice::{GpuCondition, published_gpus};
        use crate::dra_health_v1 as h;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        let conds = self.agent.gpu_conditions();
        let inv = &self.agent.inventory;
        let devices = published_gpus(inv)
            .into_iter()
            .map(|g| {
                let cond = inv
                    .gpus
                    .iter()
                    .position(|x| x.uuid == g.uuid)
                    .and_then(|i| conds.get(i).cloned())
                    .unwrap_or(GpuCondition::Healthy);
                let (health, message) = match cond {
                    GpuCondition::Healthy => (h::HealthStatus::Healthy, String::new()),
                    GpuCondition::Unhealthy(r) => (h::HealthStatus::Unhealthy, r),
                };
                h::DeviceHealth {
                    device: Some(h::DeviceIdentifier {
                        pool_name: self.node.clone(),
                        device_name: gpusched_model::dra::gpu_device_name(g.index),
                    }),
                    health: health as i32,
                    last_updated_time: now,
                    health_check_timeout_seconds: HEALTH_TIMEOUT_SECONDS,
                    message,
                }
            })
            .collect();
        h::NodeWatchResourcesResponse { devices }
    }
}

#[tonic::async_trait]
impl crate::dra_health_v1::dra_resource_health_server::DraResourceHealth for HealthService {
    type NodeWatchResourcesStream = std::pin::Pin<
        Box<
            dyn tokio_stream::Stream<
                    Item = Result<crate::dra_health_v1::NodeWatchResourcesResponse, Status>,
                > + Send,
        >,
    >;

    async fn node_watch_resources(
        &self,
        _req: Request<crate::dra_health_v1::NodeWatchResourcesRequest>,
    ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let me = self.clone();
        let mut changes = self.agent.health_gen.subscribe();
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                if *stop.borrow() {
                    return;
                }
                if tx.send(Ok(me.snapshot())).await.is_err() {
                    return;
                }
                tokio::select! {
                    r = changes.changed() => if r.is_err() { return },
                    _ = tokio::time::sleep(me.heartbeat) => {}
                    _ = tx.closed() => return,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

/// The registration service the kubelet's plugin watcher calls.
pub struct RegistrationService {
    endpoint: String,
    /// `Some(true)` once the kubelet registered the plugin, `Some(false)`
    /// when it refused.
    status: watch::Sender<Option<bool>>,
}

impl RegistrationService {
    /// A registration service naming `endpoint`; the kubelet's answer goes to `status`.
    pub fn new(endpoint: &Path, status: watch::Sender<Option<bool>>) -> Self {
        RegistrationService {
            endpoint: endpoint.display().to_string(),
            status,
        }
    }
}

#[tonic::async_trait]
impl reg::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _req: Request<reg::InfoRequest>,
    ) -> Result<Response<reg::PluginInfo>, Status> {
        Ok(Response::new(reg::PluginInfo {
            r#type: PLUGIN_TYPE.into(),
            name: DRIVER.into(),
            endpoint: self.endpoint.clone(),
            supported_versions: SUPPORTED_SERVICES.iter().map(|s| s.to_string()).collect(),
        }))
    }

    async fn notify_registration_status(
        &self,
        req: Request<reg::RegistrationStatus>,
    ) -> Result<Response<reg::RegistrationStatusResponse>, Status> {
        let s = req.into_inner();
        if s.plugin_registered {
            tracing::info!(endpoint = %self.endpoint, "the kubelet registered the DRA plugin");
        } else {
            tracing::error!(endpoint = %self.endpoint, "the kubelet refused the DRA plugin: {}", s.error);
        }
        self.status.send_replace(Some(s.plugin_registered));
        Ok(Response::new(reg::RegistrationStatusResponse {}))
    }
}

/// A bound socket that is removed when dropped.
struct Socket(PathBuf);

impl Drop for Socket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn bind(path: &Path) -> Result<(UnixListener, Socket), ServerError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServerError::Bind {
            path: path.to_path_buf(),
            source,
        })?;
    }
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).map_err(|source| ServerError::Bind {
        path: path.to_path_buf(),
        source,
    })?;
    Ok((l, Socket(path.to_path_buf())))
}

/// Serves the DRA service, then the registration (so the endpoint answers
/// before the kubelet learns it), until `stop` fires; removes both sockets.
pub async fn serve(
    settings: &DraSettings,
    preparer: Arc<Preparer>,
    health: HealthService,
    status: watch::Sender<Option<bool>>,
    stop: watch::Receiver<bool>,
) -> Result<(), ServerError> {
    let (dra_l, _dra_sock) = bind(&settings.dra_socket())?;
    let svc = DraService::new(preparer);
    let mut s1 = stop.clone();
    let dra = tokio::spawn(async move {
        let routes = Routes::new(v1::dra_plugin_server::DraPluginServer::new(svc.clone()))
            .add_service(v1beta1::dra_plugin_server::DraPluginServer::new(svc))
            .add_service(
                crate::dra_health_v1::dra_resource_health_server::DraResourceHealthServer::new(
                    health,
                ),
            );
        authority::serve(dra_l, routes, async move {
            let _ = s1.wait_for(|s| *s).await;
        })
        .await
    });
    let (reg_l, _reg_sock) = bind(&settings.registration_socket())?;
    tracing::info!(
        registration = %settings.registration_socket().display(),
        endpoint = %settings.kubelet_endpoint().display(),
        "serving the DRA plugin"
    );
    let regsvc = RegistrationService::new(&settings.kubelet_endpoint(), status);
    let mut s2 = stop.clone();
    let routes = Routes::new(reg::registration_server::RegistrationServer::new(regsvc));
    let r = authority::serve(reg_l, routes, async move {
        let _ = s2.wait_for(|s| *s).await;
    })
    .await;
    if let Err(e) = r {
        tracing::error!("DRA registration server: {e}");
    }
    match dra.await {
        Ok(Err(e)) => tracing::error!("DRA plugin server: {e}"),
        Err(e) => tracing::error!("DRA plugin server task: {e}"),
        Ok(Ok(())) => {}
    }
    Ok(())
}

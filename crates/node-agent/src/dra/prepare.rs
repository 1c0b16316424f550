//! `NodePrepareResources` / `NodeUnprepareResources`: what a claim's
//! allocation gives this node, the CDI spec that hands it to the runtime,
//! and a checkpoint of prepared claims so that a restarted agent answers
//! the kubelet exactly as before and never gives a prepared GPU twice.
//!
//! A claim is prepared when the API server's copy (read by namespace and
//! name) has the UID the kubelet asked for, is allocated, is reserved for
//! at least one consumer, and every device of this driver in its
//! allocation is in this node's pool and names a device of this node: a
//! whole GPU (`gpu-<index>`), a share of one (a result with a `shareID`
//! and the `milli` it consumed, when the agent publishes shares), or an
//! existing MIG instance (`gpu-<index>-mig-<k>`). Both
//! calls are idempotent: preparing a prepared claim returns what it
//! returned the first time (without reading the API server), and
//! unpreparing an unknown claim succeeds.

use super::cdi;
use super::slice::GPU_MILLI;
use crate::backend::{GpuInfo, Inventory, MigInfo};
use crate::coord::BoxFuture;
use gpusched_model::dra;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Reads claims from the API server (a fake in tests).
pub trait ClaimSource: Send + Sync + 'static {
    /// `Ok(None)` when the claim does not exist.
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, String>>;
}

/// The claim a kubelet names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRef {
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub name: String,
    /// The claim's UID.
    pub uid: String,
}

impl std::fmt::Display for ClaimRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "claim {}/{} (uid {})",
            self.namespace, self.name, self.uid
        )
    }
}

/// One prepared device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedDevice {
    /// The claim's requests that got this device (`req` or `req/sub`).
    pub request_names: Vec<String>,
    /// The ResourceSlice pool (the node's name).
    pub pool: String,
    /// The device's name in the pool.
    pub device: String,
    /// The GPU's UUID (a MIG instance's: its `MIG-…` UUID).
    pub uuid: String,
    /// The CDI device names handed to the kubelet.
    pub cdi_device_ids: Vec<String>,
    /// A share of the GPU: the allocation's share ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_id: Option<String>,
    /// A share of the GPU: the milli-GPUs it consumed (1–1000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
}

/// One prepared claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreparedClaim {
    /// The claim.
    pub claim: ClaimRef,
    /// Its devices.
    pub devices: Vec<PreparedDevice>,
}

/// The checkpoint file's content.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// Always `v1`.
    pub version: String,
    /// Prepared claims by UID.
    pub claims: BTreeMap<String, PreparedClaim>,
}

/// Version of the checkpoint format.
pub const CHECKPOINT_VERSION: &str = "v1";

/// The checkpoint could not be read at start.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The checkpoint exists but cannot be read.
    #[error("cannot read DRA checkpoint {path}: {source}")]
    Read {
        /// The checkpoint file.
        path: PathBuf,
        /// Why reading failed.
        source: std::io::Error,
    },
    #[error(
        "DRA checkpoint {path} is not valid: {why} (it records the claims this node prepared; fix or remove it once no pod on this node uses a claim of gpu.gpusched.io)"
    )]
    /// The checkpoint is not valid JSON of this format and version.
    Invalid {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The CDI spec of a prepared claim could not be written again.
    #[error("cannot rewrite the CDI spec {path} of a prepared claim: {source}")]
    Cdi {
        /// The CDI spec file.
        path: PathBuf,
        /// Why writing failed.
        source: std::io::Error,
    },
}

impl Checkpoint {
    /// Reads `path`; a missing file is an empty checkpoint.
    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(Checkpoint {
                    version: CHECKPOINT_VERSION.into(),
                    claims: BTreeMap::new(),
                });
            }
            Err(source) => {
                return Err(CheckpointError::Read {
                    path: path.into(),
                    source,
                });
            }
        };
        let c: Checkpoint = serde_json::from_str(&text).map_err(|e| CheckpointError::Invalid {
            path: path.into(),
            why: e.to_string(),
        })?;
        if c.version != CHECKPOINT_VERSION {
            return Err(CheckpointError::Invalid {
                path: path.into(),
                why: format!(
                    "version {:?}, this agent reads {CHECKPOINT_VERSION:?}",
                    c.version
                ),
            });
        }
        for (uid, p) in &c.claims {
            if uid != &p.claim.uid {
                return Err(CheckpointError::Invalid {
                    path: path.into(),
                    why: format!("entry {uid} holds {}", p.claim),
                });
            }
        }
        Ok(c)
    }

    /// Writes `path` (temporary name, then rename).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, path)
    }

    /// The claim holding the GPU `uuid`, if any.
    pub fn holder<'a>(&'a self, uuid: &'a str) -> Option<&'a ClaimRef> {
        self.holders(uuid).next().map(|(c, _)| c)
    }

    /// Every prepared device on `uuid`, with its claim.
    pub fn holders<'a>(
        &'a self,
        uuid: &'a str,
    ) -> impl Iterator<Item = (&'a ClaimRef, &'a PreparedDevice)> + 'a {
        self.claims.values().flat_map(move |p| {
            p.devices
                .iter()
                .filter(move |d| d.uuid == uuid)
                .map(move |d| (&p.claim, d))
        })
    }
}

/// One device of this node a claim's allocation names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Allocated {
    /// The claim's requests that got it (`req` or `req/sub`).
    pub requests: Vec<String>,
    /// The device's name in the slice.
    pub device: String,
    /// The GPU's position in the inventory (a MIG instance's GPU).
    pub gpu: usize,
    /// The MIG instance's position in its GPU's list.
    pub mig: Option<usize>,
    /// A share: its ID and milli-GPUs.
    pub share: Option<(String, u32)>,
}

/// The GPU or MIG instance with UUID `uuid` on this node.
pub fn find_uuid<'a>(inv: &'a Inventory, uuid: &str) -> Option<(&'a GpuInfo, Option<&'a MigInfo>)> {
    inv.gpus.iter().find_map(|g| {
        if g.uuid == uuid {
            Some((g, None))
        } else {
            g.mig.iter().find(|m| m.uuid == uuid).map(|m| (g, Some(m)))
        }
    })
}

/// The milli-GPUs a share result consumed (`consumedCapacity` `milli`, in
/// the driver's domain or fully qualified).
fn share_milli(
    r: &k8s_openapi::api::resource::v1::DeviceRequestAllocationResult,
) -> Result<u32, String> {
    let consumed = r.consumed_capacity.as_ref();
    let q = consumed
        .and_then(|c| {
            c.get(dra::CAPACITY_MILLI)
                .or_else(|| c.get(&format!("{}/{}", dra::DRIVER, dra::CAPACITY_MILLI)))
        })
        .ok_or_else(|| "no consumedCapacity milli".to_string())?;
    let v = gpusched_model::quantity::parse_integer(&q.0)
        .map_err(|e| format!("consumedCapacity milli {:?}: {e}", q.0))?;
    u32::try_from(v)
        .ok()
        .filter(|v| (1..=GPU_MILLI).contains(v))
        .ok_or_else(|| format!("consumedCapacity milli {:?} is not 1 to {GPU_MILLI}", q.0))
}

/// What the allocation of `claim` gives node `node`: each device with the
/// requests that got it. `shares`: whether this node publishes GPUs for
/// sharing. Errors name the claim and say what is wrong.
pub fn allocated_devices(
    claim: &ResourceClaim,
    want: &ClaimRef,
    node: &str,
    inv: &Inventory,
    shares: bool,
) -> Result<Vec<Allocated>, String> {
    let uid = claim.metadata.uid.as_deref().unwrap_or("");
    if uid != want.uid {
        return Err(format!(
            "{want}: the API server's claim has uid {uid:?} (deleted and created again?)"
        ));
    }
    let status = claim.status.as_ref();
    let Some(alloc) = status.and_then(|s| s.allocation.as_ref()) else {
        return Err(format!("{want} is not allocated"));
    };
    if status
        .and_then(|s| s.reserved_for.as_ref())
        .is_none_or(|r| r.is_empty())
    {
        return Err(format!("{want} is not reserved for any pod"));
    }
    if let Some(sel) = &alloc.node_selector
        && !selects_node(sel, node)
    {
        return Err(format!(
            "{want} is allocated for other nodes (its node selector does not name node {node})"
        ));
    }
    let mut out: Vec<Allocated> = Vec::new();
    let results = alloc.devices.as_ref().and_then(|d| d.results.as_ref());
    for r in results.into_iter().flatten() {
        if r.driver != dra::DRIVER {
            continue;
        }
        if r.pool != node {
            return Err(format!(
                "{want}: device {} of request {:?} is in pool {:?}, not in this node's pool {node:?}",
                r.device, r.request, r.pool
            ));
        }
        if r.admin_access == Some(true) {
            return Err(format!(
                "{want}: request {:?} asks for admin access to {}, which this driver does not support yet",
                r.request, r.device
            ));
        }
        let (gpu, mig) = if let Some(index) = dra::gpu_device_index(&r.device) {
            let Some(pos) = inv
                .gpus
                .iter()
                .position(|g| g.index == index && !g.mig_enabled)
            else {
                return Err(format!(
                    "{want}: device {} of request {:?}: node {node} has no whole GPU with index {index}",
                    r.device, r.request
                ));
            };
            (pos, None)
        } else if let Some((index, k)) = dra::mig_device_index(&r.device) {
            let found = inv
                .gpus
                .iter()
                .position(|g| g.index == index && g.mig_enabled)
                .filter(|&p| k < inv.gpus[p].mig.len());
            let Some(pos) = found else {
                return Err(format!(
                    "{want}: device {} of request {:?}: node {node} has no MIG instance {k} on GPU {index} (the agent never creates instances)",
                    r.device, r.request
                ));
            };
            (pos, Some(k))
        } else {
            return Err(format!(
                "{want}: device {:?} of request {:?} is not a device of {} (gpu-<index> or gpu-<index>-mig-<k>)",
                r.device,
                r.request,
                dra::DRIVER
            ));
        };
        let share = match r.share_id.as_deref().filter(|s| !s.is_empty()) {
            None => None,
            Some(id) => {
                if !shares || mig.is_some() {
                    return Err(format!(
                        "{want}: device {} of request {:?} is allocated as a share (shareID {id}), but this node does not publish it for sharing (agent flag --shares)",
                        r.device, r.request
                    ));
                }
                let milli = share_milli(r).map_err(|e| {
                    format!(
                        "{want}: device {} of request {:?} (shareID {id}): {e}",
                        r.device, r.request
                    )
                })?;
                Some((id.to_string(), milli))
            }
        };
        match out.iter_mut().find(|a| {
            a.device == r.device && a.share.as_ref().map(|s| &s.0) == share.as_ref().map(|s| &s.0)
        }) {
            Some(a) => {
                if !a.requests.contains(&r.request) {
                    a.requests.push(r.request.clone());
                }
            }
            None => out.push(Allocated {
                requests: vec![r.request.clone()],
                device: r.device.clone(),
                gpu,
                mig,
                share,
            }),
        }
    }
    if out.is_empty() {
        return Err(format!(
            "{want}: its allocation has no device of driver {}",
            dra::DRIVER
        ));
    }
    Ok(out)
}

/// Whether a claim's node selector allows `node`. Terms on
/// `metadata.name` (what allocators write) are checked; a term on labels
/// only cannot be checked without the Node and is taken as allowing it.
fn selects_node(sel: &k8s_openapi::api::core::v1::NodeSelector, node: &str) -> bool {
    sel.node_selector_terms.iter().any(|t| {
        let fields = t.match_fields.as_deref().unwrap_or(&[]);
        fields.iter().all(|f| {
            f.key != "metadata.name"
                || match f.operator.as_str() {
                    "In" => f.values.iter().flatten().any(|v| v == node),
                    "NotIn" => !f.values.iter().flatten().any(|v| v == node),
                    _ => false,
                }
        })
    })
}

/// Prepares and unprepares claims; one at a time.
pub struct Preparer {
    node: String,
    inventory: Inventory,
    cdi_dir: PathBuf,
    checkpoint_path: PathBuf,
    device_nodes: bool,
    shares: bool,
    claims: Arc<dyn ClaimSource>,
    state: tokio::sync::Mutex<Checkpoint>,
}

impl Preparer {
    /// Loads the checkpoint and rewrites the CDI specs of the claims it
    /// holds (the CDI directory may be a tmpfs that lost them).
    pub fn new(
        node: &str,
        inventory: Inventory,
        cdi_dir: &Path,
        checkpoint_path: &Path,
        device_nodes: bool,
        shares: bool,
        claims: Arc<dyn ClaimSource>,
    ) -> Result<Preparer, CheckpointError> {
        let state = Checkpoint::load(checkpoint_path)?;
        let p = Preparer {
            node: node.to_string(),
            inventory,
            cdi_dir: cdi_dir.to_path_buf(),
            checkpoint_path: checkpoint_path.to_path_buf(),
            device_nodes,
            shares,
            claims,
            state: tokio::sync::Mutex::new(Checkpoint::default()),
        };
        for c in state.claims.values() {
            let path = cdi::spec_path(&p.cdi_dir, &c.claim.uid);
            let devs = p.cdi_devices(&c.devices);
            if devs.len() != c.devices.len() {
                tracing::warn!(claim = %c.claim, "a GPU of this prepared claim is no longer on the node");
            }
            cdi::write(
                &path,
                &cdi::spec(&claim_label(&c.claim), &devs, device_nodes),
            )
            .map_err(|source| CheckpointError::Cdi { path, source })?;
        }
        if !state.claims.is_empty() {
            tracing::info!(
                claims = state.claims.len(),
                "restored prepared claims from the checkpoint"
            );
        }
        let p = Preparer {
            state: tokio::sync::Mutex::new(state),
            ..p
        };
        Ok(p)
    }

    /// What the CDI spec injects for prepared devices (those still on the
    /// node).
    fn cdi_devices(&self, devices: &[PreparedDevice]) -> Vec<cdi::CdiDevice> {
        devices
            .iter()
            .filter_map(|d| {
                let (g, m) = find_uuid(&self.inventory, &d.uuid)?;
                let name = match &d.share_id {
                    Some(id) => cdi::share_name(&d.uuid, id),
                    None => d.uuid.clone(),
                };
                Some(cdi::CdiDevice {
                    name,
                    visible: d.uuid.clone(),
                    minor: g.minor,
                    caps: m.map(|m| m.caps.clone()).unwrap_or_default(),
                    milli: d.milli,
                })
            })
            .collect()
    }

    /// The prepared claims now.
    pub async fn prepared(&self) -> Checkpoint {
        self.state.lock().await.clone()
    }

    /// Prepares one claim; the error names the claim.
    pub async fn prepare(&self, want: &ClaimRef) -> Result<Vec<PreparedDevice>, String> {
        let mut state = self.state.lock().await;
        if let Some(p) = state.claims.get(&want.uid) {
            return Ok(p.devices.clone());
        }
        let claim = self
            .claims
            .get(&want.namespace, &want.name)
            .await
            .map_err(|e| format!("{want}: cannot read it from the API server: {e}"))?
            .ok_or_else(|| format!("{want} does not exist"))?;
        let alloc = allocated_devices(&claim, want, &self.node, &self.inventory, self.shares)?;
        let devices: Vec<PreparedDevice> = alloc
            .iter()
            .map(|a| {
                let g = &self.inventory.gpus[a.gpu];
                let uuid = match a.mig {
                    Some(k) => g.mig[k].uuid.clone(),
                    None => g.uuid.clone(),
                };
                let cdi_name = match &a.share {
                    Some((id, _)) => cdi::share_name(&uuid, id),
                    None => uuid.clone(),
                };
                PreparedDevice {
                    request_names: a.requests.clone(),
                    pool: self.node.clone(),
                    device: a.device.clone(),
                    cdi_device_ids: vec![cdi::device_id(&cdi_name)],
                    uuid,
                    share_id: a.share.as_ref().map(|s| s.0.clone()),
                    milli: a.share.as_ref().map(|s| s.1),
                }
            })
            .collect();
        // Never twice: a GPU (or MIG instance) is one claim's, or shared
        // by claims whose shares add up to at most the whole GPU.
        for d in &devices {
            let mut taken = 0u32;
            for (other, od) in state.holders(&d.uuid) {
                match (od.milli, d.milli) {
                    (Some(m), Some(_)) => taken = taken.saturating_add(m),
                    _ => {
                        return Err(format!(
                            "{want}: {} ({}) is prepared for {other}; a GPU is given to one claim at a time unless both are shares",
                            d.device, d.uuid
                        ));
                    }
                }
            }
            let mine: u32 = devices
                .iter()
                .filter(|x| x.uuid == d.uuid)
                .map(|x| x.milli.unwrap_or(GPU_MILLI))
                .sum();
            if taken.saturating_add(mine) > GPU_MILLI {
                return Err(format!(
                    "{want}: shares of {} ({}) would add up to {} milli with the claims prepared already ({taken}); a GPU has {GPU_MILLI}",
                    d.device,
                    d.uuid,
                    taken.saturating_add(mine)
                ));
            }
        }
        let infos = self.cdi_devices(&devices);
        let path = cdi::spec_path(&self.cdi_dir, &want.uid);
        cdi::write(
            &path,
            &cdi::spec(&claim_label(want), &infos, self.device_nodes),
        )
        .map_err(|e| format!("{want}: cannot write CDI spec {}: {e}", path.display()))?;
        state.claims.insert(
            want.uid.clone(),
            PreparedClaim {
                claim: want.clone(),
                devices: devices.clone(),
            },
        );
        if let Err(e) = state.save(&self.checkpoint_path) {
            state.claims.remove(&want.uid);
            let _ = cdi::remove(&path);
            return Err(format!(
                "{want}: cannot write the checkpoint {}: {e}",
                self.checkpoint_path.display()
            ));
        }
        tracing::info!(claim = %want, devices = ?devices.iter().map(|d| &d.device).collect::<Vec<_>>(), "prepared");
        Ok(devices)
    }

    /// Unprepares one claim (unknown claims are done already). The
    /// checkpoint forgets the claim before its CDI spec goes, so a failure
    /// in between leaves only a spec file, which a retry removes.
    pub async fn unprepare(&self, want: &ClaimRef) -> Result<(), String> {
        let mut state = self.state.lock().await;
        if let Some(old) = state.claims.remove(&want.uid) {
            if let Err(e) = state.save(&self.checkpoint_path) {
                state.claims.insert(want.uid.clone(), old);
                return Err(format!(
                    "{want}: cannot write the checkpoint {}: {e}",
                    self.checkpoint_path.display()
                ));
            }
            tracing::info!(claim = %want, "unprepared");
        }
        let path = cdi::spec_path(&self.cdi_dir, &want.uid);
        cdi::remove(&path)
            .map_err(|e| format!("{want}: cannot remove CDI spec {}: {e}", path.display()))
    }
}

fn claim_label(c: &ClaimRef) -> String {
    format!("{}/{}", c.namespace, c.name)
}

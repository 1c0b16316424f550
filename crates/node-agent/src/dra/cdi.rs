//! CDI specs (cdi.k8s.io, Container Device Interface) of prepared claims.
//!
//! One spec file per claim, `k8s.gpu.gpusched.io-claim_<uid>.json`, kind
//! `k8s.gpu.gpusched.io/gpu`, one device per GPU named by its UUID (a MIG
//! instance by its `MIG-…` UUID), so a container's CDI id is
//! `k8s.gpu.gpusched.io/gpu=<uuid>`. A GPU or instance is in at most one
//! prepared claim at a time (`prepare` refuses a second), so no two spec
//! files define the same device; a share of a GPU is named
//! `<uuid>-share-<shareID>` ([`share_name`]) for the same reason, as
//! several claims' shares sit on one GPU. Each device injects its
//! `/dev/nvidia<minor>` node (and a MIG instance its capability nodes)
//! when device specs are passed; the spec's own edits set
//! `NVIDIA_VISIBLE_DEVICES` to the claim's GPUs and add the control nodes,
//! and, when the claim has a share, `GPUSCHED_GPU_MILLI` to each GPU's
//! milli-GPUs in the same order (1000 for a whole GPU). Files are written
//! to a temporary name and renamed, so a runtime never reads half a spec.

use serde_json::json;
use std::path::{Path, PathBuf};

/// CDI vendor of the specs.
pub const VENDOR: &str = "k8s.gpu.gpusched.io";
/// CDI class of the specs.
pub const CLASS: &str = "gpu";
/// CDI spec version written (plain env and device nodes need no newer).
pub const CDI_VERSION: &str = "0.5.0";
/// Control device nodes every container with a GPU needs.
pub const CONTROL_NODES: [&str; 3] = ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"];

/// The fully qualified CDI id of a GPU.
pub fn device_id(uuid: &str) -> String {
    format!("{VENDOR}/{CLASS}={uuid}")
}

/// The CDI device name of a share of GPU `uuid`.
pub fn share_name(uuid: &str, share_id: &str) -> String {
    format!("{uuid}-share-{share_id}")
}

/// One device of a claim's spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CdiDevice {
    /// The CDI device name (the UUID, or [`share_name`]).
    pub name: String,
    /// What `NVIDIA_VISIBLE_DEVICES` names: the GPU's or MIG instance's UUID.
    pub visible: String,
    /// The GPU's `/dev/nvidia<minor>`.
    pub minor: u32,
    /// A MIG instance's capability device nodes.
    pub caps: Vec<String>,
    /// A share's milli-GPUs.
    pub milli: Option<u32>,
}

/// Environment variable with each GPU's milli-GPUs, when a claim holds a
/// share (comma-separated, in `NVIDIA_VISIBLE_DEVICES` order).
pub const ENV_MILLI: &str = "GPUSCHED_GPU_MILLI";

/// The spec file of a claim.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("{VENDOR}-claim_{claim_uid}.json"))
}

/// The spec of a claim holding `devices`.
pub fn spec(claim: &str, devices: &[CdiDevice], device_nodes: bool) -> serde_json::Value {
    let entries: Vec<serde_json::Value> = devices
        .iter()
        .map(|d| {
            let nodes: Vec<serde_json::Value> = if device_nodes {
                std::iter::once(format!("/dev/nvidia{}", d.minor))
                    .chain(d.caps.iter().cloned())
                    .map(|p| json!({"path": p}))
                    .collect()
            } else {
                Vec::new()
            };
            json!({"name": d.name, "containerEdits": {"deviceNodes": nodes}})
        })
        .collect();
    let visible: Vec<&str> = devices.iter().map(|d| d.visible.as_str()).collect();
    let mut env = vec![
        format!("NVIDIA_VISIBLE_DEVICES={}", visible.join(",")),
        format!("GPUSCHED_DRA_CLAIM={claim}"),
    ];
    if devices.iter().any(|d| d.milli.is_some()) {
        let milli: Vec<String> = devices
            .iter()
            .map(|d| d.milli.unwrap_or(super::slice::GPU_MILLI).to_string())
            .collect();
        env.push(format!("{ENV_MILLI}={}", milli.join(",")));
    }
    let mut edits = json!({ "env": env });
    if device_nodes {
        edits["deviceNodes"] = CONTROL_NODES.iter().map(|p| json!({"path": p})).collect();
    }
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": format!("{VENDOR}/{CLASS}"),
        "devices": entries,
        "containerEdits": edits,
    })
}

/// Writes `spec` to `path` (temporary name, then rename).
pub fn write(path: &Path, spec: &serde_json::Value) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("json.tmp");
    let text = serde_json::to_vec_pretty(spec).map_err(std::io::Error::other)?;
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)
}

/// Removes a spec file; a missing file is not an error.
pub fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

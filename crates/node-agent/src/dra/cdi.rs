//! CDI specs (cdi.k8s.io, Container Device Interface) of prepared claims.
//!
//! One spec file per claim, `k8s.gpu.gpusched.io-claim_<uid>.json`, kind
//! `k8s.gpu.gpusched.io/gpu`, one device per GPU named by its UUID, so a
//! container's CDI id is `k8s.gpu.gpusched.io/gpu=<uuid>`. A GPU is in at
//! most one prepared claim at a time (`prepare` refuses a second), so no two
//! spec files define the same device. Each device injects its
//! `/dev/nvidia<minor>` node when device specs are passed; the spec's own
//! edits set `NVIDIA_VISIBLE_DEVICES` to the claim's GPUs and add the
//! control nodes. Files are written to a temporary name and renamed, so a
//! runtime never reads half a spec.

use crate::backend::GpuInfo;
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

/// The spec file of a claim.
pub fn spec_path(dir: &Path, claim_uid: &str) -> PathBuf {
    dir.join(format!("{VENDOR}-claim_{claim_uid}.json"))
}

/// The spec of a claim holding `gpus`.
pub fn spec(claim: &str, gpus: &[&GpuInfo], device_nodes: bool) -> serde_json::Value {
    let devices: Vec<serde_json::Value> = gpus
        .iter()
        .map(|g| {
            let nodes: Vec<serde_json::Value> = if device_nodes {
                vec![json!({"path": format!("/dev/nvidia{}", g.minor)})]
            } else {
                Vec::new()
            };
            json!({"name": g.uuid, "containerEdits": {"deviceNodes": nodes}})
        })
        .collect();
    let visible: Vec<&str> = gpus.iter().map(|g| g.uuid.as_str()).collect();
    let mut edits = json!({"env": [
        format!("NVIDIA_VISIBLE_DEVICES={}", visible.join(",")),
        format!("GPUSCHED_DRA_CLAIM={claim}"),
    ]});
    if device_nodes {
        edits["deviceNodes"] = CONTROL_NODES.iter().map(|p| json!({"path": p})).collect();
    }
    json!({
        "cdiVersion": CDI_VERSION,
        "kind": format!("{VENDOR}/{CLASS}"),
        "devices": devices,
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

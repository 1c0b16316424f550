//! The agent as a DRA kubelet plugin (`gpusched agent --mode dra`,
//! `docs/dra.md` "Node side").
//!
//! Layers: [`slice`](mod@slice) turns the inventory and health into this node's
//! ResourceSlice (pure); [`cdi`] writes the CDI spec of a prepared claim;
//! [`prepare`] checks a claim's allocation and keeps what was prepared in a
//! checkpoint; [`grpc`] serves the kubelet's DRA API (v1 and v1beta1) and
//! the plugin registration; [`kube`] reads claims and publishes slices on
//! the API server.

pub mod cdi;
pub mod grpc;
pub mod kube;
pub mod prepare;
pub mod slice;

use std::path::PathBuf;
use std::time::Duration;

/// File name of the DRA service socket inside the plugin directory.
pub const DRA_SOCKET: &str = "dra.sock";
/// File name of the checkpoint inside the plugin directory.
pub const CHECKPOINT_FILE: &str = "checkpoint.json";
/// Default kubelet plugin registry directory.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// Default directory of the driver's own socket and checkpoint.
pub const DEFAULT_PLUGIN_DIR: &str = "/var/lib/kubelet/plugins/gpu.gpusched.io";
/// Default CDI spec directory (the runtimes read `/var/run/cdi`).
pub const DEFAULT_CDI_DIR: &str = "/var/run/cdi";
/// Default period of the ResourceSlice check (the kubelet deletes a
/// node's slices when it starts and when a driver goes away).
pub const DEFAULT_SLICE_RESYNC: Duration = Duration::from_secs(10);

/// Settings of the DRA mode.
#[derive(Clone, Debug)]
pub struct DraSettings {
    /// This node's name: the pool name of its slice.
    pub node: String,
    /// Where the registration socket is created.
    pub registry_dir: PathBuf,
    /// Where the DRA service socket and the checkpoint live.
    pub plugin_dir: PathBuf,
    /// `plugin_dir` as the kubelet sees it (the endpoint it is told to dial),
    /// when the agent sees the kubelet's directory under another path.
    pub kubelet_plugin_dir: PathBuf,
    /// Where CDI specs are written.
    pub cdi_dir: PathBuf,
    /// How often the published slice is checked (and re-created when gone).
    pub slice_resync: Duration,
}

impl DraSettings {
    /// Defaults for node `node`.
    pub fn new(node: &str) -> Self {
        DraSettings {
            node: node.to_string(),
            registry_dir: DEFAULT_REGISTRY_DIR.into(),
            plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            kubelet_plugin_dir: DEFAULT_PLUGIN_DIR.into(),
            cdi_dir: DEFAULT_CDI_DIR.into(),
            slice_resync: DEFAULT_SLICE_RESYNC,
        }
    }

    /// The registration socket's path.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", gpusched_model::dra::DRIVER))
    }

    /// The DRA service socket as the agent binds it.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugin_dir.join(DRA_SOCKET)
    }

    /// The DRA service socket as the kubelet dials it.
    pub fn kubelet_endpoint(&self) -> PathBuf {
        self.kubelet_plugin_dir.join(DRA_SOCKET)
    }

    /// The checkpoint of prepared claims.
    pub fn checkpoint(&self) -> PathBuf {
        self.plugin_dir.join(CHECKPOINT_FILE)
    }
}

//! The real kubelet of the real-kubelet tests (`kubelet_e2e`,
//! `dra_kubelet_e2e`, `dra_kubelet_cases_e2e`), driven by the
//! `e2e/cluster/kubelet` script: running a subcommand, a node's kubelet
//! brought up in a short temporary directory, and taken down.
#![allow(dead_code)]

use crate::k8s::{self, Cluster};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

/// The `e2e/cluster/kubelet` script.
pub fn kubelet_script() -> PathBuf {
    k8s::repo_root().join("e2e/cluster/kubelet")
}

/// Runs the script with `args`; its `KEY=VALUE` output lines.
pub fn script(args: &[&str]) -> BTreeMap<String, String> {
    let out = Command::new(kubelet_script())
        .args(args)
        .output()
        .expect("running e2e/cluster/kubelet (build first: e2e/cluster/build)");
    assert!(
        out.status.success(),
        "e2e/cluster/kubelet {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// A temporary directory under /tmp named `prefix…` and the kubelet of
/// node `node` on cluster `c`, up in its `k` subdirectory: the directory
/// and the script's environment (`GPUSCHED_KUBELET_DIR` and the rest).
pub fn kubelet_up(
    c: &Cluster,
    prefix: &str,
    node: &str,
) -> (tempfile::TempDir, BTreeMap<String, String>) {
    // (short path: unix socket paths are limited to 108 bytes)
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .unwrap();
    let kdir = dir.path().join("k");
    let env = script(&[
        "up",
        kdir.to_str().unwrap(),
        "--cluster",
        c.dir.path().to_str().unwrap(),
        "--node",
        node,
    ]);
    (dir, env)
}

/// Takes the kubelet in `kdir` down. `GPUSCHED_E2E_KEEP=1` keeps `dir`
/// (the kubelet's and the agent's logs and state) for a look after a
/// failure.
pub fn kubelet_down(dir: &mut tempfile::TempDir, kdir: &str) {
    if std::env::var_os("GPUSCHED_E2E_KEEP").is_some() {
        dir.disable_cleanup(true);
        eprintln!("kept {}", dir.path().display());
    }
    let _ = Command::new(kubelet_script()).args(["down", kdir]).output();
}

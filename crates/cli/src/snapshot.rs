//! `gpusched snapshot capture`: a live cluster → one file for offline
//! replay (`gpusched simulate --snapshot FILE`).

use anyhow::Context;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// `gpusched snapshot …`
#[derive(Args, Debug)]
pub struct SnapshotArgs {
    #[command(subcommand)]
    cmd: SnapshotCmd,
}

#[derive(Subcommand, Debug)]
enum SnapshotCmd {
    /// Capture the scheduler's view of a live cluster into a file.
    Capture(CaptureArgs),
}

/// Flags of `gpusched snapshot capture`.
#[derive(Args, Debug)]
pub struct CaptureArgs {
    /// Kubeconfig file (default: in-cluster credentials, then $KUBECONFIG / ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Output file (JSON).
    #[arg(short, long, value_name = "FILE")]
    output: PathBuf,
    /// Replace names, namespaces, label values, queues, UIDs and GPU UUIDs by stable pseudonyms.
    #[arg(long)]
    redact: bool,
    /// Scheduler configuration in force (recorded in the file; default: built-in).
    #[arg(long, value_name = "SCHEDULER_CONFIG.yaml")]
    config: Option<PathBuf>,
}

pub fn run(a: SnapshotArgs) -> anyhow::Result<()> {
    let SnapshotCmd::Capture(a) = a.cmd;
    let config = crate::scheduler::read_config(a.config.as_deref())?;
    let mut file =
        gpusched_k8s::tools::snapshot::capture_blocking(a.kubeconfig.as_deref(), &config)?;
    if a.redact {
        file.redact();
    }
    std::fs::write(&a.output, file.to_json())
        .with_context(|| format!("writing {}", a.output.display()))?;
    let pending = file.snapshot.pods.iter().filter(|p| p.is_pending()).count();
    eprintln!(
        "captured {} nodes, {} pods ({} pending){} into {}",
        file.snapshot.nodes.len(),
        file.snapshot.pods.len(),
        pending,
        if a.redact { ", redacted" } else { "" },
        a.output.display()
    );
    Ok(())
}

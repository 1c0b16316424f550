//! `gpusched doctor`: the GPU troubleshooting checklist (checks live in
//! `gpusched_k8s::tools::doctor`). Exit codes: 0 every check passed, 1 warnings
//! only, 2 at least one failure, 3 the checks could not run.

use crate::kubectl::{KubeFlags, Output};
use clap::Args;
use gpusched_k8s::tools::doctor::{self, DoctorOptions, probe::ProbeOptions};
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `gpusched doctor`.
#[derive(Args, Debug)]
pub struct DoctorArgs {
    #[command(flatten)]
    kube: KubeFlags,
    /// Output format: text, json or yaml (camelCase fields; for
    /// automation). `wide` is text.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Same as `-o json` (kept for scripts written before `-o`).
    #[arg(long, hide = true, conflicts_with = "output")]
    json: bool,
    /// Also run a pod asking one GPU (`nvidia-smi -L`) and report what it saw; deleted afterwards.
    #[arg(long)]
    probe: bool,
    /// Report only pods of this namespace (nodes are always checked); the probe runs here.
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    /// Scheduler configuration the pending pods are explained with (default: built-in).
    #[arg(long, value_name = "SCHEDULER_CONFIG.yaml")]
    config: Option<PathBuf>,
    /// Image of the probe pod (must contain nvidia-smi or get it from the NVIDIA runtime).
    #[arg(long, default_value = "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04")]
    probe_image: String,
    /// Seconds to wait for the probe pod.
    #[arg(long, default_value_t = 120)]
    probe_timeout: u64,
    /// Namespace the chart installed the scheduler in (its Deployment,
    /// Lease, Service and ServiceAccount are checked there).
    #[arg(long, default_value = "gpusched-system")]
    scheduler_namespace: String,
    /// Name of the scheduler's Lease (`--lease-name`).
    #[arg(long, default_value = "gpusched")]
    lease_name: String,
    /// The scheduler's HTTP address for /readyz (e.g.
    /// `http://127.0.0.1:10259`); default: through the apiserver's proxy
    /// to its Service.
    #[arg(long, value_name = "URL", env = "GPUSCHED_ENDPOINT")]
    scheduler_endpoint: Option<String>,
    /// Skip the checks of the scheduler itself.
    #[arg(long)]
    no_scheduler_checks: bool,
}

/// Exit code when the checks could not run.
pub const EXIT_ERROR: i32 = 3;

pub fn run(a: DoctorArgs) -> anyhow::Result<()> {
    let config = crate::scheduler::read_config(a.config.as_deref())?;
    let opts = DoctorOptions {
        kubeconfig: a.kube.kubeconfig.clone(),
        context: a.kube.context.clone(),
        probe: a.probe.then(|| ProbeOptions {
            namespace: a.namespace.clone().unwrap_or_else(|| "default".into()),
            image: a.probe_image,
            timeout: Duration::from_secs(a.probe_timeout),
        }),
        namespace: a.namespace,
        config,
        scheduler: (!a.no_scheduler_checks).then(|| doctor::scheduler::SchedulerTarget {
            namespace: a.scheduler_namespace,
            lease: a.lease_name,
            endpoint: a.scheduler_endpoint,
            ..Default::default()
        }),
    };
    let report = match doctor::diagnose_blocking(&opts) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("gpusched doctor: cannot run the checks: {e:#}");
            std::process::exit(EXIT_ERROR);
        }
    };
    let output = if a.json { Output::Json } else { a.output };
    crate::kubectl::print(&report, output, |_| report.render())?;
    std::process::exit(report.exit_code);
}

//! `gpusched scheduler` (the scheduler on a Kubernetes API) and `gpusched
//! crds` (the CRD manifests). The loop lives in `gpusched-k8s`; this module
//! reads flags and the config file.

use anyhow::Context;
use clap::Args;
use gpusched_k8s::controller::{self, Options};
use gpusched_k8s::exec::ExecOptions;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Flags of `gpusched scheduler`.
#[derive(Args, Debug)]
pub struct SchedulerArgs {
    /// Kubeconfig file (default: in-cluster credentials, then $KUBECONFIG / ~/.kube/config).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Scheduler configuration (YAML, the simulator's format: actions, packing, filters).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Address for /metrics, /healthz, /readyz and /debug (the `gpusched
    /// explain` endpoint). Loopback by default: open it to the network
    /// (`0.0.0.0:10259`, as the chart does) together with
    /// `--http-auth delegated`.
    #[arg(long, default_value = "127.0.0.1:10259")]
    http_addr: SocketAddr,
    /// Protection of /metrics and /debug: `delegated` (bearer token checked
    /// with a TokenReview, `get` on the path with a SubjectAccessReview) or
    /// `none`. /healthz and /readyz stay open.
    #[arg(long, default_value = "none", value_name = "delegated|none")]
    http_auth: gpusched_k8s::debug::HttpAuth,
    /// Serving certificate (PEM chain) for --http-addr; re-read when it
    /// changes. Without it, `--http-auth delegated` serves a self-signed
    /// certificate made at start (bearer tokens never travel in clear).
    #[arg(long, value_name = "FILE", requires = "tls_private_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert-file.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_private_key_file: Option<PathBuf>,
    /// Schedule the pods whose `spec.schedulerName` is this (repeat the
    /// flag, or separate with commas, for several names, like
    /// kube-scheduler's profiles).
    #[arg(long, default_value = "gpusched", value_delimiter = ',')]
    scheduler_name: Vec<String>,
    /// DRA drivers whose ResourceSlice devices are GPUs: they become the
    /// scheduler's GPUs of their node, counted like device-plugin GPUs
    /// (repeat, or separate with commas; e.g. `gpu.gpusched.io,gpu.nvidia.com`;
    /// docs/dra.md). A DeviceClass mapping `nvidia.com/gpu`
    /// (`extendedResourceName`) adds the driver its selectors name.
    #[arg(long, default_value = "gpu.gpusched.io", value_delimiter = ',')]
    dra_gpu_driver: Vec<String>,
    /// Elect a leader on a Lease before scheduling (for more than one replica).
    #[arg(long)]
    leader_elect: bool,
    /// Name of the Lease.
    #[arg(long, default_value = "gpusched")]
    lease_name: String,
    /// Namespace of the Lease.
    #[arg(long, default_value = "kube-system")]
    lease_namespace: String,
    /// Identity in the Lease (default: $POD_NAME, else the host name and pid).
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Lease duration in seconds.
    #[arg(long, default_value_t = 15)]
    lease_seconds: u64,
    /// Client-side write rate limit in requests per second (0: none).
    /// kube-scheduler's default is 50.
    #[arg(long, default_value_t = 0.0)]
    kube_api_qps: f64,
    /// Burst of the write rate limit (kube-scheduler's default: 100).
    #[arg(long, default_value_t = 100)]
    kube_api_burst: u32,
    /// Bindings in flight at once.
    #[arg(long, default_value_t = 64)]
    bind_concurrency: usize,
    /// Milliseconds between cycles while changes keep arriving (batches a
    /// burst); the first change after a quiet spell cycles at once.
    #[arg(long, default_value_t = 20)]
    debounce_ms: u64,
    /// Write a ProvisioningRequest (autoscaling.x-k8s.io/v1) of this class
    /// for each gang that needs new nodes, and mark its members as
    /// consuming it (docs/kubernetes.md, "Pending pods and autoscalers").
    /// Without a value: `best-effort-atomic-scale-up.autoscaling.x-k8s.io`.
    /// Off by default.
    #[arg(long, value_name = "CLASS", num_args = 0..=1,
          default_missing_value = gpusched_k8s::provreq::CLASS_BEST_EFFORT_ATOMIC)]
    provisioning_requests: Option<String>,
    /// Seconds to wait after a ProvisioningRequest failed before the next
    /// one for the gang (doubled per failed attempt).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    provisioning_retry_seconds: u64,
    /// Longest wait between two ProvisioningRequests of a gang.
    #[arg(long, default_value_t = 1800, value_parser = clap::value_parser!(u64).range(1..))]
    provisioning_max_retry_seconds: u64,
    /// Log format: `text` (colours only on a terminal) or `json` (one
    /// object per line, for log collectors).
    #[arg(long, value_parser = ["text", "json"], default_value = "text")]
    log_format: String,
}

/// Runs the scheduler until SIGTERM/SIGINT.
pub fn run(a: SchedulerArgs) -> anyhow::Result<()> {
    let config = read_config(a.config.as_deref())?;
    if let Some(bad) = a.scheduler_name.iter().find(|n| !valid_scheduler_name(n)) {
        anyhow::bail!(
            "--scheduler-name {bad:?}: a scheduler name is a non-empty DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters), as spec.schedulerName"
        );
    }
    if let Some(class) = a.provisioning_requests.as_deref()
        && !valid_scheduler_name(class)
    {
        anyhow::bail!(
            "--provisioning-requests {class:?}: a provisioning class is a non-empty DNS subdomain (lower-case letters, digits, '-' and '.', at most 253 characters), e.g. {}",
            gpusched_k8s::provreq::CLASS_BEST_EFFORT_ATOMIC
        );
    }
    let provisioning = a
        .provisioning_requests
        .map(|class| gpusched_k8s::provreq::Config {
            class,
            retry_base: Duration::from_secs(a.provisioning_retry_seconds),
            retry_max: Duration::from_secs(
                a.provisioning_max_retry_seconds
                    .max(a.provisioning_retry_seconds),
            ),
            ..Default::default()
        });
    if !a.http_addr.ip().is_loopback() && a.http_auth == gpusched_k8s::debug::HttpAuth::None {
        eprintln!(
            "warning: --http-addr {} serves /metrics and /debug (pod names, queues, decisions) to anyone who can reach it; add --http-auth delegated",
            a.http_addr
        );
    }
    let identity = a.identity.unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "gpusched".into());
        format!("{host}-{}", std::process::id())
    });
    let names = vec![
        identity.clone(),
        std::env::var("POD_IP").unwrap_or_default(),
    ]
    .into_iter()
    .filter(|n| !n.is_empty())
    .collect();
    let tls = gpusched_k8s::tls::Tls::from_flags(
        a.http_auth,
        a.tls_cert_file,
        a.tls_private_key_file,
        names,
    )?;
    let opts = Options {
        kubeconfig: a.kubeconfig,
        config,
        http_addr: Some(a.http_addr),
        http_auth: a.http_auth,
        tls,
        lease_name: a.leader_elect.then_some(a.lease_name),
        lease_namespace: a.lease_namespace,
        identity: identity.clone(),
        lease_seconds: a.lease_seconds,
        debounce: Duration::from_millis(a.debounce_ms),
        exec: ExecOptions {
            bind_concurrency: a.bind_concurrency,
            qps: a.kube_api_qps,
            burst: a.kube_api_burst,
            instance: identity,
            ..Default::default()
        },
        scheduler_names: a.scheduler_name,
        dra_gpu_drivers: a.dra_gpu_driver,
        provisioning,
        ..Default::default()
    };
    controller::run_blocking(opts, a.log_format == "json")
}

/// The scheduler configuration from a YAML file (default: built-in).
pub fn read_config(
    path: Option<&std::path::Path>,
) -> anyhow::Result<gpusched_plugins::SchedulerConfig> {
    match path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            gpusched_plugins::SchedulerConfig::from_yaml(&p.display().to_string(), &text)
                .map_err(|e| anyhow::anyhow!("{e}"))
        }
        None => Ok(Default::default()),
    }
}

/// Flags of `gpusched crds`.
#[derive(Args, Debug)]
pub struct CrdsArgs {
    /// Print the scheduler-plugins PodGroup CRD (`scheduling.x-k8s.io`)
    /// instead, for clusters without scheduler-plugins whose manifests use
    /// its PodGroups.
    #[arg(long)]
    scheduler_plugins: bool,
}

/// Prints the CRD manifests.
pub fn crds(a: CrdsArgs) -> anyhow::Result<()> {
    if a.scheduler_plugins {
        print!("{}", gpusched_k8s::crd::sp_crd_yaml()?);
    } else {
        print!("{}", gpusched_k8s::crd::crds_yaml()?);
    }
    Ok(())
}

/// Flags of `gpusched fake-nodes`.
#[derive(Args, Debug)]
pub struct FakeNodesArgs {
    /// Cluster file (YAML, the simulator's cluster vocabulary, e.g.
    /// fixtures/clusters/tiny.yaml).
    file: PathBuf,
}

/// Prints a `v1` `List` of kwok Node objects (JSON) for a cluster file.
pub fn fake_nodes(a: FakeNodesArgs) -> anyhow::Result<()> {
    let name = a.file.display().to_string();
    let text = gpusched_sim::load::read(&a.file).map_err(|e| anyhow::anyhow!("{e}"))?;
    let nodes =
        gpusched_sim::load::parse_cluster(&name, &text).map_err(|e| anyhow::anyhow!("{e}"))?;
    let items: Vec<_> = nodes.iter().map(gpusched_k8s::kwok::node_object).collect();
    let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
    let mut out = std::io::stdout().lock();
    // a closed pipe (`| head`) ends the output quietly
    match writeln!(out, "{}", serde_json::to_string_pretty(&list)?) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// What `spec.schedulerName` may hold (a DNS-1123 subdomain).
fn valid_scheduler_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|l| {
            !l.is_empty()
                && l.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        })
}

#[cfg(test)]
mod tests {
    use super::valid_scheduler_name;

    #[test]
    fn scheduler_names_are_dns_subdomains() {
        for ok in ["gpusched", "gpusched-batch", "team.gpusched", "a1"] {
            assert!(valid_scheduler_name(ok), "{ok}");
        }
        for bad in ["", "GPUsched", "-x", "x-", "a..b", "a_b", &"a".repeat(254)] {
            assert!(!valid_scheduler_name(bad), "{bad}");
        }
    }
}

//! `gpusched explain pod|queue`: where a pod or a queue stands and why,
//! from the scheduler's debug endpoint (directly or through the apiserver's
//! service proxy) or from a simulator run (`--from-sim`). The reports are
//! the core's (`gpusched_core::report`); this module fetches and prints.

use crate::kubectl::{KubeFlags, Output, print};
use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use gpusched_core::report::{self, CycleView, PendingList, PodReport, QueueReport};
use gpusched_core::{CycleOutput, Snapshot};
use gpusched_k8s::debug::debug_path;
use gpusched_k8s::tools::debug_client::{Target, TokenSource};
use std::path::PathBuf;

/// `gpusched explain …`.
#[derive(Subcommand, Debug)]
pub enum ExplainCmd {
    /// Where a pod stands: bound (node, GPUs, share, topology) or why it
    /// is pending (node reasons, queue, quota, gang, preemption, what
    /// would make it fit).
    Pod {
        /// The pod: NAMESPACE/NAME, or NAME with --namespace (with
        /// --from-sim: the simulator's pod name, e.g. `train-3-p0`).
        pod: String,
        /// Namespace of the pod when POD has none (default: the
        /// kubeconfig context's, else `default`).
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        #[command(flatten)]
        source: Source,
    },
    /// A queue's guarantee, limit, fair share, usage, borrowed and its
    /// pending pods by reason.
    Queue {
        /// The queue.
        queue: String,
        #[command(flatten)]
        source: Source,
    },
}

/// `gpusched pending`: the pending pods in queue order with their reasons.
#[derive(clap::Args, Debug)]
pub struct PendingArgs {
    /// Only this queue's pods.
    #[arg(long, short = 'q', value_name = "QUEUE")]
    queue: Option<String>,
    /// Only pods of this namespace (default: every namespace; queues are
    /// cluster-wide).
    #[arg(short = 'n', long)]
    namespace: Option<String>,
    #[command(flatten)]
    source: Source,
}

/// Where the report comes from, and how it is printed.
#[derive(Args, Debug)]
pub struct Source {
    /// Output format: text, wide (tables: every column), json or yaml
    /// (camelCase fields).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Same as `-o json` (kept for scripts written before `-o`).
    #[arg(long, hide = true, conflicts_with = "output")]
    json: bool,
    #[command(flatten)]
    kube: KubeFlags,
    /// The scheduler's address (e.g. `https://10.0.0.5:10259`), for a
    /// scheduler the apiserver cannot proxy to (run outside the cluster, as
    /// `scripts/tryout` does); default: through the apiserver's proxy to the
    /// scheduler's Service.
    #[arg(long, value_name = "URL", env = "GPUSCHED_ENDPOINT")]
    endpoint: Option<String>,
    /// With --endpoint: the CA (PEM) that signed the scheduler's certificate.
    #[arg(long, value_name = "FILE", requires = "endpoint")]
    certificate_authority: Option<PathBuf>,
    /// With --endpoint: do not verify the scheduler's certificate (its
    /// self-signed one, when the chart mounts none).
    #[arg(long, requires = "endpoint")]
    insecure_skip_tls_verify: bool,
    /// How the proxy reaches the scheduler: `https` (the chart's default,
    /// `--http-auth delegated`) or `http`.
    #[arg(long, value_parser = ["https", "http"], default_value = "https")]
    scheme: String,
    /// Bearer token for the scheduler (default: the kubeconfig user's
    /// token; a user without one — client certificate, exec plugin — gets a
    /// 10-minute token of --token-service-account).
    #[arg(long)]
    token: Option<String>,
    /// The ServiceAccount (in --scheduler-namespace) whose short-lived
    /// token is used when the kubeconfig user has none (the chart's
    /// reader; `""`: send none).
    #[arg(long, value_name = "NAME", default_value = gpusched_k8s::tools::debug_client::READER_SERVICE_ACCOUNT)]
    token_service_account: String,
    /// Namespace of the scheduler's Service (for the proxy).
    #[arg(long, default_value = "gpusched-system")]
    scheduler_namespace: String,
    /// The scheduler's Service (for the proxy).
    #[arg(long, default_value = "gpusched-scheduler-metrics")]
    service: String,
    /// The Service's port, by name or number (for the proxy).
    #[arg(long, default_value = "https")]
    port: String,
    /// The scheduler pods' port number (for the proxy to the leader's pod
    /// when a standby answers).
    #[arg(long, default_value_t = 10259)]
    pod_port: u16,
    /// Explain from a simulator run instead of a cluster.
    #[arg(long)]
    from_sim: bool,
    /// With --from-sim: the last cycle at or before this virtual time
    /// (e.g. `90m`); default: the last cycle that saw the pod (the last
    /// cycle for a queue).
    #[arg(long, value_name = "TIME", requires = "from_sim")]
    at: Option<String>,
    /// With --from-sim: cluster file (default: the embedded mixed cluster).
    #[arg(long, value_name = "FILE", requires = "from_sim")]
    cluster: Option<PathBuf>,
    /// With --from-sim: workload file (default: the embedded mixed workload).
    #[arg(long, value_name = "FILE", requires = "from_sim")]
    workload: Option<PathBuf>,
    /// With --from-sim: seed.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// With --from-sim: scheduler configuration (YAML).
    #[arg(long, value_name = "FILE", requires = "from_sim")]
    config: Option<PathBuf>,
    /// With --from-sim: packing policy (overrides the configuration's).
    #[arg(long, value_name = "NAME", requires = "from_sim")]
    policy: Option<String>,
}

impl Source {
    fn output(&self) -> Output {
        if self.json { Output::Json } else { self.output }
    }
}

pub fn run(cmd: ExplainCmd) -> anyhow::Result<()> {
    match cmd {
        ExplainCmd::Pod {
            pod,
            namespace,
            source,
        } => {
            let r: PodReport = if source.from_sim {
                let name = pod.clone();
                let (snap, out, now) = simulate(&source, Some(&pod))?;
                let view = CycleView {
                    snapshot: &snap,
                    output: &out,
                    now_ms: now,
                };
                report::pod_report(&view, &name).with_context(|| {
                    format!(
                        "pod {name} is not in the simulator's cycle at t={} (not arrived yet, or finished)",
                        gpusched_model::duration::fmt_duration(now)
                    )
                })?
            } else {
                let key = match pod.split_once('/') {
                    Some(_) => pod.clone(),
                    None => {
                        let ns = namespace
                            .unwrap_or_else(|| crate::kubectl::default_namespace(&source.kube));
                        format!("{ns}/{pod}")
                    }
                };
                fetch_json(&source, &debug_path(&format!("pods/{key}")))?
            };
            print(&r, source.output(), |_| r.to_string())
        }
        ExplainCmd::Queue { queue, source } => {
            let r: QueueReport = if source.from_sim {
                let (snap, out, now) = simulate(&source, None)?;
                let view = CycleView {
                    snapshot: &snap,
                    output: &out,
                    now_ms: now,
                };
                report::queue_report(&view, &queue)
                    .with_context(|| format!("queue {queue} is not in the simulation"))?
            } else {
                fetch_json(&source, &debug_path(&format!("queues/{queue}")))?
            };
            print(&r, source.output(), |_| r.to_string())
        }
    }
}

/// `gpusched pending [--queue Q]`.
pub fn pending(a: PendingArgs) -> anyhow::Result<()> {
    let source = &a.source;
    let mut r: PendingList = if source.from_sim {
        let (snap, out, now) = simulate(source, None)?;
        let view = CycleView {
            snapshot: &snap,
            output: &out,
            now_ms: now,
        };
        let classes = gpusched_core::report::classify::classify_cycle(&out, &snap);
        let reason_of = |p| {
            classes
                .get(&p)
                .and_then(|cs: &Vec<gpusched_core::report::classify::PendingClass>| cs.first())
                .map(|c| c.reason_name().to_string())
        };
        report::pending_list(&view, a.queue.as_deref(), &reason_of).with_context(|| {
            format!(
                "queue {} is not in the simulation",
                a.queue.clone().unwrap_or_default()
            )
        })?
    } else {
        match &a.queue {
            Some(q) => fetch_json(source, &debug_path(&format!("pending/{q}")))?,
            None => fetch_json(source, &debug_path("pending"))?,
        }
    };
    if let Some(ns) = &a.namespace {
        let prefix = format!("{ns}/");
        r.pods.retain(|p| p.pod.starts_with(&prefix));
    }
    print(&r, source.output(), |wide| r.table(wide))
}

fn fetch_json<T: serde::de::DeserializeOwned>(s: &Source, path: &str) -> anyhow::Result<T> {
    let target = match &s.endpoint {
        Some(url) => Target::Endpoint {
            url: url.clone(),
            token: s.token.clone(),
            ca: s.certificate_authority.clone(),
            insecure: s.insecure_skip_tls_verify,
        },
        None => Target::Proxy {
            namespace: s.scheduler_namespace.clone(),
            service: s.service.clone(),
            port: s.port.clone(),
            pod_port: s.pod_port,
            token: s.token.clone(),
            https: s.scheme == "https",
        },
    };
    let tokens = TokenSource {
        service_account: (!s.token_service_account.is_empty()).then(|| {
            (
                s.scheduler_namespace.clone(),
                s.token_service_account.clone(),
            )
        }),
    };
    let answer = gpusched_k8s::tools::debug_client::fetch_blocking(
        target.clone(),
        &s.kube.choice(),
        &tokens,
        path,
    )?;
    if answer.fetched.status != 200 {
        bail!(
            "{}",
            gpusched_k8s::tools::debug_client::failure_text(&target, &answer)
        );
    }
    serde_json::from_str(&answer.fetched.body)
        .with_context(|| format!("the scheduler's answer to {path} is not a report"))
}

/// Keeps the cycle to explain from.
struct Keep<'a> {
    pod: Option<&'a str>,
    at: Option<u64>,
    kept: Option<(Snapshot, CycleOutput, u64)>,
}

impl gpusched_sim::Hooks for Keep<'_> {
    fn every_explanation(&self) -> bool {
        true
    }
    fn cycle_seen(&mut self, now_ms: u64, snap: &Snapshot, out: &CycleOutput) {
        if self.at.is_some_and(|a| now_ms > a) {
            return;
        }
        // without --at, a pod's last cycle is the last one that saw it
        if self.at.is_none()
            && let Some(p) = self.pod
            && !snap.pods.iter().any(|s| s.pod.name == p)
        {
            return;
        }
        self.kept = Some((snap.clone(), out.clone(), now_ms));
    }
}

fn simulate(s: &Source, pod: Option<&str>) -> anyhow::Result<(Snapshot, CycleOutput, u64)> {
    let mut scenario =
        gpusched_sim::load::scenario_files(s.cluster.as_deref(), s.workload.as_deref(), s.seed)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &scenario.warnings {
        eprintln!("warning: {w}");
    }
    let at = match &s.at {
        Some(t) => Some(
            gpusched_sim::workload::parse_duration_ms(t)
                .map_err(|e| anyhow::anyhow!("--at: {e}"))?,
        ),
        None => None,
    };
    if let Some(a) = at {
        scenario.settings.until_ms = Some(a);
    }
    let mut scheduler = crate::simulate::build_scheduler(s.config.as_deref(), s.policy.as_deref())?;
    let mut keep = Keep {
        pod,
        at,
        kept: None,
    };
    gpusched_sim::run(&scenario, &mut scheduler, s.seed, &mut keep);
    match keep.kept {
        Some(k) => Ok(k),
        None => match (pod, at) {
            (Some(p), None) => bail!("no cycle of the simulation saw pod {p}"),
            _ => bail!("no cycle ran before --at"),
        },
    }
}

//! `gpusched scheduler`: watches → world → cycle → executor, under a leader
//! lease, with `/metrics`, `/healthz`, `/readyz` and `/debug/…`
//! ([`crate::debug`]).

use crate::crd::Queue;
use crate::exec::{ExecOptions, Executor};
use crate::metrics::{Metrics, QueueLabel};
use crate::watch::{self, Shared};
use crate::world::{Built, Problem, World};
use anyhow::Context;
use gpusched_core::fairshare::QueueTree;
use gpusched_core::{Decision, Scheduler};
use gpusched_model::{GPU_MILLI, ResourceVec};
use gpusched_plugins::SchedulerConfig;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{Notify, watch as tokio_watch};

/// Everything `gpusched scheduler` can be told.
#[derive(Clone, Debug)]
pub struct Options {
    /// Path of a kubeconfig; `None`: in-cluster or the default kubeconfig.
    pub kubeconfig: Option<std::path::PathBuf>,
    /// The scheduler configuration (the simulator's format).
    pub config: SchedulerConfig,
    /// Address of `/metrics`, `/healthz`, `/readyz`, `/debug/…` (`None`:
    /// no server).
    pub http_addr: Option<SocketAddr>,
    /// How `/metrics` and `/debug/…` are protected.
    pub http_auth: crate::debug::HttpAuth,
    /// Run for the lease named here in `lease_namespace`; `None`: always lead.
    pub lease_name: Option<String>,
    /// Namespace of the lease.
    pub lease_namespace: String,
    /// Identity in the lease (the pod name).
    pub identity: String,
    /// Lease duration.
    pub lease_seconds: u64,
    /// Wait this long after a change before a cycle, to batch arrivals.
    pub debounce: Duration,
    /// A cycle at least this often (timeouts, reservations).
    pub period: Duration,
    /// Executor tunables.
    pub exec: ExecOptions,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kubeconfig: None,
            config: SchedulerConfig::default(),
            http_addr: None,
            http_auth: crate::debug::HttpAuth::None,
            lease_name: None,
            lease_namespace: "kube-system".into(),
            identity: "gpusched".into(),
            lease_seconds: 15,
            debounce: Duration::from_millis(20),
            period: Duration::from_secs(1),
            exec: ExecOptions::default(),
        }
    }
}

/// A client from a kubeconfig file, or the environment.
pub async fn client(kubeconfig: Option<&std::path::Path>) -> anyhow::Result<Client> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = kube::config::Kubeconfig::read_from(p)
                .with_context(|| format!("reading kubeconfig {}", p.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .with_context(|| format!("kubeconfig {}", p.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("finding cluster credentials")?,
    };
    Client::try_from(config).context("building the API client")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the scheduler until `shutdown` resolves.
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let client = client(opts.kubeconfig.as_deref()).await?;
    run_with_client(client, opts, shutdown).await
}

/// Runs the scheduler on a given client until `shutdown` resolves.
pub async fn run_with_client(
    client: Client,
    opts: Options,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut scheduler = gpusched_plugins::config::build(&opts.config)
        .map_err(|e| anyhow::anyhow!("scheduler config: {e}"))?;
    let metrics = Arc::new(Metrics::new());
    let shared = Shared {
        world: Arc::new(Mutex::new(World::default())),
        changed: Arc::new(Notify::new()),
    };
    let health = Arc::new(crate::debug::Server::new(
        metrics.clone(),
        opts.http_auth,
        client.clone(),
        shared.clone(),
        opts.lease_name
            .as_ref()
            .map(|n| (opts.lease_namespace.clone(), n.clone())),
        opts.lease_name.is_none(),
    ));
    let (stop_tx, stop_rx) = tokio_watch::channel(false);
    if let Some(addr) = opts.http_addr {
        crate::debug::serve(addr, health.clone(), stop_rx.clone()).await?;
    }
    let mut tasks = watch::Tasks::default();
    let mut watches = watch::start(&client, &shared, &mut tasks);
    let jobs_watch = Arc::new(watch::WatchHealth::new(
        crate::world::ObjectKind::Job,
        false,
    ));
    watches.push(jobs_watch.clone());

    // leadership
    let (leader_rx, lease_task) = match &opts.lease_name {
        Some(name) => {
            let lm = kube_lease_manager::LeaseManagerBuilder::new(client.clone(), name)
                .with_namespace(&opts.lease_namespace)
                .with_identity(&opts.identity)
                .with_duration(opts.lease_seconds)
                .with_grace((opts.lease_seconds / 3).max(2))
                .build()
                .await
                .with_context(|| format!("lease {}/{}", opts.lease_namespace, name))?;
            let (rx, task) = lm.watch().await;
            (rx, Some(task))
        }
        None => (tokio_watch::channel(true).1, None),
    };

    tasks.spawn(watch::run_job_gangs(
        client.clone(),
        leader_rx.clone(),
        jobs_watch,
    ));
    let mut exec = Executor::new(
        client.clone(),
        shared.clone(),
        metrics.clone(),
        opts.exec.clone(),
    );
    let mut last_gen = u64::MAX;
    let mut last_cycle = Instant::now() - opts.period;
    // how long the last cycle took: the wait after a change is at least
    // this, so cycles take at most about half the loop's time while many
    // changes arrive (a drain), and idle latency stays at `debounce`
    let mut last_cost = Duration::ZERO;
    let mut last_status = Instant::now();
    let mut queue_status: BTreeMap<String, serde_json::Value> = BTreeMap::new();
    let mut group_status: BTreeMap<String, (u32, u32)> = BTreeMap::new();
    let mut cycles: u64 = 0;
    tokio::pin!(shutdown);
    loop {
        let wait = opts.period.saturating_sub(last_cycle.elapsed());
        tokio::select! {
            _ = &mut shutdown => break,
            _ = shared.changed.notified() => tokio::time::sleep(opts.debounce.max(last_cost)).await,
            _ = tokio::time::sleep(wait) => {}
        }
        let synced = watches
            .iter()
            .filter(|h| h.required)
            .all(|h| h.synced.load(Ordering::SeqCst));
        health.ready.store(synced, Ordering::SeqCst);
        health.set_problem(forbidden_watches(&watches));
        let leading = *leader_rx.borrow();
        health.leader.store(leading, Ordering::SeqCst);
        metrics.leader.set(i64::from(leading));
        if !synced || !leading {
            continue;
        }
        let generation = shared.with(|w| w.generation);
        if generation == last_gen && last_cycle.elapsed() < opts.period {
            continue;
        }
        last_gen = generation;
        last_cycle = Instant::now();
        let t0 = Instant::now();
        let built = shared.with(|w| w.build());
        cycles += 1;
        let cycle_ms = now_ms();
        let out = scheduler.cycle(&built.snapshot, cycle_ms, cycles);
        last_cost = t0.elapsed();
        metrics.cycle_seconds.observe(last_cost.as_secs_f64());
        metrics.nodes.set(built.snapshot.nodes.len() as i64);
        let binds = out
            .decisions
            .iter()
            .filter(|d| matches!(d, Decision::Bind { .. }))
            .count();
        if binds > 0 || !out.explanations.is_empty() {
            tracing::debug!(
                binds,
                pending = out.explanations.len(),
                elapsed_ms = t0.elapsed().as_millis() as u64,
                "cycle"
            );
        }
        exec.apply(&out, &built);
        if last_status.elapsed() >= Duration::from_secs(2) {
            last_status = Instant::now();
            publish_queue_status(&client, &built, &metrics, &mut queue_status);
            metrics.observe_cycle(&built, &out);
            let counts = shared.with(|w| w.group_counts());
            publish_group_counts(&client, counts, &mut group_status);
        }
        if opts.http_addr.is_some() {
            health.publish(built, out, cycle_ms);
        }
    }
    tracing::info!("shutting down: waiting for bindings in flight");
    exec.drain(Duration::from_secs(10)).await;
    let _ = stop_tx.send(true);
    // every holder of the leadership channel goes, so the lease task
    // releases the lease and ends
    drop(tasks);
    drop(leader_rx);
    if let Some(task) = lease_task
        && let Ok(Ok(Ok(lm))) = tokio::time::timeout(Duration::from_secs(5), task).await
    {
        let _ = lm.release().await;
    }
    Ok(())
}

/// The permissions the watches lack, as one line for `/healthz` and
/// `/readyz` (`None` when every watch is allowed).
fn forbidden_watches(watches: &[Arc<watch::WatchHealth>]) -> Option<String> {
    let lines: Vec<String> = watches
        .iter()
        .filter_map(|h| h.forbidden().map(|m| format!("watch {:?}: {m}", h.kind)))
        .collect();
    (!lines.is_empty()).then(|| {
        format!(
            "missing permissions (the scheduler cannot work until its ClusterRole grants them): {}",
            lines.join("; ")
        )
    })
}

fn gpus_text(milli: u64) -> String {
    if milli.is_multiple_of(GPU_MILLI) {
        (milli / GPU_MILLI).to_string()
    } else {
        format!("{:.3}", milli as f64 / GPU_MILLI as f64)
    }
}

/// PodGroup status: members scheduled and running, written when changed.
fn publish_group_counts(
    client: &Client,
    counts: BTreeMap<String, (u32, u32)>,
    last: &mut BTreeMap<String, (u32, u32)>,
) {
    last.retain(|k, _| counts.contains_key(k));
    for (k, c) in counts {
        if last.get(&k) == Some(&c) {
            continue;
        }
        last.insert(k.clone(), c);
        let Some((ns, name)) = k.split_once('/') else {
            continue;
        };
        let api: Api<crate::crd::PodGroup> = Api::namespaced(client.clone(), ns);
        let name = name.to_string();
        tokio::spawn(async move {
            let patch = json!({"status": {"scheduled": c.0, "running": c.1}});
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                tracing::debug!("podgroup {name} status: {e}");
            }
        });
    }
}

/// The `Valid` condition of a queue (`error`: why it is not).
fn valid_condition(error: Option<&str>) -> serde_json::Value {
    // lastTransitionTime is filled in when the status is written
    match error {
        None => json!({"type": "Valid", "status": "True", "reason": "Valid", "message": ""}),
        Some(e) => {
            json!({"type": "Valid", "status": "False", "reason": "InvalidSpec", "message": e})
        }
    }
}

/// Queue status: allocated, fair share and pending per queue, and the
/// `Valid` condition; written only when it changed.
fn publish_queue_status(
    client: &Client,
    built: &Built,
    metrics: &Metrics,
    last: &mut BTreeMap<String, serde_json::Value>,
) {
    let snap = &built.snapshot;
    let (mut tree, _) = QueueTree::build(&snap.queues);
    tree.account(snap);
    let mut capacity = ResourceVec::default();
    for n in &snap.nodes {
        if !n.unschedulable {
            capacity.add(&n.allocatable);
        }
    }
    tree.compute_deserved(&capacity);
    let mut invalid: BTreeMap<&str, &str> = BTreeMap::new();
    for p in &built.problems {
        if let Problem::InvalidQueue { queue, error } = p
            && !queue.is_empty()
        {
            invalid.insert(queue, error);
        }
    }
    let mut statuses: Vec<(String, serde_json::Value)> = Vec::new();
    for q in &snap.queues {
        let Some(i) = tree.idx(&q.name) else { continue };
        let a = &tree.acct[i];
        let pending = built.pending_by_queue.get(&q.name).copied().unwrap_or(0);
        let label = QueueLabel {
            queue: q.name.clone(),
        };
        metrics.pending.get_or_create(&label).set(pending as i64);
        metrics
            .queue_allocated_gpus
            .get_or_create(&label)
            .set(a.usage.gpu_milli as f64 / 1000.0);
        metrics
            .queue_fair_share_gpus
            .get_or_create(&label)
            .set(a.deserved.gpu_milli as f64 / 1000.0);
        statuses.push((
            q.name.clone(),
            json!({
                "allocatedGpus": gpus_text(a.usage.gpu_milli),
                "fairShareGpus": gpus_text(a.deserved.gpu_milli),
                "pendingPods": pending,
                "allocated": {"cpu": format!("{}m", a.usage.cpu_milli), "memory": a.usage.memory.to_string(), "nvidia.com/gpu": gpus_text(a.usage.gpu_milli)},
                "fairShare": {"cpu": format!("{}m", a.deserved.cpu_milli), "memory": a.deserved.memory.to_string(), "nvidia.com/gpu": gpus_text(a.deserved.gpu_milli)},
                "conditions": [valid_condition(invalid.remove(q.name.as_str()))],
            }),
        ));
    }
    for (q, e) in invalid {
        statuses.push((
            q.to_string(),
            json!({"conditions": [valid_condition(Some(e))]}),
        ));
    }
    let api: Api<Queue> = Api::all(client.clone());
    for (name, status) in statuses {
        if last.get(&name) == Some(&status) {
            continue;
        }
        last.insert(name.clone(), status.clone());
        let mut status = status;
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        if let Some(conds) = status.get_mut("conditions").and_then(|c| c.as_array_mut()) {
            for c in conds {
                c["lastTransitionTime"] = json!(now);
            }
        }
        let api = api.clone();
        tokio::spawn(async move {
            let patch = json!({"status": status});
            if let Err(e) = api
                .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
            {
                tracing::debug!("queue {name} status: {e}");
            }
        });
    }
}

/// The scheduler's name, for tests and tools.
pub fn scheduler_name() -> &'static str {
    crate::translate::SCHEDULER_NAME
}

#[allow(dead_code)]
fn _assert_send(s: Scheduler) -> impl Send {
    s
}

/// Runs the scheduler on its own runtime until SIGTERM or SIGINT (for the
/// binary: sets up logging from `RUST_LOG`, default `info`; JSON lines with
/// `json_logs`; colours only on a terminal).
pub fn run_blocking(opts: Options, json_logs: bool) -> anyhow::Result<()> {
    let b = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if json_logs {
        b.json().try_init()
    } else {
        b.try_init()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let shutdown = async {
            #[cfg(unix)]
            {
                use tokio::signal::unix::{SignalKind, signal};
                match signal(SignalKind::terminate()) {
                    Ok(mut term) => {
                        tokio::select! {
                            _ = term.recv() => {}
                            _ = tokio::signal::ctrl_c() => {}
                        }
                    }
                    Err(_) => {
                        let _ = tokio::signal::ctrl_c().await;
                    }
                }
            }
            #[cfg(not(unix))]
            {
                let _ = tokio::signal::ctrl_c().await;
            }
        };
        run(opts, shutdown).await
    })
}

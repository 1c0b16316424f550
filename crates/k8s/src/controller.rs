//! `gpusched scheduler`: watches → world → cycle → executor, under a leader
//! lease, with `/metrics`, `/healthz`, `/readyz` and `/gpusched/debug/…`
//! ([`crate::debug`]).

use crate::exec::{ExecOptions, Executor};
use crate::metrics::Metrics;
use crate::watch::{self, Shared};
use crate::world::World;
use anyhow::Context;
use gpusched_core::{Decision, Engine};
use gpusched_plugins::SchedulerConfig;
use kube::{Api, Client};
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
    /// Address of `/metrics`, `/healthz`, `/readyz`, `/gpusched/debug/…` (`None`:
    /// no server).
    pub http_addr: Option<SocketAddr>,
    /// How `/metrics` and `/gpusched/debug/…` are protected.
    pub http_auth: crate::debug::HttpAuth,
    /// HTTPS for that address ([`crate::tls::Tls::Off`]: plain HTTP).
    pub tls: crate::tls::Tls,
    /// Run for the lease named here in `lease_namespace`; `None`: always lead.
    pub lease_name: Option<String>,
    /// Namespace of the lease.
    pub lease_namespace: String,
    /// Identity in the lease (the pod name).
    pub identity: String,
    /// Lease duration.
    pub lease_seconds: u64,
    /// While changes keep arriving, cycles are at least this far apart
    /// (batches a burst); the first change after a quiet spell of this
    /// length cycles at once.
    pub debounce: Duration,
    /// A cycle at least this often (timeouts, reservations).
    pub period: Duration,
    /// Executor tunables.
    pub exec: ExecOptions,
    /// Pods naming one of these in `spec.schedulerName` are scheduled
    /// (empty: `gpusched`).
    pub scheduler_names: Vec<String>,
    /// DRA drivers whose devices are GPUs of their node in the core
    /// (`crate::dra::gpus`; empty: gpusched's own).
    pub dra_gpu_drivers: Vec<String>,
    /// ProvisioningRequests for gangs that need new nodes
    /// ([`crate::provreq`]; `None`: off).
    pub provisioning: Option<crate::provreq::Config>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            kubeconfig: None,
            config: SchedulerConfig::default(),
            http_addr: None,
            http_auth: crate::debug::HttpAuth::None,
            tls: crate::tls::Tls::Off,
            lease_name: None,
            lease_namespace: "kube-system".into(),
            identity: "gpusched".into(),
            lease_seconds: 15,
            debounce: Duration::from_millis(20),
            period: Duration::from_secs(1),
            exec: ExecOptions::default(),
            scheduler_names: Vec::new(),
            dra_gpu_drivers: Vec::new(),
            provisioning: None,
        }
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the scheduler until `shutdown` resolves.
pub async fn run(opts: Options, shutdown: impl Future<Output = ()>) -> anyhow::Result<()> {
    let client = crate::client::client(opts.kubeconfig.as_deref()).await?;
    run_with_client(client, opts, shutdown).await
}

/// Runs the scheduler on a given client until `shutdown` resolves.
pub async fn run_with_client(
    client: Client,
    opts: Options,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let mut engine = new_engine(&opts.config)?;
    let metrics = Arc::new(Metrics::new());
    let shared = Shared {
        world: Arc::new(Mutex::new({
            let mut w = World::for_scheduler_names(opts.scheduler_names.clone());
            w.set_dra_gpu_drivers(&opts.dra_gpu_drivers);
            w
        })),
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
        crate::debug::serve(addr, &opts.tls, health.clone(), stop_rx.clone()).await?;
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
            let lease = LeaseSpec {
                namespace: opts.lease_namespace.clone(),
                name: name.clone(),
                identity: opts.identity.clone(),
                seconds: opts.lease_seconds,
            };
            let lm = lease
                .manager(&client)
                .await
                .with_context(|| format!("lease {}/{}", opts.lease_namespace, name))?;
            let (tx, rx) = tokio_watch::channel(false);
            (rx, Some(tokio::spawn(lead(client.clone(), lease, lm, tx))))
        }
        None => (tokio_watch::channel(true).1, None),
    };
    let mut lease_open = lease_task.is_some();
    // a run that is dropped (a crash, in tests) ends the lease task without
    // releasing the lease, as a killed process does
    let mut lease_task = AbortOnDrop(lease_task);
    let mut leader_changes = leader_rx.clone();

    tasks.spawn(watch::run_job_gangs(
        client.clone(),
        leader_rx.clone(),
        jobs_watch,
    ));
    // the gangs of each status cycle, for the ProvisioningRequest task
    let (gangs_tx, gangs_rx) = tokio_watch::channel(None);
    if let Some(config) = opts.provisioning.clone() {
        tasks.spawn(crate::provreq::run(crate::provreq::Ctx {
            client: client.clone(),
            config,
            shared: shared.clone(),
            gangs: gangs_rx,
            leading: leader_rx.clone(),
            instance: opts.exec.instance.clone(),
        }));
    }
    let mut exec = Executor::new(
        client.clone(),
        shared.clone(),
        metrics.clone(),
        opts.exec.clone(),
    );
    let mut last_gen = u64::MAX;
    let mut last_cycle = Instant::now() - opts.period;
    // how long the last cycle took, and when its work ended: the loop rests
    // at least REST_PER_CYCLE_COST times that before the next cycle, so
    // deciding takes at most a third of the loop's time whatever arrives
    // (a drain: more changes per cycle), while a change on a quiet
    // scheduler is decided at once
    let mut last_cost = Duration::ZERO;
    let mut last_end = Instant::now();
    let mut last_status = Instant::now() - STATUS_INTERVAL;
    let mut cycles: u64 = 0;
    // the implicit queue "default" becomes a real object (status, `kubectl
    // get`) once a leader sees none; a few tries, then it stays implicit
    let mut default_queue: Option<tokio::task::JoinHandle<()>> = None;
    let mut default_queue_tries = 0;
    tokio::pin!(shutdown);
    loop {
        let rested = last_end + last_cost * REST_PER_CYCLE_COST;
        let wait = (last_cycle + opts.period)
            .max(rested)
            .saturating_duration_since(Instant::now());
        tokio::select! {
            _ = &mut shutdown => break,
            _ = shared.changed.notified() => {
                // event-driven: the first change after a quiet spell
                // cycles at once (a lone pod waits for no timer); changes
                // that follow a cycle closely are batched — `debounce`
                // after that cycle's end, and the rest rule
                let now = Instant::now();
                let quiet = now.saturating_duration_since(last_end) >= opts.debounce;
                let until = if quiet { rested } else { (last_end + opts.debounce).max(rested) };
                tokio::time::sleep_until(until.max(now).into()).await
            }
            // a standby that gains the lease cycles at once
            r = leader_changes.changed(), if lease_open => lease_open = r.is_ok(),
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
        if default_queue.as_ref().is_none_or(|t| t.is_finished())
            && !shared.with(|w| w.has_queue(crate::translate::DEFAULT_QUEUE))
            && default_queue_tries < 5
        {
            default_queue_tries += 1;
            default_queue = Some(tokio::spawn(create_default_queue(client.clone())));
        }
        let generation = shared.with(|w| w.generation);
        if generation == last_gen && last_cycle.elapsed() < opts.period {
            continue;
        }
        last_gen = generation;
        last_cycle = Instant::now();
        let t0 = Instant::now();
        let built = shared.with(|w| w.snapshot());
        cycles += 1;
        let cycle_ms = now_ms();
        // the world's state as changes: only what differs from the core's
        // kept state is applied (ids follow the snapshot's order)
        if let Err(e) = engine.sync(&built.snapshot) {
            tracing::error!(error = %e, "the incremental core refused the cluster's changes: starting it over from this state");
            engine = new_engine(&opts.config)?;
            if let Err(e) = engine.sync(&built.snapshot) {
                tracing::error!(error = %e, "the incremental core refused the cluster's state: no cycle");
                continue;
            }
        }
        let mut out = engine.cycle(cycle_ms, cycles);
        if let Some(d) = engine.divergences().first() {
            // debug builds run the full pass beside every cycle
            panic!("the incremental core decided otherwise than the full pass: {d}");
        }
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
        // why pods wait, for status and metrics: on the cycles that publish
        // them, not every cycle
        let status_cycle = last_status.elapsed() >= STATUS_INTERVAL;
        if status_cycle || opts.http_addr.is_some() {
            // parked jobs are not tried, so not explained by the cycle:
            // status, metrics and the debug endpoint show them with what
            // parked them
            engine.explain_parked(&mut out);
        }
        let classes = status_cycle
            .then(|| gpusched_core::report::classify::classify_cycle(&out, &built.snapshot));
        exec.apply(&out, &built, classes.as_ref());
        if let Some(classes) = &classes {
            last_status = Instant::now();
            if opts.provisioning.is_some() {
                gangs_tx.send_replace(Some(Arc::new(crate::provreq::gangs(&built, &out, classes))));
            }
            metrics.observe_cycle(&built, &out, classes);
            let (counts, observed) =
                shared.with(|w| (w.group_counts(), w.observed_status().clone()));
            exec.publish_status(&built, &counts, &observed);
        }
        if opts.http_addr.is_some() {
            health.publish(built, out, cycle_ms);
        }
        last_end = Instant::now();
    }
    tracing::info!("shutting down: waiting for bindings in flight");
    exec.drain(SHUTDOWN_DRAIN).await;
    let _ = stop_tx.send(true);
    // every holder of the leadership channel goes, so the lease task
    // releases the lease and ends
    drop(tasks);
    drop(leader_rx);
    drop(leader_changes);
    if let Some(task) = lease_task.0.take() {
        let _ = tokio::time::timeout(LEASE_RELEASE_WAIT, task).await;
    }
    Ok(())
}

/// The incremental core around the configured scheduler. Debug builds (the
/// test suites) give it an oracle: the full pass runs beside every cycle,
/// and a difference stops the process.
fn new_engine(config: &SchedulerConfig) -> anyhow::Result<Engine> {
    let build = || {
        gpusched_plugins::config::build(config)
            .map_err(|e| anyhow::anyhow!("scheduler config: {e}"))
    };
    let mut engine = Engine::new(build()?);
    if cfg!(debug_assertions) {
        engine.verify_with(build()?);
    }
    Ok(engine)
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

/// A task aborted when this is dropped.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            t.abort();
        }
    }
}

/// The loop's rest after a cycle, in multiples of that cycle's duration:
/// with 2, cycles take at most a third of the loop's time (the rest is
/// left to bindings, status writes and the watches).
const REST_PER_CYCLE_COST: u32 = 2;
/// How often PodGroup and Queue status is compared with what the watches
/// show (and written where they differ).
const STATUS_INTERVAL: Duration = Duration::from_secs(1);
/// How long shutdown waits for the bindings in flight.
const SHUTDOWN_DRAIN: Duration = Duration::from_secs(10);
/// How long shutdown waits for the lease task to release the lease.
const LEASE_RELEASE_WAIT: Duration = Duration::from_secs(5);
/// Pause after a failed lease renewal or acquisition before the next try.
const LEASE_RETRY: Duration = Duration::from_secs(1);

/// The lease this replica runs for.
#[derive(Clone, Debug)]
struct LeaseSpec {
    namespace: String,
    name: String,
    identity: String,
    seconds: u64,
}

impl LeaseSpec {
    /// A fresh lease manager: it reads the lease as it is now.
    async fn manager(
        &self,
        client: &Client,
    ) -> Result<kube_lease_manager::LeaseManager, kube_lease_manager::LeaseManagerError> {
        kube_lease_manager::LeaseManagerBuilder::new(client.clone(), &self.name)
            .with_namespace(&self.namespace)
            .with_identity(&self.identity)
            .with_duration(self.seconds)
            .with_grace((self.seconds / 3).max(2))
            .build()
            .await
    }
}

/// Whether a watched Lease is free to take: no holder (released by its
/// holder on shutdown, or by a standby once it expired).
fn lease_free(l: &k8s_openapi::api::coordination::v1::Lease) -> bool {
    l.spec
        .as_ref()
        .and_then(|s| s.holder_identity.as_deref())
        .is_none_or(str::is_empty)
}

/// Runs for the lease until every receiver of `tx` is gone, then releases
/// it. kube-lease-manager's `changed()` sleeps until the lease it last read
/// expires; a Lease watch cuts that short: when the lease shows no holder
/// while this replica is standby, a fresh manager reads it and takes it at
/// once, instead of waiting out the departed leader's term.
async fn lead(
    client: Client,
    lease: LeaseSpec,
    mut lm: kube_lease_manager::LeaseManager,
    tx: tokio_watch::Sender<bool>,
) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let api: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(client.clone(), &lease.namespace);
    let cfg = watcher::Config::default().fields(&format!("metadata.name={}", lease.name));
    let mut leases = watcher::watcher(api, cfg).default_backoff().boxed();
    let what = format!("{}/{}", lease.namespace, lease.name);
    let mut leading = false;
    let mut watching = true;
    loop {
        let mut fresh = false;
        {
            let changed = lm.changed();
            tokio::pin!(changed);
            loop {
                tokio::select! {
                    biased;
                    _ = tx.closed() => break,
                    r = &mut changed => {
                        match r {
                            Ok(now) => {
                                if now && !leading {
                                    tracing::info!(lease = %what, identity = %lease.identity, "gained the lease: leading");
                                } else if !now && leading {
                                    tracing::warn!(lease = %what, identity = %lease.identity, "lost the lease: standing by");
                                }
                                leading = now;
                                let _ = tx.send(now);
                            }
                            Err(e) => {
                                tracing::warn!(lease = %what, "lease: {e}");
                                tokio::time::sleep(LEASE_RETRY).await;
                            }
                        }
                        break;
                    }
                    ev = leases.next(), if watching => match ev {
                        None => watching = false,
                        Some(Ok(watcher::Event::Apply(l) | watcher::Event::InitApply(l)))
                            if !leading && lease_free(&l) =>
                        {
                            fresh = true;
                            break;
                        }
                        Some(_) => {}
                    },
                }
            }
        }
        if tx.is_closed() {
            break;
        }
        if fresh {
            tracing::debug!(lease = %what, "lease released: taking it over");
            match lease.manager(&client).await {
                Ok(m) => lm = m,
                Err(e) => tracing::warn!(lease = %what, "lease: {e}"),
            }
        }
    }
    match lm.release().await {
        Ok(()) if leading => {
            tracing::info!(lease = %what, identity = %lease.identity, "released the lease")
        }
        Ok(()) => {}
        Err(e) => tracing::warn!(lease = %what, "releasing the lease: {e}"),
    }
    let _ = tx.send(false);
}

/// Creates the Queue `default` (the queue of pods that name none) with the
/// defaults the scheduler gives it while it is implicit; an existing one
/// (409) is fine, another error is logged and retried on a later cycle.
async fn create_default_queue(client: Client) {
    let api: Api<crate::crd::Queue> = Api::all(client);
    let q = crate::crd::Queue::new(crate::translate::DEFAULT_QUEUE, Default::default());
    let mut q = q;
    q.spec.weight = 1;
    q.spec.borrow = true;
    q.spec.reclaimable = true;
    match api.create(&kube::api::PostParams::default(), &q).await {
        Ok(_) => tracing::info!("created the queue \"default\" (pods naming no queue are in it)"),
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => tracing::warn!("creating the queue \"default\": {e}"),
    }
}

/// The scheduler's name, for tests and tools.
pub fn scheduler_name() -> &'static str {
    crate::translate::SCHEDULER_NAME
}

#[allow(dead_code)]
fn _assert_send(s: Engine) -> impl Send {
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

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec as Spec};

    #[test]
    fn a_lease_without_a_holder_is_free() {
        let lease = |holder: Option<&str>| Lease {
            spec: Some(Spec {
                holder_identity: holder.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(lease_free(&lease(None)));
        assert!(lease_free(&lease(Some(""))));
        assert!(lease_free(&Lease::default()));
        assert!(!lease_free(&lease(Some("gpusched-7d9f"))));
    }
}

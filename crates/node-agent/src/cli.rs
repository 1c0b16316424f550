//! `gpusched agent`: flags, environment variables, and the process edge
//! (runtime, signals, logging). The only place that uses `anyhow`.

use crate::agent::Agent;
use crate::backend::fake::FakeBackend;
use crate::backend::nvml::NvmlBackend;
use crate::backend::{DeviceBackend, HealthWatch};
use crate::config::{
    BackendKind, ConfigFile, DeviceIdStrategy, MigStrategy, Settings, parse_duration,
};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// How long the Node publisher waits after a health change for more
/// before writing (a burst of faults is one write).
const NODE_PUBLISH_DEBOUNCE: Duration = Duration::from_millis(200);
/// `--discover-only`: longest health check period while listening.
const DISCOVER_CHECK_INTERVAL: Duration = Duration::from_secs(1);
/// `--discover-only`: how long health events are listened for with NVML
/// (events registered, anything pending arrives).
const DISCOVER_LISTEN_NVML: Duration = Duration::from_secs(2);
/// `--discover-only`: the same with the fake backend (events are local).
const DISCOVER_LISTEN_FAKE: Duration = Duration::from_millis(50);

/// How the agent hands GPUs to the kubelet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum AgentMode {
    /// Kubelet device plugin (`nvidia.com/gpu` and friends).
    #[default]
    DevicePlugin,
    /// DRA kubelet plugin (driver `gpu.gpusched.io`, ResourceSlices and
    /// claims); needs --node-name.
    Dra,
}

/// Kubelet device plugin (or DRA kubelet plugin) for NVIDIA GPUs.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct AgentArgs {
    /// Device plugin (default) or DRA kubelet plugin; one mode per node.
    #[arg(long, value_enum, env = "GPUSCHED_AGENT_MODE")]
    pub mode: Option<AgentMode>,
    /// DRA: the kubelet's plugin registry directory.
    #[arg(long, env = "GPUSCHED_AGENT_DRA_REGISTRY_DIR")]
    pub dra_registry_dir: Option<PathBuf>,
    /// DRA: directory of the plugin's socket and checkpoint.
    #[arg(long, env = "GPUSCHED_AGENT_DRA_PLUGIN_DIR")]
    pub dra_plugin_dir: Option<PathBuf>,
    /// DRA: --dra-plugin-dir as the kubelet sees it (default: the same).
    #[arg(long, env = "GPUSCHED_AGENT_DRA_KUBELET_PLUGIN_DIR")]
    pub dra_kubelet_plugin_dir: Option<PathBuf>,
    /// DRA: where CDI specs of prepared claims are written.
    #[arg(long, env = "GPUSCHED_AGENT_CDI_DIR")]
    pub cdi_dir: Option<PathBuf>,
    /// DRA: how often the node's ResourceSlice is checked (e.g. 10s).
    #[arg(long, env = "GPUSCHED_AGENT_DRA_SLICE_RESYNC")]
    pub dra_slice_resync: Option<String>,
    /// Versioned YAML config file (`version: v1`); flags override it.
    #[arg(long, env = "GPUSCHED_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Device source.
    #[arg(long, value_enum, env = "GPUSCHED_AGENT_BACKEND")]
    pub backend: Option<BackendKind>,
    /// Node file for the fake backend (cluster-file vocabulary, one node).
    #[arg(long, env = "GPUSCHED_AGENT_NODE_FILE")]
    pub node_file: Option<PathBuf>,
    /// Fault-injection control file for the fake backend.
    #[arg(long, env = "GPUSCHED_AGENT_CONTROL_FILE")]
    pub control_file: Option<PathBuf>,
    /// Kubelet device plugin directory.
    #[arg(long, env = "GPUSCHED_AGENT_PLUGIN_DIR")]
    pub plugin_dir: Option<PathBuf>,
    /// File name of the kubelet's registration socket inside the plugin dir.
    #[arg(long, env = "GPUSCHED_AGENT_KUBELET_SOCKET")]
    pub kubelet_socket: Option<String>,
    /// Device ids: GPU/MIG UUIDs or indices.
    #[arg(long, value_enum, env = "GPUSCHED_AGENT_DEVICE_ID_STRATEGY")]
    pub device_id_strategy: Option<DeviceIdStrategy>,
    /// Return /dev/nvidia* device specs (when the NVIDIA runtime is not used).
    #[arg(long, env = "GPUSCHED_AGENT_PASS_DEVICE_SPECS", num_args = 0..=1, default_missing_value = "true")]
    pub pass_device_specs: Option<bool>,
    /// Return CDI device names (`nvidia.com/gpu=<uuid>`).
    #[arg(long, env = "GPUSCHED_AGENT_CDI_ENABLED", num_args = 0..=1, default_missing_value = "true")]
    pub cdi_enabled: Option<bool>,
    /// How MIG devices are offered.
    #[arg(long, value_enum, env = "GPUSCHED_AGENT_MIG_STRATEGY")]
    pub mig_strategy: Option<MigStrategy>,
    /// A GPU that stays clean this long is offered again (e.g. 5m, 30s).
    #[arg(long, env = "GPUSCHED_AGENT_QUIET_PERIOD")]
    pub quiet_period: Option<String>,
    /// Let unhealthy GPUs recover after the quiet period.
    #[arg(long, env = "GPUSCHED_AGENT_RECOVER", num_args = 0..=1, default_missing_value = "true")]
    pub recover: Option<bool>,
    /// Address of /metrics, /healthz, /readyz; empty disables.
    #[arg(long, env = "GPUSCHED_AGENT_METRICS_ADDRESS")]
    pub metrics_address: Option<String>,
    /// NFD local feature file for node labels; empty disables.
    #[arg(long, env = "GPUSCHED_AGENT_FEATURE_FILE")]
    pub feature_file: Option<String>,
    /// This node's name (downward API `spec.nodeName`): turns on the
    /// Kubernetes side (decisions, node publishing; in-cluster credentials).
    #[arg(long, env = "GPUSCHED_AGENT_NODE_NAME")]
    pub node_name: Option<String>,
    /// Advertise GPU shares as `gpusched.io/gpu-milli` (needs --node-name);
    /// with `--mode dra`, publish each whole GPU for sharing (capacity
    /// `gpu.gpusched.io/milli`, docs/dra.md).
    #[arg(long, env = "GPUSCHED_AGENT_SHARES", num_args = 0..=1, default_missing_value = "true")]
    pub shares: Option<bool>,
    /// Refuse `Allocate` when no scheduler decision matches (with --node-name).
    #[arg(long, env = "GPUSCHED_AGENT_REQUIRE_DECISION", num_args = 0..=1, default_missing_value = "true")]
    pub require_decision: Option<bool>,
    /// The kubelet's PodResources socket (read after a restart).
    #[arg(long, env = "GPUSCHED_AGENT_POD_RESOURCES_SOCKET")]
    pub pod_resources_socket: Option<PathBuf>,
    /// Print discovered devices, topology, MIG and health registration, then exit.
    #[arg(long)]
    pub discover_only: bool,
    /// Log format.
    #[arg(long, value_parser = ["text", "json"], default_value = "text", env = "GPUSCHED_AGENT_LOG_FORMAT")]
    pub log_format: String,
}

impl AgentArgs {
    /// The DRA settings (`--mode dra`); `None` in device-plugin mode.
    pub fn dra_settings(&self, s: &Settings) -> anyhow::Result<Option<crate::dra::DraSettings>> {
        if self.mode.unwrap_or_default() != AgentMode::Dra {
            for (set, flag) in [
                (self.dra_registry_dir.is_some(), "--dra-registry-dir"),
                (self.dra_plugin_dir.is_some(), "--dra-plugin-dir"),
                (
                    self.dra_kubelet_plugin_dir.is_some(),
                    "--dra-kubelet-plugin-dir",
                ),
                (self.cdi_dir.is_some(), "--cdi-dir"),
                (self.dra_slice_resync.is_some(), "--dra-slice-resync"),
            ] {
                if set {
                    anyhow::bail!("flag {flag} needs --mode dra");
                }
            }
            return Ok(None);
        }
        let Some(node) = &s.node_name else {
            anyhow::bail!(
                "--mode dra needs --node-name: the node's ResourceSlice pool is named after it"
            );
        };
        let mut d = crate::dra::DraSettings::new(node);
        if let Some(v) = &self.dra_registry_dir {
            d.registry_dir = v.clone();
        }
        if let Some(v) = &self.dra_plugin_dir {
            d.plugin_dir = v.clone();
            d.kubelet_plugin_dir = v.clone();
        }
        if let Some(v) = &self.dra_kubelet_plugin_dir {
            d.kubelet_plugin_dir = v.clone();
        }
        if let Some(v) = &self.cdi_dir {
            d.cdi_dir = v.clone();
        }
        if let Some(v) = &self.dra_slice_resync {
            d.slice_resync =
                parse_duration(v).map_err(|w| anyhow::anyhow!("flag --dra-slice-resync: {w}"))?;
            if d.slice_resync.is_zero() {
                anyhow::bail!("flag --dra-slice-resync: {v:?} must be more than 0");
            }
        }
        Ok(Some(d))
    }

    /// File, then flags and environment variables.
    pub fn settings(&self) -> anyhow::Result<Settings> {
        let mut s = Settings::default();
        if let Some(p) = &self.config {
            let f = ConfigFile::load(p)?;
            f.apply(&mut s, &p.display().to_string())?;
        }
        if let Some(v) = self.backend {
            s.backend = v;
        }
        if self.node_file.is_some() {
            s.node_file = self.node_file.clone();
        }
        if self.control_file.is_some() {
            s.control_file = self.control_file.clone();
        }
        if let Some(v) = &self.plugin_dir {
            s.plugin_dir = v.clone();
        }
        if let Some(v) = &self.kubelet_socket {
            s.kubelet_socket = v.clone();
        }
        if let Some(v) = self.device_id_strategy {
            s.device_id_strategy = v;
        }
        if let Some(v) = self.pass_device_specs {
            s.pass_device_specs = v;
        }
        if let Some(v) = self.cdi_enabled {
            s.cdi_enabled = v;
        }
        if let Some(v) = self.mig_strategy {
            s.mig_strategy = v;
        }
        if let Some(v) = &self.quiet_period {
            s.quiet_period =
                parse_duration(v).map_err(|w| anyhow::anyhow!("flag --quiet-period: {w}"))?;
            if s.quiet_period < crate::config::MIN_QUIET_PERIOD {
                anyhow::bail!(
                    "flag --quiet-period (or GPUSCHED_AGENT_QUIET_PERIOD): {}",
                    crate::config::quiet_period_too_short(v)
                );
            }
        }
        if let Some(v) = self.recover {
            s.recover = v;
        }
        if let Some(v) = &self.metrics_address {
            if v.is_empty() {
                s.metrics_address = None;
            } else {
                v.parse::<std::net::SocketAddr>().map_err(|_| {
                    anyhow::anyhow!("flag --metrics-address: {v:?} is not host:port")
                })?;
                s.metrics_address = Some(v.clone());
            }
        }
        if let Some(v) = &self.feature_file {
            s.feature_file = (!v.is_empty()).then(|| PathBuf::from(v));
        }
        if let Some(v) = &self.node_name {
            s.node_name = (!v.is_empty()).then(|| v.clone());
        }
        if let Some(v) = self.shares {
            s.shares = v;
        }
        if let Some(v) = self.require_decision {
            s.require_decision = v;
        }
        if let Some(v) = &self.pod_resources_socket {
            s.pod_resources_socket = v.clone();
        }
        if s.shares && s.node_name.is_none() {
            anyhow::bail!(
                "flag --shares needs --node-name: which GPU a share gets comes from the scheduler's decision"
            );
        }
        s.validate()?;
        Ok(s)
    }
}

fn init_logging(format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    let _ = if format == "json" {
        b.json().try_init()
    } else {
        b.try_init()
    };
}

/// Builds the backend the settings ask for.
pub fn make_backend(s: &Settings) -> anyhow::Result<Arc<dyn DeviceBackend>> {
    Ok(match s.backend {
        BackendKind::Nvml => Arc::new(NvmlBackend::new()?),
        BackendKind::Fake => {
            let path = s
                .node_file
                .as_ref()
                .context("the fake backend needs --node-file")?;
            Arc::new(FakeBackend::from_file(path, s.control_file.clone())?)
        }
    })
}

/// Entry point of `gpusched agent`.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    init_logging(&args.log_format);
    let settings = args.settings()?;
    let backend = make_backend(&settings)?;
    if args.discover_only {
        return discover(&settings, backend);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    if let Some(dra) = args.dra_settings(&settings)? {
        return rt.block_on(async move {
            let client = ::kube::Client::try_default()
                .await
                .context("--mode dra needs Kubernetes credentials (in-cluster or kubeconfig)")?;
            let claims = Arc::new(crate::dra::kube::KubeClaims::new(client.clone()));
            let slices = Arc::new(crate::dra::kube::KubeSlices::new(client, &dra.node));
            serve_dra(settings, dra, backend, claims, slices, shutdown_signal()).await
        });
    }
    rt.block_on(async move {
        let side = match &settings.node_name {
            Some(node) => Some(kube_side(node, settings.require_decision).await?),
            None => None,
        };
        serve_with(settings, backend, side, shutdown_signal()).await
    })
}

/// The Kubernetes side with in-cluster (or kubeconfig) credentials.
pub async fn kube_side(
    node: &str,
    require_decision: bool,
) -> anyhow::Result<crate::coord::KubeSide> {
    let client = ::kube::Client::try_default().await.context(
        "--node-name is set but no Kubernetes credentials were found (in-cluster or kubeconfig)",
    )?;
    Ok(crate::coord::KubeSide {
        node: node.to_string(),
        pods: Arc::new(crate::kube::KubePods::new(client.clone(), node)),
        events: Arc::new(crate::kube::KubeEvents::new(client.clone(), node)),
        node_sink: Some(Arc::new(crate::kube::KubeNode::new(client, node))),
        require_decision,
    })
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let int = signal(SignalKind::interrupt());
    match (term, int) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => tracing::info!("SIGTERM"),
                _ = i.recv() => tracing::info!("SIGINT"),
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Runs the agent until `shutdown` resolves, then removes its sockets.
pub async fn serve(
    settings: Settings,
    backend: Arc<dyn DeviceBackend>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    serve_with(settings, backend, None, shutdown).await
}

/// [`serve`] with the Kubernetes side (`docs/protocol.md`): decisions are
/// loaded, and what the kubelet already handed out is read back from
/// PodResources, before the agent registers with the kubelet.
pub async fn serve_with(
    settings: Settings,
    backend: Arc<dyn DeviceBackend>,
    side: Option<crate::coord::KubeSide>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // One agent per plugin directory: taken before anything is served or
    // written, held until this function returns.
    std::fs::create_dir_all(&settings.plugin_dir)
        .with_context(|| format!("cannot create plugin dir {}", settings.plugin_dir.display()))?;
    let lock = crate::lock::acquire(&settings.plugin_dir)?;
    tracing::info!(file = %lock.path().display(), "holding the plugin dir lock");
    let agent = Agent::new(settings, backend)?;
    for g in &agent.inventory.gpus {
        tracing::info!(index = g.index, uuid = %g.uuid, model = %g.model, topo = ?g.topo, mig = g.mig.len(), "gpu");
    }
    for p in &agent.plans {
        tracing::info!(resource = %p.name, devices = p.devices.len(), "resource");
    }
    for w in crate::plan::unused_replication(&agent.plans, &agent.settings) {
        tracing::warn!("{w}");
    }
    let (stop_tx, stop_rx) = watch::channel(false);
    let mut kube_tasks = Vec::new();
    if let Some(side) = side {
        let gpus = agent
            .inventory
            .gpus
            .iter()
            .map(|g| crate::decisions::LedgerGpu {
                index: g.index,
                uuid: g.uuid.clone(),
                memory_mib: g.memory_mib,
            })
            .collect();
        let coord = crate::coord::Coordinator::new(side.clone(), gpus);
        let _ = agent.coord.set(coord.clone());
        match coord.refresh().await {
            Ok(()) => {
                tracing::info!(node = %side.node, decisions = coord.ledger().entries().len(), "loaded the decisions of this node")
            }
            Err(e) => tracing::warn!("initial pod list: {e} (the watch will retry)"),
        }
        match crate::podresources::list(&agent.settings.pod_resources_socket).await {
            Ok(held) => {
                let n = crate::podresources::restore(&agent, &held, true).unwrap_or(0);
                tracing::info!(
                    pods = held.len(),
                    restored = n,
                    "read held devices from PodResources"
                );
            }
            Err(e) => tracing::warn!(
                socket = %agent.settings.pod_resources_socket.display(),
                "PodResources unavailable: {e}; decisions already served count as pending"
            ),
        }
        kube_tasks.push(tokio::spawn(crate::podresources::reconcile_loop(
            agent.clone(),
            stop_rx.clone(),
        )));
        kube_tasks.push(tokio::spawn(
            side.pods.clone().watch(coord, stop_rx.clone()),
        ));
        if let Some(sink) = side.node_sink.clone() {
            kube_tasks.push(tokio::spawn(crate::kube::publish_loop(
                agent.clone(),
                sink,
                NODE_PUBLISH_DEBOUNCE,
                stop_rx.clone(),
            )));
        }
    }
    let events = agent.start_health()?;
    let health = tokio::spawn(agent.clone().run_health(events, stop_rx.clone()));
    if let Some(f) = &agent.settings.feature_file {
        let labels = crate::labels::node_labels(&agent.inventory, &agent.settings);
        match crate::labels::write_feature_file(f, &labels) {
            Ok(()) => tracing::info!(file = %f.display(), "wrote node feature labels"),
            Err(e) => tracing::warn!(file = %f.display(), "cannot write node feature labels: {e}"),
        }
    }
    let http = match &agent.settings.metrics_address {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on metrics address {a}"))?;
            tracing::info!(address = %a, "serving /metrics /healthz /readyz");
            Some(tokio::spawn(crate::http::serve(
                agent.clone(),
                l,
                stop_rx.clone(),
            )))
        }
        None => None,
    };
    let mut servers = tokio::task::JoinSet::new();
    for r in 0..agent.plans.len() {
        servers.spawn(crate::server::run_resource(
            agent.clone(),
            r,
            stop_rx.clone(),
        ));
    }
    let mut result: anyhow::Result<()> = Ok(());
    let mut record = |r: Result<Result<(), crate::server::ServerError>, tokio::task::JoinError>| {
        let e = match r {
            Ok(Ok(())) => return,
            Ok(Err(e)) => anyhow::Error::from(e),
            Err(e) => anyhow::anyhow!("plugin server task failed: {e}"),
        };
        if result.is_ok() {
            result = Err(e);
        }
    };
    tokio::pin!(shutdown);
    tokio::select! {
        _ = &mut shutdown => {}
        Some(r) = servers.join_next() => record(r),
    }
    let _ = stop_tx.send(true);
    while let Some(r) = servers.join_next().await {
        record(r);
    }
    let _ = health.await;
    for t in kube_tasks {
        let _ = t.await;
    }
    if let Some(h) = http {
        let _ = h.await;
    }
    tracing::info!("agent stopped");
    drop(lock);
    result
}

/// Runs the agent as a DRA kubelet plugin until `shutdown` resolves:
/// serves the registration and DRA sockets, keeps the node's ResourceSlice
/// published, prepares claims, then removes its sockets (the checkpoint and
/// CDI specs of prepared claims stay).
pub async fn serve_dra(
    settings: Settings,
    dra: crate::dra::DraSettings,
    backend: Arc<dyn DeviceBackend>,
    claims: Arc<dyn crate::dra::prepare::ClaimSource>,
    slices: Arc<dyn crate::dra::kube::SliceStore>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(&dra.plugin_dir)
        .with_context(|| format!("cannot create DRA plugin dir {}", dra.plugin_dir.display()))?;
    let lock = crate::lock::acquire(&dra.plugin_dir)?;
    tracing::info!(file = %lock.path().display(), "holding the DRA plugin dir lock");
    let agent = Agent::new(settings, backend)?;
    for g in crate::dra::slice::published_gpus(&agent.inventory) {
        tracing::info!(device = %gpusched_model::dra::gpu_device_name(g.index), uuid = %g.uuid, model = %g.model, "dra device");
    }
    let preparer = Arc::new(crate::dra::prepare::Preparer::new(
        &dra.node,
        agent.inventory.clone(),
        &dra.cdi_dir,
        &dra.checkpoint(),
        agent.settings.pass_device_specs,
        agent.settings.shares,
        claims,
    )?);
    let (stop_tx, stop_rx) = watch::channel(false);
    let (reg_tx, reg_rx) = watch::channel(None);
    let events = agent.start_health()?;
    let health = tokio::spawn(agent.clone().run_health(events, stop_rx.clone()));
    let publish = tokio::spawn(crate::dra::kube::publish_loop(
        agent.clone(),
        dra.node.clone(),
        slices,
        dra.slice_resync,
        reg_rx.clone(),
        stop_rx.clone(),
    ));
    // Ready once the kubelet has registered the plugin.
    let ready = {
        let agent = agent.clone();
        let mut reg = reg_rx;
        let mut stop = stop_rx.clone();
        tokio::spawn(async move {
            loop {
                let ok = *reg.borrow_and_update() == Some(true);
                for r in 0..agent.plans.len() {
                    agent.set_registered(r, ok);
                }
                tokio::select! {
                    r = reg.changed() => if r.is_err() { return },
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        })
    };
    if let Some(f) = &agent.settings.feature_file {
        let labels = crate::labels::node_labels(&agent.inventory, &agent.settings);
        match crate::labels::write_feature_file(f, &labels) {
            Ok(()) => tracing::info!(file = %f.display(), "wrote node feature labels"),
            Err(e) => tracing::warn!(file = %f.display(), "cannot write node feature labels: {e}"),
        }
    }
    let http = match &agent.settings.metrics_address {
        Some(a) => {
            let l = tokio::net::TcpListener::bind(a)
                .await
                .with_context(|| format!("cannot listen on metrics address {a}"))?;
            Some(tokio::spawn(crate::http::serve(
                agent.clone(),
                l,
                stop_rx.clone(),
            )))
        }
        None => None,
    };
    let health_svc = crate::dra::grpc::HealthService::new(
        agent.clone(),
        &dra.node,
        crate::dra::grpc::HEALTH_HEARTBEAT,
        stop_rx.clone(),
    );
    let server = crate::dra::grpc::serve(&dra, preparer, health_svc, reg_tx, stop_rx.clone());
    tokio::pin!(server);
    tokio::pin!(shutdown);
    let result: anyhow::Result<()> = tokio::select! {
        _ = &mut shutdown => {
            let _ = stop_tx.send(true);
            server.await.map_err(anyhow::Error::from)
        }
        r = &mut server => r.map_err(anyhow::Error::from),
    };
    let _ = stop_tx.send(true);
    let _ = health.await;
    let _ = publish.await;
    let _ = ready.await;
    if let Some(h) = http {
        let _ = h.await;
    }
    tracing::info!("DRA agent stopped");
    drop(lock);
    result
}

fn discover(s: &Settings, backend: Arc<dyn DeviceBackend>) -> anyhow::Result<()> {
    let inv = backend.discover()?;
    println!("backend: {}", backend.name());
    println!(
        "driver: {}  cuda: {}  gpus: {}",
        inv.driver_version,
        inv.cuda_version,
        inv.gpus.len()
    );
    for g in &inv.gpus {
        println!(
            "gpu {} {} model={} memory={}MiB pci={} minor={} numa={} pcie_switch={} nvlink_domain={} nvlink_peers={:?} mig={}",
            g.index,
            g.uuid,
            g.model,
            g.memory_mib,
            g.pci_bus_id,
            g.minor,
            fmt_opt(g.topo.numa),
            fmt_opt(g.topo.pcie_switch),
            fmt_opt(g.topo.nvlink),
            g.nvlink_peers,
            if g.mig_enabled { "enabled" } else { "disabled" }
        );
        for m in &g.mig {
            println!(
                "  mig {} profile={} memory={}MiB",
                m.uuid, m.profile, m.memory_mib
            );
        }
    }
    // What would stop `serve` also fails this run (after printing it all),
    // so a preflight check never passes a config that cannot serve.
    let mut problems: Vec<String> = Vec::new();
    match crate::plan::build_plans(&inv, s) {
        Ok(plans) => {
            for p in &plans {
                println!("resource {} devices={}", p.name, p.devices.len());
            }
            for w in crate::plan::unused_replication(&plans, s) {
                println!("warning: {w}");
            }
        }
        Err(e) => {
            println!("resources: error: {e}");
            problems.push(format!("resources: {e}"));
        }
    }
    for (k, v) in crate::labels::node_labels(&inv, s) {
        println!("label {k}={v}");
    }
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    match backend.watch_health(
        HealthWatch {
            check_interval: s.check_interval.min(DISCOVER_CHECK_INTERVAL),
        },
        tx,
    ) {
        Ok(()) => {
            let listen = if backend.name() == "nvml" {
                DISCOVER_LISTEN_NVML
            } else {
                DISCOVER_LISTEN_FAKE
            };
            println!("health: event registration ok; listening {listen:?}");
            std::thread::sleep(listen);
            while let Ok(ev) = rx.try_recv() {
                println!("health event: {ev:?}");
            }
        }
        Err(e) => {
            println!("health: registration failed: {e}");
            if !s.health_disabled {
                problems.push(format!("health: {e}"));
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        anyhow::bail!(
            "--discover-only: this node cannot be served: {}",
            problems.join("; ")
        )
    }
}

fn fmt_opt(v: Option<u32>) -> String {
    v.map(|n| n.to_string()).unwrap_or_else(|| "-".into())
}

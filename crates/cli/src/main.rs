//! The `gpusched` binary.

use clap::{Parser, Subcommand};

mod agent;
mod bench;
mod bench_arrival;
mod doctor;
mod explain;
mod kubectl;
mod openb;
mod scheduler;
mod simulate;
mod snapshot;

#[derive(Parser)]
#[command(name = "gpusched", version, about = "GPU scheduling for Kubernetes")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run the trace-driven simulator (default: an embedded mixed cluster and workload).
    Simulate(simulate::SimulateArgs),
    /// Run the node agent: a kubelet device plugin for NVIDIA GPUs, or with
    /// `--mode dra` a DRA kubelet plugin (driver gpu.gpusched.io).
    Agent(agent::AgentArgs),
    /// Run the scheduler against a Kubernetes API server.
    Scheduler(scheduler::SchedulerArgs),
    /// Print the CustomResourceDefinitions (Queue, PodGroup) as YAML.
    Crds(scheduler::CrdsArgs),
    /// Print Node objects for kwok (fake nodes, no kubelet) from a cluster
    /// file, with the GPU labels, capacity and the `gpusched.io/gpus`
    /// annotation an agent would publish: `gpusched fake-nodes FILE |
    /// kubectl create -f -` (used by scripts/tryout).
    FakeNodes(scheduler::FakeNodesArgs),
    /// Check a cluster's GPU scheduling health (nodes, agents, pending pods, leaks); exit 0 when healthy.
    Doctor(doctor::DoctorArgs),
    /// Capture a live cluster's scheduling state into a file for `simulate --snapshot`.
    Snapshot(snapshot::SnapshotArgs),
    /// Measure scheduling throughput, gang latency and memory on synthetic clusters.
    Bench(bench::BenchArgs),
    /// Why a pod is pending (or where it runs), or a queue's state: from the
    /// scheduler's debug endpoint or a simulator run (docs/explain.md).
    #[command(subcommand)]
    Explain(explain::ExplainCmd),
    /// The pending pods in queue order with their reasons (all queues, or
    /// one with --queue), from the scheduler's debug endpoint or --from-sim.
    Pending(explain::PendingArgs),
}

/// `kubectl gpusched`: the binary run as `kubectl-gpusched` (a link or a
/// copy on $PATH; plugin.yaml installs it so): only the verbs a kubectl
/// user needs, with kubectl's flags.
#[derive(Parser)]
#[command(
    name = "kubectl gpusched",
    bin_name = "kubectl gpusched",
    version,
    about = "Why GPU pods wait, what queues hold, and whether the cluster's GPU scheduling is healthy (gpusched)"
)]
struct PluginCli {
    #[command(subcommand)]
    cmd: PluginCmd,
}

#[derive(Subcommand)]
enum PluginCmd {
    /// Why a pod is pending (or where it runs), or a queue's state.
    #[command(subcommand)]
    Explain(explain::ExplainCmd),
    /// The pending pods in queue order with their reasons (all queues, or
    /// one with --queue).
    Pending(explain::PendingArgs),
    /// Check the cluster's GPU scheduling health; exit 0 when healthy.
    Doctor(doctor::DoctorArgs),
}

/// Runs the command; a failure is printed as one `error: …` line with its
/// causes (never a backtrace, whatever RUST_BACKTRACE says: these are
/// users' errors — a bad file, flag or cluster — not crashes) and exits 1.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    // as a kubectl plugin (`kubectl gpusched explain …`: the binary linked
    // or copied as `kubectl-gpusched` on $PATH) only the plugin's verbs,
    // with the same arguments
    let plugin = std::env::args_os()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_name()
                .map(|f| f.to_string_lossy().starts_with("kubectl-gpusched"))
        })
        .unwrap_or(false);
    if plugin {
        let args = kubectl::flags_last(std::env::args_os().collect());
        return match PluginCli::parse_from(args).cmd {
            PluginCmd::Explain(c) => explain::run(c),
            PluginCmd::Pending(a) => explain::pending(a),
            PluginCmd::Doctor(a) => doctor::run(a),
        };
    }
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Simulate(a) => simulate::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Agent(a) => agent::run(a),
        Cmd::Scheduler(a) => scheduler::run(a),
        Cmd::Crds(a) => scheduler::crds(a),
        Cmd::FakeNodes(a) => scheduler::fake_nodes(a),
        Cmd::Explain(c) => explain::run(c),
        Cmd::Pending(a) => explain::pending(a),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Snapshot(a) => snapshot::run(a),
    }
}

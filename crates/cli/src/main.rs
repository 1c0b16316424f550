//! The `gpusched` binary.

use clap::{Parser, Subcommand};

mod agent;
mod bench;
mod doctor;
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
    /// Run the node agent: a kubelet device plugin for NVIDIA GPUs.
    Agent(agent::AgentArgs),
    /// Run the scheduler against a Kubernetes API server.
    Scheduler(scheduler::SchedulerArgs),
    /// Print the CustomResourceDefinitions (Queue, PodGroup) as YAML.
    Crds,
    /// Check a cluster's GPU scheduling health (nodes, agents, pending pods, leaks); exit 0 when healthy.
    Doctor(doctor::DoctorArgs),
    /// Capture a live cluster's scheduling state into a file for `simulate --snapshot`.
    Snapshot(snapshot::SnapshotArgs),
    /// Measure scheduling throughput, gang latency and memory on synthetic clusters.
    Bench(bench::BenchArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Simulate(a) => simulate::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Agent(a) => agent::run(a),
        Cmd::Scheduler(a) => scheduler::run(a),
        Cmd::Crds => scheduler::crds(),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Snapshot(a) => snapshot::run(a),
    }
}

//! The `gpusched` binary.

use clap::{Parser, Subcommand};

mod agent;
mod bench;
mod openb;
mod scheduler;
mod simulate;

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
    }
}

//! The `gpusched` binary.

use clap::{Parser, Subcommand};

mod openb;
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
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Simulate(a) => simulate::run(a),
    }
}

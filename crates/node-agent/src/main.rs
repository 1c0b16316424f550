//! Stand-alone agent binary (the same code as `gpusched agent`), used by the
//! Go wire-compatibility harness and benchmarks. An optional leading `agent`
//! argument is accepted so both spellings work.

use clap::Parser;
use gpusched_node_agent::cli::{AgentArgs, run};

#[derive(Parser)]
#[command(
    name = "gpusched-node-agent",
    version,
    about = "Kubelet device plugin for NVIDIA GPUs"
)]
struct Cli {
    #[command(flatten)]
    args: AgentArgs,
}

fn main() -> anyhow::Result<()> {
    let mut argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if argv.get(1).is_some_and(|a| a == "agent") {
        argv.remove(1);
    }
    run(Cli::parse_from(argv).args)
}

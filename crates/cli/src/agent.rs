//! `gpusched agent`: the kubelet device plugin for NVIDIA GPUs.
//!
//! The flags, the config file and the whole run loop live in the
//! `gpusched-node-agent` crate; this module only re-exports its edge so that
//! `main.rs` can mount it as a subcommand:
//!
//! ```ignore
//! Command::Agent(args) => agent::run(args),
//! ```
//!
//! (needs `gpusched-node-agent = { path = "../node-agent" }` in this crate's
//! Cargo.toml).

pub use gpusched_node_agent::cli::AgentArgs;

/// Runs the agent until SIGTERM/SIGINT.
pub fn run(args: AgentArgs) -> anyhow::Result<()> {
    gpusched_node_agent::cli::run(args)
}

//! The operator's tools, beside the running scheduler rather than in it:
//! [`doctor`] (`gpusched doctor`: read-only checks of a cluster),
//! [`snapshot`] (`gpusched snapshot capture`: the scheduler's view of a
//! cluster in one file, replayed by `gpusched simulate --snapshot`) and
//! [`debug_client`] (`gpusched explain`: the client of the scheduler's
//! debug endpoint).
//!
//! The direction is one way: the tools read the scheduler's modules
//! (`world`, `translate`, `client`, `debug`'s types), and nothing the
//! running scheduler uses (`controller`, `watch`, `world`, `exec`,
//! `metrics`, `debug`) imports from here. What the tools and the scheduler
//! both need (the classification of pending pods, the reports) lives in
//! the core and the plugins.

pub mod debug_client;
pub mod doctor;
pub mod snapshot;

use anyhow::Context;

/// Runs a future on a fresh runtime: the tools are the binary's one-shot
/// commands (`doctor`, `snapshot capture`, `explain`).
pub fn block_on<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(f)
}

//! Shared helpers of the simulator's integration tests.
#![allow(dead_code)]

use gpusched_core::Scheduler;
use gpusched_sim::{NoHooks, Scenario, SimResult};

/// Text of a file under `fixtures/`.
pub fn fixture(rel: &str) -> String {
    let p = format!("{}/../../fixtures/{rel}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{p}: {e}"))
}

/// A scenario from a cluster and a workload fixture.
pub fn scenario(cluster: &str, workload: &str, seed: u64) -> Scenario {
    gpusched_sim::load::fixture_scenario(cluster, workload, seed).unwrap_or_else(|e| panic!("{e}"))
}

/// A scenario of the two-node `clusters/tiny.yaml` and a workload given
/// as text (seed 1).
pub fn tiny_with(workload: &str) -> Scenario {
    let c = fixture("clusters/tiny.yaml");
    gpusched_sim::scenario(
        Some(gpusched_sim::Source {
            name: "tiny.yaml",
            text: &c,
        }),
        Some(gpusched_sim::Source {
            name: "w.yaml",
            text: workload,
        }),
        1,
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The scheduler the simulator runs by default
/// (`gpusched_plugins::build(&SchedulerConfig::default())`).
pub fn scheduler() -> Scheduler {
    gpusched_sim::sched::default_scheduler()
}

/// Runs with conservation checks after every cycle and event.
pub fn run_verified(mut sc: Scenario, seed: u64) -> SimResult {
    sc.settings.verify = true;
    gpusched_sim::run(&sc, &mut scheduler(), seed, &mut NoHooks)
}

/// Fails with the simulator's own error list when it refused anything.
pub fn assert_clean(r: &SimResult) {
    assert_eq!(
        r.totals.sim_errors, 0,
        "simulator errors (refused decisions / conservation): {:#?}",
        r.errors
    );
    assert_eq!(
        r.totals.gangs_started_partially, 0,
        "a gang started partially"
    );
}

/// Every cluster/workload fixture pair.
pub const PAIRS: &[(&str, &str)] = &[
    ("mixed.yaml", "mixed.yaml"),
    ("mixed.yaml", "reclaim-burst.yaml"),
    ("dgx-h100.yaml", "gang-failure.yaml"),
    ("dgx-h100.yaml", "preemption.yaml"),
    ("tiny.yaml", "retry-limit.yaml"),
    ("pcie-l40s.yaml", "notebooks.yaml"),
    ("dgx-h100.yaml", "replicas.yaml"),
];

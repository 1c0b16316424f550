//! The simulator runs the scheduler as the incremental core (issue 37):
//! with the full pass beside every cycle as its oracle, every fixture pair
//! and policy, and a deep queue, decide exactly alike — decisions,
//! counters, explanations and kept capacity — and the safety flush finds
//! no job a change should have woken (no missed hint).

mod common;

use gpusched_sim::{NoHooks, Scenario, SimResult};

fn checked(sc: &Scenario, policy: Option<&str>, seed: u64) -> SimResult {
    let build = || gpusched_sim::sched::build(None, policy).expect("scheduler");
    gpusched_sim::run_checked(sc, &mut build(), Some(build()), seed, &mut NoHooks)
}

fn assert_same_as_full_pass(what: &str, r: &SimResult) {
    assert_eq!(
        r.totals.sim_errors, 0,
        "{what}: the incremental core and the full pass differ, or a decision was refused: {:#?}",
        r.errors
    );
    assert_eq!(
        r.engine.missed_hints, 0,
        "{what}: the safety flush woke jobs that then got a decision: {:?}",
        r.engine
    );
    assert_eq!(
        r.engine.cycles, r.cycles,
        "{what}: every cycle ran on the core"
    );
}

#[test]
fn every_fixture_and_policy_decides_as_the_full_pass() {
    let mut parked = 0;
    let mut flushes = 0;
    for (c, w) in common::PAIRS {
        for policy in ["gpusched", "fgd", "binpack", "spread"] {
            let r = checked(&common::scenario(c, w, 7), Some(policy), 7);
            assert_same_as_full_pass(&format!("{c} + {w}, {policy}"), &r);
            parked += r.engine.woken_all + r.engine.woken + r.engine.parked;
            flushes += r.engine.flushes;
        }
    }
    // the runs exercised parking and the flush (else the checks above
    // would prove nothing about them)
    assert!(parked > 0, "no job was ever parked");
    assert!(flushes > 0, "no safety flush ran");
}

#[test]
fn the_default_run_is_the_same_with_and_without_the_oracle() {
    // the oracle only watches: the result is the same byte for byte
    let sc = gpusched_sim::default_scenario(42);
    let plain = gpusched_sim::run(&sc, &mut common::scheduler(), 42, &mut NoHooks);
    let checked = checked(&sc, None, 42);
    assert_same_as_full_pass("default", &checked);
    assert_eq!(
        serde_json::to_string(&plain).unwrap(),
        serde_json::to_string(&checked).unwrap()
    );
}

/// A deep queue: 64 nodes hold 8 gangs of 8 × 8 GPUs; 120 gangs wait, most
/// of them parked, while running gangs end one by one. In two queues (each
/// can reclaim from the other: capacity freed wakes every parked gang) and
/// in one (no victim: it wakes only the gangs the freed capacity holds).
#[test]
fn a_deep_queue_parks_and_decides_as_the_full_pass() {
    for queues in [&[("a", 80), ("b", 40)][..], &[("a", 120)][..]] {
        let r = deep_queue(queues);
        assert_same_as_full_pass(&format!("deep queue {queues:?}"), &r);
        assert!(r.totals.gang_starts > 20, "gangs ran: {:?}", r.totals);
        assert!(
            r.engine.woken_all + r.engine.woken > 0,
            "jobs were parked and woken: {:?}",
            r.engine
        );
        if queues.len() == 1 {
            assert!(
                r.engine.woken_by_capacity > 10,
                "one queue: capacity woke only what it can hold: {:?}",
                r.engine
            );
        }
    }
}

fn deep_queue(queues: &[(&str, u32)]) -> SimResult {
    let cluster = "nodes:\n  - name: dgx\n    count: 64\n    cpu: \"224\"\n    memory: 2Ti\n    gpus:\n      count: 8\n      model: H100-SXM5-80GB\n      memory: 80Gi\n";
    let mut w = String::from("name: deep\nqueues:\n");
    for (q, _) in queues {
        w += &format!("  - name: {q}\n");
    }
    w += "jobs:\n";
    for (q, n) in queues {
        w += &format!(
            "  - name: g{q}\n    queue: {q}\n    count: {n}\n    pods: 8\n    gang: {{}}\n    duration: 10m\n    duration_max: 20m\n    requests: {{cpu: \"16\", memory: 64Gi, nvidia.com/gpu: \"8\"}}\n"
        );
    }
    w += "settings:\n  until: 3h\n";
    let sc = gpusched_sim::scenario(
        Some(gpusched_sim::Source {
            name: "cluster.yaml",
            text: cluster,
        }),
        Some(gpusched_sim::Source {
            name: "workload.yaml",
            text: &w,
        }),
        1,
    )
    .expect("scenario");
    checked(&sc, None, 1)
}

//! Same scenario, scheduler and seed: the same result, byte for byte.

mod common;

use gpusched_sim::NoHooks;

fn json(seed: u64) -> String {
    let sc = gpusched_sim::default_scenario(seed);
    let r = gpusched_sim::run(&sc, &mut common::scheduler(), seed, &mut NoHooks);
    serde_json::to_string(&r).expect("serialise")
}

#[test]
fn default_run_is_deterministic() {
    let a = json(42);
    let b = json(42);
    assert!(a == b, "two runs with seed 42 differ");
    // the seed matters (Poisson arrivals, durations)
    assert_ne!(a, json(43));
}

#[test]
fn fixture_runs_are_deterministic() {
    // the default scenario is covered above
    for (c, w) in common::PAIRS.iter().filter(|p| p.1 != "mixed.yaml") {
        let run = || {
            let r = gpusched_sim::run(
                &common::scenario(c, w, 7),
                &mut common::scheduler(),
                7,
                &mut NoHooks,
            );
            serde_json::to_string(&r).expect("serialise")
        };
        assert!(run() == run(), "{c} + {w}: two runs differ");
    }
}

#[test]
fn result_round_trips_through_json() {
    let sc = gpusched_sim::default_scenario(1);
    let r = gpusched_sim::run(&sc, &mut common::scheduler(), 1, &mut NoHooks);
    let back: gpusched_sim::SimResult =
        serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
    assert_eq!(back, r);
}

#[test]
fn report_and_table_render_without_external_assets() {
    let sc = gpusched_sim::default_scenario(3);
    let r = gpusched_sim::run(&sc, &mut common::scheduler(), 3, &mut NoHooks);
    let html = gpusched_sim::report::render(&r, None);
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert_eq!(html.matches("<svg").count(), 5, "five charts");
    for bad in ["<script", "http://", "https://", "<link", "@import", "src="] {
        assert!(
            !html.contains(bad),
            "report must be self-contained: found {bad:?}"
        );
    }
    assert_eq!(
        html,
        gpusched_sim::report::render(&r, None),
        "deterministic"
    );
    let table = gpusched_sim::table::render(&r);
    for q in ["production", "research", "notebooks", "batch"] {
        assert!(table.contains(q), "table lists queue {q}");
    }
}

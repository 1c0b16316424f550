//! Cycle coalescing, periodic cycles, `until`, and the idle stop.

mod common;

use gpusched_sim::NoHooks;

fn scenario(workload: &str) -> gpusched_sim::Scenario {
    common::tiny_with(workload)
}

#[test]
fn simultaneous_events_share_one_cycle() {
    // 16 one-GPU jobs arrive together and finish together: one cycle to
    // place them, one after they finish.
    let sc = scenario(
        "queues: [{name: q}]\njobs:\n  - {name: j, queue: q, count: 16, duration: 1h, requests: {nvidia.com/gpu: \"1\"}}\n",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.jobs_completed, 16);
    assert_eq!(r.cycles, 2, "{r:#?}");
    assert_eq!(r.end_ms, 3_600_000);
}

#[test]
fn cycles_are_coalesced_to_the_interval() {
    // an arrival every 100 ms for 10 s, cycles at most once per second
    let sc = scenario(
        "queues: [{name: q}]\njobs:\n  - {name: j, queue: q, count: 100, every: 100ms, duration: 1h, requests: {gpusched.io/gpu-milli: \"100\"}}\n",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.jobs_completed, 100);
    assert!(r.cycles <= 2 * 11 + 2, "{} cycles", r.cycles);
}

#[test]
fn waiting_pods_get_periodic_cycles_and_an_idle_stop() {
    // 16 GPUs on one pod: no node has them; the run ticks, then stops idle
    let sc = scenario(
        "queues: [{name: q}]\njobs:\n  - {name: big, queue: q, duration: 1h, requests: {nvidia.com/gpu: \"16\"}}\nsettings: {tick: 1m, idle_stop: 30m}\n",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    assert_eq!(r.ended_by, "idle");
    assert_eq!(r.totals.jobs_unfinished, 1);
    assert!(r.cycles >= 30 && r.cycles <= 33, "{} cycles", r.cycles);
    assert!(
        r.end_ms >= 30 * 60_000 && r.end_ms <= 32 * 60_000,
        "{}",
        r.end_ms
    );
}

#[test]
fn until_stops_the_run() {
    let mut sc = gpusched_sim::default_scenario(1);
    sc.settings.until_ms = Some(30 * 60_000);
    let r = gpusched_sim::run(&sc, &mut common::scheduler(), 1, &mut NoHooks);
    assert_eq!(r.ended_by, "until");
    assert_eq!(r.end_ms, 30 * 60_000);
    assert!(r.totals.jobs_unfinished > 0);
}

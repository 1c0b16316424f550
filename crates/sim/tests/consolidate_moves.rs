//! Consolidation in the simulator: a movable pod is moved so that a bigger
//! pod fits; the move and its restart cost are counted.

mod common;

/// node-a holds `a1` (4 GPUs) and the movable `m` (2 GPUs); node-b holds
/// `b2` (6 GPUs); `p` (4 GPUs) arrives at 12 min: 4 GPUs are free in
/// total, 2 on each node.
const WORKLOAD: &str = "queues: [{name: q}]
jobs:
  - {name: a1, queue: q, duration: 3h, node_selector: {pool: a}, requests: {nvidia.com/gpu: \"4\"}}
  - {name: b1, queue: q, duration: 10m, node_selector: {pool: b}, requests: {nvidia.com/gpu: \"8\"}}
  - {name: m, queue: q, arrival: 1m, duration: 3h, requests: {nvidia.com/gpu: \"2\"}}
  - {name: b2, queue: q, arrival: 11m, duration: 3h, node_selector: {pool: b}, requests: {nvidia.com/gpu: \"6\"}}
  - {name: p, queue: q, arrival: 12m, duration: 1h, requests: {nvidia.com/gpu: \"4\"}}
";

fn scenario(movable: bool) -> gpusched_sim::Scenario {
    let mut sc = common::tiny_with(WORKLOAD);
    for j in &mut sc.jobs {
        if j.kind == "m" {
            j.template.movable = movable;
        }
    }
    sc
}

#[test]
fn a_movable_pod_is_moved_once_and_its_restart_is_counted() {
    let r = common::run_verified(scenario(true), 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.moves, 1, "{:#?}", r.totals);
    assert_eq!(
        r.totals.evictions_by_reason.get("moved to make room"),
        Some(&1)
    );
    assert_eq!(r.totals.preemptions, 0);
    // m ran from about 1 min to about 12 min before it moved
    assert!(
        (600.0..=720.0).contains(&r.totals.move_lost_pod_s),
        "{}",
        r.totals.move_lost_pod_s
    );
    assert_eq!(r.totals.jobs_completed, 5);
    // p started soon after it arrived (not after m finished at 3 h)
    assert!(r.totals.wait_p99_s < 600.0, "{}", r.totals.wait_p99_s);
}

#[test]
fn without_opt_in_nothing_moves_and_the_pod_waits() {
    let r = common::run_verified(scenario(false), 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.moves, 0);
    assert_eq!(r.totals.move_lost_pod_s, 0.0);
    assert_eq!(r.totals.jobs_completed, 5);
    assert!(r.totals.wait_p99_s > 3600.0, "{}", r.totals.wait_p99_s);
}

//! Evictions as a real cluster carries them out: a victim holds its GPUs
//! until it is gone, so the simulator refuses (as the Kubernetes executor
//! does) a bind of the same cycle onto them.

mod common;

/// Issue #22, item 5, in the simulator: a borrowing queue runs an 8-GPU
/// gang on each node of `tiny`; a guaranteed queue then asks for two
/// 8-GPU pods. Reclaiming the gang for the first evicts it whole; the
/// second pod once "fitted without evictions" onto the gang's other node
/// in the same cycle, a bind onto GPUs still held.
#[test]
fn reclaiming_a_gang_binds_nothing_onto_its_gpus_in_the_same_cycle() {
    let sc = common::tiny_with(
        "queues:
  - {name: train}
  - {name: prod, guaranteed: {gpu: \"16\"}}
jobs:
  - {name: g, queue: train, pods: 2, gang: {}, duration: 2h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
  - {name: p, queue: prod, count: 2, arrival: 10m, duration: 1h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    let t = &r.totals;
    // one reclaim decision stops the gang whole (the simulator counts the
    // member it applied; the other was stopped with it)
    assert_eq!(
        (t.reclaims, t.requeues, t.gang_restarts),
        (1, 2, 1),
        "{t:#?}"
    );
    assert_eq!(t.jobs_completed, 3, "{t:#?}");
}

/// With a termination grace period the victims hold their GPUs for it: the
/// reclaiming pods wait (nominated), bind when the gang is gone, and
/// nothing else is evicted meanwhile.
#[test]
fn victims_hold_their_gpus_for_the_termination_grace_period() {
    let sc = common::tiny_with(
        "queues:
  - {name: train}
  - {name: prod, guaranteed: {gpu: \"16\"}}
jobs:
  - {name: g, queue: train, pods: 2, gang: {}, duration: 2h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
  - {name: p, queue: prod, count: 2, arrival: 10m, duration: 1h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
settings: {termination_grace: 30s}
",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    let t = &r.totals;
    assert_eq!(
        (
            t.reclaims,
            t.evicted_pods,
            t.gangs_evicted,
            t.jobs_completed
        ),
        (1, 2, 1, 3),
        "{t:#?}"
    );
    let prod = r.queues.iter().find(|q| q.name == "prod").unwrap();
    assert_eq!(prod.wait_p50_s, 30.0, "{prod:#?}");
}

/// A queue's `min_runtime` protects its pods from reclaim until they have
/// run that long: production arrives at 10 min, train's pods started at 0
/// with a 30 min minimum, so production waits 20 min (and a cycle).
#[test]
fn a_queues_min_runtime_delays_reclaim() {
    let sc = common::tiny_with(
        "queues:
  - {name: train, min_runtime: 30m}
  - {name: prod, guaranteed: {gpu: \"16\"}}
jobs:
  - {name: t, queue: train, count: 2, duration: 2h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
  - {name: p, queue: prod, arrival: 10m, duration: 1h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
",
    );
    let r = common::run_verified(sc, 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.reclaims, 1, "{:#?}", r.totals);
    let prod = r.queues.iter().find(|q| q.name == "prod").unwrap();
    // reclaimed at 30 min, not before; bound at the next cycle (a 30 s tick)
    assert!((1200.0..=1230.0).contains(&prod.wait_p50_s), "{prod:#?}");
}

/// #39 item 9: the HTML report's "Evictions" card counted the scheduler's
/// eviction decisions (plus moves) while the terminal's "N pods evicted"
/// counted every pod stopped, a victim gang's members included: two
/// figures under one word. Both now show the pods evicted.
#[test]
fn the_html_report_and_the_terminal_count_the_same_pods_evicted() {
    let sc = common::tiny_with(
        "queues:
  - {name: train}
  - {name: prod, guaranteed: {gpu: \"16\"}}
jobs:
  - {name: g, queue: train, pods: 2, gang: {}, duration: 2h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
  - {name: p, queue: prod, count: 2, arrival: 10m, duration: 1h,
     requests: {cpu: \"8\", nvidia.com/gpu: \"8\"}}
",
    );
    let r = common::run_verified(sc, 1);
    let t = &r.totals;
    assert_eq!(t.evicted_pods, 2, "the gang's two members: {t:#?}");
    assert_ne!(t.evicted_pods, t.preemptions + t.reclaims + t.moves);
    let term = gpusched_sim::table::render(&r);
    assert!(term.contains("2 pods evicted"), "{term}");
    let html = gpusched_sim::report::render(&r, None);
    assert!(
        html.contains(r#"<div class="kv">2</div><div class="kl">pods evicted</div>"#),
        "the card shows the terminal's figure"
    );
}

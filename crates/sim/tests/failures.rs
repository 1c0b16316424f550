//! Failure → eviction → retry (with backoff) → completion, or failure
//! after the retry limit; a failed gang member restarts the whole gang.

mod common;

#[test]
fn retry_then_complete_and_retry_limit() {
    let r = common::run_verified(common::scenario("tiny.yaml", "retry-limit.yaml", 1), 1);
    common::assert_clean(&r);
    let t = &r.totals;
    // `pinned` fails at 10m, 20m and 30m: two retries, then the limit (2).
    assert_eq!(t.retry_limit_failures, 1, "{t:#?}");
    assert_eq!(t.jobs_failed, 1, "{t:#?}");
    // `whole-node` loses a GPU at 5m, waits for it, and completes.
    assert_eq!(t.jobs_completed, 1, "{t:#?}");
    assert!(t.retries >= 3, "{t:#?}");
    assert_eq!(t.failure_kills, 4, "{t:#?}");
    assert_eq!(t.pods_failed, 1);
    assert_eq!(r.ended_by, "done");
}

#[test]
fn gang_member_failure_restarts_the_gang() {
    let r = common::run_verified(common::scenario("dgx-h100.yaml", "gang-failure.yaml", 1), 1);
    common::assert_clean(&r);
    let t = &r.totals;
    assert!(t.gang_restarts >= 1, "{t:#?}");
    // both members were stopped when dgx-0 failed, and both retried
    assert!(t.failure_kills >= 2, "{t:#?}");
    assert!(t.gang_starts >= 2, "started, then restarted: {t:#?}");
    assert_eq!(t.jobs_completed, t.jobs, "{t:#?}");
    let failure = r
        .incidents
        .iter()
        .find(|i| i.what == "node failure")
        .expect("incident");
    assert!(failure.pods_stopped >= 2, "{failure:?}");
}

#[test]
fn drain_evicts_and_requeues() {
    let r = common::run_verified(common::scenario("pcie-l40s.yaml", "notebooks.yaml", 1), 1);
    common::assert_clean(&r);
    let drain = r
        .incidents
        .iter()
        .find(|i| i.what == "drain")
        .expect("drain incident");
    assert!(
        drain.pods_stopped > 0,
        "the drained node ran pods: {drain:?}"
    );
    assert!(r.totals.requeues >= drain.pods_stopped as u64);
    assert_eq!(r.totals.jobs_completed, r.totals.jobs, "{:#?}", r.totals);
}

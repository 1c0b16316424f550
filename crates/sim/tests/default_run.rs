//! The embedded default scenario shows every feature at work.

mod common;

#[test]
fn default_run_exercises_every_feature() {
    let seed = 42;
    let r = common::run_verified(gpusched_sim::default_scenario(seed), seed);
    common::assert_clean(&r);
    let t = &r.totals;
    assert_eq!(r.ended_by, "done", "{t:#?}");
    assert!(t.preemptions > 0, "preemption: {t:#?}");
    assert!(t.reclaims > 0, "reclaim: {t:#?}");
    assert!(t.backfilled > 0, "backfill: {t:#?}");
    assert!(t.gang_starts >= 5, "gangs: {t:#?}");
    assert!(t.gang_restarts > 0, "gang restart after failure: {t:#?}");
    assert!(
        t.failure_kills > 0 && t.retries > 0,
        "failures and retries: {t:#?}"
    );
    assert!(t.requeues > 0, "drain/preemption requeues: {t:#?}");
    assert!(
        t.jobs_completed * 10 >= t.jobs * 9,
        "at least 90% of jobs complete: {t:#?}"
    );
    assert!(t.alloc_mean_pct > 40.0, "{t:#?}");
    // every queue got GPUs
    for q in &r.queues {
        assert!(q.avg_gpus > 0.0, "queue {} never ran: {q:#?}", q.name);
    }
}

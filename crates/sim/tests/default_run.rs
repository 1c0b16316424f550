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

/// The default run leaves a quarter or more of the GPUs idle while pods
/// wait; the result (and the HTML report) says why, with the scheduler's
/// own reason names, and names the job whose gang timed out.
#[test]
fn the_report_explains_idle_gpus_and_names_failed_jobs() {
    let seed = 42;
    let r = common::run_verified(gpusched_sim::default_scenario(seed), seed);
    let i = &r.idle;
    assert!(i.gpu_hours > 0.0 && i.capacity_pct > 10.0, "{i:#?}");
    // the shares add up, most pod-hours first
    let total: f64 = i.by_reason.iter().map(|x| x.share_pct).sum();
    assert!((total - 100.0).abs() < 0.1, "{i:#?}");
    assert!(
        i.by_reason
            .windows(2)
            .all(|w| w[0].pod_hours >= w[1].pod_hours),
        "{i:#?}"
    );
    // the default workload's gangs wait on topology and capacity that is
    // being freed (reserved) while smaller gaps stay idle
    let names: Vec<&str> = i.by_reason.iter().map(|x| x.reason.as_str()).collect();
    for r in ["NoTopologyDomain", "InsufficientGpus", "WaitingForNode"] {
        assert!(names.contains(&r), "{r} missing: {names:?}");
    }
    // every failed job is named with why
    assert_eq!(r.failed_jobs.len() as u64, r.totals.jobs_failed);
    assert!(
        r.failed_jobs
            .iter()
            .any(|j| j.why == "gang timed out" && j.queue == "research"),
        "{:?}",
        r.failed_jobs
    );
    let html = gpusched_sim::report::render(&r, None);
    assert!(html.contains("Why GPUs sat idle while pods waited"));
    assert!(html.contains("NoTopologyDomain") && html.contains("topology: no single"));
    assert!(html.contains("<h2>Failed jobs</h2>"));
    assert!(html.contains(&r.failed_jobs[0].job));
    assert!(html.contains("packing policy"));
    // gang starts and reservations are marked on the timeline
    assert_eq!(r.marks.gang_starts_ms.len() as u64, r.totals.gang_starts);
    assert!(!r.marks.reservations_ms.is_empty());
    assert!(html.contains("<title>gang started at "));
    assert!(html.contains("<title>node reserved at "));
}

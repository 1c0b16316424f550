//! The terminal summary of a run.

use crate::metrics::SimResult;
use crate::workload::fmt_duration;
use std::fmt::Write;

/// Seconds for people (`0s`, `42s`, `1h05m`).
pub fn secs(s: f64) -> String {
    if s <= 0.0 {
        return "0s".into();
    }
    fmt_duration((s * 1000.0).round().max(0.0) as u64)
}

/// Aligns rows of cells; the first row is the header. Columns after the
/// first are right-aligned.
pub fn align(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut w = vec![0usize; cols];
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for (ri, r) in rows.iter().enumerate() {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            let pad = w[i] - c.chars().count();
            if i == 0 {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            } else {
                line.push_str("  ");
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
        if ri == 0 {
            let total: usize = w.iter().sum::<usize>() + 2 * cols.saturating_sub(1);
            out.push_str(&"─".repeat(total));
            out.push('\n');
        }
    }
    out
}

/// The summary table printed after a run.
pub fn render(r: &SimResult) -> String {
    let t = &r.totals;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "gpusched simulate — {} · seed {} · scheduler {}",
        r.scenario, r.seed, r.scheduler
    );
    let _ = writeln!(
        s,
        "{} nodes · {} GPUs · {} virtual · {} cycles · ended: {}\n",
        r.nodes,
        r.gpus,
        fmt_duration(r.end_ms),
        r.cycles,
        r.ended_by
    );
    let kv = |k: &str, v: String| format!("  {k:<12}{v}\n");
    s += &kv(
        "jobs",
        format!(
            "{} total · {} completed · {} failed · {} unfinished",
            t.jobs, t.jobs_completed, t.jobs_failed, t.jobs_unfinished
        ),
    );
    s += &kv(
        "pods",
        format!(
            "{} total · {} succeeded · {} failed · {} binds",
            t.pods, t.pods_succeeded, t.pods_failed, t.binds
        ),
    );
    s += &kv(
        "GPUs",
        format!(
            "allocation mean {:.1}% · peak {:.1}% · fragmentation mean {:.1}%",
            t.alloc_mean_pct, t.alloc_peak_pct, t.frag_mean_pct
        ),
    );
    s += &kv(
        "queue wait",
        format!(
            "p50 {} · p95 {} · p99 {}",
            secs(t.wait_p50_s),
            secs(t.wait_p95_s),
            secs(t.wait_p99_s)
        ),
    );
    s += &kv(
        "completion",
        format!("p50 {} · mean {}", secs(t.jct_p50_s), secs(t.jct_mean_s)),
    );
    s += &kv(
        "preemption",
        format!(
            "{} preempted · {} reclaimed · {} moved ({:.0} pod-s lost) · {} requeued · {} nominations",
            t.preemptions, t.reclaims, t.moves, t.move_lost_pod_s, t.requeues, t.nominations
        ),
    );
    s += &kv(
        "churn",
        format!(
            "{} pods evicted ({} had run < 1m, {} < 10m) · {} gangs evicted",
            t.evicted_pods, t.evicted_within_1m, t.evicted_within_10m, t.gangs_evicted
        ),
    );
    s += &kv(
        "gangs",
        format!(
            "{} started · {} started partially · {} restarted · {} timed out",
            t.gang_starts, t.gangs_started_partially, t.gang_restarts, t.groups_timed_out
        ),
    );
    s += &kv(
        "failures",
        format!(
            "{} pods stopped · {} retries · {} over the retry limit",
            t.failure_kills, t.retries, t.retry_limit_failures
        ),
    );
    s += &kv("backfill", format!("{} pods backfilled", t.backfilled));
    s += &kv(
        "fairness",
        format!(
            "{:.1}% of capacity away from fair share",
            t.fairness_gap_pct
        ),
    );
    s += &kv(
        "sim errors",
        if t.sim_errors == 0 {
            "0".into()
        } else {
            format!(
                "{} (first: {})",
                t.sim_errors,
                r.errors.first().cloned().unwrap_or_default()
            )
        },
    );
    s.push('\n');
    let mut rows = vec![
        [
            "queue",
            "weight",
            "guar.",
            "jobs",
            "done",
            "wait p50",
            "p95",
            "p99",
            "JCT p50",
            "GPUs avg",
            "fair",
            "entitled",
            "ratio",
            "preempted",
        ]
        .iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>(),
    ];
    for q in &r.queues {
        rows.push(vec![
            q.name.clone(),
            q.weight.to_string(),
            format!("{}", q.guarantee_gpus),
            q.jobs.to_string(),
            q.jobs_completed.to_string(),
            secs(q.wait_p50_s),
            secs(q.wait_p95_s),
            secs(q.wait_p99_s),
            secs(q.jct_p50_s),
            format!("{:.1}", q.avg_gpus),
            format!("{:.1}", q.fair_gpus),
            format!("{:.1}", q.entitled_gpus),
            format!("{:.2}", q.fairness_ratio),
            q.preempted.to_string(),
        ]);
    }
    for line in align(&rows).lines() {
        s.push_str("  ");
        s.push_str(line);
        s.push('\n');
    }
    if !r.incidents.is_empty() {
        s.push_str("\n  incidents\n");
        for i in &r.incidents {
            let _ = writeln!(
                s,
                "    {:>8}  {:<16} {:<10} {} pods stopped",
                fmt_duration(i.t_ms),
                i.what,
                i.node,
                i.pods_stopped
            );
        }
    }
    s
}

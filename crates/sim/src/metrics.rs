//! What a run measured. Everything here is a pure function of the scenario,
//! the scheduler and the seed: no wall-clock time (the CLI measures that
//! and reports it beside this, never inside).

use gpusched_core::fairshare::QueueTree;
use gpusched_model::{GPU_MILLI, Queue, ResourceVec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The result of one run. Serialises to the `--json` output.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SimResult {
    /// Name of the scenario.
    pub scenario: String,
    /// Seed of the run.
    pub seed: u64,
    /// The packer's name.
    pub scheduler: String,
    /// Nodes in the cluster.
    pub nodes: u32,
    /// GPUs in the cluster.
    pub gpus: u32,
    /// Virtual time the run ended (ms).
    pub end_ms: u64,
    /// Scheduling cycles run.
    pub cycles: u64,
    /// Why the run ended: `done` (nothing left), `until` (time limit),
    /// `idle` (pods left that nothing will change).
    pub ended_by: String,
    /// Counters and percentiles of the whole run.
    pub totals: Totals,
    /// Per-queue figures.
    pub queues: Vec<QueueReport>,
    /// Allocation, fragmentation and pods over time.
    pub series: Series,
    /// Per-node GPU occupancy over time.
    pub heatmap: Heatmap,
    /// Queue wait CDF per queue.
    pub wait_cdf: Vec<Cdf>,
    /// Node and GPU events as they happened.
    pub incidents: Vec<Incident>,
    /// Jobs that failed, in job order (at most 100).
    #[serde(default)]
    pub failed_jobs: Vec<FailedJob>,
    /// Capacity that sat idle while GPU pods waited, and why they waited.
    #[serde(default)]
    pub idle: IdleWhilePending,
    /// Gang starts and reservations, for the timeline.
    #[serde(default)]
    pub marks: Marks,
    /// The first simulator errors (refused decisions, conservation
    /// violations); `totals.sim_errors` counts all.
    pub errors: Vec<String>,
    /// The incremental core's own counters: changes, cycles, parked and
    /// woken jobs, safety flushes and the missed hints they found.
    #[serde(default)]
    pub engine: gpusched_core::engine::EngineStats,
}

/// Whole-run counters and summaries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Totals {
    /// Job instances that arrived.
    pub jobs: u64,
    /// Jobs whose pods all succeeded.
    pub jobs_completed: u64,
    /// Jobs failed (retries exhausted or gang timed out).
    pub jobs_failed: u64,
    /// Jobs still pending or running at the end.
    pub jobs_unfinished: u64,
    /// Pods that arrived.
    pub pods: u64,
    /// Pods that ran to completion.
    pub pods_succeeded: u64,
    /// Pods failed for good.
    pub pods_failed: u64,
    /// Bindings made (a retried pod counts again).
    pub binds: u64,
    /// Pods evicted by the scheduler for a higher-priority job of the same
    /// queue (`Decision::Evict` with `EvictionKind::Preempt`).
    pub preemptions: u64,
    /// Pods evicted by the scheduler to restore another queue's deserved
    /// share (`EvictionKind::Reclaim`).
    pub reclaims: u64,
    /// Evictions by the scheduler, by kind (`EvictionKind::label`).
    pub evictions_by_reason: BTreeMap<String, u64>,
    /// Pods moved by consolidation (`EvictionKind::Consolidate`): each is
    /// stopped and put back with its planned node nominated.
    #[serde(default)]
    pub moves: u64,
    /// The restart cost of those moves: run time the moved pods had
    /// accumulated and lost (pod-seconds; a moved pod runs its whole
    /// duration again).
    #[serde(default)]
    pub move_lost_pod_s: f64,
    /// Pods put back in the queue at once (preempted, drained, or restarted
    /// with their gang after a preemption).
    pub requeues: u64,
    /// Churn: pods stopped by a preemption or a reclaim, a victim gang's
    /// every running member included.
    #[serde(default)]
    pub evicted_pods: u64,
    /// Of those, pods that had run less than a minute.
    #[serde(default)]
    pub evicted_within_1m: u64,
    /// Of those, pods that had run less than ten minutes.
    #[serde(default)]
    pub evicted_within_10m: u64,
    /// Gangs stopped by a preemption or a reclaim.
    #[serde(default)]
    pub gangs_evicted: u64,
    /// Pods put back after a failure, with backoff.
    pub retries: u64,
    /// Pods stopped by a node or GPU failure (directly or via their gang).
    pub failure_kills: u64,
    /// Pods (or gangs' pods) failed after exceeding the retry limit.
    pub retry_limit_failures: u64,
    /// Gangs started (all of min_member placed).
    pub gang_starts: u64,
    /// Gangs whose first binds of an attempt were fewer than `minMember`
    /// (must be 0).
    pub gangs_started_partially: u64,
    /// Gangs stopped as a whole because one member was evicted or failed.
    pub gang_restarts: u64,
    /// Gangs that reached their schedule timeout.
    pub groups_timed_out: u64,
    /// Nominations that set or changed a pod's nominated node.
    pub nominations: u64,
    /// Sum of the core's `CycleStats::backfilled`.
    pub backfilled: u64,
    /// Decisions the simulator refused (should be 0).
    pub sim_errors: u64,
    /// Time-weighted GPU allocation (used / schedulable capacity), percent.
    pub alloc_mean_pct: f64,
    /// Highest GPU allocation, % of capacity.
    pub alloc_peak_pct: f64,
    /// Time-weighted fragmentation (fragmented milli / capacity), percent.
    pub frag_mean_pct: f64,
    /// Queue wait, median, seconds.
    pub wait_p50_s: f64,
    /// Queue wait, 95th percentile, seconds.
    pub wait_p95_s: f64,
    /// Queue wait, 99th percentile, seconds.
    pub wait_p99_s: f64,
    /// Job completion time, median, seconds.
    pub jct_p50_s: f64,
    /// Job completion time, mean, seconds.
    pub jct_mean_s: f64,
    /// Time-weighted Σ|used − fair| / (2 · capacity), percent: the share of
    /// the cluster held against the demand-aware fair share.
    pub fairness_gap_pct: f64,
}

/// Per-queue results.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QueueReport {
    /// Queue name.
    pub name: String,
    /// Weight among siblings.
    pub weight: u32,
    /// Guaranteed GPUs.
    pub guarantee_gpus: f64,
    /// Job instances that arrived.
    pub jobs: u64,
    /// Jobs whose pods all succeeded.
    pub jobs_completed: u64,
    /// Pods that arrived.
    pub pods: u64,
    /// Pods that started at least once.
    pub pods_started: u64,
    /// Queue wait, median, seconds.
    pub wait_p50_s: f64,
    /// Queue wait, 95th percentile, seconds.
    pub wait_p95_s: f64,
    /// Queue wait, 99th percentile, seconds.
    pub wait_p99_s: f64,
    /// Job completion time, median, seconds.
    pub jct_p50_s: f64,
    /// Job completion time, 95th percentile, seconds.
    pub jct_p95_s: f64,
    /// Job completion time, mean, seconds.
    pub jct_mean_s: f64,
    /// Time-averaged GPUs held.
    pub avg_gpus: f64,
    /// Time-averaged demand-aware fair share (guarantees first, then
    /// weights, capped by demand), in GPUs.
    pub fair_gpus: f64,
    /// Static entitlement (guarantee + weighted share, demand ignored).
    pub entitled_gpus: f64,
    /// `avg_gpus / fair_gpus` (1 = exactly fair; 0 when fair is 0).
    pub fairness_ratio: f64,
    /// Pods of this queue preempted or reclaimed.
    pub preempted: u64,
}

/// Time series in equal buckets (time-weighted averages).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Series {
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Bucket start times.
    pub t_ms: Vec<u64>,
    /// GPU allocation, % of capacity.
    pub alloc_pct: Vec<f64>,
    /// Fragmented GPUs, % of capacity.
    pub frag_pct: Vec<f64>,
    /// GPUs in use.
    pub used_gpus: Vec<f64>,
    /// Usable GPUs (healthy, on nodes up and schedulable).
    pub capacity_gpus: Vec<f64>,
    /// Pods waiting.
    pub pending_pods: Vec<f64>,
    /// Pods running.
    pub running_pods: Vec<f64>,
}

/// Per-node GPU occupancy over time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heatmap {
    /// Bucket width, ms.
    pub bucket_ms: u64,
    /// Node names, rows of `cells`.
    pub nodes: Vec<String>,
    /// GPUs per node.
    pub node_gpus: Vec<u32>,
    /// `cells[node][bucket]`: used fraction of the node's GPUs (0–1), or
    /// −1 when the node was down or cordoned for most of the bucket.
    pub cells: Vec<Vec<f64>>,
}

/// Empirical CDF of queue wait: `(seconds, fraction ≤)`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cdf {
    /// Queue name.
    pub queue: String,
    /// `(seconds, fraction of pods that waited at most that long)`.
    pub points: Vec<(f64, f64)>,
}

/// A cluster event as it happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Incident {
    /// Virtual time, ms.
    pub t_ms: u64,
    /// What happened (`node-failure`, `drain`, …).
    pub what: String,
    /// The node.
    pub node: String,
    /// Pods stopped by it.
    pub pods_stopped: u32,
}

/// Moments marked on the report's timeline (at most 2,000 of each).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marks {
    /// When a gang started (all of `minMember` bound in one cycle), ms.
    pub gang_starts_ms: Vec<u64>,
    /// When a pending pod got a node reserved (nominated: preemption
    /// victims leaving, or a node held for an older job), ms.
    pub reservations_ms: Vec<u64>,
}

/// A job that failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FailedJob {
    /// The job (instance) name: its pods are `JOB-pN`.
    pub job: String,
    /// Its queue.
    pub queue: String,
    /// When it failed (ms).
    pub at_ms: u64,
    /// `gang timed out` or `retry limit reached`.
    pub why: String,
}

/// GPUs idle while GPU pods were pending: how much, and why the pods could
/// not use them (the reason names of `gpusched_core::report::classify`, the
/// scheduler's Queue status; classified at most once a virtual minute).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleWhilePending {
    /// ∫ idle GPUs dt while at least one GPU pod was pending, GPU-hours
    /// (idle: free on schedulable nodes, shares counted in milli).
    pub gpu_hours: f64,
    /// The same as a share of the schedulable capacity-time, %.
    pub capacity_pct: f64,
    /// Pending GPU pods while at least one whole GPU sat idle, by the
    /// reason they waited, most pod-hours first.
    pub by_reason: Vec<IdleReason>,
}

/// One reason pods waited while GPUs sat idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IdleReason {
    /// The reason name (`GangShort`, `QueueQuota`, `InsufficientGpus`, …).
    pub reason: String,
    /// ∫ pods waiting for it dt, pod-hours.
    pub pod_hours: f64,
    /// Its share of all such pod-hours, %.
    pub share_pct: f64,
}

/// Rounds for stable, readable JSON.
pub fn r4(x: f64) -> f64 {
    if x.is_finite() {
        (x * 10_000.0).round() / 10_000.0
    } else {
        0.0
    }
}

/// Nearest-rank percentile of sorted values (ms → s).
pub fn pct_s(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil().max(1.0) as usize;
    r4(sorted[rank.min(sorted.len()) - 1] as f64 / 1000.0)
}

/// Mean of millisecond values, in seconds (0 for none).
pub fn mean_s(v: &[u64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    r4(v.iter().sum::<u64>() as f64 / v.len() as f64 / 1000.0)
}

/// Time-weighted bucket averages of a step function `(t, value)` over
/// `[0, end)`. Values hold from their time until the next step.
pub fn bucketize(steps: &[(u64, f64)], end: u64, n: usize) -> (u64, Vec<f64>) {
    let n = n.max(1);
    let w = end.div_ceil(n as u64).max(1);
    (w, bucketize_w(steps, end, w))
}

/// A round bucket width (1 s … 1 d) giving at most `max_n` buckets.
pub fn nice_bucket(end: u64, max_n: u64) -> u64 {
    const W: [u64; 16] = [
        1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000, 900_000, 1_800_000,
        3_600_000, 7_200_000, 10_800_000, 21_600_000, 43_200_000, 86_400_000,
    ];
    let max_n = max_n.max(1);
    W.iter()
        .copied()
        .find(|w| end.div_ceil(*w) <= max_n)
        .unwrap_or_else(|| end.div_ceil(max_n).max(1))
}

/// Like [`bucketize`] with a given bucket width `w` (the last bucket may
/// be partial; its average is over its covered part).
pub fn bucketize_w(steps: &[(u64, f64)], end: u64, w: u64) -> Vec<f64> {
    let w = w.max(1);
    let n = end.div_ceil(w).max(1) as usize;
    let mut out = vec![0.0; n];
    for (i, &(t, v)) in steps.iter().enumerate() {
        let t1 = steps.get(i + 1).map(|s| s.0).unwrap_or(end).min(end);
        let mut a = t.min(end);
        while a < t1 {
            let b = ((a / w + 1) * w).min(t1);
            let k = (a / w) as usize;
            if k < n {
                out[k] += v * (b - a) as f64;
            }
            a = b;
        }
    }
    for (k, o) in out.iter_mut().enumerate() {
        let lo = k as u64 * w;
        let hi = ((k as u64 + 1) * w).min(end);
        let span = hi.saturating_sub(lo);
        *o = if span > 0 { r4(*o / span as f64) } else { 0.0 };
    }
    out
}

/// GPU guarantee of a queue in milli (plain + per-model; the core's rule,
/// [`gpusched_core::fairshare::gpu_guarantee`]).
pub fn guarantee_milli(q: &Queue) -> u64 {
    gpusched_core::fairshare::gpu_guarantee(q)
}

/// Demand-aware fair share of GPU milli of each queue's own pods, as the
/// scheduler computes it ([`gpusched_core::fairshare::QueueTree`]: at each
/// level guarantees first, capped by demand, then the rest by weight,
/// water-filling). `demand[i]` is the demand of queue `i`'s own pods;
/// `None` means unbounded (gives the static entitlement). A parent's own
/// pods get what its children leave of its deserved share.
pub fn fair_shares(queues: &[Queue], demand: &[Option<u64>], capacity: u64) -> Vec<u64> {
    let (mut tree, _) = QueueTree::build(queues);
    let idx: Vec<Option<usize>> = queues.iter().map(|q| tree.idx(&q.name)).collect();
    for (i, d) in demand.iter().enumerate() {
        if let Some(Some(t)) = idx.get(i) {
            // nobody deserves more than the capacity: it stands for "unbounded"
            let d = d.unwrap_or(capacity).min(capacity);
            tree.add_pending(*t, &ResourceVec::new(0, 0, d));
        }
    }
    tree.compute_deserved(&ResourceVec::new(0, 0, capacity));
    let own = |t: usize| {
        let kids: u64 = tree.children[t]
            .iter()
            .map(|&c| tree.acct[c].deserved.gpu_milli)
            .sum();
        tree.acct[t].deserved.gpu_milli.saturating_sub(kids)
    };
    idx.iter().map(|t| t.map(own).unwrap_or(0)).collect()
}

/// Milli-GPU as GPUs.
pub fn gpus(milli: f64) -> f64 {
    r4(milli / GPU_MILLI as f64)
}

/// Wall-clock timing of a run, measured by the caller through
/// [`crate::Hooks`]. Never part of [`SimResult`]: it differs run to run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WallTiming {
    /// Whole run, seconds.
    pub total_s: f64,
    /// Cycles timed.
    pub cycles: u64,
    /// Mean cycle, ms.
    pub cycle_mean_ms: f64,
    /// Median cycle, ms.
    pub cycle_p50_ms: f64,
    /// 99th percentile cycle, ms.
    pub cycle_p99_ms: f64,
    /// Slowest cycle, ms.
    pub cycle_max_ms: f64,
}

impl WallTiming {
    /// From the run's total and every cycle's duration (ns; sorted here).
    pub fn from_cycle_ns(total_s: f64, ns: &mut [u64]) -> Self {
        ns.sort_unstable();
        let ms = |x: u64| r4(x as f64 / 1e6);
        let pick = |p: f64| {
            if ns.is_empty() {
                0.0
            } else {
                let rank = ((p / 100.0) * ns.len() as f64).ceil().max(1.0) as usize;
                ms(ns[rank.min(ns.len()) - 1])
            }
        };
        WallTiming {
            total_s: r4(total_s),
            cycles: ns.len() as u64,
            cycle_mean_ms: if ns.is_empty() {
                0.0
            } else {
                r4(ns.iter().sum::<u64>() as f64 / ns.len() as f64 / 1e6)
            },
            cycle_p50_ms: pick(50.0),
            cycle_p99_ms: pick(99.0),
            cycle_max_ms: ns.last().map(|x| ms(*x)).unwrap_or(0.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_averages() {
        let (w, v) = bucketize(&[(0, 1.0), (50, 3.0)], 100, 2);
        assert_eq!(w, 50);
        assert_eq!(v, vec![1.0, 3.0]);
        let (_, v) = bucketize(&[(0, 0.0), (25, 4.0)], 100, 1);
        assert_eq!(v, vec![3.0]);
    }

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).map(|x| x * 1000).collect();
        assert_eq!(pct_s(&v, 50.0), 50.0);
        assert_eq!(pct_s(&v, 99.0), 99.0);
        assert_eq!(pct_s(&[], 50.0), 0.0);
    }

    #[test]
    fn fair_share_is_the_schedulers() {
        // per-model guarantees add to the plain one (the core's rule)
        let mut a = Queue::new("a");
        a.guarantee.gpu_milli = 2000;
        a.gpu_guarantee_by_model.insert("H100".into(), 4000);
        let b = Queue::new("b");
        let qs = vec![a, b];
        assert_eq!(guarantee_milli(&qs[0]), 6000);
        assert_eq!(
            fair_shares(&qs, &[None, None], 10_000),
            vec![8000, 2000],
            "6 guaranteed, the other 4 split 1:1"
        );
        // a parent's own pods get what its children leave (the core splits
        // a parent's share among its children only)
        let mut org = Queue::new("org");
        org.weight = 3;
        let mut team = Queue::new("team");
        team.parent = Some("org".into());
        let qs = vec![org, team, Queue::new("other")];
        let f = fair_shares(&qs, &[Some(2000), Some(100_000), Some(100_000)], 12_000);
        // org's subtree deserves 9000 (3:1 against other), all of it to team
        assert_eq!(f, vec![0, 9000, 3000]);
        let f = fair_shares(&qs, &[Some(2000), Some(5000), Some(100_000)], 12_000);
        // org's subtree wants 7000 and gets it; team takes 5000, org's own 2000
        assert_eq!(f, vec![2000, 5000, 5000]);
    }

    #[test]
    fn fair_share_guarantees_then_weights() {
        let mut a = Queue::new("a");
        a.weight = 2;
        let mut b = Queue::new("b");
        b.guarantee.gpu_milli = 4000;
        let c = Queue::new("c");
        let qs = vec![a, b, c];
        // unbounded: b gets 4 + (12-4)/4*1 = 6, a 4, c 2
        assert_eq!(
            fair_shares(&qs, &[None, None, None], 12_000),
            vec![4000, 6000, 2000]
        );
        // c wants nothing; b wants 5
        assert_eq!(
            fair_shares(&qs, &[Some(100_000), Some(5000), Some(0)], 12_000),
            vec![7000, 5000, 0]
        );
    }
}

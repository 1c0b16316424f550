//! What a replay reports: samples of the cluster over time (allocation,
//! fragmentation) and the per-queue figures of the [`ReplayOutput`].

use super::*;

/// Cluster totals at one moment.
pub(super) struct Sample {
    t: u64,
    used: u64,
    capacity: u64,
    frag: u64,
    pending: u32,
    running: u32,
    per_node: Vec<f64>,
    /// Milli-GPU held by each queue's pods.
    queue_used: BTreeMap<String, u64>,
    /// Each queue's demand-aware fair share now (milli-GPU).
    queue_fair: BTreeMap<String, u64>,
}

pub(super) fn sample(
    t: u64,
    snap: &Snapshot,
    engine: &gpusched_plugins::packing::fgd::FragEngine,
) -> Sample {
    let (cs, _) = ClusterState::from_snapshot(snap);
    let (capacity, used) = cs.gpu_milli_totals();
    let per_node = cs
        .states()
        .iter()
        .map(|st| {
            let usable = st.gpu_usable.iter().filter(|u| **u).count() as f64;
            if usable == 0.0 {
                -1.0
            } else {
                let free: u64 = st.gpu_free_milli.iter().map(|m| *m as u64).sum();
                1.0 - free as f64 / (usable * 1000.0)
            }
        })
        .collect();
    let mut queue_used: BTreeMap<String, u64> = BTreeMap::new();
    for p in &snap.pods {
        if let Some((_, g)) = p.holding() {
            *queue_used.entry(p.pod.queue.clone()).or_default() += g.milli();
        }
    }
    // the fair share the core computes from the same snapshot
    let (mut tree, _) = gpusched_core::fairshare::QueueTree::build(&snap.queues);
    tree.account(snap);
    let mut schedulable = gpusched_model::ResourceVec::default();
    for n in snap.nodes.iter().filter(|n| !n.unschedulable) {
        schedulable.add(&n.allocatable);
    }
    tree.compute_deserved(&schedulable);
    let queue_fair = snap
        .queues
        .iter()
        .filter_map(|q| {
            Some((
                q.name.clone(),
                tree.acct[tree.idx(&q.name)?].deserved.gpu_milli,
            ))
        })
        .collect();
    Sample {
        t,
        used,
        capacity,
        queue_used,
        queue_fair,
        frag: fragmentation_milli(&cs, engine),
        pending: snap.pods.iter().filter(|p| p.is_pending()).count() as u32,
        running: snap
            .pods
            .iter()
            .filter(|p| matches!(p.phase, PodPhase::Running { .. }))
            .count() as u32,
        per_node,
    }
}

/// Drops the pods whose `keep` is false (and their per-pod entries).
pub(super) fn retain(
    snap: &mut Snapshot,
    ends: &mut Vec<Option<u64>>,
    durations: &mut Vec<Option<u64>>,
    keep: &[bool],
) {
    let mut k = keep.iter();
    snap.pods.retain(|_| *k.next().unwrap_or(&true));
    let mut k = keep.iter();
    ends.retain(|_| *k.next().unwrap_or(&true));
    let mut k = keep.iter();
    durations.retain(|_| *k.next().unwrap_or(&true));
}

/// What a replay counted per queue.
pub(super) struct PerQueue<'a> {
    pub(super) waits: &'a BTreeMap<String, Vec<u64>>,
    pub(super) started: &'a BTreeMap<String, u64>,
    pub(super) completed: &'a BTreeMap<String, u64>,
    pub(super) preempted: &'a BTreeMap<String, u64>,
}

#[allow(clippy::too_many_arguments)]
pub(super) fn result(
    input: &ReplayInput,
    scheduler: &Scheduler,
    samples: &[Sample],
    end: u64,
    cycles: u64,
    ended_by: &str,
    mut t: Totals,
    q: &PerQueue<'_>,
) -> SimResult {
    let (waits, started) = (q.waits, q.started);
    let snap = &input.snapshot;
    let pct = |a: u64, b: u64| {
        if b == 0 {
            0.0
        } else {
            100.0 * a as f64 / b as f64
        }
    };
    let steps = |f: &dyn Fn(&Sample) -> f64| -> Vec<(u64, f64)> {
        samples.iter().map(|s| (s.t, f(s))).collect()
    };
    let w = metrics::nice_bucket(end, 150);
    let b = |f: &dyn Fn(&Sample) -> f64| metrics::bucketize_w(&steps(f), end, w);
    let alloc = b(&|s| pct(s.used, s.capacity));
    let frag = b(&|s| pct(s.frag, s.capacity));
    let n = alloc.len().max(1) as f64;
    t.alloc_mean_pct = metrics::r4(alloc.iter().sum::<f64>() / n);
    t.alloc_peak_pct = metrics::r4(
        samples
            .iter()
            .map(|s| pct(s.used, s.capacity))
            .fold(0.0, f64::max),
    );
    t.frag_mean_pct = metrics::r4(frag.iter().sum::<f64>() / n);
    let mut all: Vec<u64> = waits.values().flatten().copied().collect();
    all.sort_unstable();
    t.wait_p50_s = metrics::pct_s(&all, 50.0);
    t.wait_p95_s = metrics::pct_s(&all, 95.0);
    t.wait_p99_s = metrics::pct_s(&all, 99.0);
    t.jobs_unfinished = t.jobs - t.jobs_completed;
    let series = Series {
        bucket_ms: w,
        t_ms: (0..alloc.len() as u64).map(|k| k * w).collect(),
        alloc_pct: alloc,
        frag_pct: frag,
        used_gpus: b(&|s| s.used as f64 / 1000.0),
        capacity_gpus: b(&|s| s.capacity as f64 / 1000.0),
        pending_pods: b(&|s| s.pending as f64),
        running_pods: b(&|s| s.running as f64),
    };
    let heatmap = Heatmap {
        bucket_ms: w,
        nodes: snap.nodes.iter().map(|n| n.name.clone()).collect(),
        node_gpus: snap.nodes.iter().map(|n| n.gpus.len() as u32).collect(),
        cells: (0..snap.nodes.len())
            .map(|k| b(&|s| s.per_node.get(k).copied().unwrap_or(0.0)))
            .collect(),
    };
    let (done_by_queue, preempted_by_queue) = (q.completed, q.preempted);
    let mut per_queue: BTreeMap<&str, u64> = BTreeMap::new();
    for p in &snap.pods {
        *per_queue.entry(p.pod.queue.as_str()).or_default() += 1;
    }
    let queues = snap
        .queues
        .iter()
        .map(|q| {
            let mut w8 = waits.get(&q.name).cloned().unwrap_or_default();
            w8.sort_unstable();
            // time-weighted, like the cluster's allocation
            let mean = |f: &dyn Fn(&Sample) -> f64| {
                let v = b(f);
                metrics::r4(v.iter().sum::<f64>() / v.len().max(1) as f64)
            };
            let avg_gpus =
                mean(&|s| s.queue_used.get(&q.name).copied().unwrap_or(0) as f64 / 1000.0);
            let fair_gpus =
                mean(&|s| s.queue_fair.get(&q.name).copied().unwrap_or(0) as f64 / 1000.0);
            QueueReport {
                name: q.name.clone(),
                weight: q.weight,
                guarantee_gpus: metrics::guarantee_milli(q) as f64 / 1000.0,
                jobs: per_queue.get(q.name.as_str()).copied().unwrap_or(0),
                jobs_completed: done_by_queue.get(&q.name).copied().unwrap_or(0),
                pods: per_queue.get(q.name.as_str()).copied().unwrap_or(0),
                pods_started: started.get(&q.name).copied().unwrap_or(0),
                avg_gpus,
                fair_gpus,
                fairness_ratio: if fair_gpus > 0.0 {
                    metrics::r4(avg_gpus / fair_gpus)
                } else {
                    0.0
                },
                preempted: preempted_by_queue.get(&q.name).copied().unwrap_or(0),
                wait_p50_s: metrics::pct_s(&w8, 50.0),
                wait_p95_s: metrics::pct_s(&w8, 95.0),
                wait_p99_s: metrics::pct_s(&w8, 99.0),
                ..QueueReport::default()
            }
        })
        .collect();
    SimResult {
        scenario: input.name.clone(),
        seed: 1,
        scheduler: scheduler.packer_name().to_string(),
        nodes: snap.nodes.len() as u32,
        gpus: snap.nodes.iter().map(|n| n.gpus.len() as u32).sum(),
        end_ms: end,
        cycles,
        ended_by: ended_by.to_string(),
        totals: t,
        queues,
        series,
        heatmap,
        wait_cdf: Vec::new(),
        incidents: Vec::new(),
        failed_jobs: Vec::new(),
        idle: Default::default(),
        marks: Default::default(),
        errors: Vec::new(),
        engine: Default::default(),
    }
}

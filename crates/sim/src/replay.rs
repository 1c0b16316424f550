//! Replay of one captured moment of a cluster (`gpusched snapshot
//! capture`): the core's cycles run from that state, in virtual time, with
//! whatever scheduler the caller built (another policy, another config: a
//! what-if). Deterministic: the same snapshot and scheduler give the same
//! decisions.
//!
//! Rules: cycle `k` (from 1) runs at `start + elapsed` with seed `k` (the
//! live scheduler seeds its cycles the same way, so the first cycle of a
//! replay is the cycle the scheduler would run on that state). Binds start
//! pods; a pod with a known run time finishes that long after it started
//! (captured running pods from their start), others keep running. An
//! evicted pod leaves its node before the next cycle and is pending again
//! (as if its controller recreated it). A cycle follows every cycle that
//! changed something, `cycle_interval_ms` later; otherwise time jumps to
//! the next finishing pod; with neither, the replay ends.

use crate::frag::{engine_for, fragmentation_milli};
use crate::metrics::{self, Heatmap, QueueReport, Series, SimResult, Totals};
use gpusched_core::{ClusterState, Decision, GpuAssignment, PodPhase, Scheduler, Snapshot};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a replay starts from.
#[derive(Clone, Debug)]
pub struct ReplayInput {
    /// Shown in the report.
    pub name: String,
    /// The captured state.
    pub snapshot: Snapshot,
    /// Run time of each pod (`snapshot.pods[i]`) when known.
    pub durations_ms: Vec<Option<u64>>,
    /// Run time of the pods `durations_ms` gives none (running ones from
    /// their start, pending ones from their binding); `None`: they run for
    /// ever.
    pub default_duration_ms: Option<u64>,
    /// The moment of capture (ms; the first cycle's `now`).
    pub start_ms: u64,
    /// Time between a cycle that changed something and the next.
    pub cycle_interval_ms: u64,
    /// Stop after this many cycles.
    pub max_cycles: u64,
}

/// One decision of a replay.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayDecision {
    /// Cycle number (from 1).
    pub cycle: u64,
    /// Virtual ms since the capture.
    pub at_ms: u64,
    /// `bind`, `evict` or `nominate`.
    pub action: String,
    /// The pod's name (`namespace/name`).
    pub pod: String,
    /// The node.
    pub node: String,
    /// GPU indices on the node (`nvidia-smi` order).
    pub gpus: Vec<u32>,
    /// Their UUIDs.
    pub gpu_uuids: Vec<String>,
    /// Milli-GPU of a share (absent for whole GPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub milli: Option<u32>,
    /// Why (evictions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What a replay produced.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplayOutput {
    /// Every bind, eviction and nomination, in order.
    pub decisions: Vec<ReplayDecision>,
    /// Pods still pending at the end, with the core's explanation.
    pub pending: Vec<(String, String)>,
    /// The simulator's result shape (for its table and HTML report).
    pub result: SimResult,
}

/// Cluster totals at one moment.
struct Sample {
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

fn sample(t: u64, snap: &Snapshot, engine: &gpusched_plugins::packing::fgd::FragEngine) -> Sample {
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

fn gpu_list(snap: &Snapshot, node: u32, a: &GpuAssignment) -> (Vec<u32>, Vec<String>, Option<u32>) {
    let n = &snap.nodes[node as usize];
    let (pos, milli) = match a {
        GpuAssignment::None => (Vec::new(), None),
        GpuAssignment::Whole(v) => (v.clone(), None),
        GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
            (vec![*gpu], Some(*milli))
        }
    };
    let gpus: Vec<_> = pos.iter().filter_map(|&p| n.gpus.get(p as usize)).collect();
    (
        gpus.iter().map(|g| g.index).collect(),
        gpus.iter().map(|g| g.uuid.clone()).collect(),
        milli,
    )
}

/// Runs the replay.
pub fn replay(input: &ReplayInput, scheduler: &mut Scheduler) -> ReplayOutput {
    let start = input.start_ms;
    let mut snap = input.snapshot.clone();
    let engine = engine_for(snap.pods.iter().map(|p| &p.pod));
    // absolute end time of each running pod with a known run time
    let mut durations: Vec<Option<u64>> = (0..snap.pods.len())
        .map(|i| {
            input
                .durations_ms
                .get(i)
                .copied()
                .flatten()
                .or(input.default_duration_ms)
        })
        .collect();
    let mut ends: Vec<Option<u64>> = snap
        .pods
        .iter()
        .zip(&durations)
        .map(|(p, d)| match (&p.phase, d) {
            (PodPhase::Running { since_ms, .. }, Some(d)) => Some((since_ms + d).max(start)),
            _ => None,
        })
        .collect();
    let mut decisions = Vec::new();
    let mut samples = vec![sample(0, &snap, &engine)];
    let mut t = Totals {
        pods: snap.pods.len() as u64,
        jobs: snap.pods.len() as u64,
        ..Totals::default()
    };
    let mut waits: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut started: BTreeMap<String, u64> = BTreeMap::new();
    let mut now = start;
    let mut cycle = 0u64;
    let mut last_pending: Vec<(String, String)> = Vec::new();
    let mut evicted: std::collections::BTreeSet<String> = Default::default();
    let mut timed_out: std::collections::BTreeSet<String> = Default::default();
    let mut gang_started: std::collections::BTreeSet<String> = Default::default();
    let mut completed: BTreeMap<String, u64> = BTreeMap::new();
    let mut preempted: BTreeMap<String, u64> = BTreeMap::new();
    let ended_by = loop {
        if cycle >= input.max_cycles {
            break "until";
        }
        cycle += 1;
        let out = scheduler.cycle(&snap, now, cycle);
        let rel = now - start;
        let mut changed = false;
        for d in &out.decisions {
            match d {
                Decision::Bind { pod, node, gpus } => {
                    let i = *pod as usize;
                    let (idx, uuids, milli) = gpu_list(&snap, *node, gpus);
                    let p = &mut snap.pods[i];
                    decisions.push(ReplayDecision {
                        cycle,
                        at_ms: rel,
                        action: "bind".into(),
                        pod: p.pod.name.clone(),
                        node: snap.nodes[*node as usize].name.clone(),
                        gpus: idx,
                        gpu_uuids: uuids,
                        milli,
                        reason: None,
                    });
                    waits
                        .entry(p.pod.queue.clone())
                        .or_default()
                        .push(now.saturating_sub(p.pod.arrival_ms));
                    *started.entry(p.pod.queue.clone()).or_default() += 1;
                    p.phase = PodPhase::Running {
                        node: *node,
                        gpus: gpus.clone(),
                        since_ms: now,
                    };
                    ends[i] = durations[i].map(|d| now + d);
                    t.binds += 1;
                    changed = true;
                }
                Decision::Evict { pod, reason } => {
                    let i = *pod as usize;
                    let held = snap.pods[i].holding().map(|(n, g)| (n, g.clone()));
                    if let Some((node, gpus)) = held {
                        let (idx, uuids, milli) = gpu_list(&snap, node, &gpus);
                        decisions.push(ReplayDecision {
                            cycle,
                            at_ms: rel,
                            action: "evict".into(),
                            pod: snap.pods[i].pod.name.clone(),
                            node: snap.nodes[node as usize].name.clone(),
                            gpus: idx,
                            gpu_uuids: uuids,
                            milli,
                            reason: Some(reason.to_string()),
                        });
                        evicted.insert(snap.pods[i].pod.name.clone());
                        if reason.kind() != gpusched_core::EvictionKind::Consolidate {
                            *preempted.entry(snap.pods[i].pod.queue.clone()).or_default() += 1;
                        }
                        snap.pods[i].phase = PodPhase::Terminating { node, gpus };
                    }
                    match reason.kind() {
                        gpusched_core::EvictionKind::Preempt => t.preemptions += 1,
                        gpusched_core::EvictionKind::Reclaim => t.reclaims += 1,
                        gpusched_core::EvictionKind::Consolidate => t.moves += 1,
                    }
                    *t.evictions_by_reason
                        .entry(reason.kind().label().to_string())
                        .or_default() += 1;
                    changed = true;
                }
                Decision::Nominate { pod, node } => {
                    let p = &mut snap.pods[*pod as usize];
                    if p.phase
                        != (PodPhase::Pending {
                            nominated: Some(*node),
                        })
                    {
                        p.phase = PodPhase::Pending {
                            nominated: Some(*node),
                        };
                        t.nominations += 1;
                        decisions.push(ReplayDecision {
                            cycle,
                            at_ms: rel,
                            action: "nominate".into(),
                            pod: p.pod.name.clone(),
                            node: snap.nodes[*node as usize].name.clone(),
                            gpus: Vec::new(),
                            gpu_uuids: Vec::new(),
                            milli: None,
                            reason: None,
                        });
                        changed = true;
                    }
                }
                Decision::Group { group, phase } => match phase {
                    gpusched_core::GroupPhase::TimedOut if timed_out.insert(group.clone()) => {
                        t.groups_timed_out += 1;
                    }
                    gpusched_core::GroupPhase::Running if gang_started.insert(group.clone()) => {
                        t.gang_starts += 1;
                    }
                    _ => {}
                },
            }
        }
        t.backfilled += out.stats.backfilled as u64;
        last_pending = out
            .explanations
            .iter()
            .filter_map(|e| {
                let p = snap.pods.get(e.pod as usize)?;
                p.is_pending().then(|| (p.pod.name.clone(), e.message()))
            })
            .collect();
        samples.push(sample(rel, &snap, &engine));
        // pods evicted here leave their node and are pending again; pods
        // captured terminating are gone
        let mut keep = vec![true; snap.pods.len()];
        for (i, p) in snap.pods.iter_mut().enumerate() {
            if matches!(p.phase, PodPhase::Terminating { .. }) {
                if evicted.contains(&p.pod.name) {
                    p.phase = PodPhase::Pending { nominated: None };
                    t.requeues += 1;
                } else {
                    keep[i] = false;
                }
                changed = true;
            }
        }
        retain(&mut snap, &mut ends, &mut durations, &keep);
        if changed {
            now += input.cycle_interval_ms.max(1);
            continue;
        }
        // nothing changed: jump to the next pod that finishes
        let Some(next) = ends.iter().flatten().copied().min() else {
            break if snap.pods.iter().any(|p| p.is_pending()) {
                "idle"
            } else {
                "done"
            };
        };
        now = next.max(now + 1);
        let keep: Vec<bool> = ends.iter().map(|e| !e.is_some_and(|e| e <= now)).collect();
        let done = keep.iter().filter(|k| !**k).count() as u64;
        for (p, k) in snap.pods.iter().zip(&keep) {
            if !k {
                *completed.entry(p.pod.queue.clone()).or_default() += 1;
            }
        }
        t.pods_succeeded += done;
        t.jobs_completed += done;
        retain(&mut snap, &mut ends, &mut durations, &keep);
        samples.push(sample(now - start, &snap, &engine));
    };
    let end = now - start + input.cycle_interval_ms.max(1);
    let per_queue = PerQueue {
        waits: &waits,
        started: &started,
        completed: &completed,
        preempted: &preempted,
    };
    let result = result(
        input, scheduler, &samples, end, cycle, ended_by, t, &per_queue,
    );
    ReplayOutput {
        decisions,
        pending: last_pending,
        result,
    }
}

/// Drops the pods whose `keep` is false (and their per-pod entries).
fn retain(
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
struct PerQueue<'a> {
    waits: &'a BTreeMap<String, Vec<u64>>,
    started: &'a BTreeMap<String, u64>,
    completed: &'a BTreeMap<String, u64>,
    preempted: &'a BTreeMap<String, u64>,
}

#[allow(clippy::too_many_arguments)]
fn result(
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::PodState;
    use gpusched_model::{Gpu, GpuHealth, GpuRequest, Node, Pod, Queue, ResourceVec};

    fn node(name: &str) -> Node {
        let gpus = (0..4)
            .map(|i| Gpu {
                index: i,
                uuid: format!("{name}-GPU-{i}"),
                model: "H100".into(),
                memory_mib: 81_920,
                health: GpuHealth::Healthy,
                topo: Default::default(),
                mig: Vec::new(),
            })
            .collect();
        Node::new(name, ResourceVec::new(64_000, 512 << 30, 0), gpus)
    }

    fn pod(name: &str, gpus: u32) -> Pod {
        let mut p = Pod::new(format!("ml/{name}"), "default");
        p.gpu = GpuRequest::Whole(gpus);
        p.arrival_ms = 1_000;
        p
    }

    fn input(duration: Option<u64>) -> ReplayInput {
        let mut running = PodState::pending(pod("r", 4));
        running.phase = PodPhase::Running {
            node: 0,
            gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
            since_ms: 5_000,
        };
        ReplayInput {
            name: "t".into(),
            snapshot: Snapshot {
                nodes: vec![node("a"), node("b")],
                queues: vec![Queue::new("default")],
                groups: Vec::new(),
                pods: vec![
                    running,
                    PodState::pending(pod("p1", 4)),
                    PodState::pending(pod("p2", 4)),
                ],
            },
            durations_ms: vec![duration, None, None],
            default_duration_ms: None,
            start_ms: 10_000,
            cycle_interval_ms: 1_000,
            max_cycles: 100,
        }
    }

    fn run(i: &ReplayInput) -> ReplayOutput {
        replay(i, &mut crate::sched::default_scheduler())
    }

    #[test]
    fn pending_pods_are_placed_and_finishing_pods_free_their_gpus() {
        let out = run(&input(Some(60_000)));
        let binds: Vec<(&str, &str, &[u32], u64)> = out
            .decisions
            .iter()
            .filter(|d| d.action == "bind")
            .map(|d| (d.pod.as_str(), d.node.as_str(), d.gpus.as_slice(), d.at_ms))
            .collect();
        // p1 fits on b at once; p2 waits for r (started at 5 s, runs 60 s:
        // done at 65 s, 55 s after the capture)
        assert_eq!(binds.len(), 2, "{:#?}", out.decisions);
        assert_eq!(binds[0], ("ml/p1", "b", &[0, 1, 2, 3][..], 0));
        assert_eq!((binds[1].0, binds[1].1), ("ml/p2", "a"));
        assert_eq!(binds[1].3, 55_000);
        assert_eq!(out.decisions[0].gpu_uuids[0], "b-GPU-0");
        assert_eq!(out.result.totals.binds, 2);
        assert_eq!(out.result.totals.pods_succeeded, 1);
        // nothing left pending: the replay is done
        assert_eq!(out.result.ended_by, "done");
        assert!(out.pending.is_empty());
        // deterministic, and the report renders
        assert_eq!(run(&input(Some(60_000))), out);
        let html = crate::report::render(&out.result, None);
        assert!(html.contains("<svg"), "no chart in the report");
    }

    #[test]
    fn a_default_run_time_applies_to_pods_without_one() {
        // r has no run time of its own: with a default of 60 s it ends at
        // 65 s (started at 5 s), and p2 gets its GPUs then
        let mut i = input(None);
        i.default_duration_ms = Some(60_000);
        let out = run(&i);
        let p2 = out
            .decisions
            .iter()
            .find(|d| d.action == "bind" && d.pod == "ml/p2")
            .expect("p2 bound once r ends");
        assert_eq!((p2.node.as_str(), p2.at_ms), ("a", 55_000));
        // the placed pods end too: every pod succeeds and the replay ends
        assert_eq!(out.result.totals.pods_succeeded, 3);
        assert_eq!(out.result.ended_by, "done");
        // a pod's own run time wins over the default
        let mut own = input(Some(20_000));
        own.default_duration_ms = Some(60_000);
        let out = run(&own);
        let p2 = out
            .decisions
            .iter()
            .find(|d| d.action == "bind" && d.pod == "ml/p2")
            .unwrap();
        assert_eq!(p2.at_ms, 15_000);
    }

    /// The per-queue columns of a replay are filled in (they once showed
    /// 0.0 whatever happened), and a gang's timeout is counted.
    #[test]
    fn queues_show_what_they_held_finished_and_lost() {
        let mut i = input(None);
        i.default_duration_ms = Some(60_000);
        let out = run(&i);
        let q = &out.result.queues[0];
        assert_eq!(q.name, "default");
        assert_eq!(q.jobs_completed, 3);
        assert_eq!(q.jobs_completed, out.result.totals.jobs_completed);
        // 4 then 8 GPUs held, then 4: between the extremes, never zero
        assert!(q.avg_gpus > 3.0 && q.avg_gpus < 8.0, "{q:?}");
        // alone in the cluster, its fair share is its demand
        assert!(q.fair_gpus >= q.avg_gpus, "{q:?}");
        assert!(q.fairness_ratio > 0.0 && q.fairness_ratio <= 1.0, "{q:?}");

        // a gang of 3 with 2 members, timing out after 5 s
        let mut i = input(Some(60_000));
        i.snapshot.groups.push(gpusched_model::PodGroup {
            name: "ml/trio".into(),
            queue: "default".into(),
            min_member: 3,
            priority: 0,
            topology: None,
            schedule_timeout_ms: Some(5_000),
        });
        for name in ["t0", "t1"] {
            let mut p = pod(name, 1);
            p.group = Some("ml/trio".into());
            i.snapshot.pods.push(PodState::pending(p));
            i.durations_ms.push(None);
        }
        let out = run(&i);
        assert_eq!(out.result.totals.groups_timed_out, 1, "{:#?}", out.pending);
        assert!(
            out.pending
                .iter()
                .any(|(p, why)| p == "ml/t0" && why.contains("timed out")),
            "{:?}",
            out.pending
        );
    }

    #[test]
    fn running_pods_without_a_run_time_keep_their_gpus() {
        let out = run(&input(None));
        let binds = out.decisions.iter().filter(|d| d.action == "bind").count();
        assert_eq!(binds, 1);
        assert_eq!(out.pending.len(), 1);
        assert_eq!(out.pending[0].0, "ml/p2");
        assert!(
            out.pending[0].1.contains("Insufficient"),
            "{}",
            out.pending[0].1
        );
        assert_eq!(out.result.ended_by, "idle");
    }
}

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

mod result;
use result::{PerQueue, result, retain, sample};

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
    let engine = engine_for(snap.pods.iter().map(|p| &*p.pod));
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
    let mut core = gpusched_core::Engine::lend(scheduler);
    let mut break_err: Option<String> = None;
    let ended_by = loop {
        if cycle >= input.max_cycles {
            break "until";
        }
        cycle += 1;
        // the replayed state as changes to the incremental core
        if let Err(e) = core.sync(&snap) {
            break_err = Some(e.to_string());
            break "refused";
        }
        let mut out = core.cycle(now, cycle);
        // the last cycle's pending pods are reported, the parked ones too
        core.explain_parked(&mut out);
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
                    if !matches!(p.phase, PodPhase::Pending { nominated: Some(n), .. } if n == *node)
                    {
                        p.phase = PodPhase::Pending {
                            nominated: Some(*node),
                            nominated_at_ms: None,
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
                    p.phase = PodPhase::Pending {
                        nominated: None,
                        nominated_at_ms: None,
                    };
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
    let engine_stats = core.stats().clone();
    core.give_back(scheduler);
    let mut result = result(
        input, scheduler, &samples, end, cycle, ended_by, t, &per_queue,
    );
    result.engine = engine_stats;
    if let Some(e) = break_err {
        // a captured state the core cannot take (duplicate names, a pod
        // on a node the file lacks): said, not panicked on
        result.totals.sim_errors += 1;
        result
            .errors
            .push(format!("the scheduler refused the captured state: {e}"));
    }
    ReplayOutput {
        decisions,
        pending: last_pending,
        result,
    }
}

#[cfg(test)]
mod tests;

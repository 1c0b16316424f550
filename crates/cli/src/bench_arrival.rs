//! `gpusched bench`'s one-arrival case (issue #37's first goal): a full
//! cluster of 8-GPU nodes, a deep backlog of pods that cannot fit, then pods
//! that fit arriving one at a time. Each arrival gets its own cycle on the
//! whole state (the backlog, the running pods, the arrivals placed before
//! it); the case reports the cycle that places it — p50, p99 and max — so
//! the cost of a quiet queue's one new pod can be compared with the size of
//! the cluster and the backlog it sits beside.
//!
//! Two runners are timed on the same arrivals, one after the other: the
//! full pass (a whole snapshot per cycle, `Scheduler::cycle`) and the
//! incremental core (`gpusched_core::Engine`: the arrival and each bind
//! handed over as changes, the cluster kept between cycles). Both must
//! bind every arrival to the same node.

use gpusched_core::engine::{Change, PodAt, binds_as_changes, changes_of};
use gpusched_core::{Decision, Engine, GpuAssignment, PodPhase, PodState, Snapshot};
use gpusched_model::{GpuRequest, Node, Pod, Queue, ResourceVec};
use gpusched_plugins::SchedulerConfig;
use serde::Serialize;
use std::time::Instant;

/// What the one-arrival case measured.
#[derive(Serialize, Debug)]
pub struct Arrival {
    /// Nodes (8 GPUs each; all but `arrivals` of them full).
    pub nodes: u32,
    /// Running 1-GPU pods filling the nodes.
    pub running: u32,
    /// Pending pods that cannot fit (8 GPUs each, while no node has 8 free).
    pub backlog: u32,
    /// Arrivals timed (1-GPU pods, each fitting one free GPU).
    pub arrivals: u32,
    /// The arriving pod's cycle, seconds: median.
    pub p50_seconds: f64,
    /// 99th percentile (nearest rank).
    pub p99_seconds: f64,
    /// The slowest.
    pub max_seconds: f64,
    /// The same arrivals through the incremental core: median.
    pub engine_p50_seconds: f64,
    /// 99th percentile (nearest rank).
    pub engine_p99_seconds: f64,
    /// The slowest.
    pub engine_max_seconds: f64,
    /// Cycles in which the engine rebuilt the free capacity from every pod
    /// (none when it keeps it: the first cycle's comes from the changes).
    pub engine_rebuilds: u64,
}

/// p50, p99 (nearest rank) and max of `secs`.
fn percentiles(mut secs: Vec<f64>) -> (f64, f64, f64) {
    secs.sort_by(f64::total_cmp);
    let rank = |q: f64| secs[((q * secs.len() as f64).ceil() as usize).clamp(1, secs.len()) - 1];
    (rank(0.50), rank(0.99), secs[secs.len() - 1])
}

fn running(node: u32, gpu: u32, i: usize) -> PodState {
    let mut p = Pod::new(format!("bench/r{i:06}"), "default");
    p.requests = ResourceVec::new(2000, 8 << 30, 0);
    p.gpu = GpuRequest::Whole(1);
    PodState {
        pod: p.into(),
        phase: PodPhase::Running {
            node,
            gpus: GpuAssignment::Whole(vec![gpu]),
            since_ms: 0,
        },
    }
}

/// Runs the case: `nodes` nodes of which the first `arrivals` keep one GPU
/// free, `backlog` pending 8-GPU pods, then `arrivals` 1-GPU pods one at a
/// time. Fails if an arrival is not bound in its own cycle (the case would
/// then time something else).
pub fn run(
    cfg: &SchedulerConfig,
    nodes: Vec<Node>,
    backlog: u32,
    arrivals: u32,
) -> anyhow::Result<Arrival> {
    let n = nodes.len() as u32;
    anyhow::ensure!(
        arrivals > 0 && arrivals <= n,
        "--arrivals {arrivals}: between 1 and the node count {n}"
    );
    let mut pods = Vec::new();
    for node in 0..n {
        let used = if node < arrivals { 7 } else { 8 };
        for gpu in 0..used {
            let i = pods.len();
            pods.push(running(node, gpu, i));
        }
    }
    let running_count = pods.len() as u32;
    for i in 0..backlog {
        let mut p = Pod::new(format!("bench/b{i:06}"), "default");
        p.requests = ResourceVec::new(16_000, 64 << 30, 0);
        p.gpu = GpuRequest::Whole(8);
        p.arrival_ms = i as u64;
        pods.push(PodState::pending(p));
    }
    let mut snap = Snapshot {
        nodes,
        queues: vec![Queue::new("default")],
        groups: vec![],
        pods,
    };
    // One scheduler across the arrivals, as the running scheduler keeps
    // one: whatever it carries between cycles helps it here too.
    let mut s = gpusched_plugins::build(cfg)?;
    // the backlog's first cycle (nothing fits), untimed
    let now0 = backlog as u64 + 1;
    let out = s.cycle(&snap, now0, 42);
    let placed = out
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Bind { .. }))
        .count();
    anyhow::ensure!(
        placed == 0,
        "the backlog placed {placed} pods: the cluster is not full"
    );
    // the engine, fed the same cluster as changes
    let mut engine = Engine::new(gpusched_plugins::build(cfg)?);
    engine
        .apply_all(changes_of(&snap)?)
        .map_err(|e| anyhow::anyhow!("the bench's cluster as changes: {e}"))?;
    let out = engine.cycle(now0, 42);
    anyhow::ensure!(
        !out.decisions
            .iter()
            .any(|d| matches!(d, Decision::Bind { .. })),
        "the engine placed backlog pods"
    );
    let mut secs = Vec::with_capacity(arrivals as usize);
    let mut engine_secs = Vec::with_capacity(arrivals as usize);
    for k in 0..arrivals {
        let mut p = Pod::new(format!("bench/new{k:05}"), "default");
        p.requests = ResourceVec::new(2000, 8 << 30, 0);
        p.gpu = GpuRequest::Whole(1);
        let now = now0 + 1 + k as u64;
        p.arrival_ms = now;
        // the full pass
        let id = snap.pods.len() as u32;
        snap.pods.push(PodState::pending(p.clone()));
        let t = Instant::now();
        let out = s.cycle(&snap, now, 42);
        secs.push(t.elapsed().as_secs_f64());
        let bound = out.decisions.iter().find_map(|d| match d {
            Decision::Bind { pod, node, gpus } if *pod == id => Some((*node, gpus.clone())),
            _ => None,
        });
        let Some((node, gpus)) = bound else {
            anyhow::bail!("arrival {k} was not bound in its cycle");
        };
        snap.pods[id as usize].phase = PodPhase::Running {
            node,
            gpus,
            since_ms: now,
        };
        // the engine: the arrival is one change, its bind another
        let name = p.name.clone();
        engine
            .apply(Change::Pod(std::sync::Arc::new(p), PodAt::pending()))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let t = Instant::now();
        let out = engine.cycle(now, 42);
        engine_secs.push(t.elapsed().as_secs_f64());
        let binds = binds_as_changes(&engine, &out, now);
        let at = binds.iter().find_map(|c| match c {
            Change::Pod(p, PodAt::Running { node, .. }) if p.name == name => Some(node.clone()),
            _ => None,
        });
        anyhow::ensure!(
            binds.len() == 1 && at.as_deref() == Some(snap.nodes[node as usize].name.as_str()),
            "arrival {k}: the engine bound {at:?}, the full pass {}",
            snap.nodes[node as usize].name
        );
        engine
            .apply_all(binds)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let (p50, p99, max) = percentiles(secs);
    let (e50, e99, emax) = percentiles(engine_secs);
    Ok(Arrival {
        nodes: n,
        running: running_count,
        backlog,
        arrivals,
        p50_seconds: p50,
        p99_seconds: p99,
        max_seconds: max,
        engine_p50_seconds: e50,
        engine_p99_seconds: e99,
        engine_max_seconds: emax,
        engine_rebuilds: engine.stats().rebuilds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes(n: u32) -> Vec<Node> {
        crate::bench::cluster(n).unwrap()
    }

    #[test]
    fn every_arrival_is_placed_in_its_own_cycle_beside_a_backlog_that_cannot_fit() {
        let cfg = SchedulerConfig::default();
        let r = run(&cfg, nodes(12), 40, 5).unwrap();
        assert_eq!((r.nodes, r.backlog, r.arrivals), (12, 40, 5));
        // 7 GPUs busy on the 5 arrival nodes, 8 on the other 7
        assert_eq!(r.running, 5 * 7 + 7 * 8);
        assert!(r.p50_seconds <= r.p99_seconds && r.p99_seconds <= r.max_seconds);
        assert!(r.engine_p50_seconds <= r.engine_p99_seconds);
        // the engine built the free capacity from the changes: no cycle
        // rebuilt it from every pod
        assert_eq!(r.engine_rebuilds, 0);
    }

    #[test]
    fn more_arrivals_than_free_gpus_is_refused() {
        let cfg = SchedulerConfig::default();
        let e = run(&cfg, nodes(3), 10, 4).unwrap_err().to_string();
        assert!(e.contains("--arrivals 4"), "{e}");
    }
}

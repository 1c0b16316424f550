//! `gpusched bench`: scheduling throughput, gang latency, a cluster-size
//! curve and memory per node and per pod, on synthetic clusters.

use anyhow::Context;
use clap::Args;
use gpusched_core::{CycleOutput, Decision, PodPhase, PodState, Snapshot};
use gpusched_model::spec::{ClusterSpec, GpuLayoutSpec, Interconnect, NodeGroupSpec};
use gpusched_model::{
    GpuRequest, LabelSelector, Pod, PodAffinityTerm, PodGroup, Queue, ResourceVec,
    SpreadConstraint, SpreadPolicy, WhenUnsatisfiable,
};
use gpusched_plugins::SchedulerConfig;
use serde::Serialize;
use std::time::Instant;

#[derive(Args, Debug, Clone)]
pub struct BenchArgs {
    /// Nodes (8 GPUs each) for the throughput run.
    #[arg(long, default_value_t = 5000)]
    pub nodes: u32,
    /// Pending 1-GPU pods for the throughput run.
    #[arg(long, default_value_t = 50_000)]
    pub pods: u32,
    /// Packing policy.
    #[arg(long, default_value = "gpusched")]
    pub policy: String,
    /// Node counts of the cluster-size curve (comma separated; empty: skip).
    #[arg(long, default_value = "1000,5000,10000,20000", value_parser = parse_curve)]
    pub curve: Curve,
    /// Number of 1,000-GPU gangs for the gang run (0: skip).
    #[arg(long, default_value_t = 4)]
    pub gangs: u32,
    /// Run the consolidation case: every node holds 7 movable 1-GPU pods
    /// and one free GPU, 1,000 pending 2-GPU pods (each needs a move).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub consolidation: bool,
    /// Pending pods of the Pod API case (0: skip): 1-GPU pods in groups
    /// of 100, each with required anti-affinity to its group on
    /// `kubernetes.io/hostname` and a `DoNotSchedule` zone spread
    /// (maxSkew 1) of its group, on `--nodes` nodes over `--zones` zones.
    #[arg(long, default_value_t = 10_000)]
    pub anti_affinity_pods: u32,
    /// Zones of the Pod API case.
    #[arg(long, default_value_t = 50)]
    pub zones: u32,
    /// Pending pods of the one-arrival case (0: skip): 8-GPU pods that
    /// cannot fit on `--nodes` full 8-GPU nodes, beside which
    /// `--arrivals` 1-GPU pods that fit arrive one at a time, each timed
    /// in the cycle that places it.
    #[arg(long, default_value_t = 10_000)]
    pub backlog: u32,
    /// Arrivals of the one-arrival case.
    #[arg(long, default_value_t = 100)]
    pub arrivals: u32,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Node counts of the cluster-size curve.
#[derive(Clone, Debug)]
pub struct Curve(pub Vec<u32>);

/// `--curve`: comma-separated node counts; an empty value skips the curve.
fn parse_curve(s: &str) -> Result<Curve, String> {
    s.split(',')
        .map(str::trim)
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse::<u32>()
                .map_err(|e| format!("node count {x:?}: {e}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Curve)
}

#[derive(Serialize, Debug)]
struct Run {
    name: String,
    nodes: u32,
    pods: u32,
    bound: u32,
    seconds: f64,
    decisions_per_s: f64,
}

#[derive(Serialize, Debug)]
struct Report {
    policy: String,
    throughput: Run,
    gangs: Option<Run>,
    consolidation: Option<Run>,
    /// The Pod API case (anti-affinity + zone spread per group).
    anti_affinity: Option<Run>,
    /// Seconds of one status refresh (the gauges the scheduler recomputes
    /// every 2 s: pending by reason, GPUs by state, fragmentation) on the
    /// throughput cluster after its cycle.
    status_refresh_seconds: f64,
    /// The one-arrival case.
    arrival: Option<crate::bench_arrival::Arrival>,
    curve: Vec<Run>,
    bytes_per_node: u64,
    bytes_per_pod: u64,
}

pub(crate) fn cluster(n: u32) -> anyhow::Result<Vec<gpusched_model::Node>> {
    let spec = ClusterSpec {
        nodes: vec![NodeGroupSpec {
            name: "node".into(),
            count: n,
            cpu: "224".into(),
            memory: "2Ti".into(),
            rack: Some("rack".into()),
            nodes_per_rack: Some(16),
            gpus: Some(GpuLayoutSpec {
                count: 8,
                model: "H100-SXM5-80GB".into(),
                memory: "80Gi".into(),
                interconnect: Interconnect::Nvswitch,
                pcie_switches: 4,
                numa_nodes: 2,
                devices: vec![],
            }),
            ..Default::default()
        }],
    };
    spec.nodes().context("building the synthetic cluster")
}

fn one_gpu_pods(n: u32) -> Vec<PodState> {
    (0..n)
        .map(|i| {
            let mut p = Pod::new(format!("bench/p{i:06}"), "default");
            p.requests = ResourceVec::new(2000, 8 << 30, 0);
            p.gpu = GpuRequest::Whole(1);
            p.arrival_ms = i as u64;
            PodState::pending(p)
        })
        .collect()
}

fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
            })
        })
        .map(|kb| kb * 1024)
        .unwrap_or(0)
}

fn time_cycle(cfg: &SchedulerConfig, snap: &Snapshot, name: &str) -> anyhow::Result<Run> {
    Ok(time_cycle_out(cfg, snap, name)?.0)
}

/// [`time_cycle`], and the cycle's output.
fn time_cycle_out(
    cfg: &SchedulerConfig,
    snap: &Snapshot,
    name: &str,
) -> anyhow::Result<(Run, CycleOutput)> {
    let mut s = gpusched_plugins::build(cfg)?;
    let t = Instant::now();
    let out = s.cycle(snap, 0, 42);
    let secs = t.elapsed().as_secs_f64();
    let bound = out
        .decisions
        .iter()
        .filter(|d| matches!(d, Decision::Bind { .. }))
        .count() as u32;
    let pending = snap.pods.len() as u32;
    let run = Run {
        name: name.into(),
        nodes: snap.nodes.len() as u32,
        pods: pending,
        bound,
        seconds: secs,
        decisions_per_s: pending as f64 / secs.max(1e-9),
    };
    Ok((run, out))
}

/// Times the scheduler's periodic status refresh
/// ([`gpusched_k8s::metrics::Metrics::observe_cycle`]) on `snap` with the
/// cycle's binds applied, as the next snapshot would show them.
fn time_status_refresh(snap: &Snapshot, out: &CycleOutput) -> f64 {
    let mut after = snap.clone();
    for d in &out.decisions {
        if let Decision::Bind { pod, node, gpus } = d
            && let Some(p) = after.pods.get_mut(*pod as usize)
        {
            p.phase = PodPhase::Running {
                node: *node,
                gpus: gpus.clone(),
                since_ms: 0,
            };
        }
    }
    let built = gpusched_k8s::world::Built {
        snapshot: after,
        ..Default::default()
    };
    let metrics = gpusched_k8s::metrics::Metrics::new();
    let t = Instant::now();
    let classes = gpusched_core::report::classify::classify_cycle(out, &built.snapshot);
    metrics.observe_cycle(&built, out, &classes);
    t.elapsed().as_secs_f64()
}

pub fn run(a: BenchArgs) -> anyhow::Result<()> {
    let cfg = SchedulerConfig {
        packing: gpusched_plugins::PackingConfig::from(
            a.policy.parse::<gpusched_plugins::PolicyName>()?,
        ),
        ..SchedulerConfig::default()
    };
    gpusched_plugins::build(&cfg)?;

    // memory per node / per pod
    let r0 = rss_bytes();
    let nodes = cluster(a.nodes)?;
    let r1 = rss_bytes();
    let pods = one_gpu_pods(a.pods);
    let r2 = rss_bytes();
    let snap = Snapshot {
        nodes,
        queues: vec![Queue::new("default")],
        groups: vec![],
        pods,
    };
    let (throughput, tout) = time_cycle_out(&cfg, &snap, "throughput")?;
    let status_refresh_seconds = time_status_refresh(&snap, &tout);
    drop(tout);

    let gangs = if a.gangs > 0 {
        let mut pods = Vec::new();
        let mut groups = Vec::new();
        for g in 0..a.gangs {
            groups.push(PodGroup {
                name: format!("gang-{g}"),
                queue: "default".into(),
                min_member: 125,
                priority: 0,
                topology: None,
                schedule_timeout_ms: None,
            });
            for m in 0..125 {
                let mut p = Pod::new(format!("bench/g{g}-{m:03}"), "default");
                p.requests = ResourceVec::new(16_000, 64 << 30, 0);
                p.gpu = GpuRequest::Whole(8);
                p.group = Some(format!("gang-{g}"));
                pods.push(PodState::pending(p));
            }
        }
        let gsnap = Snapshot {
            nodes: snap.nodes.clone(),
            queues: snap.queues.clone(),
            groups,
            pods,
        };
        Some(time_cycle(&cfg, &gsnap, "1000-GPU gangs")?)
    } else {
        None
    };

    let consolidation = if a.consolidation {
        let mut pods = Vec::new();
        for n in 0..a.nodes {
            for g in 0..7u32 {
                let mut p = Pod::new(format!("bench/m{n:05}-{g}"), "default");
                p.requests = ResourceVec::new(2000, 8 << 30, 0);
                p.gpu = GpuRequest::Whole(1);
                p.movable = true;
                pods.push(PodState {
                    pod: p.into(),
                    phase: gpusched_core::PodPhase::Running {
                        node: n,
                        gpus: gpusched_core::GpuAssignment::Whole(vec![g]),
                        since_ms: 0,
                    },
                });
            }
        }
        for i in 0..1000u32 {
            let mut p = Pod::new(format!("bench/q{i:04}"), "default");
            p.requests = ResourceVec::new(2000, 8 << 30, 0);
            p.gpu = GpuRequest::Whole(2);
            p.arrival_ms = i as u64;
            pods.push(PodState::pending(p));
        }
        let msnap = Snapshot {
            nodes: snap.nodes.clone(),
            queues: snap.queues.clone(),
            groups: vec![],
            pods,
        };
        // one cycle; `bound` counts the pods moved (each makes room for
        // one pending pod, nominated), at most `max_moves_per_cycle`
        let mut s = gpusched_plugins::build(&cfg)?;
        let t = Instant::now();
        let out = s.cycle(&msnap, 0, 42);
        let secs = t.elapsed().as_secs_f64();
        let moved = out
            .decisions
            .iter()
            .filter(|d| matches!(d, Decision::Evict { .. }))
            .count() as u32;
        Some(Run {
            name: "consolidation".into(),
            nodes: msnap.nodes.len() as u32,
            pods: 1000,
            bound: moved,
            seconds: secs,
            decisions_per_s: moved as f64 / secs.max(1e-9),
        })
    } else {
        None
    };

    let anti_affinity = if a.anti_affinity_pods > 0 {
        let mut nodes = snap.nodes.clone();
        for (i, n) in nodes.iter_mut().enumerate() {
            n.labels
                .insert("kubernetes.io/hostname".into(), n.name.clone());
            n.labels.insert(
                "topology.kubernetes.io/zone".into(),
                format!("zone-{}", i as u32 % a.zones.max(1)),
            );
        }
        let pods = (0..a.anti_affinity_pods)
            .map(|i| {
                let group = format!("g{:03}", i / 100);
                let mut p = Pod::new(format!("bench/a{i:06}"), "default");
                p.requests = ResourceVec::new(2000, 8 << 30, 0);
                p.gpu = GpuRequest::Whole(1);
                p.arrival_ms = i as u64;
                p.namespace = "bench".into();
                p.labels.insert("app".into(), group.clone());
                let c = p.constraints_mut();
                c.required_anti_affinity.push(PodAffinityTerm::labelled(
                    "app",
                    &group,
                    "kubernetes.io/hostname",
                ));
                c.spread.push(SpreadConstraint {
                    max_skew: 1,
                    topology_key: "topology.kubernetes.io/zone".into(),
                    when_unsatisfiable: WhenUnsatisfiable::DoNotSchedule,
                    selector: Some(LabelSelector::equals([("app", group.as_str())])),
                    min_domains: None,
                    node_affinity_policy: SpreadPolicy::Honor,
                    node_taints_policy: SpreadPolicy::Ignore,
                });
                PodState::pending(p)
            })
            .collect();
        let asnap = Snapshot {
            nodes,
            queues: snap.queues.clone(),
            groups: vec![],
            pods,
        };
        Some(time_cycle(&cfg, &asnap, "anti-affinity")?)
    } else {
        None
    };

    let arrival = if a.backlog > 0 {
        Some(crate::bench_arrival::run(
            &cfg,
            snap.nodes.clone(),
            a.backlog,
            a.arrivals,
        )?)
    } else {
        None
    };

    let mut curve = Vec::new();
    for &n in &a.curve.0 {
        let csnap = Snapshot {
            nodes: cluster(n)?,
            queues: vec![Queue::new("default")],
            groups: vec![],
            pods: one_gpu_pods(a.pods),
        };
        curve.push(time_cycle(&cfg, &csnap, &format!("{n} nodes"))?);
    }

    let report = Report {
        policy: a.policy.clone(),
        throughput,
        gangs,
        consolidation,
        anti_affinity,
        status_refresh_seconds,
        arrival,
        curve,
        bytes_per_node: r1.saturating_sub(r0) / a.nodes.max(1) as u64,
        bytes_per_pod: r2.saturating_sub(r1) / a.pods.max(1) as u64,
    };
    if a.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("gpusched bench — policy {}", report.policy);
    println!(
        "{:<18} {:>7} {:>8} {:>8} {:>9} {:>14}",
        "run", "nodes", "pods", "bound", "seconds", "decisions/s"
    );
    let mut rows = vec![&report.throughput];
    rows.extend(report.gangs.iter());
    rows.extend(report.consolidation.iter());
    rows.extend(report.anti_affinity.iter());
    rows.extend(report.curve.iter());
    for r in rows {
        println!(
            "{:<18} {:>7} {:>8} {:>8} {:>9.3} {:>14.0}",
            r.name, r.nodes, r.pods, r.bound, r.seconds, r.decisions_per_s
        );
    }
    if report.consolidation.is_some() {
        println!(
            "consolidation: {} nodes with 7 movable 1-GPU pods each, 1,000 pending 2-GPU pods; bound = pods moved in one cycle",
            report.consolidation.as_ref().map_or(0, |r| r.nodes)
        );
    }
    if report.anti_affinity.is_some() {
        println!(
            "anti-affinity: 1-GPU pods in groups of 100, required hostname anti-affinity to the group and a DoNotSchedule zone spread (maxSkew 1) over {} zones",
            a.zones
        );
    }
    if let Some(r) = &report.arrival {
        println!(
            "one arrival: {} full nodes ({} running pods), {} pending 8-GPU pods that cannot fit; each of {} 1-GPU pods placed in its own cycle: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            r.nodes,
            r.running,
            r.backlog,
            r.arrivals,
            r.p50_seconds * 1e3,
            r.p99_seconds * 1e3,
            r.max_seconds * 1e3
        );
        println!(
            "one arrival, incremental core (the arrival and its bind handed over as changes, the cluster kept): p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms ({} rebuild of the free capacity)",
            r.engine_p50_seconds * 1e3,
            r.engine_p99_seconds * 1e3,
            r.engine_max_seconds * 1e3,
            r.engine_rebuilds
        );
    }
    println!(
        "status refresh (every 2 s in the scheduler: pending by reason, GPUs by state, fragmentation): {:.3} s on the throughput cluster after its cycle",
        report.status_refresh_seconds
    );
    println!(
        "memory: {} bytes per node (8 GPUs), {} bytes per pending pod (RSS deltas)",
        report.bytes_per_node, report.bytes_per_pod
    );
    Ok(())
}

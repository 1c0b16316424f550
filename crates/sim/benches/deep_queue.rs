//! Deep queues in the simulator (issue 27, kueue#14477's shape): a cluster
//! of N DGX-style nodes × 8 GPUs and a backlog of G gangs (8 pods × 8
//! GPUs each, all arriving at once, 10–20 virtual minutes each) spread over
//! Q queues. The cluster holds N/8 gangs at a time, so almost the whole
//! backlog waits in every cycle. Measured in wall time: gangs admitted per
//! second over the cycles (the scheduler's own work), the cycles' p50/p99,
//! and the whole run (the simulator's bookkeeping included).
//!
//! ```text
//! cargo bench -p gpusched-sim --bench deep_queue -- [nodes] [gangs] [queues] [virtual minutes] [off]
//! # default 1300 10000 1 120; `off`: without skipping equivalent jobs
//! # (SchedulerOptions::skip_equivalent_jobs), the before figure
//! ```

use gpusched_core::CycleOutput;
use gpusched_sim::{Hooks, Source};
use std::time::Instant;

struct Timing {
    start: Option<Instant>,
    cycles_ms: Vec<f64>,
    gangs: u64,
    max_pending: u32,
}

impl Hooks for Timing {
    fn before_cycle(&mut self, _now_ms: u64) {
        self.start = Some(Instant::now());
    }
    fn after_cycle(&mut self, _now_ms: u64, out: &CycleOutput) {
        if let Some(s) = self.start.take() {
            self.cycles_ms.push(s.elapsed().as_secs_f64() * 1000.0);
        }
        self.gangs += u64::from(out.stats.gangs_started);
        self.max_pending = self.max_pending.max(out.stats.pending);
    }
}

fn arg(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let nodes = arg(&args, 0, 1300);
    let gangs = arg(&args, 1, 10_000);
    let queues = arg(&args, 2, 1).max(1);
    let minutes = arg(&args, 3, 120);
    let cluster = format!(
        "nodes:\n  - name: dgx\n    count: {nodes}\n    cpu: \"224\"\n    memory: 2Ti\n    rack: rack\n    nodes_per_rack: 32\n    gpus:\n      count: 8\n      model: H100-SXM5-80GB\n      memory: 80Gi\n      interconnect: nvswitch\n"
    );
    let mut w = String::from("name: deep queue\nqueues:\n");
    for q in 0..queues {
        w += &format!("  - name: q{q}\n");
    }
    w += "jobs:\n";
    for q in 0..queues {
        let n = gangs / queues + u64::from(q < gangs % queues);
        w += &format!(
            "  - name: g{q}\n    queue: q{q}\n    count: {n}\n    pods: 8\n    gang: {{}}\n    duration: 10m\n    duration_max: 20m\n    requests: {{cpu: \"16\", memory: 64Gi, nvidia.com/gpu: \"8\"}}\n"
        );
    }
    w += &format!("settings:\n  until: {minutes}m\n");
    let sc = gpusched_sim::scenario(
        Some(Source {
            name: "cluster.yaml",
            text: &cluster,
        }),
        Some(Source {
            name: "workload.yaml",
            text: &w,
        }),
        1,
    )
    .expect("bench scenario");
    let mut sched = gpusched_sim::sched::default_scheduler();
    let off = args.get(4).is_some_and(|a| a == "off");
    sched.opts.skip_equivalent_jobs = !off;
    let mut t = Timing {
        start: None,
        cycles_ms: Vec::new(),
        gangs: 0,
        max_pending: 0,
    };
    let t0 = Instant::now();
    let r = gpusched_sim::run(&sc, &mut sched, 1, &mut t);
    let wall = t0.elapsed().as_secs_f64();
    let cyc: f64 = t.cycles_ms.iter().sum::<f64>() / 1000.0;
    let mut v = t.cycles_ms.clone();
    v.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        v.get(((v.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or(0.0)
    };
    println!(
        "deep queue: {nodes} nodes x 8 GPUs, {gangs} gangs of 8x8 GPUs in {queues} queue(s), {minutes} virtual minutes{}",
        if off { ", equivalent jobs tried" } else { "" }
    );
    println!(
        "  cycles {}  max pending pods {}  gangs admitted {}  sim errors {}",
        v.len(),
        t.max_pending,
        t.gangs,
        r.totals.sim_errors
    );
    println!(
        "  cycle time {cyc:.2} s (p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms): {:.0} gangs/s",
        pct(0.5),
        pct(0.99),
        pct(1.0),
        t.gangs as f64 / cyc
    );
    println!(
        "  whole run {wall:.2} s: {:.0} gangs/s",
        t.gangs as f64 / wall
    );
}

//! Deep queues (issue 27): the scheduler does not try again a job whose
//! equivalent failed earlier in the same cycle with nothing committed
//! since (`SchedulerOptions::skip_equivalent_jobs`). That must be exact:
//! every cycle decides and explains the same with it on and off, and the
//! runs' results are equal byte for byte.

mod common;

use gpusched_core::{CycleOutput, Decision, Explanation, Scheduler};
use gpusched_sim::{Hooks, Scenario};

/// What a cycle decided and explained (its counters, which differ by
/// design, aside), and the counters summed.
#[derive(Default)]
struct Seen {
    cycles: Vec<(u64, Vec<Decision>, Vec<Explanation>)>,
    skipped: u64,
    scored: u64,
}

impl Hooks for Seen {
    fn after_cycle(&mut self, now_ms: u64, out: &CycleOutput) {
        self.cycles
            .push((now_ms, out.decisions.clone(), out.explanations.clone()));
        self.skipped += u64::from(out.stats.jobs_skipped);
        self.scored += out.stats.nodes_scored;
    }
}

fn run(sc: &Scenario, skip: bool) -> (String, Seen) {
    let mut s: Scheduler = common::scheduler();
    s.opts.skip_equivalent_jobs = skip;
    let mut seen = Seen::default();
    let r = gpusched_sim::run(sc, &mut s, 5, &mut seen);
    common::assert_clean(&r);
    (serde_json::to_string(&r).expect("serialise"), seen)
}

/// Runs `sc` both ways: same result, same decisions and explanations in
/// every cycle. Returns the jobs skipped and nodes scored (on, off).
fn both_ways(sc: &Scenario) -> (u64, u64, u64) {
    let (r_on, on) = run(sc, true);
    let (r_off, off) = run(sc, false);
    assert_eq!(off.skipped, 0, "{}: nothing skipped when off", sc.name);
    assert_eq!(
        on.cycles.len(),
        off.cycles.len(),
        "{}: cycle count",
        sc.name
    );
    for (a, b) in on.cycles.iter().zip(&off.cycles) {
        assert_eq!(a.0, b.0, "{}: cycle times", sc.name);
        assert!(a.1 == b.1, "{}: decisions differ at t={}ms", sc.name, a.0);
        if a.2 != b.2 {
            let d = a.2.iter().zip(&b.2).find(|(x, y)| x != y);
            panic!("{}: explanations differ at t={}ms: {d:#?}", sc.name, a.0);
        }
    }
    assert!(r_on == r_off, "{}: results differ", sc.name);
    (on.skipped, on.scored, off.scored)
}

/// A backlog of gangs of two shapes over three queues and two priorities
/// (so the preempt and reclaim passes run for them too), singles that
/// backfill between them, on 24 nodes of 8 GPUs.
const DEEP: &str = r#"
name: deep queue
queues:
  - {name: a, guaranteed: {gpu: "64"}}
  - {name: b}
  - {name: c, reclaimable: false}
jobs:
  - {name: big, queue: a, count: 60, pods: 4, gang: {}, duration: 20m, duration_max: 40m,
     requests: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "8"}}
  - {name: half, queue: b, count: 60, pods: 2, gang: {}, duration: 10m, duration_max: 30m,
     priority: 10, requests: {cpu: "8", memory: 32Gi, nvidia.com/gpu: "4"}}
  - {name: urgent, queue: b, count: 10, arrival: 30m, every: 7m, pods: 2, gang: {}, duration: 15m,
     priority: 100, requests: {cpu: "8", memory: 32Gi, nvidia.com/gpu: "4"}}
  - {name: single, queue: c, count: 200, every: 20s, duration: 5m, duration_max: 25m,
     requests: {cpu: "4", memory: 16Gi, nvidia.com/gpu: "1"}}
settings:
  until: 6h
"#;

#[test]
fn skipping_equivalent_jobs_changes_no_decision_and_no_explanation() {
    let cluster = "nodes:\n  - name: n\n    count: 24\n    cpu: \"128\"\n    memory: 1Ti\n    rack: r\n    nodes_per_rack: 6\n    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}\n";
    let sc = gpusched_sim::scenario(
        Some(gpusched_sim::Source {
            name: "cluster.yaml",
            text: cluster,
        }),
        Some(gpusched_sim::Source {
            name: "deep.yaml",
            text: DEEP,
        }),
        5,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let (skipped, on, off) = both_ways(&sc);
    assert!(
        skipped > 1_000,
        "the backlog's equivalents were skipped: {skipped}"
    );
    assert!(on < off, "fewer nodes scored: {on} vs {off}");
}

#[test]
fn fixture_runs_are_the_same_both_ways() {
    for (c, w) in common::PAIRS {
        both_ways(&common::scenario(c, w, 5));
    }
    both_ways(&gpusched_sim::default_scenario(5));
}

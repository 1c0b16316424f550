//! Deep queues (issue 27): the scheduler does not try again a job whose
//! equivalent failed earlier in the same cycle with nothing committed
//! since (`SchedulerOptions::skip_equivalent_jobs`). That must be exact:
//! every cycle decides and explains the same with it on and off, and the
//! runs' results are equal byte for byte. And a deep queue's explanations
//! share their lists: one per job, not one per pod.

mod common;

use gpusched_core::{CycleOutput, Decision, Explanation, Scheduler, Snapshot};
use gpusched_sim::{Hooks, Scenario};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

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

/// The deep-queue scenario on 24 nodes of 8 GPUs.
fn deep() -> Scenario {
    let cluster = "nodes:\n  - name: n\n    count: 24\n    cpu: \"128\"\n    memory: 1Ti\n    rack: r\n    nodes_per_rack: 6\n    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}\n";
    gpusched_sim::scenario(
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
    .unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn skipping_equivalent_jobs_changes_no_decision_and_no_explanation() {
    let (skipped, on, off) = both_ways(&deep());
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

/// Per cycle: explanations, distinct reason lists among them, and pairs of
/// members of one gang (next to each other) with equal lists that are not
/// the same list.
#[derive(Default)]
struct Sharing {
    explained: usize,
    lists: usize,
    gang_pairs: usize,
    unshared: usize,
}

impl Hooks for Sharing {
    fn cycle_seen(&mut self, _now_ms: u64, snap: &Snapshot, out: &CycleOutput) {
        let mut lists = BTreeSet::new();
        let mut by_group: BTreeMap<&str, Vec<&Explanation>> = BTreeMap::new();
        for e in &out.explanations {
            lists.insert(Arc::as_ptr(&e.reasons) as *const () as usize);
            if let Some(g) = snap.pods[e.pod as usize].pod.group.as_deref() {
                by_group.entry(g).or_default().push(e);
            }
        }
        self.explained += out.explanations.len();
        self.lists += lists.len();
        for members in by_group.values() {
            for w in members.windows(2) {
                self.gang_pairs += 1;
                if w[0].reasons == w[1].reasons && !Arc::ptr_eq(&w[0].reasons, &w[1].reasons)
                    || w[0].evictions == w[1].evictions
                        && !Arc::ptr_eq(&w[0].evictions, &w[1].evictions)
                {
                    self.unshared += 1;
                }
            }
        }
    }
}

#[test]
fn a_deep_queue_explains_with_one_list_per_job() {
    let mut seen = Sharing::default();
    let r = gpusched_sim::run(&deep(), &mut common::scheduler(), 5, &mut seen);
    common::assert_clean(&r);
    assert!(
        seen.gang_pairs > 10_000,
        "gangs waited: {}",
        seen.gang_pairs
    );
    assert_eq!(
        seen.unshared, 0,
        "equal lists of one gang's pods are shared"
    );
    assert!(
        seen.lists * 2 < seen.explained,
        "{} reason lists for {} explanations",
        seen.lists,
        seen.explained
    );
}

//! Behaviour of the action pipeline on small hand-made clusters.

use gpusched_core::*;
use gpusched_model::*;
use gpusched_testkit::*;

// the tests, by topic (this file: the shared setup, binding with topology,
// shares on one GPU)
mod filters;
mod gangs;
mod nominations;
mod preemption;
mod queues;
mod reasons;

/// The default options, except that a pod may be a victim as soon as it
/// runs (these tests bind and evict a few milliseconds apart; the minimum
/// runtime has its own tests in `evictions.rs`).
fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerOptions {
            min_runtime_ms: 0,
            ..Default::default()
        },
        gpusched_testkit_filters(),
        Box::new(TestBestFit),
    )
}

/// The filters the core tests need (the real ones live in plugins, which
/// depends on core; these are equivalent minimal checks).
fn gpusched_testkit_filters() -> Vec<Box<dyn Filter>> {
    struct Basic;
    impl Filter for Basic {
        fn name(&self) -> &'static str {
            "basic"
        }
        fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
            key.add(&pod.tolerations);
            key.add(&pod.gpu_models);
        }
        fn filter(&self, pod: &Pod, node: &Node) -> FilterResult {
            if node.unschedulable {
                return FilterResult::Reject("node(s) were unschedulable".into());
            }
            if !pod.tolerates_all(node) {
                return FilterResult::Reject("node(s) had untolerated taint(s)".into());
            }
            if !pod.gpu.is_none() && !node.gpus.iter().any(|g| pod.allows_model(&g.model)) {
                return FilterResult::Reject("node(s) didn't have the requested GPU model".into());
            }
            FilterResult::Pass
        }
    }
    vec![Box::new(Basic)]
}

fn run(s: &mut Scheduler, snap: &Snapshot, now: u64) -> CycleOutput {
    let out = s.cycle(snap, now, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    out
}

#[test]
fn binds_with_topology_and_no_overcommit() {
    let snap = snapshot(
        vec![
            node("a").gpus(4).pcie(2).build(),
            node("b").gpus(8).nvswitch().build(),
        ],
        vec![queue("default")],
        vec![],
        vec![
            pod("p1").gpus(2).build(),
            pod("p2").gpus(2).build(),
            pod("p3").gpus(8).build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 3, "{b:?}");
    assert_eq!(b["p3"].0, "b");
    // the two 2-GPU pods fill node a, one PCIe switch each
    let mut sets: Vec<_> = ["p1", "p2"].iter().map(|p| b[*p].1.clone()).collect();
    sets.sort_by_key(|g| format!("{g:?}"));
    assert_eq!(
        sets,
        vec![
            GpuAssignment::Whole(vec![0, 1]),
            GpuAssignment::Whole(vec![2, 3])
        ]
    );
}

#[test]
fn shares_pack_onto_one_gpu() {
    let snap = snapshot(
        vec![node("a").gpus(2).build()],
        vec![queue("default")],
        vec![],
        vec![
            pod("s1").share(500).build(),
            pod("s2").share(300).build(),
            pod("s3").share(400).build(),
        ],
    );
    let out = run(&mut sched(), &snap, 0);
    let b = binds(&snap, &out);
    assert_eq!(b.len(), 3);
    let gpu_of = |n: &str| match b[n].1 {
        GpuAssignment::Share { gpu, .. } => gpu,
        _ => panic!("not a share"),
    };
    assert_eq!(gpu_of("s1"), gpu_of("s2"), "best fit stacks 0.5 + 0.3");
    assert_ne!(gpu_of("s1"), gpu_of("s3"));
}

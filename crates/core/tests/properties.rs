//! Invariants over random clusters and workloads.

use gpusched_core::*;
use gpusched_testkit::strategies::workload;
use gpusched_testkit::*;
use proptest::prelude::*;

const MIN_RUNTIME: u64 = 150;

fn sched() -> Scheduler {
    Scheduler::new(
        SchedulerOptions {
            reserve_after_ms: 50,
            // rounds are 100 ms apart: pods bound in the first two rounds
            // are protected for a round or two, then may be victims
            min_runtime_ms: MIN_RUNTIME,
            ..Default::default()
        },
        vec![],
        Box::new(TestBestFit),
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, .. ProptestConfig::default() })]

    /// Several cycles of a random workload: no overcommit, no partial gang,
    /// explanations for every pending pod, quotas and preemption rules kept.
    #[test]
    fn cycles_keep_invariants((snap, seed) in workload()) {
        let mut s = sched();
        let mut snap = snap;
        for round in 0..4u64 {
            let out = s.cycle(&snap, round * 100, seed);
            let v = check_invariants(&snap, &out);
            prop_assert!(v.is_empty(), "round {round}: {v:?}");
            // preemption only of lower priority in the same queue, or reclaim across queues
            for d in &out.decisions {
                if let Decision::Evict { pod, reason } = d {
                    let victim = &snap.pods[*pod as usize].pod;
                    prop_assert!(victim.preemptible);
                    // no preemption or reclaim victim before its minimum runtime
                    if reason.kind() != EvictionKind::Consolidate
                        && let PodPhase::Running { since_ms, .. } = snap.pods[*pod as usize].phase
                    {
                        prop_assert!(round * 100 - since_ms >= MIN_RUNTIME,
                            "{} evicted {} ms after its start", victim.name, round * 100 - since_ms);
                    }
                    prop_assert!(!reason.to_string().is_empty());
                    if reason.kind() == EvictionKind::Preempt {
                        // some nominated preemptor in the same queue has higher priority
                        let ok = out.decisions.iter().any(|x| matches!(x, Decision::Nominate { pod: p, .. }
                            if snap.pods[*p as usize].pod.queue == victim.queue
                            && (snap.pods[*p as usize].pod.priority > victim.priority
                                || snap.groups.iter().any(|g| Some(&g.name) == snap.pods[*p as usize].pod.group.as_ref() && g.priority > victim.priority))));
                        prop_assert!(ok, "eviction of {} without a higher-priority preemptor", victim.name);
                    }
                }
            }
            // limits: queue c is capped at 6 GPUs
            apply(&mut snap, &out, round * 100);
            let used_c: u64 = snap.pods.iter().filter(|p| p.holding().is_some() && p.pod.queue == "c").map(|p| p.pod.demand().gpu_milli).sum();
            prop_assert!(used_c <= 6000, "queue c over its limit: {used_c}");
        }
    }

    /// Identical input and seed give identical output.
    #[test]
    fn deterministic((snap, seed) in workload()) {
        let a = sched().cycle(&snap, 1000, seed);
        let b = sched().cycle(&snap, 1000, seed);
        prop_assert_eq!(a, b);
    }
}

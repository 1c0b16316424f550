//! Conservation (no GPU overcommitted, checked against `ClusterState`
//! after every cycle and event) and gang atomicity, on every fixture.

mod common;

#[test]
fn no_overcommit_and_no_partial_gang_on_any_fixture() {
    for (c, w) in common::PAIRS {
        // the big default scenario once, the small ones with two seeds
        let seeds: &[u64] = if *c == "mixed.yaml" { &[1] } else { &[1, 2] };
        for &seed in seeds {
            let r = common::run_verified(common::scenario(c, w, seed), seed);
            assert_eq!(
                r.totals.sim_errors, 0,
                "{c} + {w} (seed {seed}): {:#?}",
                r.errors
            );
            assert_eq!(r.totals.gangs_started_partially, 0, "{c} + {w}");
        }
    }
}

#[test]
fn allocation_never_exceeds_capacity() {
    let r = common::run_verified(gpusched_sim::default_scenario(5), 5);
    for (i, (&a, &used)) in r
        .series
        .alloc_pct
        .iter()
        .zip(&r.series.used_gpus)
        .enumerate()
    {
        assert!(a <= 100.0 + 1e-9, "bucket {i}: allocation {a}%");
        assert!(used <= r.gpus as f64, "bucket {i}: {used} GPUs used");
    }
    for (n, row) in r.heatmap.cells.iter().enumerate() {
        for v in row {
            assert!(*v <= 1.0 + 1e-9, "node {n}: occupancy {v}");
        }
    }
}

#[test]
fn gangs_start_whole() {
    let r = common::run_verified(common::scenario("dgx-h100.yaml", "gang-failure.yaml", 1), 1);
    common::assert_clean(&r);
    assert!(
        r.totals.gang_starts >= 1,
        "the gang started: {:#?}",
        r.totals
    );
}

//! Tests of [`super`] (the module's own file stays the code).

use super::*;
use gpusched_model::spec::{ClusterSpec, GpuLayoutSpec, Interconnect, NodeGroupSpec};

/// Two nodes of 4 L40S GPUs on PCIe (2 switches): the cluster of the
/// state's tests and the statement's (`crate::statement`).
pub(crate) fn nodes() -> Vec<Node> {
    ClusterSpec {
        nodes: vec![NodeGroupSpec {
            name: "n".into(),
            count: 2,
            cpu: "16".into(),
            memory: "64Gi".into(),
            gpus: Some(GpuLayoutSpec {
                count: 4,
                model: "L40S".into(),
                memory: "48Gi".into(),
                interconnect: Interconnect::Pcie,
                pcie_switches: 2,
                numa_nodes: 1,
                devices: vec![],
            }),
            ..Default::default()
        }],
    }
    .nodes()
    .unwrap()
}

#[test]
fn models_are_interned_in_node_order() {
    let mut ns = nodes();
    ns.extend(nodes());
    for g in &mut ns[1].gpus {
        g.model = "H100".into();
    }
    ns[2].gpus.clear();
    let cs = ClusterState::new(&ns);
    assert_eq!(cs.model_names(), ["L40S", "H100", ""]);
    let idx: Vec<usize> = (0..4).map(|n| cs.model_index(n)).collect();
    assert_eq!(idx, [0, 1, 2, 0]);
    // a clone reads the same table
    assert_eq!(cs.clone().model_index(1), 1);
}

#[test]
fn free_gpu_per_model_follows_assign_and_release() {
    let mut ns = nodes();
    for g in &mut ns[1].gpus {
        g.model = "H100".into();
    }
    let mut cs = ClusterState::new(&ns);
    let sums = |cs: &ClusterState<'_>| {
        let mut v = vec![0u64; cs.model_names().len()];
        for (i, st) in cs.states().iter().enumerate() {
            v[cs.model_index(i as NodeId)] += st.free.gpu_milli;
        }
        v
    };
    assert_eq!(cs.free_gpu_milli_by_model(), [4000, 4000]);
    let req = ResourceVec {
        cpu_milli: 1000,
        ..Default::default()
    };
    let share = GpuAssignment::Share {
        gpu: 2,
        milli: 300,
        memory_mib: 0,
    };
    cs.assign(1, &req, &GpuAssignment::Whole(vec![0, 1]))
        .unwrap();
    cs.assign(1, &req, &share).unwrap();
    cs.assign(0, &req, &share).unwrap();
    // a refused assignment changes nothing
    assert!(cs.assign(1, &req, &GpuAssignment::Whole(vec![0])).is_err());
    assert_eq!(cs.free_gpu_milli_by_model(), [3700, 1700]);
    assert_eq!(cs.free_gpu_milli_by_model(), sums(&cs));
    cs.release(1, &req, &GpuAssignment::Whole(vec![0, 1]));
    cs.release(0, &req, &share);
    assert_eq!(cs.free_gpu_milli_by_model(), [4000, 3700]);
    assert_eq!(cs.free_gpu_milli_by_model(), sums(&cs));
}

#[test]
fn assign_release_round_trip_and_no_overcommit() {
    let ns = nodes();
    let mut cs = ClusterState::new(&ns);
    let before = cs.get(0).clone();
    let req = ResourceVec::new(4000, 1 << 30, 0);
    cs.assign(0, &req, &GpuAssignment::Whole(vec![0, 1]))
        .unwrap();
    assert_eq!(cs.get(0).free.gpu_milli, 2000);
    assert!(cs.assign(0, &req, &GpuAssignment::Whole(vec![1])).is_err());
    assert!(
        cs.assign(0, &req, &GpuAssignment::Whole(vec![2, 2]))
            .is_err()
    );
    assert!(cs.assign(0, &req, &GpuAssignment::Whole(vec![9])).is_err());
    cs.assign(
        0,
        &req,
        &GpuAssignment::Share {
            gpu: 2,
            milli: 600,
            memory_mib: 1000,
        },
    )
    .unwrap();
    assert!(
        cs.assign(
            0,
            &req,
            &GpuAssignment::Share {
                gpu: 2,
                milli: 500,
                memory_mib: 0
            }
        )
        .is_err()
    );
    assert!(
        cs.assign(0, &ResourceVec::new(100_000, 0, 0), &GpuAssignment::None)
            .is_err()
    );
    cs.release(
        0,
        &req,
        &GpuAssignment::Share {
            gpu: 2,
            milli: 600,
            memory_mib: 1000,
        },
    );
    cs.release(0, &req, &GpuAssignment::Whole(vec![0, 1]));
    let after = cs.get(0);
    assert_eq!(after.free, before.free);
    assert_eq!(after.gpu_free_milli, before.gpu_free_milli);
    assert!(after.version > before.version);
}

#[test]
fn default_choice_uses_topology_and_best_fit() {
    let ns = nodes();
    let mut cs = ClusterState::new(&ns);
    let mut p = Pod::new("a", "q");
    p.gpu = GpuRequest::Whole(2);
    assert_eq!(
        cs.default_gpu_choice(&p, 0),
        Some(GpuAssignment::Whole(vec![0, 1]))
    );
    cs.assign(
        0,
        &ResourceVec::default(),
        &GpuAssignment::Share {
            gpu: 3,
            milli: 500,
            memory_mib: 0,
        },
    )
    .unwrap();
    p.gpu = GpuRequest::Share {
        milli: 400,
        memory_mib: 0,
    };
    assert_eq!(
        cs.default_gpu_choice(&p, 0),
        Some(GpuAssignment::Share {
            gpu: 3,
            milli: 400,
            memory_mib: 0
        })
    );
    p.gpu = GpuRequest::Share {
        milli: 0,
        memory_mib: 24576,
    };
    assert_eq!(
        cs.default_gpu_choice(&p, 0),
        Some(GpuAssignment::Share {
            gpu: 3,
            milli: 500,
            memory_mib: 24576
        })
    );
    p.gpu = GpuRequest::Whole(4);
    assert_eq!(cs.default_gpu_choice(&p, 0), None);
    p.gpu_models = vec!["H100".into()];
    p.gpu = GpuRequest::Whole(1);
    assert_eq!(cs.default_gpu_choice(&p, 1), None);
}

/// A100 node: GPU 0 cut 7×1g.10gb, GPU 1 cut 2×3g.40gb, GPUs 2–3 whole
/// (`migStrategy: mixed`).
pub(crate) fn mig_node() -> Node {
    let mut n = nodes().remove(0);
    let slot = |g: u32, k: u32, p: &str, milli: u32| gpusched_model::MigSlot {
        id: format!("MIG-{g}-{k}"),
        profile: p.into(),
        resource: format!("nvidia.com/mig-{p}"),
        milli,
    };
    n.gpus[0].mig = (0..7).map(|k| slot(0, k, "1g.10gb", 142)).collect();
    n.gpus[1].mig = (0..2).map(|k| slot(1, k, "3g.40gb", 428)).collect();
    n.sync_gpu_allocatable();
    n
}

fn mig_pod(profile: &str, count: u32, milli: u32) -> Pod {
    let mut p = Pod::new("ml/m", "q");
    p.mig = Some(Box::new(gpusched_model::MigAsk {
        resource: format!("nvidia.com/mig-{profile}"),
        profile: profile.into(),
        count,
    }));
    p.gpu = GpuRequest::Share {
        milli: count * milli,
        memory_mib: 0,
    };
    p
}

#[test]
fn mig_instances_are_placed_by_profile_never_by_milli() {
    let nodes = vec![mig_node()];
    let mut cs = ClusterState::new(&nodes);
    // every GPU counts 1000 once, in MIG mode or not
    assert_eq!(cs.get(0).gpu_capacity_milli(), 4000);
    assert_eq!(cs.gpu_milli_totals(), (4000, 0));
    // whole GPUs and shares never land on a GPU in MIG mode
    let mut whole = Pod::new("ml/w", "q");
    whole.gpu = GpuRequest::Whole(1);
    assert_eq!(cs.free_whole_gpus(&whole, 0), vec![2, 3]);
    let mut share = Pod::new("ml/s", "q");
    share.gpu = GpuRequest::Share {
        milli: 100,
        memory_mib: 0,
    };
    let on: Vec<usize> = cs.share_candidates(&share, 0).iter().map(|c| c.0).collect();
    assert_eq!(on, vec![2, 3]);
    // seven 1g pods fill GPU 0 exactly; the eighth does not fit, though
    // GPU 1 (3g instances) has 1000 milli free
    let one = mig_pod("1g.10gb", 1, 142);
    for k in 0..7u32 {
        let a = cs.mig_choice(&one, 0).unwrap();
        assert_eq!(
            a,
            GpuAssignment::Mig {
                gpu: 0,
                instances: vec![k],
                milli: 142
            }
        );
        cs.assign(0, &one.requests, &a).unwrap();
    }
    assert_eq!(cs.mig_choice(&one, 0), None);
    assert_eq!(cs.default_gpu_choice(&one, 0), None);
    assert_eq!(cs.get(0).mig_free_milli[1], 1000);
    assert_eq!(cs.gpu_milli_totals(), (4000, 994));
    // a 2×3g pod takes both instances of GPU 1; a third 3g does not fit
    let two = mig_pod("3g.40gb", 2, 428);
    let a = cs.mig_choice(&two, 0).unwrap();
    assert_eq!(
        a,
        GpuAssignment::Mig {
            gpu: 1,
            instances: vec![0, 1],
            milli: 856
        }
    );
    cs.assign(0, &two.requests, &a).unwrap();
    assert_eq!(cs.mig_choice(&mig_pod("3g.40gb", 1, 428), 0), None);
    // whole GPUs are untouched by all this
    assert_eq!(cs.free_whole_gpus(&whole, 0), vec![2, 3]);
    // an instance in use is refused, freed ones come back
    let again = GpuAssignment::Mig {
        gpu: 0,
        instances: vec![3],
        milli: 142,
    };
    assert!(matches!(
        cs.assign(0, &one.requests, &again),
        Err(StateError::Insufficient { .. })
    ));
    cs.release(0, &one.requests, &again);
    assert_eq!(cs.mig_choice(&one, 0), Some(again.clone()));
    // a wrong measure or a GPU not in MIG mode is refused
    let wrong = GpuAssignment::Mig {
        gpu: 0,
        instances: vec![3],
        milli: 428,
    };
    assert!(cs.assign(0, &one.requests, &wrong).is_err());
    let not_mig = GpuAssignment::Mig {
        gpu: 2,
        instances: vec![0],
        milli: 142,
    };
    assert!(matches!(
        cs.assign(0, &one.requests, &not_mig),
        Err(StateError::BadGpu { .. })
    ));
    cs.assign(0, &one.requests, &again).unwrap();
    assert_eq!(cs.gpu_milli_totals(), (4000, 994 + 856));
}

#[test]
fn a_mig_gpu_of_several_profiles_gives_each_its_own_instances() {
    // 3g + 2g + 1g + 1g on one GPU: 1g asks get the two 1g instances
    let mut n = mig_node();
    let slot = |k: u32, p: &str, milli: u32| gpusched_model::MigSlot {
        id: format!("MIG-x-{k}"),
        profile: p.into(),
        resource: format!("nvidia.com/mig-{p}"),
        milli,
    };
    n.gpus[0].mig = vec![
        slot(0, "3g.40gb", 428),
        slot(1, "2g.20gb", 285),
        slot(2, "1g.10gb", 142),
        slot(3, "1g.10gb", 142),
    ];
    n.gpus[1].mig.clear();
    let nodes = vec![n];
    let mut cs = ClusterState::new(&nodes);
    let one = mig_pod("1g.10gb", 2, 142);
    let a = cs.mig_choice(&one, 0).unwrap();
    assert_eq!(
        a,
        GpuAssignment::Mig {
            gpu: 0,
            instances: vec![2, 3],
            milli: 284
        }
    );
    cs.assign(0, &one.requests, &a).unwrap();
    assert_eq!(cs.mig_choice(&mig_pod("1g.10gb", 1, 142), 0), None);
    let three = mig_pod("3g.40gb", 1, 428);
    assert_eq!(
        cs.mig_choice(&three, 0),
        Some(GpuAssignment::Mig {
            gpu: 0,
            instances: vec![0],
            milli: 428
        })
    );
    // an unhealthy GPU gives nothing
    let mut sick = nodes.clone();
    sick[0].gpus[0].health = gpusched_model::GpuHealth::Unhealthy;
    let cs = ClusterState::new(&sick);
    assert_eq!(cs.mig_choice(&three, 0), None);
    assert_eq!(cs.get(0).gpu_capacity_milli(), 3000);
}

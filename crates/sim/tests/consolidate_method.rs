//! Consolidation in the FGD evaluation method: the core's planner moves
//! placed pods so that a pod that fits no node is placed, within the move
//! budget.

use gpusched_core::{ClusterState, GpuAssignment, PackEnv, PodPhase, PodState, Snapshot};
use gpusched_model::{GpuRequest, Pod};
use gpusched_plugins::packing::{self, PackerOptions};
use gpusched_sim::eval::consolidate_method::Mover;
use gpusched_sim::eval::fgd_method::{self, FgdMethod};
use gpusched_sim::openb::{parse_nodes, parse_pods};

fn gpus(name: &str, k: u32) -> Pod {
    let mut p = Pod::new(name, "default");
    p.gpu = GpuRequest::Whole(k);
    p
}

/// A placed pod: the pod, its node, its GPUs.
type Placed = (Pod, u32, Vec<u32>);

/// Two 4-GPU nodes: `x` (2 GPUs) and `m` (1 GPU) on the first, `y` (3 GPUs)
/// on the second; one GPU free on each.
fn fragmented(budget: u32) -> (Vec<gpusched_model::Node>, Vec<Placed>, Mover) {
    let nodes = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\na,32000,131072,4,T4\nb,32000,131072,4,T4\n",
    )
    .unwrap();
    let placed = vec![
        (gpus("x", 2), 0, vec![0, 1]),
        (gpus("m", 1), 0, vec![2]),
        (gpus("y", 3), 1, vec![0, 1, 2]),
    ];
    (nodes, placed, Mover::new(budget, 2))
}

fn setup<'n>(
    nodes: &'n [gpusched_model::Node],
    placed: &[Placed],
    mover: &mut Mover,
) -> (ClusterState<'n>, Snapshot) {
    let mut cs = ClusterState::new(nodes);
    let mut snap = Snapshot {
        nodes: nodes.to_vec(),
        ..Default::default()
    };
    for (p, n, g) in placed {
        let gpus = GpuAssignment::Whole(g.clone());
        cs.assign(*n, &p.requests, &gpus).unwrap();
        snap.pods.push(PodState {
            pod: p.clone().into(),
            phase: PodPhase::Running {
                node: *n,
                gpus,
                since_ms: 0,
            },
        });
        mover.placed(*n, snap.pods.len() - 1);
    }
    (cs, snap)
}

#[test]
fn a_pod_that_fits_no_node_is_placed_after_one_move() {
    let (nodes, placed, mut mover) = fragmented(100);
    let (mut cs, mut snap) = setup(&nodes, &placed, &mut mover);
    let mut packer = packing::by_name("best-fit", &PackerOptions::default()).unwrap();
    packer.prepare(&PackEnv {
        snapshot: &snap,
        state: &cs,
        seed: 1,
        pods_changed: None,
    });
    let q = gpus("q", 2);
    let took = mover.try_place(&q, &mut cs, &mut snap, &*packer, 3);
    assert_eq!(took, Some(2000));
    assert_eq!(mover.moves, 1);
    // m moved to the second node, q took its place
    let node_of = |name: &str| {
        snap.pods
            .iter()
            .find(|p| p.pod.name == name)
            .and_then(|p| p.holding().map(|(n, _)| n))
    };
    assert_eq!(node_of("m"), Some(1));
    assert_eq!(node_of("q"), Some(0));
    assert_eq!(node_of("x"), Some(0), "x did not move");
    // the state and the snapshot agree, nothing double-booked
    let (fresh, errors) = ClusterState::from_snapshot(&snap);
    assert!(errors.is_empty(), "{errors:?}");
    for n in 0..2 {
        assert_eq!(fresh.get(n).free, cs.get(n).free);
    }
}

#[test]
fn nothing_moves_without_budget() {
    for (budget, placed_so_far) in [(0, 3), (10, 3)] {
        let (nodes, placed, mut mover) = fragmented(budget);
        let (mut cs, mut snap) = setup(&nodes, &placed, &mut mover);
        let packer = packing::by_name("best-fit", &PackerOptions::default()).unwrap();
        let before = snap.clone();
        let q = gpus("q", 2);
        assert_eq!(
            mover.try_place(&q, &mut cs, &mut snap, &*packer, placed_so_far),
            None
        );
        assert_eq!(mover.moves, 0);
        assert_eq!(snap, before, "budget {budget}: nothing changed");
    }
}

#[test]
fn the_method_counts_moves_within_the_budget() {
    let nodes = parse_nodes(
        "n.csv",
        "sn,cpu_milli,memory_mib,gpu,model\n\
         a,32000,131072,4,T4\nb,32000,131072,4,T4\nc,64000,262144,8,V100M32\n",
    )
    .unwrap();
    let pods: Vec<Pod> = parse_pods(
        "p.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         p0,4000,8192,1,1000,\np1,2000,4096,1,500,\np2,2000,4096,1,250,\n\
         p3,8000,8192,2,1000,\np4,1000,1024,0,0,\np5,4000,4096,4,1000,\n",
    )
    .unwrap()
    .into_iter()
    .map(|t| t.pod)
    .collect();
    let seeds: Vec<u64> = (1..=6).collect();
    let off = fgd_method::run(&FgdMethod::default(), &nodes, &pods, "best-fit", &seeds).unwrap();
    let on = fgd_method::run(
        &FgdMethod {
            move_budget: 50,
            ..Default::default()
        },
        &nodes,
        &pods,
        "best-fit",
        &seeds,
    )
    .unwrap();
    assert!(off.runs.iter().all(|r| r.moves == 0));
    for r in &on.runs {
        assert!(
            r.moves * 100 <= 50 * r.placed as u64,
            "seed {}: {} moves for {} placed",
            r.seed,
            r.moves,
            r.placed
        );
        assert_eq!(r.placed + r.skipped, r.pods);
    }
    // same seeds, same moves and curves
    let again = fgd_method::run(
        &FgdMethod {
            move_budget: 50,
            threads: 1,
            ..Default::default()
        },
        &nodes,
        &pods,
        "best-fit",
        &seeds,
    )
    .unwrap();
    assert_eq!(on, again);
}

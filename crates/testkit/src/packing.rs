//! Small hand-made clusters and helpers for packing-policy unit tests
//! (used by `gpusched-plugins`; import with `use gpusched_testkit::packing::*`).

use gpusched_core::{ClusterState, GpuAssignment, NodeId, PackEnv, Packer, Snapshot};
use gpusched_model::topology::shapes;
use gpusched_model::{Gpu, GpuHealth, GpuRequest, Node, Pod, ResourceVec};

/// A PCIe node with `gpus` GPUs of `model` (two per switch).
pub fn node(name: &str, gpus: usize, cpu_milli: u64, model: &str) -> Node {
    let topos = shapes::pcie(gpus, gpus.div_ceil(2).max(1), 1);
    let g = topos
        .into_iter()
        .enumerate()
        .map(|(i, topo)| Gpu {
            index: i as u32,
            uuid: format!("{name}-gpu-{i}"),
            model: model.to_string(),
            memory_mib: 16 * 1024,
            health: GpuHealth::Healthy,
            topo,
            mig: Vec::new(),
        })
        .collect();
    Node::new(name, ResourceVec::new(cpu_milli, 256 << 30, 0), g)
}

/// A pod named `p` in queue `q` asking `cpu_milli` and 1 GiB, with `gpu`.
pub fn pod(cpu_milli: u64, gpu: GpuRequest) -> Pod {
    let mut p = Pod::new("p", "q");
    p.requests = ResourceVec::new(cpu_milli, 1 << 30, 0);
    p.gpu = gpu;
    p
}

/// A share of one GPU with no memory request.
pub fn share(milli: u32) -> GpuRequest {
    GpuRequest::Share {
        milli,
        memory_mib: 0,
    }
}

/// Takes `milli` of GPU `gpu` on `node` (and `cpu` millicores).
pub fn take(cs: &mut ClusterState<'_>, node: NodeId, gpu: u32, milli: u32, cpu: u64) {
    let g = if milli == 1000 {
        GpuAssignment::Whole(vec![gpu])
    } else {
        GpuAssignment::Share {
            gpu,
            milli,
            memory_mib: 0,
        }
    };
    cs.assign(node, &ResourceVec::new(cpu, 0, 0), &g).unwrap();
}

/// Runs `prepare` against a snapshot holding only `nodes`.
pub fn prepare(p: &mut dyn Packer, snap: &Snapshot, cs: &ClusterState<'_>, seed: u64) {
    p.prepare(&PackEnv {
        snapshot: snap,
        state: cs,
        seed,
        pods_changed: None,
    });
}

/// The node with the best score (ties: lowest id) and its placement.
pub fn pick(
    p: &dyn Packer,
    pod: &Pod,
    cs: &ClusterState<'_>,
) -> Option<(NodeId, gpusched_core::Placement)> {
    let mut best: Option<(NodeId, gpusched_core::Placement)> = None;
    for n in 0..cs.len() as NodeId {
        if !cs.fits_non_gpu(pod, n) {
            continue;
        }
        if let Some(pl) = p.place(pod, n, cs)
            && best.as_ref().is_none_or(|(_, b)| pl.score > b.score)
        {
            best = Some((n, pl));
        }
    }
    best
}

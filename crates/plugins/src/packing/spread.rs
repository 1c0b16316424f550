//! `spread`: put the pod where most stays free.
//!
//! Score = `gpu_left · 10⁶ + cpu_left_ppm`, where `gpu_left` is the node's
//! free GPU milli after placing and `cpu_left_ppm` its free CPU after placing
//! in parts per million of its allocatable CPU. Shares go on the GPU with
//! the most compute left (worst fit); whole GPUs take the topology choice.

use super::names::PolicyName;
use super::scored::ScoredPacker;
use super::util::{cpu_left_after, gpu_left_after, share_worst_fit};
use gpusched_core::{ClusterState, NodeId, Packer};
use gpusched_model::Pod;

/// Least-allocated placement.
pub fn packer() -> impl Packer {
    ScoredPacker::new(PolicyName::Spread, share_worst_fit, left_score)
}

/// `gpu_left · 10⁶ + cpu_left_ppm` after placing (shared with `binpack`).
pub(crate) fn left_score(
    state: &ClusterState<'_>,
    pod: &Pod,
    node: NodeId,
    gpus: &gpusched_core::GpuAssignment,
) -> i64 {
    let cap = state.node(node).allocatable.cpu_milli.max(1);
    let cpu_ppm = (cpu_left_after(state, pod, node) as u128 * 1_000_000 / cap as u128) as i64;
    gpu_left_after(state, node, gpus) as i64 * 1_000_000 + cpu_ppm
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::GpuAssignment;
    use gpusched_model::GpuRequest;
    use gpusched_testkit::packing::*;

    #[test]
    fn prefers_the_emptiest_node_and_gpu() {
        let nodes = vec![node("a", 4, 32_000, "T4"), node("b", 4, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 0, 0, 1000, 0);
        take(&mut cs, 1, 1, 300, 0);
        let p = packer();
        let (n, pl) = pick(&p, &pod(1000, share(200)), &cs).unwrap();
        assert_eq!(n, 1);
        // worst fit: a completely free GPU, the lowest position
        assert_eq!(
            pl.gpus,
            GpuAssignment::Share {
                gpu: 0,
                milli: 200,
                memory_mib: 0
            }
        );
        let (n, _) = pick(&p, &pod(1000, GpuRequest::Whole(3)), &cs).unwrap();
        assert_eq!(n, 1);
        // CPU-only pods follow free CPU when GPUs tie
        let (n, _) = pick(&p, &pod(1000, GpuRequest::None), &cs).unwrap();
        assert_eq!(n, 1);
    }
}

//! `binpack`: put the pod where least stays free.
//!
//! Score = `-(gpu_left · 10⁶ + cpu_left_ppm)` (see [`super::spread`]).
//! Shares go on the GPU with the least compute left (best fit); whole GPUs
//! take the topology choice.

use super::names::PolicyName;
use super::scored::ScoredPacker;
use super::spread::left_score;
use super::util::share_best_fit;
use gpusched_core::Packer;

/// Most-allocated placement.
pub fn packer() -> impl Packer {
    ScoredPacker::new(
        PolicyName::Binpack,
        share_best_fit,
        |state, pod, node, gpus| -left_score(state, pod, node, gpus),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::ClusterState;
    use gpusched_core::GpuAssignment;
    use gpusched_model::GpuRequest;
    use gpusched_testkit::packing::*;

    #[test]
    fn prefers_the_fullest_node_and_gpu() {
        let nodes = vec![node("a", 4, 32_000, "T4"), node("b", 4, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 2, 300, 0);
        take(&mut cs, 1, 3, 600, 0);
        let p = packer();
        let (n, pl) = pick(&p, &pod(1000, share(300)), &cs).unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            pl.gpus,
            GpuAssignment::Share {
                gpu: 3,
                milli: 300,
                memory_mib: 0
            }
        );
        // too big for the used GPUs: still the fuller node
        let (n, _) = pick(&p, &pod(1000, share(800)), &cs).unwrap();
        assert_eq!(n, 1);
        // whole GPUs: two free on node b, topology keeps the pair on one switch
        let (n, pl) = pick(&p, &pod(1000, GpuRequest::Whole(2)), &cs).unwrap();
        assert_eq!(n, 1);
        assert_eq!(pl.gpus, GpuAssignment::Whole(vec![0, 1]));
    }
}

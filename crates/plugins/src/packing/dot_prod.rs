//! `dot-prod`: the Tetris-style dot-product baseline of the FGD paper
//! ("DotProd": merged GPU dimension, normalised by the largest node spec).
//!
//! With `C = 128000` milli-CPU and `G = 8000` milli-GPU as the normalisers,
//! free vector `f = (cpu_free/C, gpu_free/G)` of the node before placing and
//! request `r = (cpu/C, gpu/G)`:
//! `score = ⌊100 · (1 − (f·r)/2)⌋` — a node whose free capacity lines up
//! less with the request scores higher, i.e. the pod goes where it uses up
//! the least of the free resources relative to their size. Shares go on
//! the best-fit GPU, whole GPUs on the topology choice (the reference uses
//! best fit too).

use super::names::PolicyName;
use super::scored::ScoredPacker;
use super::util::share_best_fit;
use gpusched_core::Packer;

pub(crate) const MAX_SPEC_CPU: f64 = 128_000.0;
pub(crate) const MAX_SPEC_GPU: f64 = 8_000.0;

/// Dot-product (Tetris) placement.
pub fn packer() -> impl Packer {
    ScoredPacker::new(
        PolicyName::DotProd,
        share_best_fit,
        |state, pod, node, gpus| {
            let free = &state.get(node).free;
            dot_prod_score(
                free.cpu_milli,
                free.gpu_milli,
                pod.requests.cpu_milli,
                gpus.milli(),
            )
        },
    )
}

/// The reference score for free `(cpu, gpu)` and request `(cpu, gpu)`.
pub fn dot_prod_score(cpu_free: u64, gpu_free: u64, cpu_req: u64, gpu_req: u64) -> i64 {
    let dot = (cpu_free as f64 / MAX_SPEC_CPU) * (cpu_req as f64 / MAX_SPEC_CPU)
        + (gpu_free as f64 / MAX_SPEC_GPU) * (gpu_req as f64 / MAX_SPEC_GPU);
    (100.0 * (1.0 - dot / 2.0)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::ClusterState;
    use gpusched_model::GpuRequest;
    use gpusched_testkit::packing::*;

    #[test]
    fn formula() {
        // empty 8-GPU 128-core node, 8-GPU 128-core pod: dot = 2 -> 0
        assert_eq!(dot_prod_score(128_000, 8000, 128_000, 8000), 0);
        assert_eq!(dot_prod_score(64_000, 4000, 0, 0), 100);
        assert_eq!(dot_prod_score(128_000, 8000, 0, 4000), 75);
    }

    #[test]
    fn prefers_the_node_with_less_free_capacity() {
        let nodes = vec![node("big", 8, 96_000, "G2"), node("small", 2, 16_000, "G2")];
        let cs = ClusterState::new(&nodes);
        let p = packer();
        let (n, _) = pick(&p, &pod(8000, GpuRequest::Whole(1)), &cs).unwrap();
        assert_eq!(n, 1);
    }
}

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

use super::util::{WholeChooser, share_best_fit};
use gpusched_core::{ClusterState, NodeId, Packer, Placement};
use gpusched_model::Pod;

pub(crate) const MAX_SPEC_CPU: f64 = 128_000.0;
pub(crate) const MAX_SPEC_GPU: f64 = 8_000.0;

/// Dot-product (Tetris) placement.
#[derive(Default)]
pub struct DotProdPacker {
    whole: WholeChooser,
}

impl DotProdPacker {
    /// The policy (stateless).
    pub fn new() -> Self {
        Self::default()
    }
}

/// The reference score for free `(cpu, gpu)` and request `(cpu, gpu)`.
pub fn dot_prod_score(cpu_free: u64, gpu_free: u64, cpu_req: u64, gpu_req: u64) -> i64 {
    let dot = (cpu_free as f64 / MAX_SPEC_CPU) * (cpu_req as f64 / MAX_SPEC_CPU)
        + (gpu_free as f64 / MAX_SPEC_GPU) * (gpu_req as f64 / MAX_SPEC_GPU);
    (100.0 * (1.0 - dot / 2.0)) as i64
}

impl Packer for DotProdPacker {
    fn name(&self) -> &'static str {
        super::PolicyName::DotProd.as_str()
    }

    /// `place` reads the pod and the node's state only.
    fn generation(&self) -> Option<u64> {
        Some(0)
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let gpus = self
            .whole
            .assignment(state, pod, node, || share_best_fit(state, pod, node))?;
        let free = &state.get(node).free;
        Some(Placement {
            score: dot_prod_score(
                free.cpu_milli,
                free.gpu_milli,
                pod.requests.cpu_milli,
                gpus.milli(),
            )
            .into(),
            gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let p = DotProdPacker::new();
        let (n, _) = pick(&p, &pod(8000, GpuRequest::Whole(1)), &cs).unwrap();
        assert_eq!(n, 1);
    }
}

//! `gpu-packing`: the FGD paper's "GpuPacking" baseline.
//!
//! Three tiers, highest first (integer scores as in the reference):
//! 1. the pod fits on GPUs already in use: `max(100 − Σ⌊free%⌋/10, 50)`
//!    over the GPUs chosen (best fit; `free%` = free milli / 10);
//! 2. it needs `u > 0` completely free GPUs of a node that is in use:
//!    `max(50 − u, 33)`;
//! 3. the node is entirely free: `max(33 − n, n)` for its `n` free GPUs.
//!
//! CPU-only pods score 0 everywhere (the framework's tie-break decides).

use super::names::PolicyName;
use super::scored::ScoredPacker;
use super::util::share_best_fit;
use gpusched_core::{ClusterState, GpuAssignment, NodeId, Packer};
use gpusched_model::GPU_MILLI;

/// GPU packing placement.
pub fn packer() -> impl Packer {
    ScoredPacker::new(
        PolicyName::GpuPacking,
        share_best_fit,
        |state, _, node, gpus| gpu_packing_score(state, node, gpus),
    )
}

/// The reference score of putting `gpus` on `node`.
pub fn gpu_packing_score(state: &ClusterState<'_>, node: NodeId, gpus: &GpuAssignment) -> i64 {
    let st = state.get(node);
    let usable: Vec<usize> = (0..st.gpu_usable.len())
        .filter(|&g| st.gpu_usable[g])
        .collect();
    let fully_free = usable
        .iter()
        .filter(|&&g| st.gpu_free_milli[g] as u64 == GPU_MILLI)
        .count() as i64;
    match gpus {
        // MIG instances are placed by the core, never by a packer
        GpuAssignment::None | GpuAssignment::Mig { .. } => 0,
        _ if fully_free == usable.len() as i64 => (33 - fully_free).max(fully_free),
        GpuAssignment::Whole(list) => (50 - list.len() as i64).max(33),
        GpuAssignment::Share { gpu, .. } => {
            let free = st.gpu_free_milli[*gpu as usize] as u64;
            if free == GPU_MILLI {
                49 // tier 2 with one free GPU: max(50 - 1, 33)
            } else {
                let pct = (free * 100 / GPU_MILLI) as i64;
                (100 - pct / 10).max(50)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::{GpuRequest, Pod};
    use gpusched_testkit::packing::*;

    #[test]
    fn tiers() {
        let nodes = vec![
            node("free", 8, 96_000, "G2"),
            node("used", 8, 96_000, "G2"),
            node("shared", 8, 96_000, "G2"),
        ];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 0, 1000, 0);
        take(&mut cs, 2, 3, 500, 0);
        let p = packer();
        let s = |pd: &Pod, n| p.place(pd, n, &cs).unwrap().score;
        let sh = pod(1000, share(400));
        assert_eq!(s(&sh, 0), 25);
        assert_eq!(s(&sh, 1), 49);
        assert_eq!(s(&sh, 2), 95);
        assert_eq!(pick(&p, &sh, &cs).unwrap().0, 2);
        let w = pod(1000, GpuRequest::Whole(2));
        assert_eq!(s(&w, 1), 48);
        assert_eq!(s(&pod(1000, GpuRequest::None), 2), 0);
    }
}

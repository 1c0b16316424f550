//! `best-fit`: the FGD paper's "BestFit" baseline.
//!
//! With free `(cpu, gpu)` of the node before placing, request `(cpu, gpu)`
//! and normalisers `C = 128000`, `G = 8000`:
//! `left = ½(cpu_free − cpu)/C + ½(gpu_free − gpu)/G` and
//! `score = ⌊100 · (1 − left)⌋`: the node left with the least (weighted)
//! capacity wins. Shares go on the best-fit GPU, whole GPUs on the topology
//! choice.

use super::dot_prod::{MAX_SPEC_CPU, MAX_SPEC_GPU};
use super::names::PolicyName;
use super::scored::ScoredPacker;
use super::util::share_best_fit;
use gpusched_core::Packer;

/// Best-fit placement.
pub fn packer() -> impl Packer {
    ScoredPacker::new(
        PolicyName::BestFit,
        share_best_fit,
        |state, pod, node, gpus| {
            let free = &state.get(node).free;
            best_fit_score(
                free.cpu_milli,
                free.gpu_milli,
                pod.requests.cpu_milli,
                gpus.milli(),
            )
        },
    )
}

/// The reference score (see the module documentation).
pub fn best_fit_score(cpu_free: u64, gpu_free: u64, cpu_req: u64, gpu_req: u64) -> i64 {
    let left = 0.5 * (cpu_free.saturating_sub(cpu_req)) as f64 / MAX_SPEC_CPU
        + 0.5 * (gpu_free.saturating_sub(gpu_req)) as f64 / MAX_SPEC_GPU;
    ((1.0 - left) * 100.0) as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::ClusterState;
    use gpusched_core::GpuAssignment;
    use gpusched_testkit::packing::*;

    #[test]
    fn formula() {
        assert_eq!(best_fit_score(128_000, 8000, 128_000, 8000), 100);
        assert_eq!(best_fit_score(128_000, 8000, 0, 0), 0);
        assert_eq!(best_fit_score(64_000, 4000, 0, 0), 50);
    }

    #[test]
    fn picks_the_tightest_node_and_gpu() {
        let nodes = vec![node("a", 4, 32_000, "T4"), node("b", 4, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 0, 1, 500, 4000);
        take(&mut cs, 1, 0, 1000, 4000);
        take(&mut cs, 1, 1, 1000, 4000);
        let p = packer();
        let (n, pl) = pick(&p, &pod(1000, share(400)), &cs).unwrap();
        assert_eq!(n, 1);
        assert_eq!(
            pl.gpus,
            GpuAssignment::Share {
                gpu: 2,
                milli: 400,
                memory_mib: 0
            }
        );
        let (n, pl) = pick(&p, &pod(1000, share(500)), &cs).unwrap();
        assert_eq!(n, 1);
        assert!(matches!(pl.gpus, GpuAssignment::Share { gpu: 2, .. }));
    }
}

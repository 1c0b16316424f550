//! `gpusched`: our default packing policy — fragmentation gradient descent
//! without the reference's score quantization, with best fit as the
//! tie-break and an optional packing term.
//!
//! With `Δ` the change of node fragmentation of [`super::fgd`] (positive:
//! the placement removes fragments), `L` the node's free GPU milli after
//! placing and `λ` = [`GpuschedConfig::pack_weight`]:
//!
//! ```text
//! value = Δ − λ · L                       (milli-GPU, exact, not squashed)
//! score = ⌊1000 · value⌋ · 2²⁰ + tie     (tie: fuller GPU, then fuller CPU)
//! ```
//!
//! A share goes on the GPU with the best value, then the least compute left.

use super::fgd::{FragEngine, derive_profile};
use super::profile::Profile;
use super::util::{WholeChooser, cpu_left_after, for_each_share, share_on};
use gpusched_core::{ClusterState, GpuAssignment, NodeId, PackEnv, Packer, Placement};
use gpusched_model::{GpuRequest, Pod};

/// Knobs of [`GpuschedPacker`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuschedConfig {
    /// Weight of the node's free GPU milli after placing (packing pressure).
    pub pack_weight: f64,
}

impl Default for GpuschedConfig {
    fn default() -> Self {
        GpuschedConfig { pack_weight: 0.0 }
    }
}

/// Our default packing policy (see the module documentation).
pub struct GpuschedPacker {
    explicit: bool,
    cfg: GpuschedConfig,
    engine: FragEngine,
    whole: WholeChooser,
}

impl Default for GpuschedPacker {
    fn default() -> Self {
        Self::new()
    }
}

impl GpuschedPacker {
    /// Target workload derived in `prepare` from the snapshot's pods.
    pub fn new() -> Self {
        GpuschedPacker {
            explicit: false,
            cfg: GpuschedConfig::default(),
            engine: FragEngine::new(Profile::default()),
            whole: WholeChooser::new(),
        }
    }

    /// Explicit target workload.
    pub fn with_profile(profile: Profile) -> Self {
        GpuschedPacker {
            explicit: true,
            cfg: GpuschedConfig::default(),
            engine: FragEngine::new(profile),
            whole: WholeChooser::new(),
        }
    }

    pub fn with_config(mut self, cfg: GpuschedConfig) -> Self {
        self.cfg = cfg;
        self
    }

    fn score(
        &self,
        delta: f64,
        state: &ClusterState<'_>,
        pod: &Pod,
        node: NodeId,
        gpu_left: u64,
    ) -> i64 {
        let value = delta - self.cfg.pack_weight * gpu_left as f64;
        let cap = state.node(node).allocatable.cpu_milli.max(1);
        let cpu_used_ppm =
            1_000_000 - (cpu_left_after(state, pod, node) as u128 * 1_000_000 / cap as u128) as i64;
        let tie = (8000 - gpu_left.min(8000) as i64) * 100 + cpu_used_ppm / 10_000;
        ((value * 1000.0).floor() as i64) * (1 << 20) + tie
    }
}

impl Packer for GpuschedPacker {
    fn name(&self) -> &'static str {
        "gpusched"
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        if !self.explicit {
            let p = derive_profile(env);
            if &p != self.engine.profile() {
                self.engine = FragEngine::new(p);
            }
        }
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let node_free = state.get(node).free.gpu_milli;
        match pod.gpu {
            GpuRequest::Share { .. } => self.engine.with_eval(pod, node, state, |e| {
                let mut best: Option<(f64, u32, usize, u32)> = None;
                for_each_share(state, pod, node, |g, m, free| {
                    let Some(d) = e.delta_for(free) else { return };
                    let left = free - m;
                    if best.is_none_or(|(bd, bl, _, _)| d > bd || (d == bd && left < bl)) {
                        best = Some((d, left, g, m));
                    }
                });
                best.map(|(d, _, g, m)| Placement {
                    score: self.score(d, state, pod, node, node_free - m as u64),
                    gpus: share_on(pod, g, m),
                })
            }),
            _ => {
                let gpus = self.whole.assignment(state, pod, node, || None)?;
                let d = self
                    .engine
                    .with_eval(pod, node, state, |e| e.deltas.first().map(|x| x.1))?;
                let left = node_free.saturating_sub(gpus.milli());
                let _ = GpuAssignment::None;
                Some(Placement {
                    score: self.score(d, state, pod, node, left),
                    gpus,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::packing::profile::PodClass;
    use crate::packing::testutil::*;

    #[test]
    fn exact_fragmentation_then_best_fit() {
        let c = PodClass {
            cpu_milli: 1000,
            gpu_milli: 500,
            gpu_count: 1,
            gpu_mem_mib: 0,
            gpu_models: vec![],
        };
        let prof = Profile::new([(c, 1.0)]);
        let nodes = vec![node("a", 2, 32_000, "T4"), node("b", 2, 32_000, "T4")];
        let mut cs = ClusterState::new(&nodes);
        take(&mut cs, 1, 0, 1000, 0);
        let p = GpuschedPacker::with_profile(prof);
        // a 0.5 share removes no fragment anywhere (Δ = 0); best fit picks
        // the fuller node b.
        let (n, pl) = pick(&p, &pod(1000, share(500)), &cs).unwrap();
        assert_eq!(n, 1);
        assert!(matches!(pl.gpus, GpuAssignment::Share { gpu: 1, .. }));
    }
}

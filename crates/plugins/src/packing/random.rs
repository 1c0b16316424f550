//! `random`: a uniformly random feasible node (baseline "Random").
//!
//! Score = `h(seed, node, version) >> 2` where `h` is SplitMix64 over the
//! seed given to `prepare`, the node id and the node's version: every
//! feasible node gets an independent uniform score, so the best one is a
//! uniform draw among them. Shares go on a GPU drawn the same way among the
//! GPUs they fit on; whole GPUs take the topology choice. Nothing else is a
//! source of randomness: the same seed and state give the same choice.

use super::util::{WholeChooser, for_each_share, mix64, share_on};
use gpusched_core::{ClusterState, NodeId, PackEnv, Packer, Placement};
use gpusched_model::Pod;

/// Seeded random placement.
#[derive(Default)]
pub struct RandomPacker {
    seed: u64,
    whole: WholeChooser,
}

impl RandomPacker {
    /// The policy (draws only from the seed given to `prepare`).
    pub fn new() -> Self {
        Self::default()
    }

    fn draw(&self, node: NodeId, version: u64, salt: u64) -> u64 {
        mix64(mix64(mix64(self.seed ^ 0x7261_6e64_6f6d) ^ node as u64) ^ version ^ (salt << 48))
    }
}

impl Packer for RandomPacker {
    fn name(&self) -> &'static str {
        super::names::PolicyName::Random.as_str()
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        self.seed = env.seed;
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let version = state.get(node).version;
        let gpus = self.whole.assignment(state, pod, node, || {
            let mut best: Option<(u64, usize, u32)> = None;
            for_each_share(state, pod, node, |g, m, _| {
                let d = self.draw(node, version, g as u64 + 1);
                if best.is_none_or(|(b, _, _)| d > b) {
                    best = Some((d, g, m));
                }
            });
            best.map(|(_, g, m)| share_on(pod, g, m))
        })?;
        Some(Placement {
            score: ((self.draw(node, version, 0) >> 2) as i64).into(),
            gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::Snapshot;
    use gpusched_model::GpuRequest;
    use gpusched_testkit::packing::*;

    #[test]
    fn deterministic_per_seed_and_roughly_uniform() {
        let nodes: Vec<_> = (0..8)
            .map(|i| node(&format!("n{i}"), 2, 8000, "T4"))
            .collect();
        let cs = ClusterState::new(&nodes);
        let snap = Snapshot::default();
        let mut p = RandomPacker::new();
        let pd = pod(100, share(100));
        let mut hits = [0u32; 8];
        for seed in 0..800 {
            prepare(&mut p, &snap, &cs, seed);
            let a = pick(&p, &pd, &cs).unwrap();
            let b = pick(&p, &pd, &cs).unwrap();
            assert_eq!(a, b);
            hits[a.0 as usize] += 1;
        }
        assert!(hits.iter().all(|&h| (50..150).contains(&h)), "{hits:?}");
    }

    #[test]
    fn infeasible_is_none() {
        let nodes = vec![node("a", 1, 8000, "T4")];
        let cs = ClusterState::new(&nodes);
        let p = RandomPacker::new();
        assert!(p.place(&pod(100, GpuRequest::Whole(2)), 0, &cs).is_none());
    }
}

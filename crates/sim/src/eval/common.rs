//! What the evaluation's parts share: one seed's run and a policy's result
//! (written by [`super::fgd_method`], extended by
//! [`super::consolidate_method`]), and their statistics.

use serde::{Deserialize, Serialize};

/// One seed's run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SeedRun {
    /// The seed of the sampling and shuffling.
    pub seed: u64,
    /// Pods in the workload, placed and skipped.
    pub pods: usize,
    /// Pods placed.
    pub placed: usize,
    /// Pods that fit no node (skipped, never retried).
    pub skipped: usize,
    /// Total GPU request of the workload, % of capacity.
    pub requested_pct: f64,
    /// Alloc % at arrived 0..=130 % (`None`: no record near that point).
    pub alloc_curve: Vec<Option<f64>>,
    /// Fragmented GPU (FGD definition against the profile), % of capacity,
    /// at the first record of each arrived %.
    pub frag_curve: Vec<Option<f64>>,
    /// Alloc % when arrived reaches 100 %.
    pub alloc_at_100: f64,
    /// Alloc % after the last pod.
    pub final_alloc: f64,
    /// Pods moved by consolidation ([`super::fgd_method::FgdMethod::move_budget`]).
    #[serde(default)]
    pub moves: u64,
}

/// All seeds of one policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MethodResult {
    /// The packing policy.
    pub policy: String,
    /// GPUs of the cluster.
    pub total_gpus: u64,
    /// One run per seed, in seed order.
    pub runs: Vec<SeedRun>,
}

impl MethodResult {
    /// Mean and sample standard deviation of alloc at 100 % over seeds.
    pub fn headline(&self) -> (f64, f64) {
        mean_stdev(self.runs.iter().map(|r| r.alloc_at_100))
    }

    /// Mean fragmentation % at arrived `pct` over seeds (`None` if absent).
    pub fn frag_at(&self, pct: usize) -> Option<f64> {
        let v: Vec<f64> = self
            .runs
            .iter()
            .filter_map(|r| r.frag_curve.get(pct).copied().flatten())
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }
}

/// Mean and sample standard deviation (0 for fewer than two values).
pub fn mean_stdev(v: impl IntoIterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = v.into_iter().collect();
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let sd = if v.len() < 2 {
        0.0
    } else {
        (v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / (n - 1.0)).sqrt()
    };
    (m, sd)
}

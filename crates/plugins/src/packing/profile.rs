//! The target workload of the fragmentation-aware policies: a distribution
//! over pod classes (CPU, GPU shape, allowed GPU models).
//!
//! [`Profile::from_pods`] is the exact class distribution of a pod list
//! (CPU-only pods included). [`Profile::typical`] is the FGD reference's cut
//! ("typical pods"): sort classes by popularity (descending; equal weights
//! by class, descending), keep the most popular ones until they cover at
//! least 95 % of the pods, and renormalise. Memory is not part of a class,
//! as in the reference.

use gpusched_model::{GPU_MILLI, GpuRequest, Pod};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A pod class: what fragmentation is measured against.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodClass {
    /// CPU request (milli-CPU).
    pub cpu_milli: u64,
    /// Milli-GPU asked of each GPU: 1000 for whole GPUs, less for a share,
    /// 0 for a share asked by memory only or for no GPU.
    pub gpu_milli: u32,
    /// GPUs asked for: 0 (no GPU), 1 (a share or one GPU), or more.
    pub gpu_count: u32,
    /// GPU memory of a share asked by memory (MiB), else 0.
    pub gpu_mem_mib: u64,
    /// Allowed GPU models (sorted, unique); empty = any.
    pub gpu_models: Vec<String>,
}

impl PodClass {
    /// The class of a pod.
    pub fn of(pod: &Pod) -> PodClass {
        let (gpu_milli, gpu_count, gpu_mem_mib) = match pod.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => (0, 0, 0),
            GpuRequest::Whole(k) => (GPU_MILLI as u32, k, 0),
            GpuRequest::Share { milli, memory_mib } => {
                (milli, 1, if milli == 0 { memory_mib } else { 0 })
            }
        };
        let mut gpu_models = pod.gpu_models.clone();
        gpu_models.sort();
        gpu_models.dedup();
        PodClass {
            cpu_milli: pod.requests.cpu_milli,
            gpu_milli,
            gpu_count,
            gpu_mem_mib,
            gpu_models,
        }
    }

    /// GPU milli the class asks for: `gpu_count · gpu_milli`; a share
    /// asked by memory only counts as half a GPU; 0 without GPU.
    pub fn gpu_demand(&self) -> f64 {
        let per_gpu = if self.gpu_milli == 0 && self.gpu_mem_mib > 0 {
            500
        } else {
            self.gpu_milli
        };
        self.gpu_count as f64 * per_gpu as f64
    }

    /// Whether the class asks for no GPU.
    pub fn is_cpu_only(&self) -> bool {
        self.gpu_count == 0
    }

    /// Whether the class may run on GPUs of `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.gpu_models.is_empty() || self.gpu_models.iter().any(|m| m == model)
    }
}

/// How a profile is cut from a pod list.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProfileOptions {
    /// Keep the most popular classes until they cover this share of pods.
    pub coverage: f64,
    /// Count CPU-only pods.
    pub include_cpu_pods: bool,
}

impl Default for ProfileOptions {
    fn default() -> Self {
        ProfileOptions {
            coverage: 1.0,
            include_cpu_pods: true,
        }
    }
}

/// Coverage of the FGD reference's typical pods.
pub const TYPICAL_COVERAGE: f64 = 0.95;

/// Equal classes merged, non-positive and non-finite weights dropped.
fn merged(classes: impl IntoIterator<Item = (PodClass, f64)>) -> BTreeMap<PodClass, f64> {
    let mut m: BTreeMap<PodClass, f64> = BTreeMap::new();
    for (c, w) in classes {
        if w > 0.0 && w.is_finite() {
            *m.entry(c).or_insert(0.0) += w;
        }
    }
    m
}

/// A distribution over pod classes; weights are positive and sum to 1
/// (except a profile made by [`Profile::from_weights`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    classes: Vec<(PodClass, f64)>,
}

impl Profile {
    /// A profile from explicit weights (non-positive weights are dropped,
    /// the rest renormalised; equal classes are merged).
    pub fn new(classes: impl IntoIterator<Item = (PodClass, f64)>) -> Profile {
        let m = merged(classes);
        let total: f64 = m.values().sum();
        Self::sorted(m.into_iter().map(|(c, w)| (c, w / total)).collect())
    }

    fn sorted(mut classes: Vec<(PodClass, f64)>) -> Profile {
        classes.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        Profile { classes }
    }

    /// The class distribution of a pod list (every class).
    pub fn from_pods<'a>(pods: impl IntoIterator<Item = &'a Pod>) -> Profile {
        Self::from_pods_with(pods, ProfileOptions::default())
    }

    /// The class distribution of a pod list, cut as `opts` says.
    pub fn from_pods_with<'a>(
        pods: impl IntoIterator<Item = &'a Pod>,
        opts: ProfileOptions,
    ) -> Profile {
        let mut counts: BTreeMap<PodClass, u64> = BTreeMap::new();
        for p in pods {
            *counts.entry(PodClass::of(p)).or_insert(0) += 1;
        }
        Self::from_counts(&counts, opts)
    }

    /// The class distribution of pods counted by class (as
    /// [`Profile::from_pods_with`] counts them; classes counted 0 are
    /// left out), cut as `opts` says.
    pub fn from_counts(counts: &BTreeMap<PodClass, u64>, opts: ProfileOptions) -> Profile {
        let counts = counts
            .iter()
            .filter(|(c, n)| **n > 0 && (opts.include_cpu_pods || !c.is_cpu_only()));
        let total: u64 = counts.clone().map(|(_, n)| *n).sum();
        let mut list: Vec<(PodClass, u64)> = counts.map(|(c, n)| (c.clone(), *n)).collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| b.0.cmp(&a.0)));
        let need = opts.coverage * total as f64;
        let mut cum = 0u64;
        let mut keep = Vec::new();
        for (c, n) in list {
            if keep.is_empty() || (cum as f64) < need {
                cum += n;
                keep.push((c, n as f64));
            } else {
                break;
            }
        }
        Self::new(keep)
    }

    /// The most popular classes covering at least `coverage` of the weight,
    /// renormalised (the reference's typical pods for 0.95).
    pub fn typical(&self, coverage: f64) -> Profile {
        let mut cum = 0.0;
        let mut keep = Vec::new();
        for (c, w) in &self.classes {
            if keep.is_empty() || cum < coverage - 1e-12 {
                cum += w;
                keep.push((c.clone(), *w));
            } else {
                break;
            }
        }
        Profile::new(keep)
    }

    /// The profile re-weighted by GPU demand: class `c` gets `p_c · d_c`
    /// (renormalised), `d_c` its GPU milli (`gpu_count · gpu_milli`; a
    /// share asked by memory only counts as half a GPU). CPU-only classes
    /// drop out. The weight of a class is then the probability that a unit
    /// of arriving GPU demand belongs to it. A profile without GPU classes
    /// is returned unchanged.
    pub fn gpu_weighted(&self) -> Profile {
        self.reweighted(PodClass::gpu_demand)
    }

    /// A profile with the weights as given (not normalised): equal classes
    /// are merged, non-positive and non-finite weights dropped, most
    /// popular first. For the parts of a mixed fragmentation engine, whose
    /// weights are relative to each other.
    pub fn from_weights(classes: impl IntoIterator<Item = (PodClass, f64)>) -> Profile {
        Self::sorted(merged(classes).into_iter().collect())
    }

    /// The profile with each class's weight multiplied by `f(class)` and
    /// renormalised (classes whose product is not positive drop out); a
    /// result without classes is replaced by the profile unchanged.
    pub fn reweighted(&self, f: impl Fn(&PodClass) -> f64) -> Profile {
        let p = Profile::new(self.classes.iter().map(|(c, w)| (c.clone(), w * f(c))));
        if p.is_empty() { self.clone() } else { p }
    }

    /// The classes with their weights, most popular first.
    pub fn classes(&self) -> &[(PodClass, f64)] {
        &self.classes
    }

    /// Whether the profile has no class.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::ResourceVec;

    fn pod(cpu: u64, gpu: GpuRequest) -> Pod {
        let mut p = Pod::new("p", "q");
        p.requests = ResourceVec::new(cpu, 0, 0);
        p.gpu = gpu;
        p
    }

    #[test]
    fn typical_pods_cover_the_threshold_and_renormalise() {
        let mut pods = Vec::new();
        for _ in 0..60 {
            pods.push(pod(4000, GpuRequest::Whole(1)));
        }
        for _ in 0..35 {
            pods.push(pod(
                2000,
                GpuRequest::Share {
                    milli: 500,
                    memory_mib: 0,
                },
            ));
        }
        for _ in 0..5 {
            pods.push(pod(1000, GpuRequest::None));
        }
        let p = Profile::from_pods(&pods).typical(TYPICAL_COVERAGE);
        assert_eq!(p.classes().len(), 2);
        let q = Profile::from_pods_with(
            &pods,
            ProfileOptions {
                coverage: 0.95,
                include_cpu_pods: true,
            },
        );
        assert_eq!(p, q);
        assert!((p.classes()[0].1 - 60.0 / 95.0).abs() < 1e-12);
        assert_eq!(p.classes()[1].0.gpu_milli, 500);
        let all = Profile::from_pods(&pods);
        assert_eq!(all.classes().len(), 3);
        let s: f64 = all.classes().iter().map(|c| c.1).sum();
        assert!((s - 1.0).abs() < 1e-12);
        assert!(Profile::from_pods(&[]).is_empty());
        // by GPU demand: 60 pods x 1000 vs 35 x 500; CPU-only dropped
        let g = all.gpu_weighted();
        assert_eq!(g.classes().len(), 2);
        assert!((g.classes()[0].1 - 60_000.0 / 77_500.0).abs() < 1e-12);
        assert_eq!(g.classes()[1].0.gpu_milli, 500);
        let cpu_only = Profile::from_pods(&pods[95..]);
        assert_eq!(cpu_only.gpu_weighted(), cpu_only);
    }
}

//! Variants of an openb pod list, built the way the FGD paper's trace
//! family is named (`cpuXXX`, `gpushareXX`, `gpuspecXX`, `multigpuXX`).
//!
//! The published variant files are not available; these are our own,
//! seeded and deterministic constructions from a base pod list (normally
//! `openb_pod_list_default.csv`). Each one moves a single property of the
//! workload and leaves the rest as in the base:
//!
//! | variant | what changes | how |
//! |---|---|---|
//! | `cpuXXX` | CPU-only pods | their total CPU request becomes XXX/125 of the base's CPU-only total (resampled; see below) |
//! | `gpushareXX` | GPU-sharing pods | their share of the GPU demand becomes XX % (shares resampled, whole-GPU pods the rest) |
//! | `gpuspecXX` | GPU-model constraints | XX % of the GPU pods may run only on one GPU model |
//! | `multigpuXX` | multi-GPU pods | their share of the GPU demand becomes XX % (multi-GPU pods resampled, single-GPU pods the rest) |
//!
//! "Resampled" ([`resample`]): a group of pods above its target loses pods
//! chosen at random until it is at or below the target; a group below gets
//! copies of its own pods drawn with replacement until the next copy would
//! pass the target. The GPU demand of the whole list stays that of the base
//! (within one pod), so the FGD method inflates every variant to the same
//! 130 %. In `gpuspecXX` the constrained pods are drawn at random (XX % of
//! the GPU pods, rounded) and each gets one model drawn uniformly among the
//! cluster's models that hold at least 1 % of its GPUs (for the openb
//! cluster: G2, G3, T4, P100, V100M16, V100M32; not A10's two GPUs). A
//! uniform draw over unequal models is what makes the constraint bite: the
//! small models receive as much constrained demand as G2.
//!
//! The `cpuXXX` scale is calibrated on the published baselines: on the
//! published results the default trace sits between `cpu100` and `cpu200`,
//! at about `cpu125` for every policy (Random 86.30 between 87.44 and 83.03,
//! DotProd 90.62 between 91.73 and 87.46, GpuPacking 91.78 between 92.49
//! and 89.98), so `cpu125` here is the default's CPU-only volume,
//! [`CPU_BASE_PCT`].
//!
//! Everything is drawn from ChaCha8 seeded with the variant seed, so a
//! variant is one fixed pod list, like a published file.

use gpusched_model::{GpuRequest, Node, Pod};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::BTreeMap;

/// The `cpuXXX` that equals the base list's CPU-only volume (see the
/// module documentation).
pub const CPU_BASE_PCT: f64 = 125.0;

/// Seed of the variant construction when none is given.
pub const DEFAULT_VARIANT_SEED: u64 = 2023;

/// The variants the FGD paper's artifact published results for, in the
/// order its table lists them (plus `default`, the base list itself).
pub const PUBLISHED: [&str; 17] = [
    "cpu050",
    "cpu100",
    "cpu200",
    "cpu250",
    "default",
    "gpushare100",
    "gpushare40",
    "gpushare60",
    "gpushare80",
    "gpuspec10",
    "gpuspec20",
    "gpuspec25",
    "gpuspec33",
    "multigpu20",
    "multigpu30",
    "multigpu40",
    "multigpu50",
];

/// A trace variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Variant {
    /// The base list unchanged.
    Default,
    /// CPU-only pods' total CPU = this/[`CPU_BASE_PCT`] of the base's.
    Cpu(u32),
    /// GPU-sharing pods' share of the GPU demand, %.
    GpuShare(u32),
    /// GPU pods restricted to one model, % of the GPU pods.
    GpuSpec(u32),
    /// Multi-GPU pods' share of the GPU demand, %.
    MultiGpu(u32),
}

/// A variant name that does not parse, or a variant the base cannot make.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VariantError {
    /// The name is not `default`, `cpuN`, `gpushareN`, `gpuspecN` or
    /// `multigpuN` with N in range.
    #[error(
        "unknown trace variant {0:?} (expected default, cpuN (N 0-1000), gpushareN, gpuspecN or multigpuN (N 0-100), e.g. gpushare40)"
    )]
    Name(String),
    /// The base list lacks pods of a group the variant must resample.
    #[error("variant {variant}: the base pod list has no {group} to resample")]
    EmptyGroup {
        /// The variant's name.
        variant: String,
        /// The missing group, in words.
        group: &'static str,
    },
    /// `gpuspecN` on a cluster without GPUs.
    #[error("variant {0}: the cluster has no GPU model to restrict pods to")]
    NoModels(String),
}

impl std::str::FromStr for Variant {
    type Err = VariantError;
    fn from_str(s: &str) -> Result<Variant, VariantError> {
        let s = s.trim();
        let s = s.strip_prefix("openb_pod_list_").unwrap_or(s);
        if s == "default" {
            return Ok(Variant::Default);
        }
        let bad = || VariantError::Name(s.to_string());
        let num = |rest: &str, max: u32| -> Result<u32, VariantError> {
            if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let n: u32 = rest.parse().map_err(|_| bad())?;
            if n > max { Err(bad()) } else { Ok(n) }
        };
        if let Some(r) = s.strip_prefix("gpushare") {
            Ok(Variant::GpuShare(num(r, 100)?))
        } else if let Some(r) = s.strip_prefix("gpuspec") {
            Ok(Variant::GpuSpec(num(r, 100)?))
        } else if let Some(r) = s.strip_prefix("multigpu") {
            Ok(Variant::MultiGpu(num(r, 100)?))
        } else if let Some(r) = s.strip_prefix("cpu") {
            Ok(Variant::Cpu(num(r, 1000)?))
        } else {
            Err(bad())
        }
    }
}

impl std::fmt::Display for Variant {
    /// The published naming (`cpu050`, `gpushare40`, …).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Variant::Default => f.write_str("default"),
            Variant::Cpu(n) => write!(f, "cpu{n:03}"),
            Variant::GpuShare(n) => write!(f, "gpushare{n}"),
            Variant::GpuSpec(n) => write!(f, "gpuspec{n}"),
            Variant::MultiGpu(n) => write!(f, "multigpu{n}"),
        }
    }
}

impl Variant {
    /// The pod-list name of the published family
    /// (`openb_pod_list_gpushare40`), as the published results name it.
    pub fn workload_name(&self) -> String {
        format!("openb_pod_list_{self}")
    }
}

/// Parses a comma-separated list of variants; `all` is [`PUBLISHED`].
pub fn parse_list(s: &str) -> Result<Vec<Variant>, VariantError> {
    if s.trim() == "all" {
        return PUBLISHED.iter().map(|v| v.parse()).collect();
    }
    let v: Vec<Variant> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    if v.is_empty() {
        return Err(VariantError::Name(s.to_string()));
    }
    Ok(v)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Cpu,
    Share,
    One,
    Multi,
}

fn kind(p: &Pod) -> Kind {
    match p.gpu {
        GpuRequest::None | GpuRequest::Whole(0) => Kind::Cpu,
        GpuRequest::Share { .. } => Kind::Share,
        GpuRequest::Whole(1) => Kind::One,
        GpuRequest::Whole(_) => Kind::Multi,
    }
}

/// Brings the total `size` of a group of pods to `target`: removes pods
/// chosen at random while the total is above it, or appends copies of
/// pods of the group drawn with replacement while the next copy keeps the
/// total at or below it. Returns the new group (originals first, in their
/// order, then copies).
pub fn resample(
    group: Vec<Pod>,
    target: f64,
    size: impl Fn(&Pod) -> u64,
    rng: &mut ChaCha8Rng,
) -> Vec<Pod> {
    let mut total: u64 = group.iter().map(&size).sum();
    if group.is_empty() {
        return group;
    }
    if total as f64 > target {
        let mut keep = vec![true; group.len()];
        let mut alive: Vec<usize> = (0..group.len()).collect();
        while total as f64 > target && !alive.is_empty() {
            let k = rng.random_range(0..alive.len());
            let i = alive.swap_remove(k);
            keep[i] = false;
            total -= size(&group[i]);
        }
        return group
            .into_iter()
            .zip(keep)
            .filter_map(|(p, k)| k.then_some(p))
            .collect();
    }
    let originals = group.len();
    let mut out = group;
    let mut copies = 0usize;
    loop {
        let i = rng.random_range(0..originals);
        let s = size(&out[i]);
        if s == 0 || (total + s) as f64 > target {
            break;
        }
        total += s;
        copies += 1;
        let mut p = out[i].clone();
        p.name = format!("{}-v{copies}", p.name);
        out.push(p);
    }
    out
}

/// Builds `variant` from the `base` pod list for the cluster `nodes`
/// (seeded, deterministic). See the module documentation for each rule.
pub fn build(
    variant: Variant,
    base: &[Pod],
    nodes: &[Node],
    seed: u64,
) -> Result<Vec<Pod>, VariantError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ variant_salt(variant));
    let name = variant.to_string();
    let by = |k: &[Kind]| -> Vec<Pod> {
        base.iter()
            .filter(|p| k.contains(&kind(p)))
            .cloned()
            .collect()
    };
    let gpu = |p: &Pod| p.gpu.milli();
    let need = |g: &[Pod], group: &'static str| -> Result<(), VariantError> {
        if g.is_empty() {
            Err(VariantError::EmptyGroup {
                variant: name.clone(),
                group,
            })
        } else {
            Ok(())
        }
    };
    let demand: u64 = base.iter().map(gpu).sum();
    // `pct` % of the GPU demand resampled from the pods of `part`, the rest
    // from those of `other`; CPU-only pods kept as they are
    type Group<'a> = (&'a [Kind], &'static str);
    let split = |rng: &mut ChaCha8Rng,
                 pct: u32,
                 part: Group<'_>,
                 other: Group<'_>|
     -> Result<Vec<Pod>, VariantError> {
        let (part_pods, other_pods) = (by(part.0), by(other.0));
        let f = pct as f64 / 100.0;
        if f > 0.0 {
            need(&part_pods, part.1)?;
        }
        if f < 1.0 {
            need(&other_pods, other.1)?;
        }
        let mut out = by(&[Kind::Cpu]);
        out.extend(resample(other_pods, (1.0 - f) * demand as f64, gpu, rng));
        out.extend(resample(part_pods, f * demand as f64, gpu, rng));
        Ok(out)
    };
    Ok(match variant {
        Variant::Default => base.to_vec(),
        Variant::Cpu(pct) => {
            let cpu = by(&[Kind::Cpu]);
            need(&cpu, "CPU-only pods")?;
            let total: u64 = cpu.iter().map(|p| p.requests.cpu_milli).sum();
            let target = total as f64 * pct as f64 / CPU_BASE_PCT;
            let mut out = by(&[Kind::Share, Kind::One, Kind::Multi]);
            out.extend(resample(cpu, target, |p| p.requests.cpu_milli, &mut rng));
            out
        }
        Variant::GpuShare(pct) => split(
            &mut rng,
            pct,
            (&[Kind::Share], "GPU-sharing pods"),
            (&[Kind::One, Kind::Multi], "whole-GPU pods"),
        )?,
        Variant::MultiGpu(pct) => split(
            &mut rng,
            pct,
            (&[Kind::Multi], "multi-GPU pods"),
            (&[Kind::Share, Kind::One], "single-GPU pods"),
        )?,
        Variant::GpuSpec(pct) => {
            let models = spec_models(nodes);
            if models.is_empty() {
                return Err(VariantError::NoModels(name));
            }
            let mut out = base.to_vec();
            let mut gpu_pods: Vec<usize> = (0..out.len())
                .filter(|&i| kind(&out[i]) != Kind::Cpu)
                .collect();
            let n = (gpu_pods.len() as f64 * pct as f64 / 100.0).round() as usize;
            gpu_pods.shuffle(&mut rng);
            let mut chosen = gpu_pods[..n.min(gpu_pods.len())].to_vec();
            chosen.sort_unstable();
            for i in chosen {
                let m = &models[rng.random_range(0..models.len())];
                out[i].gpu_models = vec![m.clone()];
            }
            out
        }
    })
}

/// GPU models of the cluster holding at least 1 % of its GPUs, by name.
pub fn spec_models(nodes: &[Node]) -> Vec<String> {
    let mut count: BTreeMap<&str, u64> = BTreeMap::new();
    for n in nodes {
        for g in &n.gpus {
            *count.entry(g.model.as_str()).or_insert(0) += 1;
        }
    }
    let total: u64 = count.values().sum();
    count
        .into_iter()
        .filter(|&(_, c)| c * 100 >= total && total > 0)
        .map(|(m, _)| m.to_string())
        .collect()
}

/// Different variants draw from different streams of the same seed.
fn variant_salt(v: Variant) -> u64 {
    let (k, n) = match v {
        Variant::Default => (0u64, 0u32),
        Variant::Cpu(n) => (1, n),
        Variant::GpuShare(n) => (2, n),
        Variant::GpuSpec(n) => (3, n),
        Variant::MultiGpu(n) => (4, n),
    };
    (k << 32 | n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::ResourceVec;

    fn pod(name: &str, cpu: u64, gpu: GpuRequest) -> Pod {
        let mut p = Pod::new(name, "q");
        p.requests = ResourceVec::new(cpu, 1024, 0);
        p.gpu = gpu;
        p
    }

    fn share(m: u32) -> GpuRequest {
        GpuRequest::Share {
            milli: m,
            memory_mib: 0,
        }
    }

    fn base() -> Vec<Pod> {
        let mut v = Vec::new();
        for i in 0..60 {
            v.push(pod(&format!("w{i}"), 8000, GpuRequest::Whole(1)));
        }
        for i in 0..40 {
            v.push(pod(&format!("s{i}"), 4000, share(500)));
        }
        for i in 0..5 {
            v.push(pod(&format!("m{i}"), 32000, GpuRequest::Whole(4)));
        }
        for i in 0..20 {
            v.push(pod(&format!("c{i}"), 2000 + 100 * i, GpuRequest::None));
        }
        v
    }

    fn nodes() -> Vec<Node> {
        let csv = "sn,cpu_milli,memory_mib,gpu,model\n\
            a,96000,262144,8,G2\nb,96000,262144,8,G2\n\
            t0,32000,131072,2,T4\nt1,32000,131072,2,T4\n\
            t2,32000,131072,2,T4\nt3,32000,131072,2,T4\n\
            x,8000,65536,1,A10\n";
        crate::openb::parse_nodes("n.csv", csv).unwrap()
    }

    fn demand(v: &[Pod], k: &[Kind]) -> u64 {
        v.iter()
            .filter(|p| k.contains(&kind(p)))
            .map(|p| p.gpu.milli())
            .sum()
    }

    #[test]
    fn names_round_trip_and_bad_names_are_refused() {
        for n in PUBLISHED {
            let v: Variant = n.parse().unwrap();
            assert_eq!(v.to_string(), n);
        }
        assert_eq!(
            "openb_pod_list_cpu050".parse::<Variant>(),
            Ok(Variant::Cpu(50))
        );
        assert_eq!(
            Variant::GpuShare(40).workload_name(),
            "openb_pod_list_gpushare40"
        );
        for bad in [
            "gpushare",
            "gpushare101",
            "cpu-5",
            "spec10",
            "gpuspec1x",
            "",
        ] {
            let e = bad.parse::<Variant>().unwrap_err().to_string();
            assert!(e.contains("unknown trace variant"), "{bad}: {e}");
        }
        assert_eq!(parse_list("all").unwrap().len(), 17);
        assert_eq!(
            parse_list("cpu050, multigpu20").unwrap(),
            vec![Variant::Cpu(50), Variant::MultiGpu(20)]
        );
        assert!(parse_list("cpu050,nope").is_err());
        assert!(parse_list(" , ").is_err());
    }

    #[test]
    fn gpushare_and_multigpu_move_the_demand_and_keep_its_total() {
        let b = base();
        let total = demand(&b, &[Kind::Share, Kind::One, Kind::Multi]);
        let v = build(Variant::GpuShare(60), &b, &nodes(), 1).unwrap();
        let share = demand(&v, &[Kind::Share]) as f64;
        let all = demand(&v, &[Kind::Share, Kind::One, Kind::Multi]) as f64;
        assert!((share / total as f64 - 0.6).abs() < 0.02, "{share}");
        assert!((all - total as f64).abs() <= 4000.0, "{all} vs {total}");
        // CPU-only pods untouched
        assert_eq!(v.iter().filter(|p| kind(p) == Kind::Cpu).count(), 20);
        // gpushare100: no whole-GPU pod left
        let v = build(Variant::GpuShare(100), &b, &nodes(), 1).unwrap();
        assert_eq!(demand(&v, &[Kind::One, Kind::Multi]), 0);
        let v = build(Variant::MultiGpu(40), &b, &nodes(), 1).unwrap();
        let multi = demand(&v, &[Kind::Multi]) as f64;
        assert!((multi / total as f64 - 0.4).abs() < 0.05, "{multi}");
        // copies carry new names
        let names: std::collections::BTreeSet<&str> = v.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names.len(), v.len());
    }

    #[test]
    fn cpu_variants_scale_the_cpu_only_pods() {
        let b = base();
        let cpu = |v: &[Pod]| -> u64 {
            v.iter()
                .filter(|p| kind(p) == Kind::Cpu)
                .map(|p| p.requests.cpu_milli)
                .sum()
        };
        let b_cpu = cpu(&b);
        for pct in [50u32, 125, 200, 250] {
            let v = build(Variant::Cpu(pct), &b, &nodes(), 7).unwrap();
            let got = cpu(&v) as f64 / b_cpu as f64;
            let want = pct as f64 / CPU_BASE_PCT;
            assert!(
                (got - want).abs() < 0.1 && got <= want + 1e-9,
                "{pct}: {got}"
            );
            // GPU pods untouched
            assert_eq!(v.iter().filter(|p| kind(p) != Kind::Cpu).count(), 105);
        }
    }

    #[test]
    fn gpuspec_restricts_a_share_of_gpu_pods_to_big_enough_models() {
        let b = base();
        let n = nodes();
        // A10 holds 1 of 25 GPUs (4 %), still >= 1 %
        assert_eq!(spec_models(&n), vec!["A10", "G2", "T4"]);
        let v = build(Variant::GpuSpec(20), &b, &n, 3).unwrap();
        let restricted: Vec<&Pod> = v.iter().filter(|p| !p.gpu_models.is_empty()).collect();
        assert_eq!(restricted.len(), 21); // 20 % of 105 GPU pods
        assert!(restricted.iter().all(|p| kind(p) != Kind::Cpu));
        assert!(restricted.iter().all(|p| p.gpu_models.len() == 1));
        assert_eq!(v.len(), b.len());
        // deterministic by seed, different across seeds
        assert_eq!(v, build(Variant::GpuSpec(20), &b, &n, 3).unwrap());
        assert_ne!(v, build(Variant::GpuSpec(20), &b, &n, 4).unwrap());
    }

    #[test]
    fn bases_missing_a_group_are_refused() {
        let only_whole = vec![pod("w", 1000, GpuRequest::Whole(1))];
        let e = build(Variant::GpuShare(40), &only_whole, &nodes(), 1).unwrap_err();
        assert!(e.to_string().contains("no GPU-sharing pods"), "{e}");
        let e = build(Variant::Cpu(100), &only_whole, &nodes(), 1).unwrap_err();
        assert!(e.to_string().contains("CPU-only"), "{e}");
        let e = build(Variant::GpuSpec(10), &only_whole, &[], 1).unwrap_err();
        assert!(e.to_string().contains("no GPU model"), "{e}");
        assert!(build(Variant::GpuShare(0), &only_whole, &nodes(), 1).is_ok());
    }
}

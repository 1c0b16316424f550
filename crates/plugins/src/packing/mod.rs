//! Packing policies (the [`Packer`] extension point).
//!
//! Every policy is its own module and its own deterministic struct:
//!
//! | name             | struct                         | idea |
//! |------------------|--------------------------------|------|
//! | `spread`         | [`spread::SpreadPacker`]       | least allocated node, emptiest GPU |
//! | `binpack`        | [`binpack::BinpackPacker`]     | most allocated node, fullest GPU |
//! | `random`         | [`random::RandomPacker`]       | uniform random node (seeded) |
//! | `dot-prod`       | [`dot_prod::DotProdPacker`]    | Tetris dot product (FGD paper baseline) |
//! | `gpu-clustering` | [`gpu_clustering::GpuClusteringPacker`] | keep pods of one GPU shape together |
//! | `gpu-packing`    | [`gpu_packing::GpuPackingPacker`] | used GPUs, then used nodes, then free nodes |
//! | `best-fit`       | [`best_fit::BestFitPacker`]    | least CPU+GPU left after placing |
//! | `fgd`            | [`fgd::FgdPacker`]             | fragmentation gradient descent (Weng et al., ATC '23) |
//! | `gpusched`       | [`gpusched::GpuschedPacker`]   | our default: exact FGD + best-fit lookahead |
//!
//! The formulas are in `docs/placement.md`. The baselines follow the
//! definitions of the paper's public simulator (hkust-adsl/
//! kubernetes-scheduler-simulator), including the integer quantization of
//! their scores, because the quantization decides how often the framework's
//! tie-break is asked.
//!
//! Whole-GPU requests get the topology-best set of free GPUs
//! ([`gpusched_model::topology::choose`]) unless a policy says otherwise;
//! the choice is cached by (topology fingerprint, free mask, count) so
//! scoring a thousand nodes does not run the search a thousand times.

pub mod best_fit;
pub mod binpack;
pub mod dot_prod;
pub mod fgd;
pub mod gpu_clustering;
pub mod gpu_packing;
pub mod gpusched;
pub mod profile;
pub mod random;
pub mod spread;
pub(crate) mod util;

#[cfg(test)]
pub(crate) mod testutil;

use gpusched_core::Packer;
pub use profile::{PodClass, Profile};

/// Names accepted by [`by_name`], in the order tables list them.
pub const POLICY_NAMES: &[&str] = &[
    "spread",
    "binpack",
    "random",
    "dot-prod",
    "gpu-clustering",
    "gpu-packing",
    "best-fit",
    "fgd",
    "gpusched",
];

/// A policy name [`by_name`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown packing policy {name:?} (known: {known})")]
pub struct UnknownPolicy {
    pub name: String,
    pub known: String,
}

/// Options shared by the constructors of [`by_name`].
#[derive(Clone, Debug, Default)]
pub struct PackerOptions {
    /// Target workload of the fragmentation-aware policies (`fgd`,
    /// `gpusched`). `None`: derived in `prepare` from the snapshot's pods.
    pub profile: Option<Profile>,
    /// Knobs of `gpusched` (`None`: its defaults).
    pub gpusched: Option<gpusched::GpuschedConfig>,
}

/// Builds the policy called `name` (one of [`POLICY_NAMES`]).
pub fn by_name(name: &str, opts: &PackerOptions) -> Result<Box<dyn Packer>, UnknownPolicy> {
    Ok(match name {
        "spread" => Box::new(spread::SpreadPacker::new()),
        "binpack" => Box::new(binpack::BinpackPacker::new()),
        "random" => Box::new(random::RandomPacker::new()),
        "dot-prod" => Box::new(dot_prod::DotProdPacker::new()),
        "gpu-clustering" => Box::new(gpu_clustering::GpuClusteringPacker::new()),
        "gpu-packing" => Box::new(gpu_packing::GpuPackingPacker::new()),
        "best-fit" => Box::new(best_fit::BestFitPacker::new()),
        "fgd" => Box::new(match &opts.profile {
            Some(p) => fgd::FgdPacker::with_profile(p.clone()),
            None => fgd::FgdPacker::new(),
        }),
        "gpusched" => Box::new(
            match &opts.profile {
                Some(p) => gpusched::GpuschedPacker::with_profile(p.clone()),
                None => gpusched::GpuschedPacker::new(),
            }
            .with_config(opts.gpusched.unwrap_or_default()),
        ),
        _ => {
            return Err(UnknownPolicy {
                name: name.to_string(),
                known: POLICY_NAMES.join(", "),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_builds_and_reports_its_name() {
        for n in POLICY_NAMES {
            let p = by_name(n, &PackerOptions::default()).unwrap();
            assert_eq!(p.name(), *n);
        }
        let e = by_name("tetris", &PackerOptions::default()).err().unwrap();
        assert!(e.to_string().contains("tetris"));
        assert!(e.to_string().contains("fgd"));
    }
}

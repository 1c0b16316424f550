//! Packing policies (the [`Packer`] extension point).
//!
//! Every policy is its own module and deterministic. The five stateless
//! baselines are a score function each on one shared shape
//! ([`scored::ScoredPacker`]); the others are their own struct:
//!
//! | name             | built by                       | idea |
//! |------------------|--------------------------------|------|
//! | `spread`         | [`spread::packer`]             | least allocated node, emptiest GPU |
//! | `binpack`        | [`binpack::packer`]            | most allocated node, fullest GPU |
//! | `random`         | [`random::RandomPacker`]       | uniform random node (seeded) |
//! | `dot-prod`       | [`dot_prod::packer`]           | Tetris dot product (FGD paper baseline) |
//! | `gpu-clustering` | [`gpu_clustering::GpuClusteringPacker`] | keep pods of one GPU shape together |
//! | `gpu-packing`    | [`gpu_packing::packer`]        | used GPUs, then used nodes, then free nodes |
//! | `best-fit`       | [`best_fit::packer`]           | least CPU+GPU left after placing |
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
pub mod names;
pub mod profile;
pub mod random;
pub mod scored;
pub mod spread;
pub(crate) mod util;

use gpusched_core::Packer;
pub use names::{POLICY_NAMES, PolicyName, UnknownPolicy};
pub use profile::{PodClass, Profile};
use serde::{Deserialize, Serialize};

/// Options shared by the constructors of [`build`]: what a run knows
/// beyond the configuration.
#[derive(Clone, Debug, Default)]
pub struct PackerOptions {
    /// Target workload of the fragmentation-aware policies (`fgd`,
    /// `gpusched`). `None`: derived in `prepare` from the snapshot's pods.
    pub profile: Option<Profile>,
    /// Knobs of `gpusched`, overriding the configuration's (experiments).
    pub gpusched: Option<gpusched::GpuschedConfig>,
}

/// Builds the policy `cfg` names, with its arguments.
pub fn build(cfg: &PackingConfig, opts: &PackerOptions) -> Box<dyn Packer> {
    match cfg {
        PackingConfig::Spread {} => Box::new(spread::packer()),
        PackingConfig::Binpack {} => Box::new(binpack::packer()),
        PackingConfig::Random {} => Box::new(random::RandomPacker::new()),
        PackingConfig::DotProd {} => Box::new(dot_prod::packer()),
        PackingConfig::GpuClustering {} => Box::new(gpu_clustering::GpuClusteringPacker::new()),
        PackingConfig::GpuPacking {} => Box::new(gpu_packing::packer()),
        PackingConfig::BestFit {} => Box::new(best_fit::packer()),
        PackingConfig::Fgd {} => Box::new(match &opts.profile {
            Some(p) => fgd::FgdPacker::with_profile(p.clone()),
            None => fgd::FgdPacker::new(),
        }),
        PackingConfig::Gpusched(args) => Box::new(
            match &opts.profile {
                Some(p) => gpusched::GpuschedPacker::with_profile(p.clone()),
                None => gpusched::GpuschedPacker::new(),
            }
            .with_config(opts.gpusched.unwrap_or(*args)),
        ),
    }
}

/// Builds the policy called `name` (one of [`POLICY_NAMES`]) with its
/// default arguments.
pub fn by_name(name: &str, opts: &PackerOptions) -> Result<Box<dyn Packer>, UnknownPolicy> {
    let p: PolicyName = name.parse()?;
    Ok(build(&PackingConfig::from(p), opts))
}

/// The packing policy of a configuration with its arguments (YAML:
/// `policy: <name>` plus that policy's fields; unknown fields denied).
///
/// ```yaml
/// packing:
///   policy: gpusched
///   quantize_scale: 2500   # GpuschedConfig fields, only for gpusched
/// ```
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "policy", rename_all = "kebab-case", deny_unknown_fields)]
pub enum PackingConfig {
    /// `spread` (no arguments).
    Spread {},
    /// `binpack` (no arguments).
    Binpack {},
    /// `random` (no arguments).
    Random {},
    /// `dot-prod` (no arguments).
    DotProd {},
    /// `gpu-clustering` (no arguments).
    GpuClustering {},
    /// `gpu-packing` (no arguments).
    GpuPacking {},
    /// `best-fit` (no arguments).
    BestFit {},
    /// `fgd` (no arguments).
    Fgd {},
    /// `gpusched` with its knobs.
    Gpusched(gpusched::GpuschedConfig),
}

impl Default for PackingConfig {
    fn default() -> Self {
        PackingConfig::from(PolicyName::default())
    }
}

impl From<PolicyName> for PackingConfig {
    /// The policy with its default arguments.
    fn from(p: PolicyName) -> Self {
        match p {
            PolicyName::Spread => PackingConfig::Spread {},
            PolicyName::Binpack => PackingConfig::Binpack {},
            PolicyName::Random => PackingConfig::Random {},
            PolicyName::DotProd => PackingConfig::DotProd {},
            PolicyName::GpuClustering => PackingConfig::GpuClustering {},
            PolicyName::GpuPacking => PackingConfig::GpuPacking {},
            PolicyName::BestFit => PackingConfig::BestFit {},
            PolicyName::Fgd => PackingConfig::Fgd {},
            PolicyName::Gpusched => PackingConfig::Gpusched(gpusched::GpuschedConfig::default()),
        }
    }
}

impl PackingConfig {
    /// The policy's name.
    pub fn policy(&self) -> PolicyName {
        match self {
            PackingConfig::Spread {} => PolicyName::Spread,
            PackingConfig::Binpack {} => PolicyName::Binpack,
            PackingConfig::Random {} => PolicyName::Random,
            PackingConfig::DotProd {} => PolicyName::DotProd,
            PackingConfig::GpuClustering {} => PolicyName::GpuClustering,
            PackingConfig::GpuPacking {} => PolicyName::GpuPacking,
            PackingConfig::BestFit {} => PolicyName::BestFit,
            PackingConfig::Fgd {} => PolicyName::Fgd,
            PackingConfig::Gpusched(_) => PolicyName::Gpusched,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policies_read_from_yaml_with_their_arguments() {
        let c: PackingConfig = serde_saphyr::from_str("policy: dot-prod").unwrap();
        assert_eq!(c, PackingConfig::DotProd {});
        let c: PackingConfig =
            serde_saphyr::from_str("policy: gpusched\nquantize_scale: 1500").unwrap();
        let PackingConfig::Gpusched(g) = &c else {
            panic!("{c:?}")
        };
        assert_eq!(g.quantize_scale, 1500.0);
        assert_eq!(g.size_order, gpusched::GpuschedConfig::default().size_order);
        assert_eq!(c.policy(), PolicyName::Gpusched);
        // unknown fields are denied, also arguments of another policy
        for bad in [
            "policy: gpusched\nquantise_scale: 1",
            "policy: fgd\nquantize_scale: 1",
            "policy: tetris",
        ] {
            assert!(
                serde_saphyr::from_str::<PackingConfig>(bad).is_err(),
                "{bad}"
            );
        }
        let back: PackingConfig =
            serde_saphyr::from_str(&serde_saphyr::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn every_name_builds_and_reports_its_name() {
        for p in PolicyName::ALL {
            assert_eq!(p.to_string().parse::<PolicyName>(), Ok(p));
            assert_eq!(
                build(&PackingConfig::from(p), &PackerOptions::default()).name(),
                p.as_str()
            );
        }
        for n in POLICY_NAMES {
            let p = by_name(n, &PackerOptions::default()).unwrap();
            assert_eq!(p.name(), n);
        }
        let e = by_name("tetris", &PackerOptions::default()).err().unwrap();
        assert!(e.to_string().contains("tetris"));
        assert!(e.to_string().contains("fgd"));
    }
}

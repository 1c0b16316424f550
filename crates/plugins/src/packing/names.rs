//! The packing policies' names (what configurations, `--policy` and the
//! tables say). Each packer names itself from here; the factory
//! ([`super::build`]) maps a name to its packer.

use serde::{Deserialize, Serialize};

/// A packing policy's name (YAML: kebab-case, e.g. `gpu-clustering`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// Least allocated node, emptiest GPU.
    Spread,
    /// Most allocated node, fullest GPU.
    Binpack,
    /// Uniformly random feasible node (seeded).
    Random,
    /// Tetris dot product (FGD paper baseline).
    DotProd,
    /// Keep pods of one GPU shape together.
    GpuClustering,
    /// Used GPUs, then used nodes, then free nodes.
    GpuPacking,
    /// Least CPU + GPU left after placing.
    BestFit,
    /// Fragmentation gradient descent (Weng et al., ATC '23).
    Fgd,
    /// Our default.
    #[default]
    Gpusched,
}

impl PolicyName {
    /// Every policy, in the order tables list them.
    pub const ALL: [PolicyName; 9] = [
        PolicyName::Spread,
        PolicyName::Binpack,
        PolicyName::Random,
        PolicyName::DotProd,
        PolicyName::GpuClustering,
        PolicyName::GpuPacking,
        PolicyName::BestFit,
        PolicyName::Fgd,
        PolicyName::Gpusched,
    ];

    /// The name (what [`Packer::name`] of the policy returns).
    pub const fn as_str(self) -> &'static str {
        match self {
            PolicyName::Spread => "spread",
            PolicyName::Binpack => "binpack",
            PolicyName::Random => "random",
            PolicyName::DotProd => "dot-prod",
            PolicyName::GpuClustering => "gpu-clustering",
            PolicyName::GpuPacking => "gpu-packing",
            PolicyName::BestFit => "best-fit",
            PolicyName::Fgd => "fgd",
            PolicyName::Gpusched => "gpusched",
        }
    }
}

impl std::fmt::Display for PolicyName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for PolicyName {
    type Err = UnknownPolicy;
    fn from_str(name: &str) -> Result<Self, UnknownPolicy> {
        PolicyName::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| UnknownPolicy {
                name: name.to_string(),
                known: POLICY_NAMES.join(", "),
            })
    }
}

/// Names of every policy, in the order tables list them.
pub const POLICY_NAMES: [&str; 9] = {
    let mut v = [""; 9];
    let mut i = 0;
    while i < 9 {
        v[i] = PolicyName::ALL[i].as_str();
        i += 1;
    }
    v
};

/// A policy name [`super::by_name`] does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown packing policy {name:?} (known: {known})")]
pub struct UnknownPolicy {
    /// The name asked for.
    pub name: String,
    /// The known names, comma-separated.
    pub known: String,
}

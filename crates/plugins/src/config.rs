//! Typed scheduler configuration (YAML), unknown fields denied.
//!
//! ```yaml
//! version: v1
//! actions:                 # the core's action knobs (SchedulerOptions)
//!   backfill: true
//!   reserve_after_ms: 300000
//!   preemption: true
//!   reclaim: true
//!   min_runtime_ms: 30000  # no preemption/reclaim victim younger than this
//!   preferences: before-packing  # | after-packing | ignore (docs/scheduling.md)
//! packing:
//!   policy: gpusched       # spread | binpack | random | dot-prod | gpu-clustering
//!                          # | gpu-packing | best-fit | fgd | gpusched
//!   quantize_scale: 2500   # the policy's own arguments (gpusched only)
//! filters: [node-unschedulable, node-affinity, taint-toleration, gpu-fit]
//! constraints:             # what depends on other pods, and preferences
//!   [inter-pod-affinity, pod-topology-spread, node-ports,
//!    node-affinity-preference, taint-preference]
//! ```

use crate::filters::{GpuFit, NodeAffinity, NodeUnschedulable, TaintToleration};
use crate::packing::{self, PackerOptions};
pub use crate::packing::{PackingConfig, PolicyName, UnknownPolicy};
use crate::podapi::{
    InterPodAffinity, NodeAffinityPreference, NodePorts, NodeVolumeLimits, PodTopologySpread,
    TaintPreference, VolumeBinding,
};
use gpusched_core::{Filter, PodConstraint, Scheduler, SchedulerOptions};
use serde::{Deserialize, Serialize};

/// The filters' names live in the core (the pending-pod classification,
/// `gpusched_core::report::classify`, tells their refusals apart by them).
pub use gpusched_core::FilterName;

/// The whole scheduler configuration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerConfig {
    #[serde(default = "v1")]
    /// Configuration schema version (`v1`).
    pub version: String,
    #[serde(default)]
    /// Options of the scheduling actions.
    pub actions: SchedulerOptions,
    #[serde(default)]
    /// The packing policy and its arguments.
    pub packing: PackingConfig,
    #[serde(default = "all_filters")]
    /// Filters, in the order they run (each at most once).
    pub filters: Vec<FilterName>,
    #[serde(default = "all_constraints")]
    /// Constraint plugins (inter-pod affinity, topology spread, host
    /// ports, preferences), in the order they run (each at most once).
    /// Leaving one out ignores that part of the Pod API.
    pub constraints: Vec<ConstraintName>,
}

fn v1() -> String {
    "v1".into()
}

impl SchedulerConfig {
    /// Reads a configuration (YAML) of `file` (contents `text`), unknown
    /// fields denied, with errors naming the file, line and field. Whether
    /// the values make a scheduler is [`build`]'s to say.
    pub fn from_yaml(
        file: &str,
        text: &str,
    ) -> Result<SchedulerConfig, gpusched_model::yaml::LoadError> {
        gpusched_model::yaml::parse(file, text)
    }
}

impl Default for SchedulerConfig {
    fn default() -> Self {
        SchedulerConfig {
            version: v1(),
            actions: SchedulerOptions::default(),
            packing: PackingConfig::default(),
            filters: all_filters(),
            constraints: all_constraints(),
        }
    }
}

/// The constraint plugins that can be registered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ConstraintName {
    /// Required and preferred pod affinity and anti-affinity.
    InterPodAffinity,
    /// Topology spread constraints.
    PodTopologySpread,
    /// Host port conflicts.
    NodePorts,
    /// PersistentVolumeClaims (VolumeBinding, VolumeZone, ReadWriteOncePod).
    VolumeBinding,
    /// CSI attach limits per node (NodeVolumeLimits).
    NodeVolumeLimits,
    /// Preferred node affinity weights.
    NodeAffinityPreference,
    /// `PreferNoSchedule` taints.
    TaintPreference,
}

impl ConstraintName {
    /// The name (the plugin's [`gpusched_core::PodConstraint::name`] and
    /// its YAML form).
    pub const fn as_str(self) -> &'static str {
        match self {
            ConstraintName::InterPodAffinity => "inter-pod-affinity",
            ConstraintName::PodTopologySpread => "pod-topology-spread",
            ConstraintName::NodePorts => "node-ports",
            ConstraintName::VolumeBinding => "volume-binding",
            ConstraintName::NodeVolumeLimits => "node-volume-limits",
            ConstraintName::NodeAffinityPreference => "node-affinity-preference",
            ConstraintName::TaintPreference => "taint-preference",
        }
    }
}

fn all_constraints() -> Vec<ConstraintName> {
    vec![
        ConstraintName::InterPodAffinity,
        ConstraintName::PodTopologySpread,
        ConstraintName::NodePorts,
        ConstraintName::VolumeBinding,
        ConstraintName::NodeVolumeLimits,
        ConstraintName::NodeAffinityPreference,
        ConstraintName::TaintPreference,
    ]
}

fn all_filters() -> Vec<FilterName> {
    vec![
        FilterName::NodeUnschedulable,
        FilterName::NodeAffinity,
        FilterName::TaintToleration,
        FilterName::GpuFit,
    ]
}

/// A configuration that cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("version: unsupported version {0:?} (supported: v1)")]
    /// A `version` other than the supported one.
    Version(String),
    #[error("filters: {0:?} listed twice")]
    /// A filter listed twice.
    DuplicateFilter(FilterName),
    #[error("constraints: {0:?} listed twice")]
    /// A constraint plugin listed twice.
    DuplicateConstraint(ConstraintName),
    #[error("packing.{0}")]
    /// A packing policy argument outside its domain.
    Packing(String),
}

/// Builds a scheduler from its configuration; plugins are registered
/// explicitly, in the order the configuration lists them.
pub fn build(cfg: &SchedulerConfig) -> Result<Scheduler, ConfigError> {
    build_with(cfg, &PackerOptions::default())
}

/// [`build`] with packer options (e.g. an explicit FGD target workload).
pub fn build_with(cfg: &SchedulerConfig, popts: &PackerOptions) -> Result<Scheduler, ConfigError> {
    if cfg.version != "v1" {
        return Err(ConfigError::Version(cfg.version.clone()));
    }
    let mut filters: Vec<Box<dyn Filter>> = Vec::new();
    for (i, f) in cfg.filters.iter().enumerate() {
        if cfg.filters[..i].contains(f) {
            return Err(ConfigError::DuplicateFilter(*f));
        }
        filters.push(match f {
            FilterName::NodeUnschedulable => Box::new(NodeUnschedulable),
            FilterName::NodeAffinity => Box::new(NodeAffinity),
            FilterName::TaintToleration => Box::new(TaintToleration),
            FilterName::GpuFit => Box::new(GpuFit),
        });
    }
    if let packing::PackingConfig::Gpusched(g) = &cfg.packing {
        g.validate().map_err(ConfigError::Packing)?;
    }
    let mut constraints: Vec<Box<dyn PodConstraint>> = Vec::new();
    for (i, c) in cfg.constraints.iter().enumerate() {
        if cfg.constraints[..i].contains(c) {
            return Err(ConfigError::DuplicateConstraint(*c));
        }
        constraints.push(match c {
            ConstraintName::InterPodAffinity => Box::new(InterPodAffinity),
            ConstraintName::PodTopologySpread => Box::new(PodTopologySpread),
            ConstraintName::NodePorts => Box::new(NodePorts),
            ConstraintName::VolumeBinding => Box::new(VolumeBinding),
            ConstraintName::NodeVolumeLimits => Box::new(NodeVolumeLimits),
            ConstraintName::NodeAffinityPreference => Box::new(NodeAffinityPreference),
            ConstraintName::TaintPreference => Box::new(TaintPreference),
        });
    }
    let packer = packing::build(&cfg.packing, popts);
    Ok(Scheduler::new(cfg.actions.clone(), filters, packer).with_constraints(constraints))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_arguments_outside_their_domain_are_refused_by_name() {
        let bad = |yaml: &str| {
            let cfg: SchedulerConfig = serde_saphyr::from_str(yaml).unwrap();
            match build(&cfg) {
                Err(e) => e.to_string(),
                Ok(_) => panic!("{yaml} was accepted"),
            }
        };
        let e = bad("version: v1\npacking:\n  policy: gpusched\n  scarcity_exponent: -2\n");
        assert!(e.contains("packing.scarcity_exponent: -2"), "{e}");
        let e = bad("version: v1\npacking:\n  policy: gpusched\n  coverage: 1.5\n");
        assert!(
            e.contains("packing.coverage") && e.contains("(0, 1]"),
            "{e}"
        );
        // the node-size order is a name: a number is refused when parsed,
        // naming the field and the names it takes
        let e = serde_saphyr::from_str::<SchedulerConfig>(
            "version: v1\npacking:\n  policy: gpusched\n  size_order: 3\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains(
                "size_order: 3 (must be one of largest-last, fewer-first, more-first, none)"
            ),
            "{e}"
        );
        let e = serde_saphyr::from_str::<SchedulerConfig>(
            "version: v1\npacking:\n  policy: gpusched\n  size_order: smallest\n",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("size_order: \"smallest\" (must be one of"),
            "{e}"
        );
        let named: SchedulerConfig = serde_saphyr::from_str(
            "version: v1\npacking:\n  policy: gpusched\n  size_order: fewer-first\n",
        )
        .unwrap();
        assert!(build(&named).is_ok());
        let ok: SchedulerConfig = serde_saphyr::from_str(
            "version: v1\npacking:\n  policy: gpusched\n  scarcity_exponent: 3\n",
        )
        .unwrap();
        assert!(build(&ok).is_ok());
    }

    #[test]
    fn defaults_build() {
        let s = build(&SchedulerConfig::default()).unwrap();
        assert_eq!(s.packer_name(), "gpusched");
        assert_eq!(
            s.filter_names(),
            vec![
                "node-unschedulable",
                "node-affinity",
                "taint-toleration",
                "gpu-fit"
            ]
        );
    }

    #[test]
    fn constraint_plugins_are_registered_by_default_and_once() {
        let s = build(&SchedulerConfig::default()).unwrap();
        assert_eq!(
            s.constraint_names(),
            vec![
                "inter-pod-affinity",
                "pod-topology-spread",
                "node-ports",
                "volume-binding",
                "node-volume-limits",
                "node-affinity-preference",
                "taint-preference"
            ]
        );
        for c in all_constraints() {
            let yaml = serde_saphyr::to_string(&c).unwrap();
            assert_eq!(yaml.trim(), c.as_str());
        }
        let cfg: SchedulerConfig = serde_saphyr::from_str(
            "version: v1\nactions:\n  preferences: after-packing\nconstraints: [node-ports, node-ports]\n",
        )
        .unwrap();
        let e = build(&cfg).err().unwrap().to_string();
        assert!(e.contains("NodePorts") && e.contains("twice"), "{e}");
        let e = serde_saphyr::from_str::<SchedulerConfig>(
            "version: v1\nactions:\n  preferences: sometimes\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("sometimes"), "{e}");
    }

    #[test]
    fn filter_names_match_their_yaml_form() {
        for f in all_filters() {
            let yaml = serde_saphyr::to_string(&f).unwrap();
            assert_eq!(yaml.trim(), f.as_str());
        }
    }

    #[test]
    fn bad_values_are_named() {
        let mut c = SchedulerConfig::default();
        c.filters.push(FilterName::GpuFit);
        assert!(build(&c).is_err());
        c = SchedulerConfig {
            version: "v9".into(),
            ..Default::default()
        };
        assert!(build(&c).err().unwrap().to_string().contains("v9"));
    }
}

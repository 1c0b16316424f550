//! Constraint plugins (the [`gpusched_core::PodConstraint`] extension
//! point): what depends on where other pods run, and what ranks nodes.
//!
//! - [`InterPodAffinity`]: required and preferred pod affinity and
//!   anti-affinity, with the symmetry rules (existing pods' required
//!   anti-affinity refuses the incoming pod; their preferred terms and
//!   required affinity terms score it).
//! - [`PodTopologySpread`]: `DoNotSchedule` constraints filter,
//!   `ScheduleAnyway` ones score.
//! - [`NodePorts`]: host port conflicts per node.
//! - [`VolumeBinding`]: PersistentVolumeClaims (bound volumes' node
//!   affinity and zone, `WaitForFirstConsumer` volume choice,
//!   `ReadWriteOncePod`).
//! - [`NodeVolumeLimits`]: CSI attach limits per node (`CSINode`).
//! - [`NodeAffinityPreference`]: preferred node affinity weights.
//! - [`TaintPreference`]: `PreferNoSchedule` taints the pod does not
//!   tolerate.
//!
//! Each keeps per-cycle counts that the core updates through
//! `add_pod`/`remove_pod` as statements place and remove pods, so a check
//! costs a lookup per node, not a scan of the pods.

mod domains;
mod interpod;
mod limits;
mod ports;
mod prefs;
mod spread;
mod volumes;

pub use interpod::InterPodAffinity;
pub use limits::NodeVolumeLimits;
pub use ports::NodePorts;
pub use prefs::{NodeAffinityPreference, TaintPreference};
pub use spread::PodTopologySpread;
pub use volumes::{RWOP_CONFLICT, VolumeBinding};

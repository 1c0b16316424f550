//! Pure data model of gpusched.
//!
//! Everything here is plain data plus pure functions: no I/O, no clock, no
//! randomness. The scheduler core, the simulator, the Kubernetes adapter and
//! the node agent all share these types. The node agent shares only
//! [`topology`] (GPU-set scoring) and [`spec`] (the node/cluster vocabulary).

pub mod dra;
pub mod duration;
pub mod gpu;
pub mod labels;
pub mod mix;
pub mod node;
pub mod pod;
pub mod podapi;
pub mod protocol;
pub mod quantity;
pub mod queue;
pub mod resources;
pub mod sharing;
pub mod spec;
pub mod topology;
pub mod validate;
pub mod volume;
pub mod yaml;

pub use gpu::{Gpu, GpuHealth, MigSlot};
pub use node::{Node, Taint, TaintEffect};
pub use pod::{
    GpuRequest, MigAsk, NODE_NAME_FIELD, NodeNameRequirement, NodeSelectorOp,
    NodeSelectorRequirement, NodeSelectorTerm, Pod, PodGroup, Toleration, TolerationOp,
    TopologyConstraint, TopologyLevel,
};
pub use podapi::{
    HostPort, LabelSelector, PodAffinityTerm, PodConstraints, PreferredNodeTerm, Protocol,
    SpreadConstraint, SpreadPolicy, WeightedPodAffinityTerm, WhenUnsatisfiable,
};
pub use quantity::{Quantity, QuantityError};
pub use queue::Queue;
pub use resources::{GPU_MILLI, ResourceKind, ResourceLimit, ResourceVec};
pub use volume::{
    ClaimNeed, ClaimPick, CsiVolume, MAX_VOLUME_COUNT, PvChoice, VolumeConflict, pick_volumes,
};

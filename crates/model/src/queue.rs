//! Queues: a tree with weights, guarantees and limits.

use crate::resources::{ResourceLimit, ResourceVec};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One queue of the queue tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Queue {
    /// Queue name, unique in a snapshot.
    pub name: String,
    /// Parent queue; `None` for a child of the root.
    pub parent: Option<String>,
    /// Weight among siblings for fair share (≥ 1).
    pub weight: u32,
    /// Guaranteed resources (deserved even under contention).
    pub guarantee: ResourceVec,
    /// Guaranteed GPUs per model, milli-GPU (e.g. `{"H100": 16000}`).
    pub gpu_guarantee_by_model: BTreeMap<String, u64>,
    /// Hard cap on the queue's usage, on the dimensions it names; `None`:
    /// no cap.
    pub limit: Option<ResourceLimit>,
    /// Whether the queue may use more than its guarantee when others idle.
    pub can_borrow: bool,
    /// Whether resources it borrowed may be taken back by reclaim.
    pub reclaimable: bool,
    /// Every pod of the queue may be moved by consolidation (as if each
    /// were marked `gpusched.io/movable: "true"`).
    #[serde(default)]
    pub movable: bool,
    /// How long (ms) its pods run before they may be chosen as preemption
    /// or reclaim victims, counted from their bind (a gang from its
    /// youngest running member). `None`: its parent's, up to the
    /// scheduler's default (`SchedulerOptions::min_runtime_ms`).
    #[serde(default)]
    pub min_runtime_ms: Option<u64>,
}

impl Queue {
    /// A queue under the root with weight 1, no guarantee, no limit, borrowing and reclaimable.
    pub fn new(name: impl Into<String>) -> Self {
        Queue {
            name: name.into(),
            parent: None,
            weight: 1,
            guarantee: ResourceVec::default(),
            gpu_guarantee_by_model: BTreeMap::new(),
            limit: None,
            can_borrow: true,
            reclaimable: true,
            movable: false,
            min_runtime_ms: None,
        }
    }
}

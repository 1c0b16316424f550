//! The action pipeline.

use crate::decision::CycleOutput;
use crate::plugin::{Filter, Packer};
use crate::snapshot::Snapshot;
use serde::{Deserialize, Serialize};

/// Knobs of the action pipeline (policy knobs live in the plugins).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerOptions {
    /// Let smaller jobs use idle capacity while a bigger one waits.
    pub backfill: bool,
    /// After the head of a queue has waited this long (ms), capacity is
    /// reserved for it and backfill may no longer use it.
    pub reserve_after_ms: u64,
    /// Preempt lower-priority pods of the same queue.
    pub preemption: bool,
    /// Reclaim borrowed capacity across queues.
    pub reclaim: bool,
    /// Upper bound on evictions per cycle.
    pub max_evictions_per_cycle: u32,
}

impl Default for SchedulerOptions {
    fn default() -> Self {
        SchedulerOptions {
            backfill: true,
            reserve_after_ms: 300_000,
            preemption: true,
            reclaim: true,
            max_evictions_per_cycle: 64,
        }
    }
}

/// The scheduler: the action pipeline plus explicitly registered plugins.
pub struct Scheduler {
    pub opts: SchedulerOptions,
    filters: Vec<Box<dyn Filter>>,
    packer: Box<dyn Packer>,
}

impl Scheduler {
    pub fn new(
        opts: SchedulerOptions,
        filters: Vec<Box<dyn Filter>>,
        packer: Box<dyn Packer>,
    ) -> Self {
        Scheduler {
            opts,
            filters,
            packer,
        }
    }

    pub fn packer_name(&self) -> &'static str {
        self.packer.name()
    }

    /// One scheduling cycle over `snap` at virtual time `now_ms`.
    pub fn cycle(&mut self, snap: &Snapshot, now_ms: u64, seed: u64) -> CycleOutput {
        let _ = (snap, now_ms, seed, &self.filters);
        CycleOutput::default()
    }
}

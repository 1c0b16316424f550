//! Actions: the steps of a cycle, one module each, behind one seam.
//!
//! An action reads and changes the cycle's state ([`Cycle`]) through its
//! helpers (statements, binds, the candidate index) and may add decisions
//! and pending reasons. A new action goes in its own module here and into
//! [`pipeline`], which builds the list from [`SchedulerOptions`].

mod allocate;
mod consolidate;
mod evict;
mod explain;
mod reserve;

use super::SchedulerOptions;
use super::cycle::Cycle;
use super::jobs::Job;
use crate::reason::EvictionKind;

/// One step of the cycle.
pub(super) trait Action {
    /// Runs the step over the cycle's jobs.
    fn run(&self, c: &mut Cycle<'_>, jobs: &[Job]);
}

/// The actions of a cycle, in order: allocate (with backfill and
/// reservations), consolidate, preempt and reclaim when enabled, explain.
/// Consolidation goes before preemption: moving a pod that opted in
/// restarts it elsewhere, preempting it sends it back to wait.
pub(super) fn pipeline(opts: &SchedulerOptions) -> Vec<Box<dyn Action>> {
    let mut v: Vec<Box<dyn Action>> = vec![Box::new(allocate::Allocate)];
    if opts.consolidation {
        v.push(Box::new(consolidate::Consolidate));
    }
    if opts.preemption {
        v.push(Box::new(evict::Evict(EvictionKind::Preempt)));
    }
    if opts.reclaim {
        v.push(Box::new(evict::Evict(EvictionKind::Reclaim)));
    }
    v.push(Box::new(explain::Explain));
    v
}

//! Equivalent jobs: a deep queue is mostly jobs of a few shapes (a
//! training job's gangs, a sweep's pods). Once a job failed, a later job
//! of the same shape fails the same way as long as nothing was committed
//! in between — the placement search is a function of the cluster state,
//! the reservations and the pods' signatures only — so it is not tried
//! again: its pods get the failed job's reasons (with their own names).
//!
//! Two jobs have the same shape when the pods that must start together
//! have the same signatures in the same order (the candidate index's
//! [`crate::plugin::SchedulingKey`]: requests, GPU ask and what each
//! filter and the packer read), the same count, and, for the eviction
//! passes, the same queue and priority. A job is never treated as
//! equivalent when something makes its search its own: a topology
//! constraint, a node reserved or nominated for it, or a pod whose
//! constraint plugins (affinity, spread, ports) have something to say.
//! "Nothing committed" is the cycle's decision count: every change to the
//! state that outlives a trial (bind, nomination, reservation, eviction)
//! adds a decision.
//!
//! This is exact: a cycle with it decides and explains exactly what a
//! cycle without it would (`SchedulerOptions::skip_equivalent_jobs` off;
//! the simulator's `tests/deep_queue.rs` runs both ways), only
//! `CycleStats::nodes_scored` is lower and `CycleStats::jobs_skipped`
//! counts the jobs it spared.

use super::cycle::Cycle;
use super::jobs::{Job, JobId};
use crate::reason::{EvictionAttempt, EvictionKind, EvictionOutcome, PendingReason};
use std::collections::BTreeMap;

/// A job's shape: the signatures of its pods that must start together (in
/// order), whether it is a gang, and (for the eviction passes) the pass,
/// its queue and its priority.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct Shape {
    sigs: Vec<usize>,
    gang: bool,
    evict: Option<(u8, usize, i32)>,
}

/// What an allocate attempt of a shape came to.
#[derive(Clone, Debug)]
struct AllocFail {
    /// The decision count when it failed.
    at: usize,
    /// How many of its pods fitted before one did not (a gang's
    /// `GangShort` note), if it noted that.
    fit: Option<u32>,
}

/// What an eviction pass for a shape came to (nothing committed).
#[derive(Clone, Debug)]
struct EvictFail {
    at: usize,
    attempt: EvictionAttempt,
    /// The position in the job's pods of the pod the outcome names.
    named: Option<usize>,
}

/// The failures of this cycle by shape.
#[derive(Default)]
pub(super) struct Equivalence {
    alloc: BTreeMap<Shape, AllocFail>,
    evict: BTreeMap<Shape, EvictFail>,
}

impl<'s> Cycle<'s> {
    /// The shape of job `j`, if it may be treated as equivalent to others.
    pub(super) fn shape(
        &mut self,
        j: JobId,
        job: &Job,
        count: usize,
        evict: Option<EvictionKind>,
    ) -> Option<Shape> {
        if !self.opts.skip_equivalent_jobs
            || count == 0
            || job.topology.is_some()
            || !job.nominated.is_empty()
            || self.reserving.contains(&j)
        {
            return None;
        }
        let mut sigs = Vec::with_capacity(count);
        for &p in job.pods.get(..count)? {
            if !self.pre_filter(p).is_none() {
                return None;
            }
            sigs.push(self.sig_of(p));
        }
        Some(Shape {
            sigs,
            gang: job.group.is_some(),
            evict: evict.map(|k| (k as u8, job.queue, job.priority)),
        })
    }

    /// If an equivalent job failed to be placed with nothing committed
    /// since, notes the same reason for `job`'s pods and says so.
    pub(super) fn alloc_failed_before(&mut self, shape: &Shape, job: &Job) -> bool {
        let Some(f) = self.equiv.alloc.get(shape) else {
            return false;
        };
        if f.at != self.out.decisions.len() {
            return false;
        }
        if let Some(fit) = f.fit {
            let why = PendingReason::GangShort {
                group: job.name.clone(),
                fit,
                need: job.need as u32,
            };
            for &p in &job.pods {
                self.notes.insert_if_none(p, || why.clone());
            }
        }
        self.out.stats.jobs_skipped += 1;
        true
    }

    /// Records that `job` (of `shape`) could not be placed.
    pub(super) fn alloc_failed(&mut self, shape: Shape, job: &Job) {
        let fit = match job.pods.first().and_then(|p| self.notes.get(p)) {
            Some(PendingReason::GangShort { group, fit, .. }) if *group == job.name => Some(*fit),
            _ => None,
        };
        let at = self.out.decisions.len();
        self.equiv.alloc.insert(shape, AllocFail { at, fit });
    }

    /// If an equivalent job's eviction pass freed nothing with nothing
    /// committed since, notes the same outcome for `job`'s pods.
    pub(super) fn evict_failed_before(&mut self, shape: &Shape, j: JobId, job: &Job) -> bool {
        let Some(f) = self.equiv.evict.get(shape) else {
            return false;
        };
        if f.at != self.out.decisions.len() {
            return false;
        }
        let mut attempt = f.attempt.clone();
        if let (EvictionOutcome::NoNode { pod, .. }, Some(k)) = (&mut attempt.outcome, f.named) {
            match job.pods.get(k) {
                Some(&p) => *pod = self.pod(p).name.clone(),
                None => return false,
            }
        }
        if let Some(notes) = self.evict_notes.get_mut(j) {
            notes.push(attempt);
        }
        self.out.stats.jobs_skipped += 1;
        true
    }

    /// After an eviction pass for `job` (of `shape`): records its outcome
    /// if it committed nothing (`before`: the decision count and the number
    /// of attempts noted for the job before the pass).
    pub(super) fn evict_done(&mut self, shape: Shape, j: JobId, job: &Job, before: (usize, usize)) {
        let at = self.out.decisions.len();
        if at != before.0 || job.pods.is_empty() {
            return;
        }
        let Some(notes) = self.evict_notes.get(j) else {
            return;
        };
        if notes.len() != before.1 + 1 {
            return;
        }
        let Some(attempt) = notes.last().cloned() else {
            return;
        };
        let named = match &attempt.outcome {
            EvictionOutcome::NoNode { pod, .. } => {
                match job.pods.iter().position(|&p| self.pod(p).name == *pod) {
                    Some(k) => Some(k),
                    None => return,
                }
            }
            _ => None,
        };
        self.equiv
            .evict
            .insert(shape, EvictFail { at, attempt, named });
    }
}

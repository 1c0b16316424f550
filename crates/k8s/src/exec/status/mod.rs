//! PodGroup and Queue status, level-triggered: every status tick computes
//! the status each object should have from the world ([`wanted_group`],
//! [`queue_figures`]), compares it with the status the watches last showed,
//! and writes the objects that differ ([`StatusWriter`]), one write per
//! object in flight, until they agree. A write that lands late, or is
//! lost, is corrected at the next tick after [`STATUS_SETTLE`]; nothing is
//! written "on change" only. The executor's status writes (these, and a
//! pod's `PodScheduled` condition) are here: this module is the one writer
//! of status subresources, every body typed ([`StatusPatch`]).
//!
//! `group.rs` and `queue.rs` say what a PodGroup's and a Queue's status
//! should be (pure); `publish.rs` is the tick; here the writers and what
//! they share (settling, conditions, the merge diff).

use super::{clip, patch_params};
use crate::crd::{PodGroupStatus, QueueStatus, phase_name};
use crate::world::{Built, Problem};
use gpusched_core::GroupPhase;
use gpusched_core::report::classify::PendingClass;
use gpusched_model::ResourceVec;
use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::Patch;
use serde_json::{Map, Value};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod group;
mod publish;
mod queue;
pub use group::{
    GroupFacts, SCHEDULED_CONDITION, group_facts, phase_text, scheduled_condition, wanted_group,
    wanted_phase,
};
pub use queue::{QueueFigures, queue_figures, wanted_queue};

/// How long a status that was written may still differ from what the
/// watch shows before it is written again (the watch is that late, or the
/// write was lost or overtaken). Each further write of the same status
/// waits twice as long, up to [`STATUS_SETTLE_MAX`] (an object whose
/// status never reads back equal, e.g. one the watch cannot decode, is
/// not written every few seconds forever).
pub const STATUS_SETTLE: Duration = Duration::from_secs(5);

/// The longest wait between two writes of the same status.
pub const STATUS_SETTLE_MAX: Duration = Duration::from_secs(300);

/// The wait after the `n`th write of one status (1 or more).
pub fn settle_after(n: u32) -> Duration {
    STATUS_SETTLE
        .saturating_mul(1u32 << n.saturating_sub(1).min(16))
        .min(STATUS_SETTLE_MAX)
}

/// The `Valid` condition (`error`: why the spec cannot be used), its time
/// left at the epoch for [`settle_conditions`].
pub fn valid_condition(error: Option<&str>) -> Condition {
    let (status, reason, message) = match error {
        None => ("True", "Valid", String::new()),
        Some(e) => ("False", "InvalidSpec", crate::exec::clip(e)),
    };
    Condition {
        type_: "Valid".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// Gives each wanted condition its `lastTransitionTime`: the observed one
/// while the condition's status is unchanged, else `now`.
pub fn settle_conditions(wanted: &mut [Condition], observed: &[Condition], now: &Time) {
    for c in wanted {
        c.last_transition_time = match observed.iter().find(|o| o.type_ == c.type_) {
            Some(o) if o.status == c.status => o.last_transition_time.clone(),
            _ => now.clone(),
        };
    }
}

/// The current time as the API stores it (whole seconds), so a written
/// condition reads back equal.
pub fn now_time() -> Time {
    let now = k8s_openapi::jiff::Timestamp::now();
    Time(k8s_openapi::jiff::Timestamp::from_second(now.as_second()).unwrap_or(now))
}

/// A JSON merge patch (RFC 7386) that turns `from` into `to`: changed
/// members, `null` for members `to` lacks, objects recursively, arrays and
/// scalars whole. `None` when they are equal.
pub fn merge_diff(from: &Value, to: &Value) -> Option<Value> {
    if from == to {
        return None;
    }
    let (Value::Object(f), Value::Object(t)) = (from, to) else {
        return Some(to.clone());
    };
    let mut out = Map::new();
    for (k, fv) in f {
        match t.get(k) {
            None => {
                out.insert(k.clone(), Value::Null);
            }
            Some(tv) => {
                if let Some(d) = merge_diff(fv, tv) {
                    out.insert(k.clone(), d);
                }
            }
        }
    }
    for (k, tv) in t {
        if !f.contains_key(k) {
            out.insert(k.clone(), tv.clone());
        }
    }
    Some(Value::Object(out))
}

/// Which objects' status to write, per kind: remembers the last write of
/// each object and which writes are in flight.
pub struct StatusWriter<S> {
    /// Per object: the status last written, when, and how many times in a
    /// row.
    last: BTreeMap<String, (S, Instant, u32)>,
    in_flight: Arc<Mutex<BTreeSet<String>>>,
}

impl<S> Default for StatusWriter<S> {
    fn default() -> Self {
        StatusWriter {
            last: BTreeMap::new(),
            in_flight: Arc::default(),
        }
    }
}

/// Marks a write in flight until dropped.
pub struct InFlight {
    key: String,
    set: Arc<Mutex<BTreeSet<String>>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut s = self.set.lock().unwrap_or_else(|e| e.into_inner());
        s.remove(&self.key);
    }
}

impl<S: Clone + PartialEq> StatusWriter<S> {
    /// The objects to write now, with their wanted status: those that
    /// exist (`observed` has them) and whose observed status differs from
    /// the wanted one, unless a write of theirs is in flight, or the same
    /// status was written less than [`settle_after`] ago. Each comes with
    /// a guard that marks its write in flight until dropped.
    pub fn due(
        &mut self,
        wanted: BTreeMap<String, S>,
        observed: &BTreeMap<String, Option<S>>,
        now: Instant,
    ) -> Vec<(String, S, InFlight)> {
        self.last.retain(|k, _| observed.contains_key(k));
        let mut out = Vec::new();
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        for (k, w) in wanted {
            let Some(obs) = observed.get(&k) else {
                continue;
            };
            if obs.as_ref() == Some(&w) || in_flight.contains(&k) {
                continue;
            }
            let mut n = 1;
            if let Some((l, at, times)) = self.last.get(&k)
                && *l == w
            {
                if now.saturating_duration_since(*at) < settle_after(*times) {
                    continue;
                }
                n = times + 1;
            }
            self.last.insert(k.clone(), (w.clone(), now, n));
            in_flight.insert(k.clone());
            let guard = InFlight {
                key: k.clone(),
                set: self.in_flight.clone(),
            };
            out.push((k, w, guard));
        }
        out
    }
}

/// GPUs as the status shows them: whole numbers plain, shares exactly
/// (the reports' text).
pub use gpusched_core::report::gpus_text;

/// Type of the pod condition the scheduler writes.
pub const POD_SCHEDULED: &str = "PodScheduled";

/// The body of a status patch: only `status` (no kind, no metadata).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct StatusPatch<S> {
    /// The status fields to write.
    pub status: S,
}

/// The patch of a pending pod's status: its `PodScheduled` condition False
/// with `reason` and `message` (clipped to the API's limit), changed `at`.
pub fn pod_condition_patch(reason: &str, message: &str, at: Time) -> StatusPatch<PodStatus> {
    StatusPatch {
        status: PodStatus {
            conditions: Some(vec![PodCondition {
                type_: POD_SCHEDULED.into(),
                status: "False".into(),
                reason: Some(reason.into()),
                message: Some(clip(message)),
                last_transition_time: Some(at),
                ..Default::default()
            }]),
            ..Default::default()
        },
    }
}

/// The status writers of the executor: every write of a status
/// subresource (pod conditions, PodGroup and Queue status) goes through
/// here.
impl super::Executor {
    /// The pod's `PodScheduled` condition: False with `reason` and
    /// `message` (clipped to the API's limit), a strategic merge patch of
    /// the status subresource (the list merges by `type`).
    pub(super) fn pod_condition(&self, ns: &str, name: &str, reason: &str, message: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let name = name.to_string();
        let patch = pod_condition_patch(reason, message, now_time());
        self.write(move || async move {
            api.patch_status(&name, &patch_params(), &Patch::Strategic(patch))
                .await
                .map(|_| ())
        });
    }

    /// One status write: a merge patch from the observed status to the
    /// wanted one, in flight until `guard` drops.
    pub(super) fn write_status<K, S>(
        &self,
        api: Api<K>,
        name: String,
        from: Option<&S>,
        to: &S,
        guard: InFlight,
    ) where
        K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
        S: serde::Serialize,
    {
        let from = from
            .and_then(|f| serde_json::to_value(f).ok())
            .unwrap_or_else(|| Value::Object(Map::new()));
        let Ok(to) = serde_json::to_value(to) else {
            return;
        };
        let Some(diff) = merge_diff(&from, &to) else {
            return;
        };
        let patch = StatusPatch { status: diff };
        self.write(move || async move {
            let _guard = guard;
            match api
                .patch_status(&name, &patch_params(), &Patch::Merge(patch))
                .await
            {
                Ok(_) => Ok(()),
                // gone: the watch drops it
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => {
                    tracing::info!("status of {name}: {e}");
                    Err(e)
                }
            }
        });
    }
}

#[cfg(test)]
mod tests;

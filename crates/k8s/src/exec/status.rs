//! PodGroup and Queue status, level-triggered: every status tick computes
//! the status each object should have from the world ([`wanted_group`],
//! [`queue_figures`]), compares it with the status the watches last showed,
//! and writes the objects that differ ([`StatusWriter`]), one write per
//! object in flight, until they agree. A write that lands late, or is
//! lost, is corrected at the next tick after [`STATUS_SETTLE`]; nothing is
//! written "on change" only. The executor's status writes (these, and a
//! pod's `PodScheduled` condition) are here: this module is the one writer
//! of status subresources.

use super::{clip, patch_params};
use crate::crd::{PodGroupStatus, QueueStatus, phase_name};
use crate::world::{Built, Problem};
use gpusched_core::GroupPhase;
use gpusched_model::ResourceVec;
use gpusched_plugins::classify::PendingClass;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::Api;
use kube::api::Patch;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// What a PodGroup's status follows from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    /// `spec.minMember` (0 when the spec is invalid).
    pub min_member: u32,
    /// Members bound or being bound.
    pub scheduled: u32,
    /// Members running.
    pub running: u32,
    /// Members pending (not bound, not being bound).
    pub pending: u32,
    /// The last cycle timed the group out.
    pub timed_out: bool,
    /// Why the spec cannot be used.
    pub invalid: Option<String>,
    /// Why its pending members wait: the most specific class among them
    /// and that member's message (the last cycle's explanations).
    pub waiting: Option<(PendingClass, String)>,
}

/// The phase a group should show. With members pending: `Running` once
/// minMember are placed, else `TimedOut` when the core gave up, else
/// `Inqueue` when enough members exist, else `Pending`. With no member
/// pending and fewer than minMember placed (members finished or deleted)
/// the phase stays what it is (a finished gang stays `Running`); `Pending`
/// if it has none yet. An invalid group is `Pending`.
pub fn wanted_phase(f: &GroupFacts, observed: Option<GroupPhase>) -> GroupPhase {
    if f.invalid.is_some() {
        GroupPhase::Pending
    } else if f.scheduled >= f.min_member.max(1) {
        GroupPhase::Running
    } else if f.timed_out {
        GroupPhase::TimedOut
    } else if f.pending > 0 && f.scheduled + f.pending >= f.min_member {
        GroupPhase::Inqueue
    } else if f.pending > 0 {
        GroupPhase::Pending
    } else {
        observed.unwrap_or(GroupPhase::Pending)
    }
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

/// Type of the PodGroup condition that says whether the gang is placed
/// and, while it is not, why (the reasons of [`PendingClass::reason_name`]).
pub const SCHEDULED_CONDITION: &str = "Scheduled";

/// The `Scheduled` condition for a group in `phase`, its time left at the
/// epoch for [`settle_conditions`].
pub fn scheduled_condition(f: &GroupFacts, phase: GroupPhase) -> Condition {
    let (status, reason, message) = if f.invalid.is_some() {
        (
            "False",
            "InvalidSpec",
            "the PodGroup's spec is invalid (see the Valid condition)".to_string(),
        )
    } else if phase == GroupPhase::Running {
        (
            "True",
            "Scheduled",
            format!(
                "{} of minMember {} members placed",
                f.scheduled, f.min_member
            ),
        )
    } else if phase == GroupPhase::TimedOut {
        let msg = f
            .waiting
            .as_ref()
            .map(|(_, m)| m.clone())
            .unwrap_or_else(|| "the gang gave up after its schedule timeout".into());
        ("False", PendingClass::GangTimedOut.reason_name(), msg)
    } else {
        match &f.waiting {
            Some((c, m)) => ("False", c.reason_name(), m.clone()),
            None => (
                "False",
                PendingClass::GangIncomplete.reason_name(),
                format!(
                    "{} of minMember {} members exist",
                    f.scheduled + f.pending,
                    f.min_member
                ),
            ),
        }
    };
    Condition {
        type_: SCHEDULED_CONDITION.into(),
        status: status.into(),
        reason: reason.into(),
        message: crate::exec::clip(&message),
        last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        observed_generation: None,
    }
}

/// The status a PodGroup should have (conditions still to be settled).
pub fn wanted_group(f: &GroupFacts, observed: Option<&PodGroupStatus>) -> PodGroupStatus {
    let phase = wanted_phase(f, observed.and_then(|o| o.phase));
    PodGroupStatus {
        phase: Some(phase),
        scheduled: f.scheduled,
        running: f.running,
        conditions: vec![
            valid_condition(f.invalid.as_deref()),
            scheduled_condition(f, phase),
        ],
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

/// The facts of every gpusched PodGroup (`counts`: members scheduled and
/// running per group, from the world; `timed_out`: groups the last cycle
/// timed out).
pub fn group_facts(
    built: &Built,
    counts: &BTreeMap<String, (u32, u32)>,
    timed_out: &BTreeSet<String>,
    waiting: &BTreeMap<String, (PendingClass, String)>,
) -> BTreeMap<String, GroupFacts> {
    let mut pending: BTreeMap<&str, u32> = BTreeMap::new();
    for p in &built.snapshot.pods {
        if p.is_pending()
            && let Some(g) = &p.pod.group
        {
            *pending.entry(g.as_str()).or_default() += 1;
        }
    }
    let min: BTreeMap<&str, u32> = built
        .snapshot
        .groups
        .iter()
        .map(|g| (g.name.as_str(), g.min_member))
        .collect();
    let mut invalid: BTreeMap<&str, &str> = BTreeMap::new();
    for p in &built.problems {
        if let Problem::InvalidGroup { group, error } = p {
            invalid.insert(group, error);
        }
    }
    counts
        .iter()
        .map(|(k, &(scheduled, running))| {
            let facts = GroupFacts {
                min_member: min.get(k.as_str()).copied().unwrap_or(0),
                scheduled,
                running,
                pending: pending.get(k.as_str()).copied().unwrap_or(0),
                timed_out: timed_out.contains(k),
                invalid: invalid.get(k.as_str()).map(|e| e.to_string()),
                waiting: waiting.get(k).cloned(),
            };
            (k.clone(), facts)
        })
        .collect()
}

/// One queue's figures: what its status and metrics show.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueFigures {
    /// Held by its subtree's pods.
    pub allocated: ResourceVec,
    /// Deserved now.
    pub fair_share: ResourceVec,
    /// Pods waiting.
    pub pending: u32,
    /// Those pods by why they wait ([`PendingClass::reason_name`]).
    pub pending_by_reason: BTreeMap<String, u32>,
}

/// Figures of every valid queue, and the error of every invalid one.
pub fn queue_figures(built: &Built) -> (BTreeMap<String, QueueFigures>, BTreeMap<String, String>) {
    let snap = &built.snapshot;
    // the fair shares the cycle computes at its start (one rule for the
    // capacity: gpusched_core::fairshare::schedulable_capacity)
    let (tree, _) = gpusched_core::report::queue_tree(snap);
    let mut invalid: BTreeMap<String, String> = BTreeMap::new();
    for p in &built.problems {
        if let Problem::InvalidQueue { queue, error } = p
            && !queue.is_empty()
        {
            invalid
                .entry(queue.clone())
                .or_insert_with(|| error.clone());
        }
    }
    let mut figures = BTreeMap::new();
    for q in &snap.queues {
        let Some(i) = tree.idx(&q.name) else { continue };
        let a = &tree.acct[i];
        figures.insert(
            q.name.clone(),
            QueueFigures {
                allocated: a.usage.clone(),
                fair_share: a.deserved.clone(),
                pending: built.pending_by_queue.get(&q.name).copied().unwrap_or(0),
                pending_by_reason: BTreeMap::new(),
            },
        );
    }
    (figures, invalid)
}

/// GPUs as the status shows them: whole numbers plain, shares exactly
/// (the reports' text).
pub use gpusched_core::report::gpus_text;

fn resources(r: &ResourceVec) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("cpu".to_string(), format!("{}m", r.cpu_milli)),
        ("memory".to_string(), r.memory.to_string()),
        ("nvidia.com/gpu".to_string(), gpus_text(r.gpu_milli)),
    ])
}

/// The status a queue should have (conditions still to be settled).
/// `figures` is `None` for a queue left out of the tree (invalid).
pub fn wanted_queue(figures: Option<&QueueFigures>, error: Option<&str>) -> QueueStatus {
    let mut st = QueueStatus {
        conditions: vec![valid_condition(error)],
        ..Default::default()
    };
    if let Some(f) = figures {
        st.allocated = resources(&f.allocated);
        st.fair_share = resources(&f.fair_share);
        st.allocated_gpus = Some(gpus_text(f.allocated.gpu_milli));
        st.fair_share_gpus = Some(gpus_text(f.fair_share.gpu_milli));
        st.pending_pods = f.pending;
        st.pending_by_reason = f.pending_by_reason.clone();
    }
    st
}

/// Text of a phase for logs.
pub fn phase_text(p: Option<GroupPhase>) -> &'static str {
    p.map(phase_name).unwrap_or("-")
}

/// The status writers of the executor: every write of a status
/// subresource (pod conditions, PodGroup and Queue status) goes through
/// here.
impl super::Executor {
    /// The pod's `PodScheduled` condition: False with `reason` and
    /// `message` (clipped to the API's limit).
    pub(super) fn pod_condition(&self, ns: &str, name: &str, reason: &str, message: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let name = name.to_string();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": reason,
            "message": clip(message), "lastTransitionTime": now,
        }]}});
        self.write(async move {
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
            .unwrap_or_else(|| json!({}));
        let Ok(to) = serde_json::to_value(to) else {
            return;
        };
        let Some(diff) = merge_diff(&from, &to) else {
            return;
        };
        let patch = json!({ "status": diff });
        self.write(async move {
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
mod tests {
    use super::*;
    use serde_json::json;

    fn facts(min: u32, scheduled: u32, pending: u32) -> GroupFacts {
        GroupFacts {
            min_member: min,
            scheduled,
            running: scheduled,
            pending,
            ..Default::default()
        }
    }

    #[test]
    fn phase_follows_the_members_not_the_order_of_writes() {
        use GroupPhase::*;
        // 4 of minMember 4 scheduled: Running, whatever was written before
        // (the group that stayed Pending with 4 running)
        for before in [None, Some(Pending), Some(Inqueue), Some(TimedOut)] {
            assert_eq!(wanted_phase(&facts(4, 4, 0), before), Running);
        }
        assert_eq!(wanted_phase(&facts(4, 1, 0), None), Pending);
        assert_eq!(wanted_phase(&facts(4, 1, 2), Some(Running)), Pending);
        assert_eq!(wanted_phase(&facts(4, 1, 3), Some(Pending)), Inqueue);
        let mut t = facts(4, 0, 4);
        t.timed_out = true;
        assert_eq!(wanted_phase(&t, Some(Inqueue)), TimedOut);
        // a finished gang (members gone, none pending) keeps its phase
        assert_eq!(wanted_phase(&facts(4, 0, 0), Some(Running)), Running);
        let mut bad = facts(4, 4, 0);
        bad.invalid = Some("minMember: must be 1 or more".into());
        assert_eq!(wanted_phase(&bad, Some(Running)), Pending);
    }

    #[test]
    fn group_facts_count_pending_members_and_name_invalid_groups() {
        use gpusched_core::PodState;
        use gpusched_model::{Pod, PodGroup as MGroup};
        let mut built = Built::default();
        built.snapshot.groups.push(MGroup {
            name: "ml/four".into(),
            queue: "default".into(),
            min_member: 4,
            priority: 0,
            topology: None,
            schedule_timeout_ms: None,
        });
        for i in 0..3 {
            let mut p = Pod::new(format!("ml/four-{i}"), "default");
            p.group = Some("ml/four".into());
            built.snapshot.pods.push(PodState::pending(p));
        }
        built.problems.push(Problem::InvalidGroup {
            group: "ml/bad".into(),
            error: "spec.minMember: invalid value".into(),
        });
        let counts = BTreeMap::from([
            ("ml/four".to_string(), (1, 1)),
            ("ml/bad".to_string(), (0, 0)),
        ]);
        let timed_out = BTreeSet::from(["ml/four".to_string()]);
        let waiting = BTreeMap::from([(
            "ml/four".to_string(),
            (PendingClass::GangShort, "only 2 of the 4 fit".to_string()),
        )]);
        let f = group_facts(&built, &counts, &timed_out, &waiting);
        assert_eq!(
            f["ml/four"],
            GroupFacts {
                min_member: 4,
                scheduled: 1,
                running: 1,
                pending: 3,
                timed_out: true,
                invalid: None,
                waiting: Some((PendingClass::GangShort, "only 2 of the 4 fit".to_string())),
            }
        );
        assert_eq!(wanted_phase(&f["ml/four"], None), GroupPhase::TimedOut);
        assert_eq!(
            f["ml/bad"].invalid.as_deref(),
            Some("spec.minMember: invalid value")
        );
        let bad = wanted_group(&f["ml/bad"], None);
        assert_eq!(bad.phase, Some(GroupPhase::Pending));
        assert_eq!(bad.conditions[0].status, "False");
        assert_eq!(bad.conditions[1].reason, "InvalidSpec");
        // a group the world does not count (scheduler-plugins') is not ours
        assert_eq!(f.len(), 2);
    }

    /// `kubectl get podgroup -o yaml` says why the gang waits.
    #[test]
    fn the_scheduled_condition_says_why_the_gang_waits() {
        let cond = |f: &GroupFacts| {
            let w = wanted_group(f, None);
            let c = w.conditions[1].clone();
            assert_eq!(c.type_, SCHEDULED_CONDITION);
            (c.status, c.reason, c.message)
        };
        let mut f = facts(4, 1, 3);
        f.waiting = Some((PendingClass::Quota, "queue \"a\"'s limit …".into()));
        assert_eq!(
            cond(&f),
            (
                "False".into(),
                "QueueQuota".into(),
                "queue \"a\"'s limit …".into()
            )
        );
        f.waiting = Some((PendingClass::Topology, "no rack holds 4".into()));
        assert_eq!(cond(&f).1, "NoTopologyDomain");
        // members missing and nothing explained yet
        let f = facts(4, 0, 2);
        assert_eq!(
            cond(&f),
            (
                "False".into(),
                "GangIncomplete".into(),
                "2 of minMember 4 members exist".into()
            )
        );
        let mut f = facts(4, 0, 4);
        f.timed_out = true;
        assert_eq!(cond(&f).1, "GangTimedOut");
        let f = facts(4, 4, 0);
        assert_eq!(
            cond(&f),
            (
                "True".into(),
                "Scheduled".into(),
                "4 of minMember 4 members placed".into()
            )
        );
    }

    #[test]
    fn a_status_differing_from_the_observed_one_is_written_until_they_agree() {
        let mut w: StatusWriter<PodGroupStatus> = StatusWriter::default();
        let t0 = Instant::now();
        let want = wanted_group(&facts(4, 4, 0), None);
        let stale = PodGroupStatus {
            phase: Some(GroupPhase::Pending),
            scheduled: 4,
            running: 4,
            ..Default::default()
        };
        let wanted = || BTreeMap::from([("ml/g".to_string(), want.clone())]);
        let mut observed = BTreeMap::from([("ml/g".to_string(), Some(stale.clone()))]);
        // differs: written
        let d = w.due(wanted(), &observed, t0);
        assert_eq!(d.len(), 1);
        assert_eq!(d[0].1.phase, Some(GroupPhase::Running));
        // in flight: not written twice at once
        assert!(w.due(wanted(), &observed, t0).is_empty());
        drop(d);
        // done, but the watch still shows the old status: wait for it ...
        let t1 = t0 + Duration::from_secs(1);
        assert!(w.due(wanted(), &observed, t1).is_empty());
        // ... not forever: a late Pending overtook the write; write again
        let t2 = t0 + STATUS_SETTLE;
        let d = w.due(wanted(), &observed, t2);
        assert_eq!(d.len(), 1);
        drop(d);
        // a status that never reads back equal is written less and less
        assert_eq!(settle_after(2), STATUS_SETTLE * 2);
        let t3 = t2 + STATUS_SETTLE;
        assert!(w.due(wanted(), &observed, t3).is_empty());
        assert_eq!(w.due(wanted(), &observed, t2 + settle_after(2)).len(), 1);
        assert_eq!(settle_after(40), STATUS_SETTLE_MAX);
        // agreed: nothing more to write, however long
        observed.insert("ml/g".into(), Some(want.clone()));
        assert!(
            w.due(wanted(), &observed, t2 + STATUS_SETTLE * 3)
                .is_empty()
        );
        // a changed wanted status is written at once
        let mut changed = want.clone();
        changed.running = 3;
        let d = w.due(
            BTreeMap::from([("ml/g".to_string(), changed)]),
            &observed,
            t2 + Duration::from_millis(1),
        );
        assert_eq!(d.len(), 1);
        // an object that does not exist (no observed entry) is never written
        drop(d);
        let gone = BTreeMap::from([("ml/gone".to_string(), want.clone())]);
        assert!(w.due(gone, &observed, t2).is_empty());
    }

    #[test]
    fn conditions_keep_their_time_while_their_status_holds() {
        let t = |s: i64| Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap());
        let mut old = valid_condition(None);
        old.last_transition_time = t(100);
        let mut same = vec![valid_condition(None)];
        settle_conditions(&mut same, std::slice::from_ref(&old), &t(200));
        assert_eq!(same[0].last_transition_time, t(100));
        let mut flipped = vec![valid_condition(Some("weight: must be 1 or more"))];
        settle_conditions(&mut flipped, &[old], &t(200));
        assert_eq!(flipped[0].last_transition_time, t(200));
        let mut fresh = vec![valid_condition(None)];
        settle_conditions(&mut fresh, &[], &t(300));
        assert_eq!(fresh[0].last_transition_time, t(300));
    }

    #[test]
    fn merge_diff_nulls_what_is_gone_and_keeps_what_is_equal() {
        let from = json!({"phase": "Invalid", "scheduled": 4, "allocated": {"cpu": "1", "example.com/x": "2"}, "conditions": [{"type": "Valid"}]});
        let to = json!({"phase": "Running", "scheduled": 4, "allocated": {"cpu": "1"}, "running": 4, "conditions": [{"type": "Valid"}]});
        assert_eq!(
            merge_diff(&from, &to),
            Some(json!({"phase": "Running", "allocated": {"example.com/x": null}, "running": 4}))
        );
        assert_eq!(merge_diff(&to, &to), None);
        assert_eq!(merge_diff(&Value::Null, &to), Some(to.clone()));
    }

    #[test]
    fn queue_status_is_typed_and_shows_the_figures() {
        let f = QueueFigures {
            allocated: ResourceVec {
                cpu_milli: 500,
                memory: 1 << 30,
                gpu_milli: 1500,
                ..Default::default()
            },
            fair_share: ResourceVec {
                gpu_milli: 4000,
                ..Default::default()
            },
            pending: 3,
            pending_by_reason: BTreeMap::from([
                ("QueueQuota".to_string(), 2),
                ("SchedulingGated".to_string(), 1),
            ]),
        };
        let st = wanted_queue(Some(&f), None);
        assert_eq!(st.pending_by_reason, f.pending_by_reason);
        assert_eq!(st.allocated_gpus.as_deref(), Some("1.5"));
        assert_eq!(st.fair_share_gpus.as_deref(), Some("4"));
        assert_eq!(st.allocated["cpu"], "500m");
        assert_eq!(st.pending_pods, 3);
        assert_eq!(st.conditions[0].status, "True");
        let bad = wanted_queue(None, Some("parent: queue \"x\" does not exist"));
        assert_eq!(bad.allocated_gpus, None);
        assert_eq!(
            (
                bad.conditions[0].status.as_str(),
                bad.conditions[0].reason.as_str()
            ),
            ("False", "InvalidSpec")
        );
    }
}

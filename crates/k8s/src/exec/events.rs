//! Events as kube-scheduler writes them (events.k8s.io/v1): one event per
//! distinct note, repeats of the same note counted in its `series`, so a
//! changed reason is a new event and `kubectl describe` shows it; and the
//! problems of objects (malformed node annotations, unusable decisions,
//! invalid queues and groups) reported once each while they last.

use crate::world::Problem;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::Patch;
use kube::{Api, Client};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// How long after its last occurrence a note still counts as a repeat
/// (client-go's events library uses 6 minutes too); after it, the same
/// note is a new event.
pub const SERIES_WINDOW: SignedDuration = SignedDuration::from_secs(6 * 60);

/// `Normal` or `Warning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum EventType {
    /// Normal.
    Normal,
    /// Warning.
    Warning,
}

/// What identifies a series: the object, and type, reason, action and
/// note of the event (kube-rs' recorder leaves the note out, so a changed
/// note only counted up the old event).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct SeriesKey {
    /// `namespace/name/uid` of the object.
    pub regarding: String,
    /// Type.
    pub type_: EventType,
    /// Reason.
    pub reason: String,
    /// Action.
    pub action: String,
    /// Note.
    pub note: String,
}

#[derive(Clone, Debug)]
struct Series {
    name: String,
    count: i32,
    last: Timestamp,
}

/// What to write for one occurrence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventWrite {
    /// A new event of this name.
    Create {
        /// `metadata.name`.
        name: String,
    },
    /// The `count`th occurrence of the event of this name.
    Count {
        /// `metadata.name`.
        name: String,
        /// Occurrences so far (2 or more).
        count: i32,
    },
}

/// The series seen in the last [`SERIES_WINDOW`].
#[derive(Debug, Default)]
pub struct SeriesCache {
    series: BTreeMap<SeriesKey, Series>,
    /// When to next drop the series older than the window (a sweep per
    /// event would cost a scan of every series for each of many events).
    next_sweep: Option<Timestamp>,
}

impl SeriesCache {
    /// Records one occurrence at `now`: a new event when its key was not
    /// seen in the window (`name` names it), else the next count of the
    /// existing one. Forgets series older than the window.
    pub fn record(&mut self, key: SeriesKey, now: Timestamp, name: String) -> EventWrite {
        if self.next_sweep.is_none_or(|t| now >= t) {
            self.series
                .retain(|_, s| now.duration_since(s.last) < SERIES_WINDOW);
            self.next_sweep = Some(now + SERIES_WINDOW / 4);
        }
        match self.series.get_mut(&key) {
            Some(s) if now.duration_since(s.last) < SERIES_WINDOW => {
                s.count += 1;
                s.last = now;
                EventWrite::Count {
                    name: s.name.clone(),
                    count: s.count,
                }
            }
            _ => {
                self.series.insert(
                    key,
                    Series {
                        name: name.clone(),
                        count: 1,
                        last: now,
                    },
                );
                EventWrite::Create { name }
            }
        }
    }

    /// Forgets a series (its event could not be written or is gone), so
    /// the next occurrence creates a new one.
    pub fn forget(&mut self, key: &SeriesKey) {
        self.series.remove(key);
    }

    /// Series remembered.
    pub fn len(&self) -> usize {
        self.series.len()
    }

    /// No series remembered.
    pub fn is_empty(&self) -> bool {
        self.series.is_empty()
    }
}

/// Writes events with [`SeriesCache`] semantics.
#[derive(Clone)]
pub struct Recorder {
    client: Client,
    controller: String,
    instance: String,
    cache: Arc<Mutex<SeriesCache>>,
}

/// One event to write.
#[derive(Clone, Debug)]
pub struct Event {
    /// Type.
    pub type_: EventType,
    /// Reason (`FailedScheduling`, `Scheduled`, `Preempted`, …).
    pub reason: String,
    /// Action (`Scheduling`, `Binding`, `Preempting`).
    pub action: String,
    /// Note (at most 1 kB; longer is clipped).
    pub note: String,
}

impl Recorder {
    /// A recorder reporting as `controller` (`instance`: the pod).
    pub fn new(client: Client, controller: &str, instance: &str) -> Self {
        Recorder {
            client,
            controller: controller.into(),
            instance: instance.into(),
            cache: Arc::default(),
        }
    }

    /// Records the event now (so occurrences count in call order) and
    /// returns the write to carry out.
    pub fn prepare(&self, ev: Event, regarding: ObjectReference) -> PreparedEvent {
        let note = crate::exec::clip(&ev.note);
        let key = SeriesKey {
            regarding: format!(
                "{}/{}/{}",
                regarding.namespace.as_deref().unwrap_or_default(),
                regarding.name.as_deref().unwrap_or_default(),
                regarding.uid.as_deref().unwrap_or_default()
            ),
            type_: ev.type_,
            reason: ev.reason.clone(),
            action: ev.action.clone(),
            note: note.clone(),
        };
        let now = Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.controller),
            now.as_nanosecond()
        );
        let write = {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            c.record(key.clone(), now, name)
        };
        PreparedEvent {
            recorder: self.clone(),
            key,
            write,
            event: Event { note, ..ev },
            regarding,
            now,
        }
    }

    fn forget(&self, key: &SeriesKey) {
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        c.forget(key);
    }
}

/// An event recorded and not written yet.
pub struct PreparedEvent {
    recorder: Recorder,
    key: SeriesKey,
    write: EventWrite,
    event: Event,
    regarding: ObjectReference,
    now: Timestamp,
}

impl PreparedEvent {
    /// Writes it: creates the event, or counts the occurrence in its
    /// series (a series whose event is gone starts a new event).
    pub async fn publish(self) -> Result<(), kube::Error> {
        let ns = self
            .regarding
            .namespace
            .clone()
            .unwrap_or_else(|| "default".into());
        let api: Api<K8sEvent> = Api::namespaced(self.recorder.client.clone(), &ns);
        let r = match &self.write {
            EventWrite::Count { name, count } => {
                let patch = super::patch::series(*count, self.now);
                match api
                    .patch(name, &super::patch_params(), &Patch::Merge(&patch))
                    .await
                {
                    Err(kube::Error::Api(s)) if s.code == 404 => {
                        self.create(&api, name.clone()).await
                    }
                    r => r.map(|_| ()),
                }
            }
            EventWrite::Create { name } => self.create(&api, name.clone()).await,
        };
        if r.is_err() {
            self.recorder.forget(&self.key);
        }
        r
    }

    async fn create(&self, api: &Api<K8sEvent>, name: String) -> Result<(), kube::Error> {
        let ev = K8sEvent {
            action: Some(self.event.action.clone()),
            reason: Some(self.event.reason.clone()),
            event_time: Some(MicroTime(self.now)),
            regarding: Some(self.regarding.clone()),
            note: Some(self.event.note.clone()),
            metadata: ObjectMeta {
                name: Some(name),
                namespace: self.regarding.namespace.clone(),
                ..Default::default()
            },
            reporting_controller: Some(self.recorder.controller.clone()),
            reporting_instance: Some(self.recorder.instance.clone()),
            type_: Some(
                match self.event.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        };
        api.create(&super::post_params(), &ev).await.map(|_| ())
    }
}

/// Every `kind` label of the problem metrics.
pub const PROBLEM_KINDS: [&str; 8] = [
    "pod", "gated", "claims", "decision", "queue", "group", "node", "key",
];

/// The kind of object a problem is about, as the metrics label it.
pub fn problem_kind(p: &Problem) -> &'static str {
    match p {
        Problem::InvalidPod { .. } => "pod",
        Problem::GatedPod { .. } => "gated",
        Problem::ClaimsPending { .. } => "claims",
        Problem::BadDecision { .. } => "decision",
        Problem::InvalidQueue { .. } => "queue",
        Problem::InvalidGroup { .. } => "group",
        Problem::NodeWarning { .. } => "node",
        Problem::PodKeyWarning { .. } => "key",
    }
}

/// What identifies one problem: its object and its text.
fn problem_key(p: &Problem) -> (&'static str, String, String) {
    let (obj, text) = match p {
        Problem::InvalidPod { pod, error } | Problem::BadDecision { pod, error } => {
            (pod.uid.clone(), error.clone())
        }
        Problem::PodKeyWarning { pod, warning } => (pod.uid.clone(), warning.clone()),
        Problem::GatedPod { pod, gates } => (pod.uid.clone(), gates.join(",")),
        Problem::ClaimsPending { pod, message, .. } => (pod.uid.clone(), message.clone()),
        Problem::InvalidQueue { queue, error } => (queue.clone(), error.clone()),
        Problem::InvalidGroup { group, error } => (group.clone(), error.clone()),
        Problem::NodeWarning { node, warning } => (node.clone(), warning.clone()),
    };
    (problem_kind(p), obj, text)
}

/// The problems reported so far: each is reported when it first appears
/// (or comes back after it was gone, or its text changed), not every
/// cycle.
#[derive(Debug, Default)]
pub struct ProblemLog {
    seen: BTreeSet<(&'static str, String, String)>,
}

impl ProblemLog {
    /// The problems of this build not present in the last one; forgets the
    /// ones that are gone.
    pub fn fresh<'a>(&mut self, problems: &'a [Problem]) -> Vec<&'a Problem> {
        let now: BTreeSet<_> = problems.iter().map(problem_key).collect();
        let out = problems
            .iter()
            .filter(|p| !self.seen.contains(&problem_key(p)))
            .collect();
        self.seen = now;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::PodRef;

    fn key(note: &str) -> SeriesKey {
        SeriesKey {
            regarding: "ml/p/u1".into(),
            type_: EventType::Warning,
            reason: "FailedScheduling".into(),
            action: "Scheduling".into(),
            note: note.into(),
        }
    }

    #[test]
    fn a_changed_note_is_a_new_event_and_a_repeat_counts_up() {
        let mut c = SeriesCache::default();
        let t = |s: i64| Timestamp::from_second(1_700_000_000 + s).unwrap();
        let gang = "0/4 nodes are available: 1 of minMember 4 pods exist.";
        let queue = "queue ml is at its limit of 8 nvidia.com/gpu";
        assert_eq!(
            c.record(key(gang), t(0), "p.1".into()),
            EventWrite::Create { name: "p.1".into() }
        );
        assert_eq!(
            c.record(key(gang), t(10), "p.2".into()),
            EventWrite::Count {
                name: "p.1".into(),
                count: 2
            }
        );
        // the reason changed: a new event, not a third count of the old
        assert_eq!(
            c.record(key(queue), t(20), "p.3".into()),
            EventWrite::Create { name: "p.3".into() }
        );
        // the old reason again within the window: its series goes on
        assert_eq!(
            c.record(key(gang), t(30), "p.4".into()),
            EventWrite::Count {
                name: "p.1".into(),
                count: 3
            }
        );
        // another pod's same note is its own event
        let mut other = key(gang);
        other.regarding = "ml/q/u2".into();
        assert_eq!(
            c.record(other, t(31), "q.1".into()),
            EventWrite::Create { name: "q.1".into() }
        );
        // after the window: a new event, and old series are forgotten
        let late = t(31) + SERIES_WINDOW;
        assert_eq!(
            c.record(key(gang), late, "p.5".into()),
            EventWrite::Create { name: "p.5".into() }
        );
        assert_eq!(c.len(), 1);
        c.forget(&key(gang));
        assert!(c.is_empty());
    }

    #[test]
    fn each_problem_is_reported_once_while_it_lasts() {
        let node = |w: &str| Problem::NodeWarning {
            node: "n1".into(),
            warning: w.into(),
        };
        let forged = Problem::BadDecision {
            pod: PodRef {
                uid: "u1".into(),
                namespace: "ml".into(),
                name: "p".into(),
            },
            error: "decision for another pod".into(),
        };
        let mut log = ProblemLog::default();
        let first = vec![node("gpusched.io/gpus: bad"), forged.clone()];
        assert_eq!(log.fresh(&first).len(), 2);
        // every cycle builds them again: not reported again
        assert!(log.fresh(&first).is_empty());
        // the node's annotation changed to another bad value: reported
        let second = vec![node("gpusched.io/gpus: worse"), forged.clone()];
        assert_eq!(log.fresh(&second), vec![&second[0]]);
        // fixed, then broken again: reported again
        assert!(log.fresh(&[]).is_empty());
        assert_eq!(log.fresh(&second).len(), 2);
    }
}

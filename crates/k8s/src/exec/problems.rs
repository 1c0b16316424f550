//! The problems of objects the world found (invalid pods, queues and
//! groups, gated pods, pending claims, unusable decisions, node warnings):
//! a pod's shows as its event and `PodScheduled` condition like any
//! pending pod's; every kind is logged and counted once while it lasts.

use super::events::{self, EventType};
use super::{Executor, pod_ref};
use crate::metrics::KindLabel;
use crate::world::Problem;
use gpusched_core::report::classify::{PendingClass, tagged_message};
use std::collections::BTreeMap;

impl Executor {
    /// Pods of ours that cannot be scheduled as written: an event and the
    /// condition, like any pending pod.
    pub(super) fn problem(&mut self, p: &Problem) {
        match p {
            Problem::InvalidPod { pod, error } => {
                let class = PendingClass::InvalidSpec;
                let msg = tagged_message(error, class);
                if !self.should_explain(&pod.uid, &msg) {
                    return;
                }
                self.metrics.attempt("error");
                self.event(
                    pod_ref(&pod.namespace, &pod.name, &pod.uid),
                    EventType::Warning,
                    "FailedScheduling",
                    "Scheduling",
                    msg.clone(),
                );
                self.pod_condition(&pod.namespace, &pod.name, class.condition_reason(), &msg);
            }
            Problem::GatedPod { pod, gates } => {
                let class = PendingClass::Gated;
                let msg = tagged_message(
                    &format!("waiting for scheduling gates: {}", gates.join(", ")),
                    class,
                );
                if !self.should_explain(&pod.uid, &msg) {
                    return;
                }
                self.pod_condition(&pod.namespace, &pod.name, class.condition_reason(), &msg);
            }
            Problem::ClaimsPending {
                pod,
                class,
                message,
            } => {
                let message = &tagged_message(message, *class);
                if !self.should_explain(&pod.uid, message) {
                    return;
                }
                self.metrics.attempt("unschedulable");
                self.event(
                    pod_ref(&pod.namespace, &pod.name, &pod.uid),
                    EventType::Warning,
                    "FailedScheduling",
                    "Scheduling",
                    message.clone(),
                );
                self.pod_condition(&pod.namespace, &pod.name, class.condition_reason(), message);
            }
            // reported once each by report_problems; invalid queues and
            // groups also in their `Valid` condition
            Problem::BadDecision { .. }
            | Problem::InvalidQueue { .. }
            | Problem::InvalidGroup { .. }
            | Problem::PodKeyWarning { .. }
            | Problem::NodeWarning { .. } => {}
        }
    }

    /// Problems of objects, each once while it lasts (a new or changed
    /// one again): a warning in the log and
    /// `gpusched_object_problems_reported_total{kind}`; an unusable decision also a
    /// `Warning BadDecision` event on its pod. `gpusched_object_problems`
    /// counts those present now.
    pub(super) fn report_problems(&mut self, problems: &[Problem]) {
        let mut now: BTreeMap<&'static str, i64> =
            events::PROBLEM_KINDS.iter().map(|k| (*k, 0)).collect();
        for p in problems {
            *now.entry(events::problem_kind(p)).or_default() += 1;
        }
        for (kind, n) in now {
            self.metrics
                .object_problems
                .get_or_create(&KindLabel { kind: kind.into() })
                .set(n);
        }
        for p in self.problems.fresh(problems) {
            let kind = events::problem_kind(p);
            match p {
                // the warning names the node and the field
                Problem::NodeWarning { warning, .. } => tracing::warn!("{warning}"),
                Problem::InvalidQueue { queue, error } => {
                    tracing::warn!("queue {queue}: {error}")
                }
                Problem::InvalidGroup { group, error } => {
                    tracing::warn!("pod group {group}: {error}")
                }
                Problem::BadDecision { pod, error } => {
                    let note = format!(
                        "unusable {} annotation (its GPUs are assumed, not known): {error}",
                        crate::decision::ANNOTATION_DECISION
                    );
                    tracing::warn!("pod {}/{}: {note}", pod.namespace, pod.name);
                    self.event(
                        pod_ref(&pod.namespace, &pod.name, &pod.uid),
                        EventType::Warning,
                        "BadDecision",
                        "Scheduling",
                        note,
                    );
                }
                Problem::InvalidPod { pod, error } => {
                    tracing::info!("pod {}/{}: {error}", pod.namespace, pod.name)
                }
                // once while it lasts: a warning the user sees on the pod
                Problem::PodKeyWarning { pod, warning } => {
                    tracing::info!("pod {}/{}: {warning}", pod.namespace, pod.name);
                    self.event(
                        pod_ref(&pod.namespace, &pod.name, &pod.uid),
                        EventType::Warning,
                        "UnknownKey",
                        "Scheduling",
                        warning.clone(),
                    );
                }
                Problem::GatedPod { .. } | Problem::ClaimsPending { .. } => continue,
            }
            self.metrics
                .object_problems_total
                .get_or_create(&KindLabel { kind: kind.into() })
                .inc();
        }
    }
}

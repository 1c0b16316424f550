//! The status tick: what every PodGroup and Queue status should be, from
//! the world, compared with what the watches show, and written where they
//! differ (through [`super::StatusWriter`] and the one status writer).

use super::super::Executor;
use super::super::events::EventType;
use crate::crd::{PodGroup, PodGroupStatus, Queue};
use crate::exec::status;
use crate::metrics::QueueLabel;
use crate::world::{Built, ObservedStatus};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Api;
use std::collections::BTreeMap;
use std::time::Instant;

impl Executor {
    /// Writes the status of every PodGroup and Queue whose observed status
    /// differs from the one the world calls for ([`status`]); sets the
    /// queue metrics. `counts`: members scheduled and running per group.
    pub fn publish_status(
        &mut self,
        built: &Built,
        counts: &BTreeMap<String, (u32, u32)>,
        observed: &ObservedStatus,
    ) {
        let now = status::now_time();
        let at = Instant::now();
        // pod groups
        let facts = status::group_facts(built, counts, &self.timed_out, &self.group_waiting);
        let mut wanted = BTreeMap::new();
        for (k, f) in facts {
            let obs = observed.groups.get(&k).and_then(Option::as_ref);
            let mut w = status::wanted_group(&f, obs);
            status::settle_conditions(
                &mut w.conditions,
                obs.map(|o| o.conditions.as_slice()).unwrap_or(&[]),
                &now,
            );
            wanted.insert(k, w);
        }
        for (k, w, guard) in self.group_status.due(wanted, &observed.groups, at) {
            let Some((ns, name)) = k.split_once('/') else {
                continue;
            };
            let from = observed.groups.get(&k).and_then(Option::as_ref);
            tracing::debug!(
                "pod group {k}: phase {} -> {}",
                status::phase_text(from.and_then(|f| f.phase)),
                status::phase_text(w.phase)
            );
            let uid = observed.group_uids.get(&k).map(String::as_str);
            self.group_event(ns, name, uid, from, &w);
            let api: Api<PodGroup> = Api::namespaced(self.client.clone(), ns);
            self.write_status(api, name.to_string(), from, &w, guard);
        }
        // queues
        let (figures, mut invalid) =
            status::queue_figures(built, &[&self.queue_waiting, &built.unseen_by_queue]);
        let mut wanted = BTreeMap::new();
        for (q, f) in &figures {
            let label = QueueLabel { queue: q.clone() };
            self.metrics
                .pending
                .get_or_create(&label)
                .set(f.pending as i64);
            self.metrics
                .queue_allocated_gpus
                .get_or_create(&label)
                .set(f.allocated.gpu_milli as f64 / gpusched_model::GPU_MILLI as f64);
            self.metrics
                .queue_fair_share_gpus
                .get_or_create(&label)
                .set(f.fair_share.gpu_milli as f64 / gpusched_model::GPU_MILLI as f64);
            let error = invalid.remove(q);
            wanted.insert(q.clone(), status::wanted_queue(Some(f), error.as_deref()));
        }
        for (q, e) in invalid {
            wanted.insert(q, status::wanted_queue(None, Some(&e)));
        }
        for (q, w) in wanted.iter_mut() {
            let obs = observed.queues.get(q).and_then(Option::as_ref);
            status::settle_conditions(
                &mut w.conditions,
                obs.map(|o| o.conditions.as_slice()).unwrap_or(&[]),
                &now,
            );
        }
        for (q, w, guard) in self.queue_status.due(wanted, &observed.queues, at) {
            let api: Api<Queue> = Api::all(self.client.clone());
            let from = observed.queues.get(&q).and_then(Option::as_ref);
            self.write_status(api, q, from, &w, guard);
        }
    }

    /// An event on the PodGroup when its `Scheduled` condition changes
    /// reason or message: `Normal Scheduled` once placed, else a warning
    /// with the reason its members wait (what `kubectl describe podgroup`
    /// shows).
    pub(super) fn group_event(
        &self,
        ns: &str,
        name: &str,
        uid: Option<&str>,
        from: Option<&PodGroupStatus>,
        to: &PodGroupStatus,
    ) {
        let find = |st: &PodGroupStatus| {
            st.conditions
                .iter()
                .find(|c| c.type_ == status::SCHEDULED_CONDITION)
                .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
        };
        let Some((st, reason, message)) = find(to) else {
            return;
        };
        if from.and_then(find) == Some((st.clone(), reason.clone(), message.clone())) {
            return;
        }
        let r = ObjectReference {
            api_version: Some("gpusched.io/v1alpha1".into()),
            kind: Some("PodGroup".into()),
            namespace: Some(ns.into()),
            name: Some(name.into()),
            // `kubectl describe podgroup` lists the events whose
            // regarding.uid is the group's
            uid: uid.map(str::to_string),
            ..Default::default()
        };
        let type_ = if st == "True" {
            EventType::Normal
        } else {
            EventType::Warning
        };
        self.event(r, type_, &reason, "Scheduling", message);
    }
}

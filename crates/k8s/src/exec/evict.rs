//! Evictions (preemption, reclaim, consolidation moves) and nominations.

use super::{Executor, pod_ref};
use crate::exec::events::EventType;
use crate::metrics::KindLabel;
use crate::world::PodRef;
use gpusched_core::{EvictionKind, EvictionReason};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, Patch, Preconditions};

/// The metrics label, the event reason and the word its note starts with,
/// per kind of eviction. A moved pod is deleted like a preempted one (its
/// controller recreates it); the note names the pod it makes room for:
/// "Moved by gpusched: moved to make room for NS/NAME (planned to restart
/// on NODE)".
fn words(kind: EvictionKind) -> (&'static str, &'static str, &'static str) {
    match kind {
        EvictionKind::Preempt => ("preempt", "Preempted", "Preempted"),
        EvictionKind::Reclaim => ("reclaim", "Preempted", "Reclaimed"),
        EvictionKind::Consolidate => ("consolidate", "Preempted", "Moved"),
    }
}

impl Executor {
    /// Evicts a pod once: event, graceful delete with a UID precondition;
    /// the pod counts as terminating until the API shows it (or the
    /// delete fails).
    pub(super) fn evict(&mut self, pr: &PodRef, reason: &EvictionReason) {
        if !self.evicting.insert(pr.uid.clone()) {
            return;
        }
        let (label, reason_word, what) = words(reason.kind());
        self.metrics
            .evictions
            .get_or_create(&KindLabel { kind: label.into() })
            .inc();
        self.event(
            pod_ref(&pr.namespace, &pr.name, &pr.uid),
            EventType::Normal,
            reason_word,
            "Preempting",
            format!("{what} by gpusched: {reason}"),
        );
        self.shared.with(|w| w.assume_evicted(&pr.uid));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pr.namespace);
        let name = pr.name.clone();
        let uid = pr.uid.clone();
        let shared = self.shared.clone();
        let dp = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(pr.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        self.write(move || async move {
            match api.delete(&name, &dp).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(e) => {
                    shared.with(|w| w.forget_eviction(&uid));
                    shared.changed.notify_one();
                    Err(e)
                }
            }
        });
    }

    /// Writes `status.nominatedNodeName` once per (pod, node).
    pub(super) fn nominate(&mut self, pr: &PodRef, node: &str) {
        // the planned node of a pod moved by consolidation: the pod is
        // being deleted (its replacement is a new pod)
        if self.evicting.contains(&pr.uid) {
            return;
        }
        if self.nominated.get(&pr.uid).map(String::as_str) == Some(node) {
            return;
        }
        self.nominated.insert(pr.uid.clone(), node.to_string());
        self.shared.with(|w| w.nominate(&pr.uid, node));
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &pr.namespace);
        let name = pr.name.clone();
        let patch = super::patch::nominated_node(node);
        self.write(move || async move {
            api.patch_status(&name, &super::patch_params(), &Patch::Merge(&patch))
                .await
                .map(|_| ())
        });
    }
}

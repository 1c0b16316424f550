//! Bindings: the last check against double booking, the `pods/binding`
//! write with the GPU decision, and the one retry policy of the executor.

use super::{Executor, pod_ref};
use crate::decision::{ANNOTATION_DECISION, GpuDecision};
use crate::exec::events::{Event, EventType};
use crate::metrics::KindLabel;
use crate::volumes::{ANN_BOUND_BY_CONTROLLER, ANN_SELECTED_NODE, VolumeWrite};
use gpusched_core::GpuAssignment;
use k8s_openapi::api::core::v1::{
    Binding, ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use kube::Api;
use kube::api::{Patch, PatchParams};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The `FailedScheduling` warning for a pod whose bind-time step (volumes,
/// binding conditions) failed; it goes back to pending.
async fn failed_at_bind(
    recorder: &crate::exec::events::Recorder,
    ns: &str,
    name: &str,
    uid: &str,
    note: String,
) {
    let ev = recorder.prepare(
        Event {
            type_: EventType::Warning,
            reason: "FailedScheduling".into(),
            note,
            action: "Scheduling".into(),
        },
        pod_ref(ns, name, uid),
    );
    let _ = ev.publish().await;
}

/// The executor's retry policy, the only one on top of the client's.
///
/// kube's client already retries 429, 503 and 504 (up to 15 times with
/// exponential backoff, honouring `Retry-After`) under every call, so
/// nothing here retries those again. A binding is retried for what the
/// client does not retry — transport errors and the other 5xx — up to
/// `attempts` times with a doubling backoff from `backoff`. 4xx (conflict,
/// gone, refused) is final. Status writes are not retried: the status
/// writer compares and writes again until the object agrees
/// ([`crate::exec::status`]). Events are best effort.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all (1: no retry).
    pub attempts: u32,
    /// Wait before the second attempt; doubles after each.
    pub backoff: Duration,
}

impl RetryPolicy {
    /// Whether a failed call is worth another attempt under this policy.
    pub fn retryable(e: &kube::Error) -> bool {
        match e {
            kube::Error::Api(s) => s.code >= 500 && !matches!(s.code, 503 | 504),
            kube::Error::Service(_) | kube::Error::HyperError(_) => true,
            _ => false,
        }
    }

    /// The wait before attempt `next` (2 or more).
    pub fn wait(&self, next: u32) -> Duration {
        self.backoff
            .saturating_mul(1u32 << next.saturating_sub(2).min(16))
    }
}

/// Kinds of binding failure, as the metrics label them.
pub(crate) fn error_kind(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) => match s.code {
            409 => "conflict",
            404 => "not_found",
            400 | 403 | 422 => "rejected",
            429 => "throttled",
            _ => "server",
        },
        _ => "transport",
    }
}

pub(crate) fn add_held(held: &mut BTreeMap<(u32, u32), u64>, node: u32, g: &GpuAssignment) {
    match g {
        GpuAssignment::None => {}
        GpuAssignment::Whole(v) => {
            for &i in v {
                *held.entry((node, i)).or_default() += gpusched_model::GPU_MILLI;
            }
        }
        GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
            *held.entry((node, *gpu)).or_default() += u64::from(*milli)
        }
    }
}

/// The first GPU that `g` would push past one whole GPU on `node`.
pub(crate) fn overbooked(
    held: &BTreeMap<(u32, u32), u64>,
    node: u32,
    g: &GpuAssignment,
) -> Option<u32> {
    let now = |i: u32| held.get(&(node, i)).copied().unwrap_or(0);
    match g {
        GpuAssignment::None => None,
        GpuAssignment::Whole(v) => v.iter().copied().find(|&i| now(i) > 0),
        GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
            (now(*gpu) + u64::from(*milli) > gpusched_model::GPU_MILLI).then_some(*gpu)
        }
    }
}

/// Binds a pod's delayed claims as kube-scheduler's VolumeBinding PreBind
/// does: sets each chosen volume's `claimRef` (refused if the volume
/// changed since the decision) or the claim's selected node, then waits
/// until the PV controller shows every claim bound, up to `timeout`. On
/// failure nothing is undone in the API (a volume whose `claimRef` was set
/// is bound to the claim by the PV controller all the same, and the retried
/// pod then follows the bound volume), as kube-scheduler does.
async fn bind_volumes(
    client: &kube::Client,
    shared: &super::Shared,
    writes: &[VolumeWrite],
    timeout: Duration,
) -> Result<(), String> {
    let pp = PatchParams::default();
    for w in writes {
        match w {
            VolumeWrite::BindVolume {
                volume,
                resource_version,
                namespace,
                claim,
                claim_uid,
            } => {
                let api: Api<PersistentVolume> = Api::all(client.clone());
                let patch = super::patch::claim_ref(
                    resource_version,
                    ANN_BOUND_BY_CONTROLLER,
                    namespace,
                    claim,
                    claim_uid,
                );
                api.patch(volume, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(|e| {
                        format!("setting persistentvolume {volume}'s claimRef to {namespace}/{claim}: {e}")
                    })?;
            }
            VolumeWrite::SelectNode {
                namespace,
                claim,
                node,
            } => {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
                let patch = super::patch::annotation(ANN_SELECTED_NODE, node);
                api.patch(claim, &pp, &Patch::Merge(&patch))
                    .await
                    .map_err(|e| {
                        format!("asking provisioning of persistentvolumeclaim {namespace}/{claim} on {node}: {e}")
                    })?;
            }
        }
    }
    let claims: Vec<String> = writes.iter().map(VolumeWrite::claim_key).collect();
    let deadline = Instant::now() + timeout;
    loop {
        let unbound: Vec<&String> =
            shared.with(|w| claims.iter().filter(|c| !w.claim_bound(c)).collect());
        if unbound.is_empty() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "persistentvolumeclaim(s) {} not bound within {} s",
                unbound
                    .iter()
                    .map(|c| c.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
                timeout.as_secs()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// How long a pod whose claims could not be written waits before it is
/// placed again.
const CLAIM_RETRY: Duration = Duration::from_secs(2);

/// One binding to carry out.
pub(super) struct BindJob {
    pub ns: String,
    pub name: String,
    pub uid: String,
    pub node: String,
    pub decision: GpuDecision,
    /// The pod's creation (Unix ms), for the end-to-end latency.
    pub created_ms: u64,
    /// Writes that bind its delayed claims first.
    pub volumes: Vec<VolumeWrite>,
    /// DRA claims to allocate and reserve first.
    pub claims: Vec<crate::dra::state::ClaimWrite>,
}

impl Executor {
    pub(super) fn spawn_bind(&self, job: BindJob) {
        let BindJob {
            ns,
            name,
            uid,
            node,
            decision,
            created_ms,
            volumes,
            claims,
        } = job;
        let volume_timeout = self.opts.volume_bind_timeout;
        let client = self.client.clone();
        let slots = self.bind_slots.clone();
        let limit = self.bind_limit.clone();
        let shared = self.shared.clone();
        let metrics = self.metrics.clone();
        let policy = RetryPolicy {
            attempts: self.opts.bind_attempts.max(1),
            backoff: Duration::from_millis(100),
        };
        let recorder = self.recorder.clone();
        let write_slots = self.write_slots.clone();
        let write_limit = self.write_limit.clone();
        // two tasks: a small one waits for a bind slot, then the binding
        // itself (its future is kilobytes: every request it may make) is
        // spawned holding the slot. A cycle that places 40,000 pods would
        // otherwise hold 40,000 such futures while 64 bind (7 KB each,
        // heaptrack: 71 MB of the scheduler's 251 MB peak heap at 1,250
        // nodes / 10,000 bindings)
        tokio::spawn(async move {
            let Ok(permit) = slots.acquire_owned().await else {
                return;
            };
            tokio::spawn(async move {
                let _permit = permit;
                if !volumes.is_empty() {
                    limit.acquire().await;
                    if let Err(why) = bind_volumes(&client, &shared, &volumes, volume_timeout).await
                    {
                        tracing::info!("binding {ns}/{name} to {node}: {why}; the pod is retried");
                        metrics
                            .bind_errors
                            .get_or_create(&KindLabel {
                                kind: "volumes".into(),
                            })
                            .inc();
                        metrics.attempt("error");
                        failed_at_bind(
                            &recorder,
                            &ns,
                            &name,
                            &uid,
                            format!("binding volumes: {why}"),
                        )
                        .await;
                        shared.with(|w| w.forget(&uid));
                        shared.changed.notify_one();
                        return;
                    }
                }
                // DRA: allocated and reserved before the Binding, as the
                // kubelet requires; undone if anything fails
                let mut written = Vec::new();
                for w in &claims {
                    limit.acquire().await;
                    match super::claims::reserve_any(&client, w, &name, &uid).await {
                        Ok(done) => written.push(done),
                        Err(e) => {
                            tracing::warn!("pod {ns}/{name}: not bound: {e}");
                            metrics.attempt("error");
                            for w in &written {
                                super::claims::release(&client, w, &uid).await;
                            }
                            // the pod stays assumed a moment: a claim write
                            // that fails now (a permission, a webhook) would
                            // fail again at once
                            tokio::time::sleep(CLAIM_RETRY).await;
                            shared.with(|w| w.forget(&uid));
                            shared.changed.notify_one();
                            return;
                        }
                    }
                }
                // binding conditions: the devices must be ready first
                for w in &written {
                    if let Err(e) =
                        super::claims::wait_bound(&client, w, super::claims::BINDING_TIMEOUT).await
                    {
                        tracing::info!("pod {ns}/{name}: not bound: {e}");
                        metrics.attempt("error");
                        failed_at_bind(
                            &recorder,
                            &ns,
                            &name,
                            &uid,
                            format!("binding conditions: {e}"),
                        )
                        .await;
                        for w in &written {
                            super::claims::release(&client, w, &uid).await;
                        }
                        shared.with(|w| w.forget(&uid));
                        shared.changed.notify_one();
                        return;
                    }
                }
                let claim_client = client.clone();
                let api: Api<Pod> = Api::namespaced(client, &ns);
                let binding = Binding {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(ns.clone()),
                        uid: Some(uid.clone()),
                        annotations: Some(BTreeMap::from([(
                            ANNOTATION_DECISION.to_string(),
                            decision.to_annotation(),
                        )])),
                        ..Default::default()
                    },
                    target: ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(node.clone()),
                        ..Default::default()
                    },
                };
                for attempt in 1..=policy.attempts {
                    if attempt > 1 {
                        tokio::time::sleep(policy.wait(attempt)).await;
                    }
                    limit.acquire().await;
                    let t0 = Instant::now();
                    let r = api
                        .create_subresource::<Binding, serde_json::Value>(
                            "binding",
                            &name,
                            &super::post_params(),
                            &binding,
                        )
                        .await;
                    metrics.binding_seconds.observe(t0.elapsed().as_secs_f64());
                    match r {
                        Ok(_) => {
                            metrics.attempt("scheduled");
                            let now_ms = SystemTime::now()
                                .duration_since(UNIX_EPOCH)
                                .map(|d| d.as_millis() as u64)
                                .unwrap_or(0);
                            if created_ms > 0 {
                                metrics
                                    .e2e_seconds
                                    .observe(now_ms.saturating_sub(created_ms) as f64 / 1000.0);
                            }
                            let ev = recorder.prepare(
                                Event {
                                    type_: EventType::Normal,
                                    reason: "Scheduled".into(),
                                    note: format!("Successfully assigned {ns}/{name} to {node}"),
                                    action: "Binding".into(),
                                },
                                pod_ref(&ns, &name, &uid),
                            );
                            tokio::spawn(async move {
                                let Ok(_p) = write_slots.acquire_owned().await else {
                                    return;
                                };
                                write_limit.acquire().await;
                                let _ = ev.publish().await;
                            });
                            return;
                        }
                        Err(e) => {
                            metrics
                                .bind_errors
                                .get_or_create(&KindLabel {
                                    kind: error_kind(&e).into(),
                                })
                                .inc();
                            if RetryPolicy::retryable(&e) && attempt < policy.attempts {
                                tracing::debug!(
                                    "binding {ns}/{name} to {node} (attempt {attempt}): {e}"
                                );
                                continue;
                            }
                            tracing::info!("binding {ns}/{name} to {node} failed: {e}");
                            metrics.attempt("error");
                            for w in &written {
                                super::claims::release(&claim_client, w, &uid).await;
                            }
                            shared.with(|w| w.forget(&uid));
                            shared.changed.notify_one();
                            return;
                        }
                    }
                }
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("x", "y")
                .with_code(code)
                .boxed(),
        )
    }

    #[test]
    fn the_policy_leaves_what_the_client_retries_to_the_client() {
        // 429/503/504: the client's retry layer already retried these
        for code in [429, 503, 504, 409, 404, 422, 403] {
            assert!(!RetryPolicy::retryable(&api(code)), "{code}");
        }
        for code in [500, 502] {
            assert!(RetryPolicy::retryable(&api(code)), "{code}");
        }
        let p = RetryPolicy {
            attempts: 4,
            backoff: Duration::from_millis(100),
        };
        assert_eq!(p.wait(2), Duration::from_millis(100));
        assert_eq!(p.wait(4), Duration::from_millis(400));
    }

    #[test]
    fn overbooking_is_refused() {
        let mut held = BTreeMap::new();
        add_held(&mut held, 0, &GpuAssignment::Whole(vec![1]));
        add_held(
            &mut held,
            0,
            &GpuAssignment::Share {
                gpu: 2,
                milli: 600,
                memory_mib: 0,
            },
        );
        assert_eq!(
            overbooked(&held, 0, &GpuAssignment::Whole(vec![0, 1])),
            Some(1)
        );
        assert_eq!(overbooked(&held, 1, &GpuAssignment::Whole(vec![1])), None);
        let share = |milli| GpuAssignment::Share {
            gpu: 2,
            milli,
            memory_mib: 0,
        };
        assert_eq!(overbooked(&held, 0, &share(400)), None);
        assert_eq!(overbooked(&held, 0, &share(401)), Some(2));
    }
}

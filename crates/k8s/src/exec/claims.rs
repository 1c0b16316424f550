//! DRA writes before a Binding: what the kubelet checks before it prepares
//! a pod's claims is that each is allocated and reserved for the pod. So,
//! per claim: the finalizer `resource.kubernetes.io/delete-protection`
//! (the claim cannot vanish while allocated), then in one status update the
//! allocation (devices, and a node selector naming the node) and the pod in
//! `status.reservedFor`. Each write carries the claim's resourceVersion, so
//! a concurrent change is a conflict, read again and retried. When the
//! Binding fails, the pod's reservation (and an allocation made for it that
//! nobody else uses) is taken back.
//!
//! After the pod is gone kube-controller-manager's resourceclaim controller
//! removes it from `reservedFor`, and deallocates a claim no pod reserves
//! (allocation and finalizer), or deletes a claim made from a template.

use crate::dra::state::ClaimWrite;
use crate::dra::{Allocation, FINALIZER};
use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};
use k8s_openapi::api::resource::v1::{
    AllocationResult, DeviceAllocationResult, DeviceRequestAllocationResult, ResourceClaim,
    ResourceClaimConsumerReference,
};
use kube::{Api, Client};
use std::time::Duration;

/// Tries per claim when a write conflicts with another.
const ATTEMPTS: u32 = 5;

/// The API form of an allocation.
pub fn allocation_result(a: &Allocation) -> AllocationResult {
    AllocationResult {
        devices: Some(DeviceAllocationResult {
            results: Some(
                a.devices
                    .iter()
                    .map(|d| DeviceRequestAllocationResult {
                        request: d.request.clone(),
                        driver: d.id.driver.clone(),
                        pool: d.id.pool.clone(),
                        device: d.id.device.clone(),
                        admin_access: d.admin.then_some(true),
                        consumed_capacity: (!d.consumed.is_empty()).then(|| {
                            d.consumed
                                .iter()
                                .map(|(k, v)| (k.clone(), quantity(*v)))
                                .collect()
                        }),
                        share_id: d.share.clone(),
                        binding_conditions: (!d.binding.wait_for.is_empty())
                            .then(|| d.binding.wait_for.clone()),
                        binding_failure_conditions: (!d.binding.fail_on.is_empty())
                            .then(|| d.binding.fail_on.clone()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            config: None,
        }),
        node_selector: a.node.as_ref().map(|n| NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_fields: Some(vec![NodeSelectorRequirement {
                    key: "metadata.name".into(),
                    operator: "In".into(),
                    values: Some(vec![n.clone()]),
                }]),
                match_expressions: None,
            }],
        }),
        allocation_timestamp: None,
    }
}

/// A quantity of `milli` milli-units, in the API's form.
fn quantity(milli: i128) -> k8s_openapi::apimachinery::pkg::api::resource::Quantity {
    let s = if milli % 1000 == 0 {
        (milli / 1000).to_string()
    } else {
        format!("{milli}m")
    };
    k8s_openapi::apimachinery::pkg::api::resource::Quantity(s)
}

/// What the API server said (its message, not the whole status).
fn said(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} ({})", s.message, s.code),
        e => e.to_string(),
    }
}

fn conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409)
}

/// Allocates (when `w.allocate`) and reserves one claim for the pod.
pub async fn reserve(
    client: &Client,
    w: &ClaimWrite,
    pod_name: &str,
    pod_uid: &str,
) -> Result<(), String> {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &w.namespace);
    let what = format!("ResourceClaim {}/{}", w.namespace, w.name);
    let pp = super::post_params();
    for _ in 0..ATTEMPTS {
        let mut c = api
            .get(&w.name)
            .await
            .map_err(|e| format!("{what}: {}", said(&e)))?;
        if c.metadata.uid.as_deref() != Some(w.uid.as_str()) {
            return Err(format!("{what} was replaced by another claim of that name"));
        }
        if c.metadata.deletion_timestamp.is_some() {
            return Err(format!("{what} is being deleted"));
        }
        if let Some(a) = &w.allocate {
            let want = allocation_result(a);
            let has = c.status.as_ref().and_then(|s| s.allocation.as_ref());
            if let Some(has) = has
                && (has.devices != want.devices || has.node_selector != want.node_selector)
            {
                return Err(format!(
                    "{what} was allocated meanwhile (by another scheduler?)"
                ));
            }
            let fins = c.metadata.finalizers.get_or_insert_with(Vec::new);
            if !fins.iter().any(|f| f == FINALIZER) {
                fins.push(FINALIZER.to_string());
                c = match api.replace(&w.name, &pp, &c).await {
                    Ok(c) => c,
                    Err(e) if conflict(&e) => continue,
                    Err(e) => return Err(format!("{what}: adding the finalizer: {}", said(&e))),
                };
            }
            let status = c.status.get_or_insert_with(Default::default);
            if status.allocation.is_none() {
                status.allocation = Some(want);
            }
        } else if c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_none()
        {
            return Err(format!("{what} is no longer allocated"));
        }
        let status = c.status.get_or_insert_with(Default::default);
        let reserved = status.reserved_for.get_or_insert_with(Vec::new);
        if reserved.iter().any(|r| r.uid == pod_uid) {
            if w.allocate.is_none() {
                return Ok(());
            }
        } else {
            reserved.push(ResourceClaimConsumerReference {
                api_group: None,
                resource: "pods".into(),
                name: pod_name.to_string(),
                uid: pod_uid.to_string(),
            });
        }
        match api.replace_status(&w.name, &pp, &c).await {
            Ok(_) => return Ok(()),
            Err(e) if conflict(&e) => continue,
            Err(e) => return Err(format!("{what}: writing the allocation: {}", said(&e))),
        }
    }
    Err(format!("{what}: {ATTEMPTS} conflicting writes in a row"))
}

/// How long the Binding waits for a claim's binding conditions
/// (kube-scheduler's default `bindingTimeout`).
pub const BINDING_TIMEOUT: Duration = Duration::from_secs(600);

/// Where a claim's binding conditions stand.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Binding {
    /// None to wait for, or all true: the pod may be bound.
    Ready,
    /// Waiting for this (device and condition).
    Waiting(String),
    /// A failure condition is true: the allocation does not work out.
    Failed(String),
}

/// The binding conditions of allocation `a`'s devices against the claim's
/// `status.devices` as it is now.
pub fn binding_state(a: &Allocation, c: &ResourceClaim) -> Binding {
    let statuses = c
        .status
        .as_ref()
        .and_then(|s| s.devices.as_ref())
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut waiting = None;
    for d in a.devices.iter().filter(|d| !d.binding.is_empty()) {
        let st = statuses.iter().find(|s| {
            s.driver == d.id.driver
                && s.pool == d.id.pool
                && s.device == d.id.device
                && s.share_id == d.share
        });
        let is_true = |t: &str| {
            st.and_then(|s| s.conditions.as_ref())
                .into_iter()
                .flatten()
                .any(|k| k.type_ == t && k.status == "True")
        };
        if let Some(f) = d.binding.fail_on.iter().find(|f| is_true(f)) {
            return Binding::Failed(format!(
                "device {}: binding failure condition {f} is true",
                d.id
            ));
        }
        if waiting.is_none()
            && let Some(w) = d.binding.wait_for.iter().find(|w| !is_true(w))
        {
            waiting = Some(format!(
                "device {}: binding condition {w} is not true yet",
                d.id
            ));
        }
    }
    waiting.map_or(Binding::Ready, Binding::Waiting)
}

/// Waits until the binding conditions of the devices allocated by `w` are
/// true (polling the claim every second), failing on a failure condition
/// or after `timeout`. A write without binding conditions returns at once.
pub async fn wait_bound(client: &Client, w: &ClaimWrite, timeout: Duration) -> Result<(), String> {
    let Some(a) = &w.allocate else {
        return Ok(());
    };
    if a.devices.iter().all(|d| d.binding.is_empty()) {
        return Ok(());
    }
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &w.namespace);
    let what = format!("ResourceClaim {}/{}", w.namespace, w.name);
    let start = tokio::time::Instant::now();
    loop {
        let c = api
            .get(&w.name)
            .await
            .map_err(|e| format!("{what}: {}", said(&e)))?;
        match binding_state(a, &c) {
            Binding::Ready => return Ok(()),
            Binding::Failed(why) => return Err(format!("{what}: {why}")),
            Binding::Waiting(why) => {
                if start.elapsed() >= timeout {
                    return Err(format!(
                        "{what}: gave up after {}s: {why}",
                        timeout.as_secs()
                    ));
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// [`reserve`], creating the claim first when it is a KEP-5004 special
/// claim (`w.extended`): created with `generateName` for the pod, then
/// allocated and reserved, then named in the pod's
/// `status.extendedResourceClaimStatus`. The write as done (the created
/// claim's name and uid), for [`release`]. A failure after the claim was
/// created deletes it again.
pub async fn reserve_any(
    client: &Client,
    w: &ClaimWrite,
    pod_name: &str,
    pod_uid: &str,
) -> Result<ClaimWrite, String> {
    let Some(reqs) = &w.extended else {
        reserve(client, w, pod_name, pod_uid).await?;
        return Ok(w.clone());
    };
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &w.namespace);
    let obj = crate::dra::extended::claim_object(&w.namespace, pod_name, pod_uid, reqs);
    let made = api.create(&super::post_params(), &obj).await.map_err(|e| {
        format!(
            "creating the ResourceClaim for the extended resources of pod {}/{pod_name}: {}",
            w.namespace,
            said(&e)
        )
    })?;
    let done = ClaimWrite {
        name: made.metadata.name.clone().unwrap_or_default(),
        uid: made.metadata.uid.clone().unwrap_or_default(),
        ..w.clone()
    };
    let status = async {
        reserve(client, &done, pod_name, pod_uid).await?;
        let pods: Api<k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(client.clone(), &w.namespace);
        let patch = super::patch::extended_resource_claim(crate::dra::extended::pod_status(
            &done.name, reqs,
        ));
        pods.patch_status(
            pod_name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .map_err(|e| {
            format!(
                "pod {}/{pod_name}: writing status.extendedResourceClaimStatus: {}",
                w.namespace,
                said(&e)
            )
        })?;
        Ok::<(), String>(())
    };
    if let Err(e) = status.await {
        release(client, &done, pod_uid).await;
        return Err(e);
    }
    Ok(done)
}

/// Takes back what [`reserve`] wrote for the pod: its reservation, and the
/// allocation (and finalizer) when this write made it and no other pod
/// reserves the claim. Best effort: failures are logged.
pub async fn release(client: &Client, w: &ClaimWrite, pod_uid: &str) {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &w.namespace);
    if w.extended.is_some() {
        // a special claim we created: deleted (its finalizer taken off
        // first); the next attempt makes a new one
        release_claim(client, w, pod_uid).await;
        let dp = kube::api::DeleteParams {
            preconditions: Some(kube::api::Preconditions {
                uid: Some(w.uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        if let Err(e) = api.delete(&w.name, &dp).await {
            tracing::info!(
                "rolling back ResourceClaim {}/{}: deleting it: {e}",
                w.namespace,
                w.name
            );
        }
        return;
    }
    release_claim(client, w, pod_uid).await;
}

/// [`release`] of a claim's reservation, allocation and finalizer.
async fn release_claim(client: &Client, w: &ClaimWrite, pod_uid: &str) {
    let api: Api<ResourceClaim> = Api::namespaced(client.clone(), &w.namespace);
    let pp = super::post_params();
    for _ in 0..ATTEMPTS {
        let mut c = match api.get(&w.name).await {
            Ok(c) => c,
            Err(e) => {
                tracing::info!("rolling back ResourceClaim {}/{}: {e}", w.namespace, w.name);
                return;
            }
        };
        if c.metadata.uid.as_deref() != Some(w.uid.as_str()) {
            return;
        }
        let status = c.status.get_or_insert_with(Default::default);
        let reserved = status.reserved_for.get_or_insert_with(Vec::new);
        let before = reserved.len();
        reserved.retain(|r| r.uid != pod_uid);
        let unused = reserved.is_empty();
        if unused {
            status.reserved_for = None;
        }
        let deallocate = w.allocate.is_some() && unused && status.allocation.is_some();
        if deallocate {
            status.allocation = None;
        }
        if before != status.reserved_for.as_ref().map_or(0, Vec::len) || deallocate {
            c = match api.replace_status(&w.name, &pp, &c).await {
                Ok(c) => c,
                Err(e) if conflict(&e) => continue,
                Err(e) => {
                    tracing::info!("rolling back ResourceClaim {}/{}: {e}", w.namespace, w.name);
                    return;
                }
            };
        }
        let allocated = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .is_some();
        if w.allocate.is_some() && !allocated {
            let fins = c.metadata.finalizers.get_or_insert_with(Vec::new);
            if fins.iter().any(|f| f == FINALIZER) {
                fins.retain(|f| f != FINALIZER);
                match api.replace(&w.name, &pp, &c).await {
                    Ok(_) => {}
                    Err(e) if conflict(&e) => continue,
                    Err(e) => tracing::info!(
                        "rolling back ResourceClaim {}/{}: removing the finalizer: {e}",
                        w.namespace,
                        w.name
                    ),
                }
            }
        }
        return;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::{AllocatedDevice, DeviceId};

    #[test]
    fn the_allocation_names_the_devices_and_the_node_as_the_kubelet_reads_them() {
        let a = Allocation {
            node: Some("n1".into()),
            devices: vec![AllocatedDevice {
                request: "gpu".into(),
                id: DeviceId {
                    driver: "gpu.gpusched.io".into(),
                    pool: "n1".into(),
                    device: "gpu-0".into(),
                },
                admin: false,
                consumed: Default::default(),
                share: None,
                binding: Default::default(),
            }],
        };
        let v = serde_json::to_value(allocation_result(&a)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "devices": {"results": [{"request": "gpu", "driver": "gpu.gpusched.io",
                                         "pool": "n1", "device": "gpu-0"}]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
            })
        );
        // and it reads back as the same allocation
        let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml", "uid": "u"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.gpusched.io"}}]}},
            "status": {"allocation": v}
        }))
        .unwrap();
        assert_eq!(crate::dra::translate::claim(&claim).allocation, Some(a));
    }

    #[test]
    fn binding_conditions_wait_until_true_and_fail_on_a_failure_condition() {
        let dev = |name: &str, wait: &[&str], fail: &[&str]| AllocatedDevice {
            request: "gpu".into(),
            id: DeviceId {
                driver: "gpu.gpusched.io".into(),
                pool: "n1".into(),
                device: name.into(),
            },
            admin: false,
            consumed: Default::default(),
            share: None,
            binding: crate::dra::BindingConditions {
                wait_for: wait.iter().map(|s| s.to_string()).collect(),
                fail_on: fail.iter().map(|s| s.to_string()).collect(),
            },
        };
        let a = Allocation {
            node: Some("n1".into()),
            devices: vec![
                dev("gpu-0", &[], &[]),
                dev("fabric-0", &["Attached"], &["AttachFailed"]),
            ],
        };
        let v = serde_json::to_value(allocation_result(&a)).unwrap();
        assert_eq!(
            v["devices"]["results"][1]["bindingConditions"],
            serde_json::json!(["Attached"])
        );
        assert_eq!(v["devices"]["results"][0].get("bindingConditions"), None);
        let with = |conds: serde_json::Value| -> ResourceClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "c", "namespace": "ml", "uid": "u"},
                "status": {"allocation": v, "devices": [{"driver": "gpu.gpusched.io",
                    "pool": "n1", "device": "fabric-0", "conditions": conds}]}
            }))
            .unwrap()
        };
        let cond = |t: &str, s: &str| {
            serde_json::json!({"type": t, "status": s, "reason": "R", "message": "",
                "lastTransitionTime": "2026-12-06T10:00:00Z"})
        };
        let c0: ResourceClaim = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "c", "namespace": "ml", "uid": "u"}}))
        .unwrap();
        assert!(matches!(binding_state(&a, &c0), Binding::Waiting(w) if w.contains("Attached")));
        let c1 = with(serde_json::json!([cond("Attached", "False")]));
        assert!(matches!(binding_state(&a, &c1), Binding::Waiting(_)));
        let c2 = with(serde_json::json!([cond("Attached", "True")]));
        assert_eq!(binding_state(&a, &c2), Binding::Ready);
        let c3 = with(serde_json::json!([
            cond("Attached", "False"),
            cond("AttachFailed", "True")
        ]));
        assert!(matches!(binding_state(&a, &c3), Binding::Failed(f)
            if f.contains("fabric-0") && f.contains("AttachFailed")));
        // read back from the claim: the conditions are the allocation's
        let back = crate::dra::translate::claim(&c2).allocation.unwrap();
        assert_eq!(back, a);
    }
}

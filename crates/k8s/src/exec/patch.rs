//! The bodies of the executor's merge patches (RFC 7386), typed: each part
//! is a k8s-openapi value with only the fields to change set, so a field's
//! name and shape come from the API's types. k8s-openapi's whole objects
//! are not sent as patches: their serialization always carries `apiVersion`,
//! `kind` and required fields (an Event's `eventTime`), which a patch of a
//! few fields must not write.

use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolumeSpec, PodExtendedResourceClaimStatus, PodStatus,
};
use k8s_openapi::api::events::v1::EventSeries;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use serde::Serialize;
use std::collections::BTreeMap;

/// A merge patch of an object's `metadata`, `spec` and `status` (each sent
/// only when set, with only its set fields).
#[derive(Debug, Default, Serialize)]
pub(crate) struct MergePatch<Spec = (), Status = ()> {
    /// `metadata`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub metadata: Option<ObjectMeta>,
    /// `spec`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec: Option<Spec>,
    /// `status`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
}

/// A merge patch of an Event's `series` (events.k8s.io/v1).
#[derive(Debug, Serialize)]
pub(crate) struct SeriesPatch {
    /// `series`.
    pub series: EventSeries,
}

/// Binds PersistentVolume (at `resource_version`: the write is refused if
/// it changed) to claim `namespace/claim` (uid `claim_uid`), marked as the
/// PV controller marks a binding it made (`annotation`).
pub(crate) fn claim_ref(
    resource_version: &str,
    annotation: &str,
    namespace: &str,
    claim: &str,
    claim_uid: &str,
) -> MergePatch<PersistentVolumeSpec> {
    MergePatch {
        metadata: Some(ObjectMeta {
            resource_version: Some(resource_version.to_string()),
            annotations: Some(BTreeMap::from([(
                annotation.to_string(),
                "yes".to_string(),
            )])),
            ..ObjectMeta::default()
        }),
        spec: Some(PersistentVolumeSpec {
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(namespace.to_string()),
                name: Some(claim.to_string()),
                uid: Some(claim_uid.to_string()),
                ..ObjectReference::default()
            }),
            ..PersistentVolumeSpec::default()
        }),
        status: None,
    }
}

/// Sets annotation `annotation` to `value` (a PersistentVolumeClaim's
/// selected node).
pub(crate) fn annotation(annotation: &str, value: &str) -> MergePatch {
    annotations(&[(annotation, value)])
}

/// Sets each (annotation, value) of `pairs` (the pods a ProvisioningRequest
/// was made for: which request they consume, its class).
pub(crate) fn annotations(pairs: &[(&str, &str)]) -> MergePatch {
    MergePatch {
        metadata: Some(ObjectMeta {
            annotations: Some(
                pairs
                    .iter()
                    .map(|(a, v)| (a.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        }),
        ..MergePatch::default()
    }
}

/// Sets a pod's `status.nominatedNodeName`.
pub(crate) fn nominated_node(node: &str) -> MergePatch<(), PodStatus> {
    MergePatch {
        status: Some(PodStatus {
            nominated_node_name: Some(node.to_string()),
            ..PodStatus::default()
        }),
        ..MergePatch::default()
    }
}

/// Sets a pod's `status.extendedResourceClaimStatus`: the ResourceClaim
/// made for its extended resources and which container request maps to
/// which device request (KEP-5004).
pub(crate) fn extended_resource_claim(
    status: PodExtendedResourceClaimStatus,
) -> MergePatch<(), PodStatus> {
    MergePatch {
        status: Some(PodStatus {
            extended_resource_claim_status: Some(status),
            ..PodStatus::default()
        }),
        ..MergePatch::default()
    }
}

/// Counts an event's `count`th occurrence, observed `now`.
pub(crate) fn series(count: i32, now: Timestamp) -> SeriesPatch {
    SeriesPatch {
        series: EventSeries {
            count,
            last_observed_time: MicroTime(now),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    // Each body is compared with the `json!` patch the executor sent before
    // the bodies were typed: the wire content is the same.

    #[test]
    fn a_volume_binding_is_the_patch_it_was() {
        let typed = claim_ref(
            "42",
            crate::volumes::ANN_BOUND_BY_CONTROLLER,
            "ml",
            "data",
            "u-1",
        );
        let before = json!({
            "metadata": {
                "resourceVersion": "42",
                "annotations": {crate::volumes::ANN_BOUND_BY_CONTROLLER: "yes"},
            },
            "spec": {"claimRef": {
                "apiVersion": "v1",
                "kind": "PersistentVolumeClaim",
                "namespace": "ml",
                "name": "data",
                "uid": "u-1",
            }},
        });
        assert_eq!(serde_json::to_value(&typed).unwrap(), before);
    }

    #[test]
    fn a_selected_node_is_the_patch_it_was() {
        let typed = annotation(crate::volumes::ANN_SELECTED_NODE, "gpu-7");
        let before = json!({
            "metadata": {"annotations": {crate::volumes::ANN_SELECTED_NODE: "gpu-7"}},
        });
        assert_eq!(serde_json::to_value(&typed).unwrap(), before);
    }

    #[test]
    fn provisioning_annotations_are_the_patch_they_were() {
        use crate::provreq::{ANNOTATION_CLASS, ANNOTATION_CONSUME};
        let (name, class) = ("gpusched-ml-g-1", "check-capacity.autoscaling.x-k8s.io");
        let before = json!({"metadata": {"annotations": {
            ANNOTATION_CONSUME: name,
            ANNOTATION_CLASS: class,
        }}});
        let typed = annotations(&[(ANNOTATION_CONSUME, name), (ANNOTATION_CLASS, class)]);
        assert_eq!(serde_json::to_value(&typed).unwrap(), before);
    }

    #[test]
    fn a_nomination_is_the_patch_it_was() {
        let before = json!({"status": {"nominatedNodeName": "gpu-7"}});
        assert_eq!(
            serde_json::to_value(nominated_node("gpu-7")).unwrap(),
            before
        );
    }

    #[test]
    fn an_extended_resource_claim_status_is_the_patch_it_was() {
        use crate::dra::extended::{ExtendedRequest, pod_status};
        let reqs = [
            ExtendedRequest {
                container: "main".into(),
                request: "container-0-request-0".into(),
                resource: "nvidia.com/gpu".into(),
                class: "gpu.gpusched.io".into(),
                count: 2,
            },
            ExtendedRequest {
                container: "side".into(),
                request: "container-1-request-0".into(),
                resource: "nvidia.com/gpu".into(),
                class: "gpu.gpusched.io".into(),
                count: 1,
            },
        ];
        let status = pod_status("train-gpu-claim-x7k2q", &reqs);
        let before = json!({"status": {"extendedResourceClaimStatus": status.clone()}});
        assert_eq!(
            serde_json::to_value(extended_resource_claim(status)).unwrap(),
            before
        );
        assert_eq!(
            before["status"]["extendedResourceClaimStatus"],
            json!({
                "resourceClaimName": "train-gpu-claim-x7k2q",
                "requestMappings": [
                    {"containerName": "main", "requestName": "container-0-request-0",
                     "resourceName": "nvidia.com/gpu"},
                    {"containerName": "side", "requestName": "container-1-request-0",
                     "resourceName": "nvidia.com/gpu"},
                ],
            })
        );
    }

    #[test]
    fn an_event_series_is_the_patch_it_was() {
        let now = Timestamp::from_second(1_790_000_000).unwrap();
        let before = json!({"series": EventSeries {
            count: 3,
            last_observed_time: MicroTime(now),
        }});
        assert_eq!(serde_json::to_value(series(3, now)).unwrap(), before);
        // and the time as the API reads it
        assert_eq!(
            before["series"]["lastObservedTime"],
            json!("2026-09-21T14:13:20.000000Z")
        );
    }
}

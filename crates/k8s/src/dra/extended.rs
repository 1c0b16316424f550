//! KEP-5004: extended resources backed by DRA. A DeviceClass with
//! `spec.extendedResourceName` (say `nvidia.com/gpu`), and every class under
//! its implicit name `deviceclass.resource.kubernetes.io/<class>`, lets a
//! pod that asks that extended resource be served by DRA on a node whose
//! allocatable lacks it (no device plugin there). The scheduler then makes
//! one "special" ResourceClaim for the pod: one request per (container,
//! extended resource) named `container-<i>-request-<j>` (`i` the
//! container's index among init and regular containers, `j` the
//! resource's index among the container's sorted request names), an
//! `ExactCount` of the mapped class; the claim is created with
//! `generateName: <pod>-extended-resources-`, the annotation
//! `resource.kubernetes.io/extended-resource-claim: "true"` and the pod as
//! its controlling owner; the pod's `status.extendedResourceClaimStatus`
//! maps each container and resource to its request and names the claim
//! (the kubelet reads it to hand the devices to the right containers).
//!
//! These are the pure parts, as kube-scheduler's DynamicResources plugin
//! builds them: the class mapping, the requests for a node, the claim and
//! the pod status.

use super::{Claim, Class, Count, Request, SubRequest};
use k8s_openapi::api::core::v1::{
    Container, ContainerExtendedResourceRequest, Pod, PodExtendedResourceClaimStatus,
};
use k8s_openapi::api::resource::v1::{
    DeviceClaim, DeviceRequest, ExactDeviceRequest, ResourceClaim, ResourceClaimSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use std::collections::BTreeMap;

/// The prefix of a class's implicit extended resource name.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// The annotation that marks the special claim.
pub const CLAIM_ANNOTATION: &str = "resource.kubernetes.io/extended-resource-claim";

/// The name the special claim has in memory before it is created (not a
/// valid object name, so it never meets a real claim).
pub const IN_MEMORY_NAME: &str = "<extended-resources>";

/// Extended resource name → DeviceClass name: every class under its
/// implicit name, and under its `extendedResourceName` where the newest
/// class (then the first by name) naming it wins, as upstream.
pub fn class_mapping(classes: &BTreeMap<String, Class>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = BTreeMap::new();
    let mut explicit: BTreeMap<&str, &Class> = BTreeMap::new();
    for c in classes.values() {
        out.insert(format!("{IMPLICIT_PREFIX}{}", c.name), c.name.clone());
        if let Some(r) = &c.extended_resource {
            let better = explicit.get(r.as_str()).is_none_or(|o| {
                c.created_ns > o.created_ns || (c.created_ns == o.created_ns && c.name < o.name)
            });
            if better {
                explicit.insert(r, c);
            }
        }
    }
    for (r, c) in explicit {
        out.insert(r.to_string(), c.name.clone());
    }
    out
}

/// One request of the special claim and what it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtendedRequest {
    /// `container-<i>-request-<j>`.
    pub request: String,
    /// The container's name.
    pub container: String,
    /// The extended resource.
    pub resource: String,
    /// The DeviceClass it maps to.
    pub class: String,
    /// How many devices.
    pub count: u32,
}

/// The containers whose requests count: init containers, then regular
/// ones (ephemeral containers ask nothing).
fn containers(p: &Pod) -> Vec<&Container> {
    p.spec
        .as_ref()
        .map(|s| {
            s.init_containers
                .iter()
                .flatten()
                .chain(s.containers.iter())
                .collect()
        })
        .unwrap_or_default()
}

/// One domain-qualified resource a container asks (requests, defaulting
/// to limits as the API server does for extended resources), with the
/// indexes upstream names the request by.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Asked {
    /// The container's index among init then regular containers.
    pub container_index: usize,
    /// The resource's index among the container's sorted request names.
    pub resource_index: usize,
    /// The container's name.
    pub container: String,
    /// The resource.
    pub resource: String,
    /// The amount as written.
    pub amount: String,
}

/// The domain-qualified resources the pod's containers ask (the only
/// ones a DeviceClass may map), in container then name order.
pub fn asked(p: &Pod) -> Vec<Asked> {
    let mut out = Vec::new();
    for (i, c) in containers(p).into_iter().enumerate() {
        let res = c.resources.as_ref();
        let mut all: BTreeMap<&str, &str> = BTreeMap::new();
        for (k, q) in res.and_then(|r| r.limits.as_ref()).into_iter().flatten() {
            all.insert(k, &q.0);
        }
        for (k, q) in res.and_then(|r| r.requests.as_ref()).into_iter().flatten() {
            all.insert(k, &q.0);
        }
        for (j, (k, q)) in all.iter().enumerate() {
            if k.contains('/') {
                out.push(Asked {
                    container_index: i,
                    resource_index: j,
                    container: c.name.clone(),
                    resource: k.to_string(),
                    amount: q.to_string(),
                });
            }
        }
    }
    out
}

/// Whether any of `asked` is mapped by `mapping` (and not zero).
pub fn asks_mapped(asked: &[Asked], mapping: &BTreeMap<String, String>) -> bool {
    asked
        .iter()
        .any(|a| mapping.contains_key(&a.resource) && a.amount.trim() != "0")
}

/// The special claim's requests for a node: one per (container, mapped
/// extended resource) the node does not serve itself (`served`: its
/// allocatable has the resource, a device plugin's), sorted by request
/// name. Empty: nothing to allocate through DRA there. An amount that is
/// not a whole positive number (or more than 128 devices) is an error
/// naming the container and resource.
pub fn requests(
    asked: &[Asked],
    mapping: &BTreeMap<String, String>,
    served: impl Fn(&str) -> bool,
) -> Result<Vec<ExtendedRequest>, String> {
    let mut out = Vec::new();
    for a in asked {
        let Some(class) = mapping.get(&a.resource) else {
            continue;
        };
        if served(&a.resource) {
            continue;
        }
        let (c, k) = (&a.container, &a.resource);
        let n = gpusched_model::quantity::parse_integer(&a.amount)
            .map_err(|e| format!("container {c}: extended resource {k}: {e}"))?;
        if n == 0 {
            continue;
        }
        let count = u32::try_from(n).ok().filter(|n| *n <= 128).ok_or_else(|| {
            format!(
                "container {c}: extended resource {k}: {n} devices is more than the 128 a claim request may ask"
            )
        })?;
        out.push(ExtendedRequest {
            request: format!(
                "container-{}-request-{}",
                a.container_index, a.resource_index
            ),
            container: c.clone(),
            resource: k.clone(),
            class: class.clone(),
            count,
        });
    }
    out.sort_by(|a, b| a.request.cmp(&b.request));
    Ok(out)
}

/// The key the special claim of pod `uid` is held under in memory until
/// the created claim shows its allocation.
pub fn special_key(namespace: &str, pod_uid: &str) -> String {
    format!("{namespace}/{IN_MEMORY_NAME}{pod_uid}")
}

/// The special claim as the allocator sees it before it exists.
pub fn claim(namespace: &str, reqs: &[ExtendedRequest]) -> Claim {
    Claim {
        namespace: namespace.to_string(),
        name: IN_MEMORY_NAME.to_string(),
        uid: String::new(),
        requests: Ok(reqs
            .iter()
            .map(|r| Request {
                name: r.request.clone(),
                alternatives: vec![SubRequest {
                    name: r.request.clone(),
                    class: r.class.clone(),
                    selectors: Vec::new(),
                    count: Count::Exact(r.count),
                    admin: false,
                    tolerations: Vec::new(),
                    capacity: BTreeMap::new(),
                }],
            })
            .collect()),
        constraints: Vec::new(),
        allocation: None,
        reserved_for: Vec::new(),
        deleting: false,
    }
}

/// The special claim to create for pod `namespace/name` (uid `uid`):
/// `generateName`, the annotation, the pod as controlling owner, the
/// requests.
pub fn claim_object(
    namespace: &str,
    name: &str,
    uid: &str,
    reqs: &[ExtendedRequest],
) -> ResourceClaim {
    let name = name.to_string();
    ResourceClaim {
        metadata: ObjectMeta {
            namespace: Some(namespace.to_string()),
            generate_name: Some(format!("{name}-extended-resources-")),
            annotations: Some(BTreeMap::from([(
                CLAIM_ANNOTATION.to_string(),
                "true".to_string(),
            )])),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name,
                uid: uid.to_string(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(ResourceClaimSpec {
            devices: Some(DeviceClaim {
                requests: Some(
                    reqs.iter()
                        .map(|r| DeviceRequest {
                            name: r.request.clone(),
                            exactly: Some(ExactDeviceRequest {
                                device_class_name: r.class.clone(),
                                allocation_mode: Some("ExactCount".into()),
                                count: Some(i64::from(r.count)),
                                ..Default::default()
                            }),
                            first_available: None,
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
        }),
        status: None,
    }
}

/// Whether `c` is pod `p`'s special claim (annotated, controlled by it).
pub fn is_special_claim_of(c: &ResourceClaim, pod_uid: &str) -> bool {
    c.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(CLAIM_ANNOTATION))
        .is_some_and(|v| v == "true")
        && c.metadata
            .owner_references
            .iter()
            .flatten()
            .any(|o| o.controller == Some(true) && o.uid == pod_uid)
}

/// The pod's `status.extendedResourceClaimStatus` once claim `name` exists.
pub fn pod_status(name: &str, reqs: &[ExtendedRequest]) -> PodExtendedResourceClaimStatus {
    PodExtendedResourceClaimStatus {
        request_mappings: reqs
            .iter()
            .map(|r| ContainerExtendedResourceRequest {
                container_name: r.container.clone(),
                request_name: r.request.clone(),
                resource_name: r.resource.clone(),
            })
            .collect(),
        resource_claim_name: name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn class(name: &str, ext: Option<&str>, created: i128) -> (String, Class) {
        (
            name.to_string(),
            Class {
                name: name.into(),
                selectors: vec![],
                extended_resource: ext.map(String::from),
                created_ns: created,
            },
        )
    }

    fn pod() -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": "train", "namespace": "ml", "uid": "uid-train"},
            "spec": {
                "initContainers": [{"name": "fetch", "image": "x",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "containers": [
                    {"name": "main", "image": "x", "resources": {"requests": {
                        "cpu": "1", "nvidia.com/gpu": "2", "example.com/nic": "1"}}},
                    {"name": "side", "image": "x", "resources": {"requests": {"cpu": "1"}}},
                    {"name": "dev", "image": "x", "resources": {"requests": {
                        "deviceclass.resource.kubernetes.io/fpga": "1"}}}]}
        }))
        .unwrap()
    }

    #[test]
    fn the_newest_class_wins_an_extended_resource_name_and_every_class_has_its_implicit_one() {
        let classes = BTreeMap::from([
            class("gpu.gpusched.io", Some("nvidia.com/gpu"), 10),
            class("gpu-new", Some("nvidia.com/gpu"), 20),
            class("a-same", Some("example.com/nic"), 5),
            class("b-same", Some("example.com/nic"), 5),
            class("fpga", None, 0),
        ]);
        let m = class_mapping(&classes);
        assert_eq!(m["nvidia.com/gpu"], "gpu-new");
        assert_eq!(m["example.com/nic"], "a-same");
        assert_eq!(m["deviceclass.resource.kubernetes.io/fpga"], "fpga");
        assert_eq!(
            m["deviceclass.resource.kubernetes.io/gpu.gpusched.io"],
            "gpu.gpusched.io"
        );
        assert_eq!(m.len(), 7);
    }

    #[test]
    fn requests_are_named_per_container_and_sorted_resource_as_upstream() {
        let classes = BTreeMap::from([
            class("gpu.gpusched.io", Some("nvidia.com/gpu"), 1),
            class("fpga", None, 0),
        ]);
        let m = class_mapping(&classes);
        let p = asked(&pod());
        assert!(asks_mapped(&p, &m));
        let r = requests(&p, &m, |_| false).unwrap();
        let got: Vec<(&str, &str, &str, &str, u32)> = r
            .iter()
            .map(|r| {
                (
                    r.request.as_str(),
                    r.container.as_str(),
                    r.resource.as_str(),
                    r.class.as_str(),
                    r.count,
                )
            })
            .collect();
        // main's sorted requests: cpu, example.com/nic, nvidia.com/gpu
        assert_eq!(
            got,
            vec![
                (
                    "container-0-request-0",
                    "fetch",
                    "nvidia.com/gpu",
                    "gpu.gpusched.io",
                    1
                ),
                (
                    "container-1-request-2",
                    "main",
                    "nvidia.com/gpu",
                    "gpu.gpusched.io",
                    2
                ),
                (
                    "container-3-request-0",
                    "dev",
                    "deviceclass.resource.kubernetes.io/fpga",
                    "fpga",
                    1
                ),
            ]
        );
        // a node whose device plugin serves nvidia.com/gpu: only the fpga
        let r = requests(&p, &m, |k| k == "nvidia.com/gpu").unwrap();
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].resource, "deviceclass.resource.kubernetes.io/fpga");
        // nothing mapped: nothing asked
        assert!(!asks_mapped(&p, &BTreeMap::new()));
        assert!(
            requests(&p, &BTreeMap::new(), |_| false)
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn a_bad_amount_is_an_error_naming_the_container() {
        let m = class_mapping(&BTreeMap::from([class("g", Some("nvidia.com/gpu"), 0)]));
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
            "spec": {"containers": [{"name": "main", "image": "x",
                "resources": {"requests": {"nvidia.com/gpu": "500m"}}}]}
        }))
        .unwrap();
        let e = requests(&asked(&p), &m, |_| false).unwrap_err();
        assert!(
            e.contains("container main: extended resource nvidia.com/gpu"),
            "{e}"
        );
        let p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml", "uid": "u"},
            "spec": {"containers": [{"name": "main", "image": "x",
                "resources": {"requests": {"nvidia.com/gpu": "200"}}}]}
        }))
        .unwrap();
        let e = requests(&asked(&p), &m, |_| false).unwrap_err();
        assert!(e.contains("more than the 128"), "{e}");
    }

    #[test]
    fn the_claim_object_and_the_pod_status_have_upstreams_shape() {
        let m = class_mapping(&BTreeMap::from([class(
            "gpu.gpusched.io",
            Some("nvidia.com/gpu"),
            0,
        )]));
        let r = requests(&asked(&pod()), &m, |_| false).unwrap();
        let obj = claim_object("ml", "train", "uid-train", &r);
        let v = serde_json::to_value(&obj).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceClaim",
                "metadata": {
                    "namespace": "ml",
                    "generateName": "train-extended-resources-",
                    "annotations": {"resource.kubernetes.io/extended-resource-claim": "true"},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "train",
                        "uid": "uid-train", "controller": true, "blockOwnerDeletion": true}]
                },
                "spec": {"devices": {"requests": [
                    {"name": "container-0-request-0", "exactly": {"deviceClassName": "gpu.gpusched.io",
                        "allocationMode": "ExactCount", "count": 1}},
                    {"name": "container-1-request-2", "exactly": {"deviceClassName": "gpu.gpusched.io",
                        "allocationMode": "ExactCount", "count": 2}}
                ]}}
            })
        );
        assert!(is_special_claim_of(&obj, "uid-train"));
        assert!(!is_special_claim_of(&obj, "uid-other"));
        // the allocator's view asks the same
        let c = claim("ml", &r);
        let reqs = c.requests.unwrap();
        assert_eq!(reqs[1].alternatives[0].count, Count::Exact(2));
        assert_eq!(reqs[1].alternatives[0].class, "gpu.gpusched.io");
        let s = serde_json::to_value(pod_status("train-extended-resources-x7k2p", &r)).unwrap();
        assert_eq!(
            s,
            json!({"resourceClaimName": "train-extended-resources-x7k2p", "requestMappings": [
                {"containerName": "fetch", "requestName": "container-0-request-0",
                 "resourceName": "nvidia.com/gpu"},
                {"containerName": "main", "requestName": "container-1-request-2",
                 "resourceName": "nvidia.com/gpu"}]})
        );
    }
}

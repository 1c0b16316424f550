//! Pod constraints gpusched does not check yet are refused, never ignored
//! (issue #22, 7): a pending pod that uses one is `Invalid` with the field
//! named; a bound pod that uses one still counts with what it holds.

use gpusched_k8s::translate::{self, PodKind};
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Value, json};

fn pod(extra_spec: Value, bound: bool) -> Pod {
    let mut spec = json!({"schedulerName": "gpusched", "containers": [
        {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1", "cpu": "2"}}}]});
    for (k, v) in extra_spec.as_object().unwrap() {
        spec[k] = v.clone();
    }
    if bound {
        spec["nodeName"] = json!("n1");
    }
    serde_json::from_value(json!({
        "metadata": {"name": "p", "namespace": "ml", "uid": "u1",
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": spec,
        "status": {"phase": if bound {"Running"} else {"Pending"}}
    }))
    .unwrap()
}

fn term() -> Value {
    json!({"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname"})
}

#[test]
fn each_unchecked_constraint_is_refused_naming_its_field() {
    let cases = [
        (
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term()]}}}),
            "spec.affinity.podAntiAffinity",
        ),
        (
            json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm": term()}]}}}),
            "spec.affinity.podAntiAffinity",
        ),
        (
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term()]}}}),
            "spec.affinity.podAffinity",
        ),
        (
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}),
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution",
        ),
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                   "labelSelector": {"matchLabels": {"app": "x"}}}]}),
            "spec.topologySpreadConstraints",
        ),
        (
            json!({"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}),
            "spec.resourceClaims",
        ),
        (
            json!({"volumes": [{"name": "scratch", "emptyDir": {}}, {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}),
            "spec.volumes[1].persistentVolumeClaim",
        ),
        (
            json!({"volumes": [{"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}]}),
            "spec.volumes[0].ephemeral",
        ),
        (
            json!({"initContainers": [{"name": "init", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080}]}]}),
            "spec.initContainers[0].ports[0].hostPort",
        ),
    ];
    for (extra, field) in cases {
        let v = translate::pod(&pod(extra.clone(), false));
        let PodKind::Invalid { error } = &v.kind else {
            panic!("{field}: accepted: {:?}", v.kind)
        };
        assert!(
            error.contains(&format!("pod ml/p: {field}: not supported by gpusched yet")),
            "{field}: {error}"
        );
        // bound (by another scheduler, or before): still counted in full
        let v = translate::pod(&pod(extra, true));
        let PodKind::Bound { pod, .. } = &v.kind else {
            panic!("{field}: bound pod not counted: {:?}", v.kind)
        };
        assert_eq!(pod.requests.cpu_milli, 2000, "{field}");
    }
}

#[test]
fn harmless_fields_are_accepted() {
    // a container port without hostPort, empty affinity blocks, plain volumes
    let v = translate::pod(&pod(
        json!({"affinity": {"podAntiAffinity": {}}, "topologySpreadConstraints": [],
               "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "cfg", "configMap": {"name": "c"}}],
               "containers": [{"name": "main", "image": "x", "ports": [{"containerPort": 8080}],
                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
        false,
    ));
    assert!(matches!(v.kind, PodKind::Pending { .. }), "{:?}", v.kind);
}

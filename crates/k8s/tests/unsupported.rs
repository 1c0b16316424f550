//! Pod fields are translated, never ignored (issue #22, 7): harmless ones
//! are accepted, bad values are refused naming the field, and the Pod API
//! constraints gpusched honours (issue #23) are translated (see
//! `podapi.rs`); DRA claims are allocated (tests/dra.rs), volumes resolved
//! (tests/volumes.rs).

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
fn harmless_fields_are_accepted() {
    // a container port without hostPort, empty affinity blocks, volumes
    // (claims are resolved when the snapshot is built: tests/volumes.rs)
    let v = translate::pod(&pod(
        json!({"affinity": {"podAntiAffinity": {}}, "topologySpreadConstraints": [],
               "volumes": [{"name": "shm", "emptyDir": {"medium": "Memory"}}, {"name": "cfg", "configMap": {"name": "c"}},
                           {"name": "data", "persistentVolumeClaim": {"claimName": "data"}},
                           {"name": "e", "ephemeral": {"volumeClaimTemplate": {"spec": {"accessModes": ["ReadWriteOnce"]}}}}],
               "containers": [{"name": "main", "image": "x", "ports": [{"containerPort": 8080}],
                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}),
        false,
    ));
    assert!(matches!(v.kind, PodKind::Pending { .. }), "{:?}", v.kind);
}

#[test]
fn honoured_pod_api_constraints_are_translated_not_refused() {
    let v = translate::pod(&pod(
        json!({"affinity": {
                  "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term()]},
                  "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "podAffinityTerm":
                      {"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": "zone", "namespaceSelector": {}}}]},
                  "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                      {"weight": 100, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}},
               "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule",
                   "labelSelector": {"matchLabels": {"app": "x"}}, "minDomains": 3, "nodeTaintsPolicy": "Honor"}],
               "initContainers": [{"name": "init", "image": "x", "ports": [{"containerPort": 80, "hostPort": 8080, "protocol": "UDP"}]}]}),
        false,
    ));
    let PodKind::Pending { pod, .. } = &v.kind else {
        panic!("refused: {:?}", v.kind)
    };
    let c = pod.constraints();
    assert_eq!(pod.namespace, "ml");
    assert_eq!(c.required_anti_affinity.len(), 1);
    assert_eq!(
        c.required_anti_affinity[0].topology_key,
        "kubernetes.io/hostname"
    );
    assert!(c.preferred_affinity[0].term.all_namespaces);
    assert_eq!(c.preferred_affinity[0].weight, 10);
    assert_eq!(c.preferred_node_affinity[0].weight, 100);
    assert_eq!(c.spread[0].min_domains, Some(3));
    assert_eq!(
        c.spread[0].node_taints_policy,
        gpusched_model::SpreadPolicy::Honor
    );
    assert_eq!(
        c.spread[0].node_affinity_policy,
        gpusched_model::SpreadPolicy::Honor
    );
    assert_eq!(c.host_ports[0].port, 8080);
    assert_eq!(c.host_ports[0].protocol, gpusched_model::Protocol::Udp);
}

#[test]
fn namespace_selectors_are_kept_for_the_world_to_resolve() {
    let v = translate::pod(&pod(
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname",
                 "namespaceSelector": {"matchLabels": {"team": "a"}}},
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname",
                 "namespaceSelector": {}}]}}}),
        false,
    ));
    let PodKind::Pending { pod, .. } = &v.kind else {
        panic!("refused: {:?}", v.kind)
    };
    let t = &pod.constraints().required_anti_affinity;
    let sel = t[0]
        .namespace_selector
        .as_ref()
        .expect("narrow selector kept");
    assert!(sel.matches(&[("team".to_string(), "a".to_string())].into()));
    assert!(!t[0].all_namespaces && t[0].selected_namespaces.is_empty());
    assert!(t[1].all_namespaces && t[1].namespace_selector.is_none());
}

#[test]
fn bad_pod_api_values_are_refused_naming_the_field() {
    let cases = [
        (
            json!({"topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Sometimes"}]}),
            "spec.topologySpreadConstraints[0].whenUnsatisfiable",
        ),
        (
            json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}, "topologyKey": "zone"}]}}}),
            "spec.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].operator",
        ),
        (
            json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "zone",
                 "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "Lt", "values": ["1"]}]}}]}}}),
            "spec.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].namespaceSelector.matchExpressions[0].operator",
        ),
        (
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 0, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}]}}}),
            "spec.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight",
        ),
    ];
    for (extra, field) in cases {
        let v = translate::pod(&pod(extra, false));
        let PodKind::Invalid { error } = &v.kind else {
            panic!("{field}: accepted: {:?}", v.kind)
        };
        assert!(error.contains(field), "{field}: {error}");
    }
}

#[test]
fn match_label_keys_merge_the_pods_own_values() {
    let mut p = pod(
        json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "x"}}, "topologyKey": "kubernetes.io/hostname",
                 "matchLabelKeys": ["rev"], "mismatchLabelKeys": ["tenant"]}]}},
               "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway",
                   "labelSelector": {"matchLabels": {"app": "x"}}, "matchLabelKeys": ["rev"]}]}),
        false,
    );
    p.metadata.labels = Some(
        [("app", "x"), ("rev", "7"), ("tenant", "t1")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let v = translate::pod(&p);
    let PodKind::Pending { pod, .. } = &v.kind else {
        panic!("refused: {:?}", v.kind)
    };
    let c = pod.constraints();
    let sel = c.required_anti_affinity[0].selector.as_ref().unwrap();
    let l = |pairs: &[(&str, &str)]| -> std::collections::BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert!(sel.matches(&l(&[("app", "x"), ("rev", "7"), ("tenant", "t2")])));
    assert!(!sel.matches(&l(&[("app", "x"), ("rev", "8"), ("tenant", "t2")])));
    assert!(!sel.matches(&l(&[("app", "x"), ("rev", "7"), ("tenant", "t1")])));
    let spread = c.spread[0].selector.as_ref().unwrap();
    assert!(!spread.matches(&l(&[("app", "x"), ("rev", "6")])));
    assert_eq!(pod.labels.get("rev").map(String::as_str), Some("7"));
}

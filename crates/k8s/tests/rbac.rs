//! The chart grants the scheduler exactly what its code uses
//! (`gpusched_k8s::rbac`): a missing permission starves the installed
//! scheduler (issue #22, 1), an extra one is privilege nobody needs.

use gpusched_k8s::rbac;
use serde_json::Value;
use std::path::Path;

fn rendered() -> Vec<Value> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/gpusched.yaml");
    let text = std::fs::read_to_string(&path).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn granted(docs: &[Value], kind: &str, name: &str) -> Vec<(String, String, String)> {
    let doc = docs
        .iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("deploy/gpusched.yaml has no {kind} {name}"));
    let mut out = Vec::new();
    for rule in doc["rules"].as_array().unwrap() {
        for g in rule["apiGroups"].as_array().unwrap() {
            for r in rule["resources"].as_array().unwrap() {
                for v in rule["verbs"].as_array().unwrap() {
                    out.push((
                        g.as_str().unwrap().to_string(),
                        r.as_str().unwrap().to_string(),
                        v.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn the_charts_scheduler_role_is_what_the_code_uses() {
    let docs = rendered();
    assert_eq!(
        granted(&docs, "ClusterRole", "gpusched-scheduler"),
        rbac::triples(rbac::CLUSTER),
        "ClusterRole gpusched-scheduler differs from crates/k8s/src/rbac.rs"
    );
    assert_eq!(
        granted(&docs, "Role", "gpusched-scheduler-lease"),
        rbac::triples(rbac::LEASE),
        "Role gpusched-scheduler-lease differs from crates/k8s/src/rbac.rs"
    );
}

/// Issue 38, item 7: the debug reader role grants gpusched's own URL
/// prefix only — `/metrics` or `/debug/*` would also open the API server's
/// `/metrics` and `/debug/pprof/*` — and the scheduler serves its debug
/// endpoint under that prefix.
#[test]
fn the_debug_reader_role_grants_only_gpuscheds_prefix() {
    let docs = rendered();
    let doc = docs
        .iter()
        .find(|d| d["kind"] == "ClusterRole" && d["metadata"]["name"] == "gpusched-debug-reader")
        .expect("ClusterRole gpusched-debug-reader");
    let mut urls: Vec<&str> = Vec::new();
    for rule in doc["rules"].as_array().unwrap() {
        assert!(rule.get("resources").is_none(), "{rule}");
        assert_eq!(rule["verbs"], serde_json::json!(["get"]), "{rule}");
        urls.extend(
            rule["nonResourceURLs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|u| u.as_str().unwrap()),
        );
    }
    let prefix = format!("{}/*", gpusched_k8s::debug::PATH_PREFIX);
    assert_eq!(urls, vec![prefix.as_str()]);
    assert!(gpusched_k8s::debug::DEBUG_PREFIX.starts_with(gpusched_k8s::debug::PATH_PREFIX));
    assert_eq!(
        gpusched_k8s::debug::debug_path("pods/ml/p0"),
        "/gpusched/debug/pods/ml/p0"
    );
}

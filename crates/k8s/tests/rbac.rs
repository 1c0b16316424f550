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

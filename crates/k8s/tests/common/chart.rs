//! What the chart installs, as the tests read it: its documents (with `--set`
//! values), the scheduler's arguments, a ServiceAccount token's kubeconfig.

use super::*;

/// The namespace the chart is rendered for.
pub const CHART_NAMESPACE: &str = "gpusched-system";

/// The rendered chart, deploy/gpusched.yaml, one JSON value per document.
pub fn chart_docs() -> Vec<Value> {
    let text = std::fs::read_to_string(repo_root().join("deploy/gpusched.yaml")).unwrap();
    yaml_stream(&text)
}

fn yaml_stream(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

/// The chart rendered with `--set` values (`key=value`), by the Helm that
/// `deploy/render` builds and caches (as a user installs it with values).
pub fn chart_docs_with(values: &[&str]) -> Vec<Value> {
    let root = repo_root();
    let out = Command::new(root.join("deploy/render"))
        .arg("--helm")
        .output()
        .expect("deploy/render --helm");
    assert!(
        out.status.success(),
        "deploy/render --helm: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let helm = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut cmd = Command::new(&helm);
    cmd.current_dir(&root).args([
        "template",
        "gpusched",
        "deploy/helm/gpusched",
        "--namespace",
        CHART_NAMESPACE,
    ]);
    for v in values {
        cmd.args(["--set", v]);
    }
    let out = cmd.output().unwrap_or_else(|e| panic!("{helm}: {e}"));
    assert!(
        out.status.success(),
        "helm template --set {values:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    yaml_stream(&String::from_utf8_lossy(&out.stdout))
}

/// A kubeconfig with a token of the chart's ServiceAccount `sa`, bound to
/// `pod` (so it carries the pod's node, as a DaemonSet pod's token does).
pub async fn write_token_kubeconfig(c: &Cluster, sa: &str, pod: &Pod, path: &Path) {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), CHART_NAMESPACE);
    let tr: TokenRequest = serde_json::from_value(json!({"spec": {
        "audiences": null, "expirationSeconds": 4 * 3600,
        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
            "name": pod.metadata.name, "uid": pod.metadata.uid}}}))
    .unwrap();
    let token = api
        .create_token_request(sa, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token");
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig()).unwrap();
    let cluster = kc.clusters[0].cluster.clone().unwrap();
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: e2e\n  cluster:\n    server: {}\n    certificate-authority-data: {}\nusers:\n- name: {sa}\n  user:\n    token: {token}\ncontexts:\n- name: e2e\n  context: {{cluster: e2e, user: {sa}}}\ncurrent-context: e2e\n",
        cluster.server.unwrap(),
        cluster.certificate_authority_data.unwrap(),
    );
    std::fs::write(path, text).unwrap();
}

/// The arguments the chart's scheduler Deployment runs with.
pub fn chart_scheduler_args() -> Vec<String> {
    let docs = chart_docs();
    let d = docs
        .iter()
        .find(|d| d["kind"] == "Deployment" && d["metadata"]["name"] == "gpusched-scheduler")
        .expect("deploy/gpusched.yaml has the scheduler Deployment");
    d["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect()
}

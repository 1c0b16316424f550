//! The deploy manifests apply to the API server as they are.

use super::*;

/// Documents of a multi-document YAML file, as JSON values.
fn documents(text: &str) -> Vec<serde_json::Value> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut flush = |cur: &mut String| {
        let has_content = cur
            .lines()
            .any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
        if has_content {
            let v: serde_json::Value =
                serde_saphyr::from_str(cur).unwrap_or_else(|e| panic!("{e}\n{cur}"));
            out.push(v);
        }
        cur.clear();
    };
    for line in text.lines() {
        if line.trim_end() == "---" {
            flush(&mut cur);
        } else {
            cur.push_str(line);
            cur.push('\n');
        }
    }
    flush(&mut cur);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn deploy_manifests_apply_to_the_apiserver() {
    use kube::api::{DynamicObject, Patch, PatchParams};
    use kube::discovery::{Discovery, Scope};
    let c = Cluster::up().await;
    let root = k8s::repo_root();
    let mut docs = documents(
        &std::fs::read_to_string(root.join("deploy/helm/gpusched/crds/crds.yaml")).unwrap(),
    );
    let rendered = documents(&std::fs::read_to_string(root.join("deploy/gpusched.yaml")).unwrap());
    assert!(rendered.len() >= 15, "{} documents", rendered.len());
    docs.extend(rendered);
    // (the harness already made gpusched-system for the scheduler's
    // ServiceAccount; the manifests are applied over what it made)
    let discovery = Discovery::new(c.client.clone()).run().await.unwrap();
    let pp = PatchParams::apply("gpusched-deploy-test").force();
    let mut kinds = BTreeSet::new();
    for d in &docs {
        let (group, version) = match d["apiVersion"].as_str().unwrap().split_once('/') {
            Some((g, v)) => (g.to_string(), v.to_string()),
            None => (String::new(), d["apiVersion"].as_str().unwrap().to_string()),
        };
        let kind = d["kind"].as_str().unwrap();
        let gvk = kube::api::GroupVersionKind::gvk(&group, &version, kind);
        let (ar, caps) = discovery
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("the apiserver does not serve {gvk:?}"));
        let name = d["metadata"]["name"].as_str().unwrap();
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => Api::namespaced_with(
                c.client.clone(),
                d["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("gpusched-system"),
                &ar,
            ),
            Scope::Cluster => Api::all_with(c.client.clone(), &ar),
        };
        api.patch(name, &pp, &Patch::Apply(d))
            .await
            .unwrap_or_else(|e| panic!("apply {kind} {name}: {e}"));
        kinds.insert(kind.to_string());
    }
    for k in [
        "Deployment",
        "DaemonSet",
        "ClusterRole",
        "ValidatingAdmissionPolicy",
        "CustomResourceDefinition",
    ] {
        assert!(
            kinds.contains(k),
            "{k} missing from the manifests: {kinds:?}"
        );
    }
    // The agent's Node policy, with a token bound to an agent pod on a
    // node (it carries the node name): its own labels and annotations pass
    // (so every expression evaluates; a broken one fails closed), what the
    // kubelet's NodeRestriction forbids does not.
    let node_name = c.nodes_from_yaml(k8s::H100).await.remove(0);
    let agent_pods: Api<k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(c.client.clone(), "gpusched-system");
    let ap = k8s::create(
        &agent_pods,
        json!({"metadata": {"name": "agent-x"}, "spec": {"nodeName": node_name,
               "serviceAccountName": "gpusched-agent",
               "containers": [{"name": "a", "image": "gpusched"}]}}),
    )
    .await;
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(c.client.clone(), "gpusched-system");
    let tr: k8s_openapi::api::authentication::v1::TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": null, "expirationSeconds": 3600, "boundObjectRef":
            {"kind": "Pod", "apiVersion": "v1", "name": "agent-x", "uid": ap.metadata.uid}}}))
    .unwrap();
    let token = sas
        .create_token_request("gpusched-agent", &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .unwrap();
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig()).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let agent_nodes: Api<k8s_openapi::api::core::v1::Node> =
        Api::all(kube::Client::try_from(cfg).unwrap());
    let patch = |v: serde_json::Value| {
        let agent_nodes = agent_nodes.clone();
        let node_name = node_name.clone();
        async move {
            agent_nodes
                .patch(&node_name, &PatchParams::default(), &Patch::Merge(&v))
                .await
                .map(|_| ())
        }
    };
    // (the policy may take a moment to be in force after it is created)
    // (a new value each try: one that got through before the policy was in
    // force would be "unchanged" afterwards)
    let tries = std::sync::atomic::AtomicU32::new(0);
    let denied = wait_for(Duration::from_secs(20), || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        patch(json!({"spec": {"taints": [{"key": "x", "value": n.to_string(), "effect": "NoSchedule"}]}}))
            .await
            .err()
    })
    .await
    .expect("the agent may not cordon its node");
    assert!(
        denied
            .to_string()
            .contains("may not change its Node's spec"),
        "{denied}"
    );
    patch(
        json!({"metadata": {"labels": {"nvidia.com/gpu.family": "hopper"},
                               "annotations": {"gpusched.io/allocations": "{}"}}}),
    )
    .await
    .expect("the agent writes its own labels and annotations");
    agent_nodes
        .patch_status(
            &node_name,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"capacity": {"gpusched.io/gpu-memory-mib": "655360"}}}),
            ),
        )
        .await
        .expect("the agent publishes its gpusched.io/ capacity");
    for (v, msg) in [
        (
            json!({"status": {"capacity": {"nvidia.com/gpu": "99"}}}),
            "only publish gpusched.io/ capacity",
        ),
        (
            json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "x", "message": "x"}]}}),
            "may not change its Node's conditions",
        ),
    ] {
        let e = agent_nodes
            .patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&v))
            .await
            .expect_err("refused");
        assert!(e.to_string().contains(msg), "{v}: {e}");
    }
    for (v, msg) in [
        (
            json!({"metadata": {"labels": {"node-restriction.kubernetes.io/x": "y"}}}),
            "labels under nvidia.com/ and gpusched.io/",
        ),
        (
            json!({"metadata": {"annotations": {"other.io/x": "y"}}}),
            "annotations under gpusched.io/",
        ),
    ] {
        let e = patch(v.clone()).await.expect_err("refused");
        assert!(e.to_string().contains(msg), "{v}: {e}");
    }
    // Least privilege, as the API server's authorizer sees it.
    let sar: Api<k8s_openapi::api::authorization::v1::SubjectAccessReview> =
        Api::all(c.client.clone());
    let can = |who: &str, verb: &str, resource: &str, sub: &str| {
        let sar = sar.clone();
        let body = json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": format!("system:serviceaccount:gpusched-system:{who}"),
                "groups": ["system:serviceaccounts", "system:serviceaccounts:gpusched-system", "system:authenticated"],
                "resourceAttributes": {"verb": verb, "resource": resource, "subresource": sub,
                    "group": if resource == "events" { "events.k8s.io" } else { "" },
                    "namespace": if resource == "nodes" { "" } else { "ml" }}}
        });
        async move {
            let r = sar
                .create(
                    &PostParams::default(),
                    &serde_json::from_value(body).unwrap(),
                )
                .await
                .unwrap();
            r.status.map(|s| s.allowed).unwrap_or(false)
        }
    };
    for (who, verb, res, sub, want) in [
        ("gpusched-agent", "patch", "nodes", "", true),
        ("gpusched-agent", "patch", "nodes", "status", true),
        ("gpusched-agent", "watch", "pods", "", true),
        ("gpusched-agent", "create", "events", "", true),
        ("gpusched-agent", "update", "pods", "", false),
        ("gpusched-agent", "patch", "pods", "", false),
        ("gpusched-agent", "delete", "nodes", "", false),
        ("gpusched-agent", "create", "pods", "binding", false),
        ("gpusched-agent", "get", "secrets", "", false),
        ("gpusched-scheduler", "create", "pods", "binding", true),
        ("gpusched-scheduler", "patch", "pods", "status", true),
        ("gpusched-scheduler", "delete", "pods", "", true),
        ("gpusched-scheduler", "patch", "nodes", "", false),
        ("gpusched-scheduler", "get", "secrets", "", false),
    ] {
        assert_eq!(
            can(who, verb, res, sub).await,
            want,
            "{who} {verb} {res}/{sub}"
        );
    }
    // The decision policy is in force: a pod with a decision made by
    // anyone but the scheduler is refused at admission.
    let pods = c.pods("ml");
    let mut p = pod("sneaky", json!({"nvidia.com/gpu": "1"}));
    p["metadata"]["annotations"] = json!({"gpusched.io/decision": "{}"});
    let refused = wait_for(Duration::from_secs(20), || {
        let pods = pods.clone();
        let p = p.clone();
        async move {
            match pods
                .create(&PostParams::default(), &serde_json::from_value(p).unwrap())
                .await
            {
                Err(kube::Error::Api(s))
                    if s.message
                        .contains("only the gpusched scheduler may set gpusched.io/decision") =>
                {
                    Some(s.message)
                }
                Ok(_) => {
                    let _ = pods
                        .delete(
                            "sneaky",
                            &kube::api::DeleteParams::default().grace_period(0),
                        )
                        .await;
                    None
                }
                Err(_) => None,
            }
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "the admission policy never refused a forged decision"
    );
}

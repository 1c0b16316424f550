//! The scheduler as the chart installs it (its ServiceAccount and flags,
//! see `common::opts`), with what users and tenants can throw at it
//! (issue #22): missing permissions are named in /healthz and /readyz, a
//! tenant's malformed object never stops the others, refused pods are told
//! why.

mod common;

use common::*;
use gpusched_k8s::tools::debug_client::{Target, fetch};
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use serde_json::json;
use std::net::SocketAddr;
use std::time::Duration;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

async fn probe(t: &Target, path: &str) -> (u16, String) {
    match fetch(t, None, path).await {
        Ok(f) => (f.status, f.body),
        Err(e) => (0, e.to_string()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_missing_permission_fails_health_naming_it_and_recovers() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    // take list/watch on PodDisruptionBudgets away from the chart's role
    let roles: Api<ClusterRole> = Api::all(c.client.clone());
    let full = roles.get("gpusched-scheduler").await.unwrap();
    let mut cut = full.clone();
    cut.rules.as_mut().unwrap().retain(|r| {
        !r.resources
            .as_ref()
            .is_some_and(|v| v.iter().any(|x| x == "poddisruptionbudgets"))
    });
    cut.metadata.managed_fields = None;
    roles
        .replace("gpusched-scheduler", &Default::default(), &cut)
        .await
        .unwrap();
    let addr = free_addr();
    let mut o = opts();
    o.http_addr = Some(addr);
    let t = debug_target(&o, addr, None);
    let s = c.scheduler(o).await;
    let pods = c.pods("ml");
    create(&pods, gpu_pod("waits", 1)).await;
    let (code, body) = wait_for(Duration::from_secs(30), || async {
        let (code, body) = probe(&t, "/healthz").await;
        (code == 503).then_some((code, body))
    })
    .await
    .expect("/healthz fails while a watch is forbidden");
    assert_eq!(code, 503);
    assert!(body.contains("poddisruptionbudgets"), "{body}");
    assert!(body.contains("missing permissions"), "{body}");
    let (code, body) = probe(&t, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("poddisruptionbudgets"), "{body}");
    assert!(bound(&pods).await.is_empty(), "nothing is placed blind");
    // grant it back: the watch recovers, health turns good, the pod binds
    let mut back = full;
    back.metadata.managed_fields = None;
    back.metadata.resource_version = None;
    roles
        .replace("gpusched-scheduler", &Default::default(), &back)
        .await
        .unwrap();
    wait_for(Duration::from_secs(60), || async {
        (bound(&pods).await.len() == 1).then_some(())
    })
    .await
    .expect("bound once the permission is back");
    let (code, body) = probe(&t, "/healthz").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = probe(&t, "/readyz").await;
    assert_eq!(code, 200, "{body}");
    // the chart's delegated auth is served over TLS only
    let plain = Target::Endpoint {
        url: format!("http://{addr}"),
        token: None,
        ca: None,
        insecure: false,
    };
    let answered = probe(&plain, "/readyz").await;
    assert_ne!(answered.0, 200, "plain HTTP answered: {}", answered.1);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_tenants_bad_objects_stop_nobody() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    // the schemas bound what the client decodes: the apiserver refuses
    // what would overflow or not parse
    let raw: Api<kube::api::DynamicObject> = Api::all_with(
        c.client.clone(),
        &kube::api::ApiResource::erase::<gpusched_k8s::crd::Queue>(&()),
    );
    for (i, spec) in [
        json!({"weight": 4_294_967_296u64}),
        json!({"guaranteed": {"nvidia.com/gpu": "lots"}}),
        json!({"limit": {"cpu": "-4"}}),
    ]
    .into_iter()
    .enumerate()
    {
        let obj: kube::api::DynamicObject = serde_json::from_value(json!({
            "apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": format!("bad{i}")}, "spec": spec}))
        .unwrap();
        let e = raw.create(&Default::default(), &obj).await;
        assert!(e.is_err(), "the apiserver accepted Queue spec {spec}");
    }
    // a Queue stored under an older CRD without the bound (as after an
    // upgrade): it reaches the scheduler, which must mark it invalid and go
    // on with every other queue and group
    let crds: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(c.client.clone());
    crds.patch(
        "queues.gpusched.io",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::<()>::Json(
            serde_json::from_value(json!([{"op": "remove",
                "path": "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/weight/maximum"}]))
            .unwrap(),
        ),
    )
    .await
    .unwrap();
    let huge: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
        "metadata": {"name": "huge"}, "spec": {"weight": 4_294_967_296u64}}))
    .unwrap();
    wait_for(Duration::from_secs(20), || async {
        raw.create(&Default::default(), &huge).await.ok()
    })
    .await
    .expect("the older schema accepts it");
    c.queue("team", json!({"weight": 2})).await;
    c.group("ml", "gang", json!({"minMember": 2})).await;
    let s = c.scheduler(opts()).await;
    let pods = c.pods("ml");
    for i in 0..2 {
        let mut p = gpu_pod(&format!("m{i}"), 2);
        p["metadata"]["labels"] = json!({"gpusched.io/pod-group": "gang"});
        create(&pods, p).await;
    }
    let mut plain = gpu_pod("plain", 1);
    plain["metadata"]["labels"] = json!({"gpusched.io/queue": "team"});
    create(&pods, plain).await;
    let mut stuck = gpu_pod("in-huge", 1);
    stuck["metadata"]["labels"] = json!({"gpusched.io/queue": "huge"});
    create(&pods, stuck).await;
    // a pod asking only GPU memory, and one with a value gpusched refuses
    // though the apiserver takes it (a consolidation opt-in that is neither
    // "true" nor "false")
    let mut mem = gpu_pod("mem-only", 1);
    mem["spec"]["containers"][0]["resources"]["limits"] =
        json!({"gpusched.io/gpu-memory-mib": "1024"});
    create(&pods, mem).await;
    let mut maybe = gpu_pod("maybe", 1);
    maybe["metadata"]["annotations"] = json!({"gpusched.io/movable": "maybe"});
    create(&pods, maybe).await;
    let b = wait_for(Duration::from_secs(60), || async {
        let b = bound(&pods).await;
        (b.len() == 3).then_some(b)
    })
    .await
    .expect("the gang and the plain pod bound");
    assert!(b.contains_key("m0") && b.contains_key("m1") && b.contains_key("plain"));
    let ev = wait_event(&c, "ml", "in-huge", "FailedScheduling: ", 30)
        .await
        .expect("in-huge told why");
    assert!(
        ev.iter()
            .any(|e| e.contains("queue \"huge\" is invalid") && e.contains("spec.weight")),
        "{ev:?}"
    );
    let ev = wait_event(&c, "ml", "mem-only", "FailedScheduling: ", 30)
        .await
        .expect("mem-only told why");
    assert!(
        ev.iter()
            .any(|e| e.contains("gpusched.io/gpu-memory-mib needs gpusched.io/gpu-milli")),
        "{ev:?}"
    );
    let ev = wait_event(&c, "ml", "maybe", "FailedScheduling: ", 30)
        .await
        .expect("maybe told why");
    assert!(
        ev.iter()
            .any(|e| e.contains("metadata.annotations[gpusched.io/movable]")),
        "{ev:?}"
    );
    let p = pods.get("maybe").await.unwrap();
    let cond = p
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "PodScheduled")
        .expect("PodScheduled condition");
    assert_eq!(cond.status, "False");
    assert!(
        cond.message
            .unwrap_or_default()
            .contains("gpusched.io/movable")
    );
    assert_eq!(bound(&pods).await.len(), 3);
    // with the chart's admission policy, nobody but the scheduler changes a
    // decision, through the pod or its status subresource
    c.install_chart_docs(&[
        ("ValidatingAdmissionPolicy", "gpusched-decision-annotation"),
        (
            "ValidatingAdmissionPolicyBinding",
            "gpusched-decision-annotation",
        ),
    ])
    .await;
    // (a new value each try: one that got through before the policy was in
    // force would otherwise be "unchanged" afterwards)
    let tries = std::sync::atomic::AtomicU32::new(0);
    let refused = wait_for(Duration::from_secs(20), || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let forged = json!({"metadata": {"annotations": {"gpusched.io/decision": format!("{{\"try\":{n}}}")}}});
        let r = pods
            .patch_status(
                "plain",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&forged),
            )
            .await;
        match r {
            Err(kube::Error::Api(s))
                if s.message
                    .contains("only the gpusched scheduler may set gpusched.io/decision") =>
            {
                Some(())
            }
            _ => None,
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "a pods/status patch changed the decision"
    );
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_decision_too_large_for_the_agent_is_refused_naming_the_cap() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(
        "nodes:
  - name: wide
    count: 1
    cpu: \"512\"
    memory: 4Ti
    gpus: {count: 1000, model: H100-SXM5-80GB, memory: 80Gi}
",
    )
    .await;
    let s = c.scheduler(opts()).await;
    let pods = c.pods("ml");
    create(&pods, gpu_pod("all", 1000)).await;
    create(&pods, gpu_pod("one", 1)).await;
    let ev = wait_event(&c, "ml", "all", "FailedScheduling: ", 60)
        .await
        .expect("told why");
    assert!(
        ev.iter()
            .any(|e| e
                .contains("1000 GPUs in one pod is more than the 256 gpusched places in one pod")),
        "{ev:?}"
    );
    wait_for(Duration::from_secs(30), || async {
        bound(&pods).await.contains_key("one").then_some(())
    })
    .await
    .expect("the others are placed");
    assert!(!bound(&pods).await.contains_key("all"));
    s.stop().await;
}

/// Issue 38, item 5: with the chart's admission policy, a pod asking GPUs
/// may not be created with `spec.nodeName` (bypassing the scheduler)
/// unless its namespace opts in; pods without GPUs, and GPU pods left to
/// the scheduler, are not affected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_gpu_pod_created_with_a_node_name_is_refused_unless_its_namespace_opts_in() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(c.client.clone());
    let node = nodes.list(&Default::default()).await.unwrap().items[0]
        .metadata
        .name
        .clone()
        .unwrap();
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(c.client.clone());
    create_obj(
        &namespaces,
        json!({"metadata": {"name": "opted-in", "labels": {"gpusched.io/allow-node-name": "true"}}}),
    )
    .await;
    c.install_chart_docs(&[
        ("ValidatingAdmissionPolicy", "gpusched-gpu-pods-scheduled"),
        (
            "ValidatingAdmissionPolicyBinding",
            "gpusched-gpu-pods-scheduled",
        ),
    ])
    .await;
    let bypassing = |name: &str| {
        let mut p = gpu_pod(name, 1);
        p["spec"]["nodeName"] = json!(node);
        p
    };
    let pods = c.pods("ml");
    // the policy takes effect once the apiserver has loaded it
    let tries = std::sync::atomic::AtomicU32::new(0);
    let refused = wait_for(Duration::from_secs(20), || async {
        let n = tries.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let r = pods
            .create(
                &Default::default(),
                &serde_json::from_value(bypassing(&format!("bypass-{n}"))).unwrap(),
            )
            .await;
        match r {
            Err(kube::Error::Api(s))
                if s.message.contains("may not be created with spec.nodeName") =>
            {
                Some(s.message)
            }
            _ => None,
        }
    })
    .await;
    assert!(
        refused.is_some(),
        "a GPU pod was created with spec.nodeName"
    );
    // GPUs asked by an init container, too
    let mut init = bypassing("init-gpu");
    init["spec"]["initContainers"] = init["spec"]["containers"].clone();
    init["spec"]["containers"][0]["resources"] = json!({});
    assert!(
        pods.create(&Default::default(), &serde_json::from_value(init).unwrap())
            .await
            .is_err()
    );
    // a pod without GPUs, and a GPU pod the scheduler places, are created
    let mut cpu = bypassing("cpu-only");
    cpu["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    create(&pods, cpu).await;
    create(&pods, gpu_pod("scheduled", 1)).await;
    // a namespace that opted in may
    create(&c.pods("opted-in"), bypassing("allowed")).await;
}

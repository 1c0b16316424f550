//! End-to-end: `gpusched explain`'s debug endpoint on a real apiserver,
//! with delegated authentication (TokenReview + SubjectAccessReview) on.
//! Run by `e2e/run`.

mod common;

use common::*;
use gpusched_k8s::debug::HttpAuth;
use gpusched_k8s::tools::debug_client::{Fetched, Target, fetch};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::Api;
use kube::api::PostParams;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::ops::Not;
use std::time::Duration;

fn free_addr() -> SocketAddr {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// The chart's `gpusched-debug-reader` ClusterRole (get on gpusched's own
/// non-resource URLs, `/gpusched/*`), bound to the ServiceAccount `ml/sa`.
async fn grant_debug_reader(c: &Cluster, sa: &str) {
    let roles: Api<ClusterRole> = Api::all(c.client.clone());
    if roles
        .get_opt("gpusched-debug-reader")
        .await
        .unwrap()
        .is_none()
    {
        c.install_chart_docs(&[("ClusterRole", "gpusched-debug-reader")])
            .await;
    }
    let bindings: Api<ClusterRoleBinding> = Api::all(c.client.clone());
    create_obj(
        &bindings,
        json!({"metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpusched-debug-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "ml"}]}),
    )
    .await;
}

/// A ServiceAccount in `ml` and a token for it.
async fn sa_token(c: &Cluster, name: &str) -> String {
    let api: Api<ServiceAccount> = Api::namespaced(c.client.clone(), "ml");
    create_obj(&api, json!({"metadata": {"name": name}})).await;
    let tr = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: None,
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.create_token_request(name, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .expect("a token")
}

/// GET over HTTPS (the scheduler's self-signed certificate: delegated
/// auth always serves TLS, as the chart runs it).
async fn get(addr: SocketAddr, token: Option<&str>, path: &str) -> Fetched {
    let target = Target::Endpoint {
        url: format!("https://{addr}"),
        token: token.map(str::to_string),
        ca: None,
        insecure: true,
    };
    fetch(&target, None, path).await.unwrap()
}

/// A GET with one extra header (e.g. the header the CLI forwards its token
/// in through the apiserver's proxy) and no Authorization. Returns the status.
async fn raw_status(addr: SocketAddr, path: &str, header: Option<(&str, String)>) -> u16 {
    let mut config = kube::Config::new(format!("https://{addr}").parse().unwrap());
    config.accept_invalid_certs = true;
    config.default_retry = false;
    let client = kube::Client::try_from(config).unwrap();
    let mut req = http::Request::get(path);
    if let Some((k, v)) = header {
        req = req.header(k, v);
    }
    let res = client
        .send(req.body(kube::client::Body::empty()).unwrap())
        .await
        .unwrap();
    res.status().as_u16()
}

/// Polls the pod's report until `ok` holds; returns it.
async fn report_until(
    addr: SocketAddr,
    token: &str,
    path: &str,
    ok: impl Fn(&Value) -> bool,
) -> Value {
    let last = std::sync::Mutex::new(String::new());
    let v = wait_for(Duration::from_secs(30), || {
        let path = path.to_string();
        let last = &last;
        let ok = &ok;
        async move {
            let f = get(addr, Some(token), &path).await;
            *last.lock().unwrap() = format!("{} {}", f.status, f.body);
            if f.status != 200 {
                return None;
            }
            let v: Value = serde_json::from_str(&f.body).ok()?;
            ok(&v).then_some(v)
        }
    })
    .await;
    let last = last.lock().unwrap().clone();
    v.unwrap_or_else(|| panic!("{path}: last answer {last}"))
}

fn reasons(v: &Value) -> Vec<Value> {
    v["status"]["Pending"]["reasons"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn explain_through_the_debug_endpoint_with_delegated_auth() {
    let t0 = std::time::Instant::now();
    let step = |what: &str| eprintln!("[{:>6.1}s] {what}", t0.elapsed().as_secs_f64());
    let c = Cluster::up().await;
    step("cluster up");
    c.nodes_from_yaml(H100).await;
    // readers: a ClusterRole granting get on the debug URLs, bound to one
    // ServiceAccount; another has no such binding
    grant_debug_reader(&c, "reader").await;
    step("rbac");
    let reader = sa_token(&c, "reader").await;
    let nobody = sa_token(&c, "nobody").await;

    c.queue("capped", json!({"limit": {"nvidia.com/gpu": "2"}}))
        .await;
    c.group("ml", "trio", json!({"minMember": 3})).await;
    let pods = c.pods("ml");
    create(&pods, gpu_pod("plain", 2)).await;
    let mut first = gpu_pod("capped-1", 2);
    first["metadata"]["labels"] = json!({"gpusched.io/queue": "capped"});
    create(&pods, first).await;
    let mut held = gpu_pod("held", 1);
    held["spec"]["schedulingGates"] = json!([{"name": "example.com/hold"}]);
    create(&pods, held).await;
    let mut member = gpu_pod("trio-0", 1);
    member["metadata"]["labels"] = json!({"gpusched.io/pod-group": "trio"});
    create(&pods, member).await;

    step("objects");
    let addr = free_addr();
    let mut o = opts();
    o.http_addr = Some(addr);
    o.http_auth = HttpAuth::Delegated;
    o.identity = "sched-a".into();
    let s = c.scheduler(o).await;
    wait_for(Duration::from_secs(30), || async {
        let b = bound(&pods).await;
        (b.contains_key("plain") && b.contains_key("capped-1")).then_some(())
    })
    .await
    .expect("plain and capped-1 bound");
    step("bound");
    // the second pod of the capped queue waits on its limit
    let mut second = gpu_pod("capped-2", 1);
    second["metadata"]["labels"] = json!({"gpusched.io/queue": "capped"});
    create(&pods, second).await;

    // authentication and authorization
    assert_eq!(raw_status(addr, "/healthz", None).await, 200, "open");
    assert_eq!(raw_status(addr, "/readyz", None).await, 200, "open");
    // tokens never travel in clear: plain HTTP gets no answer
    let plain = Target::Endpoint {
        url: format!("http://{addr}"),
        token: Some(reader.clone()),
        ca: None,
        insecure: false,
    };
    assert!(
        fetch(&plain, None, "/healthz")
            .await
            .is_ok_and(|f| f.status == 200)
            .not(),
        "plain HTTP is answered"
    );
    assert_eq!(
        get(addr, None, "/gpusched/debug/pods/ml/plain")
            .await
            .status,
        401
    );
    assert_eq!(get(addr, None, "/metrics").await.status, 401);
    assert_eq!(
        get(addr, Some("not-a-token"), "/gpusched/debug/pods/ml/plain")
            .await
            .status,
        401
    );
    let denied = get(addr, Some(&nobody), "/gpusched/debug/pods/ml/plain").await;
    assert_eq!(denied.status, 403, "{}", denied.body);
    assert!(
        denied.body.contains("system:serviceaccount:ml:nobody"),
        "{}",
        denied.body
    );
    assert_eq!(get(addr, Some(&nobody), "/metrics").await.status, 403);
    // issue 38, item 7: the reader role opens gpusched's prefix only (a
    // grant of /metrics would open the API server's too)
    assert_eq!(get(addr, Some(&reader), "/metrics").await.status, 403);
    assert_eq!(
        get(addr, Some(&reader), "/debug/pods/ml/plain")
            .await
            .status,
        403
    );
    let m = get(addr, Some(&reader), "/gpusched/metrics").await;
    assert_eq!(m.status, 200);
    assert!(m.body.contains("gpusched_leader"), "{}", m.body);
    // the header the CLI forwards its token in through the service proxy
    assert_eq!(
        raw_status(
            addr,
            "/gpusched/debug/queues/capped",
            Some(("x-gpusched-authorization", format!("Bearer {reader}")))
        )
        .await,
        200
    );
    assert_eq!(
        raw_status(
            addr,
            "/gpusched/debug/queues/capped",
            Some(("x-gpusched-authorization", format!("Bearer {nobody}")))
        )
        .await,
        403
    );

    step("auth checked");
    // a bound pod: node, GPU ids
    let v = report_until(addr, &reader, "/gpusched/debug/pods/ml/plain", |v| {
        v["status"].get("Bound").is_some()
    })
    .await;
    let p = &v["status"]["Bound"]["placement"];
    let b = bound(&pods).await;
    let d = decision(&b["plain"]);
    assert_eq!(p["node"], json!(d.node));
    let ids: Vec<u32> = p["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["index"].as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, d.indices, "the GPUs of its decision");
    assert!(p["topology"]["cost"].as_u64().is_some(), "{p}");

    // pending on quota: the queue and the dimension
    let v = report_until(addr, &reader, "/gpusched/debug/pods/ml/capped-2", |v| {
        reasons(v).iter().any(|r| r.get("Quota").is_some())
    })
    .await;
    let q = reasons(&v)
        .into_iter()
        .find_map(|r| r.get("Quota").cloned())
        .unwrap();
    assert_eq!(q["queue"], "capped");
    assert_eq!(q["dimension"], "Gpu");
    assert_eq!(
        (q["wouldUse"].as_u64(), q["cap"].as_u64()),
        (Some(3000), Some(2000))
    );
    assert_eq!(v["queues"][0]["name"], "capped");
    assert_eq!(v["queues"][0]["usage"]["gpuMilli"], 2000);

    // a gang missing members
    let v = report_until(addr, &reader, "/gpusched/debug/pods/ml/trio-0", |v| {
        v["gang"].is_object()
    })
    .await;
    assert_eq!(v["gang"]["minMember"], 3);
    assert_eq!(v["gang"]["pending"], 1);
    assert!(
        reasons(&v)
            .contains(&json!({"GangIncomplete": {"group": "ml/trio", "have": 1, "need": 3}})),
        "{v}"
    );
    assert!(
        v["hints"]
            .as_array()
            .unwrap()
            .contains(&json!({"MoreMembers": {"group": "ml/trio", "missing": 2}})),
        "{v}"
    );

    step("gang");
    // a gated pod
    let v = report_until(addr, &reader, "/gpusched/debug/pods/ml/held", |_| true).await;
    assert_eq!(
        v["status"],
        json!({"Gated": {"gates": ["example.com/hold"]}}),
        "{v}"
    );

    // the queue: usage, limit, pending by reason
    let v = report_until(addr, &reader, "/gpusched/debug/queues/capped", |v| {
        v["pendingByReason"]["QueueQuota"] == 1
    })
    .await;
    assert_eq!(v["queue"]["limit"]["gpuMilli"], 2000);
    assert_eq!(v["runningPods"], 1);
    let v = report_until(addr, &reader, "/gpusched/debug/queues/default", |v| {
        v["pendingByReason"]["SchedulingGated"] == 1
    })
    .await;
    assert_eq!(v["pendingByReason"]["GangIncomplete"], 1, "{v}");

    step("queues");
    // unknown names
    assert_eq!(
        get(addr, Some(&reader), "/gpusched/debug/pods/ml/nope")
            .await
            .status,
        404
    );
    assert_eq!(
        get(addr, Some(&reader), "/gpusched/debug/queues/nope")
            .await
            .status,
        404
    );

    // a standby answers 503 naming the leader
    let addr_b = free_addr();
    let mut o = opts();
    o.http_addr = Some(addr_b);
    o.http_auth = HttpAuth::Delegated;
    o.identity = "sched-b".into();
    let standby = c.scheduler(o).await;
    step("standby started");
    let f = wait_for(Duration::from_secs(30), || async {
        let f = get(addr_b, Some(&reader), "/gpusched/debug/pods/ml/plain").await;
        (f.status == 503).then_some(f)
    })
    .await
    .expect("the standby answers 503");
    let v: Value = serde_json::from_str(&f.body).unwrap();
    assert_eq!(v["leader"], "sched-a", "{v}");
    step("standby answered");
    standby.stop().await;
    s.stop().await;
    step("stopped");
}

/// This host's address that the apiserver may proxy to (it refuses
/// loopback); `None` without one.
fn host_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    // no packet is sent: connecting a UDP socket only picks the route
    s.connect("198.51.100.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn explain_through_the_apiserver_service_proxy() {
    let Some(ip) = host_ip() else {
        eprintln!("skipped: no non-loopback address for the apiserver to proxy to");
        return;
    };
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    grant_debug_reader(&c, "reader").await;
    // the proxy itself: get on services/proxy (the chart's gpusched-debug-proxy)
    let ns_roles: Api<k8s_openapi::api::rbac::v1::Role> = Api::namespaced(c.client.clone(), "ml");
    create_obj(
        &ns_roles,
        json!({"metadata": {"name": "proxy"},
            "rules": [{"apiGroups": [""], "resources": ["services/proxy", "pods/proxy"], "verbs": ["get"]}]}),
    )
    .await;
    let ns_bindings: Api<k8s_openapi::api::rbac::v1::RoleBinding> =
        Api::namespaced(c.client.clone(), "ml");
    create_obj(
        &ns_bindings,
        json!({"metadata": {"name": "proxy"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "proxy"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": "ml"}]}),
    )
    .await;
    let reader = sa_token(&c, "reader").await;
    let pods = c.pods("ml");
    create(&pods, gpu_pod("plain", 2)).await;
    let port = free_addr().port();
    let mut o = opts();
    o.http_addr = Some(SocketAddr::new(ip, port));
    o.http_auth = HttpAuth::Delegated;
    let s = c.scheduler(o).await;
    // a Service without selector whose endpoint is this process
    let svcs: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(c.client.clone(), "ml");
    create_obj(
        &svcs,
        json!({"metadata": {"name": "gpusched-scheduler-metrics"},
            "spec": {"ports": [{"name": "https", "port": 10259, "targetPort": port}]}}),
    )
    .await;
    // the apiserver proxies to a ready endpoint of the Service (Endpoints
    // before 1.33, EndpointSlices since) that is a pod: a pod of another
    // scheduler, on a node no one runs, whose IP is this host's
    let mut target_pod = gpu_pod("scheduler-0", 0);
    target_pod["spec"]["schedulerName"] = json!("default-scheduler");
    target_pod["spec"]["nodeName"] = json!("nowhere");
    target_pod["spec"]["containers"][0]["resources"] = json!({});
    create(&pods, target_pod).await;
    pods.patch_status(
        "scheduler-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
        ),
    )
    .await
    .unwrap();
    let eps: Api<k8s_openapi::api::core::v1::Endpoints> = Api::namespaced(c.client.clone(), "ml");
    create_obj(
        &eps,
        json!({"metadata": {"name": "gpusched-scheduler-metrics"},
            "subsets": [{"addresses": [{"ip": ip.to_string(), "targetRef": {"kind": "Pod", "namespace": "ml", "name": "scheduler-0"}}],
                "ports": [{"name": "https", "port": port}]}]}),
    )
    .await;
    let slices: Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        Api::namespaced(c.client.clone(), "ml");
    create_obj(
        &slices,
        json!({"metadata": {"name": "gpusched-scheduler-metrics-1",
                "labels": {"kubernetes.io/service-name": "gpusched-scheduler-metrics"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true, "serving": true},
                "nodeName": "nowhere", "targetRef": {"kind": "Pod", "namespace": "ml", "name": "scheduler-0"}}],
            "ports": [{"name": "https", "port": port}]}),
    )
    .await;
    wait_for(Duration::from_secs(30), || async {
        bound(&pods).await.contains_key("plain").then_some(())
    })
    .await
    .expect("plain bound");

    // a client that is the reader, as `gpusched explain` with its kubeconfig
    let kc = kube::config::Kubeconfig::read_from(c.kubeconfig()).unwrap();
    let mut config =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(reader.clone().into()),
        ..Default::default()
    };
    config.default_retry = false;
    let as_reader = kube::Client::try_from(config).unwrap();
    let target = |token: Option<&str>| Target::Proxy {
        namespace: "ml".into(),
        service: "gpusched-scheduler-metrics".into(),
        port: "https".into(),
        pod_port: port,
        token: token.map(str::to_string),
        https: true,
    };
    // the apiserver authenticates the reader and drops its Authorization
    // header: without the forwarded one the scheduler sees no token
    let f = wait_for(Duration::from_secs(30), || async {
        let f = fetch(
            &target(None),
            Some(&as_reader),
            "/gpusched/debug/pods/ml/plain",
        )
        .await
        .ok()?;
        (f.status != 503 && f.status != 502).then_some(f)
    })
    .await
    .expect("the proxy reaches the scheduler");
    assert_eq!(f.status, 401, "{}", f.body);
    let with_token = target(Some(&reader));
    let v = report_until_with(
        || {
            fetch(
                &with_token,
                Some(&as_reader),
                "/gpusched/debug/pods/ml/plain",
            )
        },
        |v| v["status"].get("Bound").is_some(),
    )
    .await;
    assert_eq!(v["pod"], "ml/plain");
    s.stop().await;
}

async fn report_until_with<F, Fut>(f: F, ok: impl Fn(&Value) -> bool) -> Value
where
    F: Fn() -> Fut,
    Fut: Future<Output = anyhow::Result<Fetched>>,
{
    let last = std::sync::Mutex::new(String::new());
    let v = wait_for(Duration::from_secs(30), || {
        let (last, ok, f) = (&last, &ok, &f);
        async move {
            let r = f().await;
            *last.lock().unwrap() = format!("{r:?}");
            let r = r.ok()?;
            if r.status != 200 {
                return None;
            }
            let v: Value = serde_json::from_str(&r.body).ok()?;
            ok(&v).then_some(v)
        }
    })
    .await;
    let last = last.lock().unwrap().clone();
    v.unwrap_or_else(|| panic!("last answer {last}"))
}

//! End-to-end: `kubectl gpusched` (the binary run as `kubectl-gpusched`)
//! on a real apiserver with a client-certificate admin kubeconfig (the
//! kind/kubeadm default): kubectl's `--kubeconfig`, `--context` and the
//! context's namespace, `-o json|yaml|wide`, the token the CLI gets from the
//! chart's reader ServiceAccount, `pending --queue` in queue order, and the
//! hint when the scheduler's Service has no endpoints. Run by `e2e/run`.

#[path = "../../k8s/tests/common/mod.rs"]
mod common;

use common::*;
use gpusched_k8s::debug::HttpAuth;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// This host's address that the apiserver may proxy to (it refuses
/// loopback); `None` without one.
fn host_ip() -> Option<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("198.51.100.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// The binary linked as `kubectl-gpusched` in `dir`.
fn plugin(dir: &Path) -> PathBuf {
    let p = dir.join("kubectl-gpusched");
    if !p.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpusched"), &p).unwrap();
    }
    p
}

/// Runs the plugin; (success, stdout, stderr).
async fn run(bin: &Path, args: &[&str]) -> (bool, String, String) {
    let bin = bin.to_path_buf();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(&bin)
            .args(&args)
            .env_remove("KUBECONFIG")
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

/// Retries `args` until it succeeds and `ok` holds of its stdout.
async fn until(bin: &Path, args: &[&str], ok: impl Fn(&str) -> bool) -> String {
    let mut last = String::new();
    for _ in 0..60 {
        let (good, out, err) = run(bin, args).await;
        if good && ok(&out) {
            return out;
        }
        last = format!("ok={good}\nstdout:\n{out}\nstderr:\n{err}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    panic!("{args:?} never answered as expected; last:\n{last}")
}

/// A kubeconfig whose current context points nowhere and whose context
/// `e2e` is the cluster's client-certificate admin with namespace `ml`.
fn two_context_kubeconfig(c: &Cluster) -> PathBuf {
    let src = std::fs::read_to_string(c.kubeconfig()).unwrap();
    let mut v: Value = serde_saphyr::from_str(&src).unwrap();
    assert!(
        v["users"][0]["user"]["client-certificate-data"].is_string(),
        "the e2e kubeconfig is a client-certificate one: {v}"
    );
    let mut nowhere = v["clusters"][0].clone();
    nowhere["name"] = json!("nowhere");
    nowhere["cluster"]["server"] = json!("https://127.0.0.1:1");
    v["clusters"].as_array_mut().unwrap().push(nowhere);
    v["contexts"] = json!([
        {"name": "nowhere", "context": {"cluster": "nowhere", "user": v["users"][0]["name"]}},
        {"name": "e2e", "context": {"cluster": v["clusters"][0]["name"], "user": v["users"][0]["name"], "namespace": "ml"}},
    ]);
    v["current-context"] = json!("nowhere");
    let p = c.dir.path().join("two-contexts.kubeconfig");
    std::fs::write(&p, serde_json::to_string(&v).unwrap()).unwrap();
    p
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn kubectl_plugin_with_a_client_certificate_kubeconfig() {
    let Some(ip) = host_ip() else {
        eprintln!("skipped: no non-loopback address for the apiserver to proxy to");
        return;
    };
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    // the chart's reader identity: its ServiceAccount and ClusterRole, bound
    c.install_chart_docs(&[
        ("ServiceAccount", "gpusched-debug-reader"),
        ("ClusterRole", "gpusched-debug-reader"),
        ("ClusterRoleBinding", "gpusched-debug-reader"),
    ])
    .await;
    let kc = two_context_kubeconfig(&c);
    let kc = kc.to_str().unwrap();
    let bin = plugin(c.dir.path());
    let bin = bin.as_path();

    // the chart's Service, without endpoints yet
    let svcs: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(c.client.clone(), CHART_NAMESPACE);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    create_obj(
        &svcs,
        json!({"metadata": {"name": "gpusched-scheduler-metrics"},
            "spec": {"ports": [{"name": "https", "port": 10259, "targetPort": port}]}}),
    )
    .await;
    let (ok, _, err) = run(
        bin,
        &[
            "--kubeconfig",
            kc,
            "--context",
            "e2e",
            "explain",
            "pod",
            "x",
        ],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("gpusched-system/gpusched-scheduler-metrics has no ready endpoints"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    // the current context points nowhere: --context is what reached the cluster
    let (ok, _, err) = run(bin, &["--kubeconfig", kc, "explain", "pod", "x"]).await;
    assert!(!ok && !err.contains("no ready endpoints"), "{err}");

    // workloads: a bound pod; a queue capped at 2 GPUs with one pod
    // running and two waiting, the later one of higher priority
    c.queue("capped", json!({"limit": {"nvidia.com/gpu": "2"}}))
        .await;
    let classes: kube::Api<k8s_openapi::api::scheduling::v1::PriorityClass> =
        kube::Api::all(c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "high"}, "value": 1000}),
    )
    .await;
    let pods = c.pods("ml");
    create(&pods, gpu_pod("plain", 2)).await;
    let capped = |name: &str| {
        let mut p = gpu_pod(name, 1);
        p["metadata"]["labels"] = json!({"gpusched.io/queue": "capped"});
        p
    };
    let mut first = capped("capped-1");
    first["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!("2");
    create(&pods, first).await;

    let mut o = opts();
    o.http_addr = Some(SocketAddr::new(ip, port));
    o.http_auth = HttpAuth::Delegated;
    let s = c.scheduler(o).await;
    wait_for(Duration::from_secs(30), || async {
        let b = bound(&pods).await;
        (b.contains_key("plain") && b.contains_key("capped-1")).then_some(())
    })
    .await
    .expect("plain and capped-1 bound");
    create(&pods, capped("capped-2")).await;
    let mut high = capped("capped-3");
    high["spec"]["priorityClassName"] = json!("high");
    create(&pods, high).await;

    // the Service's endpoint: a pod of another scheduler whose IP is this host
    let sys = c.pods(CHART_NAMESPACE);
    let mut target_pod = gpu_pod("gpusched-scheduler-0", 0);
    target_pod["spec"]["schedulerName"] = json!("default-scheduler");
    target_pod["spec"]["nodeName"] = json!("nowhere");
    target_pod["spec"]["containers"][0]["resources"] = json!({});
    create(&sys, target_pod).await;
    sys.patch_status(
        "gpusched-scheduler-0",
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"status": {"podIP": ip.to_string(), "podIPs": [{"ip": ip.to_string()}]}}),
        ),
    )
    .await
    .unwrap();
    let slices: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
        kube::Api::namespaced(c.client.clone(), CHART_NAMESPACE);
    create_obj(
        &slices,
        json!({"metadata": {"name": "gpusched-scheduler-metrics-1",
                "labels": {"kubernetes.io/service-name": "gpusched-scheduler-metrics"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [ip.to_string()], "conditions": {"ready": true, "serving": true},
                "nodeName": "nowhere", "targetRef": {"kind": "Pod", "namespace": CHART_NAMESPACE, "name": "gpusched-scheduler-0"}}],
            "ports": [{"name": "https", "port": port}]}),
    )
    .await;
    let pod_port = port.to_string();
    let base = [
        "--kubeconfig",
        kc,
        "--context",
        "e2e",
        "--pod-port",
        pod_port.as_str(),
    ];
    let with = |rest: &[&'static str]| -> Vec<&str> {
        let mut v: Vec<&str> = rest.to_vec();
        v.extend_from_slice(&base);
        v
    };

    // explain a pod by bare name: the namespace is the context's (ml); the
    // admin has no token, so the CLI asks one of gpusched-debug-reader
    let out = until(
        bin,
        &with(&["explain", "pod", "plain", "-o", "json"]),
        |o| serde_json::from_str::<Value>(o).is_ok_and(|v| v["status"].get("Bound").is_some()),
    )
    .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pod"], "ml/plain");
    // the same in YAML
    let (ok, out, err) = run(bin, &with(&["explain", "pod", "plain", "-o", "yaml"])).await;
    assert!(ok, "{err}");
    let y: Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(y["pod"], "ml/plain", "{out}");

    // pending: the capped queue's waiting pods in its order (priority
    // first), each with its reason
    let out = until(
        bin,
        &with(&["pending", "--queue", "capped", "-o", "json"]),
        |o| {
            serde_json::from_str::<Value>(o).is_ok_and(|v| {
                v["pods"]
                    .as_array()
                    .is_some_and(|p| p.len() == 2 && p.iter().all(|e| e["reason"] == "QueueQuota"))
            })
        },
    )
    .await;
    let v: Value = serde_json::from_str(&out).unwrap();
    let names: Vec<&str> = v["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pod"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ml/capped-3", "ml/capped-2"], "{v}");
    assert_eq!(v["pods"][0]["position"], 1, "{v}");
    assert_eq!(v["pods"][0]["priority"], 1000, "{v}");
    assert_eq!(v["pods"][0]["queue"], "capped");
    assert!(
        v["pods"][0]["message"].as_str().unwrap().contains("capped"),
        "{v}"
    );
    // the table, and its wide form
    let (ok, out, err) = run(bin, &with(&["pending", "--queue", "capped"])).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("QUEUE") && lines[0].contains("REASON"),
        "{out}"
    );
    assert!(
        lines[1].contains("ml/capped-3") && lines[2].contains("ml/capped-2"),
        "{out}"
    );
    let (ok, out, err) = run(bin, &with(&["pending", "-o", "wide"])).await;
    assert!(ok, "{err}");
    assert!(out.lines().next().unwrap().contains("MESSAGE"), "{out}");
    assert!(out.contains("ml/capped-2"), "{out}");
    // an unknown queue is an error naming it
    let (ok, _, err) = run(bin, &with(&["pending", "--queue", "nope"])).await;
    assert!(!ok && err.contains("nope"), "{err}");
    // without a token (no ServiceAccount to ask one of) the scheduler
    // refuses, and the CLI says why
    let (ok, _, err) = run(bin, &with(&["pending", "--token-service-account", ""])).await;
    assert!(!ok, "{err}");
    assert!(
        err.contains("401") && err.contains("no token was sent"),
        "{err}"
    );

    // doctor with the same flags: the context's cluster, camelCase JSON
    // (its exit code says healthy or not; the report comes either way)
    let (_, out, err) = run(
        bin,
        &[
            "--kubeconfig",
            kc,
            "--context",
            "e2e",
            "doctor",
            "-o",
            "json",
            "--no-scheduler-checks",
        ],
    )
    .await;
    let d: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}\n{err}"));
    assert!(
        d["exitCode"].is_number() && d["summary"]["gpuNodes"] == 2,
        "{d}"
    );

    // through kubectl itself, when it is installed
    let kubectl_ok = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output()
        .is_ok_and(|o| o.status.success());
    if kubectl_ok {
        let path = format!(
            "{}:{}",
            c.dir.path().display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut args = vec!["gpusched".to_string()];
        args.extend(
            with(&["pending", "--queue", "capped", "-o", "json"])
                .iter()
                .map(|s| s.to_string()),
        );
        let out = tokio::task::spawn_blocking(move || {
            Command::new("kubectl")
                .args(&args)
                .env("PATH", path)
                .env_remove("KUBECONFIG")
                .output()
                .unwrap()
        })
        .await
        .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["pods"][0]["pod"], "ml/capped-3");
    }
    s.stop().await;
}

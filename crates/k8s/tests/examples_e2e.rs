//! End-to-end: every manifest under `examples/` (what users copy, and what
//! `scripts/tryout` applies) applied to a real apiserver with gpusched
//! running on the try-out's fake cluster, each reaching the state
//! its comments promise: pods bound with a decision, gangs `Running`, Job
//! gangs with their PodGroup, queues `Valid`. A new example is picked up by
//! listing the directory, so none rots unnoticed. Run by `e2e/run`.

mod common;

use common::*;
use gpusched_core::GroupPhase;
use gpusched_k8s::crd::{PodGroup, Queue};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The YAML documents of the manifest files in `dir` (sorted by name, so
/// `queues.yaml` comes after the pods that name its queues: those wait for
/// it, as a user's would), each with the file it came from.
fn manifests(dir: &Path) -> Vec<(String, Value)> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml") && !p.ends_with("cluster.yaml"))
        .collect();
    files.sort();
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        let docs = serde_saphyr::from_multiple::<Value>(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        for d in docs.into_iter().filter(|d| !d.is_null()) {
            out.push((f.display().to_string(), d));
        }
    }
    out
}

/// Creates one manifest (namespaced kinds in `ns`); returns the object.
async fn apply(c: &Cluster, ns: &str, file: &str, doc: &Value) -> DynamicObject {
    let api_version = doc["apiVersion"].as_str().unwrap();
    let kind = doc["kind"].as_str().unwrap();
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    let api: Api<DynamicObject> = match kind {
        "Queue" => Api::all_with(c.client.clone(), &ar),
        _ => Api::namespaced_with(c.client.clone(), ns, &ar),
    };
    let obj: DynamicObject = serde_json::from_value(doc.clone()).unwrap();
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("{file}: creating {kind} {:?}: {e}", obj.metadata.name))
}

/// The pods a controller would make from a workload's pod template (this
/// control plane runs no controller manager): `n` of them, named
/// `NAME-i`, with the extra labels.
async fn pods_from_template(c: &Cluster, ns: &str, owner: &DynamicObject, n: u64, labels: Value) {
    let name = owner.metadata.name.clone().unwrap();
    let template = &owner.data["spec"]["template"];
    for i in 0..n {
        let mut meta = template["metadata"].clone();
        if meta.is_null() {
            meta = json!({});
        }
        meta["name"] = json!(format!("{name}-{i}"));
        let mut l = meta["labels"].clone();
        if l.is_null() {
            l = json!({});
        }
        for (k, v) in labels.as_object().unwrap() {
            l[k] = v.clone();
        }
        meta["labels"] = l;
        create(
            &c.pods(ns),
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}),
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn every_example_reaches_its_documented_state() {
    let root = repo_root();
    let c = Cluster::up().await;
    let cluster = std::fs::read_to_string(root.join("examples/tryout/cluster.yaml")).unwrap();
    c.nodes_from_yaml(&cluster).await;
    let s = c.scheduler(opts()).await;

    let mut expected_pods: Vec<(String, String)> = Vec::new(); // (ns, name)
    let mut groups: Vec<(String, String)> = Vec::new();
    let mut queues: Vec<String> = Vec::new();
    let mut applied = 0;
    for (dir, ns) in [("examples", "ml")] {
        for (file, doc) in manifests(&root.join(dir)) {
            let obj = apply(&c, ns, &file, &doc).await;
            applied += 1;
            let name = obj.metadata.name.clone().unwrap();
            match doc["kind"].as_str().unwrap() {
                "Pod" => expected_pods.push((ns.into(), name)),
                "Queue" => queues.push(name),
                "PodGroup" => groups.push((ns.into(), name)),
                "Deployment" => {
                    let n = doc["spec"]["replicas"].as_u64().unwrap_or(1);
                    pods_from_template(&c, ns, &obj, n, json!({})).await;
                    expected_pods.extend((0..n).map(|i| (ns.into(), format!("{name}-{i}"))));
                }
                "Job" => {
                    // gpusched makes the gang's PodGroup for a labelled Job
                    let n = doc["spec"]["parallelism"].as_u64().unwrap_or(1);
                    let pg: Api<PodGroup> = Api::namespaced(c.client.clone(), ns);
                    let g = wait_for(Duration::from_secs(30), || async {
                        pg.get(&name).await.ok()
                    })
                    .await
                    .unwrap_or_else(|| panic!("{file}: no PodGroup {name} for the gang Job"));
                    assert_eq!(u64::from(g.spec.min_member), n, "{file}");
                    pods_from_template(
                        &c,
                        ns,
                        &obj,
                        n,
                        json!({"batch.kubernetes.io/job-name": name}),
                    )
                    .await;
                    expected_pods.extend((0..n).map(|i| (ns.into(), format!("{name}-{i}"))));
                    groups.push((ns.into(), name));
                }
                other => panic!("{file}: a {other} example: say here what state it must reach"),
            }
        }
    }
    assert!(applied >= 13, "only {applied} manifests found");

    // every pod bound, with the scheduler's decision
    for (ns, name) in &expected_pods {
        let api: Api<Pod> = c.pods(ns);
        let p = wait_for(Duration::from_secs(60), || async {
            let p = api.get(name).await.ok()?;
            p.spec.as_ref()?.node_name.as_ref()?;
            Some(p)
        })
        .await;
        let Some(p) = p else {
            let ev = events_for(&c.client, ns, name).await;
            panic!("{ns}/{name} was not scheduled; events: {ev:?}");
        };
        let d = decision(&p);
        assert!(!d.indices.is_empty(), "{ns}/{name}: {d:?}");
    }
    // model restriction and topology as the examples promise
    let p = c.pods("ml").get("h100-only").await.unwrap();
    let node = p.spec.unwrap().node_name.unwrap();
    assert!(node.starts_with("h100"), "h100-only on {node}");
    let racks: std::collections::BTreeSet<String> = {
        let mut r = std::collections::BTreeSet::new();
        for i in 0..4 {
            let p = c.pods("ml").get(&format!("train-{i}")).await.unwrap();
            let n = p.spec.unwrap().node_name.unwrap();
            let node: k8s_openapi::api::core::v1::Node =
                Api::all(c.client.clone()).get(&n).await.unwrap();
            r.insert(
                node.metadata
                    .labels
                    .unwrap_or_default()
                    .get("gpusched.io/rack")
                    .cloned()
                    .unwrap_or_default(),
            );
        }
        r
    };
    assert_eq!(racks.len(), 1, "the gang spans racks {racks:?}");
    // gangs running, queues valid
    for (ns, name) in &groups {
        let api: Api<PodGroup> = Api::namespaced(c.client.clone(), ns);
        let st = wait_for(Duration::from_secs(30), || async {
            let g = api.get(name).await.ok()?;
            g.status.filter(|s| s.phase == Some(GroupPhase::Running))
        })
        .await;
        assert!(st.is_some(), "PodGroup {ns}/{name} is not Running");
    }
    let qapi: Api<Queue> = Api::all(c.client.clone());
    for q in &queues {
        let ok = wait_for(Duration::from_secs(30), || async {
            let st = qapi.get(q).await.ok()?.status?;
            st.conditions
                .iter()
                .any(|c| c.type_ == "Valid" && c.status == "True")
                .then_some(())
        })
        .await;
        assert!(ok.is_some(), "Queue {q} is not Valid=True");
    }
    assert_no_double_booking(&c.client).await;
    s.stop().await;
}

/// Identifiers a PromQL query names as metrics (ours and `process_*`).
fn query_metrics(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            let w = &expr[s..i];
            let quoted = s > 0 && b[s - 1] == b'"';
            if !quoted && (w.starts_with("gpusched_") || w.starts_with("process_")) {
                out.push(w.to_string());
            }
        } else {
            i += 1;
        }
    }
    out
}

/// Label names a query uses (`by (…)`, `without (…)`, selectors
/// `{name="…"}`), with the value where a selector matches one exactly.
fn query_labels(expr: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    for kw in ["by (", "without ("] {
        let mut rest = expr;
        while let Some(p) = rest.find(kw) {
            rest = &rest[p + kw.len()..];
            let end = rest.find(')').unwrap();
            for l in rest[..end].split(',') {
                out.push((l.trim().to_string(), None));
            }
        }
    }
    let mut rest = expr;
    while let Some(p) = rest.find('{') {
        rest = &rest[p + 1..];
        let end = rest.find('}').unwrap();
        let sel = &rest[..end];
        // legend templates ({{instance}}) are not in expressions; selectors are name op "value"
        for m in sel.split(',') {
            let m = m.trim();
            let (name, op_value) = m.split_at(m.find(['=', '!']).unwrap());
            let exact = op_value.starts_with("=\"");
            let value = op_value
                .trim_start_matches(['=', '!', '~'])
                .trim_matches('"');
            out.push((name.trim().to_string(), exact.then(|| value.to_string())));
        }
    }
    out
}

/// Labels Prometheus adds from its scrape configuration, and the
/// histogram bucket label.
const TARGET_LABELS: [&str; 4] = ["job", "instance", "pod", "le"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn dashboard_queries_match_a_live_scheduler() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(
        &std::fs::read_to_string(repo_root().join("fixtures/clusters/tiny.yaml")).unwrap(),
    )
    .await;
    c.queue("research", json!({"guaranteed": {"nvidia.com/gpu": "4"}}))
        .await;
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let mut o = opts();
    o.http_addr = Some(addr);
    o.http_auth = gpusched_k8s::debug::HttpAuth::None;
    o.tls = gpusched_k8s::tls::Tls::Off;
    let s = c.scheduler(o).await;
    // a bound pod in a queue, and one that waits (too big for any node)
    let pods = c.pods("ml");
    let mut p = gpu_pod("a", 1);
    p["metadata"]["labels"] = json!({"gpusched.io/queue": "research"});
    create(&pods, p).await;
    create(&pods, gpu_pod("big", 16)).await;
    wait_for(Duration::from_secs(30), || async {
        (bound(&pods).await.len() == 1).then_some(())
    })
    .await
    .expect("pod a bound");
    // the cluster gauges are refreshed every 2 s
    let text = wait_for(Duration::from_secs(20), || async {
        let t = scrape(addr).await?;
        t.contains("gpusched_pending_pods_by_reason{reason=\"NeverFits\"} 1")
            .then_some(t)
    })
    .await
    .expect("a scrape with the pending pod classified");
    let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();

    let path = repo_root().join("deploy/dashboards/gpusched-scheduler.json");
    let dash: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let mut checked = 0;
    for panel in dash["panels"].as_array().unwrap() {
        for t in panel["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap();
            let metrics = query_metrics(expr);
            assert!(!metrics.is_empty(), "{expr}: no metric");
            let of = |m: &str| -> Vec<&str> {
                series
                    .iter()
                    .copied()
                    .filter(|l| {
                        l.strip_prefix(m)
                            .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
                    })
                    .collect()
            };
            for m in &metrics {
                assert!(
                    !of(m).is_empty(),
                    "panel {:?}: {m} has no series on a live scheduler (query {expr})",
                    panel["title"]
                );
            }
            for (label, value) in query_labels(expr) {
                if TARGET_LABELS.contains(&label.as_str()) {
                    continue;
                }
                let needle = match &value {
                    Some(v) => format!("{label}=\"{v}\""),
                    None => format!("{label}=\""),
                };
                assert!(
                    metrics
                        .iter()
                        .any(|m| of(m).iter().any(|l| l.contains(&needle))),
                    "panel {:?}: no series of {metrics:?} has {needle} (query {expr})",
                    panel["title"]
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 15, "only {checked} queries");
    s.stop().await;
}

/// `/metrics` of a scheduler started with `http_addr = addr` (no auth).
async fn scrape(addr: std::net::SocketAddr) -> Option<String> {
    use std::io::{Read, Write};
    tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        let req = "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
        s.write_all(req.as_bytes()).ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        text.starts_with("HTTP/1.1 200").then_some(text)
    })
    .await
    .ok()?
}

#[test]
fn query_parsing() {
    assert_eq!(
        query_metrics(
            r#"max by (queue) (gpusched_pending_pods) / rate(process_cpu_seconds_total{job=~".*gpusched.*"}[5m])"#
        ),
        vec!["gpusched_pending_pods", "process_cpu_seconds_total"]
    );
    assert_eq!(
        query_labels(r#"sum by (kind, queue) (x{state="free", job=~"a"})"#),
        vec![
            ("kind".to_string(), None),
            ("queue".to_string(), None),
            ("state".to_string(), Some("free".to_string())),
            ("job".to_string(), None)
        ]
    );
}

/// Regression (found by the examples test): a gang Job seen while the
/// replica was a standby (created before the first election, or during a
/// failover) got no PodGroup until the Job changed again. Here the lease
/// is held by a replica that is not running (as after a crash), the Job
/// is created, and the scheduler must make its PodGroup once it takes
/// the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_gang_job_created_before_the_leader_gets_its_pod_group() {
    use k8s_openapi::api::coordination::v1::Lease;
    let c = Cluster::up().await;
    let mut o = opts();
    let lease_name = o.lease_name.clone().expect("the chart elects a leader");
    o.lease_seconds = 5;
    // a lease held by a replica that crashed a moment ago
    let leases: Api<Lease> = Api::namespaced(c.client.clone(), &o.lease_namespace);
    let now = k8s_openapi::jiff::Timestamp::now();
    create_obj(
        &leases,
        json!({"metadata": {"name": lease_name},
               "spec": {"holderIdentity": "crashed", "leaseDurationSeconds": 5,
                        "acquireTime": now.to_string(), "renewTime": now.to_string()}}),
    )
    .await;
    let s = c.scheduler(o).await;
    let jobs: Api<k8s_openapi::api::batch::v1::Job> = Api::namespaced(c.client.clone(), "ml");
    create_obj(&jobs, json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "early", "labels": {"gpusched.io/gang": "true"}},
        "spec": {"parallelism": 3, "template": {"spec": {
            "schedulerName": "gpusched", "restartPolicy": "Never",
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}}))
    .await;
    let pg: Api<PodGroup> = Api::namespaced(c.client.clone(), "ml");
    // not while the other holds the lease
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(pg.get_opt("early").await.unwrap().is_none());
    // the lease expires, the scheduler leads, the Job becomes a gang
    let g = wait_for(Duration::from_secs(30), || async {
        pg.get_opt("early").await.ok().flatten()
    })
    .await
    .expect("the PodGroup of a Job created before this replica led");
    assert_eq!(g.spec.min_member, 3);
    s.stop().await;
}

//! The checks on fixtures: each problem is found, named and classified.

use super::*;
use serde_json::{Value, json};

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn gpus_json(n: u32, unhealthy: &[u32]) -> String {
    let v: Vec<Value> = (0..n)
        .map(|i| {
            json!({"index": i, "uuid": format!("GPU-{i}"), "model": "H100-SXM5-80GB",
                   "memoryMiB": 81559, "nvlink": 0, "pcieSwitch": i / 2, "numa": 0,
                   "healthy": !unhealthy.contains(&i)})
        })
        .collect();
    serde_json::to_string(&v).unwrap()
}

fn node(name: &str, n: u32, unhealthy: &[u32], extra: Value) -> Value {
    let mut v = json!({
        "metadata": {"name": name,
            "labels": {"nvidia.com/gpu.product": "H100-SXM5-80GB", "nvidia.com/gpu.count": n.to_string(),
                       "gpusched.io/gpu.nvlink-domains": "1"},
            "annotations": {"gpusched.io/gpus": gpus_json(n, unhealthy)}},
        "spec": {},
        "status": {
            "capacity": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": n.to_string()},
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110",
                            "nvidia.com/gpu": (n - unhealthy.len() as u32).to_string()},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    });
    merge(&mut v, extra);
    v
}

fn merge(a: &mut Value, b: Value) {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                merge(a.entry(k).or_insert(Value::Null), v);
            }
        }
        (a, b) => *a = b,
    }
}

fn pod(name: &str, gpus: u32, extra: Value) -> Value {
    let mut v = json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z", "labels": {}},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
        "status": {"phase": "Pending"}
    });
    merge(&mut v, extra);
    v
}

fn run_on(facts: &Facts) -> Report {
    let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
    run(facts, &mut s, None)
}

fn find<'a>(r: &'a Report, check: &'a str, subject: &str) -> Vec<&'a Finding> {
    r.of(check).filter(|f| f.subject == subject).collect()
}

/// The cluster of the e2e test, as fixtures: one node with an unhealthy
/// GPU and a leaked allocation, a queue at its limit, a gang short of
/// members, a gated pod, a pod asking a GPU model nobody has.
fn troubled() -> Facts {
    let allocations = json!({"v": 1, "agent": "0.1.0", "pods": [
        {"uid": "uid-gone", "namespace": "ml", "name": "gone", "gpus": ["GPU-0", "GPU-1"]},
        {"uid": "uid-done", "namespace": "ml", "name": "done", "gpus": ["GPU-2"]},
        {"uid": "uid-small-run", "namespace": "ml", "name": "small-run", "gpus": ["GPU-4"]}
    ]});
    Facts {
        nodes: vec![
            obj(node(
                "gpu-a",
                8,
                &[3],
                json!({"metadata": {"annotations": {
                "gpusched.io/allocations": allocations.to_string()}}}),
            )),
            obj(node(
                "gpu-b",
                4,
                &[],
                json!({"metadata": {"labels": {"nvidia.com/gpu.count": "8"}}}),
            )),
        ],
        pods: vec![
            obj(pod(
                "small-run",
                1,
                json!({"metadata": {"labels": {"gpusched.io/queue": "small"}},
                "spec": {"nodeName": "gpu-a"}, "status": {"phase": "Running"}}),
            )),
            obj(pod(
                "small-wait",
                1,
                json!({"metadata": {"labels": {"gpusched.io/queue": "small"}}}),
            )),
            obj(pod(
                "gang-0",
                1,
                json!({"metadata": {"labels": {"gpusched.io/pod-group": "g"}}}),
            )),
            obj(pod(
                "gated",
                1,
                json!({"spec": {"schedulingGates": [{"name": "example.com/wait"}]}}),
            )),
            obj(pod(
                "a100",
                1,
                json!({"metadata": {"annotations": {"gpusched.io/gpu-models": "A100-SXM4-80GB"}}}),
            )),
            obj(pod("too-big", 16, json!({}))),
            obj(pod(
                "done",
                1,
                json!({"spec": {"nodeName": "gpu-a"}, "status": {"phase": "Succeeded"}}),
            )),
            obj(
                json!({"metadata": {"name": "agent-a", "namespace": "gpusched-system", "uid": "uid-agent-a",
                    "labels": {"app.kubernetes.io/name": "gpusched-agent"}},
                "spec": {"nodeName": "gpu-a", "containers": [{"name": "agent", "image": "x"}]},
                "status": {"phase": "Running", "containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
                    "ready": true, "restartCount": 2}]}}),
            ),
        ],
        queues: vec![obj(
            json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": "small"}, "spec": {"limit": {"nvidia.com/gpu": "1"}}}),
        )],
        groups: vec![obj(
            json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ml"}, "spec": {"minMember": 3}}),
        )],
        now_ms: 1_796_119_300_000,
        ..Facts::default()
    }
}

#[test]
fn every_planted_problem_is_found_and_named() {
    let r = run_on(&troubled());
    // (1) the unhealthy GPU, by index and UUID, and capacity ≠ allocatable
    let a = find(&r, "gpu-resources", "node/gpu-a");
    assert!(
        a.iter()
            .any(|f| f.status == Status::Fail && f.message.contains("GPU 3 (GPU-3)")),
        "{a:#?}"
    );
    assert!(a.iter().any(|f| f.status == Status::Warn && f.message.contains("capacity 8 but allocatable 7")));
    assert!(
        find(&r, "gpu-resources", "node/gpu-b")
            .iter()
            .all(|f| f.status == Status::Ok)
    );
    // (2) the agent: restarts on gpu-a, missing on gpu-b
    assert!(
        find(&r, "agent", "node/gpu-a")
            .iter()
            .any(|f| f.message.contains("restarted 2 time(s)"))
    );
    assert!(
        find(&r, "agent", "node/gpu-b")
            .iter()
            .any(|f| f.message.contains("no gpusched-agent pod"))
    );
    // (3) pending pods, classified from the core's reasons
    let class = |name: &str| {
        let v = find(&r, "pending", &format!("pod/ml/{name}"));
        assert_eq!(v.len(), 1, "{name}: {v:#?}");
        v[0].class
    };
    assert_eq!(class("small-wait"), Some(PendingClass::Quota));
    assert_eq!(class("gang-0"), Some(PendingClass::GangIncomplete));
    assert_eq!(class("gated"), Some(PendingClass::Gated));
    assert_eq!(class("a100"), Some(PendingClass::GpuModel));
    assert_eq!(find(&r, "pending", "pod/ml/a100")[0].status, Status::Fail);
    // 16 GPUs where the largest node has 8: never, as explain says (not
    // "placed when pods finish")
    assert_eq!(class("too-big"), Some(PendingClass::NeverFits));
    let big = find(&r, "pending", "pod/ml/too-big");
    assert_eq!(big[0].status, Status::Fail);
    assert!(big[0].hint.contains("never fits"), "{big:#?}");
    // (5) labels vs discovery
    let t = find(&r, "topology", "node/gpu-b");
    assert!(
        t[0].status == Status::Warn && t[0].message.contains("nvidia.com/gpu.count=8"),
        "{t:#?}"
    );
    assert_eq!(find(&r, "topology", "node/gpu-a")[0].status, Status::Ok);
    // (6) leaks: the pod that is gone and the one that finished, not the running one
    let l = find(&r, "leaks", "node/gpu-a");
    assert_eq!(l.len(), 2, "{l:#?}");
    assert!(l[0].message.contains("ml/gone") && l[0].message.contains("no longer exists"));
    assert!(l[1].message.contains("ml/done") && l[1].message.contains("finished (Succeeded)"));
    assert_eq!(r.summary.leaked_milli, 3000);
    assert_eq!(l[0].reclaimable_milli, Some(2000));
    // summary and exit code
    assert_eq!(r.summary.gpus, 12);
    assert_eq!(r.summary.unhealthy_gpus, 1);
    // the running pod, and the finished one its node's agent still lists
    // (a status says finished, the node says in use: counted, issue 38)
    assert_eq!(r.summary.allocated_milli, 2000);
    assert_eq!(r.exit_code, 2);
    assert!(!r.healthy);
    let text = r.render();
    assert!(
        text.contains("✗ node/gpu-a: the agent reports 1 unhealthy"),
        "{text}"
    );
    assert!(text.contains("(QueueQuota)"), "{text}");
    let js: Value = serde_json::to_value(&r).unwrap();
    assert_eq!(js["exitCode"], 2);
    assert!(
        js["findings"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["class"] == "GangIncomplete")
    );
}

#[test]
fn time_sliced_gpus_are_counted_in_gpus_not_replicas() {
    let sharing = |res: &str| {
        json!({"v": 1, "timeSlicing": [{"resource": res, "of": "nvidia.com/gpu", "replicas": 4}]})
            .to_string()
    };
    // own name: 4 GPUs × 4 replicas = 16 nvidia.com/gpu
    let own = node(
        "ts",
        4,
        &[],
        json!({"metadata": {"annotations": {"gpusched.io/sharing": sharing("nvidia.com/gpu")}},
               "status": {"capacity": {"nvidia.com/gpu": "16"}, "allocatable": {"nvidia.com/gpu": "16"}}}),
    );
    // renamed: 16 nvidia.com/gpu.shared, no nvidia.com/gpu
    let mut renamed = node(
        "tr",
        4,
        &[],
        json!({"metadata": {"annotations": {"gpusched.io/sharing": sharing("nvidia.com/gpu.shared")}},
               "status": {"capacity": {"nvidia.com/gpu.shared": "16"},
                          "allocatable": {"nvidia.com/gpu.shared": "16"}}}),
    );
    renamed["status"]["capacity"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    renamed["status"]["allocatable"]
        .as_object_mut()
        .unwrap()
        .remove("nvidia.com/gpu");
    let f = Facts {
        nodes: vec![obj(own), obj(renamed)],
        now_ms: 1_796_119_300_000,
        ..Facts::default()
    };
    let r = run_on(&f);
    for (node, res) in [("ts", "nvidia.com/gpu"), ("tr", "nvidia.com/gpu.shared")] {
        let g = find(&r, "gpu-resources", &format!("node/{node}"));
        assert_eq!(g.len(), 1, "{g:#?}");
        assert_eq!(g[0].status, Status::Ok, "{g:#?}");
        assert_eq!(
            g[0].message,
            format!("16 {res} allocatable (4 GPUs × 4 replicas), all healthy")
        );
    }
    // a GPU withheld: 12 replicas are 3 GPUs, not what the agent reports
    let mut f2 = f.clone();
    f2.nodes[0]
        .status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("12".into()),
        );
    let r = run_on(&f2);
    let g = find(&r, "gpu-resources", "node/ts");
    assert!(
        g.iter().any(|x| x.message
            == "the agent reports 4 healthy GPUs but the kubelet has 12 nvidia.com/gpu allocatable (3 GPUs × 4 replicas)"),
        "{g:#?}"
    );
}

#[test]
fn a_healthy_cluster_exits_zero() {
    let mut f = Facts {
        nodes: vec![obj(node("gpu-a", 4, &[], json!({})))],
        pods: vec![obj(
            json!({"metadata": {"name": "agent-a", "namespace": "gpusched-system", "uid": "u",
                "labels": {"app.kubernetes.io/name": "gpusched-agent"}},
            "spec": {"nodeName": "gpu-a", "containers": [{"name": "agent", "image": "x"}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "agent", "image": "x", "imageID": "",
                "ready": true, "restartCount": 0}]}}),
        )],
        now_ms: 1_796_119_300_000,
        ..Facts::default()
    };
    let r = run_on(&f);
    assert_eq!(r.exit_code, 0, "{}", r.render());
    assert!(r.healthy);
    // a pod that fits but waited minutes: nobody schedules it
    let mut waiting = f.clone();
    waiting.pods.push(obj(pod("stale", 1, json!({}))));
    let r = run_on(&waiting);
    let stale = find(&r, "pending", "pod/ml/stale");
    assert_eq!(stale[0].class, Some(PendingClass::FitsNow), "{stale:#?}");
    assert!(stale[0].message.contains("would bind it to gpu-a"));
    assert_eq!(r.summary.pending_pods, 1);
    // one created just now is not reported (the scheduler binds it shortly)
    let mut fresh = f.clone();
    fresh.pods.push(obj(pod("fresh", 1, json!({}))));
    fresh.now_ms = 1_796_119_200_000 + 5_000;
    let r = run_on(&fresh);
    assert!(find(&r, "pending", "pod/ml/fresh").is_empty());
    assert_eq!(r.summary.pending_pods, 1);
    assert_eq!(r.exit_code, 0);
    // a pod that fits is not a problem; one too big for any node is
    f.pods.push(obj(pod("big", 16, json!({}))));
    let r = run_on(&f);
    let big = find(&r, "pending", "pod/ml/big");
    // (never-fits, as explain's Unresolvable says, not "placed when pods
    // finish": issue #22, 11)
    assert_eq!(big[0].class, Some(PendingClass::NeverFits), "{big:#?}");
    // bigger than any node: never fits as the cluster is
    assert_eq!(big[0].status, Status::Fail);
    assert_eq!(r.exit_code, 2);
}

#[test]
fn namespace_filter_keeps_node_checks_and_drops_other_pods() {
    let r = {
        let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
        run(&troubled(), &mut s, Some("other"))
    };
    assert_eq!(
        r.of("pending")
            .filter(|f| f.subject.starts_with("pod/"))
            .count(),
        0
    );
    assert!(r.of("gpu-resources").any(|f| f.status == Status::Fail));
    // totals still count the whole cluster
    assert_eq!(r.summary.pending_pods, 5, "with too-big");
    assert_eq!(r.summary.leaked_milli, 3000);
}

#[test]
fn the_probe_pod_asks_one_gpu_of_gpusched() {
    let p: k8s_openapi::api::core::v1::Pod =
        obj(probe::probe_pod("gpusched-doctor-probe-1", "cuda:12"));
    let v = crate::translate::pod(&p);
    let crate::translate::PodKind::Pending { pod, .. } = v.kind else {
        panic!("{:?}", v.kind)
    };
    assert_eq!(pod.gpu, gpusched_model::GpuRequest::Whole(1));
    let spec = p.spec.unwrap();
    assert_eq!(spec.restart_policy.as_deref(), Some("Never"));
    assert_eq!(
        spec.containers[0].command.as_deref(),
        Some(&["nvidia-smi".to_string(), "-L".to_string()][..])
    );
}

/// #39 item 1: the same finding on ten nodes was ten lines; it is one line
/// with a count (the JSON keeps every finding).
#[test]
fn repeated_per_node_findings_are_one_line_with_a_count() {
    let mut findings: Vec<Finding> = (0..10)
        .map(|i| {
            Finding::new(
                "agent",
                Status::Warn,
                format!("node/gpu-{i}"),
                "no gpusched-agent pod on this node",
                "check the DaemonSet",
            )
        })
        .collect();
    findings.push(Finding::new(
        "agent",
        Status::Warn,
        "node/odd",
        "another message",
        "",
    ));
    let r = Report::new(Summary::default(), findings);
    let text = r.render();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("no gpusched-agent pod"))
        .collect();
    assert_eq!(
        lines,
        ["! 10 nodes (gpu-0, gpu-1, gpu-2, … (7 more)): no gpusched-agent pod on this node"],
        "{text}"
    );
    assert!(text.contains("! node/odd: another message"), "{text}");
    assert_eq!(
        text.matches("hint: check the DaemonSet").count(),
        1,
        "{text}"
    );
    assert_eq!(r.findings.len(), 11);
}

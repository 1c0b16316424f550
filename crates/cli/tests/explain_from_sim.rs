//! `gpusched explain … --from-sim`: the binary runs the simulator to a time
//! and prints the core's report of that cycle.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory with a three-node cluster and a workload where
/// `capped` is at its limit (a 2-GPU job waits on quota; the limit names
/// only GPUs, so CPU and memory are not capped) and a gang of
/// three 8-GPU pods cannot fit the 20 GPUs left over (two whole nodes).
fn scenario() -> (PathBuf, PathBuf) {
    // one directory per call: the tests run in parallel threads
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = std::env::temp_dir().join(format!(
        "gpusched-explain-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = dir.join("cluster.yaml");
    std::fs::write(
        &cluster,
        "nodes:
  - name: node
    count: 3
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch}
",
    )
    .unwrap();
    let workload = dir.join("workload.yaml");
    std::fs::write(
        &workload,
        "name: explain
queues:
  - name: capped
    limit: {nvidia.com/gpu: \"4\"}
  - name: research
jobs:
  - name: base
    queue: capped
    duration: 3h
    requests: {cpu: \"4\", memory: 32Gi, nvidia.com/gpu: \"4\"}
  - name: more
    queue: capped
    arrival: 1m
    duration: 1h
    requests: {cpu: \"4\", memory: 32Gi, nvidia.com/gpu: \"2\"}
  - name: wide
    queue: research
    arrival: 2m
    duration: 1h
    pods: 3
    gang: {min_member: 3, timeout: 1h}
    requests: {cpu: \"4\", memory: 32Gi, nvidia.com/gpu: \"8\"}
",
    )
    .unwrap();
    (cluster, workload)
}

fn explain(args: &[&str]) -> (bool, String, String) {
    let mut all = vec!["explain"];
    all.extend_from_slice(args);
    sim(&all)
}

/// `gpusched ARGS --from-sim` on [`scenario`].
fn sim(args: &[&str]) -> (bool, String, String) {
    let (cluster, workload) = scenario();
    let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(args)
        .arg("--from-sim")
        .arg("--cluster")
        .arg(&cluster)
        .arg("--workload")
        .arg(&workload)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(cluster.parent().unwrap());
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn a_quota_pending_pod_from_the_simulator() {
    let (ok, out, err) = explain(&["pod", "more-p0", "--at", "10m", "--json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["pod"], "more-p0");
    assert_eq!(v["queue"], "capped");
    let p = &v["status"]["Pending"];
    let quota = p["reasons"]
        .as_array()
        .unwrap()
        .iter()
        .find_map(|r| r.get("Quota"))
        .unwrap_or_else(|| panic!("{p}"));
    assert_eq!(quota["queue"], "capped");
    assert_eq!(quota["dimension"], "Gpu");
    assert_eq!(quota["wouldUse"], 6000);
    assert_eq!(quota["cap"], 4000);
    assert_eq!(v["atMs"], 600_000, "the last cycle at or before 10m");
    // the text form says the same in words
    let (ok, text, err) = explain(&["pod", "more-p0", "--at", "10m"]);
    assert!(ok, "{err}");
    assert!(
        text.contains("queue \"capped\" would exceed its limit on nvidia.com/gpu (6 GPU of 4 GPU)"),
        "{text}"
    );
    assert!(
        text.contains("fits once queue \"capped\" uses 2 GPU less"),
        "{text}"
    );
}

#[test]
fn a_gang_that_does_not_fit_and_its_queue_from_the_simulator() {
    // at 4m (before the 5 min after which nodes are reserved for it)
    let (ok, out, err) = explain(&["pod", "wide-p1", "--at", "4m", "--json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let g = &v["gang"];
    assert_eq!(g["minMember"], 3);
    assert_eq!(g["pending"], 3);
    assert_eq!(g["running"], 0);
    // 1h from its arrival at 2m, seen at 4m
    assert_eq!(g["timeoutLeftMs"], 58 * 60_000);
    let reasons = v["status"]["Pending"]["reasons"].as_array().unwrap();
    let short = reasons
        .iter()
        .find_map(|r| r.get("GangShort"))
        .unwrap_or_else(|| panic!("{reasons:?}"));
    assert_eq!(short["need"], 3);
    assert_eq!(
        short["fit"], 2,
        "two empty nodes, the third has 4 GPUs used"
    );

    let (ok, text, err) = explain(&["queue", "capped", "--at", "10m"]);
    assert!(ok, "{err}");
    assert!(text.contains("queue capped"), "{text}");
    assert!(text.contains("limit       gpu 4"), "{text}");
    assert!(text.contains("usage       gpu 4"), "{text}");
    assert!(text.contains("1 QueueQuota"), "{text}");
}

#[test]
fn an_unknown_pod_is_a_clear_error() {
    let (ok, _, err) = explain(&["pod", "nope-p0", "--at", "10m"]);
    assert!(!ok);
    assert!(
        err.contains("pod nope-p0 is not in the simulator's cycle at t=10m"),
        "{err}"
    );
}

/// `gpusched pending --from-sim`: the waiting pods by queue and queue
/// order, each with the reason the Queue status counts.
#[test]
fn the_pending_list_from_the_simulator() {
    let (ok, out, err) = sim(&["pending", "--at", "10m", "-o", "json"]);
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let pods = v["pods"].as_array().unwrap();
    let row = |name: &str| {
        pods.iter()
            .find(|p| p["pod"] == name)
            .unwrap_or_else(|| panic!("{name} not pending: {v}"))
    };
    assert_eq!(row("more-p0")["queue"], "capped");
    assert_eq!(row("more-p0")["reason"], "QueueQuota");
    assert_eq!(row("more-p0")["gpus"], "2");
    assert_eq!(row("more-p0")["waitingMs"], 9 * 60_000);
    for m in ["wide-p0", "wide-p1", "wide-p2"] {
        assert_eq!(row(m)["queue"], "research");
        assert_eq!(row(m)["group"], "wide");
    }
    // capped before research; the running base job is not listed
    let queues: Vec<&str> = pods.iter().map(|p| p["queue"].as_str().unwrap()).collect();
    let mut sorted = queues.clone();
    sorted.sort();
    assert_eq!(queues, sorted, "{v}");
    assert!(pods.iter().all(|p| p["pod"] != "base-p0"), "{v}");
    // one queue; an unknown one is an error naming it
    let (ok, out, err) = sim(&["pending", "--at", "10m", "--queue", "research"]);
    assert!(ok, "{err}");
    assert!(out.starts_with("QUEUE"), "{out}");
    assert!(out.contains("wide-p0") && !out.contains("more-p0"), "{out}");
    let (ok, _, err) = sim(&["pending", "--at", "10m", "--queue", "nope"]);
    assert!(!ok && err.contains("queue nope"), "{err}");
}

/// Every JSON the CLI prints uses Kubernetes' camelCase field names:
/// `explain` (the core's reports), `pending` and `simulate --json` (no key
/// with an underscore anywhere), and the names scripts read are pinned.
#[test]
fn json_field_names_are_camel_case() {
    fn keys(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, x) in m {
                    out.push(format!("{path}.{k}"));
                    keys(x, &format!("{path}.{k}"), out);
                }
            }
            Value::Array(a) => a.iter().for_each(|x| keys(x, path, out)),
            _ => {}
        }
    }
    let runs: [&[&str]; 4] = [
        &["explain", "pod", "more-p0", "--at", "10m", "-o", "json"],
        &["explain", "pod", "wide-p1", "--at", "4m", "-o", "json"],
        &["explain", "queue", "capped", "--at", "10m", "-o", "json"],
        &["pending", "--at", "10m", "-o", "json"],
    ];
    let mut all = Vec::new();
    for args in runs {
        let (ok, out, err) = sim(args);
        assert!(ok, "{args:?}: {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        keys(&v, args[0], &mut all);
    }
    let out = Command::new(env!("CARGO_BIN_EXE_gpusched"))
        .args(["simulate", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    keys(&v, "simulate", &mut all);
    let snake: Vec<&String> = all
        .iter()
        .filter(|k| k.rsplit('.').next().unwrap().contains('_'))
        .collect();
    assert!(snake.is_empty(), "snake_case keys: {snake:?}");
    for pinned in [
        "explain.queues.canBorrow",
        "explain.queues.fairShare",
        "explain.queues.usage.gpuMilli",
        "explain.queues.sharePpm",
        "explain.gang.minMember",
        "explain.gang.timeoutLeftMs",
        "explain.atMs",
        "explain.pendingByReason",
        "explain.runningPods",
        "pending.pods.waitingMs",
        "pending.atMs",
        "simulate.totals.allocMeanPct",
        "simulate.totals.jobsCompleted",
        "simulate.queues.waitP50S",
    ] {
        assert!(
            all.iter().any(|k| k == pinned),
            "{pinned} missing; keys: {all:?}"
        );
    }
}

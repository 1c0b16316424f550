//! Time-sliced GPUs through the world → snapshot → core path: a node is
//! filled to exactly what its kubelet advertises, and every replica is
//! counted as its share of a GPU (docs/scheduling.md, *One measure for
//! GPUs*).

use gpusched_core::fairshare::QueueTree;
use gpusched_core::{Decision, GpuAssignment, PodPhase};
use gpusched_k8s::decision::ANNOTATION_DECISION;
use gpusched_k8s::world::{Problem, World};
use gpusched_model::GpuRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// A node whose agent publishes `gpus` GPUs and time-slices `resource`
/// `replicas` ways; the kubelet advertises `gpus × replicas` of it.
fn ts_node(name: &str, gpus: u32, resource: &str, replicas: u32) -> Node {
    let list: Vec<Value> = (0..gpus)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "model": "L40S", "memoryMiB": 46068}))
        .collect();
    let mut alloc = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    alloc[resource] = json!((gpus * replicas).to_string());
    if resource != "nvidia.com/gpu" {
        alloc["nvidia.com/gpu"] = json!("0");
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "gpusched.io/gpus": serde_json::to_string(&list).unwrap(),
            "gpusched.io/sharing": json!({"v": 1, "timeSlicing": [
                {"resource": resource, "of": "nvidia.com/gpu", "replicas": replicas}]}).to_string()
        }},
        "spec": {},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn whole_node(name: &str, gpus: u32) -> Node {
    let list: Vec<Value> = (0..gpus)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "model": "L40S", "memoryMiB": 46068}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"gpusched.io/gpus": serde_json::to_string(&list).unwrap()}},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": gpus.to_string()},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
    .unwrap()
}

fn pod(name: &str, resource: &str, k: u32) -> Value {
    json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {resource: k.to_string()}}}]},
        "status": {"phase": "Pending"}
    })
}

/// Runs one cycle; the binds as (pod name, node, assignment).
fn cycle(w: &World) -> Vec<(String, String, GpuAssignment)> {
    let b = w.build();
    let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
    let out = s.cycle(&b.snapshot, 1_796_119_300_000, 1);
    out.decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, node, gpus } => Some((
                b.pods[*pod as usize].name.clone(),
                b.snapshot.nodes[*node as usize].name.clone(),
                gpus.clone(),
            )),
            _ => None,
        })
        .collect()
}

/// Binds the pods as the scheduler would (decision with the replicas).
fn bind_all(w: &mut World, binds: &[(String, String, GpuAssignment)], resource: &str, k: u32) {
    let b = w.build();
    for (name, node, gpus) in binds {
        let n = b.snapshot.nodes.iter().find(|n| &n.name == node).unwrap();
        let mut d = gpusched_k8s::decision::make(&format!("uid-{name}"), n, 1, gpus);
        let share = d.share.as_mut().unwrap();
        share.resource = Some(resource.into());
        share.replicas = Some(k);
        let mut p = pod(name, resource, k);
        p["spec"]["nodeName"] = json!(node);
        p["status"]["phase"] = json!("Running");
        p["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
        w.upsert_pod(&serde_json::from_value::<Pod>(p).unwrap());
    }
}

/// Per GPU (node, index): milli held by the snapshot's running pods.
fn held(w: &World) -> BTreeMap<(String, u32), u64> {
    let b = w.build();
    let mut m = BTreeMap::new();
    for p in &b.snapshot.pods {
        if let PodPhase::Running { node, gpus, .. } = &p.phase {
            let name = b.snapshot.nodes[*node as usize].name.clone();
            match gpus {
                GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
                    *m.entry((name, *gpu)).or_default() += u64::from(*milli)
                }
                GpuAssignment::Whole(v) => {
                    for g in v {
                        *m.entry((name.clone(), *g)).or_default() += 1000
                    }
                }
                GpuAssignment::None => {}
            }
        }
    }
    m
}

fn queue_usage(w: &World) -> u64 {
    let b = w.build();
    let (mut t, _) = QueueTree::build(&b.snapshot.queues);
    t.account(&b.snapshot);
    let q = t.idx("default").unwrap();
    t.acct[q].usage.gpu_milli
}

#[test]
fn own_name_time_slicing_fills_the_node_to_what_it_advertises() {
    // 2 GPUs × 8 replicas of nvidia.com/gpu: the kubelet advertises 16
    let mut w = World::default();
    w.upsert_node(&ts_node("ts", 2, "nvidia.com/gpu", 8));
    for i in 0..17 {
        w.upsert_pod(
            &serde_json::from_value::<Pod>(pod(&format!("p{i:02}"), "nvidia.com/gpu", 1)).unwrap(),
        );
    }
    let b = w.build();
    assert!(
        b.snapshot.pods.iter().all(|p| p.pod.gpu
            == GpuRequest::Share {
                milli: 125,
                memory_mib: 0
            }),
        "a replica of a GPU shared 8 ways is 125 milli"
    );
    assert_eq!(b.replicas.len(), 17);
    let binds = cycle(&w);
    assert_eq!(binds.len(), 16, "{binds:?}");
    bind_all(&mut w, &binds, "nvidia.com/gpu", 1);
    let h = held(&w);
    assert_eq!(h.len(), 2, "{h:?}");
    assert!(
        h.values().all(|m| *m == 1000),
        "each GPU filled by its 8 replicas: {h:?}"
    );
    assert_eq!(queue_usage(&w), 2000, "16 replicas of 125 milli");
    // the 17th waits: nothing more is advertised
    assert!(cycle(&w).is_empty());
}

#[test]
fn renamed_replicas_of_several_sizes_are_shares_beside_whole_gpus() {
    // node a: 2 GPUs × 4 replicas as nvidia.com/gpu.shared; node b: whole
    let mut w = World::default();
    w.upsert_node(&ts_node("a", 2, "nvidia.com/gpu.shared", 4));
    w.upsert_node(&whole_node("b", 2));
    // 2+2+1+1+1+1 replicas = 8 = what a advertises
    for (i, k) in [2u32, 2, 1, 1, 1, 1].into_iter().enumerate() {
        w.upsert_pod(
            &serde_json::from_value::<Pod>(pod(&format!("s{i}"), "nvidia.com/gpu.shared", k))
                .unwrap(),
        );
    }
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("w", "nvidia.com/gpu", 2)).unwrap());
    let binds = cycle(&w);
    assert_eq!(binds.len(), 7, "{binds:?}");
    for (name, node, gpus) in &binds {
        if name == "w" {
            assert_eq!(node, "b");
            assert!(matches!(gpus, GpuAssignment::Whole(v) if v.len() == 2));
        } else {
            assert_eq!(node, "a", "{name}");
            assert!(matches!(gpus, GpuAssignment::Share { milli, .. } if milli % 250 == 0));
        }
    }
    let (shares, whole): (Vec<_>, Vec<_>) = binds.into_iter().partition(|b| b.0 != "w");
    for k in [1u32, 2] {
        let of_k: Vec<_> = shares
            .iter()
            .filter(|b| matches!(b.2, GpuAssignment::Share { milli, .. } if milli == 250 * k))
            .cloned()
            .collect();
        bind_all(&mut w, &of_k, "nvidia.com/gpu.shared", k);
    }
    let b = w.build();
    let n = b.snapshot.nodes.iter().find(|n| n.name == "b").unwrap();
    let d = gpusched_k8s::decision::make("uid-w", n, 1, &whole[0].2);
    let mut p = pod("w", "nvidia.com/gpu", 2);
    p["spec"]["nodeName"] = json!("b");
    p["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
    w.upsert_pod(&serde_json::from_value::<Pod>(p).unwrap());
    let h = held(&w);
    let on_a: u64 = h.iter().filter(|(k, _)| k.0 == "a").map(|(_, m)| m).sum();
    assert_eq!(on_a, 2000, "{h:?}");
    assert!(h.values().all(|m| *m <= 1000), "{h:?}");
    // one measure: 8 replicas of 250 plus 2 whole GPUs
    assert_eq!(queue_usage(&w), 4000);
    // more replicas than a GPU has are refused, naming why
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("big", "nvidia.com/gpu.shared", 5)).unwrap());
    let b = w.build();
    assert!(
        b.problems
            .iter()
            .any(|p| matches!(p, Problem::InvalidPod { pod, error }
            if pod.name == "big" && error.contains("asks 5 replicas of nvidia.com/gpu.shared"))),
        "{:?}",
        b.problems
    );
}

#[test]
fn own_name_time_slicing_beside_whole_gpus_is_withheld_with_a_warning() {
    let mut w = World::default();
    w.upsert_node(&ts_node("ts", 2, "nvidia.com/gpu", 4));
    w.upsert_node(&whole_node("b", 1));
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("p0", "nvidia.com/gpu", 1)).unwrap());
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("p1", "nvidia.com/gpu", 1)).unwrap());
    let b = w.build();
    assert!(
        b.problems
            .iter()
            .any(|p| matches!(p, Problem::NodeWarning { node, warning }
        if node == "ts" && warning.contains("rename the resource")))
    );
    let binds = cycle(&w);
    assert_eq!(binds.len(), 1, "only b's whole GPU: {binds:?}");
    assert_eq!(binds[0].1, "b");
}

#[test]
fn renamed_replicas_leave_no_whole_gpu_on_the_node() {
    let mut w = World::default();
    w.upsert_node(&ts_node("a", 2, "nvidia.com/gpu.shared", 4));
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("w", "nvidia.com/gpu", 1)).unwrap());
    assert!(
        cycle(&w).is_empty(),
        "the kubelet offers no nvidia.com/gpu there"
    );
    w.upsert_pod(&serde_json::from_value::<Pod>(pod("r", "nvidia.com/gpu.shared", 4)).unwrap());
    let binds = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?}");
    assert!(matches!(
        binds[0].2,
        GpuAssignment::Share { milli: 1000, .. }
    ));
}

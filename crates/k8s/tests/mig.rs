//! MIG instances through the world → snapshot → core path
//! (docs/scheduling.md, *One measure for GPUs*): a pod asking MIG
//! instances is placed on a GPU with that many free instances of its
//! profile, never by milli; a node is filled to exactly the instances it
//! advertises; a GPU in MIG mode is never offered whole; every instance is
//! counted as its slice fraction of its GPU; and what bound pods hold is
//! rebuilt exactly from their decisions.

use gpusched_core::fairshare::QueueTree;
use gpusched_core::{Decision, GpuAssignment, PodPhase};
use gpusched_k8s::decision::ANNOTATION_DECISION;
use gpusched_k8s::world::{Problem, World};
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// An 8-GPU A100 node whose agent publishes `layout`: (GPU index,
/// profile, slices, instances). `single`: every instance is served as
/// `nvidia.com/gpu`; else as `nvidia.com/mig-<profile>` and the other GPUs
/// whole. The kubelet advertises what the agent serves.
fn mig_node(name: &str, gpus: u32, layout: &[(u32, &str, u32, u32)], single: bool) -> Node {
    let list: Vec<Value> = (0..gpus)
        .map(|i| json!({"index": i, "uuid": format!("GPU-{name}-{i}"), "model": "A100-SXM4-80GB", "memoryMiB": 81920}))
        .collect();
    let mut mig = Vec::new();
    let mut alloc = json!({"cpu": "64", "memory": "512Gi", "pods": "110"});
    let mut counts: BTreeMap<String, u32> = BTreeMap::new();
    for &(g, profile, slices, k) in layout {
        let resource = if single {
            "nvidia.com/gpu".to_string()
        } else {
            format!("nvidia.com/mig-{profile}")
        };
        let instances: Vec<Value> = (0..k)
            .map(|j| {
                json!({"id": format!("MIG-{name}-{g}-{j}"), "profile": profile, "slices": slices,
                            "of": 7, "memoryMiB": 9856, "resource": resource})
            })
            .collect();
        *counts.entry(resource).or_default() += k;
        mig.push(json!({"index": g, "instances": instances}));
    }
    let whole = gpus - layout.len() as u32;
    alloc["nvidia.com/gpu"] = json!(whole.to_string());
    for (r, k) in counts {
        let before = alloc[&r].as_str().map_or(0, |s| s.parse::<u32>().unwrap());
        alloc[&r] = json!((before + k).to_string());
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "gpusched.io/gpus": serde_json::to_string(&list).unwrap(),
            "gpusched.io/sharing": json!({"v": 1, "mig": mig}).to_string()
        }},
        "spec": {},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]}
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

fn add(w: &mut World, name: &str, resource: &str, k: u32) {
    w.upsert_pod(&serde_json::from_value::<Pod>(pod(name, resource, k)).unwrap());
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

/// Binds the pods as the scheduler does (the decision on the pod); the
/// bound pods.
fn bind_all(
    w: &mut World,
    binds: &[(String, String, GpuAssignment)],
    asks: &BTreeMap<String, (String, u32)>,
) -> Vec<Pod> {
    let b = w.build();
    let mut out = Vec::new();
    for (name, node, gpus) in binds {
        let n = b.snapshot.nodes.iter().find(|n| &n.name == node).unwrap();
        let d = gpusched_k8s::decision::make(&format!("uid-{name}"), n, 1, gpus);
        let (resource, k) = &asks[name];
        let mut p = pod(name, resource, *k);
        p["spec"]["nodeName"] = json!(node);
        p["status"]["phase"] = json!("Running");
        p["metadata"]["annotations"] = json!({ANNOTATION_DECISION: d.to_annotation()});
        let p = serde_json::from_value::<Pod>(p).unwrap();
        w.upsert_pod(&p);
        out.push(p);
    }
    out
}

/// Every instance held by a running pod, as (node, gpu, instance), with
/// the count of holders (must be 1 each).
fn instances_held(w: &World) -> BTreeMap<(String, u32, u32), u32> {
    let b = w.build();
    let mut m = BTreeMap::new();
    for p in &b.snapshot.pods {
        if let PodPhase::Running {
            node,
            gpus: GpuAssignment::Mig { gpu, instances, .. },
            ..
        } = &p.phase
        {
            for i in instances {
                *m.entry((b.snapshot.nodes[*node as usize].name.clone(), *gpu, *i))
                    .or_default() += 1;
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
fn a_mixed_node_is_filled_to_exactly_its_instances_and_its_whole_gpus() {
    // GPU 0: 7×1g.10gb, GPU 1: 2×3g.40gb, GPUs 2–7 whole (the agent's
    // mig-a100 fixture under migStrategy: mixed)
    let mut w = World::default();
    w.upsert_node(&mig_node(
        "a",
        8,
        &[(0, "1g.10gb", 1, 7), (1, "3g.40gb", 3, 2)],
        false,
    ));
    let mut asks = BTreeMap::new();
    for i in 0..9 {
        asks.insert(format!("one{i}"), ("nvidia.com/mig-1g.10gb".to_string(), 1));
    }
    for i in 0..3 {
        asks.insert(
            format!("three{i}"),
            ("nvidia.com/mig-3g.40gb".to_string(), 1),
        );
    }
    for i in 0..7 {
        asks.insert(format!("whole{i}"), ("nvidia.com/gpu".to_string(), 1));
    }
    for (name, (r, k)) in &asks {
        add(&mut w, name, r, *k);
    }
    let b = w.build();
    let one = b
        .snapshot
        .pods
        .iter()
        .find(|p| p.pod.name == "ml/one0")
        .unwrap();
    assert_eq!(one.pod.gpu.milli(), 142, "a 1g of 7 slices is 142 milli");
    assert_eq!(one.pod.mig.as_ref().unwrap().profile, "1g.10gb");
    let binds = cycle(&w);
    let count = |p: &str| binds.iter().filter(|b| b.0.starts_with(p)).count();
    assert_eq!(
        (count("one"), count("three"), count("whole")),
        (7, 2, 6),
        "{binds:?}"
    );
    for (name, _, gpus) in &binds {
        match gpus {
            GpuAssignment::Mig {
                gpu,
                instances,
                milli,
            } => {
                let want = if name.starts_with("one") {
                    (0, 142)
                } else {
                    (1, 428)
                };
                assert_eq!((*gpu, *milli), want, "{name}");
                assert_eq!(instances.len(), 1);
            }
            GpuAssignment::Whole(v) => {
                assert!(name.starts_with("whole"));
                assert!(
                    v.iter().all(|g| *g >= 2),
                    "a GPU in MIG mode is never whole: {name} {v:?}"
                );
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    let bound = bind_all(&mut w, &binds, &asks);
    let held = instances_held(&w);
    assert_eq!(held.len(), 9, "{held:?}");
    assert!(held.values().all(|n| *n == 1));
    // restart: a new world from the same objects (bound pods first seen
    // after the pending ones) holds exactly the same instances
    let mut again = World::default();
    again.upsert_node(&mig_node(
        "a",
        8,
        &[(0, "1g.10gb", 1, 7), (1, "3g.40gb", 3, 2)],
        false,
    ));
    for (name, (r, k)) in &asks {
        if !binds.iter().any(|b| &b.0 == name) {
            add(&mut again, name, r, *k);
        }
    }
    for p in bound.iter().rev() {
        again.upsert_pod(p);
    }
    assert_eq!(instances_held(&again), held);
    assert_eq!(queue_usage(&again), queue_usage(&w));
    assert!(
        cycle(&again).is_empty(),
        "nothing more fits after a restart"
    );
    // one measure: 7×142 + 2×428 + 6 whole GPUs
    assert_eq!(queue_usage(&w), 7 * 142 + 2 * 428 + 6000);
    // the pods past capacity wait, told which resource is short
    assert!(cycle(&w).is_empty());
    let b = w.build();
    let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
    let out = s.cycle(&b.snapshot, 1_796_119_300_000, 1);
    let msg: Vec<String> = out.explanations.iter().map(|e| e.message()).collect();
    assert!(
        msg.iter()
            .any(|m| m.contains("Insufficient nvidia.com/mig-1g.10gb")),
        "{msg:?}"
    );
}

#[test]
fn a_1g_pod_never_lands_on_a_gpu_cut_into_3g_instances() {
    // GPU 0: 2×3g (both held: 144 milli left), GPU 1: 7×1g (all held)
    let mut w = World::default();
    let layout = [(0, "3g.40gb", 3, 2), (1, "1g.10gb", 1, 7)];
    w.upsert_node(&mig_node("a", 2, &layout, false));
    let mut asks = BTreeMap::new();
    asks.insert("t".to_string(), ("nvidia.com/mig-3g.40gb".to_string(), 2));
    for i in 0..7 {
        asks.insert(format!("o{i}"), ("nvidia.com/mig-1g.10gb".to_string(), 1));
    }
    for (name, (r, k)) in &asks {
        add(&mut w, name, r, *k);
    }
    let binds = cycle(&w);
    assert_eq!(binds.len(), 8, "{binds:?}");
    bind_all(&mut w, &binds, &asks);
    let b = w.build();
    let st = gpusched_core::ClusterState::from_snapshot(&b.snapshot).0;
    assert_eq!(st.get(0).mig_free_milli, vec![1000 - 856, 1000 - 994]);
    // an eighth 1g pod: 144 milli free on GPU 0, but no 1g instance
    add(&mut w, "late", "nvidia.com/mig-1g.10gb", 1);
    assert!(cycle(&w).is_empty());
    // a pod asking more instances than one GPU has is never placed
    add(&mut w, "eight", "nvidia.com/mig-1g.10gb", 8);
    assert!(cycle(&w).is_empty());
}

#[test]
fn single_strategy_nodes_serve_nvidia_com_gpu_as_instances() {
    // two GPUs, each 7×1g.10gb, served as nvidia.com/gpu (14 devices)
    let mut w = World::default();
    let layout = [(0, "1g.10gb", 1, 7), (1, "1g.10gb", 1, 7)];
    w.upsert_node(&mig_node("s", 2, &layout, true));
    let mut asks = BTreeMap::new();
    for (i, k) in [2u32, 1, 3, 1, 1, 2, 1, 2, 1].into_iter().enumerate() {
        asks.insert(format!("p{i}"), ("nvidia.com/gpu".to_string(), k));
    }
    for (name, (r, k)) in &asks {
        add(&mut w, name, r, *k);
    }
    let binds = cycle(&w);
    let placed: u32 = binds.iter().map(|b| asks[&b.0].1).sum();
    assert_eq!(
        placed, 14,
        "filled to the 14 instances it advertises: {binds:?}"
    );
    let mut seen = BTreeSet::new();
    for (name, _, gpus) in &binds {
        let GpuAssignment::Mig {
            gpu,
            instances,
            milli,
        } = gpus
        else {
            panic!("{name}: {gpus:?}");
        };
        assert_eq!(instances.len() as u32, asks[name].1);
        assert_eq!(*milli, 142 * asks[name].1);
        for i in instances {
            assert!(seen.insert((*gpu, *i)), "instance held twice");
        }
    }
    bind_all(&mut w, &binds, &asks);
    assert_eq!(queue_usage(&w), 14 * 142);
    assert!(instances_held(&w).values().all(|n| *n == 1));
    assert!(cycle(&w).is_empty());
}

#[test]
fn single_strategy_beside_whole_gpus_is_withheld_with_a_warning() {
    let mut w = World::default();
    w.upsert_node(&mig_node("s", 1, &[(0, "1g.10gb", 1, 7)], true));
    w.upsert_node(&mig_node("b", 1, &[], false));
    add(&mut w, "p0", "nvidia.com/gpu", 1);
    add(&mut w, "p1", "nvidia.com/gpu", 1);
    let b = w.build();
    assert!(
        b.problems
            .iter()
            .any(|p| matches!(p, Problem::NodeWarning { node, warning }
            if node == "s" && warning.contains("migStrategy: mixed"))),
        "{:?}",
        b.problems
    );
    let binds = cycle(&w);
    assert_eq!(binds.len(), 1, "only b's whole GPU: {binds:?}");
    assert_eq!(binds[0].1, "b");
    assert!(matches!(binds[0].2, GpuAssignment::Whole(_)));
}

#[test]
fn the_agents_served_instances_win_over_the_decision() {
    // pods a and b got each other's instance (same profile): the agent's
    // allocations say so, and the scheduler follows them
    let mut w = World::default();
    let node = mig_node("a", 1, &[(0, "1g.10gb", 1, 7)], false);
    let mut asks = BTreeMap::new();
    asks.insert("a".to_string(), ("nvidia.com/mig-1g.10gb".to_string(), 1));
    asks.insert("b".to_string(), ("nvidia.com/mig-1g.10gb".to_string(), 1));
    w.upsert_node(&node);
    for (name, (r, k)) in &asks {
        add(&mut w, name, r, *k);
    }
    let binds = cycle(&w);
    bind_all(&mut w, &binds, &asks);
    let mut n2 = node.clone();
    let ann = n2.metadata.annotations.as_mut().unwrap();
    ann.insert(
        "gpusched.io/allocations".into(),
        json!({"v": 1, "pods": [
            {"uid": "uid-a", "namespace": "ml", "name": "a", "gpus": ["GPU-a-0"], "milli": 142, "mig": ["MIG-a-0-5"]},
        ]})
        .to_string(),
    );
    w.upsert_node(&n2);
    let held = instances_held(&w);
    assert!(held.contains_key(&("a".to_string(), 0, 5)), "{held:?}");
    assert!(held.values().all(|n| *n == 1), "{held:?}");
}

#[test]
fn instances_the_kubelet_does_not_offer_yet_are_not_placed() {
    // the agent published its layout; the kubelet has not registered the
    // MIG resource yet (allocatable 0)
    let mut w = World::default();
    let mut n = mig_node("a", 2, &[(0, "1g.10gb", 1, 7)], false);
    let alloc = n.status.as_mut().unwrap().allocatable.as_mut().unwrap();
    alloc.insert(
        "nvidia.com/mig-1g.10gb".into(),
        k8s_openapi::apimachinery::pkg::api::resource::Quantity("0".into()),
    );
    w.upsert_node(&n);
    add(&mut w, "p", "nvidia.com/mig-1g.10gb", 1);
    add(&mut w, "whole", "nvidia.com/gpu", 1);
    let b = w.build();
    let g = &b.snapshot.nodes[0].gpus;
    assert_eq!(g[0].health, gpusched_model::GpuHealth::NotAllocatable);
    assert!(
        g[1].is_healthy(),
        "the whole GPU is offered (nvidia.com/gpu: 1)"
    );
    let binds = cycle(&w);
    assert_eq!(binds.len(), 1, "{binds:?}");
    assert_eq!(binds[0].0, "whole");
    assert_eq!(binds[0].2, GpuAssignment::Whole(vec![1]));
    let mut s = gpusched_plugins::config::build(&Default::default()).unwrap();
    let out = s.cycle(&b.snapshot, 1_796_119_300_000, 1);
    let msg: Vec<String> = out.explanations.iter().map(|e| e.message()).collect();
    assert!(
        msg.iter().any(|m| m.contains("does not offer yet")),
        "{msg:?}"
    );
}

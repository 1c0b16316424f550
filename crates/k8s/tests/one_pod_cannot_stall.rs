//! No single pod's spec may stall the cycle for the others (issue #22, 2):
//! the world is fed the objects a real apiserver served, the default
//! scheduler runs cycles, and every ordinary pod must be bound.

use gpusched_core::Decision;
use gpusched_k8s::translate::{self, PodKind};
use gpusched_k8s::world::World;
use k8s_openapi::api::core::v1::{Node, Pod};
use serde_json::{Value, json};

fn node(name: &str) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100-SXM5-80GB", "nvidia.com/gpu.memory": "81559"}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8",
                            "gpusched.io/gpu-milli": "8000", "gpusched.io/gpu-memory-mib": "652472"},
            "conditions": [{"type": "Ready", "status": "True"}]
        }
    }))
    .unwrap()
}

fn pod(name: &str, limits: Value, node: Option<&str>) -> Pod {
    let mut annotations = json!({});
    if let Some(n) = node {
        // the decision an older scheduler wrote for a memory-only share
        annotations[gpusched_k8s::decision::ANNOTATION_DECISION] = json!(
            json!({"v": 1, "uid": format!("uid-{name}"), "node": n, "seq": 1,
                   "indices": [0], "gpus": [""], "share": {"milli": 0, "memory_mib": 1024}})
            .to_string()
        );
    }
    let mut spec = json!({"schedulerName": "gpusched", "containers": [
        {"name": "main", "image": "x", "resources": {"limits": limits}}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z", "annotations": annotations},
        "spec": spec,
        "status": {"phase": if node.is_some() {"Running"} else {"Pending"}}
    }))
    .unwrap()
}

/// A pod asking only `gpusched.io/gpu-memory-mib` is refused at
/// translation, naming the field; it is never placed.
#[test]
fn a_memory_only_share_is_refused_naming_the_field() {
    let v = translate::pod(&pod(
        "mem-only",
        json!({"gpusched.io/gpu-memory-mib": "1024"}),
        None,
    ));
    let PodKind::Invalid { error } = v.kind else {
        panic!("accepted: {:?}", v.kind)
    };
    assert!(error.contains("gpusched.io/gpu-milli"), "{error}");
}

/// With such a pod pending (or bound by an older version), every other pod
/// is still placed.
#[test]
fn a_memory_only_share_does_not_stall_the_others() {
    for bound in [false, true] {
        let mut w = World::default();
        for n in ["n1", "n2", "n3"] {
            w.upsert_node(&node(n));
        }
        w.upsert_pod(&pod(
            "mem-only",
            json!({"gpusched.io/gpu-memory-mib": "1024"}),
            bound.then_some("n1"),
        ));
        for i in 0..6 {
            w.upsert_pod(&pod(&format!("p{i}"), json!({"nvidia.com/gpu": "1"}), None));
        }
        let mut s =
            gpusched_plugins::config::build(&gpusched_plugins::SchedulerConfig::default()).unwrap();
        let built = w.build();
        let out = s.cycle(&built.snapshot, 1_796_119_300_000, 1);
        let binds: Vec<String> = out
            .decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Bind { pod, .. } => Some(built.pods[*pod as usize].name.clone()),
                _ => None,
            })
            .collect();
        for i in 0..6 {
            assert!(
                binds.contains(&format!("p{i}")),
                "bound={bound}: p{i} not bound; binds {binds:?}; explanations {:?}",
                out.explanations
            );
        }
        assert!(!binds.contains(&"mem-only".to_string()));
    }
}

/// Below translation: the default scheduler given a zero-milli share (a
/// pod that only names GPU memory) still places every other pod.
#[test]
fn the_core_places_others_next_to_a_zero_milli_share() {
    use gpusched_model::GpuRequest;
    use gpusched_testkit as tk;
    let nodes = ["n1", "n2", "n3"]
        .iter()
        .map(|n| tk::node(n).gpus(8).build())
        .collect();
    let mut pods = vec![];
    let mut odd = tk::pod("mem-only").build();
    odd.gpu = GpuRequest::Share {
        milli: 0,
        memory_mib: 1024,
    };
    pods.push(odd);
    for i in 0..6 {
        pods.push(tk::pod(&format!("p{i}")).gpus(1).arrival(i + 1).build());
    }
    let snap = tk::snapshot(nodes, vec![tk::queue("default")], vec![], pods);
    let mut s =
        gpusched_plugins::config::build(&gpusched_plugins::SchedulerConfig::default()).unwrap();
    let out = s.cycle(&snap, 10, 1);
    let binds = tk::binds(&snap, &out);
    for i in 0..6 {
        assert!(
            binds.contains_key(&format!("p{i}")),
            "p{i} not bound: {binds:?} {:?}",
            out.explanations
        );
    }
}

/// A node that advertises more GPUs than gpusched models is warned about
/// naming the cap, and a decision for all it uses fits the 16 KiB the
/// agent and the scheduler accept (issue #22, 13).
#[test]
fn the_gpu_cap_is_named_and_the_largest_decision_fits() {
    use gpusched_k8s::decision::{GpuDecision, MAX_DECISION_BYTES, make};
    use gpusched_k8s::translate::MAX_NODE_GPUS;
    let mut n = node("huge");
    n.status
        .as_mut()
        .unwrap()
        .allocatable
        .as_mut()
        .unwrap()
        .insert(
            "nvidia.com/gpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("4000".into()),
        );
    let v = translate::node(&n);
    assert_eq!(v.node.gpus.len() as u64, MAX_NODE_GPUS);
    assert!(
        v.warnings
            .iter()
            .any(|w| w.contains("4000") && w.contains("1024 GPUs per node")),
        "{:?}",
        v.warnings
    );
    let all = gpusched_core::GpuAssignment::Whole((0..MAX_NODE_GPUS as u32).collect());
    let d = make(
        "0123456789abcdef0123456789abcdef0123",
        &v.node,
        u64::MAX,
        &all,
    );
    let text = d.to_annotation();
    assert!(text.len() <= MAX_DECISION_BYTES, "{} bytes", text.len());
    assert_eq!(GpuDecision::parse(&text).unwrap().indices.len(), 1024);
}

/// The largest pod gpusched places gets a decision the agent accepts, even
/// with real (40-character) UUIDs; one GPU more is refused naming the cap.
#[test]
fn the_largest_pod_has_a_decision_the_agent_accepts() {
    use gpusched_k8s::decision::{GpuDecision, MAX_DECISION_BYTES};
    use gpusched_k8s::translate::MAX_POD_GPUS;
    let d = GpuDecision {
        v: 1,
        uid: "0123456789abcdef0123456789abcdef0123".into(),
        node: "a-node-name-of-sixty-three-characters-which-is-the-dns-max-xxxx".into(),
        seq: u64::MAX,
        indices: (1000..1000 + MAX_POD_GPUS).collect(),
        gpus: (0..MAX_POD_GPUS)
            .map(|i| format!("GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd"))
            .collect(),
        share: None,
        mig: None,
    };
    assert_eq!(d.gpus[0].len(), 40);
    let n = d.to_annotation().len();
    assert!(n <= MAX_DECISION_BYTES, "{n} bytes");
    let v = translate::pod(&pod(
        "wide",
        json!({"nvidia.com/gpu": (MAX_POD_GPUS + 1).to_string()}),
        None,
    ));
    let PodKind::Invalid { error } = v.kind else {
        panic!("{:?}", v.kind)
    };
    assert!(
        error.contains("more than the 256 gpusched places in one pod"),
        "{error}"
    );
}

//! The scheduler's snapshot in-process (issue 27): a world of N kwok-style
//! nodes × 8 H100 and P 1-GPU pods (half bound, round robin; a third of
//! them in gangs of 8), as the watches fill it. Measured, per call:
//!
//! - **full**: `World::build`, every part from scratch (what every cycle
//!   cost before the incremental snapshot, and the reference it is checked
//!   against);
//! - **idle**: `World::snapshot` when nothing changed;
//! - **1 pod**: `World::snapshot` after one pending pod arrived;
//! - **1 bind**: after one pending pod was assumed bound (what a cycle's
//!   own decision changes);
//! - **100 binds**: after 100 assumptions (a busy drain cycle);
//! - **1 node**: after one node's labels changed.
//!
//! ```text
//! cargo bench -p gpusched-k8s --bench snapshot -- [nodes] [pods]   # default 1250 10000
//! ```

use gpusched_core::GpuAssignment;
use gpusched_k8s::kwok::node_object;
use gpusched_k8s::world::{Assumed, World};
use k8s_openapi::api::core::v1::Pod;
use serde_json::json;
use std::time::Instant;

fn pod(i: usize, node: Option<&str>) -> Pod {
    let mut labels = json!({"app": "bench"});
    if i.is_multiple_of(3) {
        labels["gpusched.io/pod-group"] = json!(format!("g-{}", i / 24));
    }
    let mut spec = json!({"schedulerName": "gpusched", "containers": [{"name": "main", "image": "x",
        "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "128Mi"}}}]});
    if let Some(n) = node {
        spec["nodeName"] = json!(n);
    }
    serde_json::from_value(json!({
        "metadata": {"name": format!("p-{i}"), "namespace": "bench", "uid": format!("u{i:07}"),
          "creationTimestamp": format!("2026-12-01T10:{:02}:{:02}Z", (i / 60) % 60, i % 60),
          "labels": labels},
        "spec": spec,
        "status": {"phase": if node.is_some() {"Running"} else {"Pending"}}
    }))
    .unwrap()
}

/// Milliseconds per call of `f`, the median of `k` calls after `prep`.
fn time(k: usize, mut prep: impl FnMut(usize), mut f: impl FnMut()) -> f64 {
    let mut v = Vec::with_capacity(k);
    for i in 0..k {
        prep(i);
        let t = Instant::now();
        f();
        v.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    v.sort_by(f64::total_cmp);
    v[k / 2]
}

fn main() {
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let n_nodes: usize = args.first().and_then(|a| a.parse().ok()).unwrap_or(1250);
    let n_pods: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(10000);
    let yaml = format!(
        "nodes:\n  - name: gpu\n    count: {n_nodes}\n    cpu: \"256\"\n    memory: 2Ti\n    gpus: {{count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}\n"
    );
    let spec: gpusched_model::spec::ClusterSpec = serde_saphyr::from_str(&yaml).unwrap();
    let nodes: Vec<_> = spec.build().unwrap().into_iter().map(|b| b.node).collect();
    let mut w = World::default();
    for n in &nodes {
        w.upsert_node(&node_object(n));
    }
    for i in 0..n_pods {
        let on = i
            .is_multiple_of(2)
            .then(|| nodes[(i / 2) % nodes.len()].name.as_str());
        w.upsert_pod(&pod(i, on));
    }
    let t = Instant::now();
    let first = w.snapshot();
    let first_ms = t.elapsed().as_secs_f64() * 1000.0;
    let pending: Vec<String> = first
        .pods
        .iter()
        .zip(&first.snapshot.pods)
        .filter(|(_, p)| p.is_pending())
        .map(|(r, _)| r.uid.clone())
        .collect();
    let k = 15;
    let full = time(k, |_| {}, || drop(w.build()));
    let idle = time(k, |_| {}, || drop(w.snapshot()));
    let mut next = n_pods;
    let w1 = std::cell::RefCell::new(w);
    let one_pod = time(
        k,
        |_| {
            w1.borrow_mut().upsert_pod(&pod(next, None));
            next += 1;
        },
        || drop(w1.borrow_mut().snapshot()),
    );
    let mut bound = 0;
    let mut assume = |w: &mut World, n: usize| {
        for _ in 0..n {
            let uid = &pending[bound % pending.len()];
            let node = &nodes[bound % nodes.len()];
            w.assume(
                uid,
                Assumed {
                    node: node.name.clone(),
                    decision: gpusched_k8s::decision::make(
                        uid,
                        node,
                        1,
                        &GpuAssignment::Whole(vec![7]),
                    ),
                    gpus: GpuAssignment::Whole(vec![7]),
                },
            );
            bound += 1;
        }
    };
    let one_bind = time(
        k,
        |_| assume(&mut w1.borrow_mut(), 1),
        || drop(w1.borrow_mut().snapshot()),
    );
    let hundred = time(
        k,
        |_| assume(&mut w1.borrow_mut(), 100),
        || drop(w1.borrow_mut().snapshot()),
    );
    let one_node = time(
        k,
        |i| {
            let mut n = nodes[i % nodes.len()].clone();
            n.labels.insert("bench".into(), format!("{i}"));
            w1.borrow_mut().upsert_node(&node_object(&n));
        },
        || drop(w1.borrow_mut().snapshot()),
    );
    let load = std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default();
    println!(
        "{n_nodes} nodes, {n_pods} pods (load {load}), median ms per call: first {first_ms:.1} | full build {full:.1} | idle {idle:.1} | 1 pod {one_pod:.1} | 1 bind {one_bind:.1} | 100 binds {hundred:.1} | 1 node {one_node:.1}"
    );
}

//! proptest strategies for random clusters and workloads.

use crate::{gang, node, pod, queue};
use gpusched_core::Snapshot;
use gpusched_model::*;
use proptest::prelude::*;

/// A random cluster of 1–12 nodes with 0–8 GPUs of two models, some
/// unhealthy GPUs, racks, and a tainted node now and then.
pub fn cluster() -> impl Strategy<Value = Vec<Node>> {
    prop::collection::vec(
        (
            0u32..=8,
            any::<bool>(),
            0u32..3,
            any::<bool>(),
            prop::option::of(0u32..8),
        ),
        1..12,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(i, (g, nvs, rack, taint, bad))| {
                let mut b = node(&format!("n{i}"))
                    .gpus(g)
                    .model(if i % 3 == 0 { "A100" } else { "H100" })
                    .rack(&format!("r{rack}"))
                    .cpu("32");
                if nvs {
                    b = b.nvswitch();
                }
                if taint && i % 4 == 0 {
                    b = b.taint("dedicated", "x", TaintEffect::NoSchedule);
                }
                if let Some(x) = bad
                    && x < g
                {
                    b = b.unhealthy_gpu(x);
                }
                b.build()
            })
            .collect()
    })
}

/// One random pod: (queue 0–2, gpu kind, priority, group 0–3 or none).
fn pod_spec() -> impl Strategy<Value = (u8, u8, i32, Option<u8>, u64)> {
    (
        0u8..3,
        0u8..8,
        -1i32..3,
        prop::option::of(0u8..4),
        1000u64..8000,
    )
}

/// A random snapshot: a cluster, three queues (weights, guarantees, a
/// limit), gangs, and a mix of pending and running pods (running pods are
/// placed by a first cycle, so the snapshot is consistent).
pub fn workload() -> impl Strategy<Value = (Snapshot, u64)> {
    (
        cluster(),
        prop::collection::vec(pod_spec(), 0..40),
        any::<u64>(),
        1u32..4,
    )
        .prop_map(|(nodes, pods, seed, min)| {
            let mut qa = queue("a");
            qa.weight = 2;
            let mut qb = queue("b");
            qb.guarantee.gpu_milli = 4000;
            let mut qc = queue("c");
            qc.limit = Some(ResourceLimit::gpus(6000));
            qc.can_borrow = true;
            let queues = vec![qa, qb, qc];
            let mut groups = Vec::new();
            for g in 0..4 {
                let mut pg = gang(&format!("g{g}"), ["a", "b", "c"][g % 3], min);
                pg.priority = g as i32 - 1;
                groups.push(pg);
            }
            let mut out = Vec::new();
            for (i, (q, kind, prio, grp, cpu)) in pods.into_iter().enumerate() {
                let mut b = pod(&format!("p{i:03}"))
                    .cpu_milli(cpu)
                    .priority(prio)
                    .arrival(i as u64 * 10);
                b = match kind {
                    0 => b,
                    1 => b.share(300),
                    2 => b.share(700),
                    3 | 4 => b.gpus(1),
                    5 => b.gpus(2),
                    6 => b.gpus(4).models(&["H100"]),
                    _ => b.gpus(8),
                };
                if let Some(g) = grp {
                    let g = g as usize;
                    b = b
                        .group(&format!("g{g}"))
                        .queue(["a", "b", "c"][g % 3])
                        .priority(groups[g].priority);
                } else {
                    b = b.queue(["a", "b", "c"][q as usize]);
                }
                out.push(b.build());
            }
            (crate::snapshot(nodes, queues, groups, out), seed)
        })
}

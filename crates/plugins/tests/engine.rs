//! The incremental core with the default plugins (the gpusched packer, which
//! keeps its workload profile's class counts from the pods added and
//! removed, and the Pod API constraints): arrivals of mixed shapes, binds
//! reported back, pods finishing — every cycle checked against the full
//! pass by the engine's oracle.

use gpusched_core::engine::{Change, PodAt, binds_as_changes};
use gpusched_core::{Decision, Engine};
use gpusched_plugins::{SchedulerConfig, build};
use gpusched_testkit::{node, pod, queue};

#[test]
fn the_engine_with_the_default_plugins_decides_as_the_full_pass() {
    let mut engine = Engine::new(build(&SchedulerConfig::default()).unwrap());
    engine.verify_with(build(&SchedulerConfig::default()).unwrap());
    for i in 0..8 {
        let model = if i % 2 == 0 { "H100" } else { "A100" };
        engine
            .apply(Change::Node(
                node(&format!("n{i}"))
                    .gpus(8)
                    .model(model)
                    .cpu("64")
                    .build(),
            ))
            .unwrap();
    }
    engine.apply(Change::Queue(queue("a"))).unwrap();
    let mut running: Vec<String> = Vec::new();
    let mut bound = 0;
    for step in 0..60u64 {
        let now = step * 1_000;
        // one or two arrivals of a mix of shapes
        for k in 0..=(step % 2) {
            let b = pod(&format!("p{step}-{k}")).queue("a").arrival(now);
            let b = match (step + k) % 5 {
                0 => b.gpus(1),
                1 => b.gpus(2).models(&["H100"]),
                2 => b.share(500),
                3 => b.gpus(8),
                _ => b.cpu_milli(4000),
            };
            engine
                .apply(Change::Pod(
                    std::sync::Arc::new(b.build()),
                    PodAt::pending(),
                ))
                .unwrap();
        }
        // every fourth step the oldest running pod finishes
        if step % 4 == 3 && !running.is_empty() {
            let gone = running.remove(0);
            engine.apply(Change::PodGone(gone)).unwrap();
        }
        let out = engine.cycle(now, step);
        for d in &out.decisions {
            if let Decision::Bind { pod, .. } = d {
                running.push(engine.snapshot().pods[*pod as usize].pod.name.clone());
                bound += 1;
            }
        }
        let binds = binds_as_changes(&engine, &out, now);
        engine.apply_all(binds).unwrap();
        assert!(
            engine.divergences().is_empty(),
            "step {step}: {:?}",
            engine.divergences()
        );
    }
    assert!(bound > 40, "{bound} binds");
    // the 8-GPU pods that arrived once the cluster filled were parked
    assert!(
        engine.stats().parked > 0 || engine.stats().woken_all > 0,
        "{:?}",
        engine.stats()
    );
}

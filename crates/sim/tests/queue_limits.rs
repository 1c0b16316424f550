//! A queue limit caps only the resources it names: a limit on GPUs alone
//! leaves CPU and memory free, so the queue's pods run, a GPU at a time
//! beyond the cap waits.

mod common;

/// `capped` may hold 2 GPUs; three 1-GPU jobs that also ask for CPU and
/// memory arrive together. The cluster has 16 free GPUs, so only the limit
/// makes the third wait for one of the first two (1 h).
const WORKLOAD: &str = "queues:
  - {name: capped, limit: {nvidia.com/gpu: \"2\"}}
jobs:
  - {name: j, queue: capped, count: 3, duration: 1h, requests: {cpu: \"8\", memory: 64Gi, nvidia.com/gpu: \"1\"}}
";

fn scenario(workload: &str) -> gpusched_sim::Scenario {
    common::tiny_with(workload)
}

/// Runs and returns the waits (p50, p99, seconds) of queue `capped`.
fn waits(workload: &str) -> (f64, f64) {
    let r = common::run_verified(scenario(workload), 1);
    common::assert_clean(&r);
    assert_eq!(r.totals.jobs_completed, 3, "{:#?}", r.totals);
    let q = r.queues.iter().find(|q| q.name == "capped").unwrap();
    (q.wait_p50_s, q.wait_p99_s)
}

#[test]
fn a_gpu_only_limit_caps_gpus_and_nothing_else() {
    let limit = scenario(WORKLOAD).queues[0].limit.clone().expect("a limit");
    assert_eq!(limit.gpu_milli, Some(2000));
    assert_eq!(limit.cpu_milli, None, "CPU was not named");
    assert_eq!(limit.memory, None, "memory was not named");
    // Two start at once; the third waits about an hour for a GPU.
    let (p50, p99) = waits(WORKLOAD);
    assert!(p50 < 60.0, "p50 {p50}");
    assert!(p99 >= 3000.0, "p99 {p99}");
}

#[test]
fn a_named_cpu_limit_still_caps_cpu() {
    // 8 GPUs allowed but 20 cores for jobs of 8: the third waits on CPU.
    let w = WORKLOAD.replace(
        "limit: {nvidia.com/gpu: \"2\"}",
        "limit: {nvidia.com/gpu: \"8\", cpu: \"20\"}",
    );
    assert_ne!(w, WORKLOAD);
    let limit = scenario(&w).queues[0].limit.clone().expect("a limit");
    assert_eq!(limit.cpu_milli, Some(20_000));
    let (p50, p99) = waits(&w);
    assert!(p50 < 60.0, "p50 {p50}");
    assert!(p99 >= 3000.0, "p99 {p99}");
}

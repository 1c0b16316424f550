//! What the agent publishes on its node: facts, health, MIG layout and
//! replicas, and the allocations of swapped pods.

use super::*;

fn published_health(f: &gpusched_node_agent::coord::NodeFacts) -> Vec<bool> {
    let v: Vec<NodeGpu> = serde_json::from_str(&f.annotations["gpusched.io/gpus"]).unwrap();
    v.iter().map(|g| g.healthy).collect()
}

#[tokio::test]
async fn node_facts_and_health_are_published() {
    let r = Rig::start(vec![], true, true).await;
    let first = {
        let t = Instant::now();
        loop {
            if let Some(f) = r.t.node.0.lock().unwrap().first().cloned() {
                break f.1;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "nothing published");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    assert_eq!(first.labels["nvidia.com/gpu.product"], "H100-SXM5-80GB");
    assert_eq!(first.labels["nvidia.com/gpu.count"], "8");
    assert_eq!(published_health(&first), vec![true; 8]);
    assert_eq!(
        first.capacity["gpusched.io/gpu-memory-mib"],
        (8 * 81920).to_string()
    );
    let t0 = Instant::now();
    r.control("unhealthy 2");
    let latency = loop {
        let last = r.t.node.0.lock().unwrap().last().cloned().unwrap();
        if !published_health(&last.1)[2] {
            break last.0 - t0;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "health not published"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("unhealthy GPU published after {latency:?}");
    let last = r.t.node.0.lock().unwrap().last().cloned().unwrap().1;
    assert_eq!(
        last.capacity["gpusched.io/gpu-memory-mib"],
        (7 * 81920).to_string()
    );
    assert!(latency < Duration::from_secs(1));
}

/// MIG layout and time-slicing replicas reach the Node as GFD labels.
#[tokio::test]
async fn mig_layout_and_replicas_are_published() {
    use gpusched_node_agent::config::{MigStrategy, Replication};
    let dir = tempfile::tempdir().unwrap();
    let k = FakeKubelet::start(dir.path()).await;
    let t = TestSide::new(true);
    let mut s = settings(dir.path(), "mig-a100.yaml");
    s.node_name = Some("a100".into());
    s.mig_strategy = MigStrategy::Mixed;
    s.replication = vec![Replication {
        name: "nvidia.com/mig-1g.10gb".into(),
        replicas: 4,
        advertised: "nvidia.com/mig-1g.10gb".into(),
    }];
    s.pod_resources_socket = dir.path().join("none.sock");
    let agent = start_agent_with(s, t.side("a100", true));
    k.next_registration(Duration::from_secs(10)).await;
    let t0 = Instant::now();
    let facts = loop {
        if let Some(f) = t.node.0.lock().unwrap().first().cloned() {
            break f.1;
        }
        assert!(t0.elapsed() < Duration::from_secs(5), "nothing published");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let l = &facts.labels;
    assert_eq!(l["nvidia.com/mig.strategy"], "mixed", "{l:?}");
    assert_eq!(l["nvidia.com/mig-1g.10gb.count"], "7", "{l:?}");
    assert_eq!(l["nvidia.com/mig-1g.10gb.replicas"], "4", "{l:?}");
    assert_eq!(l["nvidia.com/mig-3g.40gb.count"], "2", "{l:?}");
    agent.shutdown().await.unwrap();
}

/// The pods in the last published `gpusched.io/allocations`, as
/// (name, GPU indices), waiting up to 10 s for `ok` to hold.
async fn published_allocations(
    r: &Rig,
    ok: impl Fn(&[(String, Vec<usize>)]) -> bool,
) -> Vec<(String, Vec<usize>)> {
    let u = uuids();
    let t = Instant::now();
    loop {
        let got: Vec<(String, Vec<usize>)> = r
            .t
            .node
            .0
            .lock()
            .unwrap()
            .last()
            .and_then(|f| f.1.annotations.get("gpusched.io/allocations").cloned())
            .map(|a| {
                let v: serde_json::Value = serde_json::from_str(&a).unwrap();
                v["pods"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|p| {
                        let mut g: Vec<usize> = p["gpus"]
                            .as_array()
                            .unwrap()
                            .iter()
                            .filter_map(|x| u.iter().position(|y| Some(y.as_str()) == x.as_str()))
                            .collect();
                        g.sort_unstable();
                        (p["name"].as_str().unwrap().to_string(), g)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if ok(&got) || t.elapsed() > Duration::from_secs(10) {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Issue 29 item 3: an agent restart lost swapped pods. Pods of one size
/// admitted onto each other's decided GPUs (and a pending pod whose
/// decided GPU a swapped pod holds) are rebuilt from PodResources exactly:
/// the published allocations list every admitted pod with the GPUs it
/// really holds, and the pending pod is served the GPU left free.
#[tokio::test]
async fn restart_rebuilds_swapped_pods_from_pod_resources() {
    let pods = vec![
        whole("a", "2026-01-01T00:00:01Z", &[0]),
        whole("b", "2026-01-01T00:00:01Z", &[1]),
        whole("c", "2026-01-01T00:00:01Z", &[2, 3]),
        whole("d", "2026-01-01T00:00:01Z", &[4, 5]),
        whole("e", "2026-01-01T00:00:01Z", &[6]),
        whole("f", "2026-01-01T00:00:01Z", &[7]),
    ];
    let mut r = Rig::start(pods, true, true).await;
    // What the kubelet had handed out before the restart: a got f's GPU,
    // c and d each other's; f is not admitted yet.
    for (name, idx) in [
        ("a", &[7][..]),
        ("b", &[1]),
        ("c", &[4, 5]),
        ("d", &[2, 3]),
        ("e", &[6]),
    ] {
        r.pr.hold("default", name, "nvidia.com/gpu", &ids(idx));
    }
    r.restart().await;
    let want = vec![
        ("a".to_string(), vec![7]),
        ("b".to_string(), vec![1]),
        ("c".to_string(), vec![4, 5]),
        ("d".to_string(), vec![2, 3]),
        ("e".to_string(), vec![6]),
    ];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
    let mut c = r.gpu().await;
    // f is steered to the GPU nobody holds, and served.
    let free = ids(&[0]);
    assert_eq!(preferred(&mut c, &free, 1).await, free);
    assert!(allocate(&mut c, &free).await.is_ok());
    let mut want = want;
    want.push(("f".to_string(), vec![0]));
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
}

/// Issue 29 item 1 (the scheduler must learn where pods really are): two
/// 1-GPU pods admitted in the order other than the agent guessed are
/// charged to each other's decision. PodResources, read after each
/// Allocate, tells who holds what: the published allocations name each
/// pod's real GPU, and when one pod ends the GPU it really held is free for
/// the next decision (no conflict with the other pod's charge).
#[tokio::test]
async fn swapped_pods_are_published_as_they_are_and_free_their_real_gpus() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("b", "2026-01-01T00:00:01Z", &[1]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // b's binding arrived first: the agent guesses a (older seq / name).
    let p = preferred(&mut c, &ids(&[0, 1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "b", "nvidia.com/gpu", &p);
    let p = preferred(&mut c, &ids(&[1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[1]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "a", "nvidia.com/gpu", &p);
    let t0 = Instant::now();
    let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0])];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
    let took = t0.elapsed();
    eprintln!("real holders published {took:?} after the second Allocate");
    // Read ~200 ms after the call and published at once, not at the next
    // 5 s refresh: the scheduler's next decision should see it.
    assert!(took < Duration::from_secs(2), "{took:?}");
    // b ends; the scheduler, reading the allocations, decides GPU 0 (the
    // one b really held) for pod n.
    r.pr.held.lock().unwrap().retain(|p| p.name != "b");
    sync_pods(
        &r,
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("n", "2026-01-01T00:00:09Z", &[0]),
        ],
    )
    .await;
    // a's decision says GPU 0 but a holds GPU 1: n's decision is not a
    // conflict, and n is served GPU 0.
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[0, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "n", "nvidia.com/gpu", &p);
    let want = vec![("a".to_string(), vec![1]), ("n".to_string(), vec![0])];
    let got = published_allocations(&r, |g| g == want.as_slice()).await;
    assert_eq!(got, want);
}

/// Issue 29 item 4: a refused Allocate posted no GpuAllocationRefused on the
/// pod that could have called it when its decision was partly served by a
/// call of another size: every pending pod that could be the caller gets
/// the event.
#[tokio::test]
async fn refused_allocate_is_reported_on_a_partly_served_pod() {
    let r = Rig::start(
        vec![whole("d", "2026-01-01T00:00:01Z", &[6, 7])],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // A call of 1 GPU on GPU 6 (no decision expects 1: charged to d).
    allocate(&mut c, &ids(&[6])).await.unwrap();
    // Then 2 GPUs nobody decided: refused, reported on d.
    let e = allocate(&mut c, &ids(&[2, 3])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    let ev = r.t.events();
    assert!(
        ev.iter().any(|x| x.0 == "default/d"
            && x.1 == "GpuAllocationRefused"
            && x.2.contains("holds GPUs [2")),
        "{ev:?}"
    );
}

/// Until the scheduler counts pods by `gpusched.io/allocations`, it frees a
/// swapped pod's decided GPUs when it ends, and decides them again while
/// the other pod of the swap really holds them. Such a decision is not
/// refused: it is served the GPU really free, which the scheduler still
/// counts as held by the other pod.
#[tokio::test]
async fn decision_onto_a_gpu_a_swapped_pod_holds_gets_the_free_one() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("b", "2026-01-01T00:00:01Z", &[1]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // b first, charged to a's decision: b holds 0, then a holds 1.
    allocate(&mut c, &ids(&[0])).await.unwrap();
    r.pr.hold("default", "b", "nvidia.com/gpu", &ids(&[0]));
    allocate(&mut c, &ids(&[1])).await.unwrap();
    r.pr.hold("default", "a", "nvidia.com/gpu", &ids(&[1]));
    let want = vec![("a".to_string(), vec![1]), ("b".to_string(), vec![0])];
    assert_eq!(
        published_allocations(&r, |g| g == want.as_slice()).await,
        want
    );
    // b ends; a scheduler counting by decisions frees GPU 1 and decides it
    // for n, though a holds it.
    r.pr.held.lock().unwrap().retain(|p| p.name != "b");
    sync_pods(
        &r,
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[0]),
            whole("n", "2026-01-01T00:00:09Z", &[1]),
        ],
    )
    .await;
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[0, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[0]));
    allocate(&mut c, &p).await.unwrap();
    r.pr.hold("default", "n", "nvidia.com/gpu", &p);
    let want = vec![("a".to_string(), vec![1]), ("n".to_string(), vec![0])];
    assert_eq!(
        published_allocations(&r, |g| g == want.as_slice()).await,
        want
    );
    // a ends: the scheduler frees GPU 0 (a's decision) and decides it for
    // m; n really holds 0, so m is served GPU 1.
    r.pr.held.lock().unwrap().retain(|p| p.name != "a");
    sync_pods(
        &r,
        vec![
            whole("n", "2026-01-01T00:00:09Z", &[1]),
            whole("m", "2026-01-01T00:00:10Z", &[0]),
        ],
    )
    .await;
    let ev = r.t.events();
    assert!(!ev.iter().any(|e| e.1 == "GpuDecisionRefused"), "{ev:?}");
    let p = preferred(&mut c, &ids(&[1, 2, 3, 4, 5, 6, 7]), 1).await;
    assert_eq!(p, ids(&[1]));
    allocate(&mut c, &p).await.unwrap();
}

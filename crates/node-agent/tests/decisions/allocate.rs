//! One pod at a time: Allocate and GetPreferredAllocation steered to the
//! decision, tampered and overlapping decisions, shares, restarts.

use super::*;

#[tokio::test]
async fn two_pods_same_size_get_their_own_gpus() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[2]),
            whole("b", "2026-01-01T00:00:02Z", &[5]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    // The kubelet admits `a` first (older): steered to a's GPU.
    assert_eq!(preferred(&mut c, &all, 1).await, ids(&[2]));
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[2])).await.unwrap()),
        ids(&[2])[0]
    );
    // Then `b`: GPU 2 is no longer available to the kubelet.
    let rest = ids(&[0, 1, 3, 4, 5, 6, 7]);
    assert_eq!(preferred(&mut c, &rest, 1).await, ids(&[5]));
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[5])).await.unwrap()),
        ids(&[5])[0]
    );
    // A third container asking a GPU nobody was given: fail closed.
    let e = allocate(&mut c, &ids(&[3])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("no pod placed on node dgx-h100 by gpusched holds GPUs [3"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn admitted_in_reverse_order_still_one_owner_per_gpu() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[2]),
            whole("b", "2026-01-01T00:00:02Z", &[5]),
        ],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    // The kubelet ignores the preference and picks b's GPU first.
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[5])).await.unwrap()),
        ids(&[5])[0]
    );
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[2])).await.unwrap()),
        ids(&[2])[0]
    );
    // Nothing else is free: both decisions are served.
    let e = allocate(&mut c, &ids(&[0])).await.unwrap_err();
    assert!(
        e.message().contains("pending decisions: none"),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn allocate_retry_is_idempotent() {
    let r = Rig::start(
        vec![whole("a", "2026-01-01T00:00:01Z", &[0, 1])],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let first = allocate(&mut c, &ids(&[0, 1])).await.unwrap();
    let again = allocate(&mut c, &ids(&[1, 0])).await.unwrap();
    assert_eq!(
        visible(&first),
        visible(&again)
            .split(',')
            .rev()
            .collect::<Vec<_>>()
            .join(",")
    );
    // One of the pod's GPUs alone (an init container reused by an app
    // container) is the same pod's too.
    assert!(allocate(&mut c, &ids(&[1])).await.is_ok());
}

#[tokio::test]
async fn eight_gpu_pod_is_steered_to_its_decision() {
    let r = Rig::start(
        vec![whole(
            "big",
            "2026-01-01T00:00:01Z",
            &[0, 1, 2, 3, 4, 5, 6, 7],
        )],
        true,
        true,
    )
    .await;
    let mut c = r.gpu().await;
    let all = ids(&[7, 6, 5, 4, 3, 2, 1, 0]);
    let mut p = preferred(&mut c, &all, 8).await;
    p.sort();
    let mut want = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    want.sort();
    assert_eq!(p, want);
    assert!(allocate(&mut c, &all).await.is_ok());
}

#[tokio::test]
async fn tampered_decision_is_refused() {
    let a = whole("a", "2026-01-01T00:00:01Z", &[2]);
    // `c` carries a copy of a's decision (another pod's uid).
    let copied = pod("c", "2026-01-01T00:00:02Z", a.decision.clone());
    let garbage = pod("d", "2026-01-01T00:00:03Z", Some("{not json".into()));
    let wrong_uuid = pod(
        "e",
        "2026-01-01T00:00:04Z",
        Some(decision("uid-e", &[6], None).replace(&uuids()[6], "GPU-forged")),
    );
    let r = Rig::start(vec![a, copied, garbage, wrong_uuid], true, true).await;
    let ev = r.t.events();
    let refused: Vec<&str> = ev
        .iter()
        .filter(|e| e.1 == "GpuDecisionRefused")
        .map(|e| e.0.as_str())
        .collect();
    assert!(refused.contains(&"default/c"), "{ev:?}");
    assert!(refused.contains(&"default/d"), "{ev:?}");
    assert!(refused.contains(&"default/e"), "{ev:?}");
    let mut c = r.gpu().await;
    // The kubelet gives the forged pods some free GPU: refused, and the
    // message names the refused decisions.
    let e = allocate(&mut c, &ids(&[6])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("default/c: decision was made for pod uid \"uid-a\""),
        "{}",
        e.message()
    );
    assert!(
        e.message()
            .contains("default/d: annotation gpusched.io/decision is malformed"),
        "{}",
        e.message()
    );
    assert!(e.message().contains("is GPU-"), "{}", e.message());
    // The real owner still gets its GPU.
    assert!(allocate(&mut c, &ids(&[2])).await.is_ok());
}

#[tokio::test]
async fn overlapping_decisions_first_wins() {
    let r = Rig::start(
        vec![
            whole("a", "2026-01-01T00:00:01Z", &[3]),
            whole("b", "2026-01-01T00:00:02Z", &[3, 4]),
        ],
        true,
        true,
    )
    .await;
    let ev = r.t.events();
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/b" && e.2.contains("GPU 3 is already held by pod default/a")),
        "{ev:?}"
    );
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[3])).await.is_ok());
    assert!(allocate(&mut c, &ids(&[4])).await.is_err());
}

#[tokio::test]
async fn unhealthy_decided_gpu_is_refused() {
    let r = Rig::start(vec![whole("a", "2026-01-01T00:00:01Z", &[1])], true, true).await;
    r.control("unhealthy 1");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut c = r.gpu().await;
    let e = allocate(&mut c, &ids(&[1])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(e.message().contains("unhealthy"), "{}", e.message());
}

#[tokio::test]
async fn allocate_refreshes_on_miss() {
    // No watch: the pod bound after start is only seen by a fresh LIST.
    let r = Rig::start(vec![], false, true).await;
    r.t.pods.add(whole("late", "2026-01-01T00:00:01Z", &[4]));
    let before = r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
    assert_eq!(
        r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
}

/// Issue 29, seen on a real kubelet: it admitted a pod before the agent's
/// watch had the pod; the preference, made without the decision, named a
/// GPU the decision's `Allocate` then refused. A miss takes a fresh LIST.
#[tokio::test]
async fn preferred_allocation_refreshes_on_miss() {
    let r = Rig::start(vec![], false, true).await;
    r.t.pods.add(whole("late", "2026-01-01T00:00:01Z", &[4]));
    let before = r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst);
    let mut c = r.gpu().await;
    let all = ids(&[0, 1, 2, 3, 4, 5, 6, 7]);
    assert_eq!(preferred(&mut c, &all, 1).await, ids(&[4]));
    assert_eq!(
        r.t.pods.lists.load(std::sync::atomic::Ordering::SeqCst),
        before + 1
    );
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
}

/// Issue 29, seen on a real kubelet (bursts of mixed shares): a 500-milli
/// call came before the watch had the 500-milli pod and was charged to the
/// 600-milli decision (it had that much left); the 600 call then went to
/// the 700 decision and the 700 call found nothing. A call no decision
/// expects exactly takes a fresh LIST first.
#[tokio::test]
async fn a_call_no_decision_expects_exactly_lists_the_pods_first() {
    let s6 = pod(
        "s6",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s6", &[7], Some((600, 0)))),
    );
    let r = Rig::start(vec![s6], false, true).await;
    r.t.pods.add(pod(
        "s1",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s1", &[3], Some((500, 0)))),
    ));
    let mut c = r.share().await;
    let resp = allocate(&mut c, &tokens(0, 0, 500)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[3], "the 500 call gets s1's GPU");
    let resp = allocate(&mut c, &tokens(1, 0, 600)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[7], "the 600 call gets s6's GPU");
    // whole GPUs likewise: a 1-GPU call is not charged to a 2-GPU decision
    let r = Rig::start(
        vec![whole("two", "2026-01-01T00:00:01Z", &[4, 5])],
        false,
        true,
    )
    .await;
    r.t.pods.add(whole("one", "2026-01-01T00:00:02Z", &[6]));
    let mut c = r.gpu().await;
    allocate(&mut c, &ids(&[6])).await.unwrap();
    allocate(&mut c, &ids(&[4, 5])).await.unwrap();
}

#[tokio::test]
async fn without_require_decision_unmatched_calls_are_served() {
    let r = Rig::start(vec![], true, false).await;
    let mut c = r.gpu().await;
    assert!(allocate(&mut c, &ids(&[4])).await.is_ok());
}

#[tokio::test]
async fn share_gets_the_recorded_gpu_and_env() {
    let s = pod(
        "s",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s", &[3], Some((300, 8192)))),
    );
    let r = Rig::start(vec![s], true, true).await;
    let mut c = r.share().await;
    let mut all = Vec::new();
    for g in 0..8 {
        all.extend(tokens(g, 0, 1000));
    }
    let p = preferred(&mut c, &all, 300).await;
    assert_eq!(p, tokens(3, 0, 300));
    // Even tokens of another GPU (the kubelet ignoring us) give GPU 3.
    let resp = allocate(&mut c, &tokens(0, 0, 300)).await.unwrap();
    assert_eq!(visible(&resp), uuids()[3]);
    assert_eq!(resp.envs["GPUSCHED_GPU_MILLI"], "300");
    assert_eq!(resp.envs["GPUSCHED_GPU_MEMORY_LIMIT_MIB"], "8192");
    assert_eq!(resp.envs["CUDA_DEVICE_MEMORY_LIMIT_0"], "8192m");
    assert_eq!(resp.envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], "30");
    // Served: a second share of 300 has no decision.
    let e = allocate(&mut c, &tokens(3, 300, 300)).await.unwrap_err();
    assert!(
        e.message().contains(
            "no pod placed on node dgx-h100 by gpusched has a pending GPU share of 300 milli"
        ),
        "{}",
        e.message()
    );
}

#[tokio::test]
async fn shares_never_exceed_a_gpu() {
    let r = Rig::start(
        vec![
            pod(
                "s1",
                "2026-01-01T00:00:01Z",
                Some(decision("uid-s1", &[1], Some((600, 0)))),
            ),
            pod(
                "s2",
                "2026-01-01T00:00:02Z",
                Some(decision("uid-s2", &[1], Some((600, 0)))),
            ),
            pod(
                "w",
                "2026-01-01T00:00:03Z",
                Some(decision("uid-w", &[1], None)),
            ),
        ],
        true,
        true,
    )
    .await;
    let ev = r.t.events();
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/s2" && e.2.contains("GPU 1 has 600 milli")),
        "{ev:?}"
    );
    assert!(
        ev.iter()
            .any(|e| e.0 == "default/w" && e.2.contains("GPU 1 is already held")),
        "{ev:?}"
    );
    let mut c = r.share().await;
    assert!(allocate(&mut c, &tokens(1, 0, 600)).await.is_ok());
    assert!(allocate(&mut c, &tokens(1, 600, 600)).await.is_err());
    let mut g = r.gpu().await;
    assert!(allocate(&mut g, &ids(&[1])).await.is_err());
}

#[tokio::test]
async fn restart_rebuilds_from_pod_resources() {
    let s1 = pod(
        "s1",
        "2026-01-01T00:00:01Z",
        Some(decision("uid-s1", &[3], Some((300, 0)))),
    );
    let mut r = Rig::start(vec![s1.clone()], true, true).await;
    let mut c = r.share().await;
    let got = tokens(3, 0, 300);
    assert_eq!(visible(&allocate(&mut c, &got).await.unwrap()), uuids()[3]);
    r.pr.hold("default", "s1", "gpusched.io/gpu-milli", &got);
    // While the agent is down, a second pod with the same size is bound.
    let s2 = pod(
        "s2",
        "2026-01-01T00:00:02Z",
        Some(decision("uid-s2", &[4], Some((300, 0)))),
    );
    r.t.pods.set(vec![s1, s2]);
    r.restart().await;
    let mut c = r.share().await;
    // s1 is served (PodResources), so 300 more tokens belong to s2 (GPU 4),
    // not again to the older s1 (GPU 3).
    assert_eq!(
        visible(&allocate(&mut c, &tokens(3, 300, 300)).await.unwrap()),
        uuids()[4]
    );
}

#[tokio::test]
async fn restart_between_bind_and_allocate() {
    let mut r = Rig::start(vec![], true, true).await;
    if let Some(a) = r.agent.take() {
        a.shutdown().await.unwrap();
    }
    r.t.pods
        .set(vec![whole("a", "2026-01-01T00:00:01Z", &[6, 7])]);
    r.boot(true).await;
    let mut c = r.gpu().await;
    assert_eq!(
        visible(&allocate(&mut c, &ids(&[6, 7])).await.unwrap()),
        ids(&[6, 7]).join(",")
    );
}

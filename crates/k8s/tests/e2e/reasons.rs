//! Pending reasons: only pods that nodes would help read Unschedulable.

use super::*;

/// The PodScheduled reason of `name` once it is set.
async fn scheduled_reason(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    name: &str,
) -> Option<String> {
    let p = pods.get(name).await.ok()?;
    p.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")?
        .reason
}

/// cluster-autoscaler and Karpenter add nodes for pods whose PodScheduled
/// condition is False with reason `Unschedulable`: only a pod that nodes
/// would help reads so; a pod held by its queue's limit or waiting for its
/// gang's members reads its own reason (docs/kubernetes.md).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn only_pods_that_nodes_would_help_read_unschedulable() {
    let c = Cluster::up().await;
    c.nodes_from_yaml(H100).await;
    c.queue("capped", json!({"limit": {"nvidia.com/gpu": "1"}}))
        .await;
    let pods = c.pods("ml");
    for name in ["capped-1", "capped-2"] {
        let mut p = gpu_pod(name, 1);
        p["metadata"]["labels"] = json!({"gpusched.io/queue": "capped"});
        create(&pods, p).await;
    }
    // more GPUs than both nodes have free once the fillers run
    for i in 0..2 {
        create(&pods, gpu_pod(&format!("filler-{i}"), 7)).await;
    }
    c.group("ml", "trio", json!({"minMember": 3})).await;
    let mut lone = gpu_pod("trio-0", 1);
    lone["metadata"]["labels"] = json!({"gpusched.io/pod-group": "trio"});
    create(&pods, lone).await;
    let s = c.scheduler(opts()).await;
    wait_for(Duration::from_secs(60), || async {
        let b = bound(&pods).await;
        (b.contains_key("filler-0") && b.contains_key("filler-1") && b.contains_key("capped-1"))
            .then_some(())
    })
    .await
    .expect("the fillers and the first capped pod are bound");
    create(&pods, gpu_pod("wide", 4)).await;
    let want = [
        ("capped-2", "QueueQuota"),
        ("trio-0", "GangIncomplete"),
        ("wide", "Unschedulable"),
    ];
    // a condition is rewritten when its message changes (at most every
    // 10 s per pod): wait for each to settle on its reason
    let last = std::sync::Mutex::new(Vec::new());
    let settled = wait_for(Duration::from_secs(90), || async {
        let mut got = vec![];
        for (name, _) in want {
            got.push((name, scheduled_reason(&pods, name).await));
        }
        let ok = got
            .iter()
            .zip(want)
            .all(|((_, g), (_, w))| g.as_deref() == Some(w));
        *last.lock().unwrap() = got;
        ok.then_some(())
    })
    .await;
    assert!(
        settled.is_some(),
        "want {want:?}, last seen {:?}",
        last.lock().unwrap()
    );
    // the Queue counts its pending pods by the same reasons
    let queues: kube::Api<gpusched_k8s::crd::Queue> = kube::Api::all(c.client.clone());
    let by = wait_for(Duration::from_secs(60), || async {
        let st = queues.get("capped").await.ok()?.status?;
        (!st.pending_by_reason.is_empty()).then_some(st.pending_by_reason)
    })
    .await
    .expect("queue capped shows its pending pods by reason");
    assert_eq!(by.get("QueueQuota"), Some(&1), "{by:?}");
    // the PodGroup says why it waits, and so do its events
    let groups: kube::Api<gpusched_k8s::crd::PodGroup> =
        kube::Api::namespaced(c.client.clone(), "ml");
    let scheduled = |g: gpusched_k8s::crd::PodGroup| {
        g.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Scheduled")
            .map(|c| (c.status, c.reason, c.message))
    };
    let waiting = wait_for(Duration::from_secs(60), || async {
        scheduled(groups.get("trio").await.ok()?).filter(|c| c.0 == "False")
    })
    .await
    .expect("the PodGroup has a Scheduled=False condition");
    assert_eq!(waiting.1, "GangIncomplete", "{waiting:?}");
    let ev = wait_event(&c, "ml", "trio", "GangIncomplete:", 60)
        .await
        .expect("a GangIncomplete event on the PodGroup");
    assert!(ev.iter().any(|e| e.contains("trio")), "{ev:?}");
    // the fillers go, the rest of the trio comes: placed, and said so
    for i in 0..2 {
        pods.delete(&format!("filler-{i}"), &Default::default())
            .await
            .unwrap();
    }
    for i in 1..3 {
        let mut p = gpu_pod(&format!("trio-{i}"), 1);
        p["metadata"]["labels"] = json!({"gpusched.io/pod-group": "trio"});
        create(&pods, p).await;
    }
    let placed = wait_for(Duration::from_secs(90), || async {
        scheduled(groups.get("trio").await.ok()?).filter(|c| c.0 == "True")
    })
    .await
    .expect("the PodGroup turns Scheduled=True");
    assert_eq!(placed.1, "Scheduled", "{placed:?}");
    wait_event(&c, "ml", "trio", "Scheduled:", 60)
        .await
        .expect("a Scheduled event on the PodGroup");
    s.stop().await;
}

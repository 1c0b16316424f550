//! The scheduler and the agent agree on every pod's GPUs.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn scheduler_and_agent_agree_on_gpus() {
    let c = Cluster::up().await;
    let mut ns = NodeSide::new().await;
    create_bare_node(&c, &ns.node_file).await;
    let pods = c.pods("ml");
    let s = c.scheduler(opts()).await;

    // Labels: a pod selecting the GPU model waits until the agent
    // publishes the GFD labels on the Node.
    create(&pods, pod("early", json!({"nvidia.com/gpu": "1"}))).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !bound(&pods).await.contains_key("early"),
        "bound before the agent published labels"
    );
    let t0 = Instant::now();
    ns.start_agent(&c).await;
    let gpus = wait_for(Duration::from_secs(20), || node_gpus(&c))
        .await
        .expect("agent publishes gpusched.io/gpus");
    eprintln!("node GPUs published {:?} after agent start", t0.elapsed());
    assert_eq!(gpus.len(), 16);
    assert_eq!(gpus[9].nvlink, Some(1));
    let api: Api<Node> = Api::all(c.client.clone());
    let labels = api.get(NODE).await.unwrap().metadata.labels.unwrap();
    assert_eq!(labels["nvidia.com/gpu.product"], "H100-SXM5-80GB");
    assert_eq!(labels["nvidia.com/gpu.count"], "16");
    let early = wait_bound(&pods, &["early"]).await.remove(0);
    eprintln!("early pod bound {:?} after agent start", t0.elapsed());
    let r = ns.admit(&early, None).await.unwrap();
    assert_eq!(env(&r, "NVIDIA_VISIBLE_DEVICES"), decision(&early).gpus[0]);
    // What each admitted pod was given, as the kubelet would list it.
    let mut given: BTreeMap<String, Vec<String>> = BTreeMap::new();
    given.insert("early".into(), vec![env(&r, "NVIDIA_VISIBLE_DEVICES")]);

    // Two 1-GPU pods at once: each gets the GPU the scheduler chose.
    create(&pods, pod("a1", json!({"nvidia.com/gpu": "1"}))).await;
    create(&pods, pod("a2", json!({"nvidia.com/gpu": "1"}))).await;
    let got = wait_bound(&pods, &["a1", "a2"]).await;
    let (d1, d2) = (decision(&got[0]), decision(&got[1]));
    assert_ne!(d1.gpus, d2.gpus);
    // The kubelet admits a2 first (another order than bind order).
    let r2 = ns.admit(&got[1], None).await.unwrap();
    let r1 = ns.admit(&got[0], None).await.unwrap();
    let v1 = env(&r1, "NVIDIA_VISIBLE_DEVICES");
    let v2 = env(&r2, "NVIDIA_VISIBLE_DEVICES");
    assert_ne!(v1, v2);
    given.insert("a1".into(), vec![v1.clone()]);
    given.insert("a2".into(), vec![v2.clone()]);
    let mut want = vec![d1.gpus[0].clone(), d2.gpus[0].clone()];
    let mut have = vec![v1, v2];
    want.sort();
    have.sort();
    assert_eq!(have, want, "the two GPUs the scheduler chose");

    // An 8-GPU pod gets one NVLink domain, the one the scheduler chose.
    create(&pods, pod("big", json!({"nvidia.com/gpu": "8"}))).await;
    let big = wait_bound(&pods, &["big"]).await.remove(0);
    let d = decision(&big);
    let domains: BTreeSet<Option<u32>> =
        d.indices.iter().map(|&i| gpus[i as usize].nvlink).collect();
    assert_eq!(domains.len(), 1, "one NVLink domain: {:?}", d.indices);
    let r = ns.admit(&big, None).await.unwrap();
    let mut v: Vec<String> = env(&r, "NVIDIA_VISIBLE_DEVICES")
        .split(',')
        .map(String::from)
        .collect();
    v.sort();
    let mut w = d.gpus.clone();
    w.sort();
    assert_eq!(v, w);
    given.insert("big".into(), v);

    // A fractional pod gets the recorded GPU and the share env.
    create(
        &pods,
        pod(
            "frac",
            json!({"gpusched.io/gpu-milli": "300", "gpusched.io/gpu-memory-mib": "8192"}),
        ),
    )
    .await;
    let frac = wait_bound(&pods, &["frac"]).await.remove(0);
    let d = decision(&frac);
    assert_eq!(d.share.as_ref().map(|s| s.milli), Some(300));
    let r = ns.admit(&frac, None).await.unwrap();
    assert_eq!(env(&r, "NVIDIA_VISIBLE_DEVICES"), d.gpus[0]);
    assert_eq!(env(&r, "GPUSCHED_GPU_MILLI"), "300");
    assert_eq!(env(&r, "GPUSCHED_GPU_MEMORY_LIMIT_MIB"), "8192");
    given.insert("frac".into(), d.gpus.clone());

    // The agent publishes what the kubelet was given: each admitted pod
    // with the GPUs it holds (PodResources; a1 and a2, admitted in another
    // order than guessed, may hold each other's decided GPUs) and the share
    // of a shared GPU.
    let admitted = [&early, &got[0], &got[1], &big, &frac];
    let published = wait_for(Duration::from_secs(20), || async {
        node_allocations(&c)
            .await
            .filter(|a| a.pods.len() == admitted.len())
    })
    .await
    .expect("allocations of the five admitted pods on the Node");
    for p in admitted {
        let uid = p.metadata.uid.as_deref().unwrap();
        let a = published
            .pods
            .iter()
            .find(|a| a.uid == uid)
            .unwrap_or_else(|| panic!("{uid} in {published:?}"));
        assert_eq!(Some(a.name.as_str()), p.metadata.name.as_deref());
        let mut have = a.gpus.clone();
        let mut want = given[&a.name].clone();
        have.sort();
        want.sort();
        assert_eq!(have, want, "{}", a.name);
        let milli = decision(p).share.map(|s| s.milli);
        assert_eq!(a.milli, milli, "{}", a.name);
    }

    // A pod carrying a copy of another pod's decision (placed by hand on
    // the node) is refused with a clear error and an event.
    let mut forged = pod("forged", json!({"nvidia.com/gpu": "1"}));
    forged["spec"]["nodeName"] = json!(NODE);
    forged["metadata"]["annotations"] = json!({"gpusched.io/decision": GpuDecision { uid: "someone-else".into(), ..d1.clone() }.to_annotation()});
    let forged = create(&pods, forged).await;
    let ev = wait_for(Duration::from_secs(15), || async {
        let e = events_for(&c.client, "ml", "forged").await;
        e.iter()
            .any(|e| e.starts_with("GpuDecisionRefused:"))
            .then_some(e)
    })
    .await
    .expect("GpuDecisionRefused event");
    assert!(ev.iter().any(|e| e.contains("copied or forged")), "{ev:?}");
    let free = ns
        .uuids()
        .into_iter()
        .find(|u| !ns.used.contains(u))
        .unwrap();
    let e = ns.admit(&forged, Some(vec![free])).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
    assert!(
        e.message()
            .contains("ml/forged: decision was made for pod uid \"someone-else\""),
        "{}",
        e.message()
    );
    pods.delete(
        "forged",
        &kube::api::DeleteParams::default().grace_period(0),
    )
    .await
    .unwrap();

    // Agent restart between bind and Allocate.
    ns.stop_agent().await;
    create(&pods, pod("during", json!({"nvidia.com/gpu": "2"}))).await;
    let during = wait_bound(&pods, &["during"]).await.remove(0);
    ns.start_agent(&c).await;
    let r = ns.admit(&during, None).await.unwrap();
    assert_eq!(
        env(&r, "NVIDIA_VISIBLE_DEVICES"),
        decision(&during).gpus.join(",")
    );

    // A GPU marked unhealthy reaches the Node; no new pod is placed on it.
    let held: BTreeSet<u32> = bound(&pods)
        .await
        .values()
        .filter(|p| p.metadata.name.as_deref() != Some("forged"))
        .flat_map(|p| decision(p).indices)
        .collect();
    let sick = (0..16u32).rev().find(|i| !held.contains(i)).unwrap();
    let t1 = Instant::now();
    ns.control(&format!("unhealthy {sick}"));
    ns.unhealthy.insert(sick as usize);
    wait_for(Duration::from_secs(10), || async {
        let g = node_gpus(&c).await?;
        (!g[sick as usize].healthy).then_some(())
    })
    .await
    .expect("unhealthy GPU reaches the Node");
    eprintln!(
        "GPU {sick} unhealthy on the Node {:?} after the fault",
        t1.elapsed()
    );
    let free = 16 - held.len() - 1;
    let names: Vec<String> = (0..free).map(|i| format!("fill{i}")).collect();
    for n in &names {
        create(&pods, pod(n, json!({"nvidia.com/gpu": "1"}))).await;
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let filled = wait_bound(&pods, &refs).await;
    for p in &filled {
        assert_ne!(
            decision(p).indices,
            vec![sick],
            "placed on the unhealthy GPU"
        );
    }
    create(&pods, pod("one-too-many", json!({"nvidia.com/gpu": "1"}))).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!bound(&pods).await.contains_key("one-too-many"));
    k8s::assert_no_double_booking(&c.client).await;

    // With the agent down, a pod deleted behind its back stays in the
    // published allocations: doctor names it as a leak with the capacity
    // that would come back.
    ns.stop_agent().await;
    pods.delete("big", &kube::api::DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let report = wait_for(Duration::from_secs(20), || async {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .ok()?;
        let v = serde_json::to_value(&r).unwrap();
        (v["summary"]["leakedMilli"] == 8000).then_some((v, r.render()))
    })
    .await;
    let (v, text) = report.expect("doctor reports big's 8 GPUs as leaked");
    let leaks: Vec<&serde_json::Value> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["check"] == "leaks" && f["status"] != "ok")
        .collect();
    assert_eq!(leaks.len(), 1, "{text}");
    assert!(
        leaks[0]["message"].as_str().unwrap().contains("ml/big"),
        "{text}"
    );
    s.stop().await;
    let _ = fixture("dgx-h100.yaml");
}

//! The kubelet and the agent restarted under running pods.

use super::placement::burst;
use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn kubelet_and_agent_restarts_keep_every_gpu_with_one_owner() {
    let (c, mut n, s) = setup().await;
    let pods = c.pods(NS);

    // A burst, then a kubelet restart under it: the pods keep running on
    // the same GPUs and nothing is created again.
    let specs = burst(0, 7);
    let first: Vec<String> = specs
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    for p in specs {
        create(&pods, p).await;
    }
    wait_phase(&pods, &first, "Running").await.unwrap();
    let before = audit_now(&c, &n).await;
    assert_clean(&before, "burst");
    let containers = n.records().len();
    let t0 = Instant::now();
    n.kubelet_stop();
    n.kubelet_start();
    let took = wait_allocatable(&c, &n, GPUS).await;
    eprintln!(
        "kubelet restart: {GPUS} GPUs allocatable again {took:?} after start ({:?} in all)",
        t0.elapsed()
    );
    wait_phase(&pods, &first, "Running").await.unwrap();
    let after = audit_now(&c, &n).await;
    assert_clean(&after, "after a kubelet restart");
    assert_eq!(after.held, before.held, "the pods hold what they held");
    assert_eq!(
        n.records().len(),
        containers,
        "no container was created again"
    );
    // new pods after the restart land on the GPUs still free
    let more: Vec<String> = (0..2).map(|i| format!("after-{i}")).collect();
    for m in &more {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    wait_phase(&pods, &more, "Running").await.unwrap();
    assert_clean(&audit_now(&c, &n).await, "pods after the kubelet restart");
    let mut all: Vec<String> = first.clone();
    all.extend(more);
    delete_and_reclaim(&c, &all).await;

    // Swaps: with the kubelet down, four 1-GPU pods created within one
    // second are all bound; the restarted kubelet admits them in its own
    // order (ties of creationTimestamp), which the agent cannot know, so
    // most get another pod's decided GPUs (docs/protocol.md allows a swap
    // of same-size pods). More: the kubelet still counts the 10 GPUs of
    // the pods deleted above as in use (its checkpoint keeps them until
    // its pod sources are ready, after this first batch), so it cannot
    // give some of these pods their decided GPUs at all and picks free
    // ones, which the agent serves in their place. (Eight pods would not
    // fit in the 6 GPUs it sees free: "requested number of devices
    // unavailable", the kubelet's own limit, docs/agent.md.)
    n.kubelet_stop();
    let swapped: Vec<String> = (0..4).map(|i| format!("swap-{i}")).collect();
    for m in &swapped {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    wait_for(Duration::from_secs(60), || async {
        let b = k8s::bound(&pods).await;
        swapped.iter().all(|m| b.contains_key(m)).then_some(())
    })
    .await
    .expect("the eight pods bound");
    n.kubelet_start();
    wait_phase(&pods, &swapped, "Running").await.unwrap();
    let a = audit_now(&c, &n).await;
    assert_clean(&a, "swapped pods");
    eprintln!("{} of 4 pods swapped: {:?}", a.swaps.len(), a.swaps);

    // The agent crashes and comes back: it rebuilds from PodResources
    // exactly what each pod holds, swapped or not, and publishes it.
    n.stop_agent(true);
    n.start_agent();
    let held = a.held.clone();
    let rebuilt = wait_for(Duration::from_secs(30), || async {
        let al = allocations(&c).await?;
        let got: BTreeMap<String, Vec<String>> = al
            .pods
            .iter()
            .map(|p| {
                let mut g = p.gpus.clone();
                g.sort();
                (p.name.clone(), g)
            })
            .collect();
        (got == held).then_some(got)
    })
    .await;
    assert!(
        rebuilt.is_some(),
        "after an agent restart the allocations are not what the pods hold: {:?} vs {held:?}\nagent log:\n{}",
        allocations(&c).await,
        n.agent_log()
    );
    // The GPUs a swapped pod really held come back when it ends, and the
    // next pods are placed on GPUs that are really free.
    let gone: Vec<String> = swapped[..2].to_vec();
    delete_and_reclaim(&c, &gone).await;
    let next: Vec<String> = (0..4).map(|i| format!("next-{i}")).collect();
    for m in &next {
        create(&pods, pod_spec(m, &[], &[("main", whole(1))], None)).await;
    }
    let big = create(
        &pods,
        pod_spec("next-big", &[], &[("main", whole(4))], None),
    )
    .await;
    let mut all_next = next.clone();
    all_next.push(big.metadata.name.unwrap());
    wait_phase(&pods, &all_next, "Running").await.unwrap();
    assert_clean(
        &audit_now(&c, &n).await,
        "pods after the swapped pods ended",
    );
    let mut rest: Vec<String> = swapped[2..].to_vec();
    rest.extend(all_next);
    delete_and_reclaim(&c, &rest).await;
    doctor_clean(&c).await;
    s.stop().await;
}

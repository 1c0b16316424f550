//! Pods get their decided GPUs, and seeded bursts of mixed sizes
//! (whole GPUs and shares) created at once.

use super::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn pods_on_a_real_kubelet_get_their_decided_gpus() {
    let (c, n, s) = setup().await;
    let pods = c.pods(NS);
    let uuids = n.uuids();

    // The seed's cuda-check pod (restartPolicy Never; the container exits
    // after 1 s as nvidia-smi would): Running on its decided GPU, then
    // Succeeded, and its GPU is given back.
    let t0 = Instant::now();
    let mut check = pod_spec("cuda-check", &[], &[("cuda-check", whole(1))], Some(1000));
    check["spec"]["containers"][0]["image"] = json!("nvidia/cuda:12.6.0-base-ubuntu22.04");
    check["spec"]["containers"][0]["command"] = json!(["nvidia-smi"]);
    let check = create(&pods, check).await;
    let running = wait_phase(&pods, &["cuda-check".into()], "Running")
        .await
        .unwrap();
    eprintln!("cuda-check Running {:?} after create", t0.elapsed());
    let d = decision(&running[0]);
    let rec = n.records();
    let r = &rec[&(check.metadata.uid.clone().unwrap(), "cuda-check".into())];
    assert_eq!(visible(r), d.gpus, "cuda-check's NVIDIA_VISIBLE_DEVICES");
    assert_eq!(r.env.get("GPUSCHED_GPU_UUID"), None);
    wait_phase(&pods, &["cuda-check".into()], "Succeeded")
        .await
        .unwrap();
    wait_for(Duration::from_secs(20), || async {
        allocations(&c).await?.pods.is_empty().then_some(())
    })
    .await
    .expect("the finished pod's GPU is released from the published allocations");

    // Whole, multi-GPU, a share, a multi-container pod (one container asks
    // nothing) and a pod whose init container's GPU is reused.
    let specs = vec![
        pod_spec("one", &[], &[("main", whole(1))], None),
        pod_spec("two", &[], &[("main", whole(2))], None),
        pod_spec("four", &[], &[("main", whole(4))], None),
        pod_spec("share", &[], &[("main", milli(300))], None),
        pod_spec(
            "multi",
            &[],
            &[
                ("a", whole(1)),
                ("b", whole(2)),
                ("sidecar", json!({"cpu": "10m"})),
            ],
            None,
        ),
        pod_spec(
            "init",
            &[("setup", whole(1))],
            &[("main", whole(1)), ("helper", whole(1))],
            None,
        ),
        pod_spec(
            "share-multi",
            &[],
            &[("a", milli(200)), ("b", milli(100))],
            None,
        ),
    ];
    let mut created = Vec::new();
    for p in specs {
        created.push(create(&pods, p).await.metadata.name.unwrap());
    }
    let running = wait_phase(&pods, &created, "Running").await.unwrap();
    let a = audit_now(&c, &n).await;
    assert_clean(&a, "whole, multi-GPU, share, multi-container and init pods");
    let by_name: BTreeMap<String, Pod> = running
        .into_iter()
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect();
    // each pod's size, as the kubelet counts it
    for (name, size) in [
        ("one", 1),
        ("two", 2),
        ("four", 4),
        ("multi", 3),
        ("init", 2),
    ] {
        assert_eq!(a.held[name].len(), size, "{name}: {:?}", a.held[name]);
        assert_eq!(decision(&by_name[name]).gpus.len(), size, "{name}");
    }
    // the init container's GPU is one of the pod's two
    let rec = n.records();
    let uid = by_name["init"].metadata.uid.clone().unwrap();
    let setup_gpu = visible(&rec[&(uid.clone(), "setup".into())]);
    let main = visible(&rec[&(uid.clone(), "main".into())]);
    let helper = visible(&rec[&(uid, "helper".into())]);
    assert_ne!(main, helper, "main and helper are two GPUs");
    assert!(
        setup_gpu == main || setup_gpu == helper,
        "init GPU {setup_gpu:?} reused by main {main:?} or helper {helper:?}"
    );
    eprintln!("audit: {} swaps {:?}", a.swaps.len(), a.swaps);

    // Deleting them gives every device back: a 16-GPU pod then fits.
    delete_and_reclaim(&c, &created).await;
    let all = create(&pods, pod_spec("all16", &[], &[("main", whole(16))], None)).await;
    let got = wait_phase(&pods, &["all16".into()], "Running")
        .await
        .unwrap();
    let rec = n.records();
    let mut v = visible(&rec[&(all.metadata.uid.clone().unwrap(), "main".into())]);
    v.sort();
    let mut want = uuids.clone();
    want.sort();
    assert_eq!(v, want, "the 16-GPU pod holds every GPU");
    assert_clean(&audit_now(&c, &n).await, "16-GPU pod");
    drop(got);
    delete_and_reclaim(&c, &["all16".into()]).await;

    // An unhealthy GPU: the kubelet's allocatable drops to 15, the
    // scheduler stops placing on it, a 16-GPU pod waits, a 15-GPU pod runs
    // on the others.
    let sick = 5usize;
    n.control(&format!("unhealthy {sick}"));
    let t1 = Instant::now();
    wait_for(Duration::from_secs(30), || async {
        let node = node_obj(&c).await?;
        (quantity(&node, "allocatable", "nvidia.com/gpu") == Some(15)).then_some(())
    })
    .await
    .expect("allocatable nvidia.com/gpu 16 -> 15");
    eprintln!("unhealthy GPU: allocatable 15 after {:?}", t1.elapsed());
    create(
        &pods,
        pod_spec("too-big", &[], &[("main", whole(16))], None),
    )
    .await;
    let p15 = create(
        &pods,
        pod_spec("fifteen", &[], &[("main", whole(15))], None),
    )
    .await;
    wait_phase(&pods, &["fifteen".into()], "Running")
        .await
        .unwrap();
    let rec = n.records();
    let v = visible(&rec[&(p15.metadata.uid.clone().unwrap(), "main".into())]);
    assert_eq!(v.len(), 15);
    assert!(!v.contains(&uuids[sick]), "placed on the unhealthy GPU");
    let tb = pods.get("too-big").await.unwrap();
    assert_eq!(phase(&tb), "Pending");
    assert!(tb.spec.unwrap().node_name.is_none(), "too-big was bound");
    assert_clean(&audit_now(&c, &n).await, "unhealthy GPU");
    delete_and_reclaim(&c, &["fifteen".into(), "too-big".into()]).await;
    n.control(&format!("healthy {sick}"));
    wait_allocatable(&c, &n, GPUS).await;

    doctor_clean(&c).await;
    s.stop().await;
}

/// The mixed sizes of issue 29, as one burst: whole GPUs and milli shares.
const BURST_WHOLE: [u32; 6] = [2, 1, 1, 2, 1, 1];
const BURST_MILLI: [u32; 8] = [300, 500, 300, 200, 700, 400, 600, 300];

fn env_u64(k: &str, default: u64) -> u64 {
    std::env::var(k)
        .ok()
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{k}={v:?} is not a number"))
        })
        .unwrap_or(default)
}

/// The burst's pods in a seeded order (Fisher–Yates on `mix_indexed`).
pub(super) fn burst(round: u64, seed: u64) -> Vec<Value> {
    let mut v: Vec<Value> = BURST_WHOLE
        .iter()
        .enumerate()
        .map(|(i, &g)| {
            pod_spec(
                &format!("r{round}-w{i}-{g}"),
                &[],
                &[("main", whole(g))],
                None,
            )
        })
        .chain(BURST_MILLI.iter().enumerate().map(|(i, &m)| {
            pod_spec(
                &format!("r{round}-s{i}-{m}"),
                &[],
                &[("main", milli(m))],
                None,
            )
        }))
        .collect();
    for i in (1..v.len()).rev() {
        let j = (mix_indexed(seed, i as u64) % (i as u64 + 1)) as usize;
        v.swap(i, j);
    }
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane and a real kubelet (root): e2e/run"]
async fn mixed_size_bursts_on_a_real_kubelet() {
    let rounds = env_u64("GPUSCHED_KUBELET_ROUNDS", 5);
    let base = env_u64("GPUSCHED_KUBELET_SEED", 29);
    let (c, n, s) = setup().await;
    let pods = c.pods(NS);
    let t0 = Instant::now();
    let (mut failed, mut double, mut swaps, mut passed) = (Vec::new(), 0usize, 0usize, 0u64);
    let mut other: Vec<String> = Vec::new();
    let (mut t_running, mut t_reclaim) = (Duration::ZERO, Duration::ZERO);
    for round in 0..rounds {
        let seed = mix_indexed(base, round);
        let specs = burst(round, seed);
        let names: Vec<String> = specs
            .iter()
            .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        let t_round = Instant::now();
        for p in specs {
            create(&pods, p).await;
        }
        let ok = match wait_phase(&pods, &names, "Running").await {
            Ok(_) => true,
            Err(e) => {
                eprintln!("round {round} (seed {seed}): {e}");
                failed.push(format!("round {round}: {e}"));
                false
            }
        };
        t_running += t_round.elapsed();
        let a = audit_now(&c, &n).await;
        double += a.double();
        swaps += a.swaps.len();
        if !a.errors.is_empty() {
            eprintln!("round {round} (seed {seed}): {:#?}", a.errors);
            other.extend(a.errors.iter().map(|e| format!("round {round}: {e}")));
        }
        if ok && a.errors.is_empty() {
            passed += 1;
        }
        let t_del = Instant::now();
        delete_and_reclaim(&c, &names).await;
        t_reclaim += t_del.elapsed();
        if (round + 1) % 10 == 0 {
            eprintln!(
                "{} rounds in {:?}: {passed} passed",
                round + 1,
                t0.elapsed()
            );
        }
    }
    eprintln!(
        "mixed-size bursts: {passed}/{rounds} rounds passed, {} failed admissions, {double} GPUs held twice, {swaps} same-size swaps, {:.1} s ({:.2} s/round)",
        failed.len(),
        t0.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64() / rounds.max(1) as f64
    );
    eprintln!(
        "per round: create to all Running {:.2} s, delete to reclaimed {:.2} s",
        t_running.as_secs_f64() / rounds.max(1) as f64,
        t_reclaim.as_secs_f64() / rounds.max(1) as f64
    );
    assert!(failed.is_empty(), "failed rounds: {failed:#?}");
    assert_eq!(double, 0, "GPUs held twice: {other:#?}");
    assert!(other.is_empty(), "{other:#?}");
    assert_eq!(passed, rounds);
    doctor_clean(&c).await;
    s.stop().await;
}

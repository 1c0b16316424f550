//! Seeded rounds of MIG instances admitted in any order.

use super::*;

/// A pod decided onto MIG instances `ids` of GPU `gpu` (index, uuid).
fn mig_pod(
    name: &str,
    seq: u64,
    gpu: (u32, &str),
    resource: &str,
    ids: &[String],
    milli: u32,
) -> PodInfo {
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("uid-{name}"),
        node: NODE.into(),
        seq,
        indices: vec![gpu.0],
        gpus: vec![gpu.1.to_string()],
        share: None,
        mig: Some(Box::new(gpusched_model::protocol::MigDecision {
            resource: resource.into(),
            profile: String::new(),
            instances: ids.to_vec(),
            milli: milli * ids.len() as u32,
        })),
    };
    pod(name, "2026-01-01T00:00:01Z", Some(d.to_annotation()))
}

/// MIG instances (#29): the agent publishes its layout; pods of mixed
/// sizes decided onto instances of one profile, admitted in any order,
/// the kubelet following the preference or picking ids of its own, are
/// each answered with exactly their decided instances (each once); a call
/// past the decisions is refused; PodResources rebuilds them on restart.
async fn mig_rounds(
    fixture: &'static str,
    strategy: gpusched_node_agent::config::MigStrategy,
    regs: usize,
    resource: &str,
    sizes: &[usize],
    follow: bool,
) {
    use gpusched_model::sharing::NodeSharing;
    let mut r = Rig::start_mig(fixture, strategy, regs).await;
    let facts = published(&r).await;
    let sh = NodeSharing::parse(&facts.annotations["gpusched.io/sharing"]).unwrap();
    let gpus: Vec<NodeGpu> = serde_json::from_str(&facts.annotations["gpusched.io/gpus"]).unwrap();
    // the instances of `resource`, per GPU, as the scheduler reads them
    let mut layout: Vec<(u32, String, Vec<String>, u32)> = Vec::new();
    for g in &sh.mig {
        let of: Vec<&gpusched_model::sharing::MigInstance> = g
            .instances
            .iter()
            .filter(|m| m.resource == resource)
            .collect();
        if let Some(m) = of.first() {
            assert_eq!(m.of, 7, "A100: 7 compute slices");
            let uuid = gpus
                .iter()
                .find(|x| x.index == g.index)
                .unwrap()
                .uuid
                .clone();
            layout.push((
                g.index,
                uuid,
                of.iter().map(|m| m.id.clone()).collect(),
                m.milli(),
            ));
        }
    }
    let all: Vec<String> = layout.iter().flat_map(|l| l.2.clone()).collect();
    assert_eq!(
        sizes.iter().sum::<usize>(),
        all.len(),
        "the sizes fill the node"
    );
    let sock = format!("gpusched-{}.sock", resource.replace('/', "-"));
    let mut c = r.kubelet.client(&sock).await;
    let mut last: Vec<(String, Vec<String>)> = Vec::new();
    for round in 0..10u64 {
        let mut rng = Rng::new(round + if follow { 4000 } else { 5000 });
        // the scheduler's decisions: each pod k instances of one GPU
        let mut pods = Vec::new();
        let mut want: Vec<Vec<String>> = Vec::new();
        let mut free: Vec<Vec<String>> = layout.iter().map(|l| l.2.clone()).collect();
        for (i, &k) in sizes.iter().enumerate() {
            let g = (0..layout.len())
                .find(|&g| free[g].len() >= k)
                .expect("sizes fit");
            let ids: Vec<String> = free[g].drain(..k).collect();
            pods.push(mig_pod(
                &format!("m{round}-{i}"),
                i as u64 + 1,
                (layout[g].0, &layout[g].1),
                resource,
                &ids,
                layout[g].3,
            ));
            want.push(ids);
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut used: std::collections::BTreeSet<String> = Default::default();
        let mut got: Vec<Vec<String>> = Vec::new();
        last.clear();
        for &p in &order {
            let k = sizes[p];
            let avail: Vec<String> = all
                .iter()
                .filter(|id| !used.contains(*id))
                .cloned()
                .collect();
            let pick: Vec<String> = if follow {
                let pref = preferred(&mut c, &avail, k as i32).await;
                assert_eq!(pref.len(), k, "round {round}: preference {pref:?}");
                pref
            } else {
                avail[..k].to_vec()
            };
            let resp = allocate(&mut c, &pick).await.unwrap_or_else(|e| {
                panic!(
                    "round {round}: pod {p} ({k} instances) refused: {}",
                    e.message()
                )
            });
            let mut told: Vec<String> = visible(&resp).split(',').map(String::from).collect();
            told.sort();
            if follow {
                let mut p2 = pick.clone();
                p2.sort();
                assert_eq!(
                    told, p2,
                    "round {round}: the kubelet's ids are the decided ones"
                );
            }
            last.push((format!("m{round}-{p}"), pick.clone()));
            used.extend(pick);
            got.push(told);
        }
        got.sort();
        for w in &mut want {
            w.sort();
        }
        want.sort();
        assert_eq!(
            got, want,
            "round {round}: each decision served once, as decided"
        );
        // the node is full as decided: one more instance has no decision
        let e = allocate(&mut c, &all[..1]).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "round {round}");
        if round < 9 {
            sync_pods(&r, Vec::new()).await;
        }
    }
    if !follow {
        return;
    }
    // restart: PodResources lists what each pod holds; the agent rebuilds
    // it and publishes each pod with its instances
    for (name, ids) in &last {
        r.pr.hold("default", name, resource, ids);
    }
    r.restart().await;
    let want: std::collections::BTreeMap<String, Vec<String>> = last
        .iter()
        .map(|(n, ids)| {
            let mut ids = ids.clone();
            ids.sort();
            (n.clone(), ids)
        })
        .collect();
    let t0 = Instant::now();
    loop {
        let got: std::collections::BTreeMap<String, Vec<String>> = r
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
                        let mut ids: Vec<String> = p["mig"]
                            .as_array()
                            .map(|a| a.iter().map(|x| x.as_str().unwrap().to_string()).collect())
                            .unwrap_or_default();
                        ids.sort();
                        (p["name"].as_str().unwrap().to_string(), ids)
                    })
                    .collect()
            })
            .unwrap_or_default();
        if got == want {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "published {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // nothing is left to serve after the rebuild
    let mut c = r.kubelet.client(&sock).await;
    let e = allocate(&mut c, &all[..1]).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition);
}

#[tokio::test]
async fn mixed_mig_instances_follow_the_decisions() {
    use gpusched_node_agent::config::MigStrategy;
    // mig-a100: GPU 0 7×1g.10gb, GPU 1 2×3g.40gb, GPUs 2–7 whole; gpu,
    // gpu-milli and two MIG resources register
    for follow in [true, false] {
        mig_rounds(
            "mig-a100.yaml",
            MigStrategy::Mixed,
            4,
            "nvidia.com/mig-1g.10gb",
            &[2, 1, 3, 1],
            follow,
        )
        .await;
        mig_rounds(
            "mig-a100.yaml",
            MigStrategy::Mixed,
            4,
            "nvidia.com/mig-3g.40gb",
            &[1, 1],
            follow,
        )
        .await;
    }
}

#[tokio::test]
async fn single_mig_instances_follow_the_decisions() {
    use gpusched_node_agent::config::MigStrategy;
    // mig-single: 2 GPUs × 7×1g.10gb served as nvidia.com/gpu
    for follow in [true, false] {
        mig_rounds(
            "mig-single.yaml",
            MigStrategy::Single,
            1,
            "nvidia.com/gpu",
            &[3, 1, 2, 1, 2, 2, 1, 2],
            follow,
        )
        .await;
    }
}

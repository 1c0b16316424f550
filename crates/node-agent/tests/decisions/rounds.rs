//! Seeded rounds of mixed sizes admitted in any order: whole GPUs,
//! shares and time-sliced replicas.

use super::*;

#[derive(Default, Debug)]
struct Tally {
    refused: Vec<String>,
    twice: usize,
    not_decided: Vec<String>,
    wrong_size: Vec<String>,
    ignored_preference: usize,
}

/// Issue 29 item 1: whole-GPU pods of 2,1,1,2,1,1 GPUs bound at once and
/// admitted by the kubelet in any order. Per pod the stand-in kubelet calls
/// GetPreferredAllocation on the GPUs it has not handed out, takes the
/// answer (or, with `follow` false, GPUs of its own choice), and calls
/// Allocate. No call may be refused, no GPU handed out twice, and when the
/// kubelet follows the preference every pod gets exactly the GPUs of a
/// decision of its size (the kubelet does not say which pod calls, so two
/// pods of one size may get each other's: each set still has one owner).
async fn mixed_whole_rounds(rounds: u64, follow: bool) -> Tally {
    let r = Rig::start(vec![], true, true).await;
    let mut c = r.gpu().await;
    let sizes = [2u32, 1, 1, 2, 1, 1];
    let mut t = Tally::default();
    for round in 0..rounds {
        let mut rng = Rng::new(round + if follow { 0 } else { 1000 });
        let mut gpus: Vec<u32> = (0..8).collect();
        rng.shuffle(&mut gpus);
        let mut pods = Vec::new();
        let mut want: Vec<Vec<u32>> = Vec::new();
        let mut at = 0;
        for (i, &n) in sizes.iter().enumerate() {
            let mut idx = gpus[at..at + n as usize].to_vec();
            at += n as usize;
            idx.sort_unstable();
            pods.push(decided(&format!("w{round}-{i}"), i as u64 + 1, &idx, None));
            want.push(idx);
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut handed: Vec<u32> = Vec::new();
        let mut got: Vec<Vec<u32>> = Vec::new();
        for &p in &order {
            let n = sizes[p] as usize;
            let free: Vec<usize> = (0..8).filter(|g| !handed.contains(&(*g as u32))).collect();
            let avail = ids(&free);
            let pref = preferred(&mut c, &avail, n as i32).await;
            let pick: Vec<String> =
                if follow && pref.len() == n && pref.iter().all(|i| avail.contains(i)) {
                    pref
                } else {
                    if follow {
                        t.ignored_preference += 1;
                    }
                    let mut f = free.clone();
                    rng.shuffle(&mut f);
                    ids(&f[..n])
                };
            match allocate(&mut c, &pick).await {
                Ok(resp) => {
                    let u = uuids();
                    let mut mine: Vec<u32> = visible(&resp)
                        .split(',')
                        .filter_map(|v| u.iter().position(|x| x == v).map(|i| i as u32))
                        .collect();
                    mine.sort_unstable();
                    for g in &mine {
                        if handed.contains(g) {
                            t.twice += 1;
                        }
                    }
                    handed.extend(&mine);
                    if follow && !want.contains(&mine) {
                        t.not_decided
                            .push(format!("round {round}: pod {p} got {mine:?}"));
                    }
                    got.push(mine);
                }
                Err(e) => t.refused.push(format!(
                    "round {round} order {order:?} pod {p}: {}",
                    e.message()
                )),
            }
        }
        if follow && t.refused.is_empty() {
            got.sort();
            want.sort();
            assert_eq!(got, want, "round {round}: decisions used once each");
        }
    }
    t
}

#[tokio::test]
async fn mixed_whole_sizes_in_any_admission_order() {
    let t = mixed_whole_rounds(100, true).await;
    eprintln!(
        "kubelet follows the preference: {} refused, {} twice, {} not a decision",
        t.refused.len(),
        t.twice,
        t.not_decided.len()
    );
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0);
    assert_eq!(t.ignored_preference, 0, "the preference was unusable");
    assert!(t.not_decided.is_empty(), "{:#?}", t.not_decided);
    let t = mixed_whole_rounds(100, false).await;
    eprintln!("kubelet ignores the preference: {t:?}");
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0);
}

/// Issue 29 item 2: shares of 300,500,300,200,700,400,600,300 milli bound
/// at once (placed first-fit, as a scheduler packs them) and admitted in any
/// order. The stand-in kubelet counts 1000 tokens per GPU. Every pod must be
/// served a decision of exactly its milli, no GPU past 1000 milli, and when
/// the kubelet follows the preference, the decisions are used once each.
async fn mixed_share_rounds(rounds: u64, follow: bool) -> Tally {
    let r = Rig::start(vec![], true, true).await;
    let mut c = r.share().await;
    let sizes = [300u32, 500, 300, 200, 700, 400, 600, 300];
    let mut t = Tally::default();
    for round in 0..rounds {
        let mut rng = Rng::new(round + if follow { 500 } else { 1500 });
        let mut gpu_order: Vec<u32> = (0..8).collect();
        rng.shuffle(&mut gpu_order);
        let mut used = [0u32; 8];
        let mut pods = Vec::new();
        let mut want: Vec<(u32, u32)> = Vec::new();
        for (i, &m) in sizes.iter().enumerate() {
            let g = *gpu_order
                .iter()
                .find(|&&g| used[g as usize] + m <= 1000)
                .unwrap();
            used[g as usize] += m;
            pods.push(decided(
                &format!("s{round}-{i}"),
                i as u64 + 1,
                &[g],
                Some((m, u64::from(m) * 80)),
            ));
            want.push((g, m));
        }
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..sizes.len()).collect();
        rng.shuffle(&mut order);
        let mut taken: Vec<u32> = vec![0; 8];
        let mut granted = [0u32; 8];
        let mut got: Vec<(u32, u32)> = Vec::new();
        for &p in &order {
            let n = sizes[p];
            let mut avail = Vec::new();
            for (g, &k) in taken.iter().enumerate() {
                avail.extend(tokens(g, k, 1000 - k));
            }
            let pref = preferred(&mut c, &avail, n as i32).await;
            let free: std::collections::HashSet<&String> = avail.iter().collect();
            let follow_this =
                follow && pref.len() == n as usize && pref.iter().all(|i| free.contains(i));
            let pick: Vec<String> = if follow_this {
                pref
            } else {
                if follow {
                    t.ignored_preference += 1;
                }
                // The kubelet's own choice: tokens from GPUs in a random order.
                let mut gs: Vec<usize> = (0..8).collect();
                rng.shuffle(&mut gs);
                let mut v = Vec::new();
                for g in gs {
                    let k = taken[g];
                    v.extend(tokens(g, k, (1000 - k).min(n - v.len() as u32)));
                    if v.len() as u32 == n {
                        break;
                    }
                }
                v
            };
            // Which tokens the kubelet now counts as taken.
            let u = uuids();
            for id in &pick {
                if let Some(g) = u.iter().position(|x| id.starts_with(x.as_str())) {
                    taken[g] += 1;
                }
            }
            match allocate(&mut c, &pick).await {
                Ok(resp) => {
                    let g = u.iter().position(|x| *x == visible(&resp)).unwrap() as u32;
                    // The milli and memory of the decision charged.
                    let mib: u64 = resp.envs["GPUSCHED_GPU_MEMORY_LIMIT_MIB"].parse().unwrap();
                    let m = u32::try_from(mib / 80).unwrap();
                    if m != n {
                        t.wrong_size.push(format!(
                            "round {round} order {order:?}: pod {p} asked {n} milli, served the decision of {m}"
                        ));
                    }
                    granted[g as usize] += m;
                    if granted[g as usize] > 1000 {
                        t.twice += 1;
                    }
                    if follow && !want.contains(&(g, m)) {
                        t.not_decided
                            .push(format!("round {round}: pod {p} got {m} of GPU {g}"));
                    }
                    got.push((g, m));
                }
                Err(e) => t.refused.push(format!(
                    "round {round} order {order:?} pod {p}: {}",
                    e.message()
                )),
            }
        }
        if follow && t.refused.is_empty() {
            got.sort();
            want.sort();
            assert_eq!(got, want, "round {round}: decisions used once each");
        }
    }
    t
}

#[tokio::test]
async fn mixed_share_sizes_in_any_admission_order() {
    let t = mixed_share_rounds(100, true).await;
    eprintln!(
        "kubelet follows the preference: {} refused, {} served another size, {} not a decision",
        t.refused.len(),
        t.wrong_size.len(),
        t.not_decided.len()
    );
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert_eq!(t.twice, 0, "a GPU past 1000 milli");
    assert_eq!(t.ignored_preference, 0, "the preference was unusable");
    assert!(t.not_decided.is_empty(), "{:#?}", t.not_decided);
    assert!(
        t.wrong_size.is_empty(),
        "{} wrong: {:#?}",
        t.wrong_size.len(),
        t.wrong_size
    );
    let t = mixed_share_rounds(100, false).await;
    eprintln!("kubelet ignores the preference: {t:?}");
    assert!(
        t.refused.is_empty(),
        "{} refused: {:#?}",
        t.refused.len(),
        t.refused
    );
    assert!(
        t.wrong_size.is_empty(),
        "{} wrong: {:#?}",
        t.wrong_size.len(),
        t.wrong_size
    );
    assert_eq!(t.twice, 0, "a GPU past 1000 milli");
}

/// A pod asking `k` replicas of `resource` (time-sliced `n` ways), decided
/// onto GPU `gpu` as the scheduler does: a share of `k·⌊1000/n⌋` milli.
fn replica_pod(name: &str, seq: u64, gpu: u32, k: u32, n: u32, resource: &str) -> PodInfo {
    let u = uuids();
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("uid-{name}"),
        node: NODE.into(),
        seq,
        indices: vec![gpu],
        gpus: vec![u[gpu as usize].clone()],
        share: Some(ShareDecision {
            milli: k * gpusched_model::sharing::replica_milli(n),
            memory_mib: 0,
            resource: Some(resource.into()),
            replicas: Some(k),
        }),
        mig: None,
    };
    pod(name, "2026-01-01T00:00:01Z", Some(d.to_annotation()))
}

/// Issue 29 item 5: time-sliced replicas of 1 and 2 bound at once onto two
/// GPUs shared 4 ways (filling both), admitted in any order, the kubelet
/// following the preference or picking replica ids of its own (of GPUs no
/// decision names). Every call must be served a decision of exactly its
/// size, each decision once, so that each GPU gets exactly the replicas
/// decided onto it; a ninth replica is refused.
async fn replica_rounds(resource: &str, sock: &str, follow: bool) {
    use gpusched_node_agent::config::Replication;
    let r = Rig::start_with(
        vec![],
        true,
        true,
        vec![Replication {
            name: "nvidia.com/gpu".into(),
            replicas: 4,
            advertised: resource.into(),
        }],
    )
    .await;
    let mut c = r.kubelet.client(sock).await;
    let u = uuids();
    let rid = |g: usize, k: usize| format!("{}::{k}", u[g]);
    // GPU 1: 2+1+1, GPU 6: 1+2+1
    let layout = [(1u32, 2u32), (1, 1), (1, 1), (6, 1), (6, 2), (6, 1)];
    for round in 0..20u64 {
        let mut rng = Rng::new(round + if follow { 2000 } else { 3000 });
        let pods: Vec<PodInfo> = layout
            .iter()
            .enumerate()
            .map(|(i, &(g, k))| {
                replica_pod(&format!("r{round}-{i}"), i as u64 + 1, g, k, 4, resource)
            })
            .collect();
        sync_pods(&r, pods).await;
        let mut order: Vec<usize> = (0..layout.len()).collect();
        rng.shuffle(&mut order);
        // the kubelet's view: replica ids in use
        let mut used: std::collections::BTreeSet<String> = Default::default();
        let mut got: Vec<(u32, u32)> = Vec::new();
        for &p in &order {
            let k = layout[p].1 as usize;
            let avail: Vec<String> = (0..8)
                .flat_map(|g| (0..4).map(move |j| (g, j)))
                .map(|(g, j)| rid(g, j))
                .filter(|id| !used.contains(id))
                .collect();
            let pick: Vec<String> = if follow {
                let pref = preferred(&mut c, &avail, k as i32).await;
                assert_eq!(pref.len(), k, "round {round}: preference {pref:?}");
                pref
            } else {
                // its own choice: the lowest free ids (GPU 0 first, which no
                // decision names)
                avail[..k].to_vec()
            };
            let resp = allocate(&mut c, &pick).await.unwrap_or_else(|e| {
                panic!(
                    "round {round}: pod {p} ({k} replicas) refused: {}",
                    e.message()
                )
            });
            let g = u
                .iter()
                .position(|x| *x == visible(&resp))
                .unwrap_or_else(|| {
                    panic!("round {round}: answer names no single GPU: {:?}", resp.envs)
                });
            assert_eq!(resp.envs.get("GPUSCHED_GPU_UUID"), Some(&u[g]));
            if follow {
                assert!(
                    pick.iter().all(|id| id.starts_with(&u[g])),
                    "{pick:?} not of GPU {g}"
                );
            }
            got.push((g as u32, k as u32));
            used.extend(pick);
        }
        got.sort();
        let mut want = layout.to_vec();
        want.sort();
        assert_eq!(
            got, want,
            "round {round}: each decision served once, on its GPU"
        );
        // both GPUs are full as decided: a ninth replica has no decision
        let avail: Vec<String> = (0..8)
            .flat_map(|g| (0..4).map(move |j| (g, j)))
            .map(|(g, j)| rid(g, j))
            .filter(|id| !used.contains(id))
            .collect();
        let e = allocate(&mut c, &avail[..1]).await.unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition, "round {round}");
        assert!(
            e.message()
                .contains(&format!("share of {resource} replicas of 250 milli")),
            "{}",
            e.message()
        );
    }
}

#[tokio::test]
async fn time_sliced_replicas_under_their_own_name_follow_the_decisions() {
    replica_rounds("nvidia.com/gpu", GPU_SOCK, true).await;
    replica_rounds("nvidia.com/gpu", GPU_SOCK, false).await;
}

#[tokio::test]
async fn renamed_time_sliced_replicas_follow_the_decisions() {
    let sock = "gpusched-nvidia.com-gpu.shared.sock";
    replica_rounds("nvidia.com/gpu.shared", sock, true).await;
    replica_rounds("nvidia.com/gpu.shared", sock, false).await;
}

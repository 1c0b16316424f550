//! The ledger on hand-made pods: conflicts, matching, reconciliation.

use super::*;
use gpusched_model::protocol::DECISION_VERSION;

fn gpus(n: u32) -> Vec<LedgerGpu> {
    (0..n)
        .map(|i| LedgerGpu {
            index: i,
            uuid: format!("GPU-{i}"),
            memory_mib: 80 * 1024,
        })
        .collect()
}

fn pod(name: &str, created: &str, idx: &[u32], share: Option<(u32, u64)>) -> PodInfo {
    let d = GpuDecision {
        v: DECISION_VERSION,
        uid: format!("u-{name}"),
        node: "n".into(),
        seq: 1,
        indices: idx.to_vec(),
        gpus: idx.iter().map(|i| format!("GPU-{i}")).collect(),
        share: share.map(|(milli, memory_mib)| ShareDecision {
            milli,
            memory_mib,
            resource: None,
            replicas: None,
        }),
        mig: None,
    };
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("u-{name}"),
        node: "n".into(),
        created: created.into(),
        decision: Some(d.to_annotation()),
        terminal: false,
        containers: Vec::new(),
    }
}

fn replica_pod(name: &str, created: &str, gpu: u32, milli: u32) -> PodInfo {
    let mut p = pod(name, created, &[gpu], Some((milli, 0)));
    let mut d = GpuDecision::parse(p.decision.as_deref().unwrap()).unwrap();
    let s = d.share.as_mut().unwrap();
    s.resource = Some("nvidia.com/gpu.shared".into());
    s.replicas = Some(milli / 125);
    p.decision = Some(d.to_annotation());
    p
}

fn replica_held(v: &[(&str, u32, usize)]) -> BTreeMap<(String, String), HeldPod> {
    v.iter()
        .map(|(name, milli, g)| {
            (
                ("ns".to_string(), name.to_string()),
                HeldPod {
                    whole: BTreeSet::new(),
                    milli: *milli,
                    replica_gpu: Some(*g),
                    mig: BTreeSet::new(),
                },
            )
        })
        .collect()
}

fn share_gpus(l: &Ledger) -> Vec<(String, usize, u32)> {
    l.entries()
        .values()
        .filter_map(|e| match &e.state {
            Ok(Grant::Share {
                gpu, served_milli, ..
            }) => Some((e.pod.name.clone(), *gpu, *served_milli)),
            _ => None,
        })
        .collect()
}

#[test]
fn swapped_replica_pods_are_corrected_from_pod_resources() {
    let r = Some("nvidia.com/gpu.shared");
    let ok = vec![true; 2];
    let mut l = Ledger::new("n", gpus(2));
    l.observe(replica_pod("a", "1", 0, 125));
    l.observe(replica_pod("b", "2", 1, 125));
    // b's pod calls first (ids of GPU 1, but the agent cannot tell the
    // caller): charged to a, the older decision, and told GPU 0
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
    // PodResources: b holds the replicas told GPU 0; a is not listed
    let out = l.reconcile(&replica_held(&[("b", 125, 0)]), false).unwrap();
    assert_eq!(out.moved.len(), 1, "{out:?}");
    assert!(out.moved[0].contains("pod ns/b holds replicas of GPU 0, its decision named GPU 1"));
    assert_eq!(
        share_gpus(&l),
        vec![("a".into(), 1, 0), ("b".into(), 0, 125)],
        "b served on GPU 0, a now expects its call on GPU 1"
    );
    // a's call: told GPU 1, the GPU really free
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
    let out = l
        .reconcile(&replica_held(&[("b", 125, 0), ("a", 125, 1)]), false)
        .unwrap();
    assert!(out.moved.is_empty());
    assert_eq!(l.held()[0].1, 125);
    assert_eq!(l.held()[1].1, 125);
    // both calls made before PodResources is read: both swapped
    let mut l = Ledger::new("n", gpus(2));
    l.observe(replica_pod("a", "1", 0, 125));
    l.observe(replica_pod("b", "2", 1, 125));
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
    // b got GPU 0 and a GPU 1
    l.reconcile(&replica_held(&[("b", 125, 0), ("a", 125, 1)]), false)
        .unwrap();
    assert_eq!(
        share_gpus(&l),
        vec![("a".into(), 1, 125), ("b".into(), 0, 125)]
    );
    // three of one size: b's pod takes a's decision (GPU 0), c's pod
    // takes b's (GPU 1, c's own GPU): both end up served where they are
    let mut l = Ledger::new("n", gpus(2));
    l.observe(replica_pod("a", "1", 0, 125));
    l.observe(replica_pod("b", "2", 1, 125));
    l.observe(replica_pod("c", "3", 1, 125));
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
    assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
    l.reconcile(&replica_held(&[("b", 125, 0), ("c", 125, 1)]), false)
        .unwrap();
    assert_eq!(
        share_gpus(&l),
        vec![
            ("a".into(), 1, 0),
            ("b".into(), 0, 125),
            ("c".into(), 1, 125)
        ]
    );
    // a call not recorded by the kubelet yet: nothing is changed
    let mut l = Ledger::new("n", gpus(2));
    l.observe(replica_pod("a", "1", 0, 125));
    l.observe(replica_pod("b", "2", 1, 125));
    l.allocate_share(125, r, None, &ok).unwrap();
    l.allocate_share(125, r, None, &ok).unwrap();
    l.reconcile(&replica_held(&[("b", 125, 0)]), false).unwrap();
    assert_eq!(
        share_gpus(&l),
        vec![("a".into(), 0, 125), ("b".into(), 1, 125)]
    );
}

#[test]
fn conflict_refused_decision_comes_back_when_the_holder_ends() {
    let mut l = Ledger::new("n", gpus(4));
    assert!(l.observe(pod("a", "1", &[0], None)).is_none());
    let r = l.observe(pod("b", "2", &[0, 1], None)).expect("b refused");
    assert!(
        r.message.contains("GPU 0 is already held by pod ns/a"),
        "{}",
        r.message
    );
    let ok = vec![true; 4];
    assert!(l.allocate_whole(&[1], &ok).is_err());
    let mut a = pod("a", "1", &[0], None);
    a.terminal = true;
    l.observe(a);
    assert_eq!(l.allocate_whole(&[0, 1], &ok).unwrap().decision, "ns/b");
}

#[test]
fn served_decision_beats_an_older_pending_one() {
    let mut l = Ledger::new("n", gpus(2));
    l.observe(pod("young", "5", &[1], None));
    assert!(l.allocate_whole(&[1], &[true, true]).is_ok());
    // An older pod claiming the same GPU shows up late: refused, the
    // GPU stays with the pod that has it.
    assert!(l.observe(pod("old", "1", &[1], None)).is_some());
    assert_eq!(l.held()[1].0.as_deref(), Some("ns/young"));
}

#[test]
fn annotation_changed_after_allocation_is_ignored() {
    let mut l = Ledger::new("n", gpus(4));
    l.observe(pod("a", "1", &[0], None));
    l.allocate_whole(&[0], &[true; 4]).unwrap();
    let mut moved = pod("a", "1", &[3], None);
    moved.uid = "u-a".into();
    let r = l.observe(moved).expect("reported");
    assert!(r.message.contains("changed after the GPUs were allocated"));
    assert_eq!(l.held()[0].0.as_deref(), Some("ns/a"));
    assert!(l.allocate_whole(&[3], &[true; 4]).is_err());
}

#[test]
fn multi_container_pod_spends_its_gpus_per_container() {
    let mut l = Ledger::new("n", gpus(4));
    l.observe(pod("a", "1", &[0, 1, 2], None));
    assert_eq!(l.preferred_whole(&[0, 1, 2, 3], &[], 2), Some(vec![0, 1]));
    l.allocate_whole(&[0, 1], &[true; 4]).unwrap();
    // The second container: the decision's remaining GPU.
    assert_eq!(l.preferred_whole(&[2, 3], &[], 1), Some(vec![2]));
    l.allocate_whole(&[2], &[true; 4]).unwrap();
    assert!(l.preferred_whole(&[3], &[], 1).is_none());
}

#[test]
fn share_memory_is_bounded_by_the_gpu() {
    let mut l = Ledger::new("n", gpus(1));
    assert!(
        l.observe(pod("s1", "1", &[0], Some((100, 60 * 1024))))
            .is_none()
    );
    let r = l
        .observe(pod("s2", "2", &[0], Some((100, 30 * 1024))))
        .expect("refused");
    assert!(r.message.contains("would pass the GPU"), "{}", r.message);
    let too_big = pod("s3", "3", &[0], Some((100, 100 * 1024)));
    let r = l.observe(too_big).expect("refused");
    assert!(r.message.contains("exceeds GPU 0's"), "{}", r.message);
}

#[test]
fn wrong_node_and_bad_shapes_are_refused() {
    let mut l = Ledger::new("other", gpus(2));
    let mut p = pod("a", "1", &[0], None);
    p.node = "other".into();
    let r = l.observe(p).expect("refused");
    assert!(r.message.contains("made for node \"n\""), "{}", r.message);
    let mut l = Ledger::new("n", gpus(2));
    let r = l.observe(pod("b", "1", &[0, 0], None)).expect("refused");
    assert!(r.message.contains("named twice"), "{}", r.message);
    let r = l.observe(pod("c", "1", &[5], None)).expect("refused");
    assert!(r.message.contains("does not exist"), "{}", r.message);
    let mut long = pod("d", "1", &[0], None);
    long.decision = Some(" ".repeat(20_000));
    let r = l.observe(long).expect("refused");
    assert!(r.message.contains("limit"), "{}", r.message);
}

fn ask(init: bool, sidecar: bool, gpus: u32) -> ContainerAsk {
    ContainerAsk {
        init,
        sidecar,
        gpus,
        milli: 0,
    }
}

#[test]
fn calls_follow_the_kubelets_init_container_reuse() {
    let f = |a: &[ContainerAsk]| new_devices_per_call(a, |c| c.gpus);
    // Two app containers: two calls.
    assert_eq!(f(&[ask(false, false, 2), ask(false, false, 1)]), vec![2, 1]);
    // An init container of 2 reused by an app container of 3: 2 then 1.
    assert_eq!(f(&[ask(true, false, 2), ask(false, false, 3)]), vec![2, 1]);
    // Reused entirely: the app container's call adds nothing.
    assert_eq!(f(&[ask(true, false, 2), ask(false, false, 1)]), vec![2]);
    // Init devices reused once, then gone: 2, then 0 new, then 2.
    assert_eq!(
        f(&[
            ask(true, false, 2),
            ask(false, false, 2),
            ask(false, false, 2)
        ]),
        vec![2, 2]
    );
    // A sidecar keeps its devices: the next container needs its own.
    assert_eq!(f(&[ask(true, true, 1), ask(false, false, 1)]), vec![1, 1]);
    // Containers without GPUs make no call.
    assert_eq!(f(&[ask(false, false, 0), ask(false, false, 1)]), vec![1]);
    // Huge limits: the reused count never passes the largest ask.
    assert_eq!(
        f(&[
            ask(true, false, u32::MAX),
            ask(true, false, u32::MAX),
            ask(false, false, 1)
        ]),
        vec![u32::MAX]
    );
    // A spec that does not add up to the decision: one call of all of it.
    let mut l = Ledger::new("n", gpus(2));
    let mut p = pod("a", "1", &[0, 1], None);
    p.containers = vec![ask(true, false, u32::MAX), ask(false, false, u32::MAX)];
    assert!(l.observe(p).is_none());
    assert_eq!(l.preferred_whole(&[0, 1], &[], 2), Some(vec![0, 1]));
}

#[test]
fn a_container_is_matched_by_its_own_size() {
    // A 2-container pod (1 + 1 GPUs, decision [0, 1]) and a 2-GPU
    // single-container pod (decision [2, 3]), created in that order.
    let mut two = pod("two", "1", &[0, 1], None);
    two.containers = vec![ask(false, false, 1), ask(false, false, 1)];
    let big = pod("big", "2", &[2, 3], None);
    let mut l = Ledger::new("n", gpus(4));
    l.observe(two);
    l.observe(big);
    let ok = [true; 4];
    // The 2-GPU pod comes first: it goes to the decision expecting 2.
    assert_eq!(l.preferred_whole(&[0, 1, 2, 3], &[], 2), Some(vec![2, 3]));
    assert_eq!(l.allocate_whole(&[2, 3], &ok).unwrap().decision, "ns/big");
    assert_eq!(l.preferred_whole(&[0, 1], &[], 1), Some(vec![0]));
    l.allocate_whole(&[0], &ok).unwrap();
    assert_eq!(l.preferred_whole(&[1], &[], 1), Some(vec![1]));
    l.allocate_whole(&[1], &ok).unwrap();
    assert!(l.entries().values().all(|e| !e.is_pending()));
}

#[test]
fn gpus_of_another_pending_decision_are_exchanged() {
    let mut l = Ledger::new("n", gpus(4));
    l.observe(pod("a", "1", &[0], None));
    l.observe(pod("b", "2", &[2, 3], None));
    let ok = [true; 4];
    // The kubelet ignores the preference: a 1-GPU call on GPU 3.
    let m = l.allocate_whole(&[3], &ok).unwrap();
    assert_eq!(m.decision, "ns/a");
    assert!(m.note.unwrap().contains("GPU 3 of pod ns/b"));
    // b still expects 2 GPUs, now [2, 0].
    assert_eq!(l.preferred_whole(&[0, 1, 2], &[], 2), Some(vec![2, 0]));
    assert_eq!(l.allocate_whole(&[0, 2], &ok).unwrap().decision, "ns/b");
    // GPU 1 is nobody's.
    assert!(matches!(
        l.allocate_whole(&[1], &ok),
        Err(Miss::NoDecision(m)) if m.contains("holds GPUs [1 (GPU-1)]")
    ));
}

/// Issue 29, seen on a real kubelet: a kubelet restarted after pods
/// were deleted keeps their devices in use until its pod sources are
/// ready, so it cannot give pods admitted in its first batch the GPUs
/// the scheduler decided (free in fact) and picks GPUs no decision
/// names. Those are served in place of the decided ones (sizes kept,
/// one owner per GPU); a later decision onto the GPU taken, from a
/// scheduler that has not seen the allocations yet, gets the one left
/// free; a GPU with a share on it is never taken whole.
#[test]
fn a_free_gpu_the_kubelet_picks_replaces_a_decided_gpu_it_counts_as_busy() {
    let mut l = Ledger::new("n", gpus(16));
    l.observe(pod("a", "1", &[4], None));
    l.observe(pod("b", "1", &[5], None));
    l.observe(pod("s", "1", &[9], Some((300, 0))));
    let ok = [true; 16];
    // GPU 4 and 5 are busy for the kubelet: it picks 14 for a 1-GPU pod.
    let m = l.allocate_whole(&[14], &ok).unwrap();
    assert_eq!(m.decision, "ns/a");
    assert!(
        m.note
            .as_deref()
            .unwrap()
            .contains("GPU 14 (no decision names it) served in place of decided GPU 4"),
        "{m:?}"
    );
    // b still gets its own size; a GPU with a share is not free.
    assert!(l.allocate_whole(&[9], &ok).is_err());
    assert_eq!(l.allocate_whole(&[15], &ok).unwrap().decision, "ns/b");
    assert_eq!(l.held()[14].0.as_deref(), Some("ns/a"));
    assert_eq!(l.held()[15].0.as_deref(), Some("ns/b"));
    assert_eq!(l.held()[4].0, None);
    assert_eq!(l.held()[5].0, None);
    // The scheduler, not having seen the allocations, decides GPU 14
    // for c: c gets one of the GPUs left free instead of a refusal.
    assert!(l.observe(pod("c", "2", &[14], None)).is_none());
    let p = l.preferred_whole(
        &(0..16).filter(|&g| g != 14 && g != 15).collect::<Vec<_>>(),
        &[],
        1,
    );
    assert!(matches!(p.as_deref(), Some([4]) | Some([5])), "{p:?}");
    let g = p.unwrap()[0];
    assert_eq!(l.allocate_whole(&[g], &ok).unwrap().decision, "ns/c");
    // Nothing pending: a free GPU is nobody's.
    assert!(matches!(
        l.allocate_whole(&[0], &ok),
        Err(Miss::NoDecision(_))
    ));
    // With a refused decision on the node (its pod may be the caller)
    // a free GPU is refused.
    l.observe(pod("d", "3", &[7], None));
    let mut forged = pod("f", "3", &[1], None);
    forged.uid = "someone-else".into();
    assert!(l.observe(forged).is_some());
    assert!(matches!(
        l.allocate_whole(&[0], &ok),
        Err(Miss::NoDecision(_))
    ));
    assert_eq!(l.allocate_whole(&[7], &ok).unwrap().decision, "ns/d");
}

fn held(v: &[(&str, &[usize], u32)]) -> BTreeMap<(String, String), HeldPod> {
    v.iter()
        .map(|(name, whole, milli)| {
            (
                ("ns".to_string(), name.to_string()),
                HeldPod {
                    whole: whole.iter().copied().collect(),
                    milli: *milli,
                    replica_gpu: None,
                    mig: BTreeSet::new(),
                },
            )
        })
        .collect()
}

fn holdings(l: &Ledger) -> Vec<(String, Vec<usize>)> {
    l.entries()
        .values()
        .filter_map(|e| match &e.state {
            Ok(Grant::Whole { served, .. }) if !served.is_empty() => {
                Some((e.pod.name.clone(), served.iter().copied().collect()))
            }
            _ => None,
        })
        .collect()
}

/// Issue 29 item 3: after a restart, pods that hold other GPUs than
/// their decision (swapped by the kubelet) are rebuilt from what
/// PodResources lists, and a pending pod whose GPU a swapped pod holds
/// takes the GPU that pod's decision no longer needs.
#[test]
fn restart_rebuilds_swapped_pods_exactly() {
    let mut l = Ledger::new("n", gpus(8));
    for (name, idx) in [
        ("a", &[0][..]),
        ("b", &[1]),
        ("c", &[2, 3]),
        ("d", &[4, 5]),
        ("e", &[6]),
        ("f", &[7]),
    ] {
        assert!(l.observe(pod(name, "1", idx, None)).is_none());
    }
    let r = l
        .reconcile(
            &held(&[
                ("a", &[7], 0),
                ("b", &[1], 0),
                ("c", &[4, 5], 0),
                ("d", &[2, 3], 0),
                ("e", &[6], 0),
            ]),
            true,
        )
        .unwrap();
    assert_eq!(r.restored, 5);
    assert_eq!(r.moved.len(), 3, "{:?}", r.moved);
    assert_eq!(
        holdings(&l),
        vec![
            ("a".to_string(), vec![7]),
            ("b".to_string(), vec![1]),
            ("c".to_string(), vec![4, 5]),
            ("d".to_string(), vec![2, 3]),
            ("e".to_string(), vec![6]),
        ]
    );
    let held_table: Vec<Option<String>> = l.held().into_iter().map(|h| h.0).collect();
    assert_eq!(held_table[0], None);
    assert_eq!(held_table[7].as_deref(), Some("ns/a"));
    // f (decided GPU 7, which a holds) is pending on GPU 0 now.
    assert!(l.entries().values().all(|e| e.state.is_ok()));
    let ok = [true; 8];
    assert_eq!(l.preferred_whole(&[0], &[], 1), Some(vec![0]));
    assert_eq!(l.allocate_whole(&[0], &ok).unwrap().decision, "ns/f");
    // a ends: its real GPU (7) is free, not its decided one.
    l.forget("u-a");
    assert_eq!(l.held()[7].0, None);
    assert_eq!(l.held()[0].0.as_deref(), Some("ns/f"));
}

/// While running: the calls of two same-size pods were charged to each
/// other's decision; PodResources tells who holds what, and the pod
/// that ends frees the GPUs it really held.
#[test]
fn pod_resources_names_the_real_holder_while_running() {
    let mut l = Ledger::new("n", gpus(4));
    l.observe(pod("a", "1", &[0], None));
    l.observe(pod("b", "2", &[1], None));
    let ok = [true; 4];
    // b is admitted first and charged to a's decision (GPU 0).
    assert_eq!(l.allocate_whole(&[0], &ok).unwrap().decision, "ns/a");
    // A list that misses the call in flight changes nothing.
    assert!(l.reconcile(&held(&[]), false).is_none());
    // b holds 0; a is not admitted yet.
    l.reconcile(&held(&[("b", &[0], 0)]), false).unwrap();
    assert_eq!(holdings(&l), vec![("b".to_string(), vec![0])]);
    // a comes: the GPU left is 1, charged to a.
    assert_eq!(l.preferred_whole(&[1, 2, 3], &[], 1), Some(vec![1]));
    assert_eq!(l.allocate_whole(&[1], &ok).unwrap().decision, "ns/a");
    l.reconcile(&held(&[("b", &[0], 0), ("a", &[1], 0)]), false)
        .unwrap();
    // b ends: GPU 0 is free, a keeps GPU 1.
    l.forget("u-b");
    assert_eq!(l.held()[0].0, None);
    assert_eq!(l.held()[1].0.as_deref(), Some("ns/a"));
}

/// A pod bound by its creator (`spec.nodeName`) with no decision.
fn bypassing(name: &str, gpus: u32, milli: u32) -> PodInfo {
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("u-{name}"),
        node: "n".into(),
        created: "2026-01-01T00:00:00Z".into(),
        decision: None,
        terminal: false,
        containers: vec![ContainerAsk {
            gpus,
            milli,
            ..Default::default()
        }],
    }
}

fn whole_held(v: &[(&str, &[usize])]) -> BTreeMap<(String, String), HeldPod> {
    v.iter()
        .map(|(name, g)| {
            (
                ("ns".to_string(), name.to_string()),
                HeldPod {
                    whole: g.iter().copied().collect(),
                    ..Default::default()
                },
            )
        })
        .collect()
}

/// Issue 38, item 5: while a pod without a decision that asks a call of
/// the same size may be the caller, the call is charged to no decision
/// (the victim's decision would be served to the bypassing pod).
#[test]
fn a_pod_without_a_decision_is_never_charged_to_anothers_decision() {
    let mut l = Ledger::new("n", gpus(4));
    l.observe(pod("victim", "2026-01-01T00:00:01Z", &[0], None));
    l.observe(bypassing("sneak", 1, 0));
    let r = l.allocate_whole(&[0], &[true; 4]);
    match &r {
        Err(Miss::NoDecision(m)) => assert!(m.contains("pod ns/sneak"), "{m}"),
        other => panic!("charged to a decision: {other:?}"),
    }
    // a bypassing share asks the same milli: a share call is not charged
    l.observe(pod("sharer", "2026-01-01T00:00:01Z", &[1], Some((500, 0))));
    l.observe(bypassing("sneak-share", 0, 500));
    assert!(matches!(
        l.allocate_share(500, None, None, &[true; 4]),
        Err(Miss::NoDecision(_))
    ));
    // once PodResources shows the bypassing pod holding its GPU (it was
    // served as asked, or refused and gone), decisions are served again
    let held = whole_held(&[("sneak", &[3])]);
    assert!(l.reconcile(&held, false).is_some());
    l.forget("u-sneak-share");
    assert!(l.allocate_whole(&[0], &[true; 4]).is_ok());
    // and what it holds is listed as its (published for the scheduler)
    let others: Vec<(String, Vec<usize>)> = l
        .held_by_others()
        .into_iter()
        .map(|(p, g)| (p.name.clone(), g))
        .collect();
    assert_eq!(others, vec![("sneak".to_string(), vec![3])]);
}

/// Issue 38, item 6: a pod whose status says Failed while the kubelet
/// still lists its devices keeps them: no share of its GPU is handed out.
#[test]
fn a_failed_status_does_not_free_gpus_the_kubelet_still_lists() {
    let mut l = Ledger::new("n", gpus(2));
    l.observe(pod("runner", "2026-01-01T00:00:01Z", &[0], Some((600, 0))));
    assert!(l.allocate_share(600, None, None, &[true; 2]).is_ok());
    let mut held = BTreeMap::new();
    held.insert(
        ("ns".to_string(), "runner".to_string()),
        HeldPod {
            milli: 600,
            ..Default::default()
        },
    );
    assert!(l.reconcile(&held, false).is_some());
    let mut forged = pod("runner", "2026-01-01T00:00:01Z", &[0], Some((600, 0)));
    forged.terminal = true;
    l.observe(forged);
    // a new share of 600 on the same GPU would pass the GPU: refused
    let r = l.observe(pod("late", "2026-01-01T00:00:02Z", &[0], Some((600, 0))));
    assert!(
        r.as_ref().is_some_and(|r| r.message.starts_with(CONFLICT)),
        "{r:?}"
    );
    assert!(l.allocate_share(600, None, None, &[true; 2]).is_err());
    // the kubelet no longer lists it: it ends, the GPU is free
    assert!(l.reconcile(&BTreeMap::new(), false).is_some());
    assert!(l.allocate_share(600, None, None, &[true; 2]).is_ok());
}

/// Issue 38, item 6: a share is not served on a GPU PodResources shows
/// held whole by another pod (whatever that pod's status says).
#[test]
fn no_share_on_a_gpu_the_kubelet_shows_held_whole() {
    let mut l = Ledger::new("n", gpus(2));
    let mut done = pod("whole", "2026-01-01T00:00:01Z", &[1], None);
    done.terminal = true;
    l.observe(done);
    assert!(
        l.reconcile(&whole_held(&[("whole", &[1])]), false)
            .is_some()
    );
    l.observe(pod("share", "2026-01-01T00:00:02Z", &[1], Some((300, 0))));
    match l.allocate_share(300, None, None, &[true; 2]) {
        Err(Miss::Refused(m)) => assert!(m.contains("held whole by pod ns/whole"), "{m}"),
        other => panic!("{other:?}"),
    }
}

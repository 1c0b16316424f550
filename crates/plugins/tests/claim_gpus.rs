//! DRA claim constraints inside the core (`PodConstraints::claim_gpus`):
//! a pod is only given GPUs its claims' selectors allow, all of one
//! `matchAttribute` group — with every packing policy, in gangs and in
//! preemption — and a pod whose constraint the free GPUs cannot meet
//! stays pending with a reason naming the claim and the attribute.

use gpusched_core::*;
use gpusched_model::dra::ClaimGpus;
use gpusched_model::*;
use gpusched_plugins::{PackingConfig, PolicyName, SchedulerConfig, build};
use gpusched_testkit::*;

const NVLINK: &str = "gpu.gpusched.io/nvlinkDomain";

fn sched(policy: PolicyName) -> Scheduler {
    let mut cfg = SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    cfg.packing = PackingConfig::from(policy);
    build(&cfg).unwrap()
}

fn run(s: &mut Scheduler, snap: &Snapshot) -> CycleOutput {
    let out = s.cycle(snap, 1_000, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    out
}

/// Node `name` of `n` GPUs, GPU `i` in NVLink domain `i / per`.
fn domains(name: &str, n: u32, per: u32) -> Node {
    let mut node = node(name).gpus(n).build();
    for (i, g) in node.gpus.iter_mut().enumerate() {
        g.topo.nvlink = Some(i as u32 / per);
    }
    node
}

/// The constraint the adapter hands the core for a claim of GPUs in one
/// NVLink domain: each GPU's group is its domain (`None`: not allowed).
fn one_domain(nodes: &[&Node]) -> ClaimGpus {
    ClaimGpus {
        claim: "ml/gpus".into(),
        attributes: vec![NVLINK.into()],
        nodes: nodes
            .iter()
            .map(|n| {
                (
                    n.name.clone(),
                    n.gpus.iter().map(|g| g.topo.nvlink).collect(),
                )
            })
            .collect(),
        ..ClaimGpus::default()
    }
}

fn with_claim(mut p: Pod, c: &ClaimGpus) -> Pod {
    p.constraints_mut().claim_gpus = Some(c.clone());
    p
}

fn running(p: Pod, node: NodeId, gpus: &[u32]) -> PodState {
    PodState {
        pod: p.into(),
        phase: PodPhase::Running {
            node,
            gpus: GpuAssignment::Whole(gpus.to_vec()),
            since_ms: 0,
        },
    }
}

fn whole(a: &GpuAssignment) -> Vec<u32> {
    match a {
        GpuAssignment::Whole(v) => v.clone(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn two_gpus_in_one_domain_wait_while_each_domain_has_one_then_bind_in_one() {
    let a = domains("a", 4, 2);
    let c = one_domain(&[&a]);
    for policy in PolicyName::ALL {
        let mut snap = snapshot(
            vec![a.clone()],
            vec![queue("default")],
            vec![],
            vec![with_claim(pod("ml/p").gpus(2).build(), &c)],
        );
        snap.pods.push(running(pod("r0").gpus(1).build(), 0, &[0]));
        snap.pods.push(running(pod("r2").gpus(1).build(), 0, &[2]));
        let out = run(&mut sched(policy), &snap);
        assert!(binds(&snap, &out).is_empty(), "{policy:?}: {out:?}");
        assert!(evictions(&snap, &out).is_empty(), "{policy:?}");
        let why = explanation(&snap, &out, "ml/p").unwrap();
        assert!(
            why.contains(
                "node(s) had no 2 free GPUs with one gpu.gpusched.io/nvlinkDomain for ResourceClaim ml/gpus"
            ),
            "{policy:?}: {why}"
        );
        // the same pod without the constraint is placed across domains
        let mut plain = snap.clone();
        std::sync::Arc::make_mut(&mut plain.pods[0].pod).constraints = None;
        let b = binds(&plain, &run(&mut sched(policy), &plain));
        assert_eq!(whole(&b["ml/p"].1), vec![1, 3], "{policy:?}");
        // GPU 2 frees up: the pod gets domain 1
        snap.pods.retain(|p| p.pod.name != "r2");
        let b = binds(&snap, &run(&mut sched(policy), &snap));
        assert_eq!(whole(&b["ml/p"].1), vec![2, 3], "{policy:?}");
    }
}

#[test]
fn only_gpus_the_selectors_allow_are_given_and_groups_pick_the_tightest_fit() {
    let a = domains("a", 8, 4);
    // selectors allow GPUs 1, 3, 5 and 6 only (no attribute: one group)
    let allowed = ClaimGpus {
        claim: "ml/sel".into(),
        attributes: Vec::new(),
        nodes: [(
            "a".to_string(),
            (0..8)
                .map(|i| [1, 3, 5, 6].contains(&i).then_some(0))
                .collect(),
        )]
        .into(),
        ..ClaimGpus::default()
    };
    for policy in PolicyName::ALL {
        let snap = snapshot(
            vec![a.clone()],
            vec![queue("default")],
            vec![],
            vec![with_claim(pod("ml/p").gpus(3).build(), &allowed)],
        );
        let b = binds(&snap, &run(&mut sched(policy), &snap));
        let got = whole(&b["ml/p"].1);
        assert_eq!(got.len(), 3, "{policy:?}");
        assert!(
            got.iter().all(|g| [1, 3, 5, 6].contains(g)),
            "{policy:?}: {got:?}"
        );
        // five allowed GPUs are asked, four exist: pending, the claim named
        let snap = snapshot(
            vec![a.clone()],
            vec![queue("default")],
            vec![],
            vec![with_claim(pod("ml/p").gpus(5).build(), &allowed)],
        );
        let out = run(&mut sched(policy), &snap);
        assert!(binds(&snap, &out).is_empty());
        let why = explanation(&snap, &out, "ml/p").unwrap();
        assert!(
            why.contains("no 5 GPUs the selectors of ResourceClaim ml/sel match"),
            "{why}"
        );
    }
    // domain 0 has 3 free, domain 1 all 4: a 3-GPU ask takes domain 0
    let c = one_domain(&[&a]);
    let mut snap = snapshot(
        vec![a.clone()],
        vec![queue("default")],
        vec![],
        vec![with_claim(pod("ml/p").gpus(3).build(), &c)],
    );
    snap.pods.push(running(pod("r").gpus(1).build(), 0, &[0]));
    for policy in PolicyName::ALL {
        let b = binds(&snap, &run(&mut sched(policy), &snap));
        assert_eq!(whole(&b["ml/p"].1), vec![1, 2, 3], "{policy:?}");
    }
}

#[test]
fn a_gang_whose_members_need_one_domain_each_waits_whole_until_domains_are_free() {
    // 6 GPUs in three domains of 2; GPUs 0 and 2 busy: 4 free, but only
    // domain 2 whole
    let a = domains("a", 6, 2);
    let c = one_domain(&[&a]);
    let members = |c: Option<&ClaimGpus>| -> Vec<Pod> {
        (0..2)
            .map(|i| {
                let p = pod(&format!("ml/g-{i}")).gpus(2).group("g").build();
                match c {
                    Some(c) => with_claim(p, c),
                    None => p,
                }
            })
            .collect()
    };
    let setup = |pods: Vec<Pod>| {
        let mut snap = snapshot(
            vec![a.clone()],
            vec![queue("default")],
            vec![gang("g", "default", 2)],
            pods,
        );
        snap.pods.push(running(pod("r0").gpus(1).build(), 0, &[0]));
        snap.pods.push(running(pod("r2").gpus(1).build(), 0, &[2]));
        snap
    };
    for policy in PolicyName::ALL {
        let snap = setup(members(Some(&c)));
        let out = run(&mut sched(policy), &snap);
        assert!(binds(&snap, &out).is_empty(), "{policy:?}: gang split");
        // without the constraint the 4 free GPUs take it
        let plain = setup(members(None));
        assert_eq!(
            binds(&plain, &run(&mut sched(policy), &plain)).len(),
            2,
            "{policy:?}"
        );
        // r0 gone: domains 0 and 2 whole, one member each
        let mut snap = snap;
        snap.pods.retain(|p| p.pod.name != "r0");
        let b = binds(&snap, &run(&mut sched(policy), &snap));
        let mut sets: Vec<Vec<u32>> = b.values().map(|(_, g)| whole(g)).collect();
        sets.sort();
        assert_eq!(sets, vec![vec![0, 1], vec![4, 5]], "{policy:?}");
    }
}

#[test]
fn preemption_only_frees_gpus_that_meet_the_constraint() {
    // domains {0,1} and {2,3}; GPU 1 free. Evicting r2 alone (the lowest
    // priority) frees 2 GPUs, but in two domains: not a valid victim set
    let a = domains("a", 4, 2);
    let c = one_domain(&[&a]);
    for policy in [PolicyName::Gpusched, PolicyName::BestFit, PolicyName::Fgd] {
        let mut snap = snapshot(
            vec![a.clone()],
            vec![queue("default")],
            vec![],
            vec![with_claim(pod("ml/p").gpus(2).priority(100).build(), &c)],
        );
        snap.pods
            .push(running(pod("r0").gpus(1).priority(10).build(), 0, &[0]));
        snap.pods
            .push(running(pod("r2").gpus(1).priority(0).build(), 0, &[2]));
        snap.pods
            .push(running(pod("r3").gpus(1).priority(5).build(), 0, &[3]));
        let out = run(&mut sched(policy), &snap);
        let mut ev = evictions(&snap, &out);
        ev.sort();
        assert!(
            ev == ["r0"] || ev == ["r2", "r3"],
            "{policy:?}: victims {ev:?} must free one whole domain"
        );
        // the plain pod evicts just the lowest
        let mut plain = snap.clone();
        std::sync::Arc::make_mut(&mut plain.pods[0].pod).constraints = None;
        let ev = evictions(&plain, &run(&mut sched(policy), &plain));
        assert_eq!(ev, ["r2"], "{policy:?}");
    }
}

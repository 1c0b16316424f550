//! The Pod API constraints end to end through the core: inter-pod
//! affinity and anti-affinity, topology spread, host ports, preferences,
//! with gangs, preemption and a randomized differential against a
//! brute-force checker (`constraint_violations`).

use gpusched_core::*;
use gpusched_model::*;
use gpusched_plugins::{SchedulerConfig, build};
use gpusched_testkit::*;
use std::collections::{BTreeMap, BTreeSet};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

fn sched() -> Scheduler {
    let mut cfg = SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    build(&cfg).unwrap()
}

/// `n` nodes of 8 GPUs, named n0.., with hostname labels and zones from
/// `zones` (cycled).
fn nodes(n: usize, zones: &[&str]) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let name = format!("n{i}");
            node(&name)
                .gpus(8)
                .label(HOST, &name)
                .label(ZONE, zones[i % zones.len()])
                .build()
        })
        .collect()
}

fn run(s: &mut Scheduler, snap: &Snapshot) -> CycleOutput {
    // before any reservation (reserve_after_ms) so the node summary shows
    let out = s.cycle(snap, 1_000, 7);
    let v = check_invariants(snap, &out);
    assert!(v.is_empty(), "invariants violated: {v:?}");
    let c = constraint_violations(snap, &out);
    assert!(c.is_empty(), "constraints broken: {c:?}");
    out
}

fn node_of(snap: &Snapshot, out: &CycleOutput) -> BTreeMap<String, String> {
    binds(snap, out)
        .into_iter()
        .map(|(p, (n, _))| (p, n))
        .collect()
}

#[test]
fn required_anti_affinity_puts_replicas_on_distinct_nodes_and_leaves_the_rest_pending() {
    let pods: Vec<Pod> = (0..5)
        .map(|i| {
            pod(&format!("web-{i}"))
                .gpus(1)
                .label("app", "web")
                .anti_affinity("app", "web", HOST)
                .build()
        })
        .collect();
    let snap = snapshot(nodes(3, &["a"]), vec![queue("default")], vec![], pods);
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed.len(), 3, "{placed:?}");
    let distinct: BTreeSet<&String> = placed.values().collect();
    assert_eq!(distinct.len(), 3);
    let why = explanation(&snap, &out, "web-3").unwrap();
    assert!(
        why.contains("3 node(s) didn't match pod anti-affinity rules"),
        "{why}"
    );
}

#[test]
fn existing_pods_anti_affinity_refuses_matching_newcomers() {
    let mut snap = snapshot(
        nodes(2, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("guard")
                .gpus(1)
                .anti_affinity("app", "noisy", HOST)
                .build(),
            pod("noisy").gpus(1).label("app", "noisy").build(),
        ],
    );
    // the guard runs on n0 (the packer would put noisy there too)
    snap.pods[0].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    let out = run(&mut sched(), &snap);
    assert_eq!(node_of(&snap, &out)["noisy"], "n1");
}

#[test]
fn required_affinity_follows_the_anchor_and_the_first_of_a_group_goes_anywhere() {
    let mut snap = snapshot(
        nodes(4, &["a", "b"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("anchor").gpus(1).label("app", "db").build(),
            pod("follower").gpus(1).affinity("app", "db", HOST).build(),
            pod("zonal").gpus(1).affinity("app", "db", ZONE).build(),
            pod("lonely")
                .gpus(1)
                .affinity("app", "nothing-matches", HOST)
                .build(),
            pod("self-0")
                .gpus(1)
                .label("team", "x")
                .affinity("team", "x", ZONE)
                .build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 3,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed["follower"], "n3");
    assert!(
        ["n1", "n3"].contains(&placed["zonal"].as_str()),
        "{placed:?}"
    );
    assert!(!placed.contains_key("lonely"));
    assert!(
        placed.contains_key("self-0"),
        "first of a self-affine group"
    );
    let why = explanation(&snap, &out, "lonely").unwrap();
    assert!(why.contains("didn't match pod affinity rules"), "{why}");
}

#[test]
fn self_affine_group_lands_in_one_zone() {
    let pods: Vec<Pod> = (0..6)
        .map(|i| {
            pod(&format!("m-{i}"))
                .gpus(4)
                .label("team", "x")
                .affinity("team", "x", ZONE)
                .build()
        })
        .collect();
    let snap = snapshot(nodes(8, &["a", "b"]), vec![queue("default")], vec![], pods);
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed.len(), 6);
    let zones: BTreeSet<&str> = placed
        .values()
        .map(|n| {
            let i: usize = n[1..].parse().unwrap();
            ["a", "b"][i % 2]
        })
        .collect();
    assert_eq!(zones.len(), 1, "{placed:?}");
}

#[test]
fn gang_members_repel_each_other_inside_the_statement() {
    // one trainer per node: a gang of 4 on 4 nodes fits, of 5 does not
    for (members, fits) in [(4usize, true), (5, false)] {
        let pods: Vec<Pod> = (0..members)
            .map(|i| {
                pod(&format!("t-{i}"))
                    .gpus(2)
                    .group("train")
                    .label("job", "train")
                    .anti_affinity("job", "train", HOST)
                    .build()
            })
            .collect();
        let snap = snapshot(
            nodes(4, &["a"]),
            vec![queue("default")],
            vec![gang("train", "default", members as u32)],
            pods,
        );
        let out = run(&mut sched(), &snap);
        let placed = node_of(&snap, &out);
        if fits {
            assert_eq!(placed.len(), 4);
            let distinct: BTreeSet<&String> = placed.values().collect();
            assert_eq!(distinct.len(), 4);
        } else {
            assert!(placed.is_empty(), "all or nothing: {placed:?}");
        }
    }
}

#[test]
fn hard_zone_spread_balances_and_min_domains_counts_missing_zones() {
    let pods: Vec<Pod> = (0..6)
        .map(|i| {
            pod(&format!("s-{i}"))
                .gpus(1)
                .label("app", "s")
                .spread(1, ZONE, "app", "s", true)
                .build()
        })
        .collect();
    // 4 nodes in zones a, a, b, c
    let mut ns = nodes(4, &["a"]);
    for (n, z) in ns.iter_mut().zip(["a", "a", "b", "c"]) {
        n.labels.insert(ZONE.into(), z.into());
    }
    let snap = snapshot(ns.clone(), vec![queue("default")], vec![], pods);
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed.len(), 6);
    let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
    for n in placed.values() {
        let z = match n.as_str() {
            "n0" | "n1" => "a",
            "n2" => "b",
            _ => "c",
        };
        *per_zone.entry(z).or_insert(0) += 1;
    }
    assert_eq!(per_zone.values().copied().collect::<Vec<_>>(), [2, 2, 2]);

    // minDomains 4 with 3 zones: the global minimum is 0, so at most
    // maxSkew (1) per zone
    let pods: Vec<Pod> = (0..6)
        .map(|i| {
            let mut p = pod(&format!("s-{i}"))
                .gpus(1)
                .label("app", "s")
                .spread(1, ZONE, "app", "s", true)
                .build();
            p.constraints_mut().spread[0].min_domains = Some(4);
            p
        })
        .collect();
    let snap = snapshot(ns, vec![queue("default")], vec![], pods);
    let out = run(&mut sched(), &snap);
    assert_eq!(node_of(&snap, &out).len(), 3);
    let why = explanation(&snap, &out, "s-5").unwrap();
    assert!(
        why.contains("didn't match pod topology spread constraints"),
        "{why}"
    );
}

#[test]
fn spread_ignores_nodes_the_pod_cannot_use_unless_told_to() {
    // zone c's only node is tainted: with nodeTaintsPolicy Ignore it is an
    // empty domain (min 0), so a and b take one pod each; with Honor it does
    // not count and a and b balance freely
    let mut ns = nodes(3, &["a", "b", "c"]);
    ns[2].taints.push(Taint {
        key: "dedicated".into(),
        value: String::new(),
        effect: TaintEffect::NoSchedule,
    });
    for (honor, expect) in [(false, 2usize), (true, 4)] {
        let pods: Vec<Pod> = (0..4)
            .map(|i| {
                let mut p = pod(&format!("s-{i}"))
                    .gpus(1)
                    .label("app", "s")
                    .spread(1, ZONE, "app", "s", true)
                    .build();
                if honor {
                    p.constraints_mut().spread[0].node_taints_policy = SpreadPolicy::Honor;
                }
                p
            })
            .collect();
        let snap = snapshot(ns.clone(), vec![queue("default")], vec![], pods);
        let out = run(&mut sched(), &snap);
        assert_eq!(node_of(&snap, &out).len(), expect, "honor={honor}");
    }
}

#[test]
fn host_ports_conflict_per_node() {
    let pods: Vec<Pod> = (0..3)
        .map(|i| {
            pod(&format!("p-{i}"))
                .gpus(1)
                .host_port(8080)
                .selector(HOST, "n0")
                .build()
        })
        .chain([pod("other")
            .gpus(1)
            .host_port(9090)
            .selector(HOST, "n0")
            .build()])
        .collect();
    let snap = snapshot(nodes(2, &["a"]), vec![queue("default")], vec![], pods);
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed.len(), 2, "{placed:?}");
    assert!(placed.contains_key("other"));
    let why = explanation(&snap, &out, "p-1").unwrap();
    assert!(
        why.contains("didn't have free ports for the requested pod ports"),
        "{why}"
    );
}

#[test]
fn a_weight_100_node_preference_beats_packing() {
    // binpack prefers the fuller n0; the preference names n2
    let binpack = |order| {
        let mut cfg = SchedulerConfig {
            packing: gpusched_plugins::PackingConfig::from(gpusched_plugins::PolicyName::Binpack),
            ..Default::default()
        };
        cfg.actions.preferences = order;
        build(&cfg).unwrap()
    };
    use gpusched_core::scheduler::PreferenceOrder::{AfterPacking, BeforePacking, Ignore};
    let mut snap = snapshot(
        nodes(3, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("filler").gpus(4).build(),
            pod("picky").gpus(1).prefer_node(100, HOST, "n2").build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0, 1, 2, 3]),
        since_ms: 0,
    };
    let on = |s: &mut Scheduler, snap: &Snapshot| node_of(snap, &run(s, snap))["picky"].clone();
    assert_eq!(on(&mut binpack(BeforePacking), &snap), "n2");
    // packing first: the fuller node wins; ignored: the same
    assert_eq!(on(&mut binpack(AfterPacking), &snap), "n0");
    assert_eq!(on(&mut binpack(Ignore), &snap), "n0");
    // on a packing tie (all empty) the preference decides, also after packing
    snap.pods.remove(0);
    assert_eq!(on(&mut binpack(AfterPacking), &snap), "n2");
    assert_eq!(on(&mut binpack(Ignore), &snap), "n0");
}

#[test]
fn prefer_no_schedule_taints_and_preferred_pod_terms_rank_nodes() {
    let mut ns = nodes(3, &["a", "b", "c"]);
    ns[0].taints.push(Taint {
        key: "spot".into(),
        value: String::new(),
        effect: TaintEffect::PreferNoSchedule,
    });
    let mut snap = snapshot(
        ns,
        vec![queue("default")],
        vec![],
        vec![
            pod("cache").gpus(1).label("app", "cache").build(),
            pod("near-cache")
                .gpus(1)
                .prefer_pods(100, "app", "cache", ZONE)
                .build(),
            pod("untainted").gpus(4).build(),
            pod("away-from-cache")
                .gpus(1)
                .prefer_pods(-100, "app", "cache", HOST)
                .build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 2,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert_eq!(placed["near-cache"], "n2");
    assert_eq!(
        placed["untainted"], "n1",
        "avoids the PreferNoSchedule node"
    );
    assert_ne!(placed["away-from-cache"], "n2");
}

#[test]
fn preemption_evicts_the_pod_whose_anti_affinity_blocks_the_preemptor() {
    // one node; a low-priority pod there repels app=critical; the
    // critical pod needs no capacity from it, only its absence
    let mut snap = snapshot(
        nodes(1, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("repeller")
                .gpus(1)
                .anti_affinity("app", "critical", HOST)
                .build(),
            pod("bystander").gpus(1).build(),
            pod("critical")
                .gpus(1)
                .priority(100)
                .label("app", "critical")
                .build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![0]),
        since_ms: 0,
    };
    snap.pods[1].phase = PodPhase::Running {
        node: 0,
        gpus: GpuAssignment::Whole(vec![1]),
        since_ms: 0,
    };
    let out = run(&mut sched(), &snap);
    assert_eq!(evictions(&snap, &out), vec!["repeller".to_string()]);
    assert!(
        out.decisions
            .iter()
            .any(|d| matches!(d, Decision::Nominate { pod: 2, node: 0 }))
    );
}

#[test]
fn preemption_does_not_evict_when_the_preemptor_would_still_be_refused() {
    // the only node holds a high-priority pod whose anti-affinity repels
    // the preemptor; evicting the low-priority pods there cannot help
    let mut snap = snapshot(
        nodes(1, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("guard")
                .gpus(1)
                .priority(1000)
                .anti_affinity("app", "x", HOST)
                .build(),
            pod("low").gpus(7).build(),
            pod("x").gpus(1).priority(100).label("app", "x").build(),
        ],
    );
    for (i, gpus) in [(0usize, vec![0]), (1, vec![1, 2, 3, 4, 5, 6, 7])] {
        snap.pods[i].phase = PodPhase::Running {
            node: 0,
            gpus: GpuAssignment::Whole(gpus),
            since_ms: 0,
        };
    }
    let out = run(&mut sched(), &snap);
    assert!(evictions(&snap, &out).is_empty());
    let why = explanation(&snap, &out, "x").unwrap();
    assert!(
        why.contains("didn't satisfy existing pods anti-affinity rules"),
        "{why}"
    );
}

#[test]
fn pods_without_constraints_decide_as_without_the_plugins() {
    let pods: Vec<Pod> = (0..40)
        .map(|i| pod(&format!("p-{i:02}")).gpus(1 + (i % 3)).build())
        .collect();
    let snap = snapshot(nodes(6, &["a", "b"]), vec![queue("default")], vec![], pods);
    let with = run(&mut sched(), &snap);
    let cfg = SchedulerConfig {
        constraints: vec![],
        ..Default::default()
    };
    let mut without = build(&cfg).unwrap();
    let out = without.cycle(&snap, 1_000, 7);
    assert_eq!(with.decisions, out.decisions);
}

/// A tiny deterministic generator (the seed is the test's input).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[test]
fn randomized_specs_never_break_a_required_constraint() {
    let mut placed_total = 0;
    for seed in 0..60u64 {
        let mut r = Rng(seed * 7919 + 1);
        let zones = ["a", "b", "c"];
        let n_nodes = 3 + r.below(6) as usize;
        let mut ns = nodes(n_nodes, &zones);
        for n in &mut ns {
            if r.below(4) == 0 {
                n.labels.remove(ZONE);
            }
            if r.below(5) == 0 {
                n.labels.insert("tier".into(), "gold".into());
            }
        }
        let apps = ["a", "b", "c"];
        let mut pods = Vec::new();
        let mut groups = Vec::new();
        for i in 0..(4 + r.below(20)) {
            let app = apps[r.below(3) as usize];
            let mut b = pod(&format!("p-{i:02}"))
                .gpus(1 + r.below(4) as u32)
                .label("app", app)
                .priority(r.below(3) as i32 * 10);
            let topo = if r.below(2) == 0 { HOST } else { ZONE };
            let other = apps[r.below(3) as usize];
            b = match r.below(8) {
                0 => b.anti_affinity("app", other, topo),
                1 => b.affinity("app", other, topo),
                2 => b.spread(1 + r.below(2) as u32, topo, "app", app, true),
                3 => b.host_port(8000 + r.below(2) as u16),
                4 => b.prefer_pods(if r.below(2) == 0 { 50 } else { -50 }, "app", other, topo),
                5 => b.prefer_node(100, "tier", "gold"),
                _ => b,
            };
            if r.below(6) == 0 {
                b = b.selector("tier", "gold");
            }
            if i % 7 == 3 {
                let g = format!("g{i}");
                groups.push(gang(&g, "default", 2));
                for m in 0..2 {
                    let mut p = b.clone_pod();
                    p.name = format!("{}-m{m}", p.name);
                    p.group = Some(g.clone());
                    pods.push(p);
                }
                continue;
            }
            pods.push(b.build());
        }
        let mut snap = snapshot(ns, vec![queue("default")], groups, pods);
        let mut s = sched();
        // several cycles, applying binds and evictions as a runner would
        for cycle in 0..4u64 {
            let out = s.cycle(&snap, 1_000_000 + cycle, seed);
            let v = check_invariants(&snap, &out);
            assert!(v.is_empty(), "seed {seed}: invariants violated: {v:?}");
            let c = constraint_violations(&snap, &out);
            assert!(c.is_empty(), "seed {seed} cycle {cycle}: {c:?}");
            placed_total += binds(&snap, &out).len();
            apply(&mut snap, &out, 1_000_000 + cycle);
            finish_terminating(&mut snap);
        }
    }
    assert!(placed_total > 200, "the specs place pods: {placed_total}");
}

#[test]
fn preemption_frees_a_host_port_and_a_gang_spreads_over_zones() {
    // the high-priority pod needs port 8080 on n0, held by a low one
    let mut snap = snapshot(
        nodes(2, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("holder").gpus(1).host_port(8080).build(),
            pod("other").gpus(1).host_port(9090).build(),
            pod("needs-port")
                .gpus(1)
                .priority(100)
                .host_port(8080)
                .selector(HOST, "n0")
                .build(),
        ],
    );
    for i in 0..2 {
        snap.pods[i].phase = PodPhase::Running {
            node: 0,
            gpus: GpuAssignment::Whole(vec![i as u32]),
            since_ms: 0,
        };
    }
    let out = run(&mut sched(), &snap);
    assert_eq!(
        evictions(&snap, &out),
        vec!["holder".to_string()],
        "only the pod holding the port goes"
    );

    // a gang of 6 with a hard zone spread over 3 zones: 2 per zone, all or
    // nothing; with one zone full the gang waits
    let members = |n: usize| -> Vec<Pod> {
        (0..n)
            .map(|i| {
                pod(&format!("g-{i}"))
                    .gpus(8)
                    .group("g")
                    .label("job", "g")
                    .spread(1, ZONE, "job", "g", true)
                    .build()
            })
            .collect()
    };
    let snap = snapshot(
        nodes(6, &["a", "b", "c"]),
        vec![queue("default")],
        vec![gang("g", "default", 6)],
        members(6),
    );
    let out = run(&mut sched(), &snap);
    assert_eq!(node_of(&snap, &out).len(), 6);
    let mut snap = snapshot(
        nodes(6, &["a", "b", "c"]),
        vec![queue("default")],
        vec![gang("g", "default", 6)],
        members(6),
    );
    // zone c's nodes (n2, n5) are cordoned: the spread still counts zone c
    // (node affinity policy does not exclude cordoned nodes), so at most
    // one per zone above the empty c: a and b take one each, not six
    snap.nodes[2].unschedulable = true;
    snap.nodes[5].unschedulable = true;
    let out = run(&mut sched(), &snap);
    assert!(node_of(&snap, &out).is_empty(), "all or nothing");
}

#[test]
fn a_pod_nominated_to_a_node_counts_there_for_other_pods_checks() {
    // "pre" waits on n0 for a victim that is terminating (it was
    // nominated there by a preemption); kube-scheduler counts it on n0
    // when it checks other pods against n0 (its own terms and theirs).
    // gpusched keeps n0 for pre's job altogether, so an anti-affine pod
    // and a pod pre repels both go elsewhere, although packing prefers
    // the fuller n0.
    let mut snap = snapshot(
        nodes(2, &["a"]),
        vec![queue("default")],
        vec![],
        vec![
            pod("victim").gpus(6).build(),
            pod("pre")
                .gpus(4)
                .label("app", "web")
                .anti_affinity("app", "db", HOST)
                .build(),
            pod("web-2")
                .gpus(1)
                .label("app", "other")
                .anti_affinity("app", "web", HOST)
                .build(),
            pod("db").gpus(1).label("app", "db").build(),
            pod("busy").gpus(5).build(),
        ],
    );
    snap.pods[0].phase = PodPhase::Terminating {
        node: 0,
        gpus: GpuAssignment::Whole((0..6).collect()),
    };
    // n1 has 3 GPUs free: not enough for pre, enough for the others
    snap.pods[4].phase = PodPhase::Running {
        node: 1,
        gpus: GpuAssignment::Whole((0..5).collect()),
        since_ms: 0,
    };
    snap.pods[1].phase = PodPhase::Pending {
        nominated: Some(0),
        nominated_at_ms: None,
    };
    let out = run(&mut sched(), &snap);
    let placed = node_of(&snap, &out);
    assert!(!placed.contains_key("pre"), "still waiting: {placed:?}");
    assert_eq!(placed.get("web-2").map(String::as_str), Some("n1"));
    assert_eq!(placed.get("db").map(String::as_str), Some("n1"));
}

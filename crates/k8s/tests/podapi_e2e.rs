//! Differential e2e against kube-scheduler v1.37.2 (issue #23): the same
//! kwok nodes (4 × 8 H100, zones a/a/b/c) and the same pods, given once to
//! kube-scheduler (`default-scheduler`) and once to gpusched. For every
//! case: every placement of either scheduler satisfies every required
//! constraint (a brute-force check over the final placements: the check is
//! validated by kube-scheduler's own placements), gpusched leaves pending
//! no more pods than kube-scheduler, and for the hand-picked preference
//! cases gpusched picks what kube-scheduler picks. The randomized cases are
//! seeded.
//!
//! Run with `e2e/run` (or `cargo test -p gpusched-k8s --test podapi_e2e --
//! --ignored`).

mod common;

use common::*;
use gpusched_model::{Node as MNode, Pod as MPod, WhenUnsatisfiable};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

const HOST: &str = "kubernetes.io/hostname";
const ZONE: &str = "topology.kubernetes.io/zone";

const NODES: &str = "nodes:
  - {name: n1, count: 1, cpu: \"64\", memory: 512Gi, labels: {topology.kubernetes.io/zone: a, gen: \"3\"},
     gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}
  - {name: n2, count: 1, cpu: \"64\", memory: 512Gi, labels: {topology.kubernetes.io/zone: a, gen: \"4\"},
     gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}
  - {name: n3, count: 1, cpu: \"64\", memory: 512Gi, labels: {topology.kubernetes.io/zone: b, gen: \"4\"},
     gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}
  - {name: n4, count: 1, cpu: \"64\", memory: 512Gi, labels: {topology.kubernetes.io/zone: c, gen: \"5\"},
     gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}
";

/// A pod of `gpus` GPUs labelled `labels`, with `spec` merged into its
/// spec (no scheduler yet).
fn spec_pod(name: &str, gpus: u32, labels: Value, spec: Value) -> Value {
    let mut p = gpu_pod(name, gpus);
    p["metadata"]["labels"] = labels;
    for (k, v) in spec.as_object().unwrap() {
        if k == "ports" {
            p["spec"]["containers"][0]["ports"] = v.clone();
        } else {
            p["spec"][k] = v.clone();
        }
    }
    p
}

fn term(key: &str, value: &str, topology: &str) -> Value {
    json!({"labelSelector": {"matchLabels": {key: value}}, "topologyKey": topology})
}

/// Where each pod of a case went (`None`: pending).
type Placement = BTreeMap<String, Option<String>>;

/// Runs `pods` under `scheduler` in namespace `ml` until nothing changes
/// for a while, returns where they went, and deletes them.
async fn run_case(c: &Cluster, scheduler: &str, pods: &[Value]) -> Placement {
    let api = c.pods("ml");
    for p in pods {
        let mut p = p.clone();
        if p["spec"]["nodeName"].is_null() {
            p["spec"]["schedulerName"] = json!(scheduler);
        }
        create(&api, p).await;
    }
    // settled: nothing bound for 6 s (kube-scheduler retries unschedulable
    // pods with a backoff of up to 10 s, and on every change)
    let names: BTreeSet<String> = pods
        .iter()
        .map(|p| p["metadata"]["name"].as_str().unwrap().to_string())
        .collect();
    let t0 = Instant::now();
    let mut last = BTreeMap::new();
    let mut since = Instant::now();
    loop {
        let now: BTreeMap<String, String> = bound(&api)
            .await
            .into_iter()
            .filter_map(|(n, p)| Some((n, p.spec?.node_name?)))
            .collect();
        if now != last {
            last = now;
            since = Instant::now();
        }
        if last.len() == names.len() && since.elapsed() > Duration::from_secs(1) {
            break;
        }
        if since.elapsed() > Duration::from_secs(12) || t0.elapsed() > Duration::from_secs(90) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // a pod left pending says why (kept in the test's output, so a case
    // that disagrees can be read without rerunning it)
    for p in api.list(&ListParams::default()).await.unwrap().items {
        if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
            let why = p
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .into_iter()
                .find(|c| c.type_ == "PodScheduled")
                .map(|c| {
                    format!(
                        "{}: {}",
                        c.reason.unwrap_or_default(),
                        c.message.unwrap_or_default()
                    )
                })
                .unwrap_or_else(|| "no PodScheduled condition".into());
            eprintln!(
                "{scheduler}: {} pending: {why}",
                p.metadata.name.unwrap_or_default()
            );
        }
    }
    api.delete_collection(
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
        &ListParams::default(),
    )
    .await
    .unwrap();
    wait_for(Duration::from_secs(60), || async {
        api.list(&ListParams::default())
            .await
            .ok()?
            .items
            .is_empty()
            .then_some(())
    })
    .await
    .expect("pods deleted");
    names
        .into_iter()
        .map(|n| {
            let node = last.get(&n).cloned();
            (n, node)
        })
        .collect()
}

/// Every required constraint the final placement breaks (checked by
/// brute force over the pods as placed): required pod affinity (with the
/// first-of-a-self-affine-group exception) and anti-affinity both ways,
/// `DoNotSchedule` spread (for pods that only get added, the final skew
/// over eligible domains stays within maxSkew), host ports.
fn violations(nodes: &[MNode], pods: &[MPod], at: &Placement) -> Vec<String> {
    let node = |name: &str| nodes.iter().find(|n| n.name == name).unwrap();
    let short = |p: &MPod| p.name.rsplit('/').next().unwrap().to_string();
    let placed: Vec<(&MPod, &MNode)> = pods
        .iter()
        .filter_map(|p| Some((p, node(at.get(&short(p))?.as_deref()?))))
        .collect();
    let mut bad = Vec::new();
    for &(p, n) in &placed {
        let c = p.constraints();
        let others = placed.iter().filter(|(q, _)| q.name != p.name);
        for t in &c.required_anti_affinity {
            if let Some(v) = n.label(&t.topology_key) {
                for (q, m) in others.clone() {
                    if m.label(&t.topology_key) == Some(v)
                        && t.matches(&p.namespace, &q.namespace, &q.labels)
                    {
                        bad.push(format!("{}: anti-affinity to {}", p.name, q.name));
                    }
                }
            }
        }
        for t in &c.required_affinity {
            let Some(v) = n.label(&t.topology_key) else {
                bad.push(format!("{}: node lacks {}", p.name, t.topology_key));
                continue;
            };
            let near = others.clone().any(|(q, m)| {
                m.label(&t.topology_key) == Some(v)
                    && t.matches(&p.namespace, &q.namespace, &q.labels)
            });
            let anywhere = others.clone().any(|(q, m)| {
                m.label(&t.topology_key).is_some()
                    && t.matches(&p.namespace, &q.namespace, &q.labels)
            });
            let first = !anywhere && t.matches(&p.namespace, &p.namespace, &p.labels);
            if !near && !first {
                bad.push(format!("{}: affinity unmet on {}", p.name, n.name));
            }
        }
        for s in c
            .spread
            .iter()
            .filter(|s| s.when_unsatisfiable == WhenUnsatisfiable::DoNotSchedule)
        {
            let mut counts: BTreeMap<&str, i64> = BTreeMap::new();
            for m in nodes {
                let eligible = m.label(&s.topology_key).is_some()
                    && p.node_selector.iter().all(|(a, b)| m.label(a) == Some(b))
                    && (p.affinity.is_empty()
                        || p.affinity.iter().any(|t| t.matches(&m.name, &m.labels)));
                if eligible {
                    let d = m.label(&s.topology_key).unwrap();
                    let k = placed
                        .iter()
                        .filter(|(q, qm)| {
                            qm.name == m.name
                                && q.namespace == p.namespace
                                && s.selector.as_ref().is_some_and(|x| x.matches(&q.labels))
                        })
                        .count() as i64;
                    *counts.entry(d).or_insert(0) += k;
                }
            }
            let (lo, hi) = (
                counts.values().min().copied().unwrap_or(0),
                counts.values().max().copied().unwrap_or(0),
            );
            if hi - lo > s.max_skew as i64 {
                bad.push(format!("{}: {} skew {counts:?}", p.name, s.topology_key));
            }
        }
        for h in &c.host_ports {
            for (q, m) in others.clone() {
                if m.name == n.name && q.constraints().host_ports.iter().any(|x| x.conflicts(h)) {
                    bad.push(format!("{}: port {} with {}", p.name, h.port, q.name));
                }
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

struct Env {
    c: Cluster,
    nodes: Vec<MNode>,
    sched: Option<RunningScheduler>,
}

async fn env() -> Env {
    let c = Cluster::up_with_kube_scheduler().await;
    c.nodes_from_yaml(NODES).await;
    let api: Api<Node> = Api::all(c.client.clone());
    let nodes = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| gpusched_k8s::translate::node(n).node)
        .collect();
    let sched = c.scheduler(opts()).await;
    Env {
        c,
        nodes,
        sched: Some(sched),
    }
}

/// The outcome of one case under both schedulers.
struct Outcome {
    kube: Placement,
    ours: Placement,
}

impl Outcome {
    fn bound(p: &Placement) -> usize {
        p.values().filter(|n| n.is_some()).count()
    }
}

async fn compare(e: &Env, name: &str, pods: &[Value]) -> Outcome {
    let model: Vec<MPod> = pods
        .iter()
        .map(|v| {
            let mut v = v.clone();
            v["metadata"]["namespace"] = json!("ml");
            let p: Pod = serde_json::from_value(v).unwrap();
            gpusched_k8s::translate::model_pod(&p).unwrap()
        })
        .collect();
    let kube = run_case(&e.c, "default-scheduler", pods).await;
    let ours = run_case(&e.c, "gpusched", pods).await;
    let kv = violations(&e.nodes, &model, &kube);
    assert!(
        kv.is_empty(),
        "{name}: the checker disagrees with kube-scheduler: {kv:?} ({kube:?})"
    );
    let ov = violations(&e.nodes, &model, &ours);
    assert!(ov.is_empty(), "{name}: gpusched broke {ov:?}: {ours:?}");
    assert!(
        Outcome::bound(&ours) >= Outcome::bound(&kube),
        "{name}: gpusched placed fewer: ours {ours:?}, kube-scheduler {kube:?}"
    );
    eprintln!("{name}: kube-scheduler {kube:?}\n{name}: gpusched       {ours:?}");
    Outcome { kube, ours }
}

fn distinct(p: &Placement, prefix: &str) -> usize {
    p.iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .filter_map(|(_, n)| n.clone())
        .collect::<BTreeSet<_>>()
        .len()
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler (e2e/run)"]
async fn the_issue_table_reads_honoured() {
    let mut e = env().await;
    let anchor = {
        let mut a = spec_pod("anchor", 1, json!({"app": "db"}), json!({}));
        a["spec"]["nodeName"] = json!("n3");
        a
    };

    // required anti-affinity on hostname, 3 replicas: 3 nodes
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(
                &format!("web-{i}"),
                1,
                json!({"app": "web"}),
                json!({"affinity": {"podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [term("app", "web", HOST)]}}}),
            )
        })
        .collect();
    let o = compare(&e, "required anti-affinity", &pods).await;
    assert_eq!((distinct(&o.kube, "web"), distinct(&o.ours, "web")), (3, 3));

    // preferred anti-affinity: spread over nodes as kube-scheduler does
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(&format!("web-{i}"), 1, json!({"app": "web"}), json!({"affinity": {"podAntiAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term("app", "web", HOST)}]}}}))
        })
        .collect();
    let o = compare(&e, "preferred anti-affinity", &pods).await;
    assert_eq!(distinct(&o.ours, "web"), distinct(&o.kube, "web"));
    assert_eq!(distinct(&o.ours, "web"), 3);

    // required / preferred affinity to an anchor: the anchor's node
    for (kind, name) in [
        ("requiredDuringSchedulingIgnoredDuringExecution", "required"),
        (
            "preferredDuringSchedulingIgnoredDuringExecution",
            "preferred",
        ),
    ] {
        let t = if name == "required" {
            json!([term("app", "db", HOST)])
        } else {
            json!([{"weight": 100, "podAffinityTerm": term("app", "db", HOST)}])
        };
        let pods = vec![
            anchor.clone(),
            spec_pod(
                "client",
                1,
                json!({}),
                json!({"affinity": {"podAffinity": {kind: t}}}),
            ),
        ];
        let o = compare(&e, &format!("{name} affinity"), &pods).await;
        assert_eq!(o.kube["client"].as_deref(), Some("n3"));
        assert_eq!(o.ours["client"].as_deref(), Some("n3"), "{name}");
    }

    // zone spread maxSkew 1, 6 pods: 2/2/2
    let pods: Vec<Value> = (0..6)
        .map(|i| {
            spec_pod(
                &format!("s-{i}"),
                1,
                json!({"app": "s"}),
                json!({"topologySpreadConstraints": [
                {"maxSkew": 1, "topologyKey": ZONE, "whenUnsatisfiable": "DoNotSchedule",
                 "labelSelector": {"matchLabels": {"app": "s"}}}]}),
            )
        })
        .collect();
    let o = compare(&e, "zone spread", &pods).await;
    for p in [&o.kube, &o.ours] {
        let mut per_zone: BTreeMap<&str, u32> = BTreeMap::new();
        for n in p.values().flatten() {
            let z = match n.as_str() {
                "n1" | "n2" => "a",
                "n3" => "b",
                _ => "c",
            };
            *per_zone.entry(z).or_insert(0) += 1;
        }
        assert_eq!(
            per_zone.values().copied().collect::<Vec<_>>(),
            [2, 2, 2],
            "{p:?}"
        );
    }

    // preferred node affinity weight 100: the preferred node
    let pods = vec![spec_pod(
        "picky",
        1,
        json!({}),
        json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [{"key": HOST, "operator": "In", "values": ["n4"]}]}}]}}}),
    )];
    let o = compare(&e, "preferred node affinity", &pods).await;
    assert_eq!(o.kube["picky"].as_deref(), Some("n4"));
    assert_eq!(o.ours["picky"].as_deref(), Some("n4"));

    // required node affinity with Gt and Lt on an integer label (gen 3/4/4/5):
    // only n2 and n3 have 3 < gen < 5; three 8-GPU pods, the third pending
    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(
                &format!("gen-{i}"),
                8,
                json!({}),
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "gen", "operator": "Gt", "values": ["3"]},
                        {"key": "gen", "operator": "Lt", "values": ["5"]}]}]}}}}),
            )
        })
        .collect();
    let o = compare(&e, "node affinity Gt/Lt", &pods).await;
    assert_eq!((Outcome::bound(&o.kube), Outcome::bound(&o.ours)), (2, 2));
    for p in [&o.kube, &o.ours] {
        let on: BTreeSet<String> = p.values().flatten().cloned().collect();
        assert_eq!(
            on,
            BTreeSet::from(["n2".to_string(), "n3".to_string()]),
            "{p:?}"
        );
    }

    // matchFields on metadata.name: a DaemonSet-style pin (In n3, 1 GPU)
    // and three 7-GPU pods kept off n1 (NotIn): the pin on n3 and one pod
    // on each of n2, n3, n4, none on n1. (The sizes leave room for every
    // pod whatever order the pods are tried in: the pods are created one
    // after another and either scheduler may see some before the others.)
    let field = |op: &str, node: &str| {
        json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": op, "values": [node]}]}]}}}})
    };
    let mut pods = vec![spec_pod("ds", 1, json!({}), field("In", "n3"))];
    pods.extend((0..3).map(|i| spec_pod(&format!("off-{i}"), 7, json!({}), field("NotIn", "n1"))));
    let o = compare(&e, "node affinity matchFields", &pods).await;
    for p in [&o.kube, &o.ours] {
        assert_eq!(p["ds"].as_deref(), Some("n3"), "{p:?}");
        assert_eq!(Outcome::bound(p), 4, "{p:?}");
        let off: BTreeSet<&str> = p
            .iter()
            .filter(|(k, _)| k.starts_with("off"))
            .filter_map(|(_, n)| n.as_deref())
            .collect();
        assert_eq!(off, BTreeSet::from(["n2", "n3", "n4"]), "{p:?}");
    }

    // hostPort 8080, two pods pinned to one node: the second pending
    let pods: Vec<Value> = (0..2)
        .map(|i| {
            spec_pod(
                &format!("port-{i}"),
                1,
                json!({}),
                json!({"nodeSelector": {HOST: "n2"}, "ports": [{"containerPort": 80, "hostPort": 8080}]}),
            )
        })
        .collect();
    let o = compare(&e, "host port", &pods).await;
    assert_eq!((Outcome::bound(&o.kube), Outcome::bound(&o.ours)), (1, 1));
    // and gpusched says why, as kube-scheduler does
    let api = e.c.pods("ml");
    for p in &pods {
        let mut p = p.clone();
        p["spec"]["schedulerName"] = json!("gpusched");
        create(&api, p).await;
    }
    let pending = wait_for(Duration::from_secs(30), || async {
        let b = bound(&api).await;
        (b.len() == 1).then(|| {
            if b.contains_key("port-0") {
                "port-1"
            } else {
                "port-0"
            }
        })
    })
    .await
    .expect("one bound");
    let ev = wait_event(&e.c, "ml", pending, "FailedScheduling: ", 30)
        .await
        .expect("told why");
    assert!(
        ev.iter()
            .any(|m| m.contains("didn't have free ports for the requested pod ports")),
        "{ev:?}"
    );
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// A tiny deterministic generator (the seed is the case's input).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// A random case: groups of 1–3 identical pods with a random constraint
/// over random labels, zones and operators.
fn random_case(seed: u64) -> Vec<Value> {
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9) + 17);
    let apps = ["a", "b", "c"];
    let topo = |r: &mut Rng| if r.below(2) == 0 { HOST } else { ZONE };
    let mut pods = Vec::new();
    let groups = 3 + r.below(4);
    for g in 0..groups {
        let app = apps[r.below(3) as usize];
        let other = apps[r.below(3) as usize];
        let labels = json!({"app": app, "grp": format!("g{g}")});
        let op = ["In", "NotIn"][r.below(2) as usize];
        let spec = match r.below(7) {
            0 => {
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("app", other, topo(&mut r))]}}})
            }
            1 => {
                json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("app", other, topo(&mut r))]}}})
            }
            2 => {
                json!({"topologySpreadConstraints": [{"maxSkew": 1 + r.below(2), "topologyKey": topo(&mut r),
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"grp": format!("g{g}")}}}]})
            }
            3 => json!({"ports": [{"containerPort": 80, "hostPort": 8080 + r.below(2)}]}),
            4 => {
                json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    {"nodeSelectorTerms": [{"matchExpressions": [{"key": ZONE, "operator": op, "values": ["a"]}]}]}},
                    "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
                    [term("grp", &format!("g{g}"), HOST)]}}})
            }
            5 => {
                json!({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
                    [{"weight": 50, "podAffinityTerm": term("app", other, topo(&mut r))}]}}})
            }
            _ => json!({}),
        };
        let members = 1 + r.below(3);
        let gpus = 1 + r.below(2) as u32;
        for m in 0..members {
            pods.push(spec_pod(
                &format!("g{g}-m{m}"),
                gpus,
                labels.clone(),
                spec.clone(),
            ));
        }
    }
    pods
}

#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler (e2e/run)"]
async fn seeded_random_specs_agree_with_kube_scheduler() {
    let mut e = env().await;
    let seeds: u64 = std::env::var("GPUSCHED_E2E_PODAPI_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(8);
    let (mut pods_total, mut kube_bound, mut ours_bound) = (0, 0, 0);
    for seed in 1..=seeds {
        let pods = random_case(seed);
        let o = compare(&e, &format!("seed {seed}"), &pods).await;
        pods_total += pods.len();
        kube_bound += Outcome::bound(&o.kube);
        ours_bound += Outcome::bound(&o.ours);
    }
    eprintln!(
        "{seeds} seeded cases, {pods_total} pods: kube-scheduler bound {kube_bound}, gpusched {ours_bound}"
    );
    assert!(kube_bound > pods_total / 2, "the cases place pods");
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// The issue's volume rows, on kube-scheduler and gpusched in turn, with
/// kube-controller-manager's PV controller binding the claims for real:
/// a `WaitForFirstConsumer` claim whose only matching volume is local to
/// n3 puts the pod on n3 and binds that volume; a missing claim and an
/// unbound `Immediate` claim keep the pod pending, told which claim.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn volumes_bind_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
               "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await;
    create_obj(
        &classes,
        json!({"metadata": {"name": "remote"}, "provisioner": "example.com/nobody",
               "volumeBindingMode": "Immediate"}),
    )
    .await;
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    let claim_pod = |name: &str, scheduler: &str, claim: &str| {
        let mut p = spec_pod(
            name,
            1,
            json!({}),
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        p
    };
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        // a local volume on n3 only, a decoy on n1 that is too small
        for (pv, node, size) in [
            (format!("local-n3-{tag}"), "n3", "10Gi"),
            (format!("small-n1-{tag}"), "n1", "1Gi"),
        ] {
            create_obj(
                &pvs,
                json!({"metadata": {"name": pv},
                       "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                                "capacity": {"storage": size}, "local": {"path": "/mnt/disk"},
                                "persistentVolumeReclaimPolicy": "Retain",
                                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                    {"key": HOST, "operator": "In", "values": [node]}]}]}}}}),
            )
            .await;
        }
        let claim = format!("data-{tag}");
        create_obj(
            &pvcs,
            json!({"metadata": {"name": claim},
                   "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "5Gi"}}}}),
        )
        .await;
        create_obj(
            &pvcs,
            json!({"metadata": {"name": format!("immediate-{tag}")},
                   "spec": {"storageClassName": "remote", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "5Gi"}}}}),
        )
        .await;
        let wffc = format!("wffc-{tag}");
        let missing = format!("missing-{tag}");
        let immediate = format!("immediate-{tag}");
        create(&pods, claim_pod(&wffc, scheduler, &claim)).await;
        create(&pods, claim_pod(&missing, scheduler, "no-such-claim")).await;
        create(
            &pods,
            claim_pod(&immediate, scheduler, &format!("immediate-{tag}")),
        )
        .await;
        let node = wait_for(Duration::from_secs(90), || async {
            pods.get(&wffc).await.ok()?.spec?.node_name
        })
        .await;
        kcm.check();
        assert_eq!(
            node.as_deref(),
            Some("n3"),
            "{scheduler}: the volume's node"
        );
        let c = pvcs.get(&claim).await.unwrap();
        assert_eq!(
            c.spec.and_then(|s| s.volume_name).as_deref(),
            Some(format!("local-n3-{tag}").as_str()),
            "{scheduler}: the claim is bound to the local volume"
        );
        assert_eq!(
            c.status.and_then(|s| s.phase).as_deref(),
            Some("Bound"),
            "{scheduler}"
        );
        let small = pvs.get(&format!("small-n1-{tag}")).await.unwrap();
        assert!(
            small.spec.and_then(|s| s.claim_ref).is_none(),
            "{scheduler}: the decoy stays free"
        );
        for (pod, phrase) in [
            (
                &missing,
                "persistentvolumeclaim \"no-such-claim\" not found",
            ),
            (&immediate, "unbound immediate PersistentVolumeClaims"),
        ] {
            let ev = wait_event(&e.c, "ml", pod, "FailedScheduling: ", 60)
                .await
                .unwrap_or_else(|| panic!("{scheduler}: {pod} told why"));
            assert!(ev.iter().any(|m| m.contains(phrase)), "{scheduler}: {ev:?}");
            if tag == "ours" && pod == &immediate {
                assert!(
                    ev.iter().any(|m| m.contains("immediate-ours")),
                    "gpusched names the claim: {ev:?}"
                );
            }
            assert!(
                pods.get(pod)
                    .await
                    .unwrap()
                    .spec
                    .unwrap()
                    .node_name
                    .is_none(),
                "{scheduler}: {pod} stays pending"
            );
        }
        eprintln!(
            "{scheduler}: {wffc} on n3 with local-n3-{tag}; missing and immediate claims pending"
        );
        pods.delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &ListParams::default(),
        )
        .await
        .unwrap();
        wait_for(Duration::from_secs(60), || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await
        .expect("pods deleted");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// `namespaceSelector` narrower than `{}`: the same `app=db` pod runs in
/// namespace team-a (label team=a) on n3 and in team-b on n1; a pod
/// affine to `app=db` in namespaces labelled team=a goes to n3 under both
/// schedulers, and replicas that repel `app=db` in team a or b keep off
/// n1 and n3.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler (e2e/run)"]
async fn namespace_selectors_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::Namespace;
    let mut e = env().await;
    let nss: Api<Namespace> = Api::all(e.c.client.clone());
    for (ns, team, node) in [("team-a", "a", "n3"), ("team-b", "b", "n1")] {
        create_obj(
            &nss,
            json!({"metadata": {"name": ns, "labels": {"team": team}}}),
        )
        .await;
        let mut db = spec_pod("db", 1, json!({"app": "db"}), json!({}));
        db["spec"]["nodeName"] = json!(node);
        db["metadata"]["namespace"] = json!(ns);
        create(&e.c.pods(ns), db).await;
    }
    let term_in = |teams: Value| {
        json!({"labelSelector": {"matchLabels": {"app": "db"}}, "topologyKey": HOST,
               "namespaceSelector": {"matchExpressions": [{"key": "team", "operator": "In", "values": teams}]}})
    };
    let pods = vec![spec_pod(
        "client",
        1,
        json!({}),
        json!({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term_in(json!(["a"]))]}}}),
    )];
    // (the brute-force checker sees only the case's pods, not the anchors
    // in other namespaces: the outcome is asserted here instead)
    let c = &e.c;
    let both = |pods: Vec<Value>| async move {
        let kube = run_case(c, "default-scheduler", &pods).await;
        let ours = run_case(c, "gpusched", &pods).await;
        eprintln!("kube-scheduler {kube:?}\ngpusched       {ours:?}");
        Outcome { kube, ours }
    };
    let o = both(pods).await;
    assert_eq!(o.kube["client"].as_deref(), Some("n3"));
    assert_eq!(o.ours["client"].as_deref(), Some("n3"));

    let pods: Vec<Value> = (0..3)
        .map(|i| {
            spec_pod(
                &format!("web-{i}"),
                1,
                json!({"app": "web"}),
                json!({"affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    term_in(json!(["a", "b"])),
                    term("app", "web", HOST)]}}}),
            )
        })
        .collect();
    let o = both(pods).await;
    for p in [&o.kube, &o.ours] {
        let nodes: BTreeSet<&str> = p.values().flatten().map(String::as_str).collect();
        assert_eq!(nodes, BTreeSet::from(["n2", "n4"]), "{p:?}");
    }
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// CSI attach limits (kube-scheduler's NodeVolumeLimits), on kube-scheduler
/// and gpusched in turn: n2's CSINode allows one volume of the driver.
/// Claims pre-bound to CSI volumes (kube-controller-manager's PV
/// controller completes the binding); a pod using volume a goes to n2; a
/// pod with another volume pinned to n2 stays pending (`node(s) exceed max
/// volume count`), while a pod sharing volume a fits beside the first.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn csi_attach_limits_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
    const DRIVER: &str = "csi.example.com";
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let csinodes: Api<CSINode> = Api::all(e.c.client.clone());
    create_obj(
        &csinodes,
        json!({"metadata": {"name": "n2"}, "spec": {"drivers": [
            {"name": DRIVER, "nodeID": "n2", "allocatable": {"count": 1}}]}}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "csi"}, "provisioner": DRIVER,
               "volumeBindingMode": "Immediate"}),
    )
    .await;
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    let claim_pod = |name: &str, scheduler: &str, claim: &str| {
        let mut p = spec_pod(
            name,
            1,
            json!({}),
            json!({"nodeSelector": {HOST: "n2"},
                   "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        p
    };
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        for v in ["a", "b"] {
            let claim = format!("{v}-{tag}");
            create_obj(
                &pvs,
                json!({"metadata": {"name": format!("csi-{claim}")},
                       "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                                "capacity": {"storage": "1Gi"},
                                "persistentVolumeReclaimPolicy": "Retain",
                                "csi": {"driver": DRIVER, "volumeHandle": format!("handle-{claim}")},
                                "claimRef": {"namespace": "ml", "name": claim}}}),
            )
            .await;
            create_obj(
                &pvcs,
                json!({"metadata": {"name": claim},
                       "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                                "volumeName": format!("csi-{claim}"),
                                "resources": {"requests": {"storage": "1Gi"}}}}),
            )
            .await;
        }
        wait_for(Duration::from_secs(60), || async {
            let all = pvcs.list(&ListParams::default()).await.ok()?.items;
            all.iter()
                .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.ends_with(tag)))
                .all(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .then_some(())
        })
        .await
        .expect("the PV controller binds the pre-bound claims");
        kcm.check();
        let first = format!("first-{tag}");
        create(&pods, claim_pod(&first, scheduler, &format!("a-{tag}"))).await;
        let node = wait_for(Duration::from_secs(60), || async {
            pods.get(&first).await.ok()?.spec?.node_name
        })
        .await;
        assert_eq!(node.as_deref(), Some("n2"), "{scheduler}");
        let second = format!("second-{tag}");
        let shares = format!("shares-{tag}");
        create(&pods, claim_pod(&second, scheduler, &format!("b-{tag}"))).await;
        create(&pods, claim_pod(&shares, scheduler, &format!("a-{tag}"))).await;
        let node = wait_for(Duration::from_secs(60), || async {
            pods.get(&shares).await.ok()?.spec?.node_name
        })
        .await;
        assert_eq!(
            node.as_deref(),
            Some("n2"),
            "{scheduler}: a volume already on the node counts once"
        );
        let ev = wait_event(&e.c, "ml", &second, "FailedScheduling: ", 60)
            .await
            .unwrap_or_else(|| panic!("{scheduler}: {second} told why"));
        assert!(
            ev.iter().any(|m| m.contains("exceed max volume count")),
            "{scheduler}: {ev:?}"
        );
        assert!(
            pods.get(&second)
                .await
                .unwrap()
                .spec
                .unwrap()
                .node_name
                .is_none(),
            "{scheduler}: {second} stays pending"
        );
        eprintln!("{scheduler}: {first} and {shares} on n2; {second} pending: {ev:?}");
        pods.delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &ListParams::default(),
        )
        .await
        .unwrap();
        wait_for(Duration::from_secs(60), || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await
        .expect("pods deleted");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// Storage capacity for provisioning, on kube-scheduler and gpusched in
/// turn: the class's CSI driver publishes capacity (`CSIDriver`
/// `storageCapacity: true`), and only n4's `CSIStorageCapacity` holds the
/// 10Gi claim (n1's holds 1Gi, the others publish none), so the pod goes to
/// n4. The test plays the external provisioner: it waits for
/// `volume.kubernetes.io/selected-node` on the claim and creates a volume
/// bound to it on that node, as the external-provisioner sidecar does;
/// kube-controller-manager's PV controller completes the binding.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn storage_capacity_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
    const DRIVER: &str = "capacity.example.com";
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let drivers: Api<CSIDriver> = Api::all(e.c.client.clone());
    create_obj(
        &drivers,
        json!({"metadata": {"name": DRIVER}, "spec": {"storageCapacity": true}}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "cap"}, "provisioner": DRIVER,
               "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await;
    let caps: Api<CSIStorageCapacity> = Api::namespaced(e.c.client.clone(), "ml");
    for (node, size) in [("n1", "1Gi"), ("n4", "100Gi")] {
        create_obj(
            &caps,
            json!({"metadata": {"name": format!("cap-{node}")}, "storageClassName": "cap",
                   "capacity": size,
                   "nodeTopology": {"matchLabels": {HOST: node}}}),
        )
        .await;
    }
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        let claim = format!("scratch-{tag}");
        create_obj(
            &pvcs,
            json!({"metadata": {"name": claim},
                   "spec": {"storageClassName": "cap", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "10Gi"}}}}),
        )
        .await;
        let name = format!("cap-{tag}");
        let mut p = spec_pod(
            &name,
            1,
            json!({}),
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        create(&pods, p).await;
        // the provisioner's part
        let selected = wait_for(Duration::from_secs(60), || async {
            pvcs.get(&claim)
                .await
                .ok()?
                .metadata
                .annotations?
                .get("volume.kubernetes.io/selected-node")
                .cloned()
        })
        .await;
        assert_eq!(
            selected.as_deref(),
            Some("n4"),
            "{scheduler}: provisioning asked where the capacity is"
        );
        create_obj(
            &pvs,
            json!({"metadata": {"name": format!("pv-{claim}")},
                   "spec": {"storageClassName": "cap", "accessModes": ["ReadWriteOnce"],
                            "capacity": {"storage": "10Gi"},
                            "persistentVolumeReclaimPolicy": "Retain",
                            "csi": {"driver": DRIVER, "volumeHandle": format!("h-{claim}")},
                            "claimRef": {"namespace": "ml", "name": claim},
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": HOST, "operator": "In", "values": ["n4"]}]}]}}}}),
        )
        .await;
        let node = wait_for(Duration::from_secs(90), || async {
            pods.get(&name).await.ok()?.spec?.node_name
        })
        .await;
        kcm.check();
        assert_eq!(node.as_deref(), Some("n4"), "{scheduler}");
        eprintln!("{scheduler}: {name} provisioned and bound on n4");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

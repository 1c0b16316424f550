use super::*;
use crate::openb::{parse_nodes, parse_pods};

/// Nodes and pods from openb-format tables.
fn tables(nodes: &str, pods: &str) -> (Vec<Node>, Vec<Pod>) {
    let nodes = parse_nodes("n.csv", nodes).unwrap();
    let pods = parse_pods("p.csv", pods)
        .unwrap()
        .into_iter()
        .map(|t| t.pod)
        .collect();
    (nodes, pods)
}

fn small() -> (Vec<Node>, Vec<Pod>) {
    tables(
        "sn,cpu_milli,memory_mib,gpu,model\n\
         a,32000,131072,4,T4\nb,32000,131072,4,T4\nc,64000,262144,8,V100M32\n",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n\
         p0,4000,8192,1,1000,\np1,2000,4096,1,500,\np2,2000,4096,1,250,\n\
         p3,8000,8192,2,1000,\np4,1000,1024,0,0,\np5,4000,4096,1,300,V100M32\n",
    )
}

#[test]
fn published_results_parse() {
    let text = "workload,sc_policy,tune,seed,total_gpus,99,100\n\
        w,06-FGD,1.3,42,6212,94.0,95.14\nw,06-FGD,1.3,43,6212,94.1,95.06\n\
        x,06-FGD,1.3,42,6212,1,2\nw,07-Other,1.3,42,6212,1,2\n";
    let p = parse_published("a.csv", text, "w").unwrap();
    assert_eq!(p.len(), 1);
    assert_eq!(p["fgd"], vec![(42, 95.14), (43, 95.06)]);
    assert!(parse_published("a.csv", "workload,seed\n", "w").is_err());
    assert!(parse_published("a.csv", text, "zzz").unwrap().is_empty());
}

#[test]
fn workload_reaches_the_target_and_is_seeded() {
    let (_, pods) = small();
    let w = workload(&pods, 16_000, 1.3, 42);
    let total: u64 = w.iter().map(|&i| demand_milli(&pods[i])).sum();
    assert!(total as f64 <= 1.3 * 16_000.0);
    assert!(total as f64 > 1.3 * 16_000.0 - 2000.0);
    for i in 0..pods.len() {
        assert!(w.contains(&i), "every trace pod is kept");
    }
    assert_eq!(w, workload(&pods, 16_000, 1.3, 42));
    assert_ne!(w, workload(&pods, 16_000, 1.3, 43));
    // more than the target: pods are removed
    let w = workload(&pods, 2000, 1.3, 1);
    let total: u64 = w.iter().map(|&i| demand_milli(&pods[i])).sum();
    assert!(total <= 2600);
}

#[test]
fn every_policy_runs_deterministically_and_never_overcommits() {
    let (nodes, pods) = small();
    let m = FgdMethod {
        threads: 2,
        ..Default::default()
    };
    for p in packing::POLICY_NAMES {
        let a = run(&m, &nodes, &pods, p, &[1, 2, 3]).unwrap();
        let b = run(&m, &nodes, &pods, p, &[1, 2, 3]).unwrap();
        assert_eq!(a, b, "{p}");
        for r in &a.runs {
            assert!(r.final_alloc <= 100.0 + 1e-9, "{p}");
            assert_eq!(r.placed + r.skipped, r.pods);
            assert_eq!(r.alloc_curve.len(), MAX_ARRIVED_PCT + 1);
            assert!(r.alloc_curve.iter().flatten().all(|&x| x <= 100.0));
        }
    }
    assert!(run(&m, &nodes, &pods, "nope", &[1]).is_err());
}

/// A packer as given, counting its `place` calls, with its generation
/// or with none (then every decision scores every node again).
struct Counted {
    inner: Box<dyn Packer>,
    forward_generation: bool,
    calls: AtomicUsize,
}

impl Packer for Counted {
    fn name(&self) -> &'static str {
        self.inner.name()
    }
    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        self.inner.prepare(env)
    }
    fn scheduling_key(&self, pod: &Pod, key: &mut SchedulingKey) {
        self.inner.scheduling_key(pod, key)
    }
    fn place(
        &self,
        pod: &Pod,
        node: NodeId,
        state: &ClusterState<'_>,
    ) -> Option<gpusched_core::Placement> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.inner.place(pod, node, state)
    }
    fn generation(&self) -> Option<u64> {
        self.inner.generation().filter(|_| self.forward_generation)
    }
}

/// 24 nodes of three sizes and models, and pods of every kind: shares,
/// whole and multi-GPU pods, CPU-only pods and pods restricted to a
/// model (so `gpusched`'s scarcity levels move while it fills).
fn mixed() -> (Vec<Node>, Vec<Pod>) {
    let mut nodes = String::from("sn,cpu_milli,memory_mib,gpu,model\n");
    for i in 0..24 {
        let (cpu, gpus, model) = [(32000, 2, "T4"), (64000, 4, "P100"), (96000, 8, "G2")][i % 3];
        nodes.push_str(&format!("n{i},{cpu},262144,{gpus},{model}\n"));
    }
    let mut pods = String::from("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\n");
    for i in 0..60 {
        let (cpu, gpus, milli, spec) = [
            (4000, 1, 1000, ""),
            (2000, 1, 500, ""),
            (6000, 1, 300, "T4"),
            (16000, 2, 1000, ""),
            (3000, 0, 0, ""),
            (8000, 4, 1000, "G2"),
            (1000, 1, 800, ""),
            (12000, 8, 1000, ""),
            (2000, 1, 1000, "P100|T4"),
        ][i % 9];
        pods.push_str(&format!("p{i},{cpu},8192,{gpus},{milli},{spec}\n"));
    }
    tables(&nodes, &pods)
}

#[test]
fn cached_placements_give_the_same_run_with_fewer_calls() {
    let (nodes, pods) = mixed();
    let profile = Profile::from_pods(&pods);
    for budget in [0, 5] {
        let m = FgdMethod {
            move_budget: budget,
            ..Default::default()
        };
        for p in packing::POLICY_NAMES {
            let packer = |forward_generation| Counted {
                inner: packing::by_name(
                    p,
                    &PackerOptions {
                        profile: Some(profile.clone()),
                        gpusched: None,
                    },
                )
                .unwrap(),
                forward_generation,
                calls: AtomicUsize::new(0),
            };
            for seed in [1, 2] {
                let (mut cached, mut uncached) = (packer(true), packer(false));
                let a = run_seed_with(&m, &nodes, &pods, &mut cached, &profile, seed).unwrap();
                let b = run_seed_with(&m, &nodes, &pods, &mut uncached, &profile, seed).unwrap();
                assert_eq!(a, b, "{p}, budget {budget}, seed {seed}");
                assert_eq!(a, run_seed(&m, &nodes, &pods, p, &profile, seed).unwrap());
                let (ca, cb) = (cached.calls.into_inner(), uncached.calls.into_inner());
                if cached.inner.generation().is_some() {
                    assert!(ca < cb, "{p}: {ca} calls cached, {cb} not");
                } else {
                    assert_eq!(ca, cb, "{p}");
                }
            }
        }
    }
}

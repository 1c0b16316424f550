//! Seeded random pod specs: gpusched and kube-scheduler agree.

use super::*;

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

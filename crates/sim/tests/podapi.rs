//! The simulator honours the Pod API constraints through the same core:
//! inference replicas with anti-affinity and rack spread, one trainer per
//! node (fixtures/workloads/replicas.yaml). Every cycle's binds are checked
//! by brute force (`gpusched_testkit::constraint_violations`).

mod common;

use gpusched_core::{CycleOutput, Decision, Snapshot};
use gpusched_sim::Hooks;
use std::collections::{BTreeMap, BTreeSet};

#[derive(Default)]
struct Check {
    violations: Vec<String>,
    /// Nodes each pod was bound to.
    bound: BTreeMap<String, String>,
}

impl Hooks for Check {
    fn cycle_seen(&mut self, now_ms: u64, snap: &Snapshot, out: &CycleOutput) {
        for v in gpusched_testkit::constraint_violations(snap, out) {
            self.violations.push(format!("at {now_ms} ms: {v}"));
        }
        for d in &out.decisions {
            if let Decision::Bind { pod, node, .. } = d {
                self.bound.insert(
                    snap.pods[*pod as usize].pod.name.clone(),
                    snap.nodes[*node as usize].name.clone(),
                );
            }
        }
    }
}

#[test]
fn replicas_and_trainers_keep_their_constraints_in_the_simulator() {
    let sc = common::scenario("dgx-h100.yaml", "replicas.yaml", 1);
    let mut hooks = Check::default();
    let r = gpusched_sim::run(&sc, &mut common::scheduler(), 1, &mut hooks);
    common::assert_clean(&r);
    assert!(hooks.violations.is_empty(), "{:#?}", hooks.violations);
    // each web instance: 4 replicas on 4 distinct nodes; each trainer gang
    // likewise
    for job in ["web-0", "web-1", "web-2", "trainer-0", "trainer-1"] {
        let nodes: BTreeSet<&String> = hooks
            .bound
            .iter()
            .filter(|(p, _)| p.starts_with(&format!("{job}-")))
            .map(|(_, n)| n)
            .collect();
        assert_eq!(nodes.len(), 4, "{job}: {:?}", hooks.bound);
    }
}

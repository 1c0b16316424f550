//! PodTopologySpread: `topologySpreadConstraints` as kube-scheduler's
//! plugin of that name defines them.
//!
//! For each constraint, the pods counted are those of the pod's namespace
//! that the selector matches, not terminating, on nodes that carry every
//! topology key of the pod's constraints of the same kind and that pass
//! the constraint's node inclusion policies (`nodeAffinityPolicy: Honor`,
//! the default: the pod's node selector and required node affinity;
//! `nodeTaintsPolicy: Honor`: its tolerations of NoSchedule/NoExecute
//! taints; `Ignore`, the taints default: every node). Those nodes' domains
//! are the eligible domains; the global minimum is the smallest count over
//! them, or 0 when there are fewer than `minDomains`.
//!
//! - `DoNotSchedule` (filter): a node without the key is refused; else the
//!   count of its domain, plus one if the pod matches its own selector,
//!   minus the global minimum, may not exceed `maxSkew`.
//! - `ScheduleAnyway` (score): fewer matching pods in the node's domains
//!   (summed over the constraints) is better; a node without a key is
//!   the least liked.
//!
//! kube-scheduler's default cluster-level constraints (for pods of
//! Services and controllers without their own) are not applied: batch GPU
//! pods rarely want spreading, and their selectors come from Services
//! gpusched does not watch (docs/kubernetes.md).

use super::domains::{Domains, NONE, Placed};
use crate::config::ConstraintName;
use gpusched_core::{
    ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, PodPhase, Snapshot,
};
use gpusched_model::{
    LabelSelector, NodeSelectorTerm, Pod, SpreadPolicy, Toleration, WhenUnsatisfiable,
};
use std::cell::Cell;
use std::collections::BTreeMap;

/// The PodTopologySpread plugin (weight 2, as kube-scheduler's).
#[derive(Debug, Default)]
pub struct PodTopologySpread;

impl PodConstraint for PodTopologySpread {
    fn name(&self) -> &'static str {
        ConstraintName::PodTopologySpread.as_str()
    }
    fn weight(&self) -> i64 {
        2
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        !pod.constraints().spread.is_empty()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(State {
            snap: snapshot,
            domains: Domains::default(),
            placed: Placed::new(snapshot.nodes.len()),
            eligible: Vec::new(),
            eligible_index: BTreeMap::new(),
            counters: Vec::new(),
            counter_index: BTreeMap::new(),
            pre: vec![None; snapshot.pods.len()],
        })
    }
}

/// A pod's node selector (as pairs) and required node affinity terms.
type NodeAffinityKey = (Vec<(String, String)>, Vec<NodeSelectorTerm>);

/// What decides which nodes count for a constraint of a pod.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord)]
struct EligibleKey {
    /// Every topology key of the pod's constraints of this kind.
    keys: Vec<String>,
    /// The pod's node selector and required affinity (policy Honor).
    affinity: Option<NodeAffinityKey>,
    /// The pod's tolerations (policy Honor).
    tolerations: Option<Vec<Toleration>>,
}

/// Matching pods per domain for one (namespace, selector, key, eligible
/// node set).
struct Counter {
    ns: String,
    selector: Option<LabelSelector>,
    key: usize,
    eligible: usize,
    counts: Vec<i32>,
    /// Whether each domain has an eligible node.
    present: Vec<bool>,
    domains: u32,
    /// The smallest count over eligible domains (recomputed after a change).
    min: Cell<Option<i32>>,
}

impl Counter {
    fn min(&self) -> i32 {
        if let Some(m) = self.min.get() {
            return m;
        }
        let m = self
            .counts
            .iter()
            .zip(&self.present)
            .filter(|(_, p)| **p)
            .map(|(c, _)| *c)
            .min()
            .unwrap_or(i32::MAX);
        self.min.set(Some(m));
        m
    }
}

#[derive(Clone)]
struct Con {
    counter: usize,
    max_skew: i32,
    min_domains: u32,
    self_match: i32,
    hard: bool,
}

struct State<'s> {
    snap: &'s Snapshot,
    domains: Domains,
    placed: Placed,
    eligible: Vec<Vec<bool>>,
    eligible_index: BTreeMap<EligibleKey, usize>,
    counters: Vec<Counter>,
    counter_index: BTreeMap<(String, Option<LabelSelector>, usize, usize), usize>,
    pre: Vec<Option<Vec<Con>>>,
}

impl<'s> State<'s> {
    fn pod(&self, p: u32) -> &'s Pod {
        &self.snap.pods[p as usize].pod
    }

    /// Whether placed pod `q` counts at all (terminating pods do not).
    fn counts_pod(&self, q: u32) -> bool {
        !matches!(
            self.snap.pods[q as usize].phase,
            PodPhase::Terminating { .. }
        )
    }

    fn eligible_set(&mut self, k: EligibleKey) -> usize {
        if let Some(&e) = self.eligible_index.get(&k) {
            return e;
        }
        let mask = self
            .snap
            .nodes
            .iter()
            .map(|n| {
                k.keys
                    .iter()
                    .all(|key| super::domains::value(n, key).is_some())
                    && k.affinity.as_ref().is_none_or(|(sel, terms)| {
                        sel.iter().all(|(a, b)| n.label(a) == Some(b))
                            && (terms.is_empty()
                                || terms.iter().any(|t| t.matches(&n.name, &n.labels)))
                    })
                    && k.tolerations.as_ref().is_none_or(|tols| {
                        n.taints
                            .iter()
                            .filter(|t| t.effect != gpusched_model::TaintEffect::PreferNoSchedule)
                            .all(|t| tols.iter().any(|tol| tol.tolerates(t)))
                    })
            })
            .collect();
        self.eligible.push(mask);
        self.eligible_index.insert(k, self.eligible.len() - 1);
        self.eligible.len() - 1
    }

    fn counter(
        &mut self,
        ns: &str,
        selector: &Option<LabelSelector>,
        key: usize,
        e: usize,
    ) -> usize {
        let k = (ns.to_string(), selector.clone(), key, e);
        if let Some(&c) = self.counter_index.get(&k) {
            return c;
        }
        let kd = self.domains.get(key);
        let mut counts = vec![0i32; kd.count];
        let mut present = vec![false; kd.count];
        for (n, pods) in self.placed.on.iter().enumerate() {
            let d = kd.of_node[n];
            if d == NONE || !self.eligible[e][n] {
                continue;
            }
            present[d as usize] = true;
            for &q in pods {
                let qp = self.pod(q);
                if self.counts_pod(q)
                    && qp.namespace == ns
                    && selector.as_ref().is_some_and(|s| s.matches(&qp.labels))
                {
                    counts[d as usize] += 1;
                }
            }
        }
        let domains = present.iter().filter(|p| **p).count() as u32;
        self.counters.push(Counter {
            ns: ns.to_string(),
            selector: selector.clone(),
            key,
            eligible: e,
            counts,
            present,
            domains,
            min: Cell::new(None),
        });
        self.counter_index.insert(k, self.counters.len() - 1);
        self.counters.len() - 1
    }

    fn update(&mut self, q: u32, n: NodeId, by: i32) {
        if self.counters.is_empty() || !self.counts_pod(q) {
            return;
        }
        let pod = self.pod(q);
        for c in &mut self.counters {
            let d = self.domains.of(c.key, n);
            if d != NONE
                && self.eligible[c.eligible][n as usize]
                && c.ns == pod.namespace
                && c.selector.as_ref().is_some_and(|s| s.matches(&pod.labels))
            {
                c.counts[d as usize] += by;
                c.min.set(None);
            }
        }
    }

    fn prepare(&mut self, pod: &'s Pod) -> Vec<Con> {
        let Some(cons) = pod.constraints.as_deref() else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for hard in [true, false] {
            let kind = if hard {
                WhenUnsatisfiable::DoNotSchedule
            } else {
                WhenUnsatisfiable::ScheduleAnyway
            };
            let list: Vec<_> = cons
                .spread
                .iter()
                .filter(|c| c.when_unsatisfiable == kind)
                .collect();
            let keys: Vec<String> = list.iter().map(|c| c.topology_key.clone()).collect();
            for c in list {
                let e = self.eligible_set(EligibleKey {
                    keys: keys.clone(),
                    affinity: (c.node_affinity_policy == SpreadPolicy::Honor).then(|| {
                        (
                            pod.node_selector
                                .iter()
                                .map(|(a, b)| (a.clone(), b.clone()))
                                .collect(),
                            pod.affinity.clone(),
                        )
                    }),
                    tolerations: (c.node_taints_policy == SpreadPolicy::Honor)
                        .then(|| pod.tolerations.clone()),
                });
                let key = self.domains.key(&self.snap.nodes, &c.topology_key);
                let counter = self.counter(&pod.namespace, &c.selector, key, e);
                let self_match = c.selector.as_ref().is_some_and(|s| s.matches(&pod.labels));
                out.push(Con {
                    counter,
                    max_skew: c.max_skew.max(1) as i32,
                    min_domains: c.min_domains.unwrap_or(1),
                    self_match: self_match as i32,
                    hard,
                });
            }
        }
        out
    }
}

impl ConstraintState for State<'_> {
    fn add_pod(&mut self, pod: PodId, node: NodeId) {
        self.placed.add(pod, node);
        self.update(pod, node, 1);
    }

    fn remove_pod(&mut self, pod: PodId, node: NodeId) {
        self.placed.remove(pod, node);
        self.update(pod, node, -1);
    }

    fn pre_filter(&mut self, p: PodId) -> Needs {
        let pod = self.pod(p);
        if pod
            .constraints
            .as_deref()
            .is_none_or(|c| c.spread.is_empty())
        {
            return Needs::NONE;
        }
        if self.pre[p as usize].is_none() {
            let cons = self.prepare(pod);
            self.pre[p as usize] = Some(cons);
        }
        let cons = self.pre[p as usize].as_deref().unwrap_or(&[]);
        Needs {
            filter: cons.iter().any(|c| c.hard),
            score: cons.iter().any(|c| !c.hard),
        }
    }

    fn filter(&self, p: PodId, n: NodeId) -> FilterResult {
        let Some(cons) = self.pre[p as usize].as_deref() else {
            return FilterResult::Pass;
        };
        for c in cons.iter().filter(|c| c.hard) {
            let k = &self.counters[c.counter];
            let d = self.domains.of(k.key, n);
            if d == NONE {
                return FilterResult::Reject(
                    "node(s) didn't match pod topology spread constraints (missing required label)"
                        .into(),
                );
            }
            let min = if k.domains < c.min_domains {
                0
            } else {
                k.min()
            };
            let skew = k.counts[d as usize] as i64 + c.self_match as i64 - min as i64;
            if skew > c.max_skew as i64 {
                return FilterResult::Reject(
                    "node(s) didn't match pod topology spread constraints".into(),
                );
            }
        }
        FilterResult::Pass
    }

    fn score(&self, p: PodId, n: NodeId) -> Option<i64> {
        let cons = self.pre[p as usize].as_deref()?;
        let mut s = 0i64;
        for c in cons.iter().filter(|c| !c.hard) {
            let k = &self.counters[c.counter];
            let d = self.domains.of(k.key, n);
            if d == NONE {
                return None;
            }
            s -= k.counts[d as usize] as i64;
        }
        Some(s)
    }
}

//! InterPodAffinity: required and preferred pod affinity and
//! anti-affinity, as kube-scheduler's plugin of that name defines them.
//!
//! Filter (all must hold on the node):
//! - every required affinity term of the pod has a matching pod in the
//!   node's domain (the node must carry every term's topology key); the
//!   first pod of a group that is affine to itself may go anywhere with
//!   the keys: when no pod anywhere matches any of its terms and the pod
//!   matches all of them itself;
//! - no required anti-affinity term of the pod has a matching pod in the
//!   node's domain (a node without the key passes);
//! - no pod in the node's domain has a required anti-affinity term that
//!   matches the pod (symmetry).
//!
//! Score: for each pod in the node's domain, + weight of each preferred
//! affinity term of the pod it matches, − weight of each preferred
//! anti-affinity term; symmetrically + (−) the weight of each preferred
//! affinity (anti-affinity) term of that pod matching the incoming pod,
//! and + `hard_pod_affinity_weight` (1) for each of its required affinity
//! terms matching it.
//!
//! Counts are kept per distinct term (owner namespace + term) and domain,
//! updated on every placement and removal, so gang members and preemption
//! what-ifs see each other.

use super::domains::{Domains, NONE, Placed};
use crate::config::ConstraintName;
use gpusched_core::{ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, Snapshot};
use gpusched_model::{Pod, PodAffinityTerm};
use std::collections::BTreeMap;

/// kube-scheduler's default `hardPodAffinityWeight`.
const HARD_POD_AFFINITY_WEIGHT: i64 = 1;

/// The InterPodAffinity plugin (weight 2, as kube-scheduler's).
#[derive(Debug, Default)]
pub struct InterPodAffinity;

impl PodConstraint for InterPodAffinity {
    fn name(&self) -> &'static str {
        ConstraintName::InterPodAffinity.as_str()
    }
    fn weight(&self) -> i64 {
        2
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        pod.constraints().has_pod_terms()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(State {
            snap: snapshot,
            domains: Domains::default(),
            placed: Placed::new(snapshot.nodes.len()),
            counters: Vec::new(),
            counter_index: BTreeMap::new(),
            carried: Vec::new(),
            carried_index: BTreeMap::new(),
            pre: vec![None; snapshot.pods.len()],
        })
    }
}

/// Matching pods per domain of one term carried by pending pods.
struct Counter {
    owner_ns: String,
    term: PodAffinityTerm,
    key: usize,
    counts: Vec<i32>,
    total: i64,
}

/// What a term carried by placed pods is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    RequiredAnti,
    RequiredAffinity,
    /// A preferred term with its signed weight (anti-affinity negative).
    Preferred(i64),
}

/// Placed pods per domain carrying one distinct term.
struct Carried {
    kind: Kind,
    owner_ns: String,
    term: PodAffinityTerm,
    key: usize,
    counts: Vec<i32>,
}

/// A pending pod's pre-filter: handles to live counts.
#[derive(Clone, Default)]
struct Pre {
    affinity: Vec<usize>,
    anti: Vec<usize>,
    /// Whether the pod matches all its own required affinity terms.
    self_affine: bool,
    preferred: Vec<(i64, usize)>,
    /// Carried required anti-affinity terms matching the pod.
    sym_anti: Vec<usize>,
    /// Carried scoring terms matching the pod, with their weight.
    sym_score: Vec<(i64, usize)>,
    /// How many carried terms were looked at.
    carried_seen: usize,
}

struct State<'s> {
    snap: &'s Snapshot,
    domains: Domains,
    placed: Placed,
    counters: Vec<Counter>,
    counter_index: BTreeMap<(String, PodAffinityTerm), usize>,
    carried: Vec<Carried>,
    carried_index: BTreeMap<(Kind, String, PodAffinityTerm), usize>,
    pre: Vec<Option<Box<Pre>>>,
}

impl<'s> State<'s> {
    fn pod(&self, p: u32) -> &'s Pod {
        &self.snap.pods[p as usize].pod
    }

    /// The counter of `term` carried by a pod of `owner_ns` (built from
    /// the placed pods the first time).
    fn counter(&mut self, owner_ns: &str, term: &PodAffinityTerm) -> usize {
        let k = (owner_ns.to_string(), term.clone());
        if let Some(&c) = self.counter_index.get(&k) {
            return c;
        }
        let key = self.domains.key(&self.snap.nodes, &term.topology_key);
        let kd = self.domains.get(key);
        let mut counts = vec![0i32; kd.count];
        let mut total = 0;
        for (n, pods) in self.placed.on.iter().enumerate() {
            let d = kd.of_node[n];
            if d == NONE {
                continue;
            }
            for &q in pods {
                let qp = self.pod(q);
                if term.matches(owner_ns, &qp.namespace, &qp.labels) {
                    counts[d as usize] += 1;
                    total += 1;
                }
            }
        }
        self.counters.push(Counter {
            owner_ns: k.0.clone(),
            term: term.clone(),
            key,
            counts,
            total,
        });
        self.counter_index.insert(k, self.counters.len() - 1);
        self.counters.len() - 1
    }

    fn update(&mut self, q: u32, n: NodeId, by: i32) {
        let pod = self.pod(q);
        for c in &mut self.counters {
            let d = self.domains.of(c.key, n);
            if d != NONE && c.term.matches(&c.owner_ns, &pod.namespace, &pod.labels) {
                c.counts[d as usize] += by;
                c.total += by as i64;
            }
        }
        let Some(cons) = pod.constraints.as_deref() else {
            return;
        };
        if !cons.has_pod_terms() {
            return;
        }
        let terms = cons
            .required_anti_affinity
            .iter()
            .map(|t| (Kind::RequiredAnti, t))
            .chain(
                cons.required_affinity
                    .iter()
                    .map(|t| (Kind::RequiredAffinity, t)),
            )
            .chain(
                cons.preferred_affinity
                    .iter()
                    .map(|w| (Kind::Preferred(w.weight as i64), &w.term)),
            )
            .chain(
                cons.preferred_anti_affinity
                    .iter()
                    .map(|w| (Kind::Preferred(-(w.weight as i64)), &w.term)),
            );
        for (kind, term) in terms {
            let k = (kind, pod.namespace.clone(), term.clone());
            let c = match self.carried_index.get(&k) {
                Some(&c) => c,
                None => {
                    let key = self.domains.key(&self.snap.nodes, &term.topology_key);
                    let count = self.domains.get(key).count;
                    self.carried.push(Carried {
                        kind,
                        owner_ns: pod.namespace.clone(),
                        term: term.clone(),
                        key,
                        counts: vec![0; count],
                    });
                    self.carried_index.insert(k, self.carried.len() - 1);
                    self.carried.len() - 1
                }
            };
            let e = &mut self.carried[c];
            let d = self.domains.of(e.key, n);
            if d != NONE {
                e.counts[d as usize] += by;
            }
        }
    }

    fn count(&self, c: &Counter, n: NodeId) -> Option<i32> {
        let d = self.domains.of(c.key, n);
        (d != NONE).then(|| c.counts[d as usize])
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
        if self.carried.is_empty() && !pod.constraints().has_pod_terms() {
            // nothing placed carries a term, and the pod has none
            return Needs::NONE;
        }
        let mut pre = match self.pre[p as usize].take() {
            Some(pre) => pre,
            None => {
                let mut pre = Box::<Pre>::default();
                if let Some(cons) = pod.constraints.as_deref() {
                    for t in &cons.required_affinity {
                        pre.affinity.push(self.counter(&pod.namespace, t));
                    }
                    pre.self_affine = cons
                        .required_affinity
                        .iter()
                        .all(|t| t.matches(&pod.namespace, &pod.namespace, &pod.labels));
                    for t in &cons.required_anti_affinity {
                        pre.anti.push(self.counter(&pod.namespace, t));
                    }
                    for w in &cons.preferred_affinity {
                        pre.preferred
                            .push((w.weight as i64, self.counter(&pod.namespace, &w.term)));
                    }
                    for w in &cons.preferred_anti_affinity {
                        pre.preferred
                            .push((-(w.weight as i64), self.counter(&pod.namespace, &w.term)));
                    }
                }
                pre
            }
        };
        // terms placed pods carry, new since the last look
        for (i, c) in self.carried.iter().enumerate().skip(pre.carried_seen) {
            if !c.term.matches(&c.owner_ns, &pod.namespace, &pod.labels) {
                continue;
            }
            match c.kind {
                Kind::RequiredAnti => pre.sym_anti.push(i),
                Kind::RequiredAffinity => pre.sym_score.push((HARD_POD_AFFINITY_WEIGHT, i)),
                Kind::Preferred(w) => pre.sym_score.push((w, i)),
            }
        }
        pre.carried_seen = self.carried.len();
        let needs = Needs {
            filter: !(pre.affinity.is_empty() && pre.anti.is_empty() && pre.sym_anti.is_empty()),
            score: !(pre.preferred.is_empty() && pre.sym_score.is_empty()),
        };
        self.pre[p as usize] = Some(pre);
        needs
    }

    fn filter(&self, p: PodId, n: NodeId) -> FilterResult {
        let Some(pre) = self.pre[p as usize].as_deref() else {
            return FilterResult::Pass;
        };
        let mut pods_exist = true;
        for &c in &pre.affinity {
            match self.count(&self.counters[c], n) {
                None => {
                    return FilterResult::Reject("node(s) didn't match pod affinity rules".into());
                }
                Some(k) if k <= 0 => pods_exist = false,
                Some(_) => {}
            }
        }
        if !pods_exist {
            // the first of a self-affine group may start anywhere
            let none_anywhere = pre.affinity.iter().all(|&c| self.counters[c].total <= 0);
            if !(none_anywhere && pre.self_affine) {
                return FilterResult::Reject("node(s) didn't match pod affinity rules".into());
            }
        }
        for &c in &pre.anti {
            if self.count(&self.counters[c], n).is_some_and(|k| k > 0) {
                return FilterResult::Reject("node(s) didn't match pod anti-affinity rules".into());
            }
        }
        for &c in &pre.sym_anti {
            let e = &self.carried[c];
            let d = self.domains.of(e.key, n);
            if d != NONE && e.counts[d as usize] > 0 {
                return FilterResult::Reject(
                    "node(s) didn't satisfy existing pods anti-affinity rules".into(),
                );
            }
        }
        FilterResult::Pass
    }

    fn score(&self, p: PodId, n: NodeId) -> Option<i64> {
        let pre = self.pre[p as usize].as_deref()?;
        let mut s = 0i64;
        for &(w, c) in &pre.preferred {
            s += w * self.count(&self.counters[c], n).unwrap_or(0) as i64;
        }
        for &(w, c) in &pre.sym_score {
            let e = &self.carried[c];
            let d = self.domains.of(e.key, n);
            if d != NONE {
                s += w * e.counts[d as usize] as i64;
            }
        }
        Some(s)
    }
}

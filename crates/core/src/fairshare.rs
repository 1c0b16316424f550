//! Queue accounting and hierarchical weighted fair share.
//!
//! For every queue the core computes, per dimension `d` (CPU, memory, GPU
//! milli, GPU memory):
//!
//! - `usage[d]`: what its running pods hold (children add up into parents);
//! - `demand[d] = min(usage[d] + pending[d], limit[d])`;
//! - `deserved[d]`, by water-filling each parent's deserved amount (the root
//!   has the cluster's capacity) over its children:
//!   1. every child first gets `min(guarantee[d], demand[d])`;
//!   2. the rest `R` is split among children still below their demand in
//!      proportion to their weights, `R · wᵢ / Σw`; a child that would pass its
//!      demand gets only its demand, and the excess is split again among the
//!      others, until nothing changes.
//!
//! Queues are then ordered by their dominant share against what they deserve,
//! `share(q) = maxᵈ usage[d] / deserved[d]` (parts per million; a dimension
//! with `deserved = 0` and `usage > 0` counts as over-served), compared
//! lexicographically from the root down the tree, so the most under-served
//! subtree goes first (hierarchical dominant-resource fairness).
#![allow(clippy::needless_range_loop)]

use crate::reason::{QueueProblem, QuotaRule, QuotaViolation};
use crate::snapshot::Snapshot;
use gpusched_model::{Queue, ResourceKind, ResourceVec};
use std::collections::BTreeMap;

/// The capacity fair shares are computed against: the allocatable of every
/// schedulable node, its GPUs counted as its healthy ones only (what a cycle
/// can place on). The one rule for the cycle, the report's queue tree and
/// the published Queue status.
pub fn schedulable_capacity(snap: &Snapshot) -> ResourceVec {
    let mut capacity = ResourceVec::default();
    for n in snap.nodes.iter().filter(|n| !n.unschedulable) {
        let mut a = n.allocatable.clone();
        a.gpu_milli =
            n.gpus.iter().filter(|g| g.is_healthy()).count() as u64 * gpusched_model::GPU_MILLI;
        capacity.add(&a);
    }
    capacity
}

/// Index of a queue in [`QueueTree::queues`].
pub type QueueIdx = usize;

/// The accounting of one queue (its subtree: children add up into it).
#[derive(Clone, Debug, Default)]
pub struct QueueAcct {
    /// What its running pods hold.
    pub usage: ResourceVec,
    /// What its pending pods ask for.
    pub pending: ResourceVec,
    /// `min(usage + pending, limit)`.
    pub demand: ResourceVec,
    /// Its fair share (water-filled; see the module documentation).
    pub deserved: ResourceVec,
    /// Its guarantee (GPU: plain plus per-model, [`gpu_guarantee`]).
    pub guarantee: ResourceVec,
}

/// The queue tree of a snapshot with its accounting.
#[derive(Clone, Debug)]
pub struct QueueTree {
    /// The queues (the first definition of each name).
    pub queues: Vec<Queue>,
    /// Each queue's parent (`None`: a child of the root).
    pub parent: Vec<Option<QueueIdx>>,
    /// Each queue's children.
    pub children: Vec<Vec<QueueIdx>>,
    /// The children of the root.
    pub roots: Vec<QueueIdx>,
    /// Each queue's accounting.
    pub acct: Vec<QueueAcct>,
    /// Queue index by name.
    pub by_name: BTreeMap<String, QueueIdx>,
}

const DIMS: usize = 4;
const DIM_KINDS: [ResourceKind; DIMS] = [
    ResourceKind::Cpu,
    ResourceKind::Memory,
    ResourceKind::Gpu,
    ResourceKind::GpuMemory,
];

fn dims(r: &ResourceVec) -> [u64; DIMS] {
    [r.cpu_milli, r.memory, r.gpu_milli, r.gpu_mem_mib]
}

fn set_dim(r: &mut ResourceVec, d: usize, v: u64) {
    match d {
        0 => r.cpu_milli = v,
        1 => r.memory = v,
        2 => r.gpu_milli = v,
        _ => r.gpu_mem_mib = v,
    }
}

/// A queue's GPU guarantee in milli-GPU: its plain GPU guarantee plus its
/// per-model guarantees (they add: `{gpu: 2, by model H100: 4}` guarantees
/// six GPUs, four of them H100).
pub fn gpu_guarantee(q: &Queue) -> u64 {
    q.gpu_guarantee_by_model
        .values()
        .fold(q.guarantee.gpu_milli, |a, b| a.saturating_add(*b))
}

impl QueueTree {
    /// Builds the tree. A queue whose parent is missing (or that would form
    /// a cycle) hangs off the root; it is reported through `problems`.
    pub fn build(queues: &[Queue]) -> (Self, Vec<QueueProblem>) {
        let mut problems = Vec::new();
        let mut by_name = BTreeMap::new();
        let mut qs: Vec<Queue> = Vec::new();
        for q in queues {
            if by_name.contains_key(&q.name) {
                problems.push(QueueProblem::Duplicate {
                    queue: q.name.clone(),
                });
                continue;
            }
            by_name.insert(q.name.clone(), qs.len());
            qs.push(q.clone());
        }
        let n = qs.len();
        let mut parent: Vec<Option<QueueIdx>> = qs
            .iter()
            .map(|q| {
                q.parent.as_ref().and_then(|p| {
                    let idx = by_name.get(p).copied();
                    if idx.is_none() {
                        problems.push(QueueProblem::MissingParent {
                            queue: q.name.clone(),
                            parent: p.clone(),
                        });
                    }
                    idx
                })
            })
            .collect();
        // break cycles: every queue on one is reported and hangs off the
        // root (flagging one member only would leave the others looking
        // fine while their parent chain is broken)
        for i in 0..n {
            let mut path: Vec<QueueIdx> = Vec::new();
            let mut on_path = vec![false; n];
            let mut cur = Some(i);
            while let Some(c) = cur {
                if on_path[c] {
                    let start = path.iter().position(|&x| x == c).unwrap_or(0);
                    let mut members = path[start..].to_vec();
                    members.sort_unstable();
                    for m in members {
                        problems.push(QueueProblem::Cycle {
                            queue: qs[m].name.clone(),
                        });
                        parent[m] = None;
                    }
                    break;
                }
                on_path[c] = true;
                path.push(c);
                cur = parent[c];
            }
        }
        let mut children = vec![Vec::new(); n];
        let mut roots = Vec::new();
        for i in 0..n {
            match parent[i] {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
        }
        let acct = qs
            .iter()
            .map(|q| {
                let mut g = q.guarantee.clone();
                g.gpu_milli = gpu_guarantee(q);
                QueueAcct {
                    guarantee: g,
                    ..Default::default()
                }
            })
            .collect();
        (
            QueueTree {
                queues: qs,
                parent,
                children,
                roots,
                acct,
                by_name,
            },
            problems,
        )
    }

    /// The queue called `name`.
    pub fn idx(&self, name: &str) -> Option<QueueIdx> {
        self.by_name.get(name).copied()
    }

    /// The queue and its ancestors, leaf first.
    pub fn path(&self, q: QueueIdx) -> Vec<QueueIdx> {
        let mut v = vec![q];
        let mut c = q;
        while let Some(p) = self.parent[c] {
            v.push(p);
            c = p;
        }
        v
    }

    /// Adds `r` to the usage of `q` and its ancestors.
    pub fn add_usage(&mut self, q: QueueIdx, r: &ResourceVec) {
        let mut at = Some(q);
        while let Some(a) = at {
            self.acct[a].usage.add(r);
            at = self.parent[a];
        }
    }

    /// Removes `r` from the usage of `q` and its ancestors.
    pub fn sub_usage(&mut self, q: QueueIdx, r: &ResourceVec) {
        for a in self.path(q) {
            self.acct[a].usage.sub(r);
        }
    }

    /// Adds `r` to the pending demand of `q` and its ancestors.
    pub fn add_pending(&mut self, q: QueueIdx, r: &ResourceVec) {
        let mut at = Some(q);
        while let Some(a) = at {
            self.acct[a].pending.add(r);
            at = self.parent[a];
        }
    }

    /// Usage and pending demand from the snapshot's pods.
    pub fn account(&mut self, snap: &Snapshot) {
        let queues: Vec<Option<QueueIdx>> =
            snap.pods.iter().map(|p| self.idx(&p.pod.queue)).collect();
        self.account_with(snap, &queues);
    }

    /// [`QueueTree::account`] with each pod's queue already looked up
    /// (`pod_queue[i]` for `snap.pods[i]`, from [`QueueTree::idx`]).
    pub fn account_with(&mut self, snap: &Snapshot, pod_queue: &[Option<QueueIdx>]) {
        for (p, q) in snap.pods.iter().zip(pod_queue) {
            // pods of an unknown queue are explained (QueueMissing), not counted
            let Some(q) = *q else {
                continue;
            };
            let d = p.pod.demand();
            if p.holding().is_some() {
                self.add_usage(q, &d);
            } else {
                self.add_pending(q, &d);
            }
        }
    }

    /// Computes `demand` and `deserved` for every queue against `capacity`.
    pub fn compute_deserved(&mut self, capacity: &ResourceVec) {
        for a in &mut self.acct {
            a.demand = a.usage.plus(&a.pending);
        }
        for (i, q) in self.queues.iter().enumerate() {
            if let Some(l) = &q.limit {
                let capped = l.clamp(&self.acct[i].demand);
                let mut d = self.acct[i].demand.clone();
                for k in 0..DIMS {
                    set_dim(&mut d, k, dims(&capped)[k]);
                }
                self.acct[i].demand = d;
            }
        }
        let roots = self.roots.clone();
        self.fill(&roots, capacity);
    }

    fn fill(&mut self, kids: &[QueueIdx], cap: &ResourceVec) {
        if kids.is_empty() {
            return;
        }
        let capd = dims(cap);
        let mut deserved: Vec<[u64; DIMS]> = vec![[0; DIMS]; kids.len()];
        for d in 0..DIMS {
            let demand: Vec<u64> = kids
                .iter()
                .map(|&k| dims(&self.acct[k].demand)[d])
                .collect();
            let mut got: Vec<u64> = kids
                .iter()
                .zip(&demand)
                .map(|(&k, &dm)| dims(&self.acct[k].guarantee)[d].min(dm))
                .collect();
            let mut rest = capd[d].saturating_sub(got.iter().sum());
            let mut active: Vec<usize> = (0..kids.len()).filter(|&i| got[i] < demand[i]).collect();
            while rest > 0 && !active.is_empty() {
                let wsum: u64 = active
                    .iter()
                    .map(|&i| self.queues[kids[i]].weight.max(1) as u64)
                    .sum();
                let mut saturated = Vec::new();
                for &i in &active {
                    let w = self.queues[kids[i]].weight.max(1) as u64;
                    let share = ((rest as u128 * w as u128) / wsum as u128) as u64;
                    if got[i] + share >= demand[i] {
                        saturated.push(i);
                    }
                }
                if saturated.is_empty() {
                    let mut given = 0;
                    for &i in &active {
                        let w = self.queues[kids[i]].weight.max(1) as u64;
                        let share = ((rest as u128 * w as u128) / wsum as u128) as u64;
                        got[i] += share;
                        given += share;
                    }
                    // integer remainder: one unit each, in order
                    let mut left = rest - given;
                    for &i in &active {
                        if left == 0 {
                            break;
                        }
                        got[i] += 1;
                        left -= 1;
                    }
                    rest = 0;
                } else {
                    for &i in &saturated {
                        rest -= demand[i] - got[i];
                        got[i] = demand[i];
                    }
                    active.retain(|i| !saturated.contains(i));
                }
            }
            for i in 0..kids.len() {
                deserved[i][d] = got[i];
            }
        }
        for (i, &k) in kids.iter().enumerate() {
            let mut r = ResourceVec::default();
            for d in 0..DIMS {
                set_dim(&mut r, d, deserved[i][d]);
            }
            self.acct[k].deserved = r.clone();
            let ch = self.children[k].clone();
            self.fill(&ch, &r);
        }
    }

    /// Dominant share of usage against deserved, in ppm.
    pub fn share_ppm(&self, q: QueueIdx) -> u64 {
        let a = &self.acct[q];
        let u = dims(&a.usage);
        let s = dims(&a.deserved);
        let mut m = 0u64;
        for d in 0..DIMS {
            let v = if s[d] == 0 {
                if u[d] > 0 { u64::MAX / 2 } else { 0 }
            } else {
                ((u[d] as u128 * 1_000_000) / s[d] as u128) as u64
            };
            m = m.max(v);
        }
        m
    }

    /// Ordering key: shares from the root down to `q`, then the name.
    pub fn order_key(&self, q: QueueIdx) -> Vec<u64> {
        let mut p = self.path(q);
        p.reverse();
        p.into_iter().map(|a| self.share_ppm(a)).collect()
    }

    /// Why `extra` would break a limit or a no-borrow rule of `q` or an
    /// ancestor; `None` if it is allowed. A queue that may not borrow is
    /// capped at its guarantee on every dimension its guarantee names
    /// (non-zero); other dimensions are not capped by that rule.
    pub fn quota_violation(&self, q: QueueIdx, extra: &ResourceVec) -> Option<QuotaViolation> {
        for a in self.path(q) {
            let queue = &self.queues[a];
            let after = self.acct[a].usage.plus(extra);
            if let Some(l) = &queue.limit
                && let Some(k) = l.first_exceeded_by(&after)
            {
                return Some(QuotaViolation {
                    queue: queue.name.clone(),
                    rule: QuotaRule::Limit,
                    would_use: after.get(&k),
                    cap: l.cap(&k).unwrap_or(0),
                    needs: extra.get(&k),
                    dimension: k,
                });
            }
            if !queue.can_borrow {
                let cap = &self.acct[a].guarantee;
                let over: Vec<_> = (0..DIMS)
                    .filter(|&d| {
                        dims(extra)[d] > 0 && dims(cap)[d] > 0 && dims(&after)[d] > dims(cap)[d]
                    })
                    .collect();
                if let Some(&d) = over.first() {
                    return Some(QuotaViolation {
                        queue: queue.name.clone(),
                        rule: QuotaRule::NoBorrow,
                        dimension: DIM_KINDS[d].clone(),
                        would_use: dims(&after)[d],
                        cap: dims(cap)[d],
                        needs: dims(extra)[d],
                    });
                }
            }
        }
        None
    }

    /// How much of `q`'s usage is above what it deserves (0 if none) on
    /// the GPU dimension, and above its guarantee.
    pub fn gpu_surplus(&self, q: QueueIdx) -> u64 {
        let a = &self.acct[q];
        a.usage
            .gpu_milli
            .saturating_sub(a.deserved.gpu_milli.max(a.guarantee.gpu_milli))
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn every_queue_on_a_parent_cycle_is_reported_and_hangs_off_the_root() {
        let mut a = Queue::new("a");
        a.parent = Some("b".into());
        let mut b = Queue::new("b");
        b.parent = Some("a".into());
        let mut c = Queue::new("c");
        c.parent = Some("a".into());
        let (t, problems) = QueueTree::build(&[a, b, c]);
        let cyc: Vec<&str> = problems
            .iter()
            .filter(|p| matches!(p, QueueProblem::Cycle { .. }))
            .map(|p| p.queue())
            .collect();
        assert_eq!(cyc, ["a", "b"]);
        assert_eq!(t.roots.len(), 2, "a and b hang off the root");
        assert_eq!(
            t.parent[t.idx("c").unwrap()],
            t.idx("a"),
            "c keeps its parent"
        );
    }

    use super::*;
    use gpusched_model::ResourceLimit;

    fn q(name: &str, w: u32, g: u64) -> Queue {
        let mut q = Queue::new(name);
        q.weight = w;
        q.guarantee.gpu_milli = g;
        q
    }

    #[test]
    fn schedulable_capacity_counts_healthy_gpus_of_schedulable_nodes() {
        use gpusched_testkit::node;
        let mut snap = Snapshot {
            nodes: vec![
                node("a").gpus(4).cpu("32").unhealthy_gpu(1).build(),
                node("b").gpus(8).cpu("64").unschedulable().build(),
                node("c").gpus(2).cpu("16").build(),
            ],
            ..Default::default()
        };
        // a node status whose allocatable still counts the unhealthy GPU
        snap.nodes[0].allocatable.gpu_milli = 4000;
        let c = schedulable_capacity(&snap);
        // a: 3 of its 4 GPUs, b not at all, c: both
        assert_eq!(c.gpu_milli, 5000);
        assert_eq!(c.cpu_milli, 48_000);
    }

    #[test]
    fn water_filling_by_weight_and_guarantee() {
        let (mut t, p) = QueueTree::build(&[q("a", 1, 0), q("b", 3, 0), q("c", 1, 6000)]);
        assert!(p.is_empty());
        for (i, dem) in [100_000u64, 100_000, 2000].iter().enumerate() {
            t.acct[i].pending.gpu_milli = *dem;
        }
        t.compute_deserved(&ResourceVec::new(0, 0, 10_000));
        // c: guarantee capped at its demand 2000; 8000 left split 1:3.
        assert_eq!(t.acct[2].deserved.gpu_milli, 2000);
        assert_eq!(t.acct[0].deserved.gpu_milli, 2000);
        assert_eq!(t.acct[1].deserved.gpu_milli, 6000);
    }

    #[test]
    fn hierarchy_and_limits() {
        let mut child = q("team-x", 1, 0);
        child.parent = Some("org".into());
        let mut org = q("org", 1, 0);
        org.limit = Some(ResourceLimit::gpus(4000));
        let (mut t, _) = QueueTree::build(&[org, child, q("other", 1, 0)]);
        t.add_usage(1, &ResourceVec::new(0, 0, 3000));
        assert_eq!(t.acct[0].usage.gpu_milli, 3000);
        assert!(
            t.quota_violation(1, &ResourceVec::new(0, 0, 2000))
                .unwrap()
                .to_string()
                .contains("\"org\"")
        );
        assert!(
            t.quota_violation(1, &ResourceVec::new(0, 0, 1000))
                .is_none()
        );
        t.add_pending(2, &ResourceVec::new(0, 0, 10_000));
        t.add_pending(1, &ResourceVec::new(0, 0, 10_000));
        t.compute_deserved(&ResourceVec::new(0, 0, 10_000));
        // org is capped at its limit (4000); other gets the rest.
        assert_eq!(t.acct[0].deserved.gpu_milli, 4000);
        assert_eq!(t.acct[1].deserved.gpu_milli, 4000);
        assert_eq!(t.acct[2].deserved.gpu_milli, 6000);
    }

    #[test]
    fn a_gpu_only_limit_leaves_cpu_and_memory_uncapped() {
        let mut capped = q("capped", 1, 0);
        capped.limit = Some(ResourceLimit::gpus(4000));
        let (mut t, _) = QueueTree::build(&[capped, q("other", 1, 0)]);
        // Lots of CPU and memory, GPUs within the limit: allowed.
        let big_host = ResourceVec::new(64_000, 512 << 30, 4000);
        assert_eq!(t.quota_violation(0, &big_host), None);
        t.add_usage(0, &big_host);
        let v = t
            .quota_violation(0, &ResourceVec::new(1000, 1 << 30, 1000))
            .expect("a fifth GPU breaks the limit");
        assert_eq!(v.dimension, ResourceKind::Gpu);
        assert_eq!((v.would_use, v.cap), (5000, 4000));
        // CPU alone is never capped by this limit.
        assert_eq!(t.quota_violation(0, &ResourceVec::new(8000, 0, 0)), None);
        // Its entitlement is capped on GPUs only.
        t.add_pending(0, &ResourceVec::new(16_000, 64 << 30, 8000));
        t.compute_deserved(&ResourceVec::new(128_000, 1 << 40, 16_000));
        assert_eq!(t.acct[0].demand.gpu_milli, 4000);
        assert_eq!(t.acct[0].demand.cpu_milli, 80_000);
    }

    #[test]
    fn per_model_guarantees_add_to_the_gpu_guarantee() {
        let mut a = q("a", 1, 2000);
        a.gpu_guarantee_by_model.insert("H100".into(), 4000);
        a.gpu_guarantee_by_model.insert("A100".into(), 1000);
        assert_eq!(gpu_guarantee(&a), 7000);
        let (mut t, _) = QueueTree::build(&[a, q("b", 1, 0)]);
        assert_eq!(t.acct[0].guarantee.gpu_milli, 7000);
        t.acct[0].pending.gpu_milli = 100_000;
        t.acct[1].pending.gpu_milli = 100_000;
        t.compute_deserved(&ResourceVec::new(0, 0, 10_000));
        // a: 7000 guaranteed, the other 3000 split 1:1
        assert_eq!(t.acct[0].deserved.gpu_milli, 8500);
        assert_eq!(t.acct[1].deserved.gpu_milli, 1500);
    }

    #[test]
    fn bad_trees_are_reported() {
        let mut a = q("a", 1, 0);
        a.parent = Some("b".into());
        let mut b = q("b", 1, 0);
        b.parent = Some("a".into());
        let mut c = q("c", 1, 0);
        c.parent = Some("nope".into());
        let (t, p) = QueueTree::build(&[a, b, c, q("c", 1, 0)]);
        // both queues of the a <-> b cycle are reported (issue #22, 12)
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.contains(&QueueProblem::Cycle { queue: "a".into() }));
        assert!(p.contains(&QueueProblem::Cycle { queue: "b".into() }));
        assert!(p.contains(&QueueProblem::Duplicate { queue: "c".into() }));
        assert!(p.contains(&QueueProblem::MissingParent {
            queue: "c".into(),
            parent: "nope".into()
        }));
        assert!(!t.roots.is_empty());
    }
}

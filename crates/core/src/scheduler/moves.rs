//! The consolidation planner: the fewest moves that let a pending pod fit.
//!
//! One implementation, used by the scheduler's `consolidate` action and by
//! the simulator's FGD evaluation method. Each caller supplies the
//! mechanics through [`MoveWorld`] (which pods may move, where a pod fits,
//! tentative changes in a [`Statement`]); the search lives here.
//!
//! The search, for one pending pod: candidate target nodes are those where
//! the pod's GPU request would fit if every movable pod there left
//! (smallest GPU shortfall first, then node id; at most
//! [`MoveLimits::max_nodes`]). Then by iterative deepening over the number
//! of moves `k = 1, 2, …, max_moves`: on each candidate, every set of `k`
//! movable pods (bigger holders first) is tried — removed, the pending pod
//! placed, and each moved pod re-placed on another node where it fits
//! without moving anything else. Then chains: `k` pods moved off the
//! candidate, of which up to `max_moves - k` may each displace one smaller
//! movable pod on its new node, which itself must fit elsewhere without
//! moving anything (a chain of depth 2, two moves). The first plan that
//! works wins, so it uses the fewest moves among the candidates searched.
//! At most [`MoveLimits::max_trials`] sets and chain attempts are tried per
//! pod. A failed search leaves the statement as it found it.

use crate::snapshot::{GpuAssignment, NodeId, PodId};
use crate::statement::Statement;

/// What the planner needs from its caller. Pod ids name pods in the
/// caller's world: pending pods to place and running pods that may move.
pub trait MoveWorld {
    /// Where `pod` would go on `node` now (its GPUs), if it fits (the
    /// caller's filters and packer).
    fn fit(&mut self, pod: PodId, node: NodeId) -> Option<GpuAssignment>;
    /// The nodes `pod` may be placed on (filters pass, not held for
    /// someone else), in a deterministic order.
    fn targets(&mut self, pod: PodId) -> Vec<NodeId>;
    /// The running pods on `node` that may be moved to make room for
    /// `for_pod`, in a deterministic order.
    fn movable_on(&self, node: NodeId, for_pod: PodId) -> Vec<PodId>;
    /// GPU milli `pod` asks for (pending) or holds (running).
    fn gpu_milli(&self, pod: PodId) -> u64;
    /// Free GPU milli on `node` now.
    fn free_gpu_milli(&self, node: NodeId) -> u64;
    /// Tentatively removes running pod `pod` from its node.
    fn remove(&mut self, st: &mut Statement, pod: PodId);
    /// Tentatively places `pod` on `node` with `gpus`; false if refused.
    fn place(&mut self, st: &mut Statement, pod: PodId, node: NodeId, gpus: GpuAssignment) -> bool;
    /// Undoes the statement back to `checkpoint`.
    fn rollback(&mut self, st: &mut Statement, checkpoint: usize);
    /// The best node other than `avoid` where `pod` fits now without any
    /// move, with its GPUs.
    fn destination(&mut self, pod: PodId, avoid: NodeId) -> Option<(NodeId, GpuAssignment)>;
}

/// Bounds on one search (they keep a cycle on thousands of nodes fast).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoveLimits {
    /// At most this many pods moved for one pending pod.
    pub max_moves: u32,
    /// At most this many candidate target nodes examined per pod.
    pub max_nodes: u32,
    /// At most this many sets of pods tried per pod.
    pub max_trials: u32,
}

/// One planned move: `pod` leaves `from` and restarts on `to`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The moved (running) pod.
    pub pod: PodId,
    /// Where it runs now.
    pub from: NodeId,
    /// Where it is planned to restart.
    pub to: NodeId,
    /// Its GPUs there.
    pub gpus: GpuAssignment,
}

/// Where a pending pod goes, and the moves that make room for it (empty:
/// it fits without moves).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodPlan {
    /// The pending pod.
    pub pod: PodId,
    /// Its node.
    pub node: NodeId,
    /// Its GPUs there.
    pub gpus: GpuAssignment,
    /// The moves it needs, in the order they were planned.
    pub moves: Vec<Move>,
}

/// A candidate target: GPU shortfall, node, movable pods (GPU milli, id).
type Candidate = (u64, NodeId, Vec<(u64, PodId)>);

/// The fewest moves (at most `limits.max_moves`) after which `pod` fits,
/// applied to `st` (the moved pods removed and re-placed, the pod placed).
/// `None`: no plan within the limits; `st` is unchanged.
pub fn plan_pod<W: MoveWorld + ?Sized>(
    w: &mut W,
    st: &mut Statement,
    pod: PodId,
    limits: &MoveLimits,
) -> Option<PodPlan> {
    if limits.max_moves == 0 {
        return None;
    }
    let need = w.gpu_milli(pod);
    // candidates: (shortfall, node, movable pods bigger first)
    let mut cands: Vec<Candidate> = Vec::new();
    for n in w.targets(pod) {
        let free = w.free_gpu_milli(n);
        let mut mv: Vec<(u64, PodId)> = w
            .movable_on(n, pod)
            .into_iter()
            .map(|v| (w.gpu_milli(v), v))
            .collect();
        if mv.is_empty() {
            continue;
        }
        let all: u64 = mv.iter().map(|(m, _)| m).sum();
        if free + all < need {
            continue;
        }
        mv.sort_by_key(|&(m, v)| (std::cmp::Reverse(m), v));
        cands.push((need.saturating_sub(free), n, mv));
    }
    cands.sort_by_key(|&(short, n, _)| (short, n));
    cands.truncate(limits.max_nodes as usize);
    let mut search = Search {
        trials: 0,
        limits: *limits,
    };
    let mut idx: Vec<usize> = Vec::new();
    // iterative deepening over the total number of moves: `total` moves
    // are `k` pods moved off the target plus at most `total - k` chains
    // (a moved pod displacing a smaller one); plain sets first
    for total in 1..=limits.max_moves as usize {
        for k in (1..=total).rev() {
            let chains = total - k;
            for (_, n, mv) in &cands {
                if mv.len() < k {
                    continue;
                }
                let free = w.free_gpu_milli(*n);
                // every k-subset of mv, in lexicographic order of positions
                idx.clear();
                idx.extend(0..k);
                loop {
                    let freed: u64 = idx.iter().map(|&i| mv[i].0).sum();
                    if free + freed >= need {
                        search.trials += 1;
                        let set: Vec<PodId> = idx.iter().map(|&i| mv[i].1).collect();
                        if let Some(plan) = search.try_set(w, st, pod, *n, &set, chains) {
                            return Some(plan);
                        }
                        if search.exhausted() {
                            return None;
                        }
                    }
                    if !next_combination(&mut idx, mv.len()) {
                        break;
                    }
                }
            }
        }
    }
    None
}

/// One pod's search: its limits and the sets tried so far.
struct Search {
    trials: u32,
    limits: MoveLimits,
}

impl Search {
    fn exhausted(&self) -> bool {
        self.trials >= self.limits.max_trials
    }

    /// Moves `set` off `n`, places `pod` there and the moved pods
    /// elsewhere, each where it fits or (at most `chains` times) where it
    /// fits after one smaller pod there moves on; on failure undoes
    /// everything.
    fn try_set<W: MoveWorld + ?Sized>(
        &mut self,
        w: &mut W,
        st: &mut Statement,
        pod: PodId,
        n: NodeId,
        set: &[PodId],
        mut chains: usize,
    ) -> Option<PodPlan> {
        let cp = st.checkpoint();
        for &v in set {
            w.remove(st, v);
        }
        let placed = match w.fit(pod, n) {
            Some(g) if w.place(st, pod, n, g.clone()) => Some(g),
            _ => None,
        };
        let Some(gpus) = placed else {
            w.rollback(st, cp);
            return None;
        };
        let mut moves = Vec::with_capacity(set.len() + chains);
        for &v in set {
            if let Some((to, g)) = w.destination(v, n)
                && w.place(st, v, to, g.clone())
            {
                moves.push(Move {
                    pod: v,
                    from: n,
                    to,
                    gpus: g,
                });
                continue;
            }
            if chains > 0
                && let Some(pair) = self.chain(w, st, v, n)
            {
                chains -= 1;
                moves.extend(pair);
                continue;
            }
            w.rollback(st, cp);
            return None;
        }
        Some(PodPlan {
            pod,
            node: n,
            gpus,
            moves,
        })
    }

    /// A chain of two moves for `v` (already removed from `from`): `v` goes
    /// to a node `m` where it fits once one movable pod `t` there, holding
    /// fewer GPUs than `v`, leaves; `t` goes where it fits without moving
    /// anything (any node but `from`, `m` included: on another GPU there,
    /// which is how two half-used GPUs become one free GPU). Candidates: nodes by GPU shortfall for `v`, then node id
    /// (at most `max_nodes`); on each, the smallest sufficient `t` first.
    /// Each attempt counts as a set tried. On failure `st` is unchanged.
    fn chain<W: MoveWorld + ?Sized>(
        &mut self,
        w: &mut W,
        st: &mut Statement,
        v: PodId,
        from: NodeId,
    ) -> Option<[Move; 2]> {
        if self.exhausted() {
            return None;
        }
        self.trials += 1;
        let need = w.gpu_milli(v);
        let mut cands: Vec<Candidate> = Vec::new();
        for m in w.targets(v) {
            if m == from {
                continue;
            }
            let free = w.free_gpu_milli(m);
            let mut ts: Vec<(u64, PodId)> = w
                .movable_on(m, v)
                .into_iter()
                .map(|t| (w.gpu_milli(t), t))
                .filter(|&(g, _)| g < need && free + g >= need)
                .collect();
            if ts.is_empty() {
                continue;
            }
            ts.sort_unstable();
            cands.push((need.saturating_sub(free), m, ts));
        }
        cands.sort_by_key(|&(short, m, _)| (short, m));
        cands.truncate(self.limits.max_nodes as usize);
        for (_, m, ts) in cands {
            for (_, t) in ts {
                if self.exhausted() {
                    return None;
                }
                self.trials += 1;
                let cp = st.checkpoint();
                w.remove(st, t);
                if let Some(g) = w.fit(v, m)
                    && w.place(st, v, m, g.clone())
                    && let Some((to, gt)) = w.destination(t, from)
                    && w.place(st, t, to, gt.clone())
                {
                    return Some([
                        Move {
                            pod: v,
                            from,
                            to: m,
                            gpus: g,
                        },
                        Move {
                            pod: t,
                            from: m,
                            to,
                            gpus: gt,
                        },
                    ]);
                }
                w.rollback(st, cp);
            }
        }
        None
    }
}

/// The next k-combination of `0..n` (positions, ascending); false after
/// the last.
fn next_combination(idx: &mut [usize], n: usize) -> bool {
    let k = idx.len();
    let mut i = k;
    while i > 0 {
        i -= 1;
        if idx[i] < n - k + i {
            idx[i] += 1;
            for j in i + 1..k {
                idx[j] = idx[j - 1] + 1;
            }
            return true;
        }
    }
    false
}

/// Places every pod of `pods` (all or nothing): each where it fits
/// (`direct`: the caller's best node, without moves), else with the fewest
/// moves, at most `budget` moves in all. On success the changes stay in
/// `st`; on failure `st` is as it was.
pub fn plan_all<W: MoveWorld + ?Sized>(
    w: &mut W,
    st: &mut Statement,
    pods: &[PodId],
    limits: &MoveLimits,
    budget: u32,
    mut direct: impl FnMut(&mut W, PodId) -> Option<(NodeId, GpuAssignment)>,
) -> Option<Vec<PodPlan>> {
    let cp = st.checkpoint();
    let mut plans = Vec::with_capacity(pods.len());
    let mut used = 0u32;
    for &p in pods {
        if let Some((n, g)) = direct(w, p)
            && w.place(st, p, n, g.clone())
        {
            plans.push(PodPlan {
                pod: p,
                node: n,
                gpus: g,
                moves: Vec::new(),
            });
            continue;
        }
        let lim = MoveLimits {
            max_moves: limits.max_moves.min(budget.saturating_sub(used)),
            ..*limits
        };
        match plan_pod(w, st, p, &lim) {
            Some(plan) => {
                used += plan.moves.len() as u32;
                plans.push(plan);
            }
            None => {
                w.rollback(st, cp);
                return None;
            }
        }
    }
    Some(plans)
}

#[cfg(test)]
mod tests {
    use super::next_combination;

    #[test]
    fn combinations_are_all_k_subsets_in_order() {
        let mut idx = vec![0, 1];
        let mut seen = vec![idx.clone()];
        while next_combination(&mut idx, 4) {
            seen.push(idx.clone());
        }
        assert_eq!(
            seen,
            vec![
                vec![0, 1],
                vec![0, 2],
                vec![0, 3],
                vec![1, 2],
                vec![1, 3],
                vec![2, 3]
            ]
        );
        let mut one = vec![0];
        assert!(!next_combination(&mut one, 1));
    }
}

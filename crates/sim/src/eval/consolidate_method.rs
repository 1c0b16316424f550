//! Consolidation inside the FGD evaluation method ([`super::fgd_method`]):
//! a pod that fits no node, while the cluster's free GPUs would hold it in
//! total, may get room by moving already placed pods, within a budget of
//! moves per 100 pods placed.
//!
//! The search is the core's planner ([`gpusched_core::scheduler::moves`]),
//! the same code the scheduler's `consolidate` action runs, with the same
//! limits ([`SchedulerOptions`] defaults: at most 2 moves per pod, 64
//! candidate nodes, 512 sets tried), chains of depth 2 included (a moved
//! pod may displace one smaller pod, two moves). This module only supplies the
//! method's mechanics: its filters (GPU model, CPU, memory), the policy
//! under test as the packer, and a list of placed pods per node.
//!
//! In the method every placed pod may be moved: the trace has no
//! priorities, disruption budgets or opt-in marks, and pods never depart,
//! so a move costs a restart but no lost work is measured. The budget
//! accrues with placements: after `placed` pods, at most
//! `budget × placed / 100` moves in all. A pod shape whose search failed is
//! not searched again until a pod is placed.

use super::common::MethodResult;
use gpusched_core::scheduler::moves::{MoveLimits, MoveWorld, plan_pod};
use gpusched_core::{
    ClusterState, GpuAssignment, NodeId, Packer, PodId, PodPhase, PodState, SchedulerOptions,
    Snapshot, Statement,
};
use gpusched_model::{GpuRequest, Node, Pod};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The moves of one seed's run.
pub struct Mover {
    /// Moves allowed per 100 pods placed (0: consolidation off).
    budget: u32,
    /// Placed pods per node (indices into the run's snapshot pods).
    on_node: Vec<Vec<PodId>>,
    /// Moves made so far.
    pub moves: u64,
    /// Pod shapes (GPU request, CPU, memory, models) whose search failed,
    /// with how many pods were placed then.
    failed: Vec<(GpuRequest, u64, u64, Vec<String>)>,
    failed_at: usize,
}

impl Mover {
    /// A mover for a cluster of `nodes` nodes with `budget` moves per 100
    /// pods placed.
    pub fn new(budget: u32, nodes: usize) -> Self {
        Mover {
            budget,
            on_node: vec![Vec::new(); nodes],
            moves: 0,
            failed: Vec::new(),
            failed_at: 0,
        }
    }

    /// Records that snapshot pod `id` was placed on `node`.
    pub fn placed(&mut self, node: NodeId, id: usize) {
        if let Some(v) = self.on_node.get_mut(node as usize) {
            v.push(id as PodId);
        }
    }

    /// Tries to place `pod` (which fits no node) by moving placed pods.
    /// On success the cluster state and the snapshot hold the moved pods
    /// at their new nodes and `pod` placed (appended to `snap.pods`); returns
    /// the GPU milli `pod` took. `placed`: pods placed so far.
    pub fn try_place(
        &mut self,
        pod: &Pod,
        cs: &mut ClusterState<'_>,
        snap: &mut Snapshot,
        packer: &dyn Packer,
        placed: usize,
    ) -> Option<u64> {
        let allowed = (self.budget as u64 * placed as u64 / 100).saturating_sub(self.moves);
        let need = pod.gpu.milli();
        if allowed == 0 || need == 0 {
            return None;
        }
        let (total, used) = cs.gpu_milli_totals();
        if total - used < need {
            return None;
        }
        if self.failed_at != placed {
            self.failed.clear();
            self.failed_at = placed;
        }
        let shape = (
            pod.gpu,
            pod.requests.cpu_milli,
            pod.requests.memory,
            pod.gpu_models.clone(),
        );
        if self.failed.contains(&shape) {
            return None;
        }
        let o = SchedulerOptions::default();
        let limits = MoveLimits {
            max_moves: o.max_moves_per_job.min(allowed as u32),
            max_nodes: o.consolidation_max_nodes,
            max_trials: o.consolidation_max_trials,
        };
        let id = snap.pods.len() as PodId;
        let mut st = Statement::new();
        let plan = {
            let mut w = InMethod {
                nodes: &snap.nodes,
                cs,
                pods: &snap.pods,
                pending: pod,
                pending_id: id,
                on_node: &self.on_node,
                packer,
                removed: BTreeSet::new(),
            };
            plan_pod(&mut w, &mut st, id, &limits)
        };
        let Some(plan) = plan else {
            self.failed.push(shape);
            return None;
        };
        let _ = st.commit();
        for m in &plan.moves {
            self.on_node[m.from as usize].retain(|&v| v != m.pod);
            self.on_node[m.to as usize].push(m.pod);
            if let PodPhase::Running { node, gpus, .. } = &mut snap.pods[m.pod as usize].phase {
                *node = m.to;
                *gpus = m.gpus.clone();
            }
            self.moves += 1;
        }
        let milli = plan.gpus.milli();
        snap.pods.push(PodState {
            pod: pod.clone().into(),
            phase: PodPhase::Running {
                node: plan.node,
                gpus: plan.gpus,
                since_ms: 0,
            },
        });
        self.on_node[plan.node as usize].push(id);
        Some(milli)
    }
}

/// The method's cluster seen by the planner.
struct InMethod<'a, 'n> {
    nodes: &'a [Node],
    cs: &'a mut ClusterState<'n>,
    pods: &'a [PodState],
    pending: &'a Pod,
    pending_id: PodId,
    on_node: &'a [Vec<PodId>],
    packer: &'a dyn Packer,
    removed: BTreeSet<PodId>,
}

impl InMethod<'_, '_> {
    fn pod(&self, p: PodId) -> &Pod {
        if p == self.pending_id {
            self.pending
        } else {
            &self.pods[p as usize].pod
        }
    }

    /// The method's filters and capacity, with a cheap GPU pre-check before
    /// the policy's (possibly costly) placement.
    fn precheck(&self, p: &Pod, node: NodeId) -> bool {
        if !self.suits(p, node) || !self.cs.fits_non_gpu(p, node) {
            return false;
        }
        let st = self.cs.get(node);
        match p.gpu {
            GpuRequest::None | GpuRequest::Whole(0) => true,
            GpuRequest::Whole(k) => st.whole_free() >= k,
            GpuRequest::Share { milli, .. } => st.gpu_free_milli.iter().any(|&f| f >= milli),
        }
    }

    /// The method's filters: schedulable node, an allowed GPU model.
    fn suits(&self, pod: &Pod, n: NodeId) -> bool {
        let node = &self.nodes[n as usize];
        !node.unschedulable
            && (pod.gpu.is_none()
                || pod.gpu_models.is_empty()
                || node.gpus.iter().any(|g| pod.allows_model(&g.model)))
    }
}

impl MoveWorld for InMethod<'_, '_> {
    fn fit(&mut self, pod: PodId, node: NodeId) -> Option<GpuAssignment> {
        let p = self.pod(pod);
        if !self.precheck(p, node) {
            return None;
        }
        self.packer.place(p, node, self.cs).map(|pl| pl.gpus)
    }

    fn targets(&mut self, pod: PodId) -> Vec<NodeId> {
        let p = self.pod(pod);
        (0..self.nodes.len() as NodeId)
            .filter(|&n| self.suits(p, n))
            .collect()
    }

    fn movable_on(&self, node: NodeId, _for_pod: PodId) -> Vec<PodId> {
        self.on_node[node as usize]
            .iter()
            .copied()
            .filter(|v| !self.removed.contains(v))
            .collect()
    }

    fn gpu_milli(&self, pod: PodId) -> u64 {
        if pod == self.pending_id {
            return self.pending.gpu.milli();
        }
        match self.pods[pod as usize].holding() {
            Some((_, g)) => g.milli(),
            None => 0,
        }
    }

    fn free_gpu_milli(&self, node: NodeId) -> u64 {
        self.cs.get(node).free.gpu_milli
    }

    fn remove(&mut self, st: &mut Statement, pod: PodId) {
        if let Some((n, g)) = self.pods[pod as usize].holding() {
            st.remove(
                self.cs,
                pod,
                n,
                &self.pods[pod as usize].pod.requests,
                g.clone(),
            );
            self.removed.insert(pod);
        }
    }

    fn place(&mut self, st: &mut Statement, pod: PodId, node: NodeId, gpus: GpuAssignment) -> bool {
        let req = self.pod(pod).requests.clone();
        st.place(self.cs, pod, node, &req, gpus).is_ok()
    }

    fn rollback(&mut self, st: &mut Statement, checkpoint: usize) {
        st.rollback_to(self.cs, checkpoint);
        self.removed = st.removed_pods().collect();
    }

    fn destination(&mut self, pod: PodId, avoid: NodeId) -> Option<(NodeId, GpuAssignment)> {
        let mut best: Option<(gpusched_core::Score, NodeId, GpuAssignment)> = None;
        let p = self.pod(pod);
        for n in 0..self.nodes.len() as NodeId {
            if n == avoid || !self.precheck(p, n) {
                continue;
            }
            if let Some(pl) = self.packer.place(p, n, self.cs)
                && best.as_ref().is_none_or(|(s, _, _)| pl.score > *s)
            {
                best = Some((pl.score, n, pl.gpus));
            }
        }
        best.map(|(_, n, g)| (n, g))
    }
}

/// One row of the move-budget table: the budget, and one policy's result.
pub struct BudgetRow {
    /// Moves allowed per 100 pods placed.
    pub budget: u32,
    /// The policy's result with that budget.
    pub result: MethodResult,
}

/// The move-budget table: alloc at 100 % arrived (mean ± stdev over
/// seeds) and the moves made (per 100 pods placed, mean over seeds), one
/// row per budget and policy.
pub fn budget_table(rows: &[BudgetRow]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:<12} {:<12} {:>18} {:>16} {:>12}",
        "move budget", "policy", "alloc@100%", "moves/100 placed", "moves (mean)"
    );
    for r in rows {
        let (m, sd) = r.result.headline();
        let n = r.result.runs.len().max(1) as f64;
        let moves: f64 = r.result.runs.iter().map(|x| x.moves as f64).sum::<f64>() / n;
        let per100: f64 = r
            .result
            .runs
            .iter()
            .map(|x| x.moves as f64 * 100.0 / (x.placed.max(1) as f64))
            .sum::<f64>()
            / n;
        let _ = writeln!(
            s,
            "{:<12} {:<12} {:>18} {:>16.2} {:>12.1}",
            r.budget,
            r.result.policy,
            format!("{m:.2} ± {sd:.2}"),
            per100,
            moves
        );
    }
    s
}

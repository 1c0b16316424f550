//! Tentative placements with checkpoint and rollback.
//!
//! A gang is placed inside a [`Statement`]: each placement changes the
//! cluster state at once (so later members see it), and the statement
//! either commits (the placements become decisions) or discards (every
//! change is undone, in reverse order).

use crate::snapshot::{GpuAssignment, NodeId, PodId};
use crate::state::{ClusterState, StateError};
use gpusched_model::ResourceVec;

/// One tentative change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A pod placed on a node.
    Place {
        /// The pod.
        pod: PodId,
        /// The node.
        node: NodeId,
        /// Its CPU, memory and extended requests.
        requests: ResourceVec,
        /// Its GPUs.
        gpus: GpuAssignment,
    },
    /// A pod's holdings removed (a tentative eviction).
    Remove {
        /// The pod.
        pod: PodId,
        /// The node.
        node: NodeId,
        /// Its CPU, memory and extended requests.
        requests: ResourceVec,
        /// Its GPUs.
        gpus: GpuAssignment,
    },
}

/// A list of tentative changes to a [`ClusterState`].
#[derive(Debug, Default)]
pub struct Statement {
    ops: Vec<Op>,
}

impl Statement {
    /// An empty statement.
    pub fn new() -> Self {
        Statement::default()
    }

    /// Places a pod now; recorded for rollback.
    pub fn place(
        &mut self,
        cs: &mut ClusterState<'_>,
        pod: PodId,
        node: NodeId,
        requests: &ResourceVec,
        gpus: GpuAssignment,
    ) -> Result<(), StateError> {
        cs.assign(node, requests, &gpus)?;
        self.ops.push(Op::Place {
            pod,
            node,
            requests: requests.clone(),
            gpus,
        });
        Ok(())
    }

    /// Removes a pod's holdings now (a tentative eviction).
    pub fn remove(
        &mut self,
        cs: &mut ClusterState<'_>,
        pod: PodId,
        node: NodeId,
        requests: &ResourceVec,
        gpus: GpuAssignment,
    ) {
        cs.release(node, requests, &gpus);
        self.ops.push(Op::Remove {
            pod,
            node,
            requests: requests.clone(),
            gpus,
        });
    }

    /// How many changes it holds.
    pub fn len(&self) -> usize {
        self.ops.len()
    }

    /// Whether it holds no change.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// A checkpoint to roll back to.
    pub fn checkpoint(&self) -> usize {
        self.ops.len()
    }

    /// Undoes every change after `checkpoint`, newest first.
    pub fn rollback_to(&mut self, cs: &mut ClusterState<'_>, checkpoint: usize) {
        while self.ops.len() > checkpoint {
            match self.ops.pop() {
                Some(Op::Place {
                    node,
                    requests,
                    gpus,
                    ..
                }) => cs.release(node, &requests, &gpus),
                Some(Op::Remove {
                    node,
                    requests,
                    gpus,
                    ..
                }) => {
                    // It held these a moment ago; re-taking them cannot fail
                    // unless the state was changed behind the statement.
                    let _ = cs.assign(node, &requests, &gpus);
                }
                None => break,
            }
        }
    }

    /// Undoes everything.
    pub fn discard(mut self, cs: &mut ClusterState<'_>) {
        self.rollback_to(cs, 0);
    }

    /// Keeps the changes; returns them in order.
    pub fn commit(self) -> Vec<Op> {
        self.ops
    }
}

impl Statement {
    /// The changes recorded after `checkpoint`.
    pub fn ops_since(&self, checkpoint: usize) -> &[Op] {
        &self.ops[checkpoint.min(self.ops.len())..]
    }

    /// The pods this statement removes from their nodes, in order.
    pub fn removed_pods(&self) -> impl Iterator<Item = PodId> + '_ {
        self.ops.iter().filter_map(|op| match op {
            Op::Remove { pod, .. } => Some(*pod),
            Op::Place { .. } => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::NodeState;
    use crate::state::tests::nodes;

    /// What a node holds, without its version (which every change bumps).
    fn held(s: &NodeState) -> (ResourceVec, Vec<u32>, Vec<u64>, u32) {
        (
            s.free.clone(),
            s.gpu_free_milli.clone(),
            s.gpu_free_mem.clone(),
            s.pods,
        )
    }

    fn all(cs: &ClusterState<'_>) -> Vec<(ResourceVec, Vec<u32>, Vec<u64>, u32)> {
        (0..cs.len() as NodeId).map(|n| held(cs.get(n))).collect()
    }

    #[test]
    fn rollback_to_a_checkpoint_undoes_only_what_came_after() {
        let ns = nodes();
        let mut cs = ClusterState::new(&ns);
        let req = ResourceVec::new(1000, 1 << 30, 0);
        let mut st = Statement::new();
        st.place(&mut cs, 0, 0, &req, GpuAssignment::Whole(vec![0, 1]))
            .unwrap();
        let cp = st.checkpoint();
        let at_cp = all(&cs);
        st.place(&mut cs, 1, 1, &req, GpuAssignment::Whole(vec![2]))
            .unwrap();
        st.remove(&mut cs, 0, 0, &req, GpuAssignment::Whole(vec![0, 1]));
        assert_eq!(st.len(), 3);
        assert_eq!(st.ops_since(cp).len(), 2);
        st.rollback_to(&mut cs, cp);
        assert_eq!(st.len(), cp);
        assert_eq!(all(&cs), at_cp, "back to the checkpoint");
        assert_eq!(cs.get(0).free.gpu_milli, 2000, "the first placement stays");
    }

    #[test]
    fn a_failed_place_records_nothing_and_discard_undoes_everything() {
        let ns = nodes();
        let mut cs = ClusterState::new(&ns);
        let before = all(&cs);
        let req = ResourceVec::new(1000, 1 << 30, 0);
        let mut st = Statement::new();
        st.place(&mut cs, 0, 0, &req, GpuAssignment::Whole(vec![0]))
            .unwrap();
        assert!(
            st.place(&mut cs, 1, 0, &req, GpuAssignment::Whole(vec![0]))
                .is_err(),
            "GPU 0 is taken"
        );
        assert_eq!(st.len(), 1, "a refused placement is not recorded");
        st.discard(&mut cs);
        assert_eq!(all(&cs), before);
    }

    #[test]
    fn commit_keeps_the_changes_in_order() {
        let ns = nodes();
        let mut cs = ClusterState::new(&ns);
        let req = ResourceVec::new(1000, 1 << 30, 0);
        let mut st = Statement::new();
        st.place(&mut cs, 3, 1, &req, GpuAssignment::Whole(vec![1]))
            .unwrap();
        st.place(&mut cs, 4, 0, &req, GpuAssignment::Whole(vec![2]))
            .unwrap();
        let ops = st.commit();
        let pods: Vec<PodId> = ops
            .iter()
            .map(|op| match op {
                Op::Place { pod, .. } | Op::Remove { pod, .. } => *pod,
            })
            .collect();
        assert_eq!(pods, vec![3, 4]);
        assert_eq!(cs.get(1).free.gpu_milli, 3000, "committed changes stay");
    }
}

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
    Place {
        pod: PodId,
        node: NodeId,
        requests: ResourceVec,
        gpus: GpuAssignment,
    },
    Remove {
        pod: PodId,
        node: NodeId,
        requests: ResourceVec,
        gpus: GpuAssignment,
    },
}

/// A list of tentative changes to a [`ClusterState`].
#[derive(Debug, Default)]
pub struct Statement {
    ops: Vec<Op>,
}

impl Statement {
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

    pub fn len(&self) -> usize {
        self.ops.len()
    }

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
}

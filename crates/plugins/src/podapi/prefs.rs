//! Static preferences: preferred node affinity and `PreferNoSchedule`
//! taints, scored as kube-scheduler's NodeAffinity (weight 2) and
//! TaintToleration (weight 3) score plugins do.

use crate::config::ConstraintName;
use gpusched_core::{ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, Snapshot};
use gpusched_model::{Node, Pod, TaintEffect};

/// Preferred node affinity: a node scores the sum of the weights of the
/// preferred terms it matches.
#[derive(Debug, Default)]
pub struct NodeAffinityPreference;

impl PodConstraint for NodeAffinityPreference {
    fn name(&self) -> &'static str {
        ConstraintName::NodeAffinityPreference.as_str()
    }
    fn weight(&self) -> i64 {
        2
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        !pod.constraints().preferred_node_affinity.is_empty()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(Static {
            snap: snapshot,
            kind: Kind::NodeAffinity,
            tainted: Vec::new(),
        })
    }
}

/// `PreferNoSchedule` taints: a node scores minus the number of such
/// taints the pod does not tolerate.
#[derive(Debug, Default)]
pub struct TaintPreference;

impl PodConstraint for TaintPreference {
    fn name(&self) -> &'static str {
        ConstraintName::TaintPreference.as_str()
    }
    fn weight(&self) -> i64 {
        3
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        let tainted = snapshot
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| {
                n.taints
                    .iter()
                    .any(|t| t.effect == TaintEffect::PreferNoSchedule)
            })
            .map(|(i, _)| i as NodeId)
            .collect();
        Box::new(Static {
            snap: snapshot,
            kind: Kind::Taints,
            tainted,
        })
    }
}

enum Kind {
    NodeAffinity,
    Taints,
}

struct Static<'s> {
    snap: &'s Snapshot,
    kind: Kind,
    /// Nodes with a PreferNoSchedule taint.
    tainted: Vec<NodeId>,
}

fn untolerated(pod: &Pod, node: &Node) -> i64 {
    node.taints
        .iter()
        .filter(|t| t.effect == TaintEffect::PreferNoSchedule)
        .filter(|t| !pod.tolerations.iter().any(|tol| tol.tolerates(t)))
        .count() as i64
}

impl ConstraintState for Static<'_> {
    fn add_pod(&mut self, _pod: PodId, _node: NodeId) {}

    fn remove_pod(&mut self, _pod: PodId, _node: NodeId) {}

    fn pre_filter(&mut self, p: PodId) -> Needs {
        let pod = &self.snap.pods[p as usize].pod;
        let score = match self.kind {
            Kind::NodeAffinity => pod
                .constraints
                .as_deref()
                .is_some_and(|c| !c.preferred_node_affinity.is_empty()),
            Kind::Taints => self
                .tainted
                .iter()
                .any(|&n| untolerated(pod, &self.snap.nodes[n as usize]) > 0),
        };
        Needs {
            filter: false,
            score,
        }
    }

    fn filter(&self, _p: PodId, _n: NodeId) -> FilterResult {
        FilterResult::Pass
    }

    fn score(&self, p: PodId, n: NodeId) -> Option<i64> {
        let pod = &self.snap.pods[p as usize].pod;
        let node = &self.snap.nodes[n as usize];
        Some(match self.kind {
            Kind::NodeAffinity => pod.constraints.as_deref().map_or(0, |c| {
                c.preferred_node_affinity
                    .iter()
                    .filter(|t| t.term.matches(&node.name, &node.labels))
                    .map(|t| t.weight as i64)
                    .sum()
            }),
            Kind::Taints => -untolerated(pod, node),
        })
    }
}

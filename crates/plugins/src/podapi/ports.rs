//! NodePorts: a pod's host ports may not conflict with those of the pods
//! on the node (same protocol and port, and the same host IP or either
//! one every address), as kube-scheduler's plugin of that name.

use crate::config::ConstraintName;
use gpusched_core::{ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, Snapshot};
use gpusched_model::HostPort;

/// The NodePorts plugin.
#[derive(Debug, Default)]
pub struct NodePorts;

impl PodConstraint for NodePorts {
    fn name(&self) -> &'static str {
        ConstraintName::NodePorts.as_str()
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        !pod.constraints().host_ports.is_empty()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(State {
            snap: snapshot,
            used: vec![Vec::new(); snapshot.nodes.len()],
        })
    }
}

struct State<'s> {
    snap: &'s Snapshot,
    /// Host ports in use per node, with the pod using each.
    used: Vec<Vec<(PodId, &'s HostPort)>>,
}

impl<'s> State<'s> {
    fn ports(&self, p: PodId) -> &'s [HostPort] {
        self.snap.pods[p as usize]
            .pod
            .constraints
            .as_deref()
            .map_or(&[], |c| &c.host_ports[..])
    }
}

impl ConstraintState for State<'_> {
    fn add_pod(&mut self, pod: PodId, node: NodeId) {
        let ports = self.ports(pod);
        if let Some(u) = self.used.get_mut(node as usize) {
            u.extend(ports.iter().map(|h| (pod, h)));
        }
    }

    fn remove_pod(&mut self, pod: PodId, node: NodeId) {
        let n = self.ports(pod).len();
        if n == 0 {
            return;
        }
        if let Some(u) = self.used.get_mut(node as usize)
            && let Some(i) = u.iter().position(|(q, _)| *q == pod)
        {
            // the pod's ports were added together
            u.drain(i..(i + n).min(u.len()));
        }
    }

    fn pre_filter(&mut self, p: PodId) -> Needs {
        Needs {
            filter: !self.ports(p).is_empty(),
            score: false,
        }
    }

    fn filter(&self, p: PodId, n: NodeId) -> FilterResult {
        let mine = self.ports(p);
        let clash = self.used[n as usize]
            .iter()
            .any(|(_, h)| mine.iter().any(|m| m.conflicts(h)));
        if clash {
            FilterResult::Reject(
                "node(s) didn't have free ports for the requested pod ports".into(),
            )
        } else {
            FilterResult::Pass
        }
    }

    fn score(&self, _p: PodId, _n: NodeId) -> Option<i64> {
        None
    }
}

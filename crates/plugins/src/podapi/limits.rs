//! NodeVolumeLimits (kube-scheduler's CSI attach limits): a node's
//! `CSINode` caps, per CSI driver, how many distinct volumes the pods on it
//! may use ([`gpusched_model::Node::attach_limits`]). The pods' volumes are
//! resolved by the adapter ([`gpusched_model::CsiVolume`]: a bound claim's
//! driver and volume handle; an unbound claim by its storage class's
//! provisioner). A volume several pods on the node share counts once; a
//! pod is refused on a node where its volumes not already there would take
//! a driver past its limit (`node(s) exceed max volume count`). Placed pods
//! count through `add_pod`/`remove_pod`, so gang members placed in one
//! statement and victims removed in a preemption what-if count too.

use crate::config::ConstraintName;
use gpusched_core::{ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, Snapshot};
use gpusched_model::{CsiVolume, MAX_VOLUME_COUNT};
use std::collections::BTreeMap;

/// The NodeVolumeLimits plugin.
#[derive(Debug, Default)]
pub struct NodeVolumeLimits;

impl PodConstraint for NodeVolumeLimits {
    fn name(&self) -> &'static str {
        ConstraintName::NodeVolumeLimits.as_str()
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        !pod.constraints().csi_volumes.is_empty()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(State {
            snap: snapshot,
            used: vec![Used::default(); snapshot.nodes.len()],
        })
    }
}

/// The volumes in use on one node.
#[derive(Clone, Debug, Default)]
struct Used<'s> {
    /// How many placed pods use each volume.
    pods: BTreeMap<&'s CsiVolume, u32>,
    /// Distinct volumes per driver.
    per_driver: BTreeMap<&'s str, u32>,
}

struct State<'s> {
    snap: &'s Snapshot,
    /// Per node (only nodes with limits are tracked).
    used: Vec<Used<'s>>,
}

impl<'s> State<'s> {
    fn volumes(&self, p: PodId) -> &'s [CsiVolume] {
        self.snap.pods[p as usize]
            .pod
            .constraints
            .as_deref()
            .map_or(&[], |c| &c.csi_volumes[..])
    }

    fn tracked(&self, node: NodeId) -> bool {
        self.snap
            .nodes
            .get(node as usize)
            .is_some_and(|n| !n.attach_limits.is_empty())
    }
}

impl ConstraintState for State<'_> {
    fn add_pod(&mut self, pod: PodId, node: NodeId) {
        if !self.tracked(node) {
            return;
        }
        let vols = self.volumes(pod);
        let u = &mut self.used[node as usize];
        for v in vols {
            let n = u.pods.entry(v).or_insert(0);
            *n += 1;
            if *n == 1 {
                *u.per_driver.entry(v.driver.as_str()).or_insert(0) += 1;
            }
        }
    }

    fn remove_pod(&mut self, pod: PodId, node: NodeId) {
        if !self.tracked(node) {
            return;
        }
        let vols = self.volumes(pod);
        let u = &mut self.used[node as usize];
        for v in vols {
            let Some(n) = u.pods.get_mut(v) else {
                continue;
            };
            *n -= 1;
            if *n == 0 {
                u.pods.remove(v);
                if let Some(d) = u.per_driver.get_mut(v.driver.as_str()) {
                    *d -= 1;
                    if *d == 0 {
                        u.per_driver.remove(v.driver.as_str());
                    }
                }
            }
        }
    }

    fn pre_filter(&mut self, p: PodId) -> Needs {
        Needs {
            filter: !self.volumes(p).is_empty(),
            score: false,
        }
    }

    fn filter(&self, p: PodId, n: NodeId) -> FilterResult {
        let limits = &self.snap.nodes[n as usize].attach_limits;
        if limits.is_empty() {
            return FilterResult::Pass;
        }
        let u = &self.used[n as usize];
        // the pod's volumes not on the node yet, each once
        let mut new: BTreeMap<&str, u32> = BTreeMap::new();
        let mine = self.volumes(p);
        for (i, v) in mine.iter().enumerate() {
            if u.pods.contains_key(v) || mine[..i].contains(v) {
                continue;
            }
            *new.entry(v.driver.as_str()).or_insert(0) += 1;
        }
        for (driver, k) in new {
            if let Some(&max) = limits.get(driver) {
                let have = u.per_driver.get(driver).copied().unwrap_or(0);
                if have + k > max {
                    return FilterResult::Reject(MAX_VOLUME_COUNT.into());
                }
            }
        }
        FilterResult::Pass
    }

    fn score(&self, _p: PodId, _n: NodeId) -> Option<i64> {
        None
    }
}

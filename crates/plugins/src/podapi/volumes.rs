//! VolumeBinding (with VolumeZone and VolumeRestrictions' ReadWriteOncePod
//! rule): a pod's PersistentVolumeClaims, resolved by the adapter into
//! [`ClaimNeed`]s, decide which nodes suit it.
//!
//! - A blocked claim (missing, being deleted, unbound `Immediate`, bound
//!   to a missing volume) refuses every node with its reason.
//! - A bound claim allows the nodes of its volume's node affinity and
//!   zone labels.
//! - A `WaitForFirstConsumer` claim needs, on the node, a matching
//!   available volume that no other claim took in this cycle, or a
//!   storage class that can provision there ([`pick_volumes`], the rule
//!   the binder applies too). A placed pod takes the volumes it would
//!   bind, so the gang members and pods after it see them taken; a claim
//!   another placed pod shares pins the pod to that pod's volume (or, if
//!   provisioned, its node).
//! - A `ReadWriteOncePod` claim used by another pod refuses every node.

use crate::config::ConstraintName;
use gpusched_core::{ConstraintState, FilterResult, Needs, NodeId, PodConstraint, PodId, Snapshot};
use gpusched_model::volume::terms_allow;
use gpusched_model::{ClaimNeed, ClaimPick, VolumeConflict, pick_volumes};
use std::collections::{BTreeMap, BTreeSet};

/// The VolumeBinding plugin.
#[derive(Debug, Default)]
pub struct VolumeBinding;

/// kube-scheduler's VolumeRestrictions phrase.
pub const RWOP_CONFLICT: &str =
    "node has pod using PersistentVolumeClaim with the same name and ReadWriteOncePod access mode";

impl PodConstraint for VolumeBinding {
    fn name(&self) -> &'static str {
        ConstraintName::VolumeBinding.as_str()
    }
    fn relevant(&self, pod: &gpusched_model::Pod) -> bool {
        let c = pod.constraints();
        !c.volumes.is_empty() || !c.exclusive_claims.is_empty()
    }
    fn start<'s>(&self, snapshot: &'s Snapshot) -> Box<dyn ConstraintState + 's> {
        Box::new(State {
            snap: snapshot,
            taken: BTreeMap::new(),
            fixed: BTreeMap::new(),
            picks: BTreeMap::new(),
            exclusive: BTreeMap::new(),
        })
    }
}

struct State<'s> {
    snap: &'s Snapshot,
    /// Volumes taken by placed pods' delayed claims: the claim.
    taken: BTreeMap<String, String>,
    /// Delayed claims placed pods resolved: what they got, where, how many
    /// placed pods use them.
    fixed: BTreeMap<String, (ClaimPick, NodeId, u32)>,
    /// What each placed pod's delayed claims got.
    picks: BTreeMap<PodId, Vec<String>>,
    /// `ReadWriteOncePod` claims in use, by the pods using them.
    exclusive: BTreeMap<String, BTreeSet<PodId>>,
}

impl<'s> State<'s> {
    fn needs(&self, p: PodId) -> &'s [ClaimNeed] {
        self.snap.pods[p as usize]
            .pod
            .constraints
            .as_deref()
            .map_or(&[], |c| &c.volumes[..])
    }

    fn exclusive_of(&self, p: PodId) -> &'s [String] {
        self.snap.pods[p as usize]
            .pod
            .constraints
            .as_deref()
            .map_or(&[], |c| &c.exclusive_claims[..])
    }

    /// What `p`'s delayed claims get on `n`, given what placed pods took.
    fn resolve(&self, p: PodId, n: NodeId) -> Result<Vec<(&'s str, ClaimPick)>, VolumeConflict> {
        let node = &self.snap.nodes[n as usize];
        let needs = self.needs(p);
        // claims other placed pods resolved: the same volume, or node
        for need in needs {
            if let ClaimNeed::Delayed { claim, pvs, .. } = need
                && let Some((pick, at, _)) = self.fixed.get(claim)
            {
                let ok = match pick {
                    ClaimPick::Volume(v) => pvs
                        .iter()
                        .any(|pv| pv.name == *v && terms_allow(&pv.nodes, node)),
                    ClaimPick::Provision => *at == n,
                };
                if !ok {
                    return Err(VolumeConflict::NodeAffinity);
                }
            }
        }
        pick_volumes(needs, node, |pv, claim| match self.fixed.get(claim) {
            Some((ClaimPick::Volume(v), _, _)) => v == pv,
            Some((ClaimPick::Provision, _, _)) => false,
            None => self.taken.get(pv).is_none_or(|c| c == claim),
        })
    }
}

impl ConstraintState for State<'_> {
    fn add_pod(&mut self, pod: PodId, node: NodeId) {
        for c in self.exclusive_of(pod) {
            self.exclusive.entry(c.clone()).or_default().insert(pod);
        }
        if !self
            .needs(pod)
            .iter()
            .any(|n| matches!(n, ClaimNeed::Delayed { .. }))
            || (node as usize) >= self.snap.nodes.len()
        {
            return;
        }
        // a pod placed where its claims do not fit (it was placed by
        // someone else, or things changed) takes nothing
        let Ok(picks) = self.resolve(pod, node) else {
            return;
        };
        let mut mine = Vec::new();
        for (claim, pick) in picks {
            if let ClaimPick::Volume(v) = &pick {
                self.taken.insert(v.clone(), claim.to_string());
            }
            self.fixed
                .entry(claim.to_string())
                .or_insert((pick, node, 0))
                .2 += 1;
            mine.push(claim.to_string());
        }
        self.picks.insert(pod, mine);
    }

    fn remove_pod(&mut self, pod: PodId, _node: NodeId) {
        for c in self.exclusive_of(pod) {
            if let Some(s) = self.exclusive.get_mut(c) {
                s.remove(&pod);
                if s.is_empty() {
                    self.exclusive.remove(c);
                }
            }
        }
        for claim in self.picks.remove(&pod).unwrap_or_default() {
            if let Some(f) = self.fixed.get_mut(&claim) {
                f.2 -= 1;
                if f.2 == 0
                    && let Some((pick, _, _)) = self.fixed.remove(&claim)
                    && let ClaimPick::Volume(v) = pick
                {
                    self.taken.remove(&v);
                }
            }
        }
    }

    fn pre_filter(&mut self, p: PodId) -> Needs {
        Needs {
            filter: !self.needs(p).is_empty() || !self.exclusive_of(p).is_empty(),
            score: false,
        }
    }

    fn filter(&self, p: PodId, n: NodeId) -> FilterResult {
        let busy = self.exclusive_of(p).iter().any(|c| {
            self.exclusive
                .get(c)
                .is_some_and(|users| users.iter().any(|&u| u != p))
        });
        if busy {
            return FilterResult::Reject(RWOP_CONFLICT.into());
        }
        match self.resolve(p, n) {
            Ok(_) => FilterResult::Pass,
            Err(e) => FilterResult::Reject(e.reason().into()),
        }
    }

    fn score(&self, _p: PodId, _n: NodeId) -> Option<i64> {
        None
    }
}

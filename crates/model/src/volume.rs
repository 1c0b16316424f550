//! A pod's PersistentVolumeClaims as the scheduler needs them (the
//! semantics of kube-scheduler's VolumeBinding, VolumeZone and
//! VolumeRestrictions plugins): what each claim allows, already resolved
//! against the cluster's claims, volumes and storage classes by the
//! adapter; which nodes suit it is decided here, from node labels.

use crate::node::Node;
use crate::pod::NodeSelectorTerm;
use crate::podapi::LabelSelector;
use serde::{Deserialize, Serialize};

/// Node selector terms, ORed; empty: every node.
pub fn terms_allow(terms: &[NodeSelectorTerm], node: &Node) -> bool {
    terms.is_empty() || terms.iter().any(|t| t.matches(&node.name, &node.labels))
}

/// A volume a pod attaches through a CSI driver (kube-scheduler's
/// NodeVolumeLimits counting): a bound claim's volume (`driver` and
/// `volumeHandle` of its `spec.csi`), or an unbound claim counted by its
/// storage class's provisioner with a handle naming the claim.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CsiVolume {
    /// The CSI driver's name.
    pub driver: String,
    /// The volume's identity within the driver (pods sharing it attach it
    /// once).
    pub handle: String,
}

/// kube-scheduler's NodeVolumeLimits phrase.
pub const MAX_VOLUME_COUNT: &str = "node(s) exceed max volume count";

/// An available PersistentVolume a delayed claim could bind.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PvChoice {
    /// The PersistentVolume's name.
    pub name: String,
    /// Its node affinity (with its zone and region labels as
    /// requirements); empty: every node.
    #[serde(default)]
    pub nodes: Vec<NodeSelectorTerm>,
}

/// One PersistentVolumeClaim of a pod, resolved.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ClaimNeed {
    /// The pod cannot be placed until the claim changes (missing, being
    /// deleted, unbound with `Immediate` binding, bound to a missing
    /// volume): no node suits it. The reason is kube-scheduler's phrase,
    /// naming the claim.
    Blocked {
        /// Why.
        reason: String,
    },
    /// Bound to a volume: only the nodes its node affinity (and zone
    /// labels) allow.
    Bound {
        /// `namespace/name` of the claim.
        claim: String,
        /// The volume's node terms; empty: every node.
        #[serde(default)]
        nodes: Vec<NodeSelectorTerm>,
    },
    /// Unbound, `WaitForFirstConsumer`: the scheduler picks the node, then
    /// binds one of `pvs` (the first usable one that allows the node) or
    /// has the volume provisioned there.
    Delayed {
        /// `namespace/name` of the claim.
        claim: String,
        /// Matching available volumes, the preferred first (one already
        /// reserved for the claim, then the smallest that fits, then by
        /// name).
        #[serde(default)]
        pvs: Vec<PvChoice>,
        /// Where its storage class can provision a volume: `None`: it
        /// cannot; `Some(terms)`: on the nodes the class's
        /// `allowedTopologies` allow (empty: every node).
        #[serde(default)]
        provision: Option<Vec<NodeSelectorTerm>>,
        /// The node named in the claim's `volume.kubernetes.io/selected-node`
        /// annotation (provisioning was asked there): only that node can
        /// provision it.
        #[serde(default)]
        selected_node: Option<String>,
        /// Storage capacity (the class's CSI driver publishes
        /// `CSIStorageCapacity`): `None`: not checked; `Some(topologies)`:
        /// provisioning needs a node matched by one of these node
        /// topologies, those of the capacity objects that hold the claim's
        /// request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        capacity: Option<Vec<LabelSelector>>,
    },
}

/// Why a node does not suit a pod's claims (kube-scheduler's reasons).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeConflict {
    /// A claim blocks every node (its reason).
    Blocked(String),
    /// A bound volume's node affinity or zone excludes the node.
    NodeAffinity,
    /// No available volume for a delayed claim allows the node, and it
    /// cannot be provisioned there.
    NoVolume,
    /// A delayed claim could be provisioned on the node but no storage
    /// capacity published for it there holds its request.
    NoSpace,
}

impl VolumeConflict {
    /// kube-scheduler's phrase.
    pub fn reason(&self) -> String {
        match self {
            VolumeConflict::Blocked(r) => r.clone(),
            VolumeConflict::NodeAffinity => "node(s) had volume node affinity conflict".into(),
            VolumeConflict::NoVolume => {
                "node(s) didn't find available persistent volumes to bind".into()
            }
            VolumeConflict::NoSpace => "node(s) did not have enough free storage".into(),
        }
    }
}

/// What a delayed claim gets on a node.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ClaimPick {
    /// Bind this volume (its name).
    Volume(String),
    /// Provision a volume on the node.
    Provision,
}

/// For a pod's claims on `node`: what each delayed
/// claim gets (`(claim, pick)` in the pod's order), or why the node does
/// not suit. `usable(pv, claim)` says whether a volume is still free for
/// that claim (not taken by another claim); volumes picked for the pod's
/// earlier claims are not picked again. The one rule the scheduler's
/// filter and the binder both use.
pub fn pick_volumes<'a>(
    needs: &'a [ClaimNeed],
    node: &Node,
    usable: impl Fn(&str, &str) -> bool,
) -> Result<Vec<(&'a str, ClaimPick)>, VolumeConflict> {
    let mut out: Vec<(&str, ClaimPick)> = Vec::new();
    for n in needs {
        match n {
            ClaimNeed::Blocked { reason } => return Err(VolumeConflict::Blocked(reason.clone())),
            ClaimNeed::Bound { nodes, .. } => {
                if !terms_allow(nodes, node) {
                    return Err(VolumeConflict::NodeAffinity);
                }
            }
            ClaimNeed::Delayed {
                claim,
                pvs,
                provision,
                selected_node,
                capacity,
            } => {
                let pv = pvs.iter().find(|pv| {
                    terms_allow(&pv.nodes, node)
                        && usable(&pv.name, claim)
                        && !out
                            .iter()
                            .any(|(_, p)| matches!(p, ClaimPick::Volume(v) if *v == pv.name))
                });
                let pick = match (pv, provision) {
                    (Some(pv), _) => ClaimPick::Volume(pv.name.clone()),
                    (None, Some(t))
                        if terms_allow(t, node)
                            && selected_node.as_ref().is_none_or(|s| *s == node.name) =>
                    {
                        if capacity
                            .as_ref()
                            .is_some_and(|c| !c.iter().any(|s| s.matches(&node.labels)))
                        {
                            return Err(VolumeConflict::NoSpace);
                        }
                        ClaimPick::Provision
                    }
                    (None, _) => return Err(VolumeConflict::NoVolume),
                };
                out.push((claim.as_str(), pick));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pod::{NodeSelectorOp, NodeSelectorRequirement};

    fn host(h: &str) -> Vec<NodeSelectorTerm> {
        vec![NodeSelectorTerm {
            match_expressions: vec![NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: NodeSelectorOp::In,
                values: vec![h.into()],
            }],
            ..Default::default()
        }]
    }

    fn labels(h: &str) -> Node {
        let mut n = Node::new(h, Default::default(), Vec::new());
        n.labels
            .insert("kubernetes.io/hostname".to_string(), h.to_string());
        n
    }

    fn pv(name: &str, on: &str) -> PvChoice {
        PvChoice {
            name: name.into(),
            nodes: host(on),
        }
    }

    #[test]
    fn a_bound_volume_allows_only_its_nodes() {
        let needs = [ClaimNeed::Bound {
            claim: "ml/a".into(),
            nodes: host("n3"),
        }];
        assert_eq!(pick_volumes(&needs, &labels("n3"), |_, _| true), Ok(vec![]));
        assert_eq!(
            pick_volumes(&needs, &labels("n1"), |_, _| true),
            Err(VolumeConflict::NodeAffinity)
        );
        let anywhere = [ClaimNeed::Bound {
            claim: "ml/a".into(),
            nodes: vec![],
        }];
        assert!(pick_volumes(&anywhere, &labels("n1"), |_, _| true).is_ok());
    }

    #[test]
    fn a_blocked_claim_blocks_every_node_with_its_reason() {
        let needs = [ClaimNeed::Blocked {
            reason: "persistentvolumeclaim \"data\" not found".into(),
        }];
        let e = pick_volumes(&needs, &labels("n1"), |_, _| true).unwrap_err();
        assert_eq!(e.reason(), "persistentvolumeclaim \"data\" not found");
    }

    #[test]
    fn a_delayed_claim_takes_the_first_free_volume_on_the_node_else_provisions() {
        let needs = [ClaimNeed::Delayed {
            claim: "ml/a".into(),
            pvs: vec![pv("small", "n3"), pv("big", "n3"), pv("other", "n2")],
            provision: None,
            selected_node: None,
            capacity: None,
        }];
        assert_eq!(
            pick_volumes(&needs, &labels("n3"), |_, _| true),
            Ok(vec![("ml/a", ClaimPick::Volume("small".into()))])
        );
        assert_eq!(
            pick_volumes(&needs, &labels("n3"), |pv, _| pv != "small"),
            Ok(vec![("ml/a", ClaimPick::Volume("big".into()))])
        );
        assert_eq!(
            pick_volumes(&needs, &labels("n1"), |_, _| true),
            Err(VolumeConflict::NoVolume)
        );
        let prov = [ClaimNeed::Delayed {
            claim: "ml/a".into(),
            pvs: vec![pv("x", "n3")],
            provision: Some(host("n1")),
            selected_node: None,
            capacity: None,
        }];
        assert_eq!(
            pick_volumes(&prov, &labels("n1"), |_, _| true),
            Ok(vec![("ml/a", ClaimPick::Provision)])
        );
        assert_eq!(
            pick_volumes(&prov, &labels("n2"), |_, _| true),
            Err(VolumeConflict::NoVolume)
        );
        // provisioning already asked on n1: only n1
        let asked = [ClaimNeed::Delayed {
            claim: "ml/a".into(),
            pvs: vec![],
            provision: Some(vec![]),
            selected_node: Some("n1".into()),
            capacity: None,
        }];
        assert!(pick_volumes(&asked, &labels("n1"), |_, _| true).is_ok());
        assert_eq!(
            pick_volumes(&asked, &labels("n2"), |_, _| true),
            Err(VolumeConflict::NoVolume)
        );
    }

    #[test]
    fn provisioning_with_storage_capacity_needs_a_capacity_object_for_the_node() {
        let on = |h: &str| LabelSelector {
            requirements: vec![NodeSelectorRequirement {
                key: "kubernetes.io/hostname".into(),
                operator: NodeSelectorOp::In,
                values: vec![h.into()],
            }],
        };
        // the class provisions anywhere; capacity holding the request was
        // published for n1 only
        let needs = |capacity| {
            [ClaimNeed::Delayed {
                claim: "ml/a".into(),
                pvs: vec![pv("static", "n3")],
                provision: Some(vec![]),
                selected_node: None,
                capacity,
            }]
        };
        let some = needs(Some(vec![on("n1")]));
        assert_eq!(
            pick_volumes(&some, &labels("n1"), |_, _| true),
            Ok(vec![("ml/a", ClaimPick::Provision)])
        );
        assert_eq!(
            pick_volumes(&some, &labels("n2"), |_, _| true),
            Err(VolumeConflict::NoSpace)
        );
        assert_eq!(
            VolumeConflict::NoSpace.reason(),
            "node(s) did not have enough free storage"
        );
        // a matching static volume needs no capacity
        assert_eq!(
            pick_volumes(&some, &labels("n3"), |_, _| true),
            Ok(vec![("ml/a", ClaimPick::Volume("static".into()))])
        );
        // no capacity object holds the request: nowhere to provision
        let none = needs(Some(vec![]));
        assert_eq!(
            pick_volumes(&none, &labels("n1"), |_, _| true),
            Err(VolumeConflict::NoSpace)
        );
        // capacity not tracked for the driver: everywhere
        assert!(pick_volumes(&needs(None), &labels("n2"), |_, _| true).is_ok());
    }

    #[test]
    fn two_claims_of_one_pod_never_get_one_volume() {
        let needs = [
            ClaimNeed::Delayed {
                claim: "ml/a".into(),
                pvs: vec![pv("v1", "n3")],
                provision: None,
                selected_node: None,
                capacity: None,
            },
            ClaimNeed::Delayed {
                claim: "ml/b".into(),
                pvs: vec![pv("v1", "n3")],
                provision: None,
                selected_node: None,
                capacity: None,
            },
        ];
        assert_eq!(
            pick_volumes(&needs, &labels("n3"), |_, _| true),
            Err(VolumeConflict::NoVolume)
        );
    }
}

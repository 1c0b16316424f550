//! A pod's PersistentVolumeClaims resolved against the claims, volumes and
//! storage classes the scheduler watches, as kube-scheduler's
//! VolumeBinding, VolumeZone and VolumeRestrictions plugins read them:
//! pure functions from objects to the core's [`ClaimNeed`]s, and the
//! scheduler's reservations of volumes it is binding.

use gpusched_model::{
    ClaimNeed, ClaimPick, CsiVolume, LabelSelector, NodeSelectorOp, NodeSelectorRequirement,
    NodeSelectorTerm, PvChoice, Quantity,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, CSIStorageCapacity, StorageClass};
use std::collections::BTreeMap;

/// The annotation that asks a provisioner for a volume on a node.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// Set on a volume whose claim reference a controller (here: the
/// scheduler) wrote, as the PV controller expects.
pub const ANN_BOUND_BY_CONTROLLER: &str = "pv.kubernetes.io/bound-by-controller";
/// The storage class's provisioner that provisions nothing.
pub const NO_PROVISIONER: &str = "kubernetes.io/no-provisioner";
const ZONE_LABELS: &[&str] = &[
    "topology.kubernetes.io/zone",
    "topology.kubernetes.io/region",
    "failure-domain.beta.kubernetes.io/zone",
    "failure-domain.beta.kubernetes.io/region",
];

/// A claim a pod uses (`spec.volumes[*]`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodClaim {
    /// The claim's name in the pod's namespace.
    pub name: String,
    /// Made for the pod from an ephemeral volume template (must be owned
    /// by the pod).
    pub ephemeral: bool,
}

/// The claims of a pod's volumes, in order.
pub fn pod_claims(p: &Pod) -> Vec<PodClaim> {
    let pod_name = p.metadata.name.as_deref().unwrap_or_default();
    let Some(spec) = &p.spec else {
        return Vec::new();
    };
    spec.volumes
        .iter()
        .flatten()
        .filter_map(|v| {
            if let Some(c) = &v.persistent_volume_claim {
                Some(PodClaim {
                    name: c.claim_name.clone(),
                    ephemeral: false,
                })
            } else {
                v.ephemeral.as_ref().map(|_| PodClaim {
                    name: format!("{pod_name}-{}", v.name),
                    ephemeral: true,
                })
            }
        })
        .collect()
}

/// The volume objects the scheduler watches, and what it reserved.
#[derive(Clone, Debug, Default)]
pub struct Volumes {
    /// Claims by `namespace/name`.
    pub claims: BTreeMap<String, PersistentVolumeClaim>,
    /// Volumes by name.
    pub volumes: BTreeMap<String, PersistentVolume>,
    /// Storage classes by name.
    pub classes: BTreeMap<String, StorageClass>,
    /// CSINodes by name (the node's name): the nodes' attach limits.
    pub csi_nodes: BTreeMap<String, CSINode>,
    /// CSIDrivers by name: which publish storage capacity.
    pub csi_drivers: BTreeMap<String, CSIDriver>,
    /// CSIStorageCapacities by `namespace/name`.
    pub capacities: BTreeMap<String, CSIStorageCapacity>,
    /// Claims the scheduler is binding (`namespace/name`): what each gets,
    /// on which node, for which pod (uid).
    pub reserved: BTreeMap<String, Reservation>,
}

/// A claim the scheduler decided and is binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// The volume, or provisioning.
    pub pick: ClaimPick,
    /// The node.
    pub node: String,
    /// The pod it was decided for.
    pub uid: String,
}

/// A write that binds a claim before the pod's Binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum VolumeWrite {
    /// Set the volume's `claimRef` to the claim (the PV controller then
    /// binds the claim to it).
    BindVolume {
        /// The volume.
        volume: String,
        /// Its `resourceVersion` when decided (the write is refused if it
        /// changed since).
        resource_version: String,
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        claim: String,
        /// Claim uid.
        claim_uid: String,
    },
    /// Set `volume.kubernetes.io/selected-node` on the claim (its
    /// provisioner then makes a volume there).
    SelectNode {
        /// Claim namespace.
        namespace: String,
        /// Claim name.
        claim: String,
        /// The node.
        node: String,
    },
}

impl VolumeWrite {
    /// `namespace/name` of the claim it binds.
    pub fn claim_key(&self) -> String {
        match self {
            VolumeWrite::BindVolume {
                namespace, claim, ..
            }
            | VolumeWrite::SelectNode {
                namespace, claim, ..
            } => format!("{namespace}/{claim}"),
        }
    }
}

fn storage(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> Option<i128> {
    q.and_then(|q| Quantity::parse(&q.0).ok())
        .map(|q| q.units())
}

fn claim_class(c: &PersistentVolumeClaim) -> String {
    c.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .or_else(|| {
            c.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class").cloned())
        })
        .unwrap_or_default()
}

fn volume_class(v: &PersistentVolume) -> String {
    v.spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .or_else(|| {
            v.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("volume.beta.kubernetes.io/storage-class").cloned())
        })
        .unwrap_or_default()
}

/// Whether the claim is bound (or being bound) to a volume.
pub fn claim_bound(c: &PersistentVolumeClaim) -> bool {
    c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        && c.spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .is_some_and(|v| !v.is_empty())
}

/// The nodes a volume allows: its required node affinity, with its zone
/// and region labels (VolumeZone; `a__b` lists several) ANDed to every
/// term. `Err`: a term gpusched cannot read.
pub fn volume_nodes(v: &PersistentVolume) -> Result<Vec<NodeSelectorTerm>, String> {
    let name = v.metadata.name.as_deref().unwrap_or_default();
    let obj = format!("persistentvolume {name}");
    let mut terms = Vec::new();
    if let Some(req) = v
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
    {
        for (i, t) in req.node_selector_terms.iter().enumerate() {
            terms.push(
                crate::podapi::node_term(
                    t,
                    &obj,
                    &format!("spec.nodeAffinity.required.nodeSelectorTerms[{i}]"),
                )
                .map_err(|e| e.to_string())?,
            );
        }
        if terms.is_empty() {
            // required with no term: no node
            terms.push(NodeSelectorTerm {
                match_expressions: vec![NodeSelectorRequirement {
                    key: "kubernetes.io/hostname".into(),
                    operator: NodeSelectorOp::In,
                    values: Vec::new(),
                }],
                ..Default::default()
            });
        }
    }
    let zones: Vec<NodeSelectorRequirement> = ZONE_LABELS
        .iter()
        .filter_map(|k| {
            v.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(*k))
                .map(|val| NodeSelectorRequirement {
                    key: k.to_string(),
                    operator: NodeSelectorOp::In,
                    values: val.split("__").map(str::to_string).collect(),
                })
        })
        .collect();
    if !zones.is_empty() {
        if terms.is_empty() {
            terms.push(NodeSelectorTerm::default());
        }
        for t in &mut terms {
            t.match_expressions.extend(zones.iter().cloned());
        }
    }
    Ok(terms)
}

fn class_topology(c: &StorageClass) -> Vec<NodeSelectorTerm> {
    c.allowed_topologies
        .iter()
        .flatten()
        .map(|t| NodeSelectorTerm {
            match_expressions: t
                .match_label_expressions
                .iter()
                .flatten()
                .map(|e| NodeSelectorRequirement {
                    key: e.key.clone(),
                    operator: NodeSelectorOp::In,
                    values: e.values.clone(),
                })
                .collect(),
            ..Default::default()
        })
        .collect()
}

/// Whether a volume could bind the claim (the PV controller's matching,
/// node affinity aside): free or reserved for this claim, same class and
/// volume mode, every access mode, enough capacity, the claim's selector.
/// `Some(true)`: it is pre-bound to this claim.
fn matches(v: &PersistentVolume, c: &PersistentVolumeClaim) -> Option<bool> {
    let vs = v.spec.as_ref()?;
    let cs = c.spec.as_ref()?;
    if v.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let ns = c.metadata.namespace.as_deref().unwrap_or_default();
    let name = c.metadata.name.as_deref().unwrap_or_default();
    let prebound = match &vs.claim_ref {
        None => false,
        Some(r) => {
            let same = r.namespace.as_deref() == Some(ns)
                && r.name.as_deref() == Some(name)
                && r.uid
                    .as_deref()
                    .is_none_or(|u| Some(u) == c.metadata.uid.as_deref());
            if !same {
                return None;
            }
            true
        }
    };
    if !prebound
        && v.status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p != "Available")
    {
        return None;
    }
    if volume_class(v) != claim_class(c) {
        return None;
    }
    let mode = |m: Option<&String>| m.map_or("Filesystem", |m| m.as_str()).to_string();
    if mode(vs.volume_mode.as_ref()) != mode(cs.volume_mode.as_ref()) {
        return None;
    }
    let have = vs.access_modes.clone().unwrap_or_default();
    if !cs.access_modes.iter().flatten().all(|m| have.contains(m)) {
        return None;
    }
    let want = storage(
        cs.resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
    .unwrap_or(0);
    let cap = storage(vs.capacity.as_ref().and_then(|c| c.get("storage"))).unwrap_or(0);
    if cap < want {
        return None;
    }
    if let Some(sel) = &cs.selector {
        let sel = crate::podapi::selector(sel, "", "").ok()?;
        let labels = v.metadata.labels.clone().unwrap_or_default();
        if !sel.matches(&labels) {
            return None;
        }
    }
    Some(prebound)
}

/// `namespace/name` of a pod's `ReadWriteOncePod` claims.
pub fn exclusive(vols: &Volumes, namespace: &str, claims: &[PodClaim]) -> Vec<String> {
    claims
        .iter()
        .map(|c| format!("{namespace}/{}", c.name))
        .filter(|k| vols.claims.get(k).is_some_and(read_write_once_pod))
        .collect()
}

fn read_write_once_pod(c: &PersistentVolumeClaim) -> bool {
    c.spec
        .as_ref()
        .and_then(|s| s.access_modes.as_ref())
        .is_some_and(|m| m.iter().any(|m| m == "ReadWriteOncePod"))
}

/// A pod's claims resolved: what each needs, and the `namespace/name` of
/// its `ReadWriteOncePod` claims.
pub fn resolve(
    vols: &Volumes,
    namespace: &str,
    pod_uid: &str,
    claims: &[PodClaim],
) -> (Vec<ClaimNeed>, Vec<String>) {
    let mut needs = Vec::new();
    let mut exclusive = Vec::new();
    for pc in claims {
        let key = format!("{namespace}/{}", pc.name);
        let blocked = |reason: String| ClaimNeed::Blocked { reason };
        let Some(c) = vols.claims.get(&key) else {
            needs.push(blocked(format!(
                "persistentvolumeclaim \"{}\" not found",
                pc.name
            )));
            continue;
        };
        if read_write_once_pod(c) {
            exclusive.push(key.clone());
        }
        if c.metadata.deletion_timestamp.is_some() {
            needs.push(blocked(format!(
                "persistentvolumeclaim \"{}\" is being deleted",
                pc.name
            )));
            continue;
        }
        if pc.ephemeral
            && !c
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.controller == Some(true) && o.uid == pod_uid)
        {
            needs.push(blocked(format!(
                "PVC {key} was not created for pod (pod is not owner)"
            )));
            continue;
        }
        if let Some(vname) = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
        {
            needs.push(match vols.volumes.get(vname) {
                None => blocked(format!(
                    "persistentvolumeclaim \"{}\" is bound to persistentvolume \"{vname}\", which does not exist",
                    pc.name
                )),
                Some(v) => match volume_nodes(v) {
                    Ok(nodes) => ClaimNeed::Bound {
                        claim: key.clone(),
                        nodes,
                    },
                    Err(e) => blocked(e),
                },
            });
            continue;
        }
        if let Some(r) = vols.reserved.get(&key) {
            // the scheduler is binding it: where it decided
            needs.push(match &r.pick {
                ClaimPick::Volume(v) => match vols.volumes.get(v).map(volume_nodes) {
                    Some(Ok(nodes)) => ClaimNeed::Bound {
                        claim: key.clone(),
                        nodes,
                    },
                    _ => blocked(format!(
                        "persistentvolumeclaim \"{}\" is being bound to persistentvolume \"{v}\"",
                        pc.name
                    )),
                },
                ClaimPick::Provision => ClaimNeed::Delayed {
                    claim: key.clone(),
                    pvs: Vec::new(),
                    provision: Some(Vec::new()),
                    selected_node: Some(r.node.clone()),
                    capacity: None,
                },
            });
            continue;
        }
        let class_name = claim_class(c);
        let class = vols.classes.get(&class_name);
        let delayed =
            class.filter(|sc| sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
        let Some(sc) = delayed.filter(|_| !class_name.is_empty()) else {
            if !class_name.is_empty() && class.is_none() {
                needs.push(blocked(format!(
                    "storageclass.storage.k8s.io \"{class_name}\" not found (persistentvolumeclaim \"{}\")",
                    pc.name
                )));
            } else {
                needs.push(blocked(format!(
                    "pod has unbound immediate PersistentVolumeClaims (persistentvolumeclaim \"{}\")",
                    pc.name
                )));
            }
            continue;
        };
        // candidates: matching volumes not reserved for another claim;
        // pre-bound first, then the smallest, then by name
        let mut cands: Vec<(bool, i128, &str, Vec<NodeSelectorTerm>)> = Vec::new();
        for (name, v) in &vols.volumes {
            if vols
                .reserved
                .iter()
                .any(|(k, r)| *k != key && r.pick == ClaimPick::Volume(name.clone()))
            {
                continue;
            }
            let Some(prebound) = matches(v, c) else {
                continue;
            };
            let Ok(nodes) = volume_nodes(v) else {
                continue;
            };
            let cap = storage(
                v.spec
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get("storage")),
            )
            .unwrap_or(0);
            cands.push((!prebound, cap, name.as_str(), nodes));
        }
        cands.sort_by(|a, b| (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        let provision = (sc.provisioner != NO_PROVISIONER).then(|| class_topology(sc));
        let capacity = provision
            .as_ref()
            .and_then(|_| provision_capacity(vols, sc, &class_name, c));
        needs.push(ClaimNeed::Delayed {
            claim: key.clone(),
            pvs: cands
                .into_iter()
                .map(|(_, _, name, nodes)| PvChoice {
                    name: name.to_string(),
                    nodes,
                })
                .collect(),
            provision,
            selected_node: c
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANN_SELECTED_NODE).cloned()),
            capacity,
        });
    }
    (needs, exclusive)
}

/// A node's CSI attach limits: `spec.drivers[].allocatable.count` of its
/// `CSINode` (same name), by driver; drivers without a count are not
/// limited (as kube-scheduler's NodeVolumeLimits reads them).
pub fn attach_limits(vols: &Volumes, node: &str) -> BTreeMap<String, u32> {
    vols.csi_nodes
        .get(node)
        .into_iter()
        .flat_map(|c| c.spec.drivers.iter())
        .filter_map(|d| {
            let count = d.allocatable.as_ref()?.count?;
            Some((d.name.clone(), count.max(0) as u32))
        })
        .collect()
}

/// Whether any node has an attach limit (else pods' CSI volumes need not
/// be resolved at all).
pub fn any_attach_limit(vols: &Volumes) -> bool {
    vols.csi_nodes.values().any(|c| {
        c.spec
            .drivers
            .iter()
            .any(|d| d.allocatable.as_ref().is_some_and(|a| a.count.is_some()))
    })
}

/// The volumes a pod's claims attach through CSI drivers, as
/// kube-scheduler's NodeVolumeLimits counts them: a bound claim's volume
/// by its `spec.csi` driver and `volumeHandle` (a volume of an in-tree
/// plugin is not counted here); a claim without a volume (or bound to one
/// that does not exist) by its storage class's provisioner, under a handle
/// naming the claim; a missing claim, or one without a class, not at all.
pub fn csi_volumes(vols: &Volumes, namespace: &str, claims: &[PodClaim]) -> Vec<CsiVolume> {
    let mut out = Vec::new();
    for pc in claims {
        let key = format!("{namespace}/{}", pc.name);
        let Some(c) = vols.claims.get(&key) else {
            continue;
        };
        let bound = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.as_deref())
            .filter(|v| !v.is_empty())
            .and_then(|v| vols.volumes.get(v));
        if let Some(v) = bound {
            if let Some(csi) = v.spec.as_ref().and_then(|s| s.csi.as_ref()) {
                out.push(CsiVolume {
                    driver: csi.driver.clone(),
                    handle: csi.volume_handle.clone(),
                });
            }
            continue;
        }
        let class = claim_class(c);
        if let Some(sc) = vols.classes.get(&class).filter(|_| !class.is_empty()) {
            out.push(CsiVolume {
                driver: sc.provisioner.clone(),
                handle: format!("claim:{key}"),
            });
        }
    }
    out
}

/// For a claim its class would provision: `None` when the class's CSI
/// driver does not publish storage capacity (no `CSIDriver` with
/// `storageCapacity: true`), else the node topologies of the class's
/// `CSIStorageCapacity` objects whose `maximumVolumeSize` (or, without it,
/// `capacity`) holds the claim's request — kube-scheduler's VolumeBinding
/// capacity check. An object without `nodeTopology` (or one that does not
/// parse) reaches no node.
fn provision_capacity(
    vols: &Volumes,
    sc: &StorageClass,
    class: &str,
    c: &PersistentVolumeClaim,
) -> Option<Vec<LabelSelector>> {
    let tracked = vols
        .csi_drivers
        .get(&sc.provisioner)
        .and_then(|d| d.spec.storage_capacity)
        .unwrap_or(false);
    if !tracked {
        return None;
    }
    let want = storage(
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage")),
    )
    .unwrap_or(0);
    Some(
        vols.capacities
            .values()
            .filter(|cap| cap.storage_class_name == class)
            .filter(|cap| {
                storage(cap.maximum_volume_size.as_ref().or(cap.capacity.as_ref()))
                    .is_some_and(|have| have >= want)
            })
            .filter_map(|cap| crate::podapi::selector(cap.node_topology.as_ref()?, "", "").ok())
            .collect(),
    )
}

/// The writes that bind a pod's delayed claims as decided (`picks` from
/// [`gpusched_model::pick_volumes`] on the chosen node).
pub fn writes(vols: &Volumes, picks: &[(&str, ClaimPick)], node: &str) -> Vec<VolumeWrite> {
    picks
        .iter()
        .filter_map(|(key, pick)| {
            let c = vols.claims.get(*key)?;
            let namespace = c.metadata.namespace.clone().unwrap_or_default();
            let claim = c.metadata.name.clone().unwrap_or_default();
            Some(match pick {
                ClaimPick::Volume(v) => VolumeWrite::BindVolume {
                    volume: v.clone(),
                    resource_version: vols
                        .volumes
                        .get(v)?
                        .metadata
                        .resource_version
                        .clone()
                        .unwrap_or_default(),
                    namespace,
                    claim,
                    claim_uid: c.metadata.uid.clone().unwrap_or_default(),
                },
                ClaimPick::Provision => VolumeWrite::SelectNode {
                    namespace,
                    claim,
                    node: node.to_string(),
                },
            })
        })
        .collect()
}

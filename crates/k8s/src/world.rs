//! The scheduler's picture of the cluster: translated objects kept by key
//! and updated one watch event at a time, plus the placements it assumed but
//! the API has not confirmed yet. [`World::build`] assembles the core's
//! [`Snapshot`] from it, deterministically (ordered maps, stable sorts).

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::decision::{DecisionError, GpuDecision};
use crate::translate::{self, DEFAULT_QUEUE, NodeView, PodKind, PodView};
use crate::volumes::{PodClaim, Reservation, VolumeWrite, Volumes};
use crate::workloads::{self, Workload, WorkloadKind};
use gpusched_core::fairshare::QueueTree;
use gpusched_core::{GpuAssignment, NodeId, PodPhase, PodState, Snapshot};
use gpusched_model::{GpuRequest, PodGroup as MGroup, Queue as MQueue};
use gpusched_plugins::classify::PendingClass;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

mod build;
mod cache;

pub use cache::first_difference;

/// The kinds of object the world keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    /// Pods (by uid).
    Pod,
    /// Nodes.
    Node,
    /// gpusched Queues.
    Queue,
    /// gpusched PodGroups.
    PodGroup,
    /// scheduler-plugins PodGroups.
    SpPodGroup,
    /// PriorityClasses.
    PriorityClass,
    /// PodDisruptionBudgets (by `namespace/name`).
    Pdb,
    /// `batch/v1` Jobs labelled as gangs (watched for their PodGroups;
    /// the world keeps none).
    Job,
    /// JobSets (by `namespace/name`), whose pods are gangs
    /// ([`crate::workloads`]).
    JobSet,
    /// LeaderWorkerSets (by `namespace/name`), each group a gang.
    LeaderWorkerSet,
    /// Upstream `scheduling.k8s.io/v1beta1` PodGroups (by
    /// `namespace/name`), named by pods in `spec.schedulingGroup`.
    UpstreamPodGroup,
    /// KubeRay RayClusters (by `namespace/name`).
    RayCluster,
    /// Kubeflow PyTorchJobs (by `namespace/name`).
    PyTorchJob,
    /// Kubeflow TFJobs.
    TfJob,
    /// MPI Operator MPIJobs (`kubeflow.org/v2beta1`).
    MpiJob,
    /// training-operator MPIJobs (`kubeflow.org/v1`).
    MpiJobV1,
    /// Namespaces (by name), for affinity terms' namespace selectors.
    Namespace,
    /// PersistentVolumeClaims (by `namespace/name`).
    Pvc,
    /// PersistentVolumes (by name).
    Pv,
    /// StorageClasses (by name).
    StorageClass,
    /// CSINodes (by name): attach limits.
    CsiNode,
    /// CSIDrivers (by name): storage capacity tracking.
    CsiDriver,
    /// CSIStorageCapacities (by `namespace/name`).
    CsiStorageCapacity,
    /// DRA ResourceClaims (by `namespace/name`).
    ResourceClaim,
    /// DRA ResourceSlices (by name).
    ResourceSlice,
    /// DRA DeviceClasses (by name).
    DeviceClass,
    /// DRA DeviceTaintRules (by name).
    DeviceTaintRule,
}

/// Up to this many nodes + pods, debug builds check every incremental
/// snapshot against a full build ([`World::snapshot`]).
pub const CHECK_EVERY_SIZE: usize = 2_000;
/// Above [`CHECK_EVERY_SIZE`], debug builds check every this many
/// snapshots.
pub const CHECK_EVERY: u64 = 32;

/// A placement the scheduler made and is binding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assumed {
    /// Node it is being bound to.
    pub node: String,
    /// The decision written with the binding.
    pub decision: GpuDecision,
    /// The GPUs, as positions on the node.
    pub gpus: GpuAssignment,
}

/// Which pod a snapshot index stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodRef {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// Something wrong with an object, for an event or a status condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// A pod of ours that cannot be scheduled as written.
    InvalidPod {
        /// The pod.
        pod: PodRef,
        /// Why, naming the field.
        error: String,
    },
    /// A pod gated by `spec.schedulingGates`.
    GatedPod {
        /// The pod.
        pod: PodRef,
        /// Gates present.
        gates: Vec<String>,
    },
    /// A bound pod's GPU decision is unusable (its GPUs are assumed).
    BadDecision {
        /// The pod.
        pod: PodRef,
        /// Why.
        error: String,
    },
    /// A Queue cannot be used.
    InvalidQueue {
        /// Queue name.
        queue: String,
        /// Why.
        error: String,
    },
    /// A PodGroup cannot be used.
    InvalidGroup {
        /// `namespace/name`.
        group: String,
        /// Why.
        error: String,
    },
    /// A pod of ours whose ResourceClaims keep it pending: a claim does
    /// not exist yet, or they cannot be allocated on any node.
    ClaimsPending {
        /// The pod.
        pod: PodRef,
        /// [`PendingClass::WaitingForClaim`] or
        /// [`PendingClass::UnallocatableClaim`].
        class: PendingClass,
        /// Why, naming the claim.
        message: String,
    },
    /// A node's objects had unreadable parts.
    NodeWarning {
        /// Node name.
        node: String,
        /// What.
        warning: String,
    },
}

/// What [`World::build`] produced.
#[derive(Clone, Debug, Default)]
pub struct Built {
    /// The core's input.
    pub snapshot: Snapshot,
    /// `snapshot.pods[i]` is `pods[i]`.
    pub pods: Vec<PodRef>,
    /// Problems to report.
    pub problems: Vec<Problem>,
    /// Pods of ours that are pending (gated and invalid ones included), by queue.
    pub pending_by_queue: BTreeMap<String, u32>,
    /// Pending pods the core never sees (gated, invalid), by queue and class.
    pub unseen_by_queue: BTreeMap<String, BTreeMap<PendingClass, u32>>,
    /// Pods (by position in `snapshot.pods`) asking time-sliced replicas,
    /// placed as shares (`crate::sharing`): their decisions name the
    /// resource and the count.
    pub replicas: BTreeMap<usize, crate::sharing::ReplicaAsk>,
}

/// The `status` of each Queue (by name) and gpusched PodGroup (by
/// `namespace/name`) that exists, as last seen (`None`: no status yet).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ObservedStatus {
    /// Queues.
    pub queues: BTreeMap<String, Option<crate::crd::QueueStatus>>,
    /// gpusched PodGroups.
    pub groups: BTreeMap<String, Option<crate::crd::PodGroupStatus>>,
}

/// A PodGroup: translated, its priority class, whether made for a Job.
#[derive(Clone, Debug)]
struct GroupEntry {
    group: Result<MGroup, String>,
    priority_class: Option<String>,
    for_job: bool,
}

/// Translated objects, by key.
#[derive(Clone, Debug, Default)]
pub struct World {
    nodes: BTreeMap<String, NodeView>,
    pods: BTreeMap<String, PodView>,
    queues: BTreeMap<String, Result<MQueue, String>>,
    groups: BTreeMap<String, GroupEntry>,
    sp_groups: BTreeMap<String, Result<MGroup, String>>,
    /// JobSets and LeaderWorkerSets, by kind and `namespace/name`.
    workloads: BTreeMap<(WorkloadKind, String), Result<Workload, String>>,
    /// The upstream PodGroup each pod names (`spec.schedulingGroup`), by uid.
    scheduling_groups: BTreeMap<String, workloads::Member>,
    /// Pods whose phase is `Succeeded`, by uid (a workload gang's finished
    /// members count as started).
    succeeded: BTreeSet<String>,
    priority_classes: BTreeMap<String, i32>,
    assumed: BTreeMap<String, Assumed>,
    /// When each assumption was made (Unix ms): the pod's bind time until
    /// the API shows it bound.
    assumed_at: BTreeMap<String, u64>,
    nominated: BTreeMap<String, String>,
    /// Why each gang waits for a ProvisioningRequest, by group name
    /// ([`crate::provreq`]): added to its members' pending message.
    provisioning_notes: BTreeMap<String, String>,
    /// Nodes reserved for gangs whose ProvisioningRequest is provisioned.
    provisioned: crate::provreq::Reservations,
    evicting: BTreeSet<String>,
    pdbs: BTreeMap<String, translate::PdbView>,
    /// The decision each bound pod had when this scheduler first saw it
    /// bound (its own, for pods it bound): a later change is tampering
    /// (the annotation is the scheduler's alone), reported and ignored.
    decisions: BTreeMap<String, Option<Result<GpuDecision, DecisionError>>>,
    /// Pods whose decision changed after binding: what changed.
    tampered: BTreeMap<String, String>,
    observed: ObservedStatus,
    /// The `spec.schedulerName`s whose pods are ours (empty:
    /// [`translate::SCHEDULER_NAME`]).
    scheduler_names: Vec<String>,
    /// Claims, volumes, storage classes and the scheduler's reservations.
    volumes: Volumes,
    /// Namespaces' labels, by name.
    namespaces: BTreeMap<String, BTreeMap<String, String>>,
    /// The claims of each pod's volumes, by uid (pods with none absent).
    pod_claims: BTreeMap<String, Vec<PodClaim>>,
    /// DRA: ResourceClaims, ResourceSlices, DeviceClasses and this run's
    /// tentative allocations.
    dra: crate::dra::state::DraState,
    /// Bumped on every change; the loop runs a cycle when it moved.
    pub generation: u64,
    /// The incremental snapshot's parts and what changed since
    /// ([`World::snapshot`]).
    cache: cache::Cache,
}

fn key(ns: Option<&String>, name: Option<&String>) -> String {
    format!(
        "{}/{}",
        ns.map(String::as_str).unwrap_or_default(),
        name.map(String::as_str).unwrap_or_default()
    )
}

impl World {
    /// Which ResourceSlice drivers publish GPUs that are the core's GPUs of
    /// their node (`crate::dra::gpus`; empty: gpusched's own driver).
    pub fn set_dra_gpu_drivers(&mut self, drivers: &[String]) {
        self.dra
            .set_gpu_drivers(crate::dra::gpus::GpuDrivers::new(drivers));
        self.cache.dirty.nodes.extend(self.nodes.keys().cloned());
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// Whether pod `uid` holds its resources in the core: bound on a known
    /// node, or being bound by us.
    pub(crate) fn placed_in_core(&self, uid: &str) -> bool {
        self.assumed.contains_key(uid)
            || self.pods.get(uid).is_some_and(
                |v| matches!(&v.kind, PodKind::Bound { node, .. } if self.nodes.contains_key(node)),
            )
    }

    /// An empty world whose pods are those naming one of `names` in
    /// `spec.schedulerName` (empty: [`translate::SCHEDULER_NAME`]).
    pub fn for_scheduler_names(names: Vec<String>) -> World {
        World {
            scheduler_names: names,
            ..Default::default()
        }
    }

    /// A node was added or changed.
    pub fn upsert_node(&mut self, n: &Node) {
        let v = translate::node(n);
        if self.nodes.get(&v.node.name) != Some(&v) {
            self.cache.dirty.nodes.insert(v.node.name.clone());
        }
        // a node that came for a provisioned request is its gang's from
        // its first appearance
        if !self.nodes.contains_key(&v.node.name)
            && let Some(created) = n.metadata.creation_timestamp.as_ref()
            && let Some((uid, node)) = self
                .provisioned
                .on_new_node(&v.node.name, created.0.as_millisecond().max(0) as u64)
        {
            self.cache.dirty.pods.insert(uid.clone());
            self.nominated.insert(uid, node);
        }
        self.nodes.insert(v.node.name.clone(), v);
        self.generation += 1;
    }

    /// Whether a Queue object of this name exists (valid or not).
    pub fn has_queue(&self, name: &str) -> bool {
        self.queues.contains_key(name)
    }

    /// A node is gone.
    pub fn delete_node(&mut self, name: &str) {
        if self.nodes.remove(name).is_some() {
            self.cache.dirty.nodes.insert(name.to_string());
        }
        self.generation += 1;
    }

    /// A pod was added or changed. Confirms or drops its assumption once the
    /// API shows it bound (or gone).
    pub fn upsert_pod(&mut self, p: &Pod) {
        let mut v = if self.scheduler_names.is_empty() {
            translate::pod(p)
        } else {
            translate::pod_for(p, &self.scheduler_names)
        };
        self.cache.dirty.pods.insert(v.uid.clone());
        // a pod with claims that is placed now, or no longer, changes
        // which devices the core counts for others' claims (one world)
        if !v.claims.is_empty() {
            let placed = |k: &PodKind| matches!(k, PodKind::Bound { .. });
            if self
                .pods
                .get(&v.uid)
                .is_none_or(|o| placed(&o.kind) != placed(&v.kind))
            {
                self.cache.dirty.dra = true;
            }
        }
        match workloads::scheduling_group_member(p) {
            Some(m) => self.scheduling_groups.insert(v.uid.clone(), m),
            None => self.scheduling_groups.remove(&v.uid),
        };
        if p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded") {
            self.succeeded.insert(v.uid.clone());
        } else {
            self.succeeded.remove(&v.uid);
        }
        self.keep_first_decision(&mut v);
        let claims = crate::volumes::pod_claims(p);
        if claims.is_empty() {
            self.pod_claims.remove(&v.uid);
        } else {
            self.pod_claims.insert(v.uid.clone(), claims);
        }
        match &v.kind {
            PodKind::Pending { nominated, .. } => {
                if nominated.is_some() {
                    self.nominated.remove(&v.uid);
                }
            }
            PodKind::Bound {
                terminating: false, ..
            } => {
                self.assumed.remove(&v.uid);
                self.assumed_at.remove(&v.uid);
                self.nominated.remove(&v.uid);
                self.release_volumes(&v.uid);
            }
            _ => {
                self.release_volumes(&v.uid);
                self.assumed.remove(&v.uid);
                self.assumed_at.remove(&v.uid);
                self.nominated.remove(&v.uid);
                self.evicting.remove(&v.uid);
            }
        }
        self.pods.insert(v.uid.clone(), v);
        self.generation += 1;
    }

    /// A bound pod's decision is the one it was bound with: the
    /// scheduler's own when it bound the pod in this run (its assumption),
    /// else the first one seen. A different one later is kept out and
    /// reported.
    fn keep_first_decision(&mut self, v: &mut PodView) {
        let PodKind::Bound { decision, .. } = &mut v.kind else {
            return;
        };
        let first = match self.decisions.get(&v.uid) {
            Some(d) => d.clone(),
            None => {
                let d = match self.assumed.get(&v.uid) {
                    Some(a) => Some(Ok(a.decision.clone())),
                    None => decision.clone(),
                };
                self.decisions.insert(v.uid.clone(), d.clone());
                d
            }
        };
        if *decision != first {
            let shown = |d: &Option<Result<GpuDecision, DecisionError>>| match d {
                None => "none".to_string(),
                Some(Ok(d)) => format!("GPUs {:?} of {}", d.indices, d.node),
                Some(Err(e)) => format!("unreadable ({e})"),
            };
            self.tampered.insert(
                v.uid.clone(),
                format!(
                    "{} was changed after binding (to {}; bound with {}): the change is ignored; only the scheduler writes it, through the Binding",
                    crate::decision::ANNOTATION_DECISION,
                    shown(decision),
                    shown(&first)
                ),
            );
            *decision = first;
        }
    }

    /// Pods whose decision was changed after binding, with what changed.
    pub fn tampered(&self) -> &BTreeMap<String, String> {
        &self.tampered
    }

    /// A pod is gone.
    pub fn delete_pod(&mut self, uid: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        if self
            .pods
            .get(uid)
            .is_some_and(|v| !v.claims.is_empty() || !v.extended.is_empty())
        {
            self.cache.dirty.dra = true;
        }
        self.release_volumes(uid);
        self.pod_claims.remove(uid);
        self.dra.forget_pod(uid);
        self.scheduling_groups.remove(uid);
        self.succeeded.remove(uid);
        self.decisions.remove(uid);
        self.tampered.remove(uid);
        self.pods.remove(uid);
        self.assumed.remove(uid);
        self.assumed_at.remove(uid);
        self.nominated.remove(uid);
        self.evicting.remove(uid);
        self.generation += 1;
    }

    /// Keys of the objects of one kind (for dropping what a relist no
    /// longer shows): pods by uid, nodes, queues, priority classes by name,
    /// pod groups by `namespace/name`.
    pub fn keys(&self, kind: ObjectKind) -> Vec<String> {
        match kind {
            ObjectKind::Pod => self.pods.keys().cloned().collect(),
            ObjectKind::Node => self.nodes.keys().cloned().collect(),
            ObjectKind::Queue => self.queues.keys().cloned().collect(),
            ObjectKind::PodGroup => self.groups.keys().cloned().collect(),
            ObjectKind::SpPodGroup => self.sp_groups.keys().cloned().collect(),
            ObjectKind::PriorityClass => self.priority_classes.keys().cloned().collect(),
            ObjectKind::Pdb => self.pdbs.keys().cloned().collect(),
            ObjectKind::Job => Vec::new(),
            ObjectKind::Namespace => self.namespaces.keys().cloned().collect(),
            ObjectKind::Pvc => self.volumes.claims.keys().cloned().collect(),
            ObjectKind::Pv => self.volumes.volumes.keys().cloned().collect(),
            ObjectKind::StorageClass => self.volumes.classes.keys().cloned().collect(),
            ObjectKind::CsiNode => self.volumes.csi_nodes.keys().cloned().collect(),
            ObjectKind::CsiDriver => self.volumes.csi_drivers.keys().cloned().collect(),
            ObjectKind::CsiStorageCapacity => self.volumes.capacities.keys().cloned().collect(),
            ObjectKind::ResourceClaim => self.dra.claim_keys(),
            ObjectKind::ResourceSlice => self.dra.slice_keys(),
            ObjectKind::DeviceClass => self.dra.class_keys(),
            ObjectKind::DeviceTaintRule => self.dra.taint_rule_keys(),
            ObjectKind::JobSet
            | ObjectKind::LeaderWorkerSet
            | ObjectKind::UpstreamPodGroup
            | ObjectKind::RayCluster
            | ObjectKind::PyTorchJob
            | ObjectKind::TfJob
            | ObjectKind::MpiJob
            | ObjectKind::MpiJobV1 => {
                let k = workload_kind(kind);
                self.workloads
                    .keys()
                    .filter(|(wk, _)| Some(*wk) == k)
                    .map(|(_, key)| key.clone())
                    .collect()
            }
        }
    }

    /// Drops the objects of `kind` whose keys are not in `keep` (what a
    /// relist no longer shows).
    pub fn retain_only(&mut self, kind: ObjectKind, keep: &BTreeSet<String>) {
        for k in self.keys(kind) {
            if !keep.contains(&k) {
                self.remove(kind, &k);
            }
        }
    }

    /// Removes one object by its [`World::keys`] key.
    pub fn remove(&mut self, kind: ObjectKind, key: &str) {
        match kind {
            ObjectKind::Pod => self.delete_pod(key),
            ObjectKind::Node => self.delete_node(key),
            ObjectKind::Queue => self.delete_queue(key),
            ObjectKind::PodGroup => self.delete_group(key),
            ObjectKind::SpPodGroup => self.delete_sp_group(key),
            ObjectKind::PriorityClass => self.delete_priority_class(key),
            ObjectKind::Pdb => {
                self.pdbs.remove(key);
                self.generation += 1;
            }
            ObjectKind::Job => {}
            ObjectKind::Namespace => {
                self.namespaces.remove(key);
                self.cache.dirty.namespaces = true;
                self.generation += 1;
            }
            // storage: what a pod's volumes are checked against
            ObjectKind::Pvc
            | ObjectKind::Pv
            | ObjectKind::StorageClass
            | ObjectKind::CsiNode
            | ObjectKind::CsiDriver
            | ObjectKind::CsiStorageCapacity => {
                let v = &mut self.volumes;
                match kind {
                    ObjectKind::Pvc => drop(v.claims.remove(key)),
                    ObjectKind::Pv => drop(v.volumes.remove(key)),
                    ObjectKind::StorageClass => drop(v.classes.remove(key)),
                    ObjectKind::CsiNode => {
                        v.csi_nodes.remove(key);
                        // its attach limits are its node's
                        self.cache.dirty.nodes.insert(key.to_string());
                    }
                    ObjectKind::CsiDriver => drop(v.csi_drivers.remove(key)),
                    _ => drop(v.capacities.remove(key)),
                }
                self.cache.dirty.volumes = true;
                self.generation += 1;
            }
            // DRA: what a pod's claims are allocated from
            ObjectKind::ResourceClaim
            | ObjectKind::ResourceSlice
            | ObjectKind::DeviceClass
            | ObjectKind::DeviceTaintRule => {
                match kind {
                    ObjectKind::ResourceClaim => self.dra.delete_claim(key),
                    ObjectKind::ResourceSlice => {
                        // its GPUs are its node's GPUs in the core
                        if let Some(n) = self.dra.slice_node(key) {
                            self.cache.dirty.nodes.insert(n);
                        }
                        self.dra.delete_slice(key);
                    }
                    ObjectKind::DeviceClass => self.dra.delete_class(key),
                    _ => {
                        self.dra.delete_taint_rule(key);
                        self.cache.dirty.nodes.extend(self.dra.slice_nodes());
                    }
                }
                self.cache.dirty.dra = true;
                self.generation += 1;
            }
            ObjectKind::JobSet
            | ObjectKind::LeaderWorkerSet
            | ObjectKind::UpstreamPodGroup
            | ObjectKind::RayCluster
            | ObjectKind::PyTorchJob
            | ObjectKind::TfJob
            | ObjectKind::MpiJob
            | ObjectKind::MpiJobV1 => {
                if let Some(k) = workload_kind(kind) {
                    self.workloads.remove(&(k, key.to_string()));
                    self.cache.dirty.groups = true;
                    self.generation += 1;
                }
            }
        }
    }

    /// A Namespace was added or changed.
    pub fn upsert_namespace(&mut self, n: &k8s_openapi::api::core::v1::Namespace) {
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels = n.metadata.labels.clone().unwrap_or_default();
        if self.namespaces.get(&name) != Some(&labels) {
            self.namespaces.insert(name, labels);
            self.cache.dirty.namespaces = true;
            self.generation += 1;
        }
    }

    /// Fills in the namespaces each of `pod`'s affinity terms'
    /// `namespaceSelector` selects, from the Namespaces watched (as
    /// kube-scheduler resolves them when it evaluates the pod).
    fn select_namespaces(&self, pod: &mut gpusched_model::Pod) {
        if !pod
            .constraints
            .as_deref()
            .is_some_and(|c| c.has_namespace_selectors())
        {
            return;
        }
        for t in pod.constraints_mut().terms_mut() {
            if let Some(sel) = &t.namespace_selector {
                t.selected_namespaces = self
                    .namespaces
                    .iter()
                    .filter(|(_, labels)| sel.matches(labels))
                    .map(|(name, _)| name.clone())
                    .collect();
            }
        }
    }

    /// A PersistentVolumeClaim was added or changed.
    pub fn upsert_pvc(&mut self, c: &PersistentVolumeClaim) {
        let k = key(c.metadata.namespace.as_ref(), c.metadata.name.as_ref());
        self.volumes.claims.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A PersistentVolume was added or changed.
    pub fn upsert_pv(&mut self, v: &PersistentVolume) {
        let k = v.metadata.name.clone().unwrap_or_default();
        self.volumes.volumes.insert(k, v.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A StorageClass was added or changed.
    pub fn upsert_storage_class(&mut self, c: &StorageClass) {
        let k = c.metadata.name.clone().unwrap_or_default();
        self.volumes.classes.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A CSINode was added or changed (attach limits).
    pub fn upsert_csi_node(&mut self, c: &k8s_openapi::api::storage::v1::CSINode) {
        let k = c.metadata.name.clone().unwrap_or_default();
        // the node's limits, and every pod's CSI volumes when the first
        // limit appears or the last goes
        self.cache.dirty.nodes.insert(k.clone());
        self.cache.dirty.volumes = true;
        self.volumes.csi_nodes.insert(k, c.clone());
        self.generation += 1;
    }

    /// A CSIDriver was added or changed (storage capacity tracking).
    pub fn upsert_csi_driver(&mut self, d: &k8s_openapi::api::storage::v1::CSIDriver) {
        let k = d.metadata.name.clone().unwrap_or_default();
        self.volumes.csi_drivers.insert(k, d.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A CSIStorageCapacity was added or changed.
    pub fn upsert_storage_capacity(
        &mut self,
        c: &k8s_openapi::api::storage::v1::CSIStorageCapacity,
    ) {
        let k = key(c.metadata.namespace.as_ref(), c.metadata.name.as_ref());
        self.volumes.capacities.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// Decides the delayed claims of pod `uid`, just placed on `node`, as
    /// the core did ([`gpusched_model::pick_volumes`] over the same
    /// objects), reserves what they get until the pod is bound or
    /// forgotten, and returns the writes that bind them. `Err`: they no
    /// longer fit there (the pod should be forgotten and retried).
    pub fn reserve_volumes(&mut self, uid: &str, node: &str) -> Result<Vec<VolumeWrite>, String> {
        let (Some(claims), Some(v), Some(nv)) = (
            self.pod_claims.get(uid),
            self.pods.get(uid),
            self.nodes.get(node),
        ) else {
            return Ok(Vec::new());
        };
        let (needs, _) = crate::volumes::resolve(&self.volumes, &v.namespace, uid, claims);
        let picks =
            gpusched_model::pick_volumes(&needs, &nv.node, |_, _| true).map_err(|e| e.reason())?;
        let writes = crate::volumes::writes(&self.volumes, &picks, node);
        for (claim, pick) in picks {
            self.cache.dirty.volumes = true;
            self.volumes.reserved.insert(
                claim.to_string(),
                Reservation {
                    pick,
                    node: node.to_string(),
                    uid: uid.to_string(),
                },
            );
        }
        if !writes.is_empty() {
            self.generation += 1;
        }
        Ok(writes)
    }

    /// Drops the volume reservations made for pod `uid`.
    pub fn release_volumes(&mut self, uid: &str) {
        let before = self.volumes.reserved.len();
        self.volumes.reserved.retain(|_, r| r.uid != uid);
        if self.volumes.reserved.len() != before {
            self.cache.dirty.volumes = true;
            self.generation += 1;
        }
    }

    /// Whether claim `namespace/name` is bound to a volume (as last seen).
    pub fn claim_bound(&self, claim: &str) -> bool {
        self.volumes
            .claims
            .get(claim)
            .is_some_and(crate::volumes::claim_bound)
    }

    /// A Queue was added or changed.
    pub fn upsert_queue(&mut self, q: &Queue) {
        let name = q.metadata.name.clone().unwrap_or_default();
        self.observed.queues.insert(name.clone(), q.status.clone());
        self.queues
            .insert(name, translate::queue(q).map_err(|e| e.to_string()));
        self.cache.dirty.queues = true;
        self.generation += 1;
    }

    /// A Queue that could not be decoded (`error` names the field): kept as
    /// invalid, so it is reported with `Valid=False` and its pods are told
    /// why, while every other queue works.
    pub fn invalid_queue(&mut self, name: &str, error: String) {
        self.queues.insert(name.to_string(), Err(error));
        self.cache.dirty.queues = true;
        self.observed.queues.entry(name.to_string()).or_insert(None);
        self.generation += 1;
    }

    /// A Queue is gone.
    pub fn delete_queue(&mut self, name: &str) {
        self.queues.remove(name);
        self.cache.dirty.queues = true;
        self.observed.queues.remove(name);
        self.generation += 1;
    }

    /// A PodGroup was added or changed.
    pub fn upsert_group(&mut self, g: &PodGroup) {
        let k = key(g.metadata.namespace.as_ref(), g.metadata.name.as_ref());
        let for_job = g
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(translate::ANNOTATION_FOR_JOB));
        self.observed.groups.insert(k.clone(), g.status.clone());
        self.cache.dirty.groups = true;
        self.groups.insert(
            k,
            GroupEntry {
                group: translate::group(g, 0).map_err(|e| e.to_string()),
                priority_class: g.spec.priority_class_name.clone(),
                for_job,
            },
        );
        self.generation += 1;
    }

    /// A PodGroup that could not be decoded (`key`: `namespace/name`).
    pub fn invalid_group(&mut self, key: &str, error: String) {
        self.observed.groups.entry(key.to_string()).or_insert(None);
        self.cache.dirty.groups = true;
        self.groups.insert(
            key.to_string(),
            GroupEntry {
                group: Err(error),
                priority_class: None,
                for_job: false,
            },
        );
        self.generation += 1;
    }

    /// A PodGroup is gone.
    pub fn delete_group(&mut self, key: &str) {
        self.groups.remove(key);
        self.cache.dirty.groups = true;
        self.observed.groups.remove(key);
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup was added or changed.
    pub fn upsert_sp_group(&mut self, g: &SpPodGroup) {
        let k = key(g.metadata.namespace.as_ref(), g.metadata.name.as_ref());
        self.sp_groups
            .insert(k, translate::sp_group(g).map_err(|e| e.to_string()));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup that could not be decoded.
    pub fn invalid_sp_group(&mut self, key: &str, error: String) {
        self.sp_groups.insert(key.to_string(), Err(error));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup is gone.
    pub fn delete_sp_group(&mut self, key: &str) {
        self.sp_groups.remove(key);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A JobSet or LeaderWorkerSet was added or changed (`key`:
    /// `namespace/name`; an `Err` names what is wrong with it: its pods
    /// wait, and the problem is reported).
    pub fn upsert_workload(&mut self, kind: WorkloadKind, key: &str, w: Result<Workload, String>) {
        self.workloads.insert((kind, key.to_string()), w);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A PodDisruptionBudget was added or changed.
    pub fn upsert_pdb(&mut self, p: &k8s_openapi::api::policy::v1::PodDisruptionBudget) {
        let k = key(p.metadata.namespace.as_ref(), p.metadata.name.as_ref());
        self.pdbs.insert(k, translate::pdb(p));
        self.generation += 1;
    }

    /// Pods (by uid) whose PodDisruptionBudget allows no disruption now.
    fn budget_exhausted(&self) -> BTreeSet<&str> {
        let mut out = BTreeSet::new();
        for pdb in self.pdbs.values() {
            let Some(sel) = &pdb.selector else { continue };
            let covered: Vec<&PodView> = self
                .pods
                .values()
                .filter(|v| {
                    v.namespace == pdb.namespace
                        && matches!(
                            v.kind,
                            PodKind::Bound {
                                terminating: false,
                                ..
                            }
                        )
                        && translate::selects(sel, &v.labels)
                })
                .collect();
            let healthy = covered.iter().filter(|v| v.running).count() as u32;
            if pdb.allowed(covered.len() as u32, healthy) <= 0 {
                out.extend(covered.iter().map(|v| v.uid.as_str()));
            }
        }
        out
    }

    /// A PriorityClass was added or changed.
    pub fn upsert_priority_class(&mut self, pc: &PriorityClass) {
        let name = pc.metadata.name.clone().unwrap_or_default();
        self.priority_classes.insert(name, pc.value.unwrap_or(0));
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// A PriorityClass is gone.
    pub fn delete_priority_class(&mut self, name: &str) {
        self.priority_classes.remove(name);
        self.cache.dirty.groups = true;
        self.generation += 1;
    }

    /// Remembers a placement being bound: it counts as held until the API
    /// confirms or refuses it.
    pub fn assume(&mut self, uid: &str, a: Assumed) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.cache.dirty.pods.insert(uid.to_string());
        self.assumed_at.insert(uid.to_string(), now);
        self.assumed.insert(uid.to_string(), a);
        self.generation += 1;
    }

    /// Remembers an eviction being carried out: the pod counts as
    /// terminating (still holding, never a victim again) until the API shows
    /// it terminating or gone.
    pub fn assume_evicted(&mut self, uid: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        self.evicting.insert(uid.to_string());
        self.generation += 1;
    }

    /// The eviction failed: the pod runs on.
    pub fn forget_eviction(&mut self, uid: &str) {
        if self.evicting.remove(uid) {
            self.cache.dirty.pods.insert(uid.to_string());
            self.generation += 1;
        }
    }

    /// Remembers a nomination until the pod's status shows it (or the pod
    /// stops pending), so the next cycle sees it at once.
    pub fn nominate(&mut self, uid: &str, node: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        self.nominated.insert(uid.to_string(), node.to_string());
    }

    /// Reserves for `gang`, whose ProvisioningRequest (made at `since_ms`)
    /// is provisioned, the `nodes` that came for it, and from now on every
    /// node that registers ([`crate::provreq::Reservations`]): its pending
    /// `members` (uids) are nominated to them. Returns whether anything
    /// changed.
    pub fn reserve_provisioned(
        &mut self,
        gang: &str,
        since_ms: u64,
        members: Vec<String>,
        nodes: &[String],
    ) -> bool {
        let noms = self.provisioned.reserve(gang, since_ms, members, nodes);
        let changed = !noms.is_empty();
        for (uid, node) in noms {
            self.cache.dirty.pods.insert(uid.clone());
            self.nominated.insert(uid, node);
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Ends the reservations of gangs not in `keep` (their nominations
    /// go). Returns whether anything changed.
    pub fn retain_provisioned(&mut self, keep: &BTreeSet<String>) -> bool {
        let uids = self.provisioned.retain(keep);
        let changed = !uids.is_empty();
        for uid in uids {
            self.nominated.remove(&uid);
            self.cache.dirty.pods.insert(uid);
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Replaces the notes of gangs waiting for a ProvisioningRequest.
    /// Returns whether they changed.
    pub fn set_provisioning_notes(&mut self, notes: BTreeMap<String, String>) -> bool {
        if self.provisioning_notes == notes {
            return false;
        }
        self.provisioning_notes = notes;
        self.generation += 1;
        true
    }

    /// The notes of gangs waiting for a ProvisioningRequest, by group name.
    pub fn provisioning_notes(&self) -> &BTreeMap<String, String> {
        &self.provisioning_notes
    }

    /// A ResourceClaim was added or changed.
    pub fn upsert_claim(&mut self, c: &k8s_openapi::api::resource::v1::ResourceClaim) {
        self.dra.upsert_claim(c);
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A ResourceSlice was added or changed.
    pub fn upsert_slice(&mut self, s: &k8s_openapi::api::resource::v1::ResourceSlice) {
        // its GPUs are its node's GPUs in the core (before and after)
        let name = s.metadata.name.clone().unwrap_or_default();
        self.cache.dirty.nodes.extend(self.dra.slice_node(&name));
        self.dra.upsert_slice(s);
        self.cache.dirty.nodes.extend(self.dra.slice_node(&name));
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A DeviceClass was added or changed.
    pub fn upsert_device_class(&mut self, c: &k8s_openapi::api::resource::v1::DeviceClass) {
        self.dra.upsert_class(c);
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A DeviceTaintRule was added or changed.
    pub fn upsert_device_taint_rule(
        &mut self,
        r: &k8s_openapi::api::resource::v1::DeviceTaintRule,
    ) {
        self.dra.upsert_taint_rule(r);
        self.cache.dirty.nodes.extend(self.dra.slice_nodes());
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// The DRA objects.
    pub fn dra(&self) -> &crate::dra::state::DraState {
        &self.dra
    }

    /// Allocates the ResourceClaims of pending pod `uid` on `node` (where
    /// the core placed it), holding the devices until the claims show the
    /// allocation or [`World::forget`] drops it: what to write to each
    /// claim before the Binding (empty: the pod has no claims).
    pub fn allocate_claims(
        &mut self,
        uid: &str,
        node: &str,
    ) -> Result<Vec<crate::dra::state::ClaimWrite>, String> {
        self.allocate_claims_at(uid, node, &[])
    }

    /// [`World::allocate_claims`], giving the claims the GPUs the core
    /// chose (positions on the node) when they allow them
    /// ([`crate::dra::state::DraState::allocate`]).
    pub fn allocate_claims_at(
        &mut self,
        uid: &str,
        node: &str,
        core_gpus: &[u32],
    ) -> Result<Vec<crate::dra::state::ClaimWrite>, String> {
        let Some(v) = self.pods.get(uid) else {
            return Ok(Vec::new());
        };
        // KEP-5004: extended resources a DeviceClass maps and the node does
        // not serve itself get a special claim, unless it has one
        let special = self.extended_requests(uid, node)?;
        if v.claims.is_empty() && special.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, claims) = (v.namespace.clone(), v.claims.clone());
        let mut r = if claims.is_empty() {
            Ok(Vec::new())
        } else {
            self.dra.allocate(uid, &ns, &claims, node, core_gpus)
        };
        if !special.is_empty()
            && let Ok(writes) = &mut r
        {
            match self
                .dra
                .allocate_extended(uid, &ns, &special, node, core_gpus)
            {
                Ok(w) => writes.push(w),
                Err(e) => {
                    self.dra.forget_pod(uid);
                    r = Err(e);
                }
            }
        }
        self.cache.dirty.dra = true;
        self.generation += 1;
        r
    }

    /// KEP-5004: the special claim's requests pod `uid` needs on `node`:
    /// the extended resources a DeviceClass maps that `node`'s allocatable
    /// lacks (empty: none, or its special claim exists already).
    pub fn extended_requests(
        &self,
        uid: &str,
        node: &str,
    ) -> Result<Vec<crate::dra::extended::ExtendedRequest>, String> {
        let Some(v) = self.pods.get(uid) else {
            return Ok(Vec::new());
        };
        if v.extended.is_empty() || self.dra.has_special_claim(&v.namespace, &v.claims) {
            return Ok(Vec::new());
        }
        let mapping = self.dra.class_mapping();
        if !crate::dra::extended::asks_mapped(&v.extended, &mapping) {
            return Ok(Vec::new());
        }
        let nv = self.nodes.get(node);
        let served = |name: &str| {
            nv.is_some_and(
                |nv| match gpusched_model::ResourceKind::from_resource_name(name) {
                    gpusched_model::ResourceKind::Gpu => {
                        !nv.node.gpus.is_empty() || nv.node.allocatable.gpu_milli > 0
                    }
                    gpusched_model::ResourceKind::Extended(n) => {
                        nv.node.allocatable.ext_get(&n) > 0
                    }
                    _ => true,
                },
            )
        };
        crate::dra::extended::requests(&v.extended, &mapping, served)
            .map_err(|e| format!("pod {}/{}: {e}", v.namespace, v.name))
    }

    /// Drops an assumption (the binding failed): the pod is pending again.
    pub fn forget(&mut self, uid: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        if self
            .pods
            .get(uid)
            .is_some_and(|v| !v.claims.is_empty() || !v.extended.is_empty())
        {
            self.cache.dirty.dra = true;
        }
        self.release_volumes(uid);
        self.dra.forget_pod(uid);
        self.assumed_at.remove(uid);
        if self.assumed.remove(uid).is_some() {
            self.generation += 1;
        }
    }

    /// The core's snapshot of the world as it is now — the scheduler's
    /// path. Equal to [`World::build`], but computed from what changed
    /// since the last call (`world/cache.rs`): the parts and pod entries
    /// nothing touched are reused. Debug builds compare it with a full
    /// build (every call up to [`CHECK_EVERY_SIZE`] nodes + pods, every
    /// [`CHECK_EVERY`]th above) and panic naming the first difference.
    pub fn snapshot(&mut self) -> Built {
        let mut c = std::mem::take(&mut self.cache);
        c.refresh(self);
        let built = c.assemble(self);
        self.cache = c;
        if cfg!(debug_assertions) {
            self.cache.since_check += 1;
            if self.nodes.len() + self.pods.len() <= CHECK_EVERY_SIZE
                || self.cache.since_check >= CHECK_EVERY
            {
                self.cache.since_check = 0;
                if let Some(d) = first_difference(&built, &self.build()) {
                    panic!("the incremental snapshot differs from a full build: {d}");
                }
            }
        }
        built
    }

    /// How many pod entries the last [`World::snapshot`] recomputed (the
    /// rest were reused).
    pub fn last_snapshot_work(&self) -> usize {
        self.cache.last_work
    }

    /// Number of assumed placements not yet confirmed.
    pub fn assumed_len(&self) -> usize {
        self.assumed.len()
    }

    /// A pod by uid.
    pub fn pod(&self, uid: &str) -> Option<&PodView> {
        self.pods.get(uid)
    }

    /// All pods, by uid.
    pub fn pods(&self) -> impl Iterator<Item = &PodView> {
        self.pods.values()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeView> {
        self.nodes.get(name)
    }

    /// Number of nodes known.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    // -- status as the watches last showed it (for the status writer,
    // crate::exec::status) --

    /// The `status` of every Queue and gpusched PodGroup that exists, as
    /// the watches last showed it.
    pub fn observed_status(&self) -> &ObservedStatus {
        &self.observed
    }

    /// Per gpusched PodGroup (`namespace/name`): members bound (or being
    /// bound) and members running.
    pub fn group_counts(&self) -> BTreeMap<String, (u32, u32)> {
        let mut out: BTreeMap<String, (u32, u32)> =
            self.groups.keys().map(|k| (k.clone(), (0, 0))).collect();
        for v in self.pods.values() {
            let Some(g) = self.group_of(v) else { continue };
            let Some(c) = out.get_mut(&g) else { continue };
            let bound =
                matches!(v.kind, PodKind::Bound { .. }) || self.assumed.contains_key(&v.uid);
            if bound {
                c.0 += 1;
            }
            if v.running {
                c.1 += 1;
            }
        }
        out
    }

    /// The group of a pod: its label's, else the PodGroup made for its
    /// Job, else its JobSet's or LeaderWorkerSet's gang.
    fn group_of(&self, v: &PodView) -> Option<String> {
        if v.group.is_some() {
            return v.group.clone();
        }
        if let Some(job) = &v.job {
            let k = format!("{}/{job}", v.namespace);
            if self.groups.get(&k).is_some_and(|e| e.for_job) {
                return Some(k);
            }
        }
        self.workload_group(v).map(|g| g.0)
    }

    /// The workload a pod belongs to (JobSet, LeaderWorkerSet, upstream
    /// PodGroup) and what is known of it (`None`: not seen yet, or
    /// unusable).
    fn workload_of(&self, v: &PodView) -> Option<(workloads::Member, Option<&Workload>)> {
        let m = match self.scheduling_groups.get(&v.uid) {
            Some(m) => m.clone(),
            None => workloads::member(&v.labels)?,
        };
        let w = self
            .workloads
            .get(&(m.kind, format!("{}/{}", v.namespace, m.workload)))
            .and_then(|w| w.as_ref().ok());
        Some((m, w))
    }

    /// The workload gang of a pod: its name, its size and the workload's
    /// queue label (`None` size: the workload is not known, or cannot be
    /// used; the pod waits for its group). `None`: no gang.
    fn workload_group(&self, v: &PodView) -> Option<(String, Option<u32>, Option<&str>)> {
        let (m, w) = self.workload_of(v)?;
        let (name, min) = workloads::group_of(&v.namespace, &m, w)?;
        Some((name, min, w.and_then(|w| w.queue.as_deref())))
    }

    /// The queue label that applies to a pod: its own, else its
    /// workload's (ganged or not).
    fn queue_label<'a>(&'a self, v: &'a PodView) -> Option<&'a str> {
        v.queue_label.as_deref().or_else(|| {
            self.workload_of(v)
                .and_then(|(_, w)| w)
                .and_then(|w| w.queue.as_deref())
        })
    }

    /// The queue a pod is counted in while pending.
    fn queue_name(&self, v: &PodView) -> String {
        self.queue_label(v).unwrap_or(DEFAULT_QUEUE).to_string()
    }

    /// The GPUs the node's agent reports it served to pod `uid`, as
    /// positions on `nv` (`None`: not reported, or naming GPUs the node does
    /// not have).
    fn served(&self, node: &str, uid: &str, nv: &gpusched_model::Node) -> Option<GpuAssignment> {
        let a = self.nodes.get(node)?.allocations.get(uid)?;
        let mut pos = Vec::with_capacity(a.gpus.len());
        for u in &a.gpus {
            let p = nv.gpus.iter().position(|g| &g.uuid == u)? as u32;
            if pos.contains(&p) {
                return None;
            }
            pos.push(p);
        }
        if !a.mig.is_empty() {
            // MIG instances: the positions of the ids on their one GPU
            let [gpu] = pos[..] else {
                return None;
            };
            let slots = &nv.gpus[gpu as usize].mig;
            let mut instances = Vec::with_capacity(a.mig.len());
            for id in &a.mig {
                let i = slots.iter().position(|m| &m.id == id)? as u32;
                if instances.contains(&i) {
                    return None;
                }
                instances.push(i);
            }
            instances.sort_unstable();
            let milli = instances.iter().map(|&i| slots[i as usize].milli).sum();
            return Some(GpuAssignment::Mig {
                gpu,
                instances,
                milli,
            });
        }
        match (a.milli, pos.as_slice()) {
            (Some(milli), [gpu]) => Some(GpuAssignment::Share {
                gpu: *gpu,
                milli,
                memory_mib: 0,
            }),
            (Some(_), _) | (None, []) => None,
            (None, _) => {
                pos.sort_unstable();
                Some(GpuAssignment::Whole(pos))
            }
        }
    }
}

fn workload_kind(k: ObjectKind) -> Option<WorkloadKind> {
    match k {
        ObjectKind::JobSet => Some(WorkloadKind::JobSet),
        ObjectKind::LeaderWorkerSet => Some(WorkloadKind::LeaderWorkerSet),
        ObjectKind::UpstreamPodGroup => Some(WorkloadKind::PodGroup),
        ObjectKind::RayCluster => Some(WorkloadKind::RayCluster),
        ObjectKind::PyTorchJob => Some(WorkloadKind::PyTorchJob),
        ObjectKind::TfJob => Some(WorkloadKind::TfJob),
        ObjectKind::MpiJob => Some(WorkloadKind::MpiJob),
        ObjectKind::MpiJobV1 => Some(WorkloadKind::MpiJobV1),
        _ => None,
    }
}

impl World {
    /// A pod without a queue label is charged to its workload's queue.
    fn inherit_queue(&self, v: &PodView, pod: &mut gpusched_model::Pod) {
        if v.queue_label.is_none()
            && let Some(q) = self.queue_label(v)
        {
            pod.queue = q.to_string();
        }
    }
}

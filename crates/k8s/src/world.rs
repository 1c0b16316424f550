//! The scheduler's picture of the cluster: translated objects kept by key
//! and updated one watch event at a time, plus the placements it assumed but
//! the API has not confirmed yet. [`World::build`] assembles the core's
//! [`Snapshot`] from it, deterministically (ordered maps, stable sorts).
//!
//! Here: the types, nodes and pods. The other kinds of object each have a
//! file (`storage`, `groups`, `dra`), as do the placements in flight
//! (`assume`), what a pod belongs to (`lookup`), the from-scratch build by
//! part (`build/`: nodes and head, `entry` per pod, `assemble`) and the
//! incremental snapshot (`cache`).

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::decision::{DecisionError, GpuDecision};
use crate::translate::{self, DEFAULT_QUEUE, NodeView, PodKind, PodView};
use crate::volumes::{PodClaim, Reservation, VolumeWrite, Volumes};
use crate::workloads::{self, Workload, WorkloadKind};
use gpusched_core::fairshare::QueueTree;
use gpusched_core::report::classify::PendingClass;
use gpusched_core::{GpuAssignment, NodeId, PodPhase, PodState, Snapshot};
use gpusched_model::{GpuRequest, PodGroup as MGroup, Queue as MQueue};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use k8s_openapi::api::storage::v1::StorageClass;
use std::collections::{BTreeMap, BTreeSet};

mod assume;
mod build;
mod cache;
mod dra;
mod groups;
mod lookup;
mod storage;

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
    /// `batch/v1` Jobs labelled `gpusched.io/gang` (by `namespace/name`):
    /// the leader makes a PodGroup for each `"true"` one; the world keeps
    /// each one's value, so the pods of a Job whose value is not a flag
    /// wait, told why.
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
    /// A pod of ours names a `gpusched.io/` label or annotation key
    /// gpusched does not know (a typo ignored in silence otherwise).
    PodKeyWarning {
        /// The pod.
        pod: PodRef,
        /// The key and the nearest known one.
        warning: String,
    },
    /// A node's objects had unreadable parts.
    NodeWarning {
        /// Node name.
        node: String,
        /// What.
        warning: String,
    },
}

impl Problem {
    /// The pending pod this problem keeps out of the core (invalid, gated,
    /// claims pending): its explanation is the problem's.
    pub fn pending_pod(&self) -> Option<&PodRef> {
        match self {
            Problem::InvalidPod { pod, .. }
            | Problem::GatedPod { pod, .. }
            | Problem::ClaimsPending { pod, .. } => Some(pod),
            _ => None,
        }
    }
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
    /// The uid of each gpusched PodGroup (what its events' `regarding`
    /// names, so `kubectl describe podgroup` finds them).
    pub group_uids: BTreeMap<String, String>,
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
    /// `batch/v1` Jobs labelled `gpusched.io/gang`, by `namespace/name`:
    /// the value read (`Err`: not a flag, naming the Job, the key, the
    /// value and the values accepted).
    gang_jobs: BTreeMap<String, Result<bool, String>>,
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
    /// The scheduler's own nominations (by uid) until the pod's status
    /// shows the same node; preferred over `status.nominatedNodeName`,
    /// which anyone who may write pod status can set.
    nominated: BTreeMap<String, String>,
    /// When this scheduler first saw each pod bound (Unix ms, by uid): its
    /// own bind time for pods it bound, else when the pod first came in
    /// bound. A pod's start is never later than this, whatever its
    /// `PodScheduled` condition says (that is anyone's with pods/status: a
    /// time in the future would keep it "younger than its minimum runtime"
    /// for ever, immune to preemption and reclaim; issue 38).
    bound_seen: BTreeMap<String, u64>,
    /// When each pod's current nomination (own or from its status) was
    /// first seen (Unix ms), by uid: the core holds a nominated node for a
    /// bounded time from it (`SchedulerOptions::max_nomination_ms`).
    nominated_at: BTreeMap<String, (String, u64)>,
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
            self.note_nominated(&uid, &node);
            self.nominated.insert(uid, node);
        }
        // devices of slices with a node selector follow the labels
        if self.dra.set_node_labels(&v.node.name, Some(&v.node.labels)) {
            self.cache.dirty.dra = true;
        }
        self.nodes.insert(v.node.name.clone(), v);
        self.generation += 1;
    }

    /// Remembers when pod `uid`'s nomination to `node` was first seen (now,
    /// unless it was already nominated there).
    pub(crate) fn note_nominated(&mut self, uid: &str, node: &str) {
        if self.nominated_at.get(uid).is_some_and(|(n, _)| n == node) {
            return;
        }
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.nominated_at
            .insert(uid.to_string(), (node.to_string(), now));
    }

    /// When pod `v` started, for the core (`PodPhase::Running::since_ms`):
    /// its `PodScheduled` time (else its start or creation), but never
    /// later than when this scheduler first saw it bound.
    pub(crate) fn bound_since(&self, v: &PodView) -> u64 {
        match self.bound_seen.get(&v.uid) {
            Some(&seen) => v.bound_ms.min(seen),
            None => v.bound_ms,
        }
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
        if self.dra.set_node_labels(name, None) {
            self.cache.dirty.dra = true;
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
        if matches!(v.kind, PodKind::Bound { .. } | PodKind::Finished { .. })
            && !self.bound_seen.contains_key(&v.uid)
        {
            let at = self.assumed_at.get(&v.uid).copied().unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64)
            });
            self.bound_seen.insert(v.uid.clone(), at);
        }
        match &v.kind {
            PodKind::Pending { nominated, .. } => {
                // the status shows the scheduler's own nomination: it is
                // persisted; a different one (anyone with pods/status may
                // write it) does not replace the scheduler's own
                if nominated.is_some() && self.nominated.get(&v.uid) == nominated.as_ref() {
                    self.nominated.remove(&v.uid);
                }
                match self.nominated.get(&v.uid).or(nominated.as_ref()).cloned() {
                    Some(n) => self.note_nominated(&v.uid, &n),
                    None => {
                        self.nominated_at.remove(&v.uid);
                    }
                }
            }
            PodKind::Bound {
                terminating: false, ..
            } => {
                self.assumed.remove(&v.uid);
                self.assumed_at.remove(&v.uid);
                self.nominated.remove(&v.uid);
                self.nominated_at.remove(&v.uid);
                self.release_volumes(&v.uid);
            }
            _ => {
                self.release_volumes(&v.uid);
                self.assumed.remove(&v.uid);
                self.assumed_at.remove(&v.uid);
                self.nominated.remove(&v.uid);
                self.nominated_at.remove(&v.uid);
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
        self.release_holds(uid);
        self.pod_claims.remove(uid);
        self.scheduling_groups.remove(uid);
        self.succeeded.remove(uid);
        self.decisions.remove(uid);
        self.tampered.remove(uid);
        self.pods.remove(uid);
        self.assumed.remove(uid);
        self.assumed_at.remove(uid);
        self.nominated.remove(uid);
        self.nominated_at.remove(uid);
        self.bound_seen.remove(uid);
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
            ObjectKind::Job => self.gang_jobs.keys().cloned().collect(),
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
            ObjectKind::Job => self.delete_gang_job(key),
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
                        for n in self.dra.slice_node(key) {
                            self.cache.dirty.nodes.insert(n);
                        }
                        self.dra.delete_slice(key);
                    }
                    ObjectKind::DeviceClass => {
                        if self.dra.delete_class(key) {
                            self.cache.dirty.nodes.extend(self.dra.slice_nodes());
                        }
                    }
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

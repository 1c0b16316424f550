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
    /// DRA ResourceClaims (by `namespace/name`).
    ResourceClaim,
    /// DRA ResourceSlices (by name).
    ResourceSlice,
    /// DRA DeviceClasses (by name).
    DeviceClass,
    /// DRA DeviceTaintRules (by name).
    DeviceTaintRule,
}

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
}

fn key(ns: Option<&String>, name: Option<&String>) -> String {
    format!(
        "{}/{}",
        ns.map(String::as_str).unwrap_or_default(),
        name.map(String::as_str).unwrap_or_default()
    )
}

impl World {
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
        // a node that came for a provisioned request is its gang's from
        // its first appearance
        if !self.nodes.contains_key(&v.node.name)
            && let Some(created) = n.metadata.creation_timestamp.as_ref()
            && let Some((uid, node)) = self
                .provisioned
                .on_new_node(&v.node.name, created.0.as_millisecond().max(0) as u64)
        {
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
        self.nodes.remove(name);
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
                self.generation += 1;
            }
            ObjectKind::Pvc => {
                self.volumes.claims.remove(key);
                self.generation += 1;
            }
            ObjectKind::Pv => {
                self.volumes.volumes.remove(key);
                self.generation += 1;
            }
            ObjectKind::StorageClass => {
                self.volumes.classes.remove(key);
                self.generation += 1;
            }
            ObjectKind::ResourceClaim => {
                self.dra.delete_claim(key);
                self.generation += 1;
            }
            ObjectKind::ResourceSlice => {
                self.dra.delete_slice(key);
                self.generation += 1;
            }
            ObjectKind::DeviceClass => {
                self.dra.delete_class(key);
                self.generation += 1;
            }
            ObjectKind::DeviceTaintRule => {
                self.dra.delete_taint_rule(key);
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
        self.generation += 1;
    }

    /// A PersistentVolume was added or changed.
    pub fn upsert_pv(&mut self, v: &PersistentVolume) {
        let k = v.metadata.name.clone().unwrap_or_default();
        self.volumes.volumes.insert(k, v.clone());
        self.generation += 1;
    }

    /// A StorageClass was added or changed.
    pub fn upsert_storage_class(&mut self, c: &StorageClass) {
        let k = c.metadata.name.clone().unwrap_or_default();
        self.volumes.classes.insert(k, c.clone());
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
        self.generation += 1;
    }

    /// A Queue that could not be decoded (`error` names the field): kept as
    /// invalid, so it is reported with `Valid=False` and its pods are told
    /// why, while every other queue works.
    pub fn invalid_queue(&mut self, name: &str, error: String) {
        self.queues.insert(name.to_string(), Err(error));
        self.observed.queues.entry(name.to_string()).or_insert(None);
        self.generation += 1;
    }

    /// A Queue is gone.
    pub fn delete_queue(&mut self, name: &str) {
        self.queues.remove(name);
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
        self.observed.groups.remove(key);
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup was added or changed.
    pub fn upsert_sp_group(&mut self, g: &SpPodGroup) {
        let k = key(g.metadata.namespace.as_ref(), g.metadata.name.as_ref());
        self.sp_groups
            .insert(k, translate::sp_group(g).map_err(|e| e.to_string()));
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup that could not be decoded.
    pub fn invalid_sp_group(&mut self, key: &str, error: String) {
        self.sp_groups.insert(key.to_string(), Err(error));
        self.generation += 1;
    }

    /// A scheduler-plugins PodGroup is gone.
    pub fn delete_sp_group(&mut self, key: &str) {
        self.sp_groups.remove(key);
        self.generation += 1;
    }

    /// A JobSet or LeaderWorkerSet was added or changed (`key`:
    /// `namespace/name`; an `Err` names what is wrong with it: its pods
    /// wait, and the problem is reported).
    pub fn upsert_workload(&mut self, kind: WorkloadKind, key: &str, w: Result<Workload, String>) {
        self.workloads.insert((kind, key.to_string()), w);
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
        self.generation += 1;
    }

    /// A PriorityClass is gone.
    pub fn delete_priority_class(&mut self, name: &str) {
        self.priority_classes.remove(name);
        self.generation += 1;
    }

    /// Remembers a placement being bound: it counts as held until the API
    /// confirms or refuses it.
    pub fn assume(&mut self, uid: &str, a: Assumed) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.assumed_at.insert(uid.to_string(), now);
        self.assumed.insert(uid.to_string(), a);
        self.generation += 1;
    }

    /// Remembers an eviction being carried out: the pod counts as
    /// terminating (still holding, never a victim again) until the API shows
    /// it terminating or gone.
    pub fn assume_evicted(&mut self, uid: &str) {
        self.evicting.insert(uid.to_string());
        self.generation += 1;
    }

    /// The eviction failed: the pod runs on.
    pub fn forget_eviction(&mut self, uid: &str) {
        if self.evicting.remove(uid) {
            self.generation += 1;
        }
    }

    /// Remembers a nomination until the pod's status shows it (or the pod
    /// stops pending), so the next cycle sees it at once.
    pub fn nominate(&mut self, uid: &str, node: &str) {
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
        self.generation += 1;
    }

    /// A ResourceSlice was added or changed.
    pub fn upsert_slice(&mut self, s: &k8s_openapi::api::resource::v1::ResourceSlice) {
        self.dra.upsert_slice(s);
        self.generation += 1;
    }

    /// A DeviceClass was added or changed.
    pub fn upsert_device_class(&mut self, c: &k8s_openapi::api::resource::v1::DeviceClass) {
        self.dra.upsert_class(c);
        self.generation += 1;
    }

    /// A DeviceTaintRule was added or changed.
    pub fn upsert_device_taint_rule(
        &mut self,
        r: &k8s_openapi::api::resource::v1::DeviceTaintRule,
    ) {
        self.dra.upsert_taint_rule(r);
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
        let Some(v) = self.pods.get(uid) else {
            return Ok(Vec::new());
        };
        if v.claims.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, claims) = (v.namespace.clone(), v.claims.clone());
        let r = self.dra.allocate(uid, &ns, &claims, node);
        self.generation += 1;
        r
    }

    /// Drops an assumption (the binding failed): the pod is pending again.
    pub fn forget(&mut self, uid: &str) {
        self.release_volumes(uid);
        self.dra.forget_pod(uid);
        self.assumed_at.remove(uid);
        if self.assumed.remove(uid).is_some() {
            self.generation += 1;
        }
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

    /// The core's snapshot of the world as it is now.
    pub fn build(&self) -> Built {
        let mut out = Built::default();
        let mut node_ids: BTreeMap<&str, NodeId> = BTreeMap::new();
        for (i, (name, v)) in self.nodes.iter().enumerate() {
            node_ids.insert(name.as_str(), i as NodeId);
            out.snapshot.nodes.push(v.node.clone());
            for w in &v.warnings {
                out.problems.push(Problem::NodeWarning {
                    node: name.clone(),
                    warning: w.clone(),
                });
            }
        }
        // what a request for a time-sliced resource means (crate::sharing)
        let sharing = {
            let ins: Vec<crate::sharing::NodeIn<'_>> = self
                .nodes
                .iter()
                .map(|(name, v)| crate::sharing::NodeIn {
                    name,
                    sharing: v.sharing.as_ref(),
                    has_gpus: !v.node.gpus.is_empty(),
                })
                .collect();
            crate::sharing::table(&ins)
        };
        for &i in &sharing.withheld {
            let n = &mut out.snapshot.nodes[i];
            for g in &mut n.gpus {
                if g.is_healthy() {
                    g.health = gpusched_model::GpuHealth::NotAllocatable;
                }
            }
            n.sync_gpu_allocatable();
        }
        for (i, w) in &sharing.warnings {
            out.problems.push(Problem::NodeWarning {
                node: out.snapshot.nodes[*i].name.clone(),
                warning: w.clone(),
            });
        }
        // queues: the valid ones, plus an implicit default queue
        for (name, q) in &self.queues {
            match q {
                Ok(q) => out.snapshot.queues.push(q.clone()),
                Err(e) => out.problems.push(Problem::InvalidQueue {
                    queue: name.clone(),
                    error: e.clone(),
                }),
            }
        }
        if !self.queues.contains_key(DEFAULT_QUEUE) {
            out.snapshot.queues.push(MQueue::new(DEFAULT_QUEUE));
        }
        let (_, queue_problems) = QueueTree::build(&out.snapshot.queues);
        for p in queue_problems {
            out.problems.push(Problem::InvalidQueue {
                queue: p.queue().to_string(),
                error: p.to_string(),
            });
        }
        // the queue of a group defaults to its first member's label
        let mut member_queue: BTreeMap<String, &str> = BTreeMap::new();
        for v in self.pods.values() {
            if let (Some(g), Some(q)) = (self.group_of(v), self.queue_label(v)) {
                member_queue.entry(g).or_insert(q);
            }
        }
        let mut group_names: BTreeSet<&str> = BTreeSet::new();
        for (k, e) in &self.groups {
            match &e.group {
                Ok(g) => {
                    let mut g = g.clone();
                    g.priority = e
                        .priority_class
                        .as_ref()
                        .and_then(|pc| self.priority_classes.get(pc).copied())
                        .unwrap_or(0);
                    if let (Some(q), true) = (member_queue.get(k), g.queue == DEFAULT_QUEUE) {
                        g.queue = q.to_string();
                    }
                    group_names.insert(k.as_str());
                    out.snapshot.groups.push(g);
                }
                Err(e) => out.problems.push(Problem::InvalidGroup {
                    group: k.clone(),
                    error: e.clone(),
                }),
            }
        }
        for (k, g) in &self.sp_groups {
            if group_names.contains(k.as_str()) {
                continue;
            }
            match g {
                Ok(g) => {
                    let mut g = g.clone();
                    if let Some(q) = member_queue.get(k) {
                        g.queue = q.to_string();
                    }
                    out.snapshot.groups.push(g);
                }
                Err(e) => out.problems.push(Problem::InvalidGroup {
                    group: k.clone(),
                    error: e.clone(),
                }),
            }
        }
        self.workload_groups(&mut out, &member_queue, &group_names);
        out.snapshot.groups.sort_by(|a, b| a.name.cmp(&b.name));

        // pods, in creation order (then name) for determinism
        let mut views: Vec<&PodView> = self.pods.values().collect();
        views.sort_by(|a, b| {
            (a.created_ms, &a.namespace, &a.name).cmp(&(b.created_ms, &b.namespace, &b.name))
        });
        let pref = |v: &PodView| PodRef {
            uid: v.uid.clone(),
            namespace: v.namespace.clone(),
            name: v.name.clone(),
        };
        let exhausted = self.budget_exhausted();
        // DRA: the devices per node and those held, once per build
        let dra_nodes: Vec<&str> = self.nodes.keys().map(String::as_str).collect();
        let dra_devices = self.dra.devices_by_node();
        let dra_in_use = self.dra.in_use();
        let mut dra_memo = BTreeMap::new();
        for w in self.dra.warnings() {
            out.problems.push(Problem::NodeWarning {
                node: "(resourceslices)".into(),
                warning: w.clone(),
            });
        }
        // GPUs taken per node by pods whose GPUs are known
        let mut taken: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); out.snapshot.nodes.len()];
        let mut shared: Vec<BTreeMap<u32, u64>> = vec![BTreeMap::new(); out.snapshot.nodes.len()];
        let mut undecided: Vec<(usize, NodeId)> = Vec::new();
        // bound whole-GPU pods: (index, node, listed by the agent, decided GPUs)
        let mut whole_bound: Vec<(usize, NodeId, bool, Vec<u32>)> = Vec::new();
        for v in views {
            match &v.kind {
                PodKind::Ignored => {}
                PodKind::Gated { gates } => {
                    *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                    *out.unseen_by_queue
                        .entry(self.queue_name(v))
                        .or_default()
                        .entry(PendingClass::Gated)
                        .or_default() += 1;
                    out.problems.push(Problem::GatedPod {
                        pod: pref(v),
                        gates: gates.clone(),
                    });
                }
                PodKind::Invalid { error } => {
                    *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                    *out.unseen_by_queue
                        .entry(self.queue_name(v))
                        .or_default()
                        .entry(PendingClass::InvalidSpec)
                        .or_default() += 1;
                    out.problems.push(Problem::InvalidPod {
                        pod: pref(v),
                        error: error.clone(),
                    });
                }
                PodKind::Pending { pod, nominated } => {
                    let mut pod = pod.clone();
                    let replicas = match crate::sharing::resolve(&mut pod, &sharing) {
                        Ok(r) => r,
                        Err(why) => {
                            *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                            *out.unseen_by_queue
                                .entry(self.queue_name(v))
                                .or_default()
                                .entry(PendingClass::InvalidSpec)
                                .or_default() += 1;
                            out.problems.push(Problem::InvalidPod {
                                pod: pref(v),
                                error: format!("pod {}/{}: {why}", v.namespace, v.name),
                            });
                            continue;
                        }
                    };
                    let pod = &pod;
                    // a queue that exists but cannot be used: the pod is
                    // told which and why (not that it does not exist)
                    let group = self.group_of(v);
                    let queue = group
                        .as_ref()
                        .and_then(|g| {
                            out.snapshot
                                .groups
                                .binary_search_by(|x| x.name.as_str().cmp(g))
                                .ok()
                        })
                        .map_or(pod.queue.as_str(), |i| {
                            out.snapshot.groups[i].queue.as_str()
                        });
                    if !self.assumed.contains_key(&v.uid)
                        && let Some(Err(why)) = self.queues.get(queue)
                    {
                        *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                        out.problems.push(Problem::InvalidPod {
                            pod: pref(v),
                            error: format!(
                                "queue {queue:?} is invalid (Valid=False), so its pods wait: {why}"
                            ),
                        });
                        continue;
                    }
                    // DRA: its claims must exist and be allocatable
                    // somewhere; the core picks among those nodes
                    let mut claim_nodes = None;
                    if !v.claims.is_empty() && !self.assumed.contains_key(&v.uid) {
                        use crate::dra::state::PodClaims;
                        let (class, message) = match self.dra.pod_claims(
                            &v.namespace,
                            &v.claims,
                            &dra_nodes,
                            &dra_devices,
                            &dra_in_use,
                            &mut dra_memo,
                        ) {
                            PodClaims::None => (None, String::new()),
                            PodClaims::Waiting(m) => (Some(PendingClass::WaitingForClaim), m),
                            PodClaims::Unallocatable(m) => {
                                (Some(PendingClass::UnallocatableClaim), m)
                            }
                            PodClaims::Nodes(n) => {
                                claim_nodes = Some(n);
                                (None, String::new())
                            }
                        };
                        if let Some(class) = class {
                            *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                            *out.unseen_by_queue
                                .entry(self.queue_name(v))
                                .or_default()
                                .entry(class)
                                .or_default() += 1;
                            out.problems.push(Problem::ClaimsPending {
                                pod: pref(v),
                                class,
                                message,
                            });
                            continue;
                        }
                    }
                    let phase = match self.assumed.get(&v.uid) {
                        Some(a) => match node_ids.get(a.node.as_str()) {
                            Some(&n) => {
                                mark(&mut taken[n as usize], &mut shared[n as usize], &a.gpus);
                                PodPhase::Running {
                                    node: n,
                                    gpus: a.gpus.clone(),
                                    since_ms: self
                                        .assumed_at
                                        .get(&v.uid)
                                        .copied()
                                        .unwrap_or(pod.arrival_ms),
                                }
                            }
                            None => continue,
                        },
                        None => {
                            *out.pending_by_queue.entry(self.queue_name(v)).or_default() += 1;
                            PodPhase::Pending {
                                nominated: nominated
                                    .as_ref()
                                    .or_else(|| self.nominated.get(&v.uid))
                                    .and_then(|n| node_ids.get(n.as_str()).copied()),
                            }
                        }
                    };
                    out.pods.push(pref(v));
                    let mut pod = pod.clone();
                    if let Some(claims) = self.pod_claims.get(&v.uid) {
                        let (needs, exclusive) =
                            crate::volumes::resolve(&self.volumes, &v.namespace, &v.uid, claims);
                        let c = pod.constraints_mut();
                        c.volumes = needs;
                        c.exclusive_claims = exclusive;
                    }
                    self.select_namespaces(&mut pod);
                    if let Some(n) = claim_nodes {
                        pod.constraints_mut().claim_nodes = Some(n);
                    }
                    pod.group = self.group_of(v);
                    self.inherit_queue(v, &mut pod);
                    group_queue(&out.snapshot.groups, &mut pod);
                    if let Some(r) = replicas {
                        out.replicas.insert(out.snapshot.pods.len(), r);
                    }
                    out.snapshot.pods.push(PodState { pod, phase });
                }
                PodKind::Bound {
                    pod,
                    node,
                    decision,
                    terminating,
                } => {
                    let Some(&n) = node_ids.get(node.as_str()) else {
                        continue;
                    };
                    // counted as placed: replicas as their share (a pod
                    // the table cannot resolve keeps its plain request)
                    let mut pod = pod.clone();
                    let replicas = crate::sharing::resolve(&mut pod, &sharing).ok().flatten();
                    let pod = &pod;
                    if let Some(t) = self.tampered.get(&v.uid) {
                        out.problems.push(Problem::BadDecision {
                            pod: pref(v),
                            error: t.clone(),
                        });
                    }
                    let nv = &out.snapshot.nodes[n as usize];
                    let gpus = match decision {
                        Some(Ok(d)) => match crate::decision::assignment(d, &v.uid, nv) {
                            Ok(a) if a.milli() == pod.gpu.milli() => Some(a),
                            Ok(a) => {
                                out.problems.push(Problem::BadDecision {
                                    pod: pref(v),
                                    error: format!(
                                        "the decision holds {} milli-GPU but the pod asks {}",
                                        a.milli(),
                                        pod.gpu.milli()
                                    ),
                                });
                                None
                            }
                            Err(e) => {
                                out.problems.push(Problem::BadDecision {
                                    pod: pref(v),
                                    error: e.to_string(),
                                });
                                None
                            }
                        },
                        Some(Err(e)) => {
                            out.problems.push(Problem::BadDecision {
                                pod: pref(v),
                                error: e.to_string(),
                            });
                            None
                        }
                        None => None,
                    };
                    // where the agent says the kubelet really put it wins
                    // over the decision (same size, other GPUs: the next
                    // decision must see the GPUs that are really free)
                    let decided_whole = match &gpus {
                        Some(GpuAssignment::Whole(d)) => Some(d.clone()),
                        _ => None,
                    };
                    let listed = self
                        .nodes
                        .get(node.as_str())
                        .is_some_and(|x| x.allocations.contains_key(&v.uid));
                    let gpus = match (gpus, self.served(node, &v.uid, nv)) {
                        (
                            Some(GpuAssignment::Share { memory_mib, .. }),
                            Some(GpuAssignment::Share { gpu, milli, .. }),
                        ) if u64::from(milli) == pod.gpu.milli() => Some(GpuAssignment::Share {
                            gpu,
                            milli,
                            memory_mib,
                        }),
                        (Some(GpuAssignment::Whole(_)), Some(real @ GpuAssignment::Whole(_)))
                            if real.milli() == pod.gpu.milli() =>
                        {
                            Some(real)
                        }
                        (
                            Some(GpuAssignment::Mig { .. }),
                            Some(real @ GpuAssignment::Mig { .. }),
                        ) if real.milli() == pod.gpu.milli() => Some(real),
                        (g, _) => g,
                    };
                    if let Some(d) = decided_whole {
                        whole_bound.push((out.snapshot.pods.len(), n, listed, d));
                    }
                    let gpus = match gpus {
                        Some(a) => {
                            mark(&mut taken[n as usize], &mut shared[n as usize], &a);
                            a
                        }
                        None if pod.gpu.is_none() => GpuAssignment::None,
                        None => {
                            undecided.push((out.snapshot.pods.len(), n));
                            GpuAssignment::None
                        }
                    };
                    let phase = if *terminating || self.evicting.contains(&v.uid) {
                        PodPhase::Terminating { node: n, gpus }
                    } else {
                        PodPhase::Running {
                            node: n,
                            gpus,
                            since_ms: v.bound_ms,
                        }
                    };
                    out.pods.push(pref(v));
                    let mut pod = pod.clone();
                    if let Some(r) = replicas {
                        out.replicas.insert(out.snapshot.pods.len(), r);
                    }
                    if let Some(claims) = self.pod_claims.get(&v.uid) {
                        // a running pod's ReadWriteOncePod claims keep others off them
                        let exclusive =
                            crate::volumes::exclusive(&self.volumes, &v.namespace, claims);
                        if !exclusive.is_empty() {
                            pod.constraints_mut().exclusive_claims = exclusive;
                        }
                    }
                    self.select_namespaces(&mut pod);
                    pod.disruption_budget_exhausted = exhausted.contains(v.uid.as_str());
                    pod.group = self.group_of(v);
                    self.inherit_queue(v, &mut pod);
                    group_queue(&out.snapshot.groups, &mut pod);
                    out.snapshot.pods.push(PodState { pod, phase });
                }
            }
        }
        swaps_in_progress(&mut out.snapshot.pods, &whole_bound, &mut taken);
        // Pods placed by others hold GPUs the kubelet chose; we do not know
        // which, so they get the lowest free ones (healthy first): the count
        // per node is what matters for the next placement.
        for (i, n) in undecided {
            let node = &out.snapshot.nodes[n as usize];
            let want = out.snapshot.pods[i].pod.gpu;
            let a = match (&out.snapshot.pods[i].pod.mig, want) {
                // MIG instances: the lowest free ones of its profile
                (Some(ask), _) => undecided_mig(&out.snapshot, n, ask),
                (None, want) => match want {
                    GpuRequest::Whole(k) => {
                        let mut order: Vec<u32> = (0..node.gpus.len() as u32)
                            .filter(|g| {
                                !taken[n as usize].contains(g)
                                    && !shared[n as usize].contains_key(g)
                                    && !node.gpus[*g as usize].is_mig()
                            })
                            .collect();
                        order.sort_by_key(|&g| (!node.gpus[g as usize].is_healthy(), g));
                        order.truncate(k as usize);
                        GpuAssignment::Whole(order)
                    }
                    GpuRequest::Share { milli, memory_mib } => {
                        let gpu = (0..node.gpus.len() as u32)
                            .filter(|g| {
                                !taken[n as usize].contains(g) && !node.gpus[*g as usize].is_mig()
                            })
                            .min_by_key(|g| (shared[n as usize].get(g).copied().unwrap_or(0), *g));
                        match gpu {
                            Some(gpu) => GpuAssignment::Share {
                                gpu,
                                milli,
                                memory_mib,
                            },
                            None => GpuAssignment::None,
                        }
                    }
                    GpuRequest::None => GpuAssignment::None,
                },
            };
            mark(&mut taken[n as usize], &mut shared[n as usize], &a);
            match &mut out.snapshot.pods[i].phase {
                PodPhase::Running { gpus, .. } | PodPhase::Terminating { gpus, .. } => *gpus = a,
                PodPhase::Pending { .. } => {}
            }
        }
        out
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

    /// The gangs of JobSets and LeaderWorkerSets that have pods: sized from
    /// the workload, in its queue (else its first member's), at its
    /// members' highest priority (the controllers copy the template's
    /// priority class onto each pod). A workload that cannot be used is
    /// reported; its pods wait for a group that is not there.
    fn workload_groups(
        &self,
        out: &mut Built,
        member_queue: &BTreeMap<String, &str>,
        taken: &BTreeSet<&str>,
    ) {
        let mut made: BTreeMap<String, MGroup> = BTreeMap::new();
        // members that finished: they started, so the gang needs that
        // many fewer (a failed member's replacement is not held for peers
        // that are done)
        let mut finished: BTreeMap<String, u32> = BTreeMap::new();
        for v in self.pods.values() {
            if self.succeeded.contains(&v.uid)
                && let Some((name, _, _)) = self.workload_group(v)
            {
                *finished.entry(name).or_default() += 1;
            }
        }
        for v in self.pods.values() {
            let priority = match &v.kind {
                PodKind::Pending { pod, .. } | PodKind::Bound { pod, .. } => pod.priority,
                _ => continue,
            };
            let Some((name, Some(min), queue)) = self.workload_group(v) else {
                continue;
            };
            if taken.contains(name.as_str()) || self.group_of(v).as_ref() != Some(&name) {
                continue;
            }
            let g = made.entry(name.clone()).or_insert_with(|| MGroup {
                name: name.clone(),
                queue: queue
                    .or_else(|| member_queue.get(&name).copied())
                    .unwrap_or(DEFAULT_QUEUE)
                    .to_string(),
                min_member: min
                    .saturating_sub(finished.get(&name).copied().unwrap_or(0))
                    .max(1),
                priority,
                topology: None,
                schedule_timeout_ms: None,
            });
            g.priority = g.priority.max(priority);
        }
        out.snapshot.groups.extend(made.into_values());
        for ((kind, key), w) in &self.workloads {
            if let Err(e) = w {
                out.problems.push(Problem::InvalidGroup {
                    group: format!("{} {key}", kind.api_kind()),
                    error: e.clone(),
                });
            }
        }
    }
}

/// A swap in progress (`docs/protocol.md`): pod B, listed by its agent on
/// GPUs its decision did not name, holds a GPU pod A was decided onto, and
/// A is not admitted yet (not listed). The agent will give A a GPU a listed
/// pod was decided onto but does not hold; counting A on its decision would
/// count one GPU twice and leave that one looking free, and the next
/// decision would land on it (seen on a real kubelet, issue 29). A is
/// counted there instead, as the agent will serve it (lowest such GPU no
/// pod is counted on).
fn swaps_in_progress(
    pods: &mut [PodState],
    bound: &[(usize, NodeId, bool, Vec<u32>)],
    taken: &mut [BTreeSet<u32>],
) {
    let whole = |p: &PodState| match &p.phase {
        PodPhase::Running {
            gpus: GpuAssignment::Whole(v),
            ..
        }
        | PodPhase::Terminating {
            gpus: GpuAssignment::Whole(v),
            ..
        } => v.clone(),
        _ => Vec::new(),
    };
    let nodes: BTreeSet<NodeId> = bound
        .iter()
        .filter(|(i, _, listed, d)| {
            *listed
                && whole(&pods[*i]).iter().collect::<BTreeSet<_>>()
                    != d.iter().collect::<BTreeSet<_>>()
        })
        .map(|(_, n, _, _)| *n)
        .collect();
    for n in nodes {
        let on: Vec<&(usize, NodeId, bool, Vec<u32>)> = bound.iter().filter(|b| b.1 == n).collect();
        let held_listed: BTreeSet<u32> = on
            .iter()
            .filter(|b| b.2)
            .flat_map(|b| whole(&pods[b.0]))
            .collect();
        let mut counted: BTreeSet<u32> = on.iter().flat_map(|b| whole(&pods[b.0])).collect();
        let mut spare: BTreeSet<u32> = on
            .iter()
            .filter(|b| b.2)
            .flat_map(|b| b.3.iter().copied())
            .filter(|g| !counted.contains(g))
            .collect();
        for b in on.iter().filter(|b| !b.2) {
            let mut gpus = whole(&pods[b.0]);
            let mut changed = false;
            for g in gpus.iter_mut() {
                if held_listed.contains(g)
                    && let Some(h) = spare.pop_first()
                {
                    *g = h;
                    counted.insert(h);
                    taken[n as usize].insert(h);
                    changed = true;
                }
            }
            if changed {
                gpus.sort_unstable();
                match &mut pods[b.0].phase {
                    PodPhase::Running { gpus: a, .. } | PodPhase::Terminating { gpus: a, .. } => {
                        *a = GpuAssignment::Whole(gpus)
                    }
                    PodPhase::Pending { .. } => {}
                }
            }
        }
    }
}

/// A gang member is in its group's queue (the PodGroup's `spec.queue`,
/// else its members' label): the core admits the gang there, so its usage
/// must be counted there too, not in the member's own label or `default`.
/// `groups` is sorted by name.
fn group_queue(groups: &[MGroup], pod: &mut gpusched_model::Pod) {
    if let Some(g) = pod.group.as_deref()
        && let Ok(i) = groups.binary_search_by(|x| x.name.as_str().cmp(g))
    {
        pod.queue = groups[i].queue.clone();
    }
}

/// The lowest free MIG instances of `ask` on node `n` (by GPU position,
/// healthy GPUs first) for a bound pod without a usable decision (placed by
/// another scheduler): the kubelet chose, we do not know which, and the
/// count per node is what matters for the next placement.
fn undecided_mig(
    snap: &gpusched_core::Snapshot,
    n: NodeId,
    ask: &gpusched_model::MigAsk,
) -> GpuAssignment {
    let node = &snap.nodes[n as usize];
    let mut used: BTreeSet<(u32, u32)> = BTreeSet::new();
    for p in &snap.pods {
        if let PodPhase::Running {
            node: pn,
            gpus: GpuAssignment::Mig { gpu, instances, .. },
            ..
        }
        | PodPhase::Terminating {
            node: pn,
            gpus: GpuAssignment::Mig { gpu, instances, .. },
        } = &p.phase
            && *pn == n
        {
            used.extend(instances.iter().map(|&i| (*gpu, i)));
        }
    }
    let mut order: Vec<usize> = (0..node.gpus.len()).collect();
    order.sort_by_key(|&g| (!node.gpus[g].is_healthy(), g));
    for g in order {
        let free: Vec<u32> = node.gpus[g]
            .mig
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                m.resource == ask.resource
                    && m.profile == ask.profile
                    && !used.contains(&(g as u32, *i as u32))
            })
            .map(|(i, _)| i as u32)
            .take(ask.count as usize)
            .collect();
        if free.len() == ask.count as usize {
            let milli = free
                .iter()
                .map(|&i| node.gpus[g].mig[i as usize].milli)
                .sum();
            return GpuAssignment::Mig {
                gpu: g as u32,
                instances: free,
                milli,
            };
        }
    }
    GpuAssignment::None
}

fn mark(taken: &mut BTreeSet<u32>, shared: &mut BTreeMap<u32, u64>, a: &GpuAssignment) {
    match a {
        GpuAssignment::None => {}
        GpuAssignment::Whole(v) => taken.extend(v.iter().copied()),
        GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
            *shared.entry(*gpu).or_default() += *milli as u64;
        }
    }
}

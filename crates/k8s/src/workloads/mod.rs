//! Gangs for the workload controllers people run, derived without a
//! PodGroup: JobSet (`jobset.x-k8s.io/v1alpha2`) and LeaderWorkerSet
//! (`leaderworkerset.x-k8s.io/v1`); and the upstream Workload API's
//! PodGroup (`scheduling.k8s.io/v1beta1`, Kubernetes 1.37 behind the
//! `GenericWorkload` gate), which pods name in `spec.schedulingGroup`.
//!
//! Each controller labels the pods it makes with the workload's name and
//! the part of it they belong to (JobSet: the restart attempt and the
//! replicated job; LeaderWorkerSet: the group index). The gang of a pod is
//! named from those labels and sized from the workload object, which the
//! scheduler watches (list/watch only). The groups live in memory, rebuilt
//! on every snapshot, rather than as PodGroup objects the scheduler would
//! create and own, because:
//! - the pods arrive before any object the scheduler could write, so a
//!   created PodGroup would race them; a group derived from the pods' own
//!   labels exists from the first pod on;
//! - the controllers' restart semantics become group identity for free: a
//!   JobSet restart makes pods with a new `restart-attempt` label (a fresh
//!   gang), a recreated LeaderWorkerSet group reuses its index;
//! - no writes, no leader-only task, nothing left behind to garbage-collect,
//!   and no RBAC beyond reading the two kinds.
//!
//! Pure functions only: the world calls them when it builds a snapshot.
//! The watched objects' fields are in `objects.rs`, each object's gang in
//! `gangs.rs`, and a pod's membership (from its labels) here.

use gpusched_model::labels::parse_flag;
use kube::core::ObjectMeta;
use std::collections::BTreeMap;

mod gangs;
mod objects;
pub use gangs::{jobset, kubeflow_job, leader_worker_set, ray_cluster, upstream_pod_group};
// the object types are this module's public API, as before the split
pub use objects::*;

/// Annotation on a JobSet or LeaderWorkerSet: `"false"` opts the workload
/// out of gang scheduling (its pods are placed one by one).
pub const ANNOTATION_GANG: &str = "gpusched.io/gang";

/// Label the JobSet controller puts on its pods: the JobSet's name.
pub const LABEL_JOBSET_NAME: &str = "jobset.sigs.k8s.io/jobset-name";
/// Label the JobSet controller puts on its pods: the replicated job.
pub const LABEL_JOBSET_REPLICATED_JOB: &str = "jobset.sigs.k8s.io/replicatedjob-name";
/// Label the JobSet controller puts on its pods: the JobSet's restart
/// attempt (`status.restarts` when the Job was made).
pub const LABEL_JOBSET_RESTART: &str = "jobset.sigs.k8s.io/restart-attempt";
/// Label KubeRay puts on a RayCluster's pods: the cluster's name.
pub const LABEL_RAY_CLUSTER: &str = "ray.io/cluster";
/// Label the Kubeflow training-operator and the MPI Operator put on their
/// pods: the job's name.
pub const LABEL_KUBEFLOW_JOB_NAME: &str = "training.kubeflow.org/job-name";
/// Label the Kubeflow training-operator and the MPI Operator put on their
/// pods: which controller (`pytorchjob-controller`, `tfjob-controller`,
/// `mpijob-controller` — the training-operator's v1 MPIJob — and
/// `mpi-operator`).
pub const LABEL_KUBEFLOW_OPERATOR: &str = "training.kubeflow.org/operator-name";
/// Label the LeaderWorkerSet controller puts on its pods: the set's name.
pub const LABEL_LWS_NAME: &str = "leaderworkerset.sigs.k8s.io/name";
/// Label the LeaderWorkerSet controller puts on its pods: the group index.
pub const LABEL_LWS_GROUP_INDEX: &str = "leaderworkerset.sigs.k8s.io/group-index";

/// Which controller a workload belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    /// `jobset.x-k8s.io` JobSet.
    JobSet,
    /// `leaderworkerset.x-k8s.io` LeaderWorkerSet.
    LeaderWorkerSet,
    /// The upstream `scheduling.k8s.io/v1beta1` PodGroup.
    PodGroup,
    /// KubeRay's `ray.io` RayCluster (RayJob and RayService run one).
    RayCluster,
    /// Kubeflow training-operator `kubeflow.org/v1` PyTorchJob.
    PyTorchJob,
    /// Kubeflow training-operator `kubeflow.org/v1` TFJob.
    TfJob,
    /// MPI Operator `kubeflow.org/v2beta1` MPIJob.
    MpiJob,
    /// Kubeflow training-operator `kubeflow.org/v1` MPIJob (the same
    /// resource as the MPI Operator's, in the older version: a cluster
    /// serves one or the other).
    MpiJobV1,
}

impl WorkloadKind {
    /// The prefix of its groups' names.
    fn prefix(self) -> &'static str {
        match self {
            WorkloadKind::JobSet => "jobset",
            WorkloadKind::LeaderWorkerSet => "leaderworkerset",
            WorkloadKind::PodGroup => "scheduling.k8s.io",
            WorkloadKind::RayCluster => "raycluster",
            WorkloadKind::PyTorchJob => "pytorchjob",
            WorkloadKind::TfJob => "tfjob",
            WorkloadKind::MpiJob | WorkloadKind::MpiJobV1 => "mpijob",
        }
    }

    /// Its kind as the API names it.
    pub fn api_kind(self) -> &'static str {
        match self {
            WorkloadKind::JobSet => "JobSet",
            WorkloadKind::LeaderWorkerSet => "LeaderWorkerSet",
            WorkloadKind::PodGroup => "PodGroup.scheduling.k8s.io",
            WorkloadKind::RayCluster => "RayCluster",
            WorkloadKind::PyTorchJob => "PyTorchJob",
            WorkloadKind::TfJob => "TFJob",
            WorkloadKind::MpiJob => "MPIJob.v2beta1.kubeflow.org",
            WorkloadKind::MpiJobV1 => "MPIJob.v1.kubeflow.org",
        }
    }
}

/// How a workload's pods are grouped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Gang {
    /// Not ganged: its pods are placed one by one (why, for the docs and
    /// the logs).
    Off(&'static str),
    /// One gang of this many pods per attempt (JobSet) or per group
    /// (LeaderWorkerSet).
    Whole {
        /// Pods that must start together.
        min_member: u32,
    },
    /// One gang per replicated job (a JobSet whose replicated jobs start
    /// one after another): the size of each.
    PerReplicatedJob {
        /// Pods per replicated job, by name.
        min_member: BTreeMap<String, u32>,
    },
}

/// What gpusched keeps of a JobSet or LeaderWorkerSet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    /// Which controller.
    pub kind: WorkloadKind,
    /// Its `gpusched.io/queue` label.
    pub queue: Option<String>,
    /// How its pods are grouped.
    pub gang: Gang,
}

/// A pod's place in a workload, read from the labels its controller put on
/// it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Which controller.
    pub kind: WorkloadKind,
    /// The workload's name (same namespace as the pod).
    pub workload: String,
    /// JobSet: the restart attempt; LeaderWorkerSet: the group index.
    pub instance: String,
    /// JobSet: the replicated job (empty for a LeaderWorkerSet).
    pub part: String,
}

/// The workload a pod belongs to, from its labels (`None`: none of the
/// kinds known here; such a pod is placed on its own).
pub fn member(labels: &BTreeMap<String, String>) -> Option<Member> {
    if let Some(name) = labels.get(LABEL_JOBSET_NAME).filter(|n| !n.is_empty()) {
        return Some(Member {
            kind: WorkloadKind::JobSet,
            workload: name.clone(),
            instance: labels
                .get(LABEL_JOBSET_RESTART)
                .cloned()
                .unwrap_or_else(|| "0".into()),
            part: labels
                .get(LABEL_JOBSET_REPLICATED_JOB)
                .cloned()
                .unwrap_or_default(),
        });
    }
    if let Some(name) = labels
        .get(LABEL_KUBEFLOW_JOB_NAME)
        .filter(|n| !n.is_empty())
    {
        let kind = match labels.get(LABEL_KUBEFLOW_OPERATOR).map(String::as_str) {
            Some("pytorchjob-controller") => WorkloadKind::PyTorchJob,
            Some("tfjob-controller") => WorkloadKind::TfJob,
            Some("mpi-operator") => WorkloadKind::MpiJob,
            Some("mpijob-controller") => WorkloadKind::MpiJobV1,
            _ => return None,
        };
        return Some(Member {
            kind,
            workload: name.clone(),
            instance: String::new(),
            part: String::new(),
        });
    }
    if let Some(name) = labels.get(LABEL_RAY_CLUSTER).filter(|n| !n.is_empty()) {
        return Some(Member {
            kind: WorkloadKind::RayCluster,
            workload: name.clone(),
            instance: String::new(),
            part: String::new(),
        });
    }
    let name = labels.get(LABEL_LWS_NAME).filter(|n| !n.is_empty())?;
    let index = labels
        .get(LABEL_LWS_GROUP_INDEX)
        .filter(|i| !i.is_empty())?;
    Some(Member {
        kind: WorkloadKind::LeaderWorkerSet,
        workload: name.clone(),
        instance: index.clone(),
        part: String::new(),
    })
}

/// The member of the upstream PodGroup a pod names in
/// `spec.schedulingGroup.podGroupName`.
pub fn scheduling_group_member(pod: &k8s_openapi::api::core::v1::Pod) -> Option<Member> {
    let name = pod
        .spec
        .as_ref()?
        .scheduling_group
        .as_ref()?
        .pod_group_name
        .clone()
        .filter(|n| !n.is_empty())?;
    Some(Member {
        kind: WorkloadKind::PodGroup,
        workload: name,
        instance: String::new(),
        part: String::new(),
    })
}

/// The gang a member belongs to: its name (`namespace/<kind>:<workload>…`,
/// never a valid object name, so never a PodGroup's) and its size.
/// `workload`: what is known of the workload (`None`: not seen yet; the
/// name is still given, so the pod waits for its group instead of starting
/// alone). `None`: the workload is not ganged.
pub fn group_of(
    namespace: &str,
    m: &Member,
    workload: Option<&Workload>,
) -> Option<(String, Option<u32>)> {
    let mut name = format!("{namespace}/{}:{}", m.kind.prefix(), m.workload);
    match m.kind {
        WorkloadKind::JobSet if m.instance != "0" => {
            name.push_str(&format!(":restart-{}", m.instance))
        }
        WorkloadKind::LeaderWorkerSet => name.push_str(&format!(":{}", m.instance)),
        _ => {}
    }
    match workload.map(|w| &w.gang) {
        None => Some((name, None)),
        Some(Gang::Off(_)) => None,
        Some(Gang::Whole { min_member }) => Some((name, Some(*min_member))),
        Some(Gang::PerReplicatedJob { min_member }) => {
            let min = min_member.get(&m.part).copied();
            name.push_str(&format!(":{}", m.part));
            Some((name, min))
        }
    }
}

fn meta_queue(meta: &ObjectMeta) -> Option<String> {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(gpusched_model::labels::LABEL_QUEUE))
        .filter(|q| !q.is_empty())
        .cloned()
}

/// The opt-out annotation: `Ok(false)` when the workload says
/// `gpusched.io/gang: "false"`.
fn gang_wanted(meta: &ObjectMeta, object: &str) -> Result<bool, String> {
    match meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANNOTATION_GANG))
    {
        None => Ok(true),
        Some(v) => parse_flag(v)
            .map_err(|e| format!("{object}: metadata.annotations[{ANNOTATION_GANG}]: {e}")),
    }
}

fn object_name(kind: &str, meta: &ObjectMeta) -> String {
    format!(
        "{kind} {}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod world_tests;

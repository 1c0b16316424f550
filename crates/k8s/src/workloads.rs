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

use gpusched_model::labels::parse_flag;
use kube::CustomResource;
use kube::core::ObjectMeta;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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

/// The JobSet fields gpusched reads (`jobset.x-k8s.io/v1alpha2`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "jobset.x-k8s.io",
    version = "v1alpha2",
    kind = "JobSet",
    plural = "jobsets",
    namespaced,
    status = "JobSetStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct JobSetSpec {
    /// The replicated jobs.
    #[serde(default)]
    pub replicated_jobs: Vec<ReplicatedJob>,
    /// `startupPolicy.startupPolicyOrder`.
    #[serde(default)]
    pub startup_policy: Option<StartupPolicy>,
}

/// One replicated job of a JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReplicatedJob {
    /// Its name.
    pub name: String,
    /// How many Jobs (the API's default is 1).
    #[serde(default)]
    pub replicas: Option<i64>,
    /// The Job template.
    #[serde(default)]
    pub template: JobTemplate,
    /// Replicated jobs this one waits for.
    #[serde(default)]
    pub depends_on: Option<Vec<serde_json::Value>>,
}

/// A Job template: only the sizes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobTemplate {
    /// The Job's spec.
    #[serde(default)]
    pub spec: Option<JobSizes>,
}

/// `parallelism` and `completions` of a Job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSizes {
    /// Pods running at once (default 1).
    #[serde(default)]
    pub parallelism: Option<i64>,
    /// Pods to complete (unset: any one success).
    #[serde(default)]
    pub completions: Option<i64>,
}

/// `spec.startupPolicy` of a JobSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StartupPolicy {
    /// `AnyOrder` or `InOrder`.
    #[serde(default)]
    pub startup_policy_order: Option<String>,
}

/// The JobSet status fields gpusched reads.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JobSetStatus {
    /// Restarts so far.
    #[serde(default)]
    pub restarts: Option<i64>,
}

/// The LeaderWorkerSet fields gpusched reads (`leaderworkerset.x-k8s.io/v1`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "leaderworkerset.x-k8s.io",
    version = "v1",
    kind = "LeaderWorkerSet",
    plural = "leaderworkersets",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct LeaderWorkerSetSpec {
    /// The group template.
    #[serde(default)]
    pub leader_worker_template: LeaderWorkerTemplate,
    /// `LeaderCreated` (default) or `LeaderReady`.
    #[serde(default)]
    pub startup_policy: Option<String>,
}

/// `spec.leaderWorkerTemplate`: only the size.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LeaderWorkerTemplate {
    /// Pods per group, leader included (default 1).
    #[serde(default)]
    pub size: Option<i64>,
}

/// The RayCluster fields gpusched reads (`ray.io/v1`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "ray.io",
    version = "v1",
    kind = "RayCluster",
    plural = "rayclusters",
    namespaced,
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct RayClusterSpec {
    /// The Ray autoscaler runs and sizes the worker groups.
    #[serde(default)]
    pub enable_in_tree_autoscaling: Option<bool>,
    /// The whole cluster is suspended (no pods).
    #[serde(default)]
    pub suspend: Option<bool>,
    /// The worker groups.
    #[serde(default)]
    pub worker_group_specs: Vec<RayWorkerGroup>,
}

/// One worker group of a RayCluster: only the sizes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RayWorkerGroup {
    /// Its name.
    #[serde(default)]
    pub group_name: String,
    /// Desired replicas.
    #[serde(default)]
    pub replicas: Option<i64>,
    /// At least this many (default 0).
    #[serde(default)]
    pub min_replicas: Option<i64>,
    /// At most this many.
    #[serde(default)]
    pub max_replicas: Option<i64>,
    /// Pods per replica (multi-host; default 1).
    #[serde(default)]
    pub num_of_hosts: Option<i64>,
    /// The group is suspended (no pods).
    #[serde(default)]
    pub suspend: Option<bool>,
}

/// What gpusched reads of a Kubeflow job's spec: the run policy, the
/// replica specs (`<kind>ReplicaSpecs`, by replica type) and the MPI
/// Operator's launcher creation policy.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeflowJobSpec {
    /// `runPolicy.schedulingPolicy.minAvailable`.
    #[serde(default)]
    pub run_policy: Option<KubeflowRunPolicy>,
    /// MPI Operator: `AtStartup` (default) or `WaitForWorkersReady`.
    #[serde(default)]
    pub launcher_creation_policy: Option<String>,
    /// Everything else, among it the `…ReplicaSpecs` maps.
    #[serde(flatten)]
    pub rest: BTreeMap<String, serde_json::Value>,
}

/// `spec.runPolicy` of a Kubeflow job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeflowRunPolicy {
    /// `schedulingPolicy`.
    #[serde(default)]
    pub scheduling_policy: Option<KubeflowSchedulingPolicy>,
}

/// `spec.runPolicy.schedulingPolicy` of a Kubeflow job.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KubeflowSchedulingPolicy {
    /// Pods that must start together.
    #[serde(default)]
    pub min_available: Option<i64>,
}

macro_rules! kubeflow_kind {
    ($root:ident, $kind:literal, $version:literal, $plural:literal) => {
        /// A Kubeflow job (only what gpusched reads).
        #[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
        pub struct $root {
            /// Metadata.
            pub metadata: ObjectMeta,
            /// Spec.
            #[serde(default)]
            pub spec: KubeflowJobSpec,
        }

        impl kube::Resource for $root {
            type DynamicType = ();
            type Scope = kube::core::NamespaceResourceScope;
            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                $kind.into()
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                "kubeflow.org".into()
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                $version.into()
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                $plural.into()
            }
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
kubeflow_kind!(PyTorchJob, "PyTorchJob", "v1", "pytorchjobs");
kubeflow_kind!(TfJob, "TFJob", "v1", "tfjobs");
kubeflow_kind!(MpiJob, "MPIJob", "v2beta1", "mpijobs");
kubeflow_kind!(MpiJobV1, "MPIJob", "v1", "mpijobs");

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

/// A JobSet's gang. All its replicated jobs' pods form one gang of
/// Σ replicas × pods per Job (pods per Job: `parallelism`, default 1, at
/// most `completions`), one per restart attempt. When the replicated jobs
/// start one after another (`startupPolicyOrder: InOrder`, or `dependsOn`),
/// a later one's pods do not exist until an earlier one runs, so each
/// replicated job is its own gang.
pub fn jobset(js: &JobSet) -> Result<Workload, String> {
    let obj = object_name("jobset", &js.metadata);
    let queue = meta_queue(&js.metadata);
    if !gang_wanted(&js.metadata, &obj)? {
        return Ok(Workload {
            kind: WorkloadKind::JobSet,
            queue,
            gang: Gang::Off("opted out (gpusched.io/gang: \"false\")"),
        });
    }
    let mut per: BTreeMap<String, u32> = BTreeMap::new();
    let mut total: u32 = 0;
    for (i, r) in js.spec.replicated_jobs.iter().enumerate() {
        let field = format!("spec.replicatedJobs[{i}]");
        let replicas = r.replicas.unwrap_or(1);
        let sizes = r.template.spec.clone().unwrap_or_default();
        let parallelism = sizes.parallelism.unwrap_or(1);
        let per_job = match sizes.completions {
            Some(c) => parallelism.min(c),
            None => parallelism,
        };
        for (what, v) in [
            ("replicas", replicas),
            ("template.spec.parallelism", parallelism),
            ("template.spec.completions", sizes.completions.unwrap_or(0)),
        ] {
            if v < 0 {
                return Err(format!(
                    "{obj}: {field}.{what}: must not be negative, is {v}"
                ));
            }
        }
        let n = u32::try_from(replicas.saturating_mul(per_job))
            .ok()
            .filter(|n| total.checked_add(*n).is_some())
            .ok_or_else(|| {
                format!("{obj}: {field}: {replicas} replicas × {per_job} pods is more pods than one gang can hold")
            })?;
        total += n;
        per.insert(r.name.clone(), n);
    }
    let staged = js
        .spec
        .startup_policy
        .as_ref()
        .and_then(|s| s.startup_policy_order.as_deref())
        == Some("InOrder")
        || js
            .spec
            .replicated_jobs
            .iter()
            .any(|r| r.depends_on.as_ref().is_some_and(|d| !d.is_empty()));
    let gang = if total == 0 {
        Gang::Off("no pods")
    } else if staged {
        Gang::PerReplicatedJob { min_member: per }
    } else {
        Gang::Whole { min_member: total }
    };
    Ok(Workload {
        kind: WorkloadKind::JobSet,
        queue,
        gang,
    })
}

/// A LeaderWorkerSet's gangs: each group (leader + workers, `size` pods)
/// is one gang; replicas are independent gangs. With `startupPolicy:
/// LeaderReady` the workers are made only once the leader runs, so a gang
/// could never complete: such a set is placed pod by pod.
pub fn leader_worker_set(l: &LeaderWorkerSet) -> Result<Workload, String> {
    let obj = object_name("leaderworkerset", &l.metadata);
    let queue = meta_queue(&l.metadata);
    let off = |why| {
        Ok(Workload {
            kind: WorkloadKind::LeaderWorkerSet,
            queue: queue.clone(),
            gang: Gang::Off(why),
        })
    };
    if !gang_wanted(&l.metadata, &obj)? {
        return off("opted out (gpusched.io/gang: \"false\")");
    }
    if l.spec.startup_policy.as_deref() == Some("LeaderReady") {
        return off("startupPolicy LeaderReady: workers are made after the leader runs");
    }
    let size = l.spec.leader_worker_template.size.unwrap_or(1);
    let size = u32::try_from(size)
        .ok()
        .filter(|s| *s >= 1)
        .ok_or_else(|| {
            format!("{obj}: spec.leaderWorkerTemplate.size: must be 1 or more, is {size}")
        })?;
    Ok(Workload {
        kind: WorkloadKind::LeaderWorkerSet,
        queue,
        gang: Gang::Whole { min_member: size },
    })
}

/// An upstream PodGroup (`scheduling.k8s.io/v1beta1`): a gang of
/// `spec.schedulingPolicy.gang.minCount` pods; the `basic` policy places
/// its pods one by one, as kube-scheduler does.
pub fn upstream_pod_group(
    g: &k8s_openapi::api::scheduling::v1beta1::PodGroup,
) -> Result<Workload, String> {
    let obj = object_name("podgroup.scheduling.k8s.io", &g.metadata);
    let queue = meta_queue(&g.metadata);
    let gang = match &g.spec.scheduling_policy.gang {
        Some(gang) => {
            let min = u32::try_from(gang.min_count)
                .ok()
                .filter(|m| *m >= 1)
                .ok_or_else(|| {
                    format!(
                        "{obj}: spec.schedulingPolicy.gang.minCount: must be 1 or more, is {}",
                        gang.min_count
                    )
                })?;
            if gang_wanted(&g.metadata, &obj)? {
                Gang::Whole { min_member: min }
            } else {
                Gang::Off("opted out (gpusched.io/gang: \"false\")")
            }
        }
        None => Gang::Off("basic scheduling policy"),
    };
    Ok(Workload {
        kind: WorkloadKind::PodGroup,
        queue,
        gang,
    })
}

/// A RayCluster's gang: the head and its workers, sized as KubeRay sizes
/// the gang it asks batch schedulers for: 1 + Σ over worker groups of
/// replicas × `numOfHosts`, replicas being `minReplicas` when the Ray
/// autoscaler runs (it adds the rest later, one by one), else the desired
/// `replicas` held within `minReplicas..maxReplicas`; suspended groups
/// count 0. A RayJob's or RayService's pods belong to the RayCluster it
/// makes (the submitter Job's pods to none).
pub fn ray_cluster(r: &RayCluster) -> Result<Workload, String> {
    let obj = object_name("raycluster", &r.metadata);
    let queue = meta_queue(&r.metadata);
    if !gang_wanted(&r.metadata, &obj)? {
        return Ok(Workload {
            kind: WorkloadKind::RayCluster,
            queue,
            gang: Gang::Off("opted out (gpusched.io/gang: \"false\")"),
        });
    }
    if r.spec.suspend == Some(true) {
        return Ok(Workload {
            kind: WorkloadKind::RayCluster,
            queue,
            gang: Gang::Off("no pods"),
        });
    }
    let autoscaling = r.spec.enable_in_tree_autoscaling == Some(true);
    let mut total: i64 = 1;
    for (i, g) in r.spec.worker_group_specs.iter().enumerate() {
        let field = format!("spec.workerGroupSpecs[{i}]");
        if g.suspend == Some(true) {
            continue;
        }
        let min = g.min_replicas.unwrap_or(0);
        let max = g.max_replicas.unwrap_or(i64::from(i32::MAX));
        let hosts = g.num_of_hosts.unwrap_or(1);
        for (what, v) in [
            ("minReplicas", min),
            ("maxReplicas", max),
            ("numOfHosts", hosts),
        ] {
            if v < 0 {
                return Err(format!(
                    "{obj}: {field}.{what}: must not be negative, is {v}"
                ));
            }
        }
        let replicas = if autoscaling {
            min
        } else {
            g.replicas.unwrap_or(min).max(min).min(max)
        };
        total = total.saturating_add(replicas.saturating_mul(hosts));
    }
    let min_member = u32::try_from(total)
        .map_err(|_| format!("{obj}: {total} pods is more than one gang can hold"))?;
    Ok(Workload {
        kind: WorkloadKind::RayCluster,
        queue,
        gang: Gang::Whole { min_member },
    })
}

/// A Kubeflow job's gang, as its operator sizes the gang it asks batch
/// schedulers for: `runPolicy.schedulingPolicy.minAvailable` when set,
/// else every replica of every replica type (training-operator: Σ
/// `replicas`, default 1; MPI Operator: the workers plus the launcher).
/// An MPI Operator job with `launcherCreationPolicy: WaitForWorkersReady`
/// makes its launcher only once the workers run, so its gang is the
/// workers alone.
pub fn kubeflow_job(
    kind: WorkloadKind,
    meta: &ObjectMeta,
    spec: &KubeflowJobSpec,
) -> Result<Workload, String> {
    let obj = object_name(&kind.api_kind().to_lowercase(), meta);
    let queue = meta_queue(meta);
    let done = |gang| {
        Ok(Workload {
            kind,
            queue: queue.clone(),
            gang,
        })
    };
    if !gang_wanted(meta, &obj)? {
        return done(Gang::Off("opted out (gpusched.io/gang: \"false\")"));
    }
    // The training-operator's v1 MPIJob sizes its replicas as the MPI
    // Operator does (workers default to 0) and makes its launcher with its
    // workers, in the same pass: the `AtStartup` shape.
    let mpi = matches!(kind, WorkloadKind::MpiJob | WorkloadKind::MpiJobV1);
    let wait_for_workers = kind == WorkloadKind::MpiJob
        && spec.launcher_creation_policy.as_deref() == Some("WaitForWorkersReady");
    let min_available = spec
        .run_policy
        .as_ref()
        .and_then(|r| r.scheduling_policy.as_ref())
        .and_then(|s| s.min_available);
    let total: i64 = match min_available {
        Some(m) if !wait_for_workers => m,
        _ => {
            let mut total: i64 = 0;
            for (field, v) in &spec.rest {
                if !field.ends_with("ReplicaSpecs") {
                    continue;
                }
                let Some(types) = v.as_object() else {
                    return Err(format!("{obj}: spec.{field}: not a map of replica types"));
                };
                for (rtype, r) in types {
                    let launcher = rtype.eq_ignore_ascii_case("launcher");
                    if launcher && wait_for_workers {
                        continue;
                    }
                    let default = if mpi && !launcher { 0 } else { 1 };
                    let n = match r.get("replicas") {
                        None | Some(serde_json::Value::Null) => default,
                        Some(v) => v.as_i64().ok_or_else(|| {
                            format!("{obj}: spec.{field}.{rtype}.replicas: not an integer")
                        })?,
                    };
                    if n < 0 {
                        return Err(format!(
                            "{obj}: spec.{field}.{rtype}.replicas: must not be negative, is {n}"
                        ));
                    }
                    total = total.saturating_add(n);
                }
            }
            total
        }
    };
    if total < 0 {
        return Err(format!(
            "{obj}: spec.runPolicy.schedulingPolicy.minAvailable: must not be negative, is {total}"
        ));
    }
    match u32::try_from(total) {
        Ok(0) => done(Gang::Off("no pods")),
        Ok(min_member) => done(Gang::Whole { min_member }),
        Err(_) => Err(format!(
            "{obj}: {total} pods is more than one gang can hold"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn js(v: serde_json::Value) -> JobSet {
        serde_json::from_value(v).unwrap()
    }

    fn labels(v: &[(&str, &str)]) -> BTreeMap<String, String> {
        v.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_jobset_is_one_gang_of_every_replicated_jobs_pods() {
        let j = js(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ml", "labels": {"gpusched.io/queue": "research"}},
            "spec": {"replicatedJobs": [
                {"name": "leader", "template": {"spec": {"template": {"spec": {"containers": []}}}}},
                {"name": "workers", "replicas": 3,
                 "template": {"spec": {"parallelism": 4, "completions": 4, "template": {}}}},
                {"name": "short", "replicas": 2,
                 "template": {"spec": {"parallelism": 4, "completions": 1}}}
            ]},
            "status": {"restarts": 0}
        }));
        let w = jobset(&j).unwrap();
        assert_eq!(w.queue.as_deref(), Some("research"));
        assert_eq!(
            w.gang,
            Gang::Whole {
                min_member: 1 + 12 + 2
            }
        );
        let m = member(&labels(&[
            (LABEL_JOBSET_NAME, "train"),
            (LABEL_JOBSET_REPLICATED_JOB, "workers"),
            (LABEL_JOBSET_RESTART, "0"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&w)),
            Some(("ml/jobset:train".into(), Some(15)))
        );
        // a restart is a fresh gang
        let m = member(&labels(&[
            (LABEL_JOBSET_NAME, "train"),
            (LABEL_JOBSET_RESTART, "2"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&w)).unwrap().0,
            "ml/jobset:train:restart-2"
        );
    }

    #[test]
    fn replicated_jobs_that_start_in_turn_are_a_gang_each() {
        for spec in [
            json!({"startupPolicy": {"startupPolicyOrder": "InOrder"}, "replicatedJobs": [
                {"name": "a", "replicas": 2}, {"name": "b", "template": {"spec": {"parallelism": 3}}}]}),
            json!({"replicatedJobs": [
                {"name": "a", "replicas": 2},
                {"name": "b", "template": {"spec": {"parallelism": 3}},
                 "dependsOn": [{"name": "a", "status": "Ready"}]}]}),
        ] {
            let w = jobset(&js(json!({"metadata": {"name": "s", "namespace": "ml"},
                "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "spec": spec})))
            .unwrap();
            let m = member(&labels(&[
                (LABEL_JOBSET_NAME, "s"),
                (LABEL_JOBSET_REPLICATED_JOB, "b"),
            ]))
            .unwrap();
            assert_eq!(
                group_of("ml", &m, Some(&w)),
                Some(("ml/jobset:s:b".into(), Some(3)))
            );
        }
    }

    #[test]
    fn opting_out_and_bad_sizes() {
        let base = |ann: serde_json::Value, rjobs: serde_json::Value| {
            js(
                json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
                "metadata": {"name": "s", "namespace": "ml", "annotations": ann},
                "spec": {"replicatedJobs": rjobs}}),
            )
        };
        let w = jobset(&base(
            json!({"gpusched.io/gang": "false"}),
            json!([{"name": "a"}]),
        ))
        .unwrap();
        assert!(matches!(w.gang, Gang::Off(_)));
        let m = member(&labels(&[(LABEL_JOBSET_NAME, "s")])).unwrap();
        assert_eq!(group_of("ml", &m, Some(&w)), None);
        let e = jobset(&base(json!({"gpusched.io/gang": "maybe"}), json!([]))).unwrap_err();
        assert!(
            e.starts_with("jobset ml/s: metadata.annotations[gpusched.io/gang]"),
            "{e}"
        );
        let e = jobset(&base(json!({}), json!([{"name": "a", "replicas": -1}]))).unwrap_err();
        assert!(e.contains("spec.replicatedJobs[0].replicas"), "{e}");
        let e = jobset(&base(
            json!({}),
            json!([{"name": "a", "replicas": 70000, "template": {"spec": {"parallelism": 70000}}}]),
        ))
        .unwrap_err();
        assert!(e.contains("more pods than one gang can hold"), "{e}");
        let w = jobset(&base(json!({}), json!([{"name": "a", "replicas": 0}]))).unwrap();
        assert_eq!(w.gang, Gang::Off("no pods"));
    }

    #[test]
    fn each_leader_worker_group_is_a_gang() {
        let l: LeaderWorkerSet = serde_json::from_value(json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "namespace": "inf"},
            "spec": {"replicas": 3, "startupPolicy": "LeaderCreated",
                     "leaderWorkerTemplate": {"size": 4, "workerTemplate": {"spec": {}}}}
        }))
        .unwrap();
        let w = leader_worker_set(&l).unwrap();
        let leader = member(&labels(&[
            (LABEL_LWS_NAME, "serve"),
            (LABEL_LWS_GROUP_INDEX, "2"),
            ("leaderworkerset.sigs.k8s.io/worker-index", "0"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("inf", &leader, Some(&w)),
            Some(("inf/leaderworkerset:serve:2".into(), Some(4)))
        );
        // not seen yet: still named, so the pod waits for its group
        assert_eq!(
            group_of("inf", &leader, None),
            Some(("inf/leaderworkerset:serve:2".into(), None))
        );
        let mut ready = l.clone();
        ready.spec.startup_policy = Some("LeaderReady".into());
        assert!(matches!(
            leader_worker_set(&ready).unwrap().gang,
            Gang::Off(_)
        ));
        let mut zero = l;
        zero.spec.leader_worker_template.size = Some(0);
        let e = leader_worker_set(&zero).unwrap_err();
        assert_eq!(
            e,
            "leaderworkerset inf/serve: spec.leaderWorkerTemplate.size: must be 1 or more, is 0"
        );
    }

    #[test]
    fn an_upstream_pod_group_is_a_gang_of_min_count() {
        let g: k8s_openapi::api::scheduling::v1beta1::PodGroup = serde_json::from_value(json!({
            "apiVersion": "scheduling.k8s.io/v1beta1", "kind": "PodGroup",
            "metadata": {"name": "g", "namespace": "ml"},
            "spec": {"schedulingPolicy": {"gang": {"minCount": 3}}}
        }))
        .unwrap();
        let w = upstream_pod_group(&g).unwrap();
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ml"},
            "spec": {"containers": [], "schedulingGroup": {"podGroupName": "g"}}
        }))
        .unwrap();
        let m = scheduling_group_member(&pod).unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&w)),
            Some(("ml/scheduling.k8s.io:g".into(), Some(3)))
        );
        let mut basic = g.clone();
        basic.spec.scheduling_policy.gang = None;
        assert_eq!(
            upstream_pod_group(&basic).unwrap().gang,
            Gang::Off("basic scheduling policy")
        );
        let mut bad = g;
        bad.spec.scheduling_policy.gang.as_mut().unwrap().min_count = 0;
        assert!(
            upstream_pod_group(&bad)
                .unwrap_err()
                .contains("spec.schedulingPolicy.gang.minCount: must be 1 or more, is 0")
        );
    }

    #[test]
    fn a_ray_cluster_is_its_head_and_workers() {
        let r = |autoscaling: bool| -> RayCluster {
            serde_json::from_value(json!({
                "apiVersion": "ray.io/v1", "kind": "RayCluster",
                "metadata": {"name": "rc", "namespace": "ml"},
                "spec": {"enableInTreeAutoscaling": autoscaling,
                    "headGroupSpec": {"template": {}},
                    "workerGroupSpecs": [
                        {"groupName": "gpu", "replicas": 3, "minReplicas": 1, "maxReplicas": 4,
                         "numOfHosts": 2, "template": {}},
                        {"groupName": "cpu", "replicas": 9, "maxReplicas": 2, "template": {}},
                        {"groupName": "off", "replicas": 5, "suspend": true, "template": {}}
                    ]}
            }))
            .unwrap()
        };
        // 1 head + 3 × 2 + min(9, 2)
        assert_eq!(
            ray_cluster(&r(false)).unwrap().gang,
            Gang::Whole { min_member: 9 }
        );
        // with the autoscaler: 1 head + 1 × 2 + 0
        assert_eq!(
            ray_cluster(&r(true)).unwrap().gang,
            Gang::Whole { min_member: 3 }
        );
        let m = member(&labels(&[
            (LABEL_RAY_CLUSTER, "rc"),
            ("ray.io/node-type", "worker"),
            ("ray.io/group", "gpu"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&ray_cluster(&r(false)).unwrap())),
            Some(("ml/raycluster:rc".into(), Some(9)))
        );
    }

    #[test]
    fn kubeflow_jobs_are_gangs_of_all_their_replicas() {
        let pt: PyTorchJob = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": "pt", "namespace": "ml"},
            "spec": {"pytorchReplicaSpecs": {
                "Master": {"replicas": 1, "template": {}},
                "Worker": {"replicas": 3, "template": {}}}}
        }))
        .unwrap();
        let w = kubeflow_job(WorkloadKind::PyTorchJob, &pt.metadata, &pt.spec).unwrap();
        assert_eq!(w.gang, Gang::Whole { min_member: 4 });
        let m = member(&labels(&[
            (LABEL_KUBEFLOW_JOB_NAME, "pt"),
            (LABEL_KUBEFLOW_OPERATOR, "pytorchjob-controller"),
            ("training.kubeflow.org/replica-type", "worker"),
        ]))
        .unwrap();
        assert_eq!(
            group_of("ml", &m, Some(&w)),
            Some(("ml/pytorchjob:pt".into(), Some(4)))
        );
        let mut min = pt.clone();
        min.spec.run_policy =
            serde_json::from_value(json!({"schedulingPolicy": {"minAvailable": 2}})).unwrap();
        assert_eq!(
            kubeflow_job(WorkloadKind::PyTorchJob, &min.metadata, &min.spec)
                .unwrap()
                .gang,
            Gang::Whole { min_member: 2 }
        );
        // MPI Operator: workers + launcher, or the workers alone when the
        // launcher waits for them
        let mpi = |policy: &str| -> MpiJob {
            serde_json::from_value(json!({
                "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
                "metadata": {"name": "m", "namespace": "ml"},
                "spec": {"launcherCreationPolicy": policy, "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": {}},
                    "Worker": {"replicas": 4, "template": {}}}}
            }))
            .unwrap()
        };
        let j = mpi("AtStartup");
        assert_eq!(
            kubeflow_job(WorkloadKind::MpiJob, &j.metadata, &j.spec)
                .unwrap()
                .gang,
            Gang::Whole { min_member: 5 }
        );
        let j = mpi("WaitForWorkersReady");
        assert_eq!(
            kubeflow_job(WorkloadKind::MpiJob, &j.metadata, &j.spec)
                .unwrap()
                .gang,
            Gang::Whole { min_member: 4 }
        );
        let m = member(&labels(&[
            (LABEL_KUBEFLOW_JOB_NAME, "m"),
            (LABEL_KUBEFLOW_OPERATOR, "mpi-operator"),
            ("training.kubeflow.org/job-role", "launcher"),
        ]))
        .unwrap();
        assert_eq!(m.kind, WorkloadKind::MpiJob);
        // the training-operator's v1 MPIJob: the launcher and the workers
        // (none unless given), made together; no launcher policy
        let v1: MpiJobV1 = serde_json::from_value(json!({
            "apiVersion": "kubeflow.org/v1", "kind": "MPIJob",
            "metadata": {"name": "m1", "namespace": "ml"},
            "spec": {"mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "template": {}},
                "Worker": {"replicas": 3, "template": {}}}}
        }))
        .unwrap();
        assert_eq!(
            kubeflow_job(WorkloadKind::MpiJobV1, &v1.metadata, &v1.spec)
                .unwrap()
                .gang,
            Gang::Whole { min_member: 4 }
        );
        let mut no_workers = v1.clone();
        no_workers.spec.rest.insert(
            "mpiReplicaSpecs".into(),
            json!({"Launcher": {"template": {}}, "Worker": {"template": {}}}),
        );
        assert_eq!(
            kubeflow_job(
                WorkloadKind::MpiJobV1,
                &no_workers.metadata,
                &no_workers.spec
            )
            .unwrap()
            .gang,
            Gang::Whole { min_member: 1 }
        );
        let m = member(&labels(&[
            (LABEL_KUBEFLOW_JOB_NAME, "m1"),
            (LABEL_KUBEFLOW_OPERATOR, "mpijob-controller"),
        ]))
        .unwrap();
        assert_eq!(m.kind, WorkloadKind::MpiJobV1);
        assert_eq!(
            group_of("ml", &m, None).unwrap().0,
            "ml/mpijob:m1",
            "one group name for both MPIJob versions"
        );
        // an operator not known here: not a member of anything
        assert_eq!(
            member(&labels(&[
                (LABEL_KUBEFLOW_JOB_NAME, "x"),
                (LABEL_KUBEFLOW_OPERATOR, "xgboostjob-controller"),
            ])),
            None
        );
        let mut bad = pt;
        bad.spec.rest.insert(
            "pytorchReplicaSpecs".into(),
            json!({"Worker": {"replicas": -2}}),
        );
        assert!(
            kubeflow_job(WorkloadKind::PyTorchJob, &bad.metadata, &bad.spec)
                .unwrap_err()
                .contains("spec.pytorchReplicaSpecs.Worker.replicas: must not be negative")
        );
    }

    #[test]
    fn pods_of_other_owners_are_nobodys_members() {
        assert_eq!(member(&labels(&[("app", "x")])), None);
        assert_eq!(member(&labels(&[(LABEL_LWS_NAME, "serve")])), None);
        assert_eq!(member(&labels(&[(LABEL_JOBSET_NAME, "")])), None);
    }
}

#[cfg(test)]
mod world_tests {
    use super::*;
    use crate::world::World;
    use k8s_openapi::api::core::v1::Pod;
    use serde_json::{Value, json};

    fn pod(name: &str, labels: Value, priority: i32) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                         "creationTimestamp": "2026-12-01T10:00:00Z", "labels": labels},
            "spec": {"schedulerName": "gpusched", "priority": priority, "containers": [
                {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
            "status": {"phase": "Pending"}
        }))
        .unwrap()
    }

    fn train(annotations: Value) -> JobSet {
        serde_json::from_value(json!({
            "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": "train", "namespace": "ml", "annotations": annotations,
                         "labels": {"gpusched.io/queue": "research"}},
            "spec": {"replicatedJobs": [{"name": "w", "replicas": 2,
                     "template": {"spec": {"parallelism": 2}}}]}
        }))
        .unwrap()
    }

    fn jobset_pod(name: &str, priority: i32) -> Pod {
        pod(
            name,
            json!({LABEL_JOBSET_NAME: "train", LABEL_JOBSET_REPLICATED_JOB: "w",
                   LABEL_JOBSET_RESTART: "0", "batch.kubernetes.io/job-name": "train-w-0"}),
            priority,
        )
    }

    #[test]
    fn a_jobsets_pods_are_one_gang_in_its_queue_at_their_priority() {
        let mut w = World::default();
        for (i, prio) in [(0, 5), (1, 7), (2, 5), (3, 5)] {
            w.upsert_pod(&jobset_pod(&format!("train-w-{i}"), prio));
        }
        w.upsert_pod(&pod("loose", json!({"app": "x"}), 0));
        // the JobSet not seen yet: its pods wait for their group
        let b = w.build();
        assert!(b.snapshot.groups.is_empty());
        assert!(
            b.snapshot
                .pods
                .iter()
                .filter(|p| p.pod.name.starts_with("ml/train"))
                .all(|p| p.pod.group.as_deref() == Some("ml/jobset:train"))
        );
        w.upsert_workload(WorkloadKind::JobSet, "ml/train", jobset(&train(json!({}))));
        let b = w.build();
        assert_eq!(b.snapshot.groups.len(), 1);
        let g = &b.snapshot.groups[0];
        assert_eq!(
            (g.name.as_str(), g.min_member, g.queue.as_str(), g.priority),
            ("ml/jobset:train", 4, "research", 7)
        );
        for p in &b.snapshot.pods {
            if p.pod.name == "ml/loose" {
                assert_eq!(
                    (p.pod.group.as_deref(), p.pod.queue.as_str()),
                    (None, "default")
                );
            } else {
                // no queue label of their own: charged to the JobSet's queue
                assert_eq!(p.pod.queue, "research");
            }
        }
        assert_eq!(b.pending_by_queue.get("research"), Some(&4));
        // opted out: each pod on its own
        w.upsert_workload(
            WorkloadKind::JobSet,
            "ml/train",
            jobset(&train(json!({ANNOTATION_GANG: "false"}))),
        );
        let b = w.build();
        assert!(b.snapshot.groups.is_empty());
        assert!(b.snapshot.pods.iter().all(|p| p.pod.group.is_none()));
        // (still charged to the JobSet's queue)
        assert!(
            b.snapshot
                .pods
                .iter()
                .filter(|p| p.pod.name.starts_with("ml/train"))
                .all(|p| p.pod.queue == "research")
        );
        // gone again (a relist without it): its pods wait once more
        w.retain_only(
            crate::world::ObjectKind::JobSet,
            &std::collections::BTreeSet::new(),
        );
        assert!(
            w.build()
                .snapshot
                .pods
                .iter()
                .any(|p| p.pod.group.is_some())
        );
    }

    #[test]
    fn finished_members_count_as_started() {
        let mut w = World::default();
        w.upsert_workload(WorkloadKind::JobSet, "ml/train", jobset(&train(json!({}))));
        for i in 0..4 {
            w.upsert_pod(&jobset_pod(&format!("train-w-{i}"), 0));
        }
        assert_eq!(w.build().snapshot.groups[0].min_member, 4);
        // two finished, one failed and was replaced (pending): the
        // replacement needs only the one still running... and itself
        for i in 0..2 {
            let mut p = jobset_pod(&format!("train-w-{i}"), 0);
            p.status.as_mut().unwrap().phase = Some("Succeeded".into());
            w.upsert_pod(&p);
        }
        assert_eq!(w.build().snapshot.groups[0].min_member, 2);
    }

    #[test]
    fn an_unusable_workload_is_reported_and_its_pods_wait() {
        let mut w = World::default();
        w.upsert_pod(&jobset_pod("train-w-0", 0));
        w.upsert_workload(
            WorkloadKind::JobSet,
            "ml/train",
            jobset(&train(json!({ANNOTATION_GANG: "perhaps"}))),
        );
        let b = w.build();
        assert!(b.snapshot.groups.is_empty());
        assert_eq!(
            b.snapshot.pods[0].pod.group.as_deref(),
            Some("ml/jobset:train")
        );
        assert!(b.problems.iter().any(|p| matches!(p,
            crate::world::Problem::InvalidGroup { group, error }
                if group == "JobSet ml/train" && error.contains("gpusched.io/gang"))));
    }

    #[test]
    fn leader_worker_groups_are_separate_gangs() {
        let mut w = World::default();
        for g in 0..2 {
            for i in 0..3 {
                w.upsert_pod(&pod(
                    &format!("serve-{g}-{i}"),
                    json!({LABEL_LWS_NAME: "serve", LABEL_LWS_GROUP_INDEX: g.to_string(),
                           "gpusched.io/queue": "inference"}),
                    0,
                ));
            }
        }
        let l: LeaderWorkerSet = serde_json::from_value(json!({
            "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
            "metadata": {"name": "serve", "namespace": "ml"},
            "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 3}}
        }))
        .unwrap();
        w.upsert_workload(
            WorkloadKind::LeaderWorkerSet,
            "ml/serve",
            leader_worker_set(&l),
        );
        let b = w.build();
        let gs: Vec<(&str, u32, &str)> = b
            .snapshot
            .groups
            .iter()
            .map(|g| (g.name.as_str(), g.min_member, g.queue.as_str()))
            .collect();
        assert_eq!(
            gs,
            [
                ("ml/leaderworkerset:serve:0", 3, "inference"),
                ("ml/leaderworkerset:serve:1", 3, "inference")
            ]
        );
    }
}

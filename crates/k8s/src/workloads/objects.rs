//! The fields gpusched reads of the workload objects it watches: JobSet,
//! LeaderWorkerSet, RayCluster and the Kubeflow jobs (typed, list/watch
//! only; the upstream PodGroup is k8s-openapi's).

use super::*;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

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

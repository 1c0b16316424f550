//! ProvisioningRequests (`autoscaling.x-k8s.io/v1`) for gangs that need
//! new nodes: one request for the whole gang, so cluster-autoscaler adds
//! the gang's capacity atomically instead of scaling for its members one
//! by one (docs/kubernetes.md, "Pending pods and autoscalers").
//!
//! The decision is pure ([`decide`]): from what the last cycle said of a
//! gang ([`GangState`], built by [`gangs`]) and the requests that exist
//! for it ([`PrState`]) to a [`Plan`]. [`run`] carries plans out on the
//! leader: PodTemplates and the request, the consume annotation on the
//! members, a reservation of the provisioned nodes (nominations), deletion
//! when the gang runs, goes away or is held by gpusched's own rules, and a
//! new request after a failure, with backoff.
//!
//! Here: the request's fields and the configuration; `decide.rs` the pure
//! decision, `request.rs` what a request asks for, `reserve.rs` the
//! provisioned nodes' reservation, `run.rs` the leader's task and its API
//! writes.

use crate::exec::events::{Event, EventType, Recorder};
use crate::watch::Shared;
use crate::world::Built;
use futures::StreamExt;
use gpusched_core::report::classify::PendingClass;
use gpusched_core::{CycleOutput, PodId};
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplate, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, CustomResource, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch as tokio_watch;

mod decide;
mod request;
mod reserve;
mod run;
pub use decide::{
    Blocked, GangState, Member, Next, Plan, PrPhase, PrState, decide, gangs, phase, pr_state,
};
pub use request::{pod_sets, pr_name};
pub use reserve::{Reservations, new_nodes};
pub use run::{Ctx, Gangs, run};

/// cluster-autoscaler's class that adds nodes for the whole request or
/// none (the default).
pub const CLASS_BEST_EFFORT_ATOMIC: &str = "best-effort-atomic-scale-up.autoscaling.x-k8s.io";
/// cluster-autoscaler's class that only checks the existing nodes and
/// books the capacity.
pub const CLASS_CHECK_CAPACITY: &str = "check-capacity.autoscaling.x-k8s.io";
/// The annotation on a pod naming the request whose capacity it consumes
/// (cluster-autoscaler then leaves it out of its per-pod scale-up).
pub const ANNOTATION_CONSUME: &str = "autoscaling.x-k8s.io/consume-provisioning-request";
/// The annotation on a pod naming that request's class.
pub const ANNOTATION_CLASS: &str = "autoscaling.x-k8s.io/provisioning-class-name";
/// The gang (`namespace/name` as the scheduler knows it) a request is for.
pub const ANNOTATION_GANG: &str = "gpusched.io/gang";
/// Which request for the gang this is (1, 2, … after failures).
pub const ANNOTATION_ATTEMPT: &str = "gpusched.io/provisioning-attempt";
/// Label on the requests and PodTemplates gpusched writes (the watch
/// selects by it: other requests are not ours).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "gpusched";
/// The `PodScheduled=False` reason of a gang's members while its request
/// is pending, provisioned or being retried (not `Unschedulable`: no
/// autoscaler should also scale up for the members one by one).
pub const CONDITION_REASON: &str = "WaitingForProvisioning";
/// At most this many pod sets in one request (the CRD's `maxItems`).
pub const MAX_POD_SETS: usize = 32;

/// A request for capacity (cluster-autoscaler's CRD, as served by
/// `config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml` of
/// `k8s.io/autoscaler/cluster-autoscaler/apis`).
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "autoscaling.x-k8s.io",
    version = "v1",
    kind = "ProvisioningRequest",
    plural = "provisioningrequests",
    namespaced,
    status = "ProvisioningRequestStatus",
    schema = "disabled"
)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestSpec {
    /// Groups of identical pods and how many of each.
    pub pod_sets: Vec<PodSet>,
    /// The provisioning class.
    pub provisioning_class_name: String,
    /// Class parameters (e.g. `ValidUntilSeconds`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub parameters: BTreeMap<String, String>,
}

/// One group of identical pods of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// The PodTemplate (same namespace) the pods look like.
    pub pod_template_ref: Reference,
    /// How many such pods.
    pub count: i32,
}

/// A reference by name within the namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reference {
    /// The object's name.
    #[serde(default)]
    pub name: String,
}

/// What the autoscaler says of a request.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningRequestStatus {
    /// `Accepted`, `Provisioned`, `Failed`, `BookingExpired`,
    /// `CapacityRevoked`.
    #[serde(default)]
    pub conditions: Option<Vec<PrCondition>>,
}

/// One condition of a request (lenient: every field but the type may be
/// missing).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PrCondition {
    /// The condition type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False`, `Unknown`.
    #[serde(default)]
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: Option<String>,
    /// Human-readable message.
    #[serde(default)]
    pub message: Option<String>,
    /// RFC 3339 time of the last change.
    #[serde(default)]
    pub last_transition_time: Option<String>,
}

/// What the scheduler does with ProvisioningRequests (off unless given:
/// `gpusched scheduler --provisioning-requests`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// The class of the requests written.
    pub class: String,
    /// Their `spec.parameters`.
    pub parameters: BTreeMap<String, String>,
    /// Wait after the first failure before a new request; doubled per
    /// failed attempt.
    pub retry_base: Duration,
    /// Longest wait between attempts.
    pub retry_max: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            class: CLASS_BEST_EFFORT_ATOMIC.into(),
            parameters: BTreeMap::new(),
            retry_base: Duration::from_secs(60),
            retry_max: Duration::from_secs(1800),
        }
    }
}

impl Config {
    /// The wait after the `attempt`-th request failed.
    pub fn backoff(&self, attempt: u32) -> Duration {
        let shift = attempt.saturating_sub(1).min(20);
        self.retry_base
            .saturating_mul(1u32 << shift)
            .min(self.retry_max)
    }
}

#[cfg(test)]
mod tests;

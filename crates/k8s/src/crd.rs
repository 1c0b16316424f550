//! gpusched's custom resources, API group `gpusched.io/v1alpha1`:
//! [`Queue`] (cluster-scoped) and [`PodGroup`] (namespaced). The CRD
//! manifests are generated from these types (`gpusched crds`).
//!
//! Resource amounts are Kubernetes quantity strings keyed by resource name
//! (`cpu`, `memory`, `nvidia.com/gpu`, any extended resource), exactly as in
//! a pod's `resources`, so users write what they already know.

use gpusched_core::GroupPhase;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::CustomResource;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// API group of gpusched's resources.
pub const GROUP: &str = "gpusched.io";
/// API version of gpusched's resources.
pub const VERSION: &str = "v1alpha1";

/// A queue of the queue tree: who gets how much of the cluster.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "gpusched.io",
    version = "v1alpha1",
    kind = "Queue",
    plural = "queues",
    shortname = "gq",
    status = "QueueStatus",
    printcolumn = r#"{"name":"Parent","type":"string","jsonPath":".spec.parent"}"#,
    printcolumn = r#"{"name":"Weight","type":"integer","jsonPath":".spec.weight"}"#,
    printcolumn = r#"{"name":"GPUs","type":"string","description":"GPUs allocated (whole + shares)","jsonPath":".status.allocatedGpus"}"#,
    printcolumn = r#"{"name":"Fair share","type":"string","description":"GPUs deserved now","jsonPath":".status.fairShareGpus"}"#,
    printcolumn = r#"{"name":"Pending","type":"integer","jsonPath":".status.pendingPods"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","description":"False when the scheduler cannot use the spec (the condition's message says why)","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A queue of gpusched's queue tree (queues.gpusched.io; `kubectl get queues.gpusched.io` where Volcano's queues also exist): what share of the cluster its pods get. Pods join with the label gpusched.io/queue; pods naming none are in the queue `default`."
)]
#[x_kube(validation = "!has(self.parent) || self.parent != ''")]
#[serde(rename_all = "camelCase")]
pub struct QueueSpec {
    /// Parent queue; absent for a top-level queue.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    /// Weight among siblings for fair share (1 to 1,000,000; default 1).
    #[serde(default = "one")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub weight: u32,
    /// Resources deserved even under contention (`cpu`, `memory`,
    /// `nvidia.com/gpu`, extended resources).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, isQuantity(self[k]) && !quantity(self[k]).isLessThan(quantity('0')))").message("every value must be a non-negative quantity, e.g. \"4\", \"500m\", \"64Gi\""))]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 64}))]
    pub guaranteed: BTreeMap<String, String>,
    /// Guaranteed whole GPUs per GPU model (the `nvidia.com/gpu.product`
    /// label value); added to the GPU guarantee.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[x_kube(validation = Rule::new("self.all(k, isQuantity(self[k]) && !quantity(self[k]).isLessThan(quantity('0')))").message("every value must be a non-negative quantity, e.g. \"4\", \"500m\", \"64Gi\""))]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 64}))]
    pub guaranteed_gpus_by_model: BTreeMap<String, String>,
    /// Hard cap on each resource it names (e.g. `nvidia.com/gpu: "16"`);
    /// resources it does not name are not capped; absent: no cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self.all(k, isQuantity(self[k]) && !quantity(self[k]).isLessThan(quantity('0')))").message("every value must be a non-negative quantity, e.g. \"4\", \"500m\", \"64Gi\""))]
    #[schemars(extend("maxProperties" = 64, "additionalProperties" = {"type": "string", "maxLength": 64}))]
    pub limit: Option<BTreeMap<String, String>>,
    /// May the queue use more than its guarantee while others are idle?
    #[serde(default = "yes")]
    pub borrow: bool,
    /// May what it borrowed be taken back by reclaim?
    #[serde(default = "yes")]
    pub reclaimable: bool,
    /// May consolidation move its pods (each is deleted and recreated by
    /// its controller) to make room for a pending pod of equal or higher
    /// priority? As if every pod of the queue had the label
    /// `gpusched.io/movable: "true"`. Default false.
    #[serde(default)]
    pub movable: bool,
    /// Seconds a pod of the queue (or of its children, unless they set
    /// their own) runs before it may be preempted or reclaimed; absent:
    /// the parent's, else the scheduler configuration's
    /// (`actions.min_runtime_ms`, default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31_536_000))]
    pub min_runtime_seconds: Option<u64>,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// What the scheduler observed of a queue.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueStatus {
    /// Resources held by the queue's running pods (its subtree's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub allocated: BTreeMap<String, String>,
    /// Resources the queue deserves now (hierarchical weighted fair share).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fair_share: BTreeMap<String, String>,
    /// GPUs allocated, as a decimal (shares count as fractions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_gpus: Option<String>,
    /// GPUs deserved now, as a decimal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share_gpus: Option<String>,
    /// Pods of this queue waiting to be scheduled.
    #[serde(default)]
    pub pending_pods: u32,
    /// Those pods by why they wait (the reasons of the PodGroup `Scheduled`
    /// condition: `QueueQuota`, `InsufficientGpus`, `GangIncomplete`, …).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub pending_by_reason: BTreeMap<String, u32>,
    /// `Valid` (False with a reason when the queue is misconfigured).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Topology level a pod group must (or should) fit in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum TopologyLevel {
    /// All members on one node.
    Node,
    /// All members in one NVLink domain.
    NvlinkDomain,
    /// All members in one rack (`gpusched.io/rack`).
    Rack,
    /// All members in one block (`gpusched.io/block`).
    Block,
}

/// Whether a topology constraint may be relaxed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TopologyMode {
    /// Never place across the level.
    #[default]
    Required,
    /// Try the level first, then relax.
    Preferred,
}

/// A pod group's topology constraint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpec {
    /// The level all members must share.
    pub level: TopologyLevel,
    /// `Required` (default) or `Preferred`.
    #[serde(default)]
    pub mode: TopologyMode,
}

/// A gang: pods that start together or not at all.
#[derive(CustomResource, KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "gpusched.io",
    version = "v1alpha1",
    kind = "PodGroup",
    plural = "podgroups",
    shortname = "gpg",
    namespaced,
    status = "PodGroupStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Min","type":"integer","jsonPath":".spec.minMember"}"#,
    printcolumn = r#"{"name":"Scheduled","type":"integer","jsonPath":".status.scheduled"}"#,
    printcolumn = r#"{"name":"Running","type":"integer","jsonPath":".status.running"}"#,
    printcolumn = r#"{"name":"Queue","type":"string","jsonPath":".spec.queue"}"#,
    printcolumn = r#"{"name":"Valid","type":"string","description":"False when the scheduler cannot use the spec (the condition's message says why)","jsonPath":".status.conditions[?(@.type==\"Valid\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A gang of gpusched (podgroups.gpusched.io): pods labelled gpusched.io/pod-group with its name start together (at least minMember of them) or not at all."
)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupSpec {
    /// Members that must be placed together (1 to 100,000).
    #[schemars(range(min = 1, max = 100_000))]
    pub min_member: u32,
    /// Queue of the group (else the members' `gpusched.io/queue` label, else
    /// the default queue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue: Option<String>,
    /// Priority of the whole group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority_class_name: Option<String>,
    /// Topology all members must (or should) share.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<TopologySpec>,
    /// Give up after this many seconds without starting (members get a
    /// `FailedScheduling` event and the group phase `TimedOut`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 31_536_000))]
    pub schedule_timeout_seconds: Option<u64>,
}

/// What the scheduler observed of a pod group.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodGroupStatus {
    /// The core's phase: `Pending` (fewer than minMember members exist),
    /// `Inqueue` (enough exist, waiting for capacity), `Running`
    /// (minMember placed), `TimedOut`. A group whose spec is invalid stays
    /// `Pending` with the `Valid` condition False.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient_phase"
    )]
    #[schemars(schema_with = "phase_schema")]
    pub phase: Option<GroupPhase>,
    /// Members bound to a node.
    #[serde(default)]
    pub scheduled: u32,
    /// Members running.
    #[serde(default)]
    pub running: u32,
    /// The `Valid` condition (False with the reason when the spec is unusable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

/// Every phase of the core, in order (a new variant fails to compile here
/// until it is listed).
pub fn group_phases() -> [GroupPhase; 4] {
    use GroupPhase::*;
    let _every_variant_listed = |p: GroupPhase| match p {
        Pending | Inqueue | Running | TimedOut => (),
    };
    [Pending, Inqueue, Running, TimedOut]
}

/// The name of a phase as written in `status.phase`.
pub fn phase_name(p: GroupPhase) -> &'static str {
    match p {
        GroupPhase::Pending => "Pending",
        GroupPhase::Inqueue => "Inqueue",
        GroupPhase::Running => "Running",
        GroupPhase::TimedOut => "TimedOut",
    }
}

/// Reads `status.phase`; a value this version does not know (e.g. the
/// `Invalid` older versions wrote) reads as absent, so the status writer
/// replaces it instead of the watch failing on the whole object.
fn lenient_phase<'de, D>(d: D) -> Result<Option<GroupPhase>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    let s: Option<String> = Option::deserialize(d)?;
    Ok(s.and_then(|s| group_phases().into_iter().find(|p| phase_name(*p) == s)))
}

fn phase_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let names: Vec<&str> = group_phases().into_iter().map(phase_name).collect();
    schemars::json_schema!({"type": "string", "enum": names, "nullable": true})
}

/// The scheduler-plugins PodGroup (`scheduling.x-k8s.io/v1alpha1`), accepted
/// so clusters can migrate without rewriting their manifests. gpusched reads
/// `minMember` and `scheduleTimeoutSeconds`; the chart installs this CRD
/// only on request (`schedulerPluginsPodGroupCrd: true`), for clusters
/// without scheduler-plugins. The schema is ours, with the upstream field
/// names, so existing manifests apply.
#[derive(CustomResource, Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "scheduling.x-k8s.io",
    version = "v1alpha1",
    kind = "PodGroup",
    root = "SpPodGroup",
    plural = "podgroups",
    shortname = "pg",
    namespaced,
    status = "SpPodGroupStatus",
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"MinMember","type":"integer","jsonPath":".spec.minMember"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A gang in the scheduler-plugins (coscheduling) vocabulary: pods labelled scheduling.x-k8s.io/pod-group with its name start together (at least minMember) or not at all. gpusched honours minMember and scheduleTimeoutSeconds."
)]
#[serde(rename_all = "camelCase")]
pub struct SpPodGroupSpec {
    /// Members that must be placed together.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub min_member: i32,
    /// Resources the whole group needs before any member starts (read by
    /// scheduler-plugins; gpusched does not use it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_resources:
        Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
    /// Give up after this many seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub schedule_timeout_seconds: Option<i32>,
}

/// Status fields of the scheduler-plugins PodGroup (written by its
/// controller; gpusched writes none of them).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SpPodGroupStatus {
    /// Pending, PreScheduling, Scheduling, Scheduled, Running, Finished or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// The owner of the group's pods (`namespace/name` of their controller).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub occupied_by: Option<String>,
    /// Members running.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<i32>,
    /// Members succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub succeeded: Option<i32>,
    /// Members failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<i32>,
    /// When scheduling of the group began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule_start_time: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>,
}

/// The optional scheduler-plugins PodGroup CRD as YAML (the chart's
/// `schedulerPluginsPodGroupCrd` template carries exactly this).
/// Helm keeps it on uninstall (deleting a CRD deletes every PodGroup).
pub fn sp_crd_yaml() -> Result<String, serde_saphyr::ser::Error> {
    use kube::CustomResourceExt;
    let mut crd = SpPodGroup::crd();
    crd.metadata.annotations = Some(BTreeMap::from([(
        "helm.sh/resource-policy".to_string(),
        "keep".to_string(),
    )]));
    serde_saphyr::to_string(&crd)
}

/// The CRDs of gpusched's resources (Queue, PodGroup), as installed.
pub fn crds() -> Vec<CustomResourceDefinition> {
    use kube::CustomResourceExt;
    vec![
        openapi_formats(Queue::crd()),
        openapi_formats(PodGroup::crd()),
    ]
}

/// The schema generator writes `format: uint32`/`uint64` for unsigned
/// integers; Kubernetes knows `int32`/`int64` only and warns about the
/// others on every apply (`unrecognized format "uint64"`). Unsigned
/// fields already carry `minimum: 0`, so the signed format of the next
/// width up (int64) keeps their range.
fn openapi_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    fn walk(v: &mut serde_json::Value) {
        match v {
            serde_json::Value::Object(m) => {
                if let Some(serde_json::Value::String(f)) = m.get("format")
                    && f.starts_with("uint")
                {
                    m.insert("format".into(), "int64".into());
                }
                m.values_mut().for_each(walk);
            }
            serde_json::Value::Array(a) => a.iter_mut().for_each(walk),
            _ => {}
        }
    }
    let Ok(mut v) = serde_json::to_value(&crd) else {
        return crd;
    };
    walk(&mut v);
    serde_json::from_value(v).unwrap_or(crd)
}

/// The CRD manifests of gpusched's resources, as one YAML stream.
pub fn crds_yaml() -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for crd in crds() {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(&crd)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crds_have_printer_columns_and_validation() {
        let q = serde_json::to_string(&Queue::crd()).unwrap();
        assert!(q.contains("\"scope\":\"Cluster\""), "{q}");
        assert!(q.contains("additionalPrinterColumns"));
        assert!(q.contains("x-kubernetes-validations"));
        let pg = serde_json::to_string(&PodGroup::crd()).unwrap();
        assert!(pg.contains("\"scope\":\"Namespaced\""));
        assert!(pg.contains("\"minimum\":1"), "{pg}");
        for crd in [&q, &pg] {
            assert!(
                crd.contains(r#"{"description":"False when the scheduler cannot use the spec (the condition's message says why)","jsonPath":".status.conditions[?(@.type==\"Valid\")].status","name":"Valid","type":"string"}"#),
                "{crd}"
            );
            assert!(!crd.contains("Auto-generated"), "{crd}");
        }
        let y = crds_yaml().unwrap();
        assert!(y.contains("name: queues.gpusched.io"), "{y}");
        // only formats Kubernetes knows (no apply warnings)
        assert!(!y.contains("format: uint"), "{y}");
        assert!(y.contains("format: int64"), "{y}");
        assert!(y.contains("name: podgroups.gpusched.io"));
    }

    #[test]
    fn group_phase_is_the_cores_and_unknown_values_read_as_absent() {
        for p in group_phases() {
            let st = PodGroupStatus {
                phase: Some(p),
                ..Default::default()
            };
            let v = serde_json::to_value(&st).unwrap();
            assert_eq!(v["phase"], phase_name(p), "{v}");
            let back: PodGroupStatus = serde_json::from_value(v).unwrap();
            assert_eq!(back, st);
        }
        // written by older versions: must not break the PodGroup watch
        let old: PodGroupStatus =
            serde_json::from_str(r#"{"phase": "Invalid", "scheduled": 2}"#).unwrap();
        assert_eq!((old.phase, old.scheduled), (None, 2));
        let none: PodGroupStatus = serde_json::from_str(r#"{"phase": null}"#).unwrap();
        assert_eq!(none.phase, None);
        let pg = serde_json::to_value(PodGroup::crd()).unwrap();
        let phase = &pg["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
            ["properties"]["phase"];
        assert_eq!(
            phase["enum"],
            serde_json::json!(["Pending", "Inqueue", "Running", "TimedOut"]),
            "{phase}"
        );
    }

    #[test]
    fn queue_defaults() {
        let q: QueueSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(q.weight, 1);
        assert!(q.borrow && q.reclaimable);
    }
}

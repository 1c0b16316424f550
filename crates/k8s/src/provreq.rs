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

use crate::exec::events::{Event, EventType, Recorder};
use crate::watch::Shared;
use crate::world::Built;
use futures::StreamExt;
use gpusched_core::{CycleOutput, Decision, PodId};
use gpusched_plugins::classify::PendingClass;
use k8s_openapi::api::core::v1::{Node, Pod, PodSpec, PodTemplate, PodTemplateSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{DeleteParams, ListParams, Patch};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, CustomResource, Resource, ResourceExt};
use serde::{Deserialize, Serialize};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch as tokio_watch;

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

/// Why a gang's pending members wait, as far as requests are concerned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Blocked {
    /// Every pending member reads `Unschedulable`: more nodes would let
    /// the gang run.
    Capacity,
    /// gpusched itself holds the gang (its quota, an incomplete gang, …):
    /// the `PodScheduled` reason that says so.
    Held(String),
    /// It fits now, or waits for nodes being freed or provisioned for it.
    Waiting,
}

/// A pending member of a gang.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Member {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.name`.
    pub name: String,
}

/// A gang with pending members, as the last cycle saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GangState {
    /// Its namespace.
    pub namespace: String,
    /// Why it waits.
    pub blocked: Blocked,
    /// Its pending members, by name.
    pub pending: Vec<Member>,
}

/// The gangs with pending members of one cycle, by group name
/// (`namespace/…`). Pods bound by the cycle are not pending; a gang none
/// of whose members is pending is absent (it runs, or is gone).
pub fn gangs(
    built: &Built,
    out: &CycleOutput,
    classes: &BTreeMap<PodId, Vec<PendingClass>>,
) -> BTreeMap<String, GangState> {
    let bound: BTreeSet<PodId> = out
        .decisions
        .iter()
        .filter_map(|d| match d {
            Decision::Bind { pod, .. } => Some(*pod),
            _ => None,
        })
        .collect();
    let mut reasons: BTreeMap<String, (String, BTreeSet<&'static str>, Vec<Member>)> =
        BTreeMap::new();
    for e in &out.explanations {
        if bound.contains(&e.pod) {
            continue;
        }
        let (Some(ps), Some(pr)) = (
            built.snapshot.pods.get(e.pod as usize),
            built.pods.get(e.pod as usize),
        ) else {
            continue;
        };
        let Some(group) = ps.pod.group.as_ref() else {
            continue;
        };
        if !ps.is_pending() {
            continue;
        }
        let cls = classes.get(&e.pod).map(Vec::as_slice).unwrap_or(&[]);
        let reason = gpusched_plugins::classify::condition_reason(e, cls);
        let entry = reasons
            .entry(group.clone())
            .or_insert_with(|| (pr.namespace.clone(), BTreeSet::new(), Vec::new()));
        entry.1.insert(reason);
        entry.2.push(Member {
            uid: pr.uid.clone(),
            name: pr.name.clone(),
        });
    }
    reasons
        .into_iter()
        .map(|(g, (namespace, rs, mut pending))| {
            pending.sort();
            let waiting = [
                PendingClass::WaitingForNode.condition_reason(),
                PendingClass::FitsNow.condition_reason(),
            ];
            let held = rs
                .iter()
                .find(|r| **r != "Unschedulable" && !waiting.contains(r));
            let blocked = match held {
                Some(r) => Blocked::Held((*r).to_string()),
                None if rs.iter().all(|r| *r == "Unschedulable") => Blocked::Capacity,
                None => Blocked::Waiting,
            };
            (
                g,
                GangState {
                    namespace,
                    blocked,
                    pending,
                },
            )
        })
        .collect()
}

/// Where a request stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PrPhase {
    /// Not answered yet (or `Accepted`).
    Waiting,
    /// `Provisioned=True`: the capacity is there (booked for the gang).
    Provisioned,
    /// `Failed`, `BookingExpired` or `CapacityRevoked` is `True`: this
    /// request will not (or no longer) give the gang capacity.
    Failed {
        /// Which of the three.
        condition: String,
        /// Its reason and message.
        why: String,
        /// When it became true (Unix ms; 0 when not given).
        at_ms: u64,
    },
}

/// A request gpusched wrote for a gang.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PrState {
    /// Its name.
    pub name: String,
    /// Its attempt number (1 for the first request of the gang).
    pub attempt: u32,
    /// Its creation (Unix ms).
    pub created_ms: u64,
    /// What the autoscaler says.
    pub phase: PrPhase,
}

fn rfc3339_ms(s: &str) -> Option<u64> {
    s.parse::<k8s_openapi::jiff::Timestamp>()
        .ok()
        .and_then(|t| u64::try_from(t.as_millisecond()).ok())
}

/// The phase of a request from its conditions. A failure condition wins
/// over `Provisioned` (a booking that expired was provisioned first).
pub fn phase(status: Option<&ProvisioningRequestStatus>) -> PrPhase {
    let conds = status.and_then(|s| s.conditions.as_deref()).unwrap_or(&[]);
    let is_true = |t: &str| conds.iter().find(|c| c.type_ == t && c.status == "True");
    for t in ["Failed", "CapacityRevoked", "BookingExpired"] {
        if let Some(c) = is_true(t) {
            let why = match (c.reason.as_deref(), c.message.as_deref()) {
                (Some(r), Some(m)) if !m.is_empty() => format!("{r}: {m}"),
                (Some(r), _) => r.to_string(),
                (None, Some(m)) => m.to_string(),
                (None, None) => String::new(),
            };
            return PrPhase::Failed {
                condition: t.to_string(),
                why,
                at_ms: c
                    .last_transition_time
                    .as_deref()
                    .and_then(rfc3339_ms)
                    .unwrap_or(0),
            };
        }
    }
    if is_true("Provisioned").is_some() {
        PrPhase::Provisioned
    } else {
        PrPhase::Waiting
    }
}

/// The gang a request of ours is for, and its state (`None`: not one of
/// ours, or its annotations are unreadable).
pub fn pr_state(pr: &ProvisioningRequest) -> Option<(String, PrState)> {
    let ann = pr.metadata.annotations.as_ref()?;
    let gang = ann.get(ANNOTATION_GANG)?.clone();
    let attempt = ann.get(ANNOTATION_ATTEMPT)?.parse().ok()?;
    let created_ms = pr
        .metadata
        .creation_timestamp
        .as_ref()
        .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
        .unwrap_or(0);
    Some((
        gang,
        PrState {
            name: pr.metadata.name.clone()?,
            attempt,
            created_ms,
            phase: phase(pr.status.as_ref()),
        },
    ))
}

/// What to do next for a gang (after the deletions of its [`Plan`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Next {
    /// Nothing: no request wanted, none to watch.
    Nothing,
    /// Write request number `attempt` for the gang.
    Create {
        /// Its attempt number.
        attempt: u32,
    },
    /// The request is pending: the members wait for it.
    Pending {
        /// Its name.
        pr: String,
    },
    /// The request is provisioned: reserve the nodes that came for it.
    Reserve {
        /// Its name.
        pr: String,
        /// Its creation (Unix ms): nodes created since came for it.
        since_ms: u64,
    },
    /// The request failed; a new one is written at `until_ms`.
    Backoff {
        /// Its name.
        pr: String,
        /// What failed and why.
        why: String,
        /// When the next attempt is made (Unix ms).
        until_ms: u64,
    },
}

/// A gang's plan: requests to delete (with why), then [`Next`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Requests to delete, and why.
    pub delete: Vec<(String, String)>,
    /// What then.
    pub next: Next,
}

/// The plan for one gang: `gang` is what the last cycle said of it
/// (`None`: no member pending — it runs or is gone), `prs` the requests
/// gpusched wrote for it. Pure.
///
/// - No member pending, or gpusched holds the gang (quota, incomplete …):
///   every request is deleted; none is written.
/// - Capacity-blocked and no request: request 1 is written.
/// - The newest request pending → the members wait for it; provisioned →
///   its nodes are reserved for the gang; failed (`Failed`,
///   `BookingExpired`, `CapacityRevoked`) → kept (its status says why)
///   until the backoff of its attempt has passed, then replaced by the
///   next attempt if the gang still needs capacity.
/// - Older requests than the newest are deleted.
pub fn decide(gang: Option<&GangState>, prs: &[PrState], now_ms: u64, cfg: &Config) -> Plan {
    let mut delete = Vec::new();
    let newest = prs.iter().max_by_key(|p| (p.attempt, &p.name));
    for p in prs {
        if newest.is_some_and(|n| n.name != p.name) {
            delete.push((p.name.clone(), "superseded by a newer request".to_string()));
        }
    }
    let reason = match gang {
        None => Some("the gang has no pending member (it runs, or is gone)".to_string()),
        Some(GangState {
            blocked: Blocked::Held(r),
            ..
        }) => Some(format!(
            "gpusched holds the gang ({r}): new nodes would not start it"
        )),
        Some(_) => None,
    };
    if let Some(why) = reason {
        if let Some(n) = newest {
            delete.push((n.name.clone(), why));
        }
        return Plan {
            delete,
            next: Next::Nothing,
        };
    }
    let blocked = gang.map(|g| &g.blocked);
    let next = match newest {
        None if blocked == Some(&Blocked::Capacity) => Next::Create { attempt: 1 },
        None => Next::Nothing,
        Some(n) => match &n.phase {
            PrPhase::Waiting => Next::Pending { pr: n.name.clone() },
            PrPhase::Provisioned => Next::Reserve {
                pr: n.name.clone(),
                since_ms: n.created_ms,
            },
            PrPhase::Failed {
                condition,
                why,
                at_ms,
            } => {
                let until_ms = at_ms.saturating_add(cfg.backoff(n.attempt).as_millis() as u64);
                let why = if why.is_empty() {
                    condition.clone()
                } else {
                    format!("{condition} ({why})")
                };
                if now_ms < until_ms {
                    Next::Backoff {
                        pr: n.name.clone(),
                        why,
                        until_ms,
                    }
                } else if blocked == Some(&Blocked::Capacity) {
                    delete.push((n.name.clone(), format!("{why}; replaced by a new request")));
                    Next::Create {
                        attempt: n.attempt + 1,
                    }
                } else {
                    Next::Backoff {
                        pr: n.name.clone(),
                        why,
                        until_ms,
                    }
                }
            }
        },
    };
    Plan { delete, next }
}

/// A stable 32-bit FNV-1a hash, for names.
fn fnv(s: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in s.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

/// The name of request `attempt` of a gang: `gpusched-<gang>-<hash>-<n>`
/// (the gang's name made a DNS label, clipped; the hash keeps clipped or
/// folded names apart).
pub fn pr_name(gang: &str, attempt: u32) -> String {
    let base = gang.split_once('/').map_or(gang, |(_, n)| n);
    let mut slug = String::new();
    for c in base.chars() {
        let c = c.to_ascii_lowercase();
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            slug.push(c);
        } else if !slug.ends_with('-') {
            slug.push('-');
        }
    }
    let slug: String = slug.trim_matches('-').chars().take(40).collect();
    let slug = slug.trim_end_matches('-');
    if slug.is_empty() {
        format!("gpusched-{:08x}-{attempt}", fnv(gang))
    } else {
        format!("gpusched-{slug}-{:08x}-{attempt}", fnv(gang))
    }
}

/// Labels of a pod that name that one pod (left out of templates).
const POD_LABELS: &[&str] = &[
    "controller-revision-hash",
    "pod-template-hash",
    "statefulset.kubernetes.io/pod-name",
    "apps.kubernetes.io/pod-index",
    "batch.kubernetes.io/job-completion-index",
    "jobset.sigs.k8s.io/job-index",
    "leaderworkerset.sigs.k8s.io/worker-index",
];

/// What of a pod the autoscaler's scheduling simulation reads: requests,
/// node selection, tolerations, spread and priority (names, images, env
/// and per-pod labels left out, so members of one shape count together).
fn shape(p: &Pod) -> Result<PodTemplateSpec, String> {
    let name = p.metadata.name.as_deref().unwrap_or_default();
    let spec = p
        .spec
        .as_ref()
        .ok_or_else(|| format!("pod {name} has no spec"))?;
    let container =
        |c: &k8s_openapi::api::core::v1::Container| k8s_openapi::api::core::v1::Container {
            name: c.name.clone(),
            image: c.image.clone(),
            resources: c.resources.clone(),
            ports: c.ports.clone(),
            restart_policy: c.restart_policy.clone(),
            ..Default::default()
        };
    let init = spec
        .init_containers
        .as_ref()
        .map(|v| v.iter().map(container).collect());
    let labels: BTreeMap<String, String> = p
        .metadata
        .labels
        .iter()
        .flatten()
        .filter(|(k, _)| !POD_LABELS.contains(&k.as_str()))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    Ok(PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: (!labels.is_empty()).then_some(labels),
            ..Default::default()
        }),
        spec: Some(PodSpec {
            containers: spec.containers.iter().map(container).collect(),
            init_containers: init,
            node_selector: spec.node_selector.clone(),
            affinity: spec.affinity.clone(),
            tolerations: spec.tolerations.clone(),
            topology_spread_constraints: spec.topology_spread_constraints.clone(),
            priority_class_name: spec.priority_class_name.clone(),
            priority: spec.priority,
            overhead: spec.overhead.clone(),
            runtime_class_name: spec.runtime_class_name.clone(),
            ..Default::default()
        }),
    })
}

/// The pod sets of a gang: one template per distinct shape (in the order
/// first seen) and how many members have it. Errors when a member has no
/// spec or there are more than [`MAX_POD_SETS`] shapes.
pub fn pod_sets(pods: &[Pod]) -> Result<Vec<(PodTemplateSpec, i32)>, String> {
    let mut out: Vec<(PodTemplateSpec, i32)> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    for p in pods {
        let t = shape(p)?;
        // the shape is the spec (labels of the first member of a shape
        // are kept, not compared)
        let key = serde_json::to_string(&t.spec).map_err(|e| e.to_string())?;
        match index.get(&key) {
            Some(&i) => out[i].1 += 1,
            None => {
                index.insert(key, out.len());
                out.push((t, 1));
            }
        }
    }
    if out.len() > MAX_POD_SETS {
        return Err(format!(
            "the gang's members have {} distinct shapes (requests, selectors, tolerations); a ProvisioningRequest holds at most {MAX_POD_SETS}",
            out.len()
        ));
    }
    Ok(out)
}

/// Nodes that came for a request made at `since_ms`: created since (the
/// API's times have whole seconds, so from the start of that second),
/// Ready, by name.
pub fn new_nodes(nodes: &[Node], since_ms: u64) -> Vec<String> {
    let from = since_ms - since_ms % 1000;
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
                .is_some_and(|c| c >= from)
                && crate::translate::node_ready(n)
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    out.sort();
    out
}

/// The provisioned requests' reservations, kept in the world so a node
/// that registers for one is reserved for its gang in the same update
/// (before any cycle could give it to another pod). A reservation is a
/// nomination of a pending member to the node: the core then keeps the
/// node for the gang and tries the gang first in its queue. One node per
/// member at most (a pod has one nomination); extra nodes are not held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservations {
    gangs: BTreeMap<String, Reserved>,
}

/// One gang's reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Reserved {
    /// The request's creation (Unix ms).
    since_ms: u64,
    /// Pending members' uids, by name.
    members: Vec<String>,
    /// Nodes nominated so far, in order (the i-th to the i-th member).
    nodes: Vec<String>,
}

impl Reserved {
    fn nominate(&mut self, node: &str) -> Option<(String, String)> {
        if self.nodes.iter().any(|n| n == node) || self.nodes.len() >= self.members.len() {
            return None;
        }
        let uid = self.members[self.nodes.len()].clone();
        self.nodes.push(node.to_string());
        Some((uid, node.to_string()))
    }
}

impl Reservations {
    /// Reserves for `gang` (provisioned by a request made at `since_ms`)
    /// the `nodes` that came for it; returns the nominations to add
    /// (member uid, node). When the pending members changed, the nodes
    /// already held are handed to the members given, in order.
    pub fn reserve(
        &mut self,
        gang: &str,
        since_ms: u64,
        members: Vec<String>,
        nodes: &[String],
    ) -> Vec<(String, String)> {
        let r = self.gangs.entry(gang.to_string()).or_default();
        let mut held = Vec::new();
        if r.since_ms != since_ms || r.members != members {
            // the same request with other members pending (some bound):
            // the nodes it holds go to the members pending now
            if r.since_ms == since_ms {
                held = std::mem::take(&mut r.nodes);
            }
            *r = Reserved {
                since_ms,
                members,
                nodes: Vec::new(),
            };
        }
        held.iter()
            .chain(nodes)
            .filter_map(|n| r.nominate(n))
            .collect()
    }

    /// A node registered at `created_ms`: the nomination that reserves it
    /// for the first gang (by name) whose request was made before it and
    /// that has a member left without a node.
    pub fn on_new_node(&mut self, node: &str, created_ms: u64) -> Option<(String, String)> {
        self.gangs
            .values_mut()
            .filter(|r| r.since_ms - r.since_ms % 1000 <= created_ms)
            .find_map(|r| r.nominate(node))
    }

    /// Keeps only the reservations of `keep`; returns the uids whose
    /// nominations go.
    pub fn retain(&mut self, keep: &BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = self
            .gangs
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        let mut uids = Vec::new();
        for k in gone {
            if let Some(r) = self.gangs.remove(&k) {
                uids.extend(r.members.into_iter().take(r.nodes.len()));
            }
        }
        uids
    }
}

/// The gangs of the last status cycle, sent by the loop to [`run`].
pub type Gangs = Arc<BTreeMap<String, GangState>>;

/// Everything [`run`] needs.
pub struct Ctx {
    /// The scheduler's client.
    pub client: Client,
    /// What to write.
    pub config: Config,
    /// The world (nominations and the members' condition notes).
    pub shared: Shared,
    /// The gangs of each status cycle (`None` until the first).
    pub gangs: tokio_watch::Receiver<Option<Gangs>>,
    /// Leadership: only the leader writes.
    pub leading: tokio_watch::Receiver<bool>,
    /// The reporting instance for events.
    pub instance: String,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs the ProvisioningRequest side of the scheduler until dropped:
/// waits until `autoscaling.x-k8s.io/v1` serves `provisioningrequests`
/// (checking every [`crate::watch::OPTIONAL_RECHECK`]), then watches the
/// requests labelled [`LABEL_MANAGED_BY`]=[`MANAGED_BY`] and carries out
/// [`decide`]'s plans whenever the gangs or the requests change (and every
/// few seconds, for backoffs).
pub async fn run(mut ctx: Ctx) {
    let ar = kube::api::ApiResource::erase::<ProvisioningRequest>(&());
    let mut said = false;
    while !crate::watch::served(&ctx.client, &ar).await {
        if !said {
            tracing::info!(
                "autoscaling.x-k8s.io/v1 provisioningrequests is not served (CRD not installed): no ProvisioningRequests for gangs; checking again every {}s",
                crate::watch::OPTIONAL_RECHECK.as_secs()
            );
            said = true;
        }
        tokio::time::sleep(crate::watch::OPTIONAL_RECHECK).await;
    }
    tracing::info!(class = %ctx.config.class, "writing ProvisioningRequests for gangs that need nodes");
    let api: Api<ProvisioningRequest> = Api::all(ctx.client.clone());
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}"));
    let changed = Arc::new(tokio::sync::Notify::new());
    let notify = changed.clone();
    let stream = reflector(writer, watcher(api, cfg))
        .default_backoff()
        .touched_objects();
    let watch_task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Err(e) = ev {
                tracing::debug!("ProvisioningRequest watch: {e}");
            }
            notify.notify_one();
        }
    });
    let _guard = AbortOnDrop(watch_task);
    let recorder = Recorder::new(ctx.client.clone(), "gpusched", &ctx.instance);
    let mut state = RunState::default();
    loop {
        tokio::select! {
            r = ctx.gangs.changed() => if r.is_err() { return },
            _ = changed.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
        if !*ctx.leading.borrow() {
            continue;
        }
        let Some(gangs) = ctx.gangs.borrow().clone() else {
            continue;
        };
        if reader.wait_until_ready().await.is_err() {
            return;
        }
        let prs = reader.state();
        reconcile(&ctx, &recorder, &mut state, &gangs, &prs).await;
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// What [`run`] remembers between rounds.
#[derive(Default)]
struct RunState {
    /// (request, what) already reported by an event.
    reported: BTreeSet<(String, String)>,
    /// Provisioned requests whose existing nodes were listed (once: the
    /// nodes that register later are reserved by the world as they come).
    listed: BTreeSet<String>,
}

async fn reconcile(
    ctx: &Ctx,
    recorder: &Recorder,
    st: &mut RunState,
    gangs: &BTreeMap<String, GangState>,
    prs: &[Arc<ProvisioningRequest>],
) {
    let now = now_ms();
    let mut by_gang: BTreeMap<String, Vec<(PrState, Arc<ProvisioningRequest>)>> = BTreeMap::new();
    for pr in prs {
        if let Some((g, s)) = pr_state(pr) {
            by_gang.entry(g).or_default().push((s, pr.clone()));
        }
    }
    let keys: BTreeSet<&String> = gangs
        .keys()
        .filter(|k| gangs[*k].blocked != Blocked::Waiting || by_gang.contains_key(*k))
        .chain(by_gang.keys())
        .collect();
    let mut notes: BTreeMap<String, String> = BTreeMap::new();
    let mut nodes_cache: Option<Vec<Node>> = None;
    let mut keep_reserved: BTreeSet<String> = BTreeSet::new();
    for key in keys {
        let gang = gangs.get(key);
        let mine = by_gang.get(key).map(Vec::as_slice).unwrap_or(&[]);
        let states: Vec<PrState> = mine.iter().map(|(s, _)| s.clone()).collect();
        let plan = decide(gang, &states, now, &ctx.config);
        for (name, why) in &plan.delete {
            if let Some((_, pr)) = mine.iter().find(|(s, _)| &s.name == name) {
                delete(ctx, pr, why).await;
            }
        }
        let ns = gang
            .map(|g| g.namespace.clone())
            .or_else(|| mine.first().and_then(|(_, p)| p.namespace()))
            .unwrap_or_default();
        match plan.next {
            Next::Nothing => {}
            Next::Create { attempt } => {
                let Some(g) = gang else { continue };
                match create(ctx, key, g, attempt).await {
                    Ok(name) => {
                        let msg = format!(
                            "the gang {key} needs new nodes: ProvisioningRequest {ns}/{name} ({}) asks for all {} pending member(s) at once (attempt {attempt})",
                            ctx.config.class,
                            g.pending.len()
                        );
                        tracing::info!("{msg}");
                        event_members(
                            recorder,
                            g,
                            EventType::Normal,
                            "ProvisioningRequested",
                            &msg,
                        );
                        notes.insert(
                            key.clone(),
                            format!(
                                "waiting for ProvisioningRequest {ns}/{name} ({})",
                                ctx.config.class
                            ),
                        );
                    }
                    Err(e) => {
                        tracing::warn!("ProvisioningRequest for the gang {key}: {e}");
                        if st.reported.insert((pr_name(key, attempt), e.clone())) {
                            event_members(
                                recorder,
                                g,
                                EventType::Warning,
                                "ProvisioningRequestFailed",
                                &format!(
                                    "cannot write a ProvisioningRequest for the gang {key}: {e}"
                                ),
                            );
                        }
                    }
                }
            }
            Next::Pending { pr } => {
                notes.insert(
                    key.clone(),
                    format!(
                        "waiting for ProvisioningRequest {ns}/{pr} ({})",
                        ctx.config.class
                    ),
                );
            }
            Next::Reserve { pr, since_ms } => {
                notes.insert(
                    key.clone(),
                    format!("ProvisioningRequest {ns}/{pr} is provisioned: the new nodes are reserved for the gang"),
                );
                let Some(g) = gang else { continue };
                let first = !st.listed.contains(&pr);
                if first && nodes_cache.is_none() {
                    let api: Api<Node> = Api::all(ctx.client.clone());
                    match api.list(&ListParams::default()).await {
                        Ok(l) => nodes_cache = Some(l.items),
                        Err(e) => {
                            tracing::warn!("listing nodes for ProvisioningRequest {ns}/{pr}: {e}")
                        }
                    }
                }
                let nodes = match (&nodes_cache, first) {
                    (Some(all), true) => {
                        st.listed.insert(pr.clone());
                        new_nodes(all, since_ms)
                    }
                    _ => Vec::new(),
                };
                if st.reported.insert((pr.clone(), "Provisioned".into())) {
                    let msg = format!(
                        "ProvisioningRequest {ns}/{pr} is provisioned; the nodes that come for it are reserved for the gang {key} ({} there now)",
                        nodes.len()
                    );
                    tracing::info!("{msg}");
                    event_members(recorder, g, EventType::Normal, "Provisioned", &msg);
                }
                let uids = g.pending.iter().map(|m| m.uid.clone()).collect();
                keep_reserved.insert(key.clone());
                if ctx
                    .shared
                    .with(|w| w.reserve_provisioned(key, since_ms, uids, &nodes))
                {
                    ctx.shared.changed.notify_one();
                }
            }
            Next::Backoff { pr, why, until_ms } => {
                let secs = until_ms.saturating_sub(now).div_ceil(1000);
                // the note holds the time, not a countdown: it changes
                // only when the request does (a changed note rewrites the
                // members' conditions)
                let at = i64::try_from(until_ms)
                    .ok()
                    .and_then(|ms| k8s_openapi::jiff::Timestamp::from_millisecond(ms).ok())
                    .map_or_else(|| "later".to_string(), |t| format!("at {t:.0}"));
                let next = if gang.is_some_and(|g| g.blocked == Blocked::Capacity) {
                    format!("a new request {at}")
                } else {
                    "no new request while the gang does not need nodes".to_string()
                };
                notes.insert(
                    key.clone(),
                    format!("ProvisioningRequest {ns}/{pr} failed: {why}; {next}"),
                );
                if let Some(g) = gang
                    && st.reported.insert((pr.clone(), why.clone()))
                {
                    let msg = format!(
                        "ProvisioningRequest {ns}/{pr} for the gang {key} failed: {why}; a new request in {secs}s"
                    );
                    tracing::warn!("{msg}");
                    event_members(recorder, g, EventType::Warning, "ProvisioningFailed", &msg);
                }
            }
        }
    }
    // reservations of gangs whose request is no longer provisioned
    if ctx.shared.with(|w| w.retain_provisioned(&keep_reserved)) {
        ctx.shared.changed.notify_one();
    }
    let live: BTreeSet<String> = prs.iter().filter_map(|p| p.metadata.name.clone()).collect();
    st.reported.retain(|(pr, _)| live.contains(pr));
    st.listed.retain(|pr| live.contains(pr));
    let changed = ctx.shared.with(|w| w.set_provisioning_notes(notes));
    if changed {
        ctx.shared.changed.notify_one();
    }
}

fn event_members(recorder: &Recorder, g: &GangState, type_: EventType, reason: &str, note: &str) {
    for m in &g.pending {
        let ev = recorder.prepare(
            Event {
                type_,
                reason: reason.into(),
                action: "Provisioning".into(),
                note: note.into(),
            },
            crate::exec::pod_ref(&g.namespace, &m.name, &m.uid),
        );
        tokio::spawn(async move {
            if let Err(e) = ev.publish().await {
                tracing::debug!("event: {e}");
            }
        });
    }
}

/// Who owns a gang's request (and its templates), so the garbage
/// collector removes them with the gang: the gpusched PodGroup when the
/// gang is one, else the first member's controller (Job, JobSet's Job,
/// StatefulSet, …), else the members themselves (removed when all are).
async fn owners(client: &Client, key: &str, pods: &[Pod]) -> Vec<OwnerReference> {
    if let Some((ns, name)) = key.split_once('/')
        && !name.contains(':')
    {
        let api: Api<crate::crd::PodGroup> = Api::namespaced(client.clone(), ns);
        if let Ok(Some(g)) = api.get_opt(name).await
            && let Some(uid) = g.metadata.uid.clone()
        {
            return vec![OwnerReference {
                api_version: crate::crd::PodGroup::api_version(&()).into(),
                kind: "PodGroup".into(),
                name: name.into(),
                uid,
                ..Default::default()
            }];
        }
    }
    if let Some(o) = pods
        .first()
        .and_then(|p| p.metadata.owner_references.as_ref())
        .and_then(|os| os.iter().find(|o| o.controller == Some(true)))
    {
        return vec![OwnerReference {
            controller: None,
            block_owner_deletion: None,
            ..o.clone()
        }];
    }
    pods.iter()
        .filter_map(|p| {
            Some(OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: p.metadata.name.clone()?,
                uid: p.metadata.uid.clone()?,
                ..Default::default()
            })
        })
        .collect()
}

fn managed_meta(
    name: &str,
    ns: &str,
    gang: &str,
    attempt: u32,
    owners: &[OwnerReference],
) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        labels: Some(BTreeMap::from([(
            LABEL_MANAGED_BY.to_string(),
            MANAGED_BY.to_string(),
        )])),
        annotations: Some(BTreeMap::from([
            (ANNOTATION_GANG.to_string(), gang.to_string()),
            (ANNOTATION_ATTEMPT.to_string(), attempt.to_string()),
        ])),
        owner_references: (!owners.is_empty()).then(|| owners.to_vec()),
        ..Default::default()
    }
}

/// Writes request `attempt` for the gang: reads the pending members,
/// writes one PodTemplate per shape, then the request naming them, then
/// the consume annotation on each member. Returns the request's name.
async fn create(ctx: &Ctx, key: &str, g: &GangState, attempt: u32) -> Result<String, String> {
    let ns = &g.namespace;
    let pods_api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let mut pods = Vec::new();
    for m in &g.pending {
        match pods_api.get_opt(&m.name).await {
            Ok(Some(p)) if p.metadata.uid.as_deref() == Some(m.uid.as_str()) => pods.push(p),
            Ok(_) => {}
            Err(e) => return Err(format!("reading pod {ns}/{}: {e}", m.name)),
        }
    }
    if pods.is_empty() {
        return Err("its pending members are gone".into());
    }
    let sets = pod_sets(&pods)?;
    let owners = owners(&ctx.client, key, &pods).await;
    let name = pr_name(key, attempt);
    let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), ns);
    let mut pod_sets = Vec::new();
    for (i, (template, count)) in sets.into_iter().enumerate() {
        let tname = format!("{name}-{i}");
        let t = PodTemplate {
            metadata: managed_meta(&tname, ns, key, attempt, &owners),
            template: Some(template),
        };
        match templates.create(&crate::exec::post_params(), &t).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating PodTemplate {ns}/{tname}: {e}")),
        }
        pod_sets.push(PodSet {
            pod_template_ref: Reference { name: tname },
            count,
        });
    }
    let pr = ProvisioningRequest {
        metadata: managed_meta(&name, ns, key, attempt, &owners),
        spec: ProvisioningRequestSpec {
            pod_sets,
            provisioning_class_name: ctx.config.class.clone(),
            parameters: ctx.config.parameters.clone(),
        },
        status: None,
    };
    let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), ns);
    match api.create(&crate::exec::post_params(), &pr).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(format!("creating ProvisioningRequest {ns}/{name}: {e}")),
    }
    let patch = json!({"metadata": {"annotations": {
        ANNOTATION_CONSUME: name,
        ANNOTATION_CLASS: ctx.config.class,
    }}});
    for p in &pods {
        let Some(pname) = p.metadata.name.as_deref() else {
            continue;
        };
        if let Err(e) = pods_api
            .patch(pname, &crate::exec::patch_params(), &Patch::Merge(&patch))
            .await
        {
            tracing::warn!("annotating pod {ns}/{pname} with {ANNOTATION_CONSUME}: {e}");
        }
    }
    Ok(name)
}

/// Deletes a request and the PodTemplates it names.
async fn delete(ctx: &Ctx, pr: &ProvisioningRequest, why: &str) {
    let (Some(ns), Some(name)) = (
        pr.metadata.namespace.as_deref(),
        pr.metadata.name.as_deref(),
    ) else {
        return;
    };
    tracing::info!("deleting ProvisioningRequest {ns}/{name}: {why}");
    let api: Api<ProvisioningRequest> = Api::namespaced(ctx.client.clone(), ns);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => tracing::warn!("deleting ProvisioningRequest {ns}/{name}: {e}"),
    }
    let templates: Api<PodTemplate> = Api::namespaced(ctx.client.clone(), ns);
    for s in &pr.spec.pod_sets {
        match templates
            .delete(&s.pod_template_ref.name, &DeleteParams::background())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => tracing::warn!("deleting PodTemplate {ns}/{}: {e}", s.pod_template_ref.name),
        }
    }
}

#[cfg(test)]
mod tests;

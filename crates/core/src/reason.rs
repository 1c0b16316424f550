//! Typed reasons: why a pod is still pending, why a node does not take it,
//! why a pod is evicted, what is wrong with the queue tree.
//!
//! Reasons are data with their facts (queue, dimension, have/need, plugin).
//! They become text only at the edges (events, CLI, report) through their
//! [`Display`](std::fmt::Display) impls, which give kube-scheduler-shaped
//! phrases; [`crate::Explanation::message`] joins them into one message.
//! Nothing parses the text back.

use gpusched_model::{ResourceKind, TopologyLevel};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::fmt;

/// Why one node does not take a pod now (one entry of kube-scheduler's
/// `0/N nodes are available: …` list).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum NodeReason {
    /// A filter refused the node (static: labels, taints, GPU model …).
    Filter {
        /// [`crate::Filter::name`] of the filter that refused.
        plugin: Cow<'static, str>,
        /// Its phrase, e.g. `node(s) had untolerated taint(s)`.
        reason: Cow<'static, str>,
    },
    /// Not enough free of one resource (CPU, memory, extended, whole GPUs).
    Insufficient(ResourceKind),
    /// No single GPU with enough free compute/memory for a GPU share.
    InsufficientGpuShare,
    /// The pod would fit, but the node is reserved for another job.
    ReservedForOtherJob,
    /// Not enough free GPUs that the pod's DRA claims may take together:
    /// selectors that allow too few, or no `count` of one group (a
    /// `matchAttribute` constraint).
    ClaimGpus {
        /// The claim (`namespace/name`).
        claim: String,
        /// GPUs the pod needs.
        count: u32,
        /// The attributes its GPUs must share (empty: only selectors).
        attributes: Vec<String>,
        /// The attributes no two of its GPUs may share (`distinctAttribute`).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        distinct: Vec<String>,
    },
    /// The node has no GPU of a model the pod asks (`asked`); it has
    /// `has`. Said with both lists, so a typo or a wrong product name shows.
    NoGpuOfModel {
        /// The models the pod may run on.
        asked: Vec<String>,
        /// The node's models.
        has: Vec<String>,
    },
}

impl fmt::Display for NodeReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NodeReason::Filter { reason, .. } => f.write_str(reason),
            NodeReason::Insufficient(k) => write!(f, "Insufficient {k}"),
            NodeReason::InsufficientGpuShare => {
                f.write_str("Insufficient GPU share (no GPU with enough free compute/memory)")
            }
            NodeReason::ReservedForOtherJob => f.write_str("node(s) reserved for a waiting job"),
            NodeReason::ClaimGpus {
                claim,
                count,
                attributes,
                distinct,
            } => f.write_str(
                &gpusched_model::dra::ClaimGpus {
                    claim: claim.clone(),
                    attributes: attributes.clone(),
                    distinct: distinct.clone(),
                    ..Default::default()
                }
                .shortage(*count, true),
            ),
            NodeReason::NoGpuOfModel { asked, has } => write!(
                f,
                "node(s) had no GPU of the requested model(s) {} (they have {})",
                asked.join(", "),
                if has.is_empty() {
                    "none".to_string()
                } else {
                    has.join(", ")
                }
            ),
        }
    }
}

/// kube-scheduler's node summary: of `total` nodes none takes the pod;
/// how many nodes gave each reason (a node counts once per reason it has).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSummary {
    /// Nodes in the snapshot.
    pub total: u32,
    /// Reasons with their node counts, in the order they are rendered
    /// (by rendered text).
    pub counts: Vec<(NodeReason, u32)>,
    /// Of the nodes that pass the filters, the one closest to taking the
    /// pod's GPUs now (for "what would make it fit"); not rendered in the
    /// message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nearest: Option<NearestNode>,
}

/// The node that passes a pod's filters and has the most of what the pod's
/// GPU request needs free now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NearestNode {
    /// The node.
    pub node: String,
    /// Usable GPUs of an allowed model there that are completely free.
    pub free_gpus: u32,
    /// The most free milli-GPU on one usable, allowed GPU there.
    pub best_gpu_free_milli: u32,
}

impl fmt::Display for NodeSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0/{} nodes are available: ", self.total)?;
        for (i, (r, c)) in self.counts.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{c} {r}")?;
        }
        f.write_str(".")
    }
}

/// Which quota rule a placement would break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum QuotaRule {
    /// The queue's `limit`.
    Limit,
    /// A queue that may not borrow is capped at its guarantee.
    NoBorrow,
}

/// A placement would break a quota of `queue` (the job's queue or an
/// ancestor) on one dimension.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaViolation {
    /// The queue whose rule is broken.
    pub queue: String,
    /// The broken rule.
    pub rule: QuotaRule,
    /// The dimension.
    pub dimension: ResourceKind,
    /// What the queue would use with the job.
    pub would_use: u64,
    /// The limit or guarantee.
    pub cap: u64,
    /// What the job alone asks on the dimension (more than `cap`: it can
    /// never fit, whatever the queue frees).
    #[serde(default)]
    pub needs: u64,
}

impl QuotaViolation {
    /// The job alone asks more than the cap: it never fits while the
    /// queue's limit (or guarantee) stays as it is.
    pub fn never(&self) -> bool {
        self.needs > self.cap
    }
}

impl fmt::Display for QuotaViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use crate::report::amount_text;
        let what = match self.rule {
            QuotaRule::Limit => "limit",
            QuotaRule::NoBorrow => "guarantee (it may not borrow)",
        };
        if self.never() {
            return write!(
                f,
                "queue {:?}'s {what} on {} is {} and the job alone asks {}: it never fits until the {what} is raised",
                self.queue,
                self.dimension,
                amount_text(&self.dimension, self.cap),
                amount_text(&self.dimension, self.needs)
            );
        }
        write!(
            f,
            "queue {:?} would exceed its {what} on {} ({} of {})",
            self.queue,
            self.dimension,
            amount_text(&self.dimension, self.would_use),
            amount_text(&self.dimension, self.cap)
        )
    }
}

/// Why a pod is still pending beyond (or instead of) the node summary:
/// queue, quota, gang, topology and reservation reasons.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum PendingReason {
    /// No node takes the pod now (kube-scheduler's summary).
    Nodes(NodeSummary),
    /// The pod's queue is not defined.
    QueueMissing {
        /// The queue the pod names.
        queue: String,
    },
    /// The pod's pod group is not defined.
    GroupMissing {
        /// The group the pod names.
        group: String,
    },
    /// The pod group's queue is not defined.
    GroupQueueMissing {
        /// The pod group.
        group: String,
        /// The queue it names.
        queue: String,
    },
    /// The pod group gave up after its schedule timeout.
    GangTimedOut {
        /// The pod group.
        group: String,
        /// Its schedule timeout.
        after_ms: u64,
    },
    /// Fewer than `minMember` pods of the group exist yet.
    GangIncomplete {
        /// The pod group.
        group: String,
        /// Members that exist (running and pending).
        have: u32,
        /// Its `minMember`.
        need: u32,
    },
    /// Only `fit` of the `need` pods that must start together fit now.
    GangShort {
        /// The pod group.
        group: String,
        /// Members that fit now.
        fit: u32,
        /// Members that must start together.
        need: u32,
    },
    /// The gang can never start as written: even with every node empty,
    /// at most `most` of its `count` required members asking `gpus` whole
    /// GPUs each fit (the nodes that pass their filters, each holding as
    /// many such members as it has usable GPUs for) — a gang's
    /// "Unresolvable", as a pod bigger than any node is.
    GangNeverFits {
        /// The pod group.
        group: String,
        /// Members that must start together.
        need: u32,
        /// Those of them that ask `gpus` GPUs each.
        count: u32,
        /// GPUs each of those asks.
        gpus: u32,
        /// The most of those the cluster can ever hold at once.
        most: u32,
    },
    /// No topology domain of `level` can hold the gang's `need` pods.
    NoTopologyDomain {
        /// The pod group.
        group: String,
        /// The level of its topology constraint.
        level: TopologyLevel,
        /// Members that must fit in one domain.
        need: u32,
        /// Whether the constraint is required (else preferred).
        required: bool,
    },
    /// Placing the job would break a queue limit or no-borrow rule.
    Quota(QuotaViolation),
    /// The job waited past the reservation threshold; `node` is reserved
    /// for it and drains.
    Reserved {
        /// The reserved node.
        node: String,
    },
    /// Victims were evicted for the pod; it waits for them to go on `node`.
    VictimsTerminating {
        /// Pods evicted for it.
        victims: u32,
        /// The node it is nominated to.
        node: String,
    },
    /// Fits once pods already terminating on `node` are gone; waits there.
    TerminatingPods {
        /// The node it is nominated to.
        node: String,
    },
    /// Nominated to a node; waiting for capacity there.
    Nominated,
    /// Consolidation moved `moved` pod(s) off `node` to make room for it;
    /// it waits for them to leave.
    PodsMoving {
        /// Pods moved for it.
        moved: u32,
        /// The node it is nominated to.
        node: String,
    },
    /// The snapshot puts a pod where it does not fit.
    SnapshotInconsistent {
        /// What is inconsistent.
        error: String,
    },
}

impl PendingReason {
    /// A stable short label of the kind of reason (for counting pending
    /// pods by reason in reports and metrics).
    pub fn label(&self) -> &'static str {
        match self {
            PendingReason::Nodes(_) => "NoNodeFits",
            PendingReason::QueueMissing { .. } => "QueueMissing",
            PendingReason::GroupMissing { .. } => "GroupMissing",
            PendingReason::GroupQueueMissing { .. } => "GroupQueueMissing",
            PendingReason::GangTimedOut { .. } => "GangTimedOut",
            PendingReason::GangIncomplete { .. } => "GangIncomplete",
            PendingReason::GangShort { .. } => "GangShort",
            PendingReason::GangNeverFits { .. } => "GangNeverFits",
            PendingReason::NoTopologyDomain { .. } => "NoTopologyDomain",
            PendingReason::Quota(_) => "Quota",
            PendingReason::Reserved { .. } => "Reserved",
            PendingReason::VictimsTerminating { .. } => "VictimsTerminating",
            PendingReason::TerminatingPods { .. } => "TerminatingPods",
            PendingReason::PodsMoving { .. } => "PodsMoving",
            PendingReason::Nominated => "Nominated",
            PendingReason::SnapshotInconsistent { .. } => "SnapshotInconsistent",
        }
    }
}

/// Human name of a topology level, as used in messages.
pub fn level_name(l: TopologyLevel) -> &'static str {
    match l {
        TopologyLevel::Node => "node",
        TopologyLevel::NvlinkDomain => "NVLink domain",
        TopologyLevel::Rack => "rack",
        TopologyLevel::Block => "block",
    }
}

impl fmt::Display for PendingReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PendingReason::Nodes(s) => s.fmt(f),
            PendingReason::QueueMissing { queue } => write!(f, "queue {queue:?} does not exist"),
            PendingReason::GroupMissing { group } => {
                write!(f, "pod group {group:?} does not exist")
            }
            PendingReason::GroupQueueMissing { group, queue } => {
                write!(f, "pod group {group:?}: queue {queue:?} does not exist")
            }
            PendingReason::GangTimedOut { group, after_ms } => {
                write!(
                    f,
                    "pod group {group:?} timed out after {}",
                    gpusched_model::duration::fmt_duration(*after_ms)
                )
            }
            PendingReason::GangIncomplete { group, have, need } => write!(
                f,
                "pod group {group:?}: {have} of minMember {need} pods exist; waiting for the rest"
            ),
            PendingReason::GangShort { group, fit, need } => write!(
                f,
                "pod group {group:?}: only {fit} of the {need} required pods fit now (all-or-nothing)."
            ),
            PendingReason::GangNeverFits {
                group,
                need,
                count,
                gpus,
                most,
            } => write!(
                f,
                "pod group {group:?}: {need} pods must start together (all-or-nothing); {count} of them ask {gpus} GPU(s) each, and the cluster can hold at most {most} such pods even when empty: it never fits as written."
            ),
            PendingReason::NoTopologyDomain {
                group,
                level,
                need,
                required,
            } => write!(
                f,
                "pod group {group:?}: no {} can hold all {need} required pods{}",
                level_name(*level),
                if *required { " (required)" } else { "" }
            ),
            PendingReason::Quota(q) => q.fmt(f),
            PendingReason::Reserved { node } => write!(
                f,
                "waited longer than the reservation threshold; node {node} is reserved for it and drains"
            ),
            PendingReason::VictimsTerminating { victims, node } => write!(
                f,
                "{victims} victim(s) evicted to make room; waiting for them to terminate on {node}"
            ),
            PendingReason::TerminatingPods { node } => {
                write!(f, "waiting for terminating pods to leave {node}")
            }
            PendingReason::Nominated => f.write_str("nominated; waiting for capacity"),
            PendingReason::PodsMoving { moved, node } => write!(
                f,
                "{moved} pod(s) moved to make room; waiting for them to leave {node}"
            ),
            PendingReason::SnapshotInconsistent { error } => {
                write!(f, "snapshot inconsistent: {error}")
            }
        }
    }
}

/// Why a pod is evicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EvictionKind {
    /// For a higher-priority job of the same queue.
    Preempt,
    /// For a queue below its deserved share.
    Reclaim,
    /// Moved by consolidation, to make room for a pending pod.
    Consolidate,
}

impl EvictionKind {
    /// A stable short label for counting evictions by kind (metrics,
    /// reports).
    pub fn label(self) -> &'static str {
        match self {
            EvictionKind::Preempt => "preempted by higher-priority",
            EvictionKind::Reclaim => "reclaimed for queue",
            EvictionKind::Consolidate => "moved to make room",
        }
    }
}

/// Why a node was not used to free room for a pending pod (preemption or
/// reclaim); kube-scheduler's `preemption: 0/N nodes are available: …`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum CandidateRejection {
    /// The node is reserved (or nominated) for another job.
    ReservedForOtherJob,
    /// No pod on the node may be evicted for this pod (preempt: none of
    /// its queue with lower priority; reclaim: none of a queue above its
    /// deserved share; non-preemptible pods never).
    NoVictims,
    /// The node's only candidate victims started less than their queue's
    /// minimum runtime ago (`min_runtime_ms`).
    VictimsTooYoung,
    /// Even with every candidate victim gone, the node has too few GPUs.
    NotEnoughGpus,
    /// Even with every candidate victim gone, the pod does not fit
    /// (CPU, memory, GPU placement).
    DoesNotFit,
    /// Freeing the node would break a PodDisruptionBudget while other
    /// nodes' victims are only younger than their minimum runtime: the pod
    /// waits for those (at most that runtime) rather than break it.
    WouldBreakBudget,
}

impl fmt::Display for CandidateRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CandidateRejection::ReservedForOtherJob => "node(s) reserved for a waiting job",
            CandidateRejection::NoVictims => "No preemption victims found for incoming pod",
            CandidateRejection::VictimsTooYoung => {
                "node(s) had only victims that started less than their minimum runtime ago"
            }
            CandidateRejection::NotEnoughGpus => {
                "Preemption is not helpful for scheduling (too few GPUs even with every candidate victim evicted)"
            }
            CandidateRejection::DoesNotFit => {
                "Preemption is not helpful for scheduling (does not fit even with every candidate victim evicted)"
            }
            CandidateRejection::WouldBreakBudget => {
                "node(s) would break a PodDisruptionBudget while other victims are still younger than their minimum runtime"
            }
        })
    }
}

/// Why the preempt or reclaim pass did not try to free room for a job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum EvictionSkip {
    /// A pod of the job has `preemptionPolicy: Never`.
    PreemptionPolicyNever,
    /// The job breaks a quota rule; evicting would not change that.
    Quota(QuotaViolation),
    /// Victims are not searched for gangs with a required topology
    /// constraint (they wait for their domain).
    RequiredTopology,
    /// The cycle's eviction budget was spent.
    EvictionLimit {
        /// `max_evictions_per_cycle`.
        max: u32,
    },
    /// Reclaim is only for a queue below its deserved share (or guarantee).
    NotBelowDeservedShare {
        /// The job's queue.
        queue: String,
        /// Its GPU usage with the job (milli-GPU).
        would_use: u64,
        /// Its deserved share or guarantee, whichever is higher (milli-GPU).
        deserved: u64,
    },
}

impl fmt::Display for EvictionSkip {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictionSkip::PreemptionPolicyNever => {
                f.write_str("the pod has preemptionPolicy Never")
            }
            EvictionSkip::Quota(q) => write!(f, "evicting would not help: {q}"),
            EvictionSkip::RequiredTopology => {
                f.write_str("not attempted for gangs with a required topology constraint")
            }
            EvictionSkip::EvictionLimit { max } => {
                write!(f, "this cycle's eviction budget ({max}) was spent")
            }
            EvictionSkip::NotBelowDeservedShare {
                queue,
                would_use,
                deserved,
            } => write!(
                f,
                "queue {queue:?} would not be below its deserved share with the pod ({} of {} GPU)",
                crate::report::gpus_text(*would_use),
                crate::report::gpus_text(*deserved)
            ),
        }
    }
}

/// What came of the preempt or reclaim pass for a job that stays pending.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum EvictionOutcome {
    /// The pass did not look for victims.
    Skipped(EvictionSkip),
    /// No node could be freed for member `pod` of the job.
    NoNode {
        /// The member that found no node (a gang stops at the first).
        pod: String,
        /// Nodes that pass the pod's filters (the ones considered).
        considered: u32,
        /// Why each was not used, with node counts.
        counts: Vec<(CandidateRejection, u32)>,
        /// Where nodes were refused only because their victims are younger
        /// than their queue's minimum runtime: how long until the first of
        /// them reaches it (ms from the cycle), when the pass may evict it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        wait_ms: Option<u64>,
    },
}

impl EvictionAttempt {
    /// Whether the pass found victims but waits for their minimum runtime:
    /// the pod's message says so, and until when (kube-scheduler would
    /// preempt at once; docs/kubernetes.md, deliberate differences).
    pub fn waits_for_min_runtime(&self) -> bool {
        matches!(&self.outcome, EvictionOutcome::NoNode { counts, .. }
            if counts.iter().any(|(r, c)| *r == CandidateRejection::VictimsTooYoung && *c > 0))
    }
}

/// One eviction pass tried (or skipped) for a pending pod's job.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EvictionAttempt {
    /// Preempt or reclaim.
    pub kind: EvictionKind,
    /// What came of it.
    pub outcome: EvictionOutcome,
}

impl fmt::Display for EvictionAttempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pass = match self.kind {
            EvictionKind::Preempt => "preemption",
            EvictionKind::Reclaim => "reclaim",
            EvictionKind::Consolidate => "consolidation",
        };
        match &self.outcome {
            EvictionOutcome::Skipped(s) => write!(f, "{pass}: {s}"),
            // no node passes the pod's filters: nothing to free ("0/0
            // nodes are available" said nothing)
            EvictionOutcome::NoNode {
                considered: 0,
                counts,
                ..
            } if counts.is_empty() => write!(
                f,
                "{pass}: no node passes the pod's filters, so evicting pods would not help."
            ),
            EvictionOutcome::NoNode {
                considered,
                counts,
                wait_ms,
                ..
            } => {
                write!(f, "{pass}: 0/{considered} nodes are available")?;
                for (i, (r, c)) in counts.iter().enumerate() {
                    f.write_str(if i == 0 { ": " } else { ", " })?;
                    write!(f, "{c} {r}")?;
                    if *r == CandidateRejection::VictimsTooYoung
                        && let Some(w) = wait_ms
                    {
                        write!(
                            f,
                            " (the first reaches it in {})",
                            gpusched_model::duration::fmt_duration(*w)
                        )?;
                    }
                }
                f.write_str(".")
            }
        }
    }
}

/// Why a pod is evicted, with its facts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum EvictionReason {
    /// Preempted by a higher-priority job of its own queue.
    Preempted {
        /// The preempting job (pod group or pod name).
        by: String,
        /// Its priority.
        priority: i32,
    },
    /// Reclaimed for a queue below its deserved share.
    Reclaimed {
        /// The queue that reclaims.
        for_queue: String,
    },
    /// Moved by consolidation: it restarts on `to_node` (planned; its
    /// capacity is checked) so that `for_pod` fits where it ran.
    Moved {
        /// The pending pod it makes room for (`namespace/name`).
        for_pod: String,
        /// The node planned for it.
        to_node: String,
    },
}

impl EvictionReason {
    /// Preempt, reclaim or consolidate.
    pub fn kind(&self) -> EvictionKind {
        match self {
            EvictionReason::Preempted { .. } => EvictionKind::Preempt,
            EvictionReason::Reclaimed { .. } => EvictionKind::Reclaim,
            EvictionReason::Moved { .. } => EvictionKind::Consolidate,
        }
    }
}

impl fmt::Display for EvictionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EvictionReason::Preempted { by, priority } => {
                write!(
                    f,
                    "preempted by higher-priority {by:?} (priority {priority})"
                )
            }
            EvictionReason::Reclaimed { for_queue } => write!(
                f,
                "reclaimed for queue {for_queue:?} (below its deserved share)"
            ),
            EvictionReason::Moved { for_pod, to_node } => write!(
                f,
                "moved to make room for {for_pod} (planned to restart on {to_node})"
            ),
        }
    }
}

/// A problem with the snapshot's queue tree. The tree is still built (the
/// queue hangs off the root, or the first definition wins); callers should
/// surface these (Queue conditions, events, warnings).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all_fields = "camelCase")]
pub enum QueueProblem {
    /// The queue is defined more than once; the first definition is used.
    Duplicate {
        /// The queue.
        queue: String,
    },
    /// The queue's parent does not exist; the queue hangs off the root.
    MissingParent {
        /// The queue.
        queue: String,
        /// The parent it names.
        parent: String,
    },
    /// The queue's parent chain forms a cycle; the queue hangs off the root.
    Cycle {
        /// A queue on the cycle.
        queue: String,
    },
}

impl QueueProblem {
    /// The queue the problem is about.
    pub fn queue(&self) -> &str {
        match self {
            QueueProblem::Duplicate { queue }
            | QueueProblem::MissingParent { queue, .. }
            | QueueProblem::Cycle { queue } => queue,
        }
    }
}

impl fmt::Display for QueueProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            QueueProblem::Duplicate { queue } => {
                write!(f, "queue {queue:?} defined twice; the first one is used")
            }
            QueueProblem::MissingParent { queue, parent } => {
                write!(f, "queue {queue:?}: parent {parent:?} does not exist")
            }
            QueueProblem::Cycle { queue } => {
                write!(f, "queue {queue:?}: parent chain forms a cycle")
            }
        }
    }
}

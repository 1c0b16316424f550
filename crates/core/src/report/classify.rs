//! One classification of why a pending pod waits, from the core's typed
//! reasons: it feeds the pod's `PodScheduled` condition (and so what
//! cluster autoscalers do), the pending-by-reason metrics, `explain` and
//! `doctor`, in the scheduler and the simulator alike. The filters'
//! refusals are told apart by their names ([`FilterName`]).
//!
//! One vocabulary: a class has one name, [`PendingClass::reason_name`]
//! (CamelCase, as condition reasons are written), and every surface shows
//! that name verbatim — `explain`, `pending`, the Queue and PodGroup
//! status, `doctor`, the `reason` label of the pending-pods metric, the
//! JSON of all of them, and the pod's `FailedScheduling` event and
//! `PodScheduled` condition message ([`tagged_message`]). The condition's
//! *reason* is the class name too, except where more nodes would help: it
//! is then kube-scheduler's `Unschedulable`, which cluster autoscalers act
//! on ([`PendingClass::condition_reason`]).

use crate::fairshare::QueueTree;
use crate::plugin::FilterName;
use crate::{CycleOutput, Explanation, NodeReason, PendingReason, PodId, Snapshot};
use gpusched_model::{GpuHealth, GpuRequest, ResourceKind};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::collections::BTreeSet;

/// Why a pending GPU pod waits, as doctor classifies the core's reasons.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "&'static str")]
pub enum PendingClass {
    /// `spec.schedulingGates` present.
    Gated,
    /// The spec cannot be scheduled as written.
    InvalidSpec,
    /// Names a queue or pod group that does not exist.
    MissingQueueOrGroup,
    /// A ResourceClaim it references does not exist yet.
    WaitingForClaim,
    /// Its ResourceClaims cannot be allocated on any node.
    UnallocatableClaim,
    /// A queue limit / no-borrow rule.
    Quota,
    /// Fewer than `minMember` pods of the gang exist.
    GangIncomplete,
    /// The gang gave up after its schedule timeout.
    GangTimedOut,
    /// No topology domain can hold the gang.
    Topology,
    /// No node has the GPU model asked.
    GpuModel,
    /// No GPU has the memory asked.
    GpuMemory,
    /// Node selector / affinity matches no usable node.
    Affinity,
    /// Untolerated taints.
    Taints,
    /// The GPUs it could use are unhealthy.
    UnhealthyGpus,
    /// Nodes cordoned or not ready.
    NodeUnavailable,
    /// The core's verdict is Unresolvable: more than any node (or its
    /// queue's quota) can ever hold, whatever frees up.
    NeverFits,
    /// Not enough free GPUs (or GPU share) now.
    InsufficientGpus,
    /// Not enough CPU, memory or another resource.
    InsufficientResources,
    /// Only part of the gang fits now.
    GangShort,
    /// Preemption or reservation under way; it waits for a node.
    WaitingForNode,
    /// Fits now: the next cycle places it.
    FitsNow,
}

impl PendingClass {
    /// The class's one name ([`PendingClass::reason_name`]): the same in
    /// JSON, metrics labels, doctor, explain and the statuses.
    pub fn as_str(self) -> &'static str {
        self.reason_name()
    }

    /// The class named `name` ([`PendingClass::reason_name`]).
    pub fn from_name(name: &str) -> Option<PendingClass> {
        PendingClass::ALL
            .iter()
            .copied()
            .find(|c| c.reason_name() == name)
    }

    /// Every class, in the order a pod's main class is chosen.
    pub const ALL: [PendingClass; 21] = [
        PendingClass::Gated,
        PendingClass::InvalidSpec,
        PendingClass::MissingQueueOrGroup,
        PendingClass::WaitingForClaim,
        PendingClass::UnallocatableClaim,
        PendingClass::Quota,
        PendingClass::GangIncomplete,
        PendingClass::GangTimedOut,
        PendingClass::Topology,
        PendingClass::GpuModel,
        PendingClass::GpuMemory,
        PendingClass::Affinity,
        PendingClass::Taints,
        PendingClass::UnhealthyGpus,
        PendingClass::NodeUnavailable,
        PendingClass::NeverFits,
        PendingClass::InsufficientGpus,
        PendingClass::InsufficientResources,
        PendingClass::GangShort,
        PendingClass::WaitingForNode,
        PendingClass::FitsNow,
    ];

    /// The class's name (CamelCase, as a condition or event reason): the
    /// one name every surface shows, as a PodGroup's `Scheduled` condition
    /// shows why its members wait.
    pub fn reason_name(self) -> &'static str {
        match self {
            PendingClass::Gated => "SchedulingGated",
            PendingClass::InvalidSpec => "InvalidSpec",
            PendingClass::MissingQueueOrGroup => "MissingQueueOrGroup",
            PendingClass::WaitingForClaim => "WaitingForResourceClaim",
            PendingClass::UnallocatableClaim => "UnallocatableResourceClaim",
            PendingClass::Quota => "QueueQuota",
            PendingClass::GangIncomplete => "GangIncomplete",
            PendingClass::GangTimedOut => "GangTimedOut",
            PendingClass::Topology => "NoTopologyDomain",
            PendingClass::GpuModel => "NoGpuModel",
            PendingClass::GpuMemory => "InsufficientGpuMemory",
            PendingClass::Affinity => "NodeAffinity",
            PendingClass::Taints => "Taints",
            PendingClass::UnhealthyGpus => "UnhealthyGpus",
            PendingClass::NodeUnavailable => "NodeUnavailable",
            PendingClass::NeverFits => "NeverFits",
            PendingClass::InsufficientGpus => "InsufficientGpus",
            PendingClass::InsufficientResources => "InsufficientResources",
            PendingClass::GangShort => "GangShort",
            PendingClass::WaitingForNode => "WaitingForNode",
            PendingClass::FitsNow => "FitsNow",
        }
    }

    /// Whether more (or other) nodes would let the pod run: what cluster
    /// autoscalers act on. False where gpusched itself holds the pod (its
    /// spec, its queue's quota, its gang, capacity already being freed for
    /// it, or nothing: it fits now).
    pub fn more_nodes_help(self) -> bool {
        !matches!(
            self,
            PendingClass::Gated
                | PendingClass::InvalidSpec
                | PendingClass::MissingQueueOrGroup
                | PendingClass::WaitingForClaim
                | PendingClass::Quota
                | PendingClass::GangIncomplete
                | PendingClass::GangTimedOut
                | PendingClass::WaitingForNode
                | PendingClass::FitsNow
        )
    }

    /// The `PodScheduled=False` reason for a pod whose main class this is
    /// (docs/kubernetes.md, "Pending pods and autoscalers").
    pub fn condition_reason(self) -> &'static str {
        if self.more_nodes_help() {
            "Unschedulable"
        } else {
            self.reason_name()
        }
    }

    /// What the user can do about it (doctor's hint).
    pub fn hint(self) -> &'static str {
        match self {
            PendingClass::Gated => {
                "a controller must remove spec.schedulingGates before the pod is scheduled"
            }
            PendingClass::InvalidSpec => {
                "fix the field named in the message (see docs/kubernetes.md, Pods)"
            }
            PendingClass::MissingQueueOrGroup => {
                "create the Queue / PodGroup, or fix the gpusched.io/queue or gpusched.io/pod-group label"
            }
            PendingClass::WaitingForClaim => {
                "create the ResourceClaim the pod names (a template's claim is made by kube-controller-manager)"
            }
            PendingClass::UnallocatableClaim => {
                "no node has free devices matching the claim (its DeviceClass, selectors, constraints, taints): see docs/dra.md"
            }
            PendingClass::Quota => {
                "the queue is at its limit (or may not borrow): wait, raise the Queue's limit/guarantee, or use another queue"
            }
            PendingClass::GangIncomplete => {
                "fewer pods than minMember exist: create the missing members or lower minMember"
            }
            PendingClass::GangTimedOut => {
                "the gang gave up: recreate it, or raise its scheduleTimeout"
            }
            PendingClass::Topology => {
                "no single domain holds the whole gang: relax the topology constraint or free a domain"
            }
            PendingClass::GpuModel => {
                "no node has the requested GPU model: check nvidia.com/gpu.product selectors and gpusched.io/gpu-models"
            }
            PendingClass::GpuMemory => {
                "no GPU has that much memory: lower gpusched.io/min-gpu-memory or the memory share"
            }
            PendingClass::Affinity => "no GPU node matches the pod's nodeSelector / affinity",
            PendingClass::Taints => "the GPU nodes are tainted: add the tolerations or untaint",
            PendingClass::UnhealthyGpus => {
                "the matching GPUs are unhealthy: see the gpu-resources findings"
            }
            PendingClass::NodeUnavailable => "the matching nodes are cordoned or NotReady",
            PendingClass::NeverFits => {
                "it asks more than any node (or its queue's quota) can ever hold: it never fits as written; make it smaller or raise the quota"
            }
            PendingClass::InsufficientGpus => {
                "not enough free GPUs now: it is placed when pods finish (or preempts lower priority)"
            }
            PendingClass::InsufficientResources => {
                "not enough CPU/memory/other resources on the GPU nodes"
            }
            PendingClass::GangShort => {
                "not every member fits at once: the gang waits for capacity (all-or-nothing)"
            }
            PendingClass::WaitingForNode => {
                "victims are terminating, a node is reserved for it, or a node's GPUs are not offered by its kubelet yet: it is placed when they are"
            }
            PendingClass::FitsNow => {
                "it fits now; the scheduler places it next cycle (is the scheduler running?)"
            }
        }
    }
}

impl From<PendingClass> for &'static str {
    fn from(c: PendingClass) -> &'static str {
        c.reason_name()
    }
}

impl TryFrom<String> for PendingClass {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        PendingClass::from_name(&s).ok_or_else(|| format!("unknown pending class {s:?}"))
    }
}

impl std::fmt::Display for PendingClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.reason_name())
    }
}

/// A pod's `FailedScheduling` event note and `PodScheduled` condition
/// message: the explanation's message, then its main class's name in
/// brackets — the name `explain`, `pending`, the Queue status, doctor and
/// the metrics show (the condition's reason can be only `Unschedulable`
/// where autoscalers should act).
pub fn tagged_message(message: &str, class: PendingClass) -> String {
    format!("{message} [{}]", class.reason_name())
}

/// The classes of one explanation, most specific first.
pub fn classify(e: &Explanation, pod: &gpusched_model::Pod, snap: &Snapshot) -> Vec<PendingClass> {
    Classifier::new(snap).classify(e, pod)
}

/// Classifies many pods of one snapshot: what the snapshot's GPUs say of a
/// pod's GPU ask (any GPU of its models? with the memory? a node with
/// enough of them?) is looked up once per distinct ask, not once per pod
/// (a walk over every GPU of the cluster: ≈ 0.5 ms per pod at 5,000
/// nodes).
pub struct Classifier<'a> {
    snap: &'a Snapshot,
    fit: std::cell::RefCell<GpuFitMemo>,
}

/// What `gpu_fit_class` answered per (GPU ask, models, minimum GPU memory):
/// a lookup cache only, its order never read.
type GpuFitMemo = std::collections::HashMap<(GpuRequest, Vec<String>, u64), PendingClass>;

impl<'a> Classifier<'a> {
    /// A classifier over `snap`.
    pub fn new(snap: &'a Snapshot) -> Self {
        Classifier {
            snap,
            fit: Default::default(),
        }
    }

    /// [`classify`] of one explanation.
    pub fn classify(&self, e: &Explanation, pod: &gpusched_model::Pod) -> Vec<PendingClass> {
        classify_with(self, e, pod)
    }

    fn gpu_fit(&self, pod: &gpusched_model::Pod) -> PendingClass {
        let key = (pod.gpu, pod.gpu_models.clone(), pod.min_gpu_memory_mib);
        if let Some(c) = self.fit.borrow().get(&key) {
            return *c;
        }
        let c = gpu_fit_class(pod, self.snap);
        self.fit.borrow_mut().insert(key, c);
        c
    }
}

fn classify_with(
    c: &Classifier<'_>,
    e: &Explanation,
    pod: &gpusched_model::Pod,
) -> Vec<PendingClass> {
    let mut set = BTreeSet::new();
    if e.reasons.is_empty() {
        set.insert(PendingClass::FitsNow);
    }
    for r in e.reasons.iter() {
        match r {
            PendingReason::Nodes(s) => {
                for (nr, _) in &s.counts {
                    set.insert(node_class(nr, pod, c));
                }
            }
            PendingReason::QueueMissing { .. }
            | PendingReason::GroupMissing { .. }
            | PendingReason::GroupQueueMissing { .. } => {
                set.insert(PendingClass::MissingQueueOrGroup);
            }
            PendingReason::GangTimedOut { .. } => {
                set.insert(PendingClass::GangTimedOut);
            }
            PendingReason::GangIncomplete { .. } => {
                set.insert(PendingClass::GangIncomplete);
            }
            PendingReason::GangShort { .. } => {
                set.insert(PendingClass::GangShort);
            }
            // as a pod bigger than any node: never, whatever frees up
            PendingReason::GangNeverFits { .. } => {
                set.insert(PendingClass::NeverFits);
            }
            PendingReason::NoTopologyDomain { .. } => {
                set.insert(PendingClass::Topology);
            }
            PendingReason::Quota(v) if v.never() => {
                set.insert(PendingClass::NeverFits);
            }
            PendingReason::Quota(_) => {
                set.insert(PendingClass::Quota);
            }
            PendingReason::Reserved { .. }
            | PendingReason::VictimsTerminating { .. }
            | PendingReason::TerminatingPods { .. }
            | PendingReason::PodsMoving { .. }
            | PendingReason::Nominated => {
                set.insert(PendingClass::WaitingForNode);
            }
            PendingReason::SnapshotInconsistent { .. } => {
                set.insert(PendingClass::InsufficientGpus);
            }
        }
    }
    // the core's verdict says waiting never helps: not "placed when pods
    // finish" (explain and doctor agree: one classification)
    if e.verdict == crate::Verdict::Unresolvable
        && (set.remove(&PendingClass::InsufficientGpus)
            | set.remove(&PendingClass::InsufficientResources)
            | set.remove(&PendingClass::Quota))
    {
        set.insert(PendingClass::NeverFits);
    }
    PendingClass::ALL
        .iter()
        .copied()
        .filter(|c| set.contains(c))
        .collect()
}

/// A node reason's class. The GPU filter's refusals are told apart by the
/// facts of the snapshot (is there any GPU of the model? with the memory?),
/// not by the phrase.
/// The classes of every pending pod a cycle explained, most specific
/// first; computed once per cycle for the conditions, the PodGroup and
/// Queue status, the metrics and `explain`.
pub fn classify_cycle(out: &CycleOutput, snap: &Snapshot) -> BTreeMap<PodId, Vec<PendingClass>> {
    let c = Classifier::new(snap);
    out.explanations
        .iter()
        .filter_map(|e| {
            let ps = snap.pods.get(e.pod as usize)?;
            ps.is_pending().then(|| (e.pod, c.classify(e, &ps.pod)))
        })
        .collect()
}

/// A queue's pending pods the cycle explained — its own and its
/// descendants', as its usage is its subtree's — by the name of their main
/// class (what the Queue's status and `explain queue` show).
pub fn queue_pending_by_reason(
    classes: &BTreeMap<PodId, Vec<PendingClass>>,
    snap: &Snapshot,
    queue: &str,
) -> BTreeMap<String, u32> {
    let (tree, _) = QueueTree::build(&snap.queues);
    let mut own: BTreeMap<&str, BTreeMap<PendingClass, u32>> = BTreeMap::new();
    for (p, cs) in classes {
        if let Some(ps) = snap.pods.get(*p as usize) {
            let c = cs.first().copied().unwrap_or(PendingClass::FitsNow);
            *own.entry(ps.pod.queue.as_str())
                .or_default()
                .entry(c)
                .or_default() += 1;
        }
    }
    roll_up(&tree, own.iter().map(|(q, m)| (*q, m)))
        .remove(queue)
        .unwrap_or_default()
        .into_iter()
        .map(|(c, n)| (c.reason_name().to_string(), n))
        .collect()
}

/// Per-queue counts summed up the queue tree: each queue's entry counts
/// its own and every descendant's (a parent's PENDING includes its
/// children's, as its allocation does). A queue the tree does not know
/// (missing or invalid) keeps only its own.
pub fn roll_up<'a, K: Ord + Copy + 'a>(
    tree: &QueueTree,
    own: impl IntoIterator<Item = (&'a str, &'a BTreeMap<K, u32>)>,
) -> BTreeMap<String, BTreeMap<K, u32>> {
    let mut out: BTreeMap<String, BTreeMap<K, u32>> = BTreeMap::new();
    for (q, m) in own {
        let names: Vec<&str> = match tree.idx(q) {
            Some(i) => tree
                .path(i)
                .into_iter()
                .map(|a| tree.queues[a].name.as_str())
                .collect(),
            None => vec![q],
        };
        for name in names {
            let e = out.entry(name.to_string()).or_default();
            for (k, n) in m {
                *e.entry(*k).or_default() += n;
            }
        }
    }
    out
}

/// The `PodScheduled=False` reason of an explanation: `Unschedulable`
/// (kube-scheduler's, which cluster-autoscaler and Karpenter scale up for)
/// only when more or other nodes would let the pod run; when gpusched holds
/// it for its own rules (quota, gang, capacity being freed), that rule's
/// reason, even if the nodes are full too — new nodes would not start it.
/// A pod whose job alone is over its queue's limit is `QueueQuota`, never
/// `Unschedulable`.
pub fn condition_reason(e: &Explanation, classes: &[PendingClass]) -> &'static str {
    let quota_never = e
        .reasons
        .iter()
        .any(|r| matches!(r, PendingReason::Quota(v) if v.never()));
    if quota_never {
        return PendingClass::Quota.condition_reason();
    }
    classes
        .iter()
        .find(|c| !c.more_nodes_help())
        .copied()
        .unwrap_or(PendingClass::InsufficientGpus)
        .condition_reason()
}

fn node_class(r: &NodeReason, pod: &gpusched_model::Pod, c: &Classifier<'_>) -> PendingClass {
    match r {
        // GPUs of a model (or memory) the pod does not take count as no
        // GPUs free for it: told apart by the snapshot's facts, as the GPU
        // filter's refusals are
        NodeReason::Insufficient(ResourceKind::Gpu) | NodeReason::InsufficientGpuShare => {
            match c.gpu_fit(pod) {
                c @ (PendingClass::GpuModel | PendingClass::GpuMemory) => c,
                _ => PendingClass::InsufficientGpus,
            }
        }
        NodeReason::ClaimGpus { .. } => PendingClass::InsufficientGpus,
        NodeReason::NoGpuOfModel { .. } => PendingClass::GpuModel,
        NodeReason::Insufficient(ResourceKind::GpuMemory) => PendingClass::GpuMemory,
        NodeReason::Insufficient(_) => PendingClass::InsufficientResources,
        NodeReason::ReservedForOtherJob => PendingClass::WaitingForNode,
        NodeReason::Filter { plugin, .. } => {
            if plugin == FilterName::NodeUnschedulable.as_str() {
                PendingClass::NodeUnavailable
            } else if plugin == FilterName::NodeAffinity.as_str() {
                PendingClass::Affinity
            } else if plugin == FilterName::TaintToleration.as_str() {
                PendingClass::Taints
            } else if plugin == FilterName::GpuFit.as_str() {
                c.gpu_fit(pod)
            } else {
                PendingClass::InsufficientResources
            }
        }
    }
}

fn gpu_fit_class(pod: &gpusched_model::Pod, snap: &Snapshot) -> PendingClass {
    let gpus = || snap.nodes.iter().flat_map(|n| n.gpus.iter());
    if !gpus().any(|g| pod.allows_model(&g.model)) {
        return PendingClass::GpuModel;
    }
    let need_mem = match pod.gpu {
        GpuRequest::Share { memory_mib, .. } => memory_mib.max(pod.min_gpu_memory_mib),
        _ => pod.min_gpu_memory_mib,
    };
    if !gpus().any(|g| pod.allows_model(&g.model) && g.memory_mib >= need_mem) {
        return PendingClass::GpuMemory;
    }
    if let GpuRequest::Whole(k) = pod.gpu {
        let most = snap
            .nodes
            .iter()
            .map(|n| {
                n.gpus
                    .iter()
                    .filter(|g| pod.allows_model(&g.model) && g.memory_mib >= need_mem)
                    .count()
            })
            .max()
            .unwrap_or(0);
        if most < k as usize {
            return PendingClass::NeverFits;
        }
    }
    let fits = |g: &&gpusched_model::Gpu| pod.allows_model(&g.model) && g.memory_mib >= need_mem;
    if gpus()
        .filter(fits)
        .any(|g| g.health == GpuHealth::Unhealthy)
    {
        return PendingClass::UnhealthyGpus;
    }
    // GPUs the kubelet does not offer yet (an agent that just started): the
    // node is coming, not missing
    if gpus()
        .filter(fits)
        .any(|g| g.health == GpuHealth::NotAllocatable)
    {
        return PendingClass::WaitingForNode;
    }
    PendingClass::InsufficientGpus
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Verdict;
    use crate::reason::{NodeSummary, QuotaRule, QuotaViolation};
    use gpusched_testkit as tk;

    /// `gpusched_testkit::snapshot`, for this crate's own `Snapshot` (the
    /// testkit's is the core's as a dependency, another type here).
    fn snapshot(
        nodes: Vec<gpusched_model::Node>,
        queues: Vec<gpusched_model::Queue>,
        groups: Vec<gpusched_model::PodGroup>,
        pods: Vec<gpusched_model::Pod>,
    ) -> Snapshot {
        Snapshot {
            nodes,
            queues,
            groups,
            pods: pods.into_iter().map(crate::PodState::pending).collect(),
        }
    }

    fn explanation(reasons: Vec<PendingReason>) -> Explanation {
        Explanation {
            pod: 0,
            verdict: Verdict::Unschedulable,
            reasons: reasons.into(),
            evictions: Vec::new().into(),
            queue_position: None,
        }
    }

    fn full_nodes() -> PendingReason {
        PendingReason::Nodes(NodeSummary {
            total: 2,
            counts: vec![(NodeReason::Insufficient(ResourceKind::Gpu), 2)],
            nearest: None,
        })
    }

    fn quota(needs: u64) -> PendingReason {
        PendingReason::Quota(QuotaViolation {
            queue: "research".into(),
            rule: QuotaRule::Limit,
            dimension: ResourceKind::Gpu,
            would_use: 10_000,
            cap: 8_000,
            needs,
        })
    }

    /// What cluster-autoscaler and Karpenter read: `Unschedulable` only
    /// when nodes are what is missing.
    #[test]
    fn only_a_lack_of_nodes_reads_unschedulable() {
        let snap = snapshot(
            vec![tk::node("a").gpus(8).build(), tk::node("b").gpus(8).build()],
            vec![tk::queue("research")],
            vec![],
            vec![tk::pod("p").queue("research").gpus(2).build()],
        );
        let pod = &snap.pods[0].pod;
        let reason = |reasons: Vec<PendingReason>| {
            let e = explanation(reasons);
            condition_reason(&e, &classify(&e, pod, &snap))
        };
        assert_eq!(reason(vec![full_nodes()]), "Unschedulable");
        // the queue holds it: new nodes would not start it
        assert_eq!(reason(vec![quota(2_000)]), "QueueQuota");
        assert_eq!(reason(vec![full_nodes(), quota(2_000)]), "QueueQuota");
        // the job alone is over the limit: never Unschedulable
        assert_eq!(reason(vec![quota(9_000)]), "QueueQuota");
        let incomplete = PendingReason::GangIncomplete {
            group: "g".into(),
            have: 2,
            need: 4,
        };
        assert_eq!(reason(vec![full_nodes(), incomplete]), "GangIncomplete");
        // a gang whose members exist but do not all fit: nodes would help
        let short = PendingReason::GangShort {
            group: "g".into(),
            fit: 2,
            need: 4,
        };
        assert_eq!(reason(vec![full_nodes(), short]), "Unschedulable");
        let freeing = PendingReason::VictimsTerminating {
            victims: 2,
            node: "a".into(),
        };
        assert_eq!(reason(vec![freeing]), "WaitingForNode");
        assert_eq!(reason(vec![]), "FitsNow");
        let missing = PendingReason::QueueMissing { queue: "x".into() };
        assert_eq!(reason(vec![missing]), "MissingQueueOrGroup");
    }

    #[test]
    fn every_class_says_whether_nodes_help_and_has_a_reason() {
        let mut names = BTreeSet::new();
        for c in PendingClass::ALL {
            let r = c.condition_reason();
            assert_eq!(r == "Unschedulable", c.more_nodes_help(), "{c:?}");
            assert!(
                names.insert(c.reason_name()),
                "{c:?}: reason name used twice"
            );
        }
        // ALL lists every class in declaration (Ord) order
        assert!(PendingClass::ALL.windows(2).all(|w| w[0] < w[1]));
    }
}

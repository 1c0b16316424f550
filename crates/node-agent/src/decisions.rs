//! The agent's side of the scheduler ↔ agent protocol (`docs/protocol.md`):
//! the decisions recorded on the pods bound to this node, which of their
//! GPUs the kubelet has been given, and the matching of the kubelet's ids
//! to them. Pure: no I/O, no clock; the pod watch and the gRPC server feed
//! it.

use gpusched_model::protocol::{GpuDecision, ShareDecision};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// Thousandths of one GPU.
pub const GPU_MILLI: u32 = 1000;

/// A pod as the agent needs to see it.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct PodInfo {
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
    /// `metadata.uid`.
    pub uid: String,
    /// `spec.nodeName`.
    pub node: String,
    /// `metadata.creationTimestamp` as sortable text (RFC 3339) — the
    /// kubelet admits pods in this order.
    pub created: String,
    /// The `gpusched.io/decision` annotation, if any.
    pub decision: Option<String>,
    /// Phase Succeeded/Failed, or being deleted with no container left.
    pub terminal: bool,
    /// What each container asks, in the kubelet's order (init containers,
    /// then app containers). Empty: unknown (the decision is then taken as
    /// one container asking all of it).
    pub containers: Vec<ContainerAsk>,
}

/// What one container of a pod asks of the resources decisions govern.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ContainerAsk {
    /// An init container.
    pub init: bool,
    /// An init container with `restartPolicy: Always` (a sidecar): its
    /// devices are not reused by later containers.
    pub sidecar: bool,
    /// `nvidia.com/gpu` limit.
    pub gpus: u32,
    /// `gpusched.io/gpu-milli` limit.
    pub milli: u32,
}

/// The devices each `Allocate` call of a pod adds beyond those it reuses,
/// in call order, as the kubelet's device manager does it: an init
/// container reuses the devices of earlier init containers and leaves its
/// own for reuse; a sidecar or app container reuses what is left for reuse
/// and takes it away. Calls that only reuse are left out.
pub fn new_devices_per_call(
    asks: &[ContainerAsk],
    want: impl Fn(&ContainerAsk) -> u32,
) -> Vec<u32> {
    let mut reusable = 0u32;
    let mut out = Vec::new();
    for a in asks {
        let k = want(a);
        if k == 0 {
            continue;
        }
        let reused = k.min(reusable);
        let new = k - reused;
        if new > 0 {
            out.push(new);
        }
        if a.init && !a.sidecar {
            reusable += new; // = max(reusable, k): no overflow
        } else {
            reusable -= reused;
        }
    }
    out
}

/// The calls a decision of `total` devices expects: the pod's own layout
/// when it adds up to the decision, else one call for all of it.
fn slots_for(pod: &PodInfo, total: u32, want: impl Fn(&ContainerAsk) -> u32) -> Vec<u32> {
    let v = new_devices_per_call(&pod.containers, want);
    if !v.is_empty() && v.iter().map(|&x| u64::from(x)).sum::<u64>() == u64::from(total) {
        v
    } else {
        vec![total]
    }
}

/// Takes one call of `n` devices off `slots`: an exact one if any, else
/// from the smallest larger one, else from the largest ones (the pod's
/// layout was not what its spec said); the sum always drops by `n` (down to
/// zero).
fn take_slot(slots: &mut Vec<u32>, n: u32) {
    if let Some(i) = slots.iter().position(|&s| s == n) {
        slots.remove(i);
        return;
    }
    if let Some(i) = (0..slots.len())
        .filter(|&i| slots[i] > n)
        .min_by_key(|&i| slots[i])
    {
        slots[i] -= n;
        return;
    }
    let mut left = n;
    slots.sort_unstable();
    while left > 0 {
        let Some(s) = slots.pop() else { break };
        if s > left {
            slots.push(s - left);
            left = 0;
        } else {
            left -= s;
        }
    }
}

impl PodInfo {
    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A GPU of the node as the ledger knows it (position = inventory index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerGpu {
    /// The driver's index (what decisions name).
    pub index: u32,
    /// The GPU UUID.
    pub uuid: String,
    /// Total memory.
    pub memory_mib: u64,
}

/// What a valid decision gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Whole GPUs (inventory positions), and those already handed to the
    /// kubelet.
    ///
    /// `slots`: the GPUs each `Allocate` call still expected from the pod
    /// adds (Σ = GPUs not served yet).
    Whole {
        /// The decided GPUs.
        gpus: Vec<usize>,
        /// Those already handed to the kubelet.
        served: BTreeSet<usize>,
        /// GPUs each `Allocate` call still expected from the pod adds.
        slots: Vec<u32>,
    },
    /// A share of one GPU, and the milli already handed out; `slots` as
    /// for whole GPUs, in milli (Σ = milli not served yet).
    Share {
        /// The GPU (inventory position).
        gpu: usize,
        /// The decided share.
        milli: u32,
        /// The decided memory.
        memory_mib: u64,
        /// Milli already handed out.
        served_milli: u32,
        /// Milli each `Allocate` call still expected from the pod adds.
        slots: Vec<u32>,
        /// The time-sliced resource of a replica decision (its calls come
        /// for that resource, not `gpusched.io/gpu-milli`, and are served
        /// as a plain time-slicing plugin would: docs/protocol.md).
        resource: Option<String>,
        /// MIG instances decided (device ids), for a MIG decision: its
        /// calls come for `resource` (the MIG resource) and are answered
        /// with these devices. Empty otherwise.
        mig: Vec<String>,
    },
}

impl Grant {
    fn served_any(&self) -> bool {
        match self {
            Grant::Whole { served, .. } => !served.is_empty(),
            Grant::Share { served_milli, .. } => *served_milli > 0,
        }
    }
    fn fully_served(&self) -> bool {
        match self {
            Grant::Whole { gpus, served, .. } => served.len() == gpus.len(),
            Grant::Share {
                milli,
                served_milli,
                ..
            } => served_milli >= milli,
        }
    }
}

/// One pod's decision on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The pod.
    pub pod: PodInfo,
    /// The decision's `seq` (orders decisions of one node).
    pub seq: u64,
    /// The decision, or why it is refused.
    pub state: Result<Grant, String>,
    /// The GPUs the decision named (empty when it is unreadable).
    pub decided: Vec<usize>,
}

impl Entry {
    /// Pending (nothing handed out yet) or partly served.
    pub fn is_pending(&self) -> bool {
        matches!(&self.state, Ok(g) if !g.fully_served())
    }
}

/// A refusal to report as an event on a pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The pod.
    pub pod: PodInfo,
    /// The event's text.
    pub message: String,
}

/// What `Allocate` hands out for a share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGrant {
    /// The pod (`namespace/name`).
    pub pod: String,
    /// The GPU (inventory position).
    pub gpu: usize,
    /// The pod's whole decided share (not only this call's).
    pub milli: u32,
    /// The pod's decided memory.
    pub memory_mib: u64,
    /// The decided MIG instances (device ids), for a MIG decision.
    pub mig: Vec<String>,
}

/// Which decision a whole-GPU `Allocate` was charged to. The kubelet does
/// not say which pod calls: another pending pod of the same size may be
/// the caller (PodResources tells later).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Matched {
    /// The pod whose decision was charged.
    pub decision: String,
    /// GPUs exchanged with other pending decisions to serve the call.
    pub note: Option<String>,
}

/// What PodResources says one pod holds of the resources decisions govern.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct HeldPod {
    /// Whole GPUs (inventory positions).
    pub whole: BTreeSet<usize>,
    /// Share tokens (milli).
    pub milli: u32,
    /// For time-sliced replicas: the GPU the `Allocate` calls that handed
    /// out its replica ids named (all one GPU), when known.
    pub replica_gpu: Option<usize>,
    /// MIG instances (device ids) its containers were told.
    pub mig: BTreeSet<String>,
}

/// What [`Ledger::reconcile`] did.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Reconciled {
    /// Listed pods that matched a decision.
    pub restored: usize,
    /// Pods found on other GPUs than their decision named.
    pub moved: Vec<String>,
}

fn unserved(gpus: &[usize], served: &BTreeSet<usize>) -> Vec<usize> {
    gpus.iter()
        .copied()
        .filter(|g| !served.contains(g))
        .collect()
}

/// `Allocate` found nothing it may serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Miss {
    /// No live decision covers the request (retry after a fresh LIST).
    NoDecision(String),
    /// A decision matched but may not be served (unhealthy, overbooked).
    Refused(String),
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Miss::NoDecision(m) | Miss::Refused(m) => f.write_str(m),
        }
    }
}

/// The decisions of one node.
#[derive(Clone, Debug)]
pub struct Ledger {
    node: String,
    gpus: Vec<LedgerGpu>,
    entries: BTreeMap<String, Entry>,
    /// The decision the last call was charged to (a pod's containers come
    /// one after the other).
    last: Option<String>,
}

fn validate(
    d: &GpuDecision,
    pod: &PodInfo,
    node: &str,
    gpus: &[LedgerGpu],
) -> Result<Grant, String> {
    if d.uid != pod.uid {
        return Err(format!(
            "decision was made for pod uid {:?}, not this pod ({:?}): copied or forged",
            d.uid, pod.uid
        ));
    }
    if d.node != node {
        return Err(format!(
            "decision was made for node {:?}, not {node:?}",
            d.node
        ));
    }
    if d.indices.len() != d.gpus.len() {
        return Err(format!(
            "{} indices but {} GPU uuids",
            d.indices.len(),
            d.gpus.len()
        ));
    }
    if d.indices.is_empty() {
        return Err("decision names no GPU".into());
    }
    let mut pos = Vec::with_capacity(d.indices.len());
    for (&i, u) in d.indices.iter().zip(&d.gpus) {
        let Some(p) = gpus.iter().position(|g| g.index == i) else {
            return Err(format!("GPU index {i} does not exist on node {node}"));
        };
        if gpus[p].uuid != *u {
            return Err(format!(
                "GPU index {i} of node {node} is {}, not {u:?}",
                gpus[p].uuid
            ));
        }
        if pos.contains(&p) {
            return Err(format!("GPU index {i} named twice"));
        }
        pos.push(p);
    }
    if let Some(m) = &d.mig {
        if pos.len() != 1 || d.share.is_some() {
            return Err(format!(
                "MIG instances name one GPU and no share, not {} GPUs{}",
                pos.len(),
                if d.share.is_some() {
                    " and a share"
                } else {
                    ""
                }
            ));
        }
        if m.instances.is_empty() || m.milli == 0 || m.milli > GPU_MILLI {
            return Err(format!(
                "MIG decision of {} instances and {} milli is not 1.. instances of 1..{GPU_MILLI}",
                m.instances.len(),
                m.milli
            ));
        }
        let distinct: BTreeSet<&String> = m.instances.iter().collect();
        if distinct.len() != m.instances.len() {
            return Err("MIG decision names an instance twice".into());
        }
        return Ok(Grant::Share {
            gpu: pos[0],
            milli: m.milli,
            memory_mib: 0,
            served_milli: 0,
            // one call of its whole size, for its resource
            slots: vec![m.milli],
            resource: Some(m.resource.clone()),
            mig: m.instances.clone(),
        });
    }
    match &d.share {
        None => Ok(Grant::Whole {
            slots: slots_for(pod, pos.len() as u32, |c| c.gpus),
            gpus: pos,
            served: BTreeSet::new(),
        }),
        Some(ShareDecision {
            milli,
            memory_mib,
            resource,
            ..
        }) => {
            if pos.len() != 1 {
                return Err(format!("a share names {} GPUs, not one", pos.len()));
            }
            // replicas may fill their GPU (N of N); a milli share may not
            let most = if resource.is_some() {
                GPU_MILLI
            } else {
                GPU_MILLI - 1
            };
            if *milli == 0 || *milli > most {
                return Err(format!("share of {milli} milli is not 1..{most}"));
            }
            if *memory_mib > gpus[pos[0]].memory_mib {
                return Err(format!(
                    "share of {memory_mib} MiB exceeds GPU {}'s {} MiB",
                    gpus[pos[0]].index, gpus[pos[0]].memory_mib
                ));
            }
            Ok(Grant::Share {
                gpu: pos[0],
                milli: *milli,
                memory_mib: *memory_mib,
                served_milli: 0,
                // a replica decision expects one call of its whole size,
                // for its resource (containers' asks of it are not read)
                slots: if resource.is_some() {
                    vec![*milli]
                } else {
                    slots_for(pod, *milli, |c| c.milli)
                },
                resource: resource.clone(),
                mig: Vec::new(),
            })
        }
    }
}

impl Ledger {
    /// A ledger of `node` with no decisions.
    pub fn new(node: &str, gpus: Vec<LedgerGpu>) -> Self {
        Ledger {
            node: node.to_string(),
            gpus,
            entries: BTreeMap::new(),
            last: None,
        }
    }

    /// The Node this ledger is of.
    pub fn node(&self) -> &str {
        &self.node
    }

    /// The node's GPUs (position = inventory index).
    pub fn gpus(&self) -> &[LedgerGpu] {
        &self.gpus
    }

    /// Every entry, by pod UID.
    pub fn entries(&self) -> &BTreeMap<String, Entry> {
        &self.entries
    }

    /// Takes in a pod (added or changed). Returns a refusal to report when
    /// the pod's decision is newly refused.
    pub fn observe(&mut self, pod: PodInfo) -> Option<Refusal> {
        if pod.node != self.node || pod.terminal || pod.decision.is_none() {
            self.forget(&pod.uid);
            return None;
        }
        let text = pod.decision.clone().unwrap_or_default();
        if let Some(old) = self.entries.get_mut(&pod.uid) {
            if old.pod.decision.as_deref() == Some(text.as_str()) {
                old.pod = pod;
                return None;
            }
            if old.state.as_ref().is_ok_and(Grant::served_any) {
                // GPUs already handed out stay with the pod as served.
                tracing::warn!(pod = %pod.key(), "decision annotation changed after allocation; ignored");
                return Some(Refusal {
                    message: "annotation gpusched.io/decision changed after the GPUs were allocated; the change is ignored".into(),
                    pod,
                });
            }
        }
        let (seq, state) = match GpuDecision::parse(&text) {
            Ok(d) => (d.seq, validate(&d, &pod, &self.node, &self.gpus)),
            Err(e) => (u64::MAX, Err(e.to_string())),
        };
        let refused = state.as_ref().err().cloned();
        let decided = match &state {
            Ok(Grant::Whole { gpus, .. }) => gpus.clone(),
            Ok(Grant::Share { gpu, .. }) => vec![*gpu],
            Err(_) => Vec::new(),
        };
        self.entries.insert(
            pod.uid.clone(),
            Entry {
                pod: pod.clone(),
                seq,
                state,
                decided,
            },
        );
        let conflict = self.recheck();
        match refused {
            Some(m) => Some(Refusal { pod, message: m }),
            None => conflict.into_iter().find(|r| r.pod.uid == pod.uid),
        }
    }

    /// The pod is gone.
    pub fn forget(&mut self, uid: &str) {
        if self.entries.remove(uid).is_some() {
            self.recheck();
        }
    }

    /// Replaces every pod (a fresh LIST). Entries that stay keep what they
    /// were served. Returns new refusals.
    pub fn replace_all(&mut self, pods: Vec<PodInfo>) -> Vec<Refusal> {
        let keep: BTreeSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
        self.entries.retain(|uid, _| keep.contains(uid));
        let mut out = Vec::new();
        for p in pods {
            if let Some(r) = self.observe(p) {
                out.push(r);
            }
        }
        self.recheck();
        out
    }

    /// Refuses live decisions that would put a GPU beyond one whole owner
    /// or beyond its shares. Served ones win, then older ones (creation,
    /// seq). Returns the newly refused.
    fn recheck(&mut self) -> Vec<Refusal> {
        // Entries refused for a conflict are reconsidered each time.
        let mut order: Vec<(bool, String, u64, String)> = Vec::new();
        for (uid, e) in &mut self.entries {
            if let Err(m) = &e.state
                && m.starts_with(CONFLICT)
                && let Some(text) = e.pod.decision.as_deref()
                && let Ok(d) = GpuDecision::parse(text)
                && let Ok(g) = validate(&d, &e.pod, &self.node, &self.gpus)
            {
                e.state = Ok(g);
            }
            if let Ok(g) = &e.state {
                order.push((!g.served_any(), e.pod.created.clone(), e.seq, uid.clone()));
            }
        }
        order.sort();
        let n = self.gpus.len();
        let mut whole: Vec<Option<String>> = vec![None; n];
        let mut milli = vec![0u32; n];
        let mut mem = vec![0u64; n];
        let mut sharer: Vec<Option<String>> = vec![None; n];
        let mut refused = Vec::new();
        // GPUs pods hold that their decisions did not name (the kubelet
        // admitted them onto another decision's GPUs), and GPUs decisions
        // named that their pods do not hold and nobody claims. The
        // scheduler, counting pods by their decisions, takes the first for
        // free and the second for held: a pending decision naming one of
        // the first is given one of the second instead of being refused.
        let mut claimed: BTreeSet<usize> = BTreeSet::new();
        let mut swapped_in: BTreeSet<usize> = BTreeSet::new();
        let mut swapped_out: BTreeSet<usize> = BTreeSet::new();
        for e in self.entries.values() {
            match &e.state {
                Ok(Grant::Whole { gpus, served, .. }) => {
                    claimed.extend(gpus.iter().copied());
                    if !served.is_empty() {
                        swapped_in.extend(gpus.iter().filter(|g| !e.decided.contains(g)));
                        swapped_out.extend(e.decided.iter().filter(|g| !gpus.contains(g)));
                    }
                }
                Ok(Grant::Share { gpu, .. }) => {
                    claimed.insert(*gpu);
                }
                Err(_) => {}
            }
        }
        let mut spare: Vec<usize> = swapped_out.difference(&claimed).copied().collect();
        for (_, _, _, uid) in order {
            let Some(e) = self.entries.get_mut(&uid) else {
                continue;
            };
            let key = e.pod.key();
            if let Ok(Grant::Whole { gpus, served, .. }) = &mut e.state
                && served.is_empty()
            {
                for g in gpus.iter_mut() {
                    if swapped_in.contains(g) && whole[*g].is_some() && !spare.is_empty() {
                        let h = spare.remove(0);
                        tracing::info!(
                            pod = %key,
                            "decided GPU {} is held by a pod the kubelet admitted onto it; GPU {} (decided for that pod, free) instead",
                            self.gpus[*g].index,
                            self.gpus[h].index
                        );
                        *g = h;
                    }
                }
            }
            let why = match &e.state {
                Ok(Grant::Whole { gpus, .. }) => gpus.iter().find_map(|&g| {
                    whole[g].as_ref().or(sharer[g].as_ref()).map(|o| {
                        format!(
                            "{CONFLICT} GPU {} is already held by pod {o}",
                            self.gpus[g].index
                        )
                    })
                }),
                Ok(Grant::Share {
                    gpu,
                    milli: m,
                    memory_mib,
                    ..
                }) => {
                    let g = *gpu;
                    if let Some(o) = &whole[g] {
                        Some(format!(
                            "{CONFLICT} GPU {} is held whole by pod {o}",
                            self.gpus[g].index
                        ))
                    } else if milli[g] + m > GPU_MILLI
                        || mem[g] + memory_mib > self.gpus[g].memory_mib
                    {
                        Some(format!(
                            "{CONFLICT} GPU {} has {} milli and {} MiB given to other pods; {m} milli and {memory_mib} MiB more would pass the GPU",
                            self.gpus[g].index, milli[g], mem[g]
                        ))
                    } else {
                        None
                    }
                }
                Err(_) => None,
            };
            match why {
                Some(m) => {
                    e.state = Err(m.clone());
                    refused.push(Refusal {
                        pod: e.pod.clone(),
                        message: m,
                    });
                }
                None => match &e.state {
                    Ok(Grant::Whole { gpus, .. }) => {
                        for &g in gpus {
                            whole[g] = Some(key.clone());
                        }
                    }
                    Ok(Grant::Share {
                        gpu,
                        milli: m,
                        memory_mib,
                        ..
                    }) => {
                        milli[*gpu] += m;
                        mem[*gpu] += memory_mib;
                        sharer[*gpu] = Some(key.clone());
                    }
                    Err(_) => {}
                },
            }
        }
        refused
    }

    fn live_order(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self.entries.values().filter(|e| e.state.is_ok()).collect();
        v.sort_by(|a, b| (&a.pod.created, a.seq).cmp(&(&b.pod.created, b.seq)));
        v
    }

    /// The candidate a call is charged to: the first that `better` likes,
    /// else the decision the previous call was charged to while it is
    /// partly served (the kubelet allocates a pod's containers one after
    /// the other), else the first in admission order.
    fn rank<'a>(&self, cands: &[&'a Entry], better: impl Fn(&Entry) -> bool) -> Option<&'a Entry> {
        let cont = |e: &Entry| {
            self.last.as_deref() == Some(e.pod.uid.as_str())
                && e.state
                    .as_ref()
                    .is_ok_and(|g| g.served_any() && !g.fully_served())
        };
        cands
            .iter()
            .find(|e| better(e))
            .or_else(|| cands.iter().find(|e| cont(e)))
            .or(cands.first())
            .copied()
    }

    /// Live whole-GPU decisions a call adding `n` GPUs may be charged to:
    /// first those expecting a call of exactly `n` (a container of that
    /// size), and only when there is none, those with `n` GPUs unserved
    /// (a pod whose layout is not known). Admission order within each.
    fn whole_candidates(&self, n: usize, ok: impl Fn(&Entry, &[usize]) -> bool) -> Vec<&Entry> {
        for exact in [true, false] {
            let v: Vec<&Entry> = self
                .live_order()
                .into_iter()
                .filter(|e| match &e.state {
                    Ok(Grant::Whole {
                        gpus,
                        served,
                        slots,
                    }) => {
                        let free = unserved(gpus, served);
                        let fits = if exact {
                            slots.iter().any(|&s| s as usize == n)
                        } else {
                            free.len() >= n
                        };
                        fits && ok(e, &free)
                    }
                    _ => false,
                })
                .collect();
            if !v.is_empty() {
                return v;
            }
        }
        Vec::new()
    }

    /// Whether a live decision expects a call of exactly `n` whole GPUs
    /// (a container of that size). When none does, the call would be
    /// charged to a decision with that much left whose layout says
    /// otherwise: likely our pod watch has not seen the caller's pod yet.
    pub fn expects_whole(&self, n: usize) -> bool {
        self.entries.values().any(|e| {
            e.state.as_ref().is_ok_and(|g| {
                matches!(g, Grant::Whole { slots, .. } if slots.iter().any(|&s| s as usize == n))
            })
        })
    }

    /// Whether a live share decision of `resource` (`None`:
    /// `gpusched.io/gpu-milli`; else a time-sliced resource) expects a call
    /// of exactly `n` milli.
    pub fn expects_share(&self, n: u32, resource: Option<&str>) -> bool {
        self.entries.values().any(|e| {
            e.state.as_ref().is_ok_and(|g| {
                matches!(g, Grant::Share { slots, resource: r, .. }
                    if slots.contains(&n) && r.as_deref() == resource)
            })
        })
    }

    /// How many of `want` no decision was served yet (what a call adds).
    pub fn new_gpus(&self, want: &[usize]) -> usize {
        want.iter()
            .filter(|g| {
                !self.entries.values().any(
                    |e| matches!(&e.state, Ok(Grant::Whole { served, .. }) if served.contains(g)),
                )
            })
            .count()
    }

    /// Whole GPUs to prefer for a container asking `size` (`docs/protocol.md`):
    /// with `must` (an init container's GPUs reused), more of the same
    /// decision; else the unserved GPUs of a decision expecting a call of
    /// exactly this size.
    pub fn preferred_whole(
        &self,
        available: &[usize],
        must: &[usize],
        size: usize,
    ) -> Option<Vec<usize>> {
        if !must.is_empty() {
            let reused = self.entries.values().find_map(|e| match &e.state {
                Ok(Grant::Whole { gpus, served, .. })
                    if must.iter().all(|m| served.contains(m)) =>
                {
                    Some(unserved(gpus, served))
                }
                _ => None,
            });
            if let Some(free) = reused {
                let mut out = must.to_vec();
                out.extend(
                    free.into_iter()
                        .filter(|g| available.contains(g))
                        .take(size.saturating_sub(must.len())),
                );
                return (out.len() == size).then_some(out);
            }
        }
        let pick = |free: &[usize]| -> Option<Vec<usize>> {
            if !must.iter().all(|m| free.contains(m)) {
                return None;
            }
            let mut out = must.to_vec();
            out.extend(
                free.iter()
                    .copied()
                    .filter(|g| available.contains(g) && !must.contains(g))
                    .take(size.saturating_sub(must.len())),
            );
            (out.len() == size).then_some(out)
        };
        let cands = self.whole_candidates(size, |_, free| pick(free).is_some());
        let e = self.rank(&cands, |_| false)?;
        match &e.state {
            Ok(Grant::Whole { gpus, served, .. }) => pick(&unserved(gpus, served)),
            _ => None,
        }
    }

    /// The MIG instances (device ids) of the MIG decision a call of
    /// `size` milli of `resource` would be charged to.
    pub fn preferred_mig(&self, size: u32, resource: &str) -> Option<Vec<String>> {
        let cands = self.share_candidates(size, Some(resource));
        match &self.rank(&cands, |_| false)?.state {
            Ok(Grant::Share { mig, .. }) if !mig.is_empty() => Some(mig.clone()),
            _ => None,
        }
    }

    /// The GPU to take share tokens from: that of the pending share
    /// decision expecting a call of exactly `size` milli (else one with
    /// that much unserved).
    pub fn preferred_share(&self, size: u32, resource: Option<&str>) -> Option<usize> {
        let cands = self.share_candidates(size, resource);
        match &self.rank(&cands, |_| false)?.state {
            Ok(Grant::Share { gpu, .. }) => Some(*gpu),
            _ => None,
        }
    }

    fn share_candidates(&self, n: u32, resource: Option<&str>) -> Vec<&Entry> {
        for exact in [true, false] {
            let v: Vec<&Entry> = self
                .live_order()
                .into_iter()
                .filter(|e| match &e.state {
                    Ok(Grant::Share {
                        milli,
                        served_milli,
                        slots,
                        resource: r,
                        mig,
                        ..
                    }) if r.as_deref() == resource => {
                        if exact {
                            slots.contains(&n)
                        } else {
                            // a MIG decision is answered with all its
                            // instances: only a call of its size
                            mig.is_empty() && milli.saturating_sub(*served_milli) >= n
                        }
                    }
                    _ => false,
                })
                .collect();
            if !v.is_empty() {
                return v;
            }
        }
        Vec::new()
    }

    fn no_whole(&self, want: &[usize]) -> Miss {
        Miss::NoDecision(format!(
            "no pod placed on node {} by gpusched holds GPUs {}; {}",
            self.node,
            self.show(want),
            self.summary()
        ))
    }

    /// Serves whole GPUs `want` (inventory positions), charging them to a
    /// decision (`docs/protocol.md`, *Allocate*).
    pub fn allocate_whole(&mut self, want: &[usize], healthy: &[bool]) -> Result<Matched, Miss> {
        // GPUs already served (a retry, an init container's GPUs reused)
        // name their decision; the others are new.
        let mut reuse: Option<String> = None;
        let mut new = Vec::new();
        for &g in want {
            let owner = self.entries.iter().find_map(|(uid, e)| match &e.state {
                Ok(Grant::Whole { served, .. }) if served.contains(&g) => Some(uid.clone()),
                _ => None,
            });
            match owner {
                Some(u) if reuse.as_ref().is_some_and(|r| *r != u) => {
                    return Err(Miss::NoDecision(format!(
                        "GPUs {} were handed to different pods; {}",
                        self.show(want),
                        self.summary()
                    )));
                }
                Some(u) => reuse = Some(u),
                None => new.push(g),
            }
        }
        let n = new.len();
        let target = match &reuse {
            Some(u) => {
                let free = match &self.entries[u].state {
                    Ok(Grant::Whole { gpus, served, .. }) => unserved(gpus, served),
                    _ => Vec::new(),
                };
                if free.len() < n {
                    return Err(self.no_whole(want));
                }
                u.clone()
            }
            None => {
                let cands = self.whole_candidates(n, |_, _| true);
                let owns_all = |e: &Entry| match &e.state {
                    Ok(Grant::Whole { gpus, served, .. }) => {
                        new.iter().all(|g| gpus.contains(g) && !served.contains(g))
                    }
                    _ => false,
                };
                match self.rank(&cands, owns_all) {
                    Some(e) => e.pod.uid.clone(),
                    None => return Err(self.no_whole(want)),
                }
            }
        };
        let tkey = self.entries[&target].pod.key();
        if let Some(&g) = want
            .iter()
            .find(|&&g| !healthy.get(g).copied().unwrap_or(false))
        {
            return Err(Miss::Refused(format!(
                "GPU {} ({}) recorded for pod {tkey} is unhealthy",
                self.gpus[g].index, self.gpus[g].uuid,
            )));
        }
        // New GPUs outside the target's unserved ones are exchanged with
        // unserved GPUs of the target. Each comes from another live
        // decision's unserved GPUs, which takes the target's in return; or
        // it is a GPU no decision names (live, or refused for a conflict
        // and waiting; whole or shared), while no decision of the node is
        // refused, which the target takes in place of one of its own: the
        // kubelet counts that one as in use (a restarted kubelet keeps the
        // devices of pods deleted before it stopped until its pod sources
        // are ready) or ignored the preference. Sizes are kept and live
        // decisions stay disjoint; the GPU given up is free, and a later
        // decision naming the GPU taken gets it (`recheck`).
        let Ok(Grant::Whole { gpus, served, .. }) = &self.entries[&target].state else {
            return Err(self.no_whole(want));
        };
        let tfree = unserved(gpus, served);
        let mut spare = tfree.iter().rev().filter(|g| !new.contains(g));
        let claimed = |g: usize| {
            self.entries.values().any(|e| match &e.state {
                Ok(Grant::Whole { gpus, .. }) => gpus.contains(&g),
                Ok(Grant::Share { gpu, .. }) => *gpu == g,
                // refused for a conflict: it comes back when the holder ends
                Err(m) => m.starts_with(CONFLICT) && e.decided.contains(&g),
            })
        };
        // With a refused decision on the node its pod may be the caller
        // (a forged or copied decision): fail closed, never hand it a GPU.
        let any_refused = self.entries.values().any(|e| e.state.is_err());
        let mut swaps: Vec<(usize, Option<String>, usize)> = Vec::new();
        for &g in new.iter().filter(|g| !tfree.contains(g)) {
            let from = self.entries.iter().find_map(|(uid, e)| match &e.state {
                Ok(Grant::Whole { gpus, served, .. })
                    if *uid != target && gpus.contains(&g) && !served.contains(&g) =>
                {
                    Some(uid.clone())
                }
                _ => None,
            });
            if from.is_none() && (any_refused || claimed(g)) {
                return Err(self.no_whole(want));
            }
            let Some(&h) = spare.next() else {
                return Err(self.no_whole(want));
            };
            swaps.push((g, from, h));
        }
        let mut note = Vec::new();
        for (g, from, h) in swaps {
            match from.and_then(|f| self.entries.get_mut(&f)) {
                Some(e) => {
                    if let Ok(Grant::Whole { gpus, .. }) = &mut e.state {
                        gpus.iter_mut().filter(|x| **x == g).for_each(|x| *x = h);
                        note.push(format!(
                            "GPU {} of pod {}'s decision taken, GPU {} given in exchange",
                            self.gpus[g].index,
                            e.pod.key(),
                            self.gpus[h].index
                        ));
                    }
                }
                None => note.push(format!(
                    "GPU {} (no decision names it) served in place of decided GPU {}, which is left free",
                    self.gpus[g].index, self.gpus[h].index
                )),
            }
            if let Some(e) = self.entries.get_mut(&target)
                && let Ok(Grant::Whole { gpus, .. }) = &mut e.state
            {
                gpus.iter_mut().filter(|x| **x == h).for_each(|x| *x = g);
            }
        }
        if let Some(e) = self.entries.get_mut(&target)
            && let Ok(Grant::Whole { served, slots, .. }) = &mut e.state
        {
            served.extend(new.iter().copied());
            if n > 0 {
                take_slot(slots, n as u32);
            }
        }
        if n > 0 {
            self.last = Some(target);
        }
        Ok(Matched {
            decision: tkey,
            note: (!note.is_empty()).then(|| note.join("; ")),
        })
    }

    /// Serves `n` milli of a share; `hint` is the GPU the kubelet's tokens
    /// came from when they all came from one.
    pub fn allocate_share(
        &mut self,
        n: u32,
        resource: Option<&str>,
        hint: Option<usize>,
        healthy: &[bool],
    ) -> Result<ShareGrant, Miss> {
        let cands = self.share_candidates(n, resource);
        let same_gpu =
            |e: &Entry| matches!(&e.state, Ok(Grant::Share { gpu, .. }) if Some(*gpu) == hint);
        let Some(uid) = self.rank(&cands, same_gpu).map(|e| e.pod.uid.clone()) else {
            return Err(Miss::NoDecision(format!(
                "no pod placed on node {} by gpusched has a pending {} of {n} milli; {}",
                self.node,
                resource.map_or("GPU share".to_string(), |r| format!(
                    "share of {r} replicas"
                )),
                self.summary()
            )));
        };
        let e = self
            .entries
            .get_mut(&uid)
            .ok_or_else(|| Miss::NoDecision("gone".into()))?;
        let key = e.pod.key();
        let Ok(Grant::Share {
            gpu,
            milli,
            memory_mib,
            served_milli,
            slots,
            mig,
            ..
        }) = &mut e.state
        else {
            return Err(Miss::NoDecision("not a share".into()));
        };
        if !healthy.get(*gpu).copied().unwrap_or(false) {
            return Err(Miss::Refused(format!(
                "GPU {} ({}) recorded for pod {key} is unhealthy",
                self.gpus[*gpu].index, self.gpus[*gpu].uuid
            )));
        }
        *served_milli += n;
        take_slot(slots, n);
        let out = ShareGrant {
            pod: key,
            gpu: *gpu,
            milli: *milli,
            memory_mib: *memory_mib,
            mig: mig.clone(),
        };
        self.last = Some(uid);
        Ok(out)
    }

    /// Takes in what the kubelet says each pod holds (PodResources `List`,
    /// by namespace/name): after a restart, and again now and then so that
    /// a pod the kubelet admitted onto another decision's GPUs is known by
    /// the GPUs it really has (`docs/protocol.md`, *Restart*). Whole GPUs:
    /// a listed pod's decision becomes exactly what it holds; decisions of
    /// pods not admitted yet whose GPUs another pod holds take the GPUs
    /// that pod's decision no longer needs. Shares (only with `restart`:
    /// tokens do not say which GPU's share a container was given): the
    /// milli the pod's tokens count. Returns how many pods matched a
    /// decision, or `None` when the list disagrees with what was served
    /// (a call in flight): nothing is changed then.
    pub fn reconcile(
        &mut self,
        held: &BTreeMap<(String, String), HeldPod>,
        restart: bool,
    ) -> Option<Reconciled> {
        let by_key: BTreeMap<(String, String), String> = self
            .entries
            .iter()
            .map(|(u, e)| ((e.pod.namespace.clone(), e.pod.name.clone()), u.clone()))
            .collect();
        let all_held: BTreeSet<usize> = held
            .values()
            .flat_map(|h| h.whole.iter().copied())
            .collect();
        let served_now: BTreeSet<usize> = self
            .entries
            .values()
            .filter_map(|e| match &e.state {
                Ok(Grant::Whole { served, .. }) => Some(served.iter().copied()),
                _ => None,
            })
            .flatten()
            .collect();
        if !served_now.is_subset(&all_held) {
            return None;
        }
        // Whole GPUs held by listed pods with a whole decision.
        let mut owner: BTreeMap<usize, String> = BTreeMap::new();
        let mut listed: Vec<(String, Vec<usize>)> = Vec::new();
        for (k, h) in held {
            let Some(uid) = by_key.get(k) else { continue };
            if h.whole.is_empty() || !matches!(self.entries[uid].state, Ok(Grant::Whole { .. })) {
                continue;
            }
            let v: Vec<usize> = h
                .whole
                .iter()
                .copied()
                .filter(|&g| g < self.gpus.len())
                .collect();
            for &g in &v {
                owner.insert(g, uid.clone());
            }
            listed.push((uid.clone(), v));
        }
        let mut out = Reconciled::default();
        let mut freed: Vec<usize> = Vec::new();
        for (uid, h) in &listed {
            let Some(e) = self.entries.get_mut(uid) else {
                continue;
            };
            let key = e.pod.key();
            let Ok(Grant::Whole {
                gpus,
                served,
                slots,
            }) = &mut e.state
            else {
                continue;
            };
            out.restored += 1;
            let hs: BTreeSet<usize> = h.iter().copied().collect();
            if *served == hs && hs.iter().all(|g| gpus.contains(g)) {
                continue;
            }
            let mut next: Vec<usize> = h.clone();
            for &g in gpus.iter() {
                if next.len() >= gpus.len().max(h.len()) {
                    break;
                }
                if !owner.contains_key(&g) && !next.contains(&g) {
                    next.push(g);
                }
            }
            freed.extend(gpus.iter().copied().filter(|g| !next.contains(g)));
            if hs.iter().any(|g| !gpus.contains(g)) {
                let show = |v: &[usize]| {
                    v.iter()
                        .map(|&g| self.gpus[g].index.to_string())
                        .collect::<Vec<_>>()
                        .join(",")
                };
                out.moved.push(format!(
                    "pod {key} holds GPUs [{}], its decision named [{}]",
                    show(h),
                    show(gpus)
                ));
            }
            let left = (next.len() - hs.len()) as u32;
            *gpus = next;
            *served = hs;
            *slots = if left > 0 { vec![left] } else { Vec::new() };
        }
        // Decisions of pods not listed: GPUs a listed pod holds are not
        // theirs (served to another pod's call, or decided for them and
        // taken): they get freed GPUs instead, and expect the calls again.
        let listed_uids: BTreeSet<&String> = listed.iter().map(|(u, _)| u).collect();
        let uids: Vec<String> = self
            .live_order()
            .into_iter()
            .map(|e| e.pod.uid.clone())
            .filter(|u| !listed_uids.contains(u))
            .collect();
        freed.sort_unstable();
        freed.dedup();
        let mut pool: Vec<usize> = freed
            .into_iter()
            .filter(|g| !all_held.contains(g))
            .rev()
            .collect();
        for uid in uids {
            let Some(e) = self.entries.get_mut(&uid) else {
                continue;
            };
            match &mut e.state {
                Ok(Grant::Whole {
                    gpus,
                    served,
                    slots,
                }) => {
                    served.retain(|g| !owner.contains_key(g));
                    for g in gpus.iter_mut() {
                        if owner.contains_key(g)
                            && let Some(h) = pool.pop()
                        {
                            *g = h;
                        }
                    }
                    let want = gpus.len().saturating_sub(served.len()) as u32;
                    let have: u32 = slots.iter().sum();
                    if have < want {
                        slots.push(want - have);
                    }
                }
                Ok(Grant::Share {
                    milli,
                    served_milli,
                    slots,
                    ..
                }) if restart && *served_milli == 0 => {
                    let Some(h) = held.get(&(e.pod.namespace.clone(), e.pod.name.clone())) else {
                        continue;
                    };
                    if h.milli == 0 {
                        continue;
                    }
                    *served_milli = h.milli.min(*milli);
                    *slots = if *served_milli < *milli {
                        vec![*milli - *served_milli]
                    } else {
                        Vec::new()
                    };
                    out.restored += 1;
                }
                _ => {}
            }
        }
        self.correct_replica_swaps(held, &mut out);
        self.correct_mig_swaps(held, &mut out);
        self.recheck();
        Some(out)
    }

    /// Replica decisions of one size on different GPUs are swapped when
    /// the kubelet admits their pods in another order than the agent
    /// guessed (a call does not say which pod makes it). PodResources
    /// names the pod holding the replica ids, and the agent knows which
    /// GPU it named for them: a listed pod told GPU `g` while its decision
    /// names another exchanges GPU and served state with the served
    /// decision of that size on `g` whose own pod is not there (the one
    /// charged for its call): the pod's decision is then served on `g`, and
    /// the other stands for what the pod's decision stood for. Each
    /// GPU keeps the replicas it held; the published allocations and the
    /// held table then follow the pods. Skipped for a (resource, size)
    /// while its served decisions and listed pods differ in number (a call
    /// the kubelet has not recorded yet).
    /// Pods holding other MIG instances than their decision named (their
    /// call was charged to another pending decision of the same size, or
    /// the kubelet took ids of its own): the pod's decision exchanges
    /// instances, GPU and served state with the decision whose instances
    /// the pod's containers were told (`HeldPod::mig`), so that every
    /// decision stands for the pod really holding its instances
    /// (`gpusched.io/allocations`, and the instances freed when it ends).
    /// Two share decisions exchange GPU and served state (slots, served
    /// milli, MIG instances, which go with their GPU): `p`'s becomes where
    /// its pod is, `q`'s carries what `p`'s decision stood for. False (and
    /// nothing changed) unless both are shares.
    fn exchange_shares(&mut self, p: &str, q: &str) -> bool {
        let state = |l: &Ledger, u: &str| match l.entries.get(u).map(|e| &e.state) {
            Some(Ok(Grant::Share {
                gpu,
                served_milli,
                slots,
                mig,
                ..
            })) => Some((*gpu, *served_milli, slots.clone(), mig.clone())),
            _ => None,
        };
        let (Some(sp), Some(sq)) = (state(self, p), state(self, q)) else {
            return false;
        };
        for (u, (to, sm, sl, mg)) in [(p, sq), (q, sp)] {
            if let Some(e) = self.entries.get_mut(u)
                && let Ok(Grant::Share {
                    gpu,
                    served_milli,
                    slots,
                    mig,
                    ..
                }) = &mut e.state
            {
                *gpu = to;
                *served_milli = sm;
                *slots = sl;
                *mig = mg;
            }
        }
        true
    }

    fn correct_mig_swaps(
        &mut self,
        held: &BTreeMap<(String, String), HeldPod>,
        out: &mut Reconciled,
    ) {
        let uids: Vec<String> = self.entries.keys().cloned().collect();
        for p in uids {
            let Some(e) = self.entries.get(&p) else {
                continue;
            };
            let Ok(Grant::Share {
                mig,
                resource: Some(res),
                milli,
                ..
            }) = &e.state
            else {
                continue;
            };
            let Some(h) = held.get(&(e.pod.namespace.clone(), e.pod.name.clone())) else {
                continue;
            };
            let have: BTreeSet<String> = mig.iter().cloned().collect();
            if mig.is_empty() || h.mig.len() != have.len() || h.mig == have {
                continue;
            }
            let (res, milli) = (res.clone(), *milli);
            let partner = self
                .entries
                .iter()
                .find(|(u, x)| {
                    **u != p
                        && matches!(&x.state, Ok(Grant::Share { mig: m, resource: Some(r), milli: mm, .. })
                            if *r == res && *mm == milli
                                && m.iter().cloned().collect::<BTreeSet<String>>() == h.mig)
                })
                .map(|(u, _)| u.clone());
            let Some(q) = partner else {
                continue;
            };
            if !self.exchange_shares(&p, &q) {
                continue;
            }
            if let Some(e) = self.entries.get(&p) {
                out.moved.push(format!(
                    "pod {} holds MIG instances {:?}, its decision named {:?}",
                    e.pod.key(),
                    h.mig,
                    have
                ));
            }
        }
    }

    fn correct_replica_swaps(
        &mut self,
        held: &BTreeMap<(String, String), HeldPod>,
        out: &mut Reconciled,
    ) {
        // listed replica pods: uid → (resource, milli, GPU told)
        let mut listed: BTreeMap<String, (String, u32, usize)> = BTreeMap::new();
        for e in self.entries.values() {
            let Ok(Grant::Share {
                milli,
                resource: Some(r),
                ..
            }) = &e.state
            else {
                continue;
            };
            if let Some(h) = held.get(&(e.pod.namespace.clone(), e.pod.name.clone()))
                && h.milli == *milli
                && let Some(g) = h.replica_gpu
                && g < self.gpus.len()
            {
                listed.insert(e.pod.uid.clone(), (r.clone(), *milli, g));
            }
        }
        let uids: Vec<String> = listed.keys().cloned().collect();
        for p in uids {
            let (res, milli, g) = listed[&p].clone();
            let Some(Ok(Grant::Share {
                gpu: decided,
                served_milli: served_p,
                ..
            })) = self.entries.get(&p).map(|e| &e.state)
            else {
                continue;
            };
            let decided = *decided;
            // in place: on its GPU and served (a pod listed on its own GPU
            // whose call was charged to another decision there is not)
            if decided == g && *served_p > 0 {
                continue;
            }
            let same = |st: &Result<Grant, String>| {
                matches!(st, Ok(Grant::Share { milli: m, resource: Some(r), .. })
                    if *m == milli && *r == res)
            };
            let served = self
                .entries
                .values()
                .filter(|e| {
                    same(&e.state)
                        && matches!(e.state, Ok(Grant::Share { served_milli, .. }) if served_milli > 0)
                })
                .count();
            let on_list = listed
                .values()
                .filter(|(r, m, _)| *r == res && *m == milli)
                .count();
            if served != on_list {
                continue;
            }
            // the decision of this size charged for it on g: a served one
            // whose own pod is not listed on g (not listed first)
            let partner = self
                .live_order()
                .into_iter()
                .filter(|e| e.pod.uid != p && same(&e.state))
                .filter(|e| {
                    matches!(e.state, Ok(Grant::Share { gpu, served_milli, .. })
                        if gpu == g && served_milli > 0)
                })
                .filter(|e| listed.get(&e.pod.uid).is_none_or(|x| x.2 != g))
                .min_by_key(|e| listed.contains_key(&e.pod.uid))
                .map(|e| e.pod.uid.clone());
            let Some(q) = partner else { continue };
            // the two decisions exchange GPU and served state: p's is where
            // its pod is, q's carries what p's decision stood for
            // (MIG instances go with their GPU)
            if !self.exchange_shares(&p, &q) {
                continue;
            }
            if let Some(e) = self.entries.get(&p)
                && decided != g
            {
                out.moved.push(format!(
                    "pod {} holds replicas of GPU {}, its decision named GPU {}",
                    e.pod.key(),
                    self.gpus[g].index,
                    self.gpus[decided].index
                ));
            }
        }
    }

    /// Per GPU: whole owner, or Σ milli of served shares.
    pub fn held(&self) -> Vec<(Option<String>, u32)> {
        let mut out = vec![(None, 0u32); self.gpus.len()];
        for e in self.entries.values() {
            match &e.state {
                Ok(Grant::Whole { served, .. }) => {
                    for &g in served {
                        out[g].0 = Some(e.pod.key());
                    }
                }
                Ok(Grant::Share {
                    gpu,
                    milli,
                    served_milli,
                    ..
                }) if *served_milli > 0 => out[*gpu].1 += milli,
                _ => {}
            }
        }
        out
    }

    fn show(&self, gpus: &[usize]) -> String {
        let v: Vec<String> = gpus
            .iter()
            .map(|&g| format!("{} ({})", self.gpus[g].index, self.gpus[g].uuid))
            .collect();
        format!("[{}]", v.join(", "))
    }

    /// Pending and refused decisions, for error messages (bounded).
    pub fn summary(&self) -> String {
        let mut pending = Vec::new();
        let mut refused = Vec::new();
        for e in self.live_order() {
            if !e.is_pending() {
                continue;
            }
            match &e.state {
                Ok(Grant::Whole { gpus, .. }) => {
                    let idx: Vec<String> = gpus
                        .iter()
                        .map(|&g| self.gpus[g].index.to_string())
                        .collect();
                    pending.push(format!("{} → GPUs [{}]", e.pod.key(), idx.join(",")))
                }
                Ok(Grant::Share { gpu, milli, .. }) => pending.push(format!(
                    "{} → {milli} milli of GPU {}",
                    e.pod.key(),
                    self.gpus[*gpu].index
                )),
                Err(_) => {}
            }
        }
        for e in self.entries.values() {
            if let Err(m) = &e.state {
                refused.push(format!("{}: {m}", e.pod.key()));
            }
        }
        let cut = |v: Vec<String>| {
            let n = v.len();
            let mut s: Vec<String> = v.into_iter().take(8).collect();
            if n > 8 {
                s.push(format!("… {} more", n - 8));
            }
            if s.is_empty() {
                "none".to_string()
            } else {
                s.join("; ")
            }
        };
        format!(
            "pending decisions: {}; refused decisions: {}",
            cut(pending),
            cut(refused)
        )
    }
}

const CONFLICT: &str = "conflict:";

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_model::protocol::DECISION_VERSION;

    fn gpus(n: u32) -> Vec<LedgerGpu> {
        (0..n)
            .map(|i| LedgerGpu {
                index: i,
                uuid: format!("GPU-{i}"),
                memory_mib: 80 * 1024,
            })
            .collect()
    }

    fn pod(name: &str, created: &str, idx: &[u32], share: Option<(u32, u64)>) -> PodInfo {
        let d = GpuDecision {
            v: DECISION_VERSION,
            uid: format!("u-{name}"),
            node: "n".into(),
            seq: 1,
            indices: idx.to_vec(),
            gpus: idx.iter().map(|i| format!("GPU-{i}")).collect(),
            share: share.map(|(milli, memory_mib)| ShareDecision {
                milli,
                memory_mib,
                resource: None,
                replicas: None,
            }),
            mig: None,
        };
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("u-{name}"),
            node: "n".into(),
            created: created.into(),
            decision: Some(d.to_annotation()),
            terminal: false,
            containers: Vec::new(),
        }
    }

    fn replica_pod(name: &str, created: &str, gpu: u32, milli: u32) -> PodInfo {
        let mut p = pod(name, created, &[gpu], Some((milli, 0)));
        let mut d = GpuDecision::parse(p.decision.as_deref().unwrap()).unwrap();
        let s = d.share.as_mut().unwrap();
        s.resource = Some("nvidia.com/gpu.shared".into());
        s.replicas = Some(milli / 125);
        p.decision = Some(d.to_annotation());
        p
    }

    fn replica_held(v: &[(&str, u32, usize)]) -> BTreeMap<(String, String), HeldPod> {
        v.iter()
            .map(|(name, milli, g)| {
                (
                    ("ns".to_string(), name.to_string()),
                    HeldPod {
                        whole: BTreeSet::new(),
                        milli: *milli,
                        replica_gpu: Some(*g),
                        mig: BTreeSet::new(),
                    },
                )
            })
            .collect()
    }

    fn share_gpus(l: &Ledger) -> Vec<(String, usize, u32)> {
        l.entries()
            .values()
            .filter_map(|e| match &e.state {
                Ok(Grant::Share {
                    gpu, served_milli, ..
                }) => Some((e.pod.name.clone(), *gpu, *served_milli)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn swapped_replica_pods_are_corrected_from_pod_resources() {
        let r = Some("nvidia.com/gpu.shared");
        let ok = vec![true; 2];
        let mut l = Ledger::new("n", gpus(2));
        l.observe(replica_pod("a", "1", 0, 125));
        l.observe(replica_pod("b", "2", 1, 125));
        // b's pod calls first (ids of GPU 1, but the agent cannot tell the
        // caller): charged to a, the older decision, and told GPU 0
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
        // PodResources: b holds the replicas told GPU 0; a is not listed
        let out = l.reconcile(&replica_held(&[("b", 125, 0)]), false).unwrap();
        assert_eq!(out.moved.len(), 1, "{out:?}");
        assert!(
            out.moved[0].contains("pod ns/b holds replicas of GPU 0, its decision named GPU 1")
        );
        assert_eq!(
            share_gpus(&l),
            vec![("a".into(), 1, 0), ("b".into(), 0, 125)],
            "b served on GPU 0, a now expects its call on GPU 1"
        );
        // a's call: told GPU 1, the GPU really free
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
        let out = l
            .reconcile(&replica_held(&[("b", 125, 0), ("a", 125, 1)]), false)
            .unwrap();
        assert!(out.moved.is_empty());
        assert_eq!(l.held()[0].1, 125);
        assert_eq!(l.held()[1].1, 125);
        // both calls made before PodResources is read: both swapped
        let mut l = Ledger::new("n", gpus(2));
        l.observe(replica_pod("a", "1", 0, 125));
        l.observe(replica_pod("b", "2", 1, 125));
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
        // b got GPU 0 and a GPU 1
        l.reconcile(&replica_held(&[("b", 125, 0), ("a", 125, 1)]), false)
            .unwrap();
        assert_eq!(
            share_gpus(&l),
            vec![("a".into(), 1, 125), ("b".into(), 0, 125)]
        );
        // three of one size: b's pod takes a's decision (GPU 0), c's pod
        // takes b's (GPU 1, c's own GPU): both end up served where they are
        let mut l = Ledger::new("n", gpus(2));
        l.observe(replica_pod("a", "1", 0, 125));
        l.observe(replica_pod("b", "2", 1, 125));
        l.observe(replica_pod("c", "3", 1, 125));
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 0);
        assert_eq!(l.allocate_share(125, r, None, &ok).unwrap().gpu, 1);
        l.reconcile(&replica_held(&[("b", 125, 0), ("c", 125, 1)]), false)
            .unwrap();
        assert_eq!(
            share_gpus(&l),
            vec![
                ("a".into(), 1, 0),
                ("b".into(), 0, 125),
                ("c".into(), 1, 125)
            ]
        );
        // a call not recorded by the kubelet yet: nothing is changed
        let mut l = Ledger::new("n", gpus(2));
        l.observe(replica_pod("a", "1", 0, 125));
        l.observe(replica_pod("b", "2", 1, 125));
        l.allocate_share(125, r, None, &ok).unwrap();
        l.allocate_share(125, r, None, &ok).unwrap();
        l.reconcile(&replica_held(&[("b", 125, 0)]), false).unwrap();
        assert_eq!(
            share_gpus(&l),
            vec![("a".into(), 0, 125), ("b".into(), 1, 125)]
        );
    }

    #[test]
    fn conflict_refused_decision_comes_back_when_the_holder_ends() {
        let mut l = Ledger::new("n", gpus(4));
        assert!(l.observe(pod("a", "1", &[0], None)).is_none());
        let r = l.observe(pod("b", "2", &[0, 1], None)).expect("b refused");
        assert!(
            r.message.contains("GPU 0 is already held by pod ns/a"),
            "{}",
            r.message
        );
        let ok = vec![true; 4];
        assert!(l.allocate_whole(&[1], &ok).is_err());
        let mut a = pod("a", "1", &[0], None);
        a.terminal = true;
        l.observe(a);
        assert_eq!(l.allocate_whole(&[0, 1], &ok).unwrap().decision, "ns/b");
    }

    #[test]
    fn served_decision_beats_an_older_pending_one() {
        let mut l = Ledger::new("n", gpus(2));
        l.observe(pod("young", "5", &[1], None));
        assert!(l.allocate_whole(&[1], &[true, true]).is_ok());
        // An older pod claiming the same GPU shows up late: refused, the
        // GPU stays with the pod that has it.
        assert!(l.observe(pod("old", "1", &[1], None)).is_some());
        assert_eq!(l.held()[1].0.as_deref(), Some("ns/young"));
    }

    #[test]
    fn annotation_changed_after_allocation_is_ignored() {
        let mut l = Ledger::new("n", gpus(4));
        l.observe(pod("a", "1", &[0], None));
        l.allocate_whole(&[0], &[true; 4]).unwrap();
        let mut moved = pod("a", "1", &[3], None);
        moved.uid = "u-a".into();
        let r = l.observe(moved).expect("reported");
        assert!(r.message.contains("changed after the GPUs were allocated"));
        assert_eq!(l.held()[0].0.as_deref(), Some("ns/a"));
        assert!(l.allocate_whole(&[3], &[true; 4]).is_err());
    }

    #[test]
    fn multi_container_pod_spends_its_gpus_per_container() {
        let mut l = Ledger::new("n", gpus(4));
        l.observe(pod("a", "1", &[0, 1, 2], None));
        assert_eq!(l.preferred_whole(&[0, 1, 2, 3], &[], 2), Some(vec![0, 1]));
        l.allocate_whole(&[0, 1], &[true; 4]).unwrap();
        // The second container: the decision's remaining GPU.
        assert_eq!(l.preferred_whole(&[2, 3], &[], 1), Some(vec![2]));
        l.allocate_whole(&[2], &[true; 4]).unwrap();
        assert!(l.preferred_whole(&[3], &[], 1).is_none());
    }

    #[test]
    fn share_memory_is_bounded_by_the_gpu() {
        let mut l = Ledger::new("n", gpus(1));
        assert!(
            l.observe(pod("s1", "1", &[0], Some((100, 60 * 1024))))
                .is_none()
        );
        let r = l
            .observe(pod("s2", "2", &[0], Some((100, 30 * 1024))))
            .expect("refused");
        assert!(r.message.contains("would pass the GPU"), "{}", r.message);
        let too_big = pod("s3", "3", &[0], Some((100, 100 * 1024)));
        let r = l.observe(too_big).expect("refused");
        assert!(r.message.contains("exceeds GPU 0's"), "{}", r.message);
    }

    #[test]
    fn wrong_node_and_bad_shapes_are_refused() {
        let mut l = Ledger::new("other", gpus(2));
        let mut p = pod("a", "1", &[0], None);
        p.node = "other".into();
        let r = l.observe(p).expect("refused");
        assert!(r.message.contains("made for node \"n\""), "{}", r.message);
        let mut l = Ledger::new("n", gpus(2));
        let r = l.observe(pod("b", "1", &[0, 0], None)).expect("refused");
        assert!(r.message.contains("named twice"), "{}", r.message);
        let r = l.observe(pod("c", "1", &[5], None)).expect("refused");
        assert!(r.message.contains("does not exist"), "{}", r.message);
        let mut long = pod("d", "1", &[0], None);
        long.decision = Some(" ".repeat(20_000));
        let r = l.observe(long).expect("refused");
        assert!(r.message.contains("limit"), "{}", r.message);
    }

    fn ask(init: bool, sidecar: bool, gpus: u32) -> ContainerAsk {
        ContainerAsk {
            init,
            sidecar,
            gpus,
            milli: 0,
        }
    }

    #[test]
    fn calls_follow_the_kubelets_init_container_reuse() {
        let f = |a: &[ContainerAsk]| new_devices_per_call(a, |c| c.gpus);
        // Two app containers: two calls.
        assert_eq!(f(&[ask(false, false, 2), ask(false, false, 1)]), vec![2, 1]);
        // An init container of 2 reused by an app container of 3: 2 then 1.
        assert_eq!(f(&[ask(true, false, 2), ask(false, false, 3)]), vec![2, 1]);
        // Reused entirely: the app container's call adds nothing.
        assert_eq!(f(&[ask(true, false, 2), ask(false, false, 1)]), vec![2]);
        // Init devices reused once, then gone: 2, then 0 new, then 2.
        assert_eq!(
            f(&[
                ask(true, false, 2),
                ask(false, false, 2),
                ask(false, false, 2)
            ]),
            vec![2, 2]
        );
        // A sidecar keeps its devices: the next container needs its own.
        assert_eq!(f(&[ask(true, true, 1), ask(false, false, 1)]), vec![1, 1]);
        // Containers without GPUs make no call.
        assert_eq!(f(&[ask(false, false, 0), ask(false, false, 1)]), vec![1]);
        // Huge limits: the reused count never passes the largest ask.
        assert_eq!(
            f(&[
                ask(true, false, u32::MAX),
                ask(true, false, u32::MAX),
                ask(false, false, 1)
            ]),
            vec![u32::MAX]
        );
        // A spec that does not add up to the decision: one call of all of it.
        let mut l = Ledger::new("n", gpus(2));
        let mut p = pod("a", "1", &[0, 1], None);
        p.containers = vec![ask(true, false, u32::MAX), ask(false, false, u32::MAX)];
        assert!(l.observe(p).is_none());
        assert_eq!(l.preferred_whole(&[0, 1], &[], 2), Some(vec![0, 1]));
    }

    #[test]
    fn a_container_is_matched_by_its_own_size() {
        // A 2-container pod (1 + 1 GPUs, decision [0, 1]) and a 2-GPU
        // single-container pod (decision [2, 3]), created in that order.
        let mut two = pod("two", "1", &[0, 1], None);
        two.containers = vec![ask(false, false, 1), ask(false, false, 1)];
        let big = pod("big", "2", &[2, 3], None);
        let mut l = Ledger::new("n", gpus(4));
        l.observe(two);
        l.observe(big);
        let ok = [true; 4];
        // The 2-GPU pod comes first: it goes to the decision expecting 2.
        assert_eq!(l.preferred_whole(&[0, 1, 2, 3], &[], 2), Some(vec![2, 3]));
        assert_eq!(l.allocate_whole(&[2, 3], &ok).unwrap().decision, "ns/big");
        assert_eq!(l.preferred_whole(&[0, 1], &[], 1), Some(vec![0]));
        l.allocate_whole(&[0], &ok).unwrap();
        assert_eq!(l.preferred_whole(&[1], &[], 1), Some(vec![1]));
        l.allocate_whole(&[1], &ok).unwrap();
        assert!(l.entries().values().all(|e| !e.is_pending()));
    }

    #[test]
    fn gpus_of_another_pending_decision_are_exchanged() {
        let mut l = Ledger::new("n", gpus(4));
        l.observe(pod("a", "1", &[0], None));
        l.observe(pod("b", "2", &[2, 3], None));
        let ok = [true; 4];
        // The kubelet ignores the preference: a 1-GPU call on GPU 3.
        let m = l.allocate_whole(&[3], &ok).unwrap();
        assert_eq!(m.decision, "ns/a");
        assert!(m.note.unwrap().contains("GPU 3 of pod ns/b"));
        // b still expects 2 GPUs, now [2, 0].
        assert_eq!(l.preferred_whole(&[0, 1, 2], &[], 2), Some(vec![2, 0]));
        assert_eq!(l.allocate_whole(&[0, 2], &ok).unwrap().decision, "ns/b");
        // GPU 1 is nobody's.
        assert!(matches!(
            l.allocate_whole(&[1], &ok),
            Err(Miss::NoDecision(m)) if m.contains("holds GPUs [1 (GPU-1)]")
        ));
    }

    /// Issue 29, seen on a real kubelet: a kubelet restarted after pods
    /// were deleted keeps their devices in use until its pod sources are
    /// ready, so it cannot give pods admitted in its first batch the GPUs
    /// the scheduler decided (free in fact) and picks GPUs no decision
    /// names. Those are served in place of the decided ones (sizes kept,
    /// one owner per GPU); a later decision onto the GPU taken, from a
    /// scheduler that has not seen the allocations yet, gets the one left
    /// free; a GPU with a share on it is never taken whole.
    #[test]
    fn a_free_gpu_the_kubelet_picks_replaces_a_decided_gpu_it_counts_as_busy() {
        let mut l = Ledger::new("n", gpus(16));
        l.observe(pod("a", "1", &[4], None));
        l.observe(pod("b", "1", &[5], None));
        l.observe(pod("s", "1", &[9], Some((300, 0))));
        let ok = [true; 16];
        // GPU 4 and 5 are busy for the kubelet: it picks 14 for a 1-GPU pod.
        let m = l.allocate_whole(&[14], &ok).unwrap();
        assert_eq!(m.decision, "ns/a");
        assert!(
            m.note
                .as_deref()
                .unwrap()
                .contains("GPU 14 (no decision names it) served in place of decided GPU 4"),
            "{m:?}"
        );
        // b still gets its own size; a GPU with a share is not free.
        assert!(l.allocate_whole(&[9], &ok).is_err());
        assert_eq!(l.allocate_whole(&[15], &ok).unwrap().decision, "ns/b");
        assert_eq!(l.held()[14].0.as_deref(), Some("ns/a"));
        assert_eq!(l.held()[15].0.as_deref(), Some("ns/b"));
        assert_eq!(l.held()[4].0, None);
        assert_eq!(l.held()[5].0, None);
        // The scheduler, not having seen the allocations, decides GPU 14
        // for c: c gets one of the GPUs left free instead of a refusal.
        assert!(l.observe(pod("c", "2", &[14], None)).is_none());
        let p = l.preferred_whole(
            &(0..16).filter(|&g| g != 14 && g != 15).collect::<Vec<_>>(),
            &[],
            1,
        );
        assert!(matches!(p.as_deref(), Some([4]) | Some([5])), "{p:?}");
        let g = p.unwrap()[0];
        assert_eq!(l.allocate_whole(&[g], &ok).unwrap().decision, "ns/c");
        // Nothing pending: a free GPU is nobody's.
        assert!(matches!(
            l.allocate_whole(&[0], &ok),
            Err(Miss::NoDecision(_))
        ));
        // With a refused decision on the node (its pod may be the caller)
        // a free GPU is refused.
        l.observe(pod("d", "3", &[7], None));
        let mut forged = pod("f", "3", &[1], None);
        forged.uid = "someone-else".into();
        assert!(l.observe(forged).is_some());
        assert!(matches!(
            l.allocate_whole(&[0], &ok),
            Err(Miss::NoDecision(_))
        ));
        assert_eq!(l.allocate_whole(&[7], &ok).unwrap().decision, "ns/d");
    }

    fn held(v: &[(&str, &[usize], u32)]) -> BTreeMap<(String, String), HeldPod> {
        v.iter()
            .map(|(name, whole, milli)| {
                (
                    ("ns".to_string(), name.to_string()),
                    HeldPod {
                        whole: whole.iter().copied().collect(),
                        milli: *milli,
                        replica_gpu: None,
                        mig: BTreeSet::new(),
                    },
                )
            })
            .collect()
    }

    fn holdings(l: &Ledger) -> Vec<(String, Vec<usize>)> {
        l.entries()
            .values()
            .filter_map(|e| match &e.state {
                Ok(Grant::Whole { served, .. }) if !served.is_empty() => {
                    Some((e.pod.name.clone(), served.iter().copied().collect()))
                }
                _ => None,
            })
            .collect()
    }

    /// Issue 29 item 3: after a restart, pods that hold other GPUs than
    /// their decision (swapped by the kubelet) are rebuilt from what
    /// PodResources lists, and a pending pod whose GPU a swapped pod holds
    /// takes the GPU that pod's decision no longer needs.
    #[test]
    fn restart_rebuilds_swapped_pods_exactly() {
        let mut l = Ledger::new("n", gpus(8));
        for (name, idx) in [
            ("a", &[0][..]),
            ("b", &[1]),
            ("c", &[2, 3]),
            ("d", &[4, 5]),
            ("e", &[6]),
            ("f", &[7]),
        ] {
            assert!(l.observe(pod(name, "1", idx, None)).is_none());
        }
        let r = l
            .reconcile(
                &held(&[
                    ("a", &[7], 0),
                    ("b", &[1], 0),
                    ("c", &[4, 5], 0),
                    ("d", &[2, 3], 0),
                    ("e", &[6], 0),
                ]),
                true,
            )
            .unwrap();
        assert_eq!(r.restored, 5);
        assert_eq!(r.moved.len(), 3, "{:?}", r.moved);
        assert_eq!(
            holdings(&l),
            vec![
                ("a".to_string(), vec![7]),
                ("b".to_string(), vec![1]),
                ("c".to_string(), vec![4, 5]),
                ("d".to_string(), vec![2, 3]),
                ("e".to_string(), vec![6]),
            ]
        );
        let held_table: Vec<Option<String>> = l.held().into_iter().map(|h| h.0).collect();
        assert_eq!(held_table[0], None);
        assert_eq!(held_table[7].as_deref(), Some("ns/a"));
        // f (decided GPU 7, which a holds) is pending on GPU 0 now.
        assert!(l.entries().values().all(|e| e.state.is_ok()));
        let ok = [true; 8];
        assert_eq!(l.preferred_whole(&[0], &[], 1), Some(vec![0]));
        assert_eq!(l.allocate_whole(&[0], &ok).unwrap().decision, "ns/f");
        // a ends: its real GPU (7) is free, not its decided one.
        l.forget("u-a");
        assert_eq!(l.held()[7].0, None);
        assert_eq!(l.held()[0].0.as_deref(), Some("ns/f"));
    }

    /// While running: the calls of two same-size pods were charged to each
    /// other's decision; PodResources tells who holds what, and the pod
    /// that ends frees the GPUs it really held.
    #[test]
    fn pod_resources_names_the_real_holder_while_running() {
        let mut l = Ledger::new("n", gpus(4));
        l.observe(pod("a", "1", &[0], None));
        l.observe(pod("b", "2", &[1], None));
        let ok = [true; 4];
        // b is admitted first and charged to a's decision (GPU 0).
        assert_eq!(l.allocate_whole(&[0], &ok).unwrap().decision, "ns/a");
        // A list that misses the call in flight changes nothing.
        assert!(l.reconcile(&held(&[]), false).is_none());
        // b holds 0; a is not admitted yet.
        l.reconcile(&held(&[("b", &[0], 0)]), false).unwrap();
        assert_eq!(holdings(&l), vec![("b".to_string(), vec![0])]);
        // a comes: the GPU left is 1, charged to a.
        assert_eq!(l.preferred_whole(&[1, 2, 3], &[], 1), Some(vec![1]));
        assert_eq!(l.allocate_whole(&[1], &ok).unwrap().decision, "ns/a");
        l.reconcile(&held(&[("b", &[0], 0), ("a", &[1], 0)]), false)
            .unwrap();
        // b ends: GPU 0 is free, a keeps GPU 1.
        l.forget("u-b");
        assert_eq!(l.held()[0].0, None);
        assert_eq!(l.held()[1].0.as_deref(), Some("ns/a"));
    }
}

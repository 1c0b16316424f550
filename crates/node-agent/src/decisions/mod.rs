//! The agent's side of the scheduler ↔ agent protocol (`docs/protocol.md`):
//! the decisions recorded on the pods bound to this node, which of their
//! GPUs the kubelet has been given, and the matching of the kubelet's ids
//! to them. Pure: no I/O, no clock; the pod watch and the gRPC server feed
//! it.

//!
//! Layout: this file holds the types, the ledger and what it shows
//! (holdings, summary); `validate.rs` checks one decision against its pod
//! and node; `observe.rs` takes pods in and out (refusing conflicts);
//! `choose.rs` picks the decision a call would be charged to (for
//! `GetPreferredAllocation` and the matching); `allocate.rs` charges a
//! served `Allocate` to a decision; `reconcile.rs` corrects the ledger from
//! PodResources.

mod allocate;
mod choose;
mod observe;
mod reconcile;
#[cfg(test)]
mod tests;
mod validate;

use gpusched_model::protocol::{GpuDecision, ShareDecision};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use validate::validate;

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
    /// Pods of this node without a live entry (no decision, or finished),
    /// by UID: a pod that bypassed the scheduler (`spec.nodeName` set by
    /// its creator) may make a call the ledger must not charge to another
    /// pod's decision, and what such pods hold is published as theirs.
    others: BTreeMap<String, PodInfo>,
    /// What the kubelet said at the last PodResources read, by
    /// `(namespace, name)` (empty before the first).
    last_held: BTreeMap<(String, String), HeldPod>,
}

impl Ledger {
    /// A ledger of `node` with no decisions.
    pub fn new(node: &str, gpus: Vec<LedgerGpu>) -> Self {
        Ledger {
            node: node.to_string(),
            gpus,
            entries: BTreeMap::new(),
            last: None,
            others: BTreeMap::new(),
            last_held: BTreeMap::new(),
        }
    }

    /// Pods of this node without a live decision that the last
    /// PodResources read showed holding whole GPUs (inventory positions):
    /// pods that bypassed the scheduler, or whose status says they
    /// finished while the kubelet still counts their devices in use.
    /// Published with the allocations so that the scheduler counts them on
    /// the GPUs they really hold.
    pub fn held_by_others(&self) -> Vec<(&PodInfo, Vec<usize>)> {
        self.others
            .values()
            .filter_map(|p| {
                let h = self.last_held.get(&(p.namespace.clone(), p.name.clone()))?;
                let v: Vec<usize> = h
                    .whole
                    .iter()
                    .copied()
                    .filter(|&g| g < self.gpus.len())
                    .collect();
                (!v.is_empty()).then_some((p, v))
            })
            .collect()
    }

    /// A pod of this node without a decision that may be the caller of an
    /// `Allocate` adding `n` devices (whole GPUs, or milli of
    /// `gpusched.io/gpu-milli` when `share`): not finished, one of its
    /// containers asks exactly that, and PodResources does not show it
    /// holding anything yet. The kubelet does not say which pod calls, so
    /// such a call is charged to no decision (issue 38, item 5).
    pub(super) fn undecided_caller(&self, n: u32, share: bool) -> Option<&PodInfo> {
        self.others.values().find(|p| {
            if p.terminal || p.decision.is_some() {
                return false;
            }
            let calls = if share {
                new_devices_per_call(&p.containers, |a| a.milli)
            } else {
                new_devices_per_call(&p.containers, |a| a.gpus)
            };
            calls.contains(&n)
                && !self
                    .last_held
                    .contains_key(&(p.namespace.clone(), p.name.clone()))
        })
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

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
    pub namespace: String,
    pub name: String,
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
}

impl PodInfo {
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// A GPU of the node as the ledger knows it (position = inventory index).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerGpu {
    pub index: u32,
    pub uuid: String,
    pub memory_mib: u64,
}

/// What a valid decision gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Grant {
    /// Whole GPUs (inventory positions), and those already handed to the
    /// kubelet.
    Whole {
        gpus: Vec<usize>,
        served: BTreeSet<usize>,
    },
    /// A share of one GPU, and the milli already handed out.
    Share {
        gpu: usize,
        milli: u32,
        memory_mib: u64,
        served_milli: u32,
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
            Grant::Whole { gpus, served } => served.len() == gpus.len(),
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
    pub pod: PodInfo,
    pub seq: u64,
    /// The decision, or why it is refused.
    pub state: Result<Grant, String>,
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
    pub pod: PodInfo,
    pub message: String,
}

/// What `Allocate` hands out for a share.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShareGrant {
    pub pod: String,
    pub gpu: usize,
    pub milli: u32,
    pub memory_mib: u64,
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
    match &d.share {
        None => Ok(Grant::Whole {
            gpus: pos,
            served: BTreeSet::new(),
        }),
        Some(ShareDecision { milli, memory_mib }) => {
            if pos.len() != 1 {
                return Err(format!("a share names {} GPUs, not one", pos.len()));
            }
            if *milli == 0 || *milli >= GPU_MILLI {
                return Err(format!("share of {milli} milli is not 1..999"));
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
            })
        }
    }
}

impl Ledger {
    pub fn new(node: &str, gpus: Vec<LedgerGpu>) -> Self {
        Ledger {
            node: node.to_string(),
            gpus,
            entries: BTreeMap::new(),
        }
    }

    pub fn node(&self) -> &str {
        &self.node
    }

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
        self.entries.insert(
            pod.uid.clone(),
            Entry {
                pod: pod.clone(),
                seq,
                state,
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
        for (_, _, _, uid) in order {
            let Some(e) = self.entries.get_mut(&uid) else {
                continue;
            };
            let key = e.pod.key();
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

    /// Whole GPUs to prefer: the unserved GPUs of the first pending
    /// decision (admission order) that fit `available` and `must`.
    pub fn preferred_whole(
        &self,
        available: &[usize],
        must: &[usize],
        size: usize,
    ) -> Option<Vec<usize>> {
        for e in self.live_order() {
            let Ok(Grant::Whole { gpus, served }) = &e.state else {
                continue;
            };
            let free: Vec<usize> = gpus
                .iter()
                .copied()
                .filter(|g| !served.contains(g))
                .collect();
            if free.len() < size
                || !must.iter().all(|m| free.contains(m))
                || !free.iter().all(|g| available.contains(g))
            {
                continue;
            }
            let mut out: Vec<usize> = must.to_vec();
            for g in free {
                if out.len() >= size {
                    break;
                }
                if !out.contains(&g) {
                    out.push(g);
                }
            }
            return Some(out);
        }
        None
    }

    /// The GPU to take share tokens from: that of the first pending share
    /// decision asking exactly `size` milli.
    pub fn preferred_share(&self, size: u32) -> Option<usize> {
        self.live_order().into_iter().find_map(|e| match &e.state {
            Ok(Grant::Share {
                gpu,
                milli,
                served_milli,
                ..
            }) if milli - served_milli.min(milli) == size => Some(*gpu),
            _ => None,
        })
    }

    /// Serves whole GPUs `want` (inventory positions). Returns the pod.
    pub fn allocate_whole(&mut self, want: &[usize], healthy: &[bool]) -> Result<String, Miss> {
        let found = self.entries.iter().find(|(_, e)| {
            matches!(&e.state, Ok(Grant::Whole { gpus, .. }) if want.iter().all(|g| gpus.contains(g)))
        });
        let Some((uid, _)) = found else {
            return Err(Miss::NoDecision(format!(
                "no pod placed on node {} by gpusched holds GPUs {}; {}",
                self.node,
                self.show(want),
                self.summary()
            )));
        };
        let uid = uid.clone();
        if let Some(&g) = want
            .iter()
            .find(|&&g| !healthy.get(g).copied().unwrap_or(false))
        {
            let e = &self.entries[&uid];
            return Err(Miss::Refused(format!(
                "GPU {} ({}) recorded for pod {} is unhealthy",
                self.gpus[g].index,
                self.gpus[g].uuid,
                e.pod.key()
            )));
        }
        let e = self
            .entries
            .get_mut(&uid)
            .ok_or_else(|| Miss::NoDecision("gone".into()))?;
        if let Ok(Grant::Whole { served, .. }) = &mut e.state {
            served.extend(want.iter().copied());
        }
        Ok(e.pod.key())
    }

    /// Serves `n` milli of a share; `hint` is the GPU the kubelet's tokens
    /// came from when they all came from one.
    pub fn allocate_share(
        &mut self,
        n: u32,
        hint: Option<usize>,
        healthy: &[bool],
    ) -> Result<ShareGrant, Miss> {
        let cands: Vec<String> = self
            .live_order()
            .into_iter()
            .filter(|e| {
                matches!(&e.state, Ok(Grant::Share { milli, served_milli, .. }) if milli.saturating_sub(*served_milli) >= n)
            })
            .map(|e| e.pod.uid.clone())
            .collect();
        let pick = cands
            .iter()
            .find(|uid| {
                matches!(&self.entries[*uid].state, Ok(Grant::Share { gpu, .. }) if Some(*gpu) == hint)
            })
            .or(cands.first())
            .cloned();
        let Some(uid) = pick else {
            return Err(Miss::NoDecision(format!(
                "no pod placed on node {} by gpusched has a pending GPU share of {n} milli; {}",
                self.node,
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
        Ok(ShareGrant {
            pod: key,
            gpu: *gpu,
            milli: *milli,
            memory_mib: *memory_mib,
        })
    }

    /// Marks what the kubelet reports a pod holds (PodResources, after a
    /// restart): whole GPUs and share milli.
    pub fn restore(
        &mut self,
        namespace: &str,
        name: &str,
        whole: &[usize],
        share_milli: u32,
    ) -> bool {
        let Some(e) = self
            .entries
            .values_mut()
            .find(|e| e.pod.namespace == namespace && e.pod.name == name)
        else {
            return false;
        };
        match &mut e.state {
            Ok(Grant::Whole { gpus, served }) => {
                served.extend(whole.iter().copied().filter(|g| gpus.contains(g)));
            }
            Ok(Grant::Share {
                milli,
                served_milli,
                ..
            }) => *served_milli = (*served_milli + share_milli).min(*milli),
            Err(_) => return false,
        }
        self.recheck();
        true
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
            share: share.map(|(milli, memory_mib)| ShareDecision { milli, memory_mib }),
        };
        PodInfo {
            namespace: "ns".into(),
            name: name.into(),
            uid: format!("u-{name}"),
            node: "n".into(),
            created: created.into(),
            decision: Some(d.to_annotation()),
            terminal: false,
        }
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
        assert_eq!(l.allocate_whole(&[0, 1], &ok).unwrap(), "ns/b");
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
}

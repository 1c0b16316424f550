//! The incremental snapshot: the parts of [`World::build`] kept between
//! cycles and recomputed only where what they read changed.
//!
//! Every change to the world marks what it touches ([`Dirty`]): a pod (by
//! uid), a node (by name), the queues, the groups (PodGroups, workloads,
//! priority classes), the namespaces, the volumes, the DRA objects. The
//! next [`World::snapshot`] recomputes:
//! - the node part when a node changed; when the set of nodes (their ids)
//!   or the time-slicing table changed, every pod entry, else the entries
//!   of the pods on the changed nodes;
//! - the head part (queues, groups) when a queue, a group or a pod that
//!   may belong to a group changed; every entry when a queue changed; when
//!   a group's record changed, the entries of the pods labelled with it
//!   and of the pods that may change group (Job and workload members);
//! - the entries of the changed pods, of the pods with namespace selectors
//!   (namespaces), with volume claims (volumes), with ResourceClaims (DRA).
//!
//! The entries are kept in snapshot order; the assembly then walks them
//! (clones, GPU marks, swaps, PodDisruptionBudgets), which is linear in the
//! pods but computes nothing per pod that a change did not touch.

use super::build::{DraCtx, Entry, HeadPart, NodePart, OrderKey, order_key};
use super::*;

/// What changed since the last snapshot.
#[derive(Clone, Debug, Default)]
pub(super) struct Dirty {
    /// Pods, by uid.
    pub(super) pods: BTreeSet<String>,
    /// Nodes, by name.
    pub(super) nodes: BTreeSet<String>,
    /// A Queue.
    pub(super) queues: bool,
    /// A PodGroup (ours or scheduler-plugins'), a workload, a
    /// PriorityClass.
    pub(super) groups: bool,
    /// A Namespace.
    pub(super) namespaces: bool,
    /// A claim, volume, storage class, CSINode, CSIDriver,
    /// CSIStorageCapacity or reservation.
    pub(super) volumes: bool,
    /// A ResourceClaim, ResourceSlice, DeviceClass or tentative
    /// allocation.
    pub(super) dra: bool,
}

/// The parts kept between snapshots.
#[derive(Clone, Debug, Default)]
pub(super) struct Cache {
    /// What changed since the last snapshot.
    pub(super) dirty: Dirty,
    nodes: Option<NodePart>,
    head: Option<HeadPart>,
    /// Pod entries, in snapshot order.
    entries: BTreeMap<OrderKey, Entry>,
    /// Each pod's key in `entries`, by uid.
    keys: BTreeMap<String, OrderKey>,
    /// Pods (by uid) whose entry holds resources on a node, by node name.
    on_node: BTreeMap<String, BTreeSet<String>>,
    /// Pods that may belong to a group ([`World::maybe_grouped`]).
    grouped: BTreeSet<String>,
    /// Of those, the pods whose group is their label's alone (no Job, no
    /// workload): their entries read only that group's record. By group,
    /// and each one's group by uid.
    by_group: BTreeMap<String, BTreeSet<String>>,
    labelled: BTreeMap<String, String>,
    /// Pods with affinity terms selecting namespaces.
    selecting: BTreeSet<String>,
    /// Pods referencing ResourceClaims.
    claiming: BTreeSet<String>,
    /// Pod entries the last refresh recomputed.
    pub(super) last_work: usize,
    /// Snapshots since the last check against a full build (debug builds).
    pub(super) since_check: u64,
}

fn set(s: &mut BTreeSet<String>, uid: &str, member: bool) {
    if member {
        if !s.contains(uid) {
            s.insert(uid.to_string());
        }
    } else {
        s.remove(uid);
    }
}

fn selects_namespaces(v: &PodView) -> bool {
    match &v.kind {
        PodKind::Pending { pod, .. } | PodKind::Bound { pod, .. } => pod
            .constraints
            .as_deref()
            .is_some_and(|c| c.has_namespace_selectors()),
        _ => false,
    }
}

/// The group of a pod whose group is its label's alone (no Job label, not
/// a workload's member).
fn labelled_group(w: &World, v: &PodView) -> Option<String> {
    if v.job.is_some() || w.workload_of(v).is_some() {
        return None;
    }
    v.group.clone()
}

/// Names of the groups added, removed or changed (both sorted by name).
fn changed_groups<'a>(old: &'a [MGroup], new: &'a [MGroup]) -> BTreeSet<&'a str> {
    let index = |gs: &'a [MGroup]| -> BTreeMap<&'a str, &'a MGroup> {
        gs.iter().map(|g| (g.name.as_str(), g)).collect()
    };
    let (a, b) = (index(old), index(new));
    a.keys()
        .chain(b.keys())
        .filter(|k| a.get(*k) != b.get(*k))
        .copied()
        .collect()
}

impl Cache {
    /// Records pod `uid`'s label-only group (`None`: it has none, or may
    /// change group).
    fn set_labelled(&mut self, uid: &str, group: Option<String>) {
        if self.labelled.get(uid) == group.as_ref() {
            return;
        }
        if let Some(old) = self.labelled.remove(uid)
            && let Some(on) = self.by_group.get_mut(&old)
        {
            on.remove(uid);
            if on.is_empty() {
                self.by_group.remove(&old);
            }
        }
        if let Some(g) = group {
            self.by_group
                .entry(g.clone())
                .or_default()
                .insert(uid.to_string());
            self.labelled.insert(uid.to_string(), g);
        }
    }

    /// Brings the parts up to date with `w`.
    pub(super) fn refresh(&mut self, w: &World) {
        let d = std::mem::take(&mut self.dirty);
        let mut all = false;
        let mut pods = d.pods;
        if self.nodes.is_none() || !d.nodes.is_empty() {
            let np = w.node_part();
            match &self.nodes {
                Some(old) if old.ids == np.ids && old.sharing == np.sharing => {
                    for n in &d.nodes {
                        if let Some(on) = self.on_node.get(n) {
                            pods.extend(on.iter().cloned());
                        }
                    }
                }
                _ => all = true,
            }
            self.nodes = Some(np);
        }
        let mut grouped_changed = false;
        for u in &pods {
            let v = w.pods.get(u);
            let g = v.is_some_and(|v| w.maybe_grouped(v));
            grouped_changed |= g || self.grouped.contains(u);
            set(&mut self.grouped, u, g);
            self.set_labelled(u, v.and_then(|v| labelled_group(w, v)));
            set(&mut self.selecting, u, v.is_some_and(selects_namespaces));
            set(
                &mut self.claiming,
                u,
                v.is_some_and(|v| !v.claims.is_empty()),
            );
        }
        if !all && (self.head.is_none() || d.queues || d.groups || grouped_changed) {
            let members: Vec<&PodView> =
                self.grouped.iter().filter_map(|u| w.pods.get(u)).collect();
            let hp = w.head_part(&members);
            match &self.head {
                Some(old) if !d.queues => {
                    if d.groups || old.groups != hp.groups {
                        // pods whose group is their label's read only
                        // that group's record; the others (Job and
                        // workload members) may change group
                        for g in changed_groups(&old.groups, &hp.groups) {
                            if let Some(on) = self.by_group.get(g) {
                                pods.extend(on.iter().cloned());
                            }
                        }
                        pods.extend(
                            self.grouped
                                .iter()
                                .filter(|u| !self.labelled.contains_key(*u))
                                .cloned(),
                        );
                    }
                }
                _ => all = true,
            }
            self.head = Some(hp);
        }
        if d.namespaces {
            pods.extend(self.selecting.iter().cloned());
        }
        if d.volumes {
            pods.extend(w.pod_claims.keys().cloned());
        }
        if d.dra {
            pods.extend(self.claiming.iter().cloned());
        }
        if all {
            self.entries.clear();
            self.keys.clear();
            self.on_node.clear();
            self.grouped = w
                .pods
                .values()
                .filter(|v| w.maybe_grouped(v))
                .map(|v| v.uid.clone())
                .collect();
            self.by_group.clear();
            self.labelled.clear();
            for v in w.pods.values() {
                self.set_labelled(&v.uid, labelled_group(w, v));
            }
            self.selecting = w
                .pods
                .values()
                .filter(|v| selects_namespaces(v))
                .map(|v| v.uid.clone())
                .collect();
            self.claiming = w
                .pods
                .values()
                .filter(|v| !v.claims.is_empty())
                .map(|v| v.uid.clone())
                .collect();
            let members: Vec<&PodView> =
                self.grouped.iter().filter_map(|u| w.pods.get(u)).collect();
            self.head = Some(w.head_part(&members));
            pods = w.pods.keys().cloned().collect();
        }
        let (Some(np), Some(hp)) = (&self.nodes, &self.head) else {
            return;
        };
        let mut dra: Option<DraCtx<'_>> = None;
        for u in &pods {
            // a finished pod's entry follows its node's allocations
            // whether it holds anything or not (its node never changes)
            let finished_on = |v: Option<&PodView>| match v.map(|v| &v.kind) {
                Some(PodKind::Finished { node, .. }) => Some(node.clone()),
                _ => None,
            };
            if let Some(k) = self.keys.remove(u) {
                let old = match self.entries.remove(&k) {
                    Some(Entry::Placed(p)) => p.node.clone(),
                    _ => finished_on(w.pods.get(u)),
                };
                if let Some(n) = old
                    && let Some(on) = self.on_node.get_mut(&n)
                {
                    on.remove(u);
                    if on.is_empty() {
                        self.on_node.remove(&n);
                    }
                }
            }
            let Some(v) = w.pods.get(u) else { continue };
            let e = w.pod_entry(v, np, hp, &mut dra);
            let node = match &e {
                Entry::Placed(p) => p.node.clone(),
                _ => finished_on(Some(v)),
            };
            if let Some(n) = node {
                self.on_node.entry(n).or_default().insert(u.clone());
            }
            let k = order_key(v);
            self.keys.insert(u.clone(), k.clone());
            self.entries.insert(k, e);
        }
        self.last_work = pods.len();
    }

    /// The snapshot from the parts (after [`Cache::refresh`]).
    pub(super) fn assemble(&self, w: &World) -> Built {
        match (&self.nodes, &self.head) {
            (Some(np), Some(hp)) => {
                w.assemble(np, hp, self.entries.iter().map(|(k, e)| (k.3.as_str(), e)))
            }
            _ => w.build(),
        }
    }
}

/// Where two builds differ first, in words (`None`: equal). For the debug
/// check and the tests: a whole snapshot is too large to print.
pub fn first_difference(a: &Built, b: &Built) -> Option<String> {
    if a.snapshot.nodes != b.snapshot.nodes {
        let i = a
            .snapshot
            .nodes
            .iter()
            .zip(&b.snapshot.nodes)
            .position(|(x, y)| x != y);
        return Some(format!(
            "nodes ({} vs {}; first at {i:?})",
            a.snapshot.nodes.len(),
            b.snapshot.nodes.len()
        ));
    }
    if a.snapshot.queues != b.snapshot.queues {
        return Some(format!(
            "queues: {:?} vs {:?}",
            a.snapshot.queues, b.snapshot.queues
        ));
    }
    if a.snapshot.groups != b.snapshot.groups {
        return Some(format!(
            "groups: {:?} vs {:?}",
            a.snapshot.groups, b.snapshot.groups
        ));
    }
    if a.pods != b.pods || a.snapshot.pods != b.snapshot.pods {
        let n = a.pods.len().max(b.pods.len());
        for i in 0..n {
            let (x, y) = (a.snapshot.pods.get(i), b.snapshot.pods.get(i));
            if a.pods.get(i) != b.pods.get(i) || x != y {
                return Some(format!(
                    "pod {i}: {:?} {x:?} vs {:?} {y:?}",
                    a.pods.get(i),
                    b.pods.get(i)
                ));
            }
        }
    }
    if a.problems != b.problems {
        return Some(format!("problems: {:?} vs {:?}", a.problems, b.problems));
    }
    if a.pending_by_queue != b.pending_by_queue {
        return Some(format!(
            "pending by queue: {:?} vs {:?}",
            a.pending_by_queue, b.pending_by_queue
        ));
    }
    if a.unseen_by_queue != b.unseen_by_queue {
        return Some(format!(
            "unseen by queue: {:?} vs {:?}",
            a.unseen_by_queue, b.unseen_by_queue
        ));
    }
    if a.replicas != b.replicas {
        return Some(format!("replicas: {:?} vs {:?}", a.replicas, b.replicas));
    }
    None
}

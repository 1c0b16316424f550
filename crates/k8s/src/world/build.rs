//! The core's snapshot, built by part: the nodes (with the time-slicing
//! table), the head (queues and groups), one entry per pod, and the
//! assembly that lays the entries out in order and places the GPUs of pods
//! whose GPUs are not known (placed by others, swaps in progress).
//!
//! [`World::build`] runs every part from scratch: it is the reference the
//! incremental snapshot ([`World::snapshot`], `super::cache`) is checked
//! against, and what the one-shot readers (doctor, snapshot capture) use.
//! Both paths call the same part functions, so they differ only in which
//! parts they recompute.

use super::*;
use crate::dra::state::PodClaims;
use crate::dra::{Device, DeviceId};

/// The nodes as the core sees them, their ids, and the time-slicing table
/// derived from all of them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct NodePart {
    /// `snapshot.nodes` (time-slicing nodes' GPUs withheld).
    pub(super) nodes: Vec<gpusched_model::Node>,
    /// Node name → position.
    pub(super) ids: BTreeMap<String, NodeId>,
    /// What a time-sliced resource means in the cluster.
    pub(super) sharing: crate::sharing::SharingTable,
    /// Node warnings, then the table's.
    pub(super) problems: Vec<Problem>,
    /// Some node has a CSI attach limit (`CSINode`): pods' CSI volumes
    /// are resolved.
    pub(super) attach_limits: bool,
    /// DRA GPU devices (`crate::dra::gpus`): the node and the position
    /// among its GPUs each one is.
    pub(super) dra_gpus: BTreeMap<DeviceId, (NodeId, u32)>,
}

impl NodePart {
    /// The positions on its node of the GPUs among `devices` (those on
    /// `node`), sorted.
    fn gpu_positions<'a>(
        &self,
        node: NodeId,
        devices: impl IntoIterator<Item = &'a DeviceId>,
    ) -> Vec<u32> {
        let mut out: Vec<u32> = devices
            .into_iter()
            .filter_map(|d| self.dra_gpus.get(d))
            .filter(|(n, _)| *n == node)
            .map(|(_, p)| *p)
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }
}

/// Queues and groups as the core sees them.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct HeadPart {
    /// `snapshot.queues`.
    pub(super) queues: Vec<MQueue>,
    /// `snapshot.groups`, sorted by name.
    pub(super) groups: Vec<MGroup>,
    /// Invalid queues, queue tree problems, invalid groups and workloads.
    pub(super) problems: Vec<Problem>,
}

/// What one pod contributes to the snapshot, given the node and head
/// parts. Placement of GPUs nobody recorded, swaps and PodDisruptionBudget
/// state are left to the assembly (they depend on other pods).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Entry {
    /// Nothing (not ours and holding nothing, or on a node not known).
    Skip,
    /// Pending, but not handed to the core.
    Unseen {
        /// The queue it is counted in.
        queue: String,
        /// Its class among those the core never sees (`None`: counted
        /// pending only — its queue is invalid).
        class: Option<PendingClass>,
        /// What to tell.
        problem: Problem,
    },
    /// Handed to the core.
    Placed(Box<Placed>),
}

/// A pod handed to the core.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Placed {
    pub(super) pref: PodRef,
    /// As it goes into the snapshot, but for the GPUs of an undecided pod
    /// (`None` until the assembly picks them) and its PodDisruptionBudget
    /// flag.
    pub(super) state: PodState,
    pub(super) replicas: Option<crate::sharing::ReplicaAsk>,
    pub(super) problems: Vec<Problem>,
    /// Counted pending in this queue.
    pub(super) pending_queue: Option<String>,
    /// Bound (its PodDisruptionBudget flag is set by the assembly).
    pub(super) bound: bool,
    /// Bound on whole GPUs by a decision: (listed by its node's agent,
    /// the decided GPUs).
    pub(super) whole: Option<(bool, Vec<u32>)>,
    /// Bound with GPUs nobody recorded: the assembly gives it the lowest
    /// free ones.
    pub(super) undecided: bool,
    /// The node it holds resources on, by name.
    pub(super) node: Option<String>,
}

/// The DRA inputs, computed once per build (only when a pod with claims
/// is looked at).
pub(super) struct DraCtx<'a> {
    nodes: Vec<&'a str>,
    devices: BTreeMap<Option<&'a str>, Vec<&'a Device>>,
    in_use: BTreeSet<DeviceId>,
    memo: BTreeMap<String, PodClaims>,
}

impl<'a> DraCtx<'a> {
    /// The devices held for the feasibility check leave out the GPUs held
    /// by pods the core counts them on: whether those are free is the
    /// core's question (it counts them, and may preempt their pods).
    pub(super) fn new(w: &'a World) -> Self {
        let devices = w.dra.devices_by_node();
        let gpus: BTreeSet<&DeviceId> = devices
            .values()
            .flatten()
            .filter(|d| w.dra.gpu_drivers().is_gpu(d))
            .map(|d| &d.id)
            .collect();
        let in_use = w
            .dra
            .held()
            .into_iter()
            .filter(|(d, owner)| !(gpus.contains(d) && owner.is_some_and(|u| w.placed_in_core(u))))
            .map(|(d, _)| d.clone())
            .collect();
        DraCtx {
            nodes: w.nodes.keys().map(String::as_str).collect(),
            devices,
            in_use,
            memo: BTreeMap::new(),
        }
    }
}

/// A pod's place in the snapshot: creation time, then name (then uid, for
/// two objects of one name seen at once).
pub(super) type OrderKey = (u64, String, String, String);

pub(super) fn order_key(v: &PodView) -> OrderKey {
    (
        v.created_ms,
        v.namespace.clone(),
        v.name.clone(),
        v.uid.clone(),
    )
}

fn pref(v: &PodView) -> PodRef {
    PodRef {
        uid: v.uid.clone(),
        namespace: v.namespace.clone(),
        name: v.name.clone(),
    }
}

impl World {
    /// The core's snapshot of the world as it is now, built from scratch.
    /// The scheduler uses [`World::snapshot`], which builds the same
    /// snapshot from what changed.
    pub fn build(&self) -> Built {
        let np = self.node_part();
        let members: Vec<&PodView> = self.pods.values().collect();
        let hp = self.head_part(&members);
        let mut views: Vec<&PodView> = self.pods.values().collect();
        views.sort_by_cached_key(|v| order_key(v));
        let mut dra = None;
        let entries: Vec<(&str, Entry)> = views
            .into_iter()
            .map(|v| (v.uid.as_str(), self.pod_entry(v, &np, &hp, &mut dra)))
            .collect();
        self.assemble(&np, &hp, entries.iter().map(|(u, e)| (*u, e)))
    }

    /// The nodes part.
    pub(super) fn node_part(&self) -> NodePart {
        let mut out = NodePart {
            attach_limits: crate::volumes::any_attach_limit(&self.volumes),
            ..NodePart::default()
        };
        for (i, (name, v)) in self.nodes.iter().enumerate() {
            out.ids.insert(name.clone(), i as NodeId);
            out.nodes.push(v.node.clone());
            if out.attach_limits {
                out.nodes[i].attach_limits = crate::volumes::attach_limits(&self.volumes, name);
            }
            for w in &v.warnings {
                out.problems.push(Problem::NodeWarning {
                    node: name.clone(),
                    warning: w.clone(),
                });
            }
            // one world: the GPUs its ResourceSlices publish are its GPUs
            let devices = self.dra.gpu_devices_on(name);
            if !devices.is_empty() {
                let n = &mut out.nodes[i];
                if !n.gpus.is_empty() {
                    out.problems.push(Problem::NodeWarning {
                        node: name.clone(),
                        warning: format!(
                            "the node publishes GPUs both to the device plugin ({}) and as ResourceSlice devices ({}); gpusched counts the ResourceSlice devices as its GPUs (run one agent mode per node)",
                            n.gpus.len(),
                            devices.len()
                        ),
                    });
                }
                n.gpus = crate::dra::gpus::model_gpus(&devices);
                n.sync_gpu_allocatable();
                for (p, d) in devices.iter().enumerate() {
                    out.dra_gpus.insert(d.id.clone(), (i as NodeId, p as u32));
                }
            }
        }
        // what a request for a time-sliced resource means (crate::sharing)
        let ins: Vec<crate::sharing::NodeIn<'_>> = self
            .nodes
            .iter()
            .map(|(name, v)| crate::sharing::NodeIn {
                name,
                sharing: v.sharing.as_ref(),
                has_gpus: !v.node.gpus.is_empty(),
            })
            .collect();
        out.sharing = crate::sharing::table(&ins);
        for &i in &out.sharing.withheld {
            let n = &mut out.nodes[i];
            for g in &mut n.gpus {
                if g.is_healthy() {
                    g.health = gpusched_model::GpuHealth::NotAllocatable;
                }
            }
            n.sync_gpu_allocatable();
        }
        for (i, w) in &out.sharing.warnings {
            out.problems.push(Problem::NodeWarning {
                node: out.nodes[*i].name.clone(),
                warning: w.clone(),
            });
        }
        out
    }

    /// Whether a pod may belong to a group (its label, its Job, its
    /// workload): the pods the head part reads. A pod for which this is
    /// false has no group whatever the groups and workloads are.
    pub(super) fn maybe_grouped(&self, v: &PodView) -> bool {
        v.group.is_some() || v.job.is_some() || self.workload_of(v).is_some()
    }

    /// The head part. `members`: the pods that may belong to a group
    /// ([`World::maybe_grouped`]; more do no harm), in uid order.
    pub(super) fn head_part(&self, members: &[&PodView]) -> HeadPart {
        let mut out = HeadPart::default();
        // queues: the valid ones, plus an implicit default queue
        for (name, q) in &self.queues {
            match q {
                Ok(q) => out.queues.push(q.clone()),
                Err(e) => out.problems.push(Problem::InvalidQueue {
                    queue: name.clone(),
                    error: e.clone(),
                }),
            }
        }
        if !self.queues.contains_key(DEFAULT_QUEUE) {
            out.queues.push(MQueue::new(DEFAULT_QUEUE));
        }
        let (_, queue_problems) = QueueTree::build(&out.queues);
        for p in queue_problems {
            out.problems.push(Problem::InvalidQueue {
                queue: p.queue().to_string(),
                error: p.to_string(),
            });
        }
        // the queue of a group defaults to its first member's label
        let mut member_queue: BTreeMap<String, &str> = BTreeMap::new();
        for v in members {
            if let (Some(g), Some(q)) = (self.group_of(v), self.queue_label(v)) {
                member_queue.entry(g).or_insert(q);
            }
        }
        let mut group_names: BTreeSet<&str> = BTreeSet::new();
        for (k, e) in &self.groups {
            match &e.group {
                Ok(g) => {
                    let mut g = g.clone();
                    g.priority = e
                        .priority_class
                        .as_ref()
                        .and_then(|pc| self.priority_classes.get(pc).copied())
                        .unwrap_or(0);
                    if let (Some(q), true) = (member_queue.get(k), g.queue == DEFAULT_QUEUE) {
                        g.queue = q.to_string();
                    }
                    group_names.insert(k.as_str());
                    out.groups.push(g);
                }
                Err(e) => out.problems.push(Problem::InvalidGroup {
                    group: k.clone(),
                    error: e.clone(),
                }),
            }
        }
        for (k, g) in &self.sp_groups {
            if group_names.contains(k.as_str()) {
                continue;
            }
            match g {
                Ok(g) => {
                    let mut g = g.clone();
                    if let Some(q) = member_queue.get(k) {
                        g.queue = q.to_string();
                    }
                    out.groups.push(g);
                }
                Err(e) => out.problems.push(Problem::InvalidGroup {
                    group: k.clone(),
                    error: e.clone(),
                }),
            }
        }
        self.workload_groups(&mut out, members, &member_queue, &group_names);
        out.groups.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// The gangs of JobSets and LeaderWorkerSets that have pods: sized from
    /// the workload, in its queue (else its first member's), at its
    /// members' highest priority (the controllers copy the template's
    /// priority class onto each pod). A workload that cannot be used is
    /// reported; its pods wait for a group that is not there.
    fn workload_groups(
        &self,
        out: &mut HeadPart,
        members: &[&PodView],
        member_queue: &BTreeMap<String, &str>,
        taken: &BTreeSet<&str>,
    ) {
        let mut made: BTreeMap<String, MGroup> = BTreeMap::new();
        // members that finished: they started, so the gang needs that
        // many fewer (a failed member's replacement is not held for peers
        // that are done)
        let mut finished: BTreeMap<String, u32> = BTreeMap::new();
        for v in members {
            if self.succeeded.contains(&v.uid)
                && let Some((name, _, _)) = self.workload_group(v)
            {
                *finished.entry(name).or_default() += 1;
            }
        }
        for v in members {
            let priority = match &v.kind {
                PodKind::Pending { pod, .. } | PodKind::Bound { pod, .. } => pod.priority,
                _ => continue,
            };
            let Some((name, Some(min), queue)) = self.workload_group(v) else {
                continue;
            };
            if taken.contains(name.as_str()) || self.group_of(v).as_ref() != Some(&name) {
                continue;
            }
            let g = made.entry(name.clone()).or_insert_with(|| MGroup {
                name: name.clone(),
                queue: queue
                    .or_else(|| member_queue.get(&name).copied())
                    .unwrap_or(DEFAULT_QUEUE)
                    .to_string(),
                min_member: min
                    .saturating_sub(finished.get(&name).copied().unwrap_or(0))
                    .max(1),
                priority,
                topology: None,
                schedule_timeout_ms: None,
            });
            g.priority = g.priority.max(priority);
        }
        out.groups.extend(made.into_values());
        for ((kind, key), w) in &self.workloads {
            if let Err(e) = w {
                out.problems.push(Problem::InvalidGroup {
                    group: format!("{} {key}", kind.api_kind()),
                    error: e.clone(),
                });
            }
        }
    }

    /// One pod's entry. `dra` is made on first need.
    pub(super) fn pod_entry<'a>(
        &'a self,
        v: &PodView,
        np: &NodePart,
        hp: &HeadPart,
        dra: &mut Option<DraCtx<'a>>,
    ) -> Entry {
        let unseen = |class: Option<PendingClass>, problem: Problem| Entry::Unseen {
            queue: self.queue_name(v),
            class,
            problem,
        };
        match &v.kind {
            PodKind::Ignored => Entry::Skip,
            PodKind::Gated { gates } => unseen(
                Some(PendingClass::Gated),
                Problem::GatedPod {
                    pod: pref(v),
                    gates: gates.clone(),
                },
            ),
            PodKind::Invalid { error } => unseen(
                Some(PendingClass::InvalidSpec),
                Problem::InvalidPod {
                    pod: pref(v),
                    error: error.clone(),
                },
            ),
            PodKind::Pending { pod, nominated } => {
                let mut pod = pod.clone();
                let replicas = match crate::sharing::resolve(&mut pod, &np.sharing) {
                    Ok(r) => r,
                    Err(why) => {
                        return unseen(
                            Some(PendingClass::InvalidSpec),
                            Problem::InvalidPod {
                                pod: pref(v),
                                error: format!("pod {}/{}: {why}", v.namespace, v.name),
                            },
                        );
                    }
                };
                // a queue that exists but cannot be used: the pod is
                // told which and why (not that it does not exist)
                let group = self.group_of(v);
                let queue = group
                    .as_ref()
                    .and_then(|g| hp.groups.binary_search_by(|x| x.name.as_str().cmp(g)).ok())
                    .map_or(pod.queue.as_str(), |i| hp.groups[i].queue.as_str());
                if !self.assumed.contains_key(&v.uid)
                    && let Some(Err(why)) = self.queues.get(queue)
                {
                    return unseen(
                        None,
                        Problem::InvalidPod {
                            pod: pref(v),
                            error: format!(
                                "queue {queue:?} is invalid (Valid=False), so its pods wait: {why}"
                            ),
                        },
                    );
                }
                // DRA: its claims must exist and be allocatable
                // somewhere; the core picks among those nodes
                let mut claim_nodes = None;
                let mut claim_gpus = 0;
                if !v.claims.is_empty() && !self.assumed.contains_key(&v.uid) {
                    let d = dra.get_or_insert_with(|| DraCtx::new(self));
                    let (class, message) = match self.dra.pod_claims(
                        &v.namespace,
                        &v.claims,
                        &d.nodes,
                        &d.devices,
                        &d.in_use,
                        &mut d.memo,
                    ) {
                        PodClaims::None => (None, String::new()),
                        PodClaims::Waiting(m) => (Some(PendingClass::WaitingForClaim), m),
                        PodClaims::Unallocatable(m) => (Some(PendingClass::UnallocatableClaim), m),
                        PodClaims::Nodes(n, g) => {
                            claim_nodes = Some(n);
                            claim_gpus = g;
                            (None, String::new())
                        }
                    };
                    if let Some(class) = class {
                        return unseen(
                            Some(class),
                            Problem::ClaimsPending {
                                pod: pref(v),
                                class,
                                message,
                            },
                        );
                    }
                }
                if claim_gpus > 0 {
                    if !pod.gpu.is_none() {
                        return unseen(
                            Some(PendingClass::InvalidSpec),
                            Problem::InvalidPod {
                                pod: pref(v),
                                error: format!(
                                    "pod {}/{}: asks GPUs both as a resource ({}) and through its ResourceClaims ({claim_gpus}); gpusched places one or the other",
                                    v.namespace,
                                    v.name,
                                    pod.gpu.milli() / gpusched_model::GPU_MILLI
                                ),
                            },
                        );
                    }
                    // one world: its claims' GPUs are its GPU demand
                    pod.gpu = GpuRequest::Whole(claim_gpus);
                }
                let mut pending_queue = None;
                let mut node = None;
                let phase = match self.assumed.get(&v.uid) {
                    Some(a) => match np.ids.get(a.node.as_str()) {
                        Some(&n) => {
                            node = Some(a.node.clone());
                            // being bound with claims: counted on the GPUs
                            // its claims got
                            let held = np.gpu_positions(
                                n,
                                self.dra.held_by(&v.uid, &v.namespace, &v.claims),
                            );
                            let fits = pod.gpu.is_none()
                                || pod.gpu == GpuRequest::Whole(held.len() as u32);
                            let gpus = if held.is_empty() || !fits {
                                a.gpus.clone()
                            } else {
                                pod.gpu = GpuRequest::Whole(held.len() as u32);
                                GpuAssignment::Whole(held)
                            };
                            PodPhase::Running {
                                node: n,
                                gpus,
                                since_ms: self
                                    .assumed_at
                                    .get(&v.uid)
                                    .copied()
                                    .unwrap_or(pod.arrival_ms),
                            }
                        }
                        None => return Entry::Skip,
                    },
                    None => {
                        pending_queue = Some(self.queue_name(v));
                        PodPhase::Pending {
                            nominated: nominated
                                .as_ref()
                                .or_else(|| self.nominated.get(&v.uid))
                                .and_then(|n| np.ids.get(n.as_str()).copied()),
                        }
                    }
                };
                if let Some(claims) = self.pod_claims.get(&v.uid) {
                    let (needs, exclusive) =
                        crate::volumes::resolve(&self.volumes, &v.namespace, &v.uid, claims);
                    let c = pod.constraints_mut();
                    c.volumes = needs;
                    c.exclusive_claims = exclusive;
                    if np.attach_limits {
                        c.csi_volumes =
                            crate::volumes::csi_volumes(&self.volumes, &v.namespace, claims);
                    }
                }
                self.select_namespaces(&mut pod);
                if let Some(n) = claim_nodes {
                    pod.constraints_mut().claim_nodes = Some(n);
                }
                pod.group = group;
                self.inherit_queue(v, &mut pod);
                group_queue(&hp.groups, &mut pod);
                Entry::Placed(Box::new(Placed {
                    pref: pref(v),
                    state: PodState { pod, phase },
                    replicas,
                    problems: Vec::new(),
                    pending_queue,
                    bound: false,
                    whole: None,
                    undecided: false,
                    node,
                }))
            }
            PodKind::Bound {
                pod,
                node,
                decision,
                terminating,
            } => {
                let Some(&n) = np.ids.get(node.as_str()) else {
                    return Entry::Skip;
                };
                let mut problems = Vec::new();
                // counted as placed: replicas as their share (a pod the
                // table cannot resolve keeps its plain request)
                let mut pod = pod.clone();
                let replicas = crate::sharing::resolve(&mut pod, &np.sharing)
                    .ok()
                    .flatten();
                if let Some(t) = self.tampered.get(&v.uid) {
                    problems.push(Problem::BadDecision {
                        pod: pref(v),
                        error: t.clone(),
                    });
                }
                let nv = &np.nodes[n as usize];
                // one world: a pod's claims' GPUs are its GPUs (its
                // decision only repeats the core's choice)
                let mut dra_held = if v.claims.is_empty() && v.extended.is_empty() {
                    Vec::new()
                } else {
                    np.gpu_positions(n, self.dra.held_by(&v.uid, &v.namespace, &v.claims))
                };
                // (a KEP-5004 pod asks `nvidia.com/gpu` and holds its
                // special claim's devices: the same count)
                let is_dra = !dra_held.is_empty()
                    && (pod.gpu.is_none() || pod.gpu == GpuRequest::Whole(dra_held.len() as u32));
                if is_dra {
                    pod.gpu = GpuRequest::Whole(dra_held.len() as u32);
                }
                let gpus = match decision {
                    _ if is_dra => Some(GpuAssignment::Whole(std::mem::take(&mut dra_held))),
                    Some(Ok(d)) => match crate::decision::assignment(d, &v.uid, nv) {
                        Ok(a) if a.milli() == pod.gpu.milli() => Some(a),
                        Ok(a) => {
                            problems.push(Problem::BadDecision {
                                pod: pref(v),
                                error: format!(
                                    "the decision holds {} milli-GPU but the pod asks {}",
                                    a.milli(),
                                    pod.gpu.milli()
                                ),
                            });
                            None
                        }
                        Err(e) => {
                            problems.push(Problem::BadDecision {
                                pod: pref(v),
                                error: e.to_string(),
                            });
                            None
                        }
                    },
                    Some(Err(e)) => {
                        problems.push(Problem::BadDecision {
                            pod: pref(v),
                            error: e.to_string(),
                        });
                        None
                    }
                    None => None,
                };
                // where the agent says the kubelet really put it wins
                // over the decision (same size, other GPUs: the next
                // decision must see the GPUs that are really free)
                let decided_whole = match &gpus {
                    Some(GpuAssignment::Whole(d)) if !is_dra => Some(d.clone()),
                    _ => None,
                };
                let listed = self
                    .nodes
                    .get(node.as_str())
                    .is_some_and(|x| x.allocations.contains_key(&v.uid));
                let gpus = match (gpus, self.served(node, &v.uid, nv)) {
                    (g, _) if is_dra => g,
                    (
                        Some(GpuAssignment::Share { memory_mib, .. }),
                        Some(GpuAssignment::Share { gpu, milli, .. }),
                    ) if u64::from(milli) == pod.gpu.milli() => Some(GpuAssignment::Share {
                        gpu,
                        milli,
                        memory_mib,
                    }),
                    (Some(GpuAssignment::Whole(_)), Some(real @ GpuAssignment::Whole(_)))
                        if real.milli() == pod.gpu.milli() =>
                    {
                        Some(real)
                    }
                    (Some(GpuAssignment::Mig { .. }), Some(real @ GpuAssignment::Mig { .. }))
                        if real.milli() == pod.gpu.milli() =>
                    {
                        Some(real)
                    }
                    (g, _) => g,
                };
                let mut undecided = false;
                let gpus = match gpus {
                    Some(a) => a,
                    None => {
                        undecided = !pod.gpu.is_none();
                        GpuAssignment::None
                    }
                };
                let phase = if *terminating || self.evicting.contains(&v.uid) {
                    PodPhase::Terminating { node: n, gpus }
                } else {
                    PodPhase::Running {
                        node: n,
                        gpus,
                        since_ms: v.bound_ms,
                    }
                };
                if let Some(claims) = self.pod_claims.get(&v.uid) {
                    // a running pod's ReadWriteOncePod claims keep others off them
                    let exclusive = crate::volumes::exclusive(&self.volumes, &v.namespace, claims);
                    if !exclusive.is_empty() {
                        pod.constraints_mut().exclusive_claims = exclusive;
                    }
                    // and its CSI volumes count against its node's limits
                    if np.attach_limits {
                        let vols = crate::volumes::csi_volumes(&self.volumes, &v.namespace, claims);
                        if !vols.is_empty() {
                            pod.constraints_mut().csi_volumes = vols;
                        }
                    }
                }
                self.select_namespaces(&mut pod);
                pod.group = self.group_of(v);
                self.inherit_queue(v, &mut pod);
                group_queue(&hp.groups, &mut pod);
                Entry::Placed(Box::new(Placed {
                    pref: pref(v),
                    state: PodState { pod, phase },
                    replicas,
                    problems,
                    pending_queue: None,
                    bound: true,
                    whole: decided_whole.map(|d| (listed, d)),
                    undecided,
                    node: Some(node.clone()),
                }))
            }
        }
    }

    /// Lays out the parts and the pods' entries (in snapshot order, with
    /// their uids) as the core's snapshot, and places what depends on the
    /// other pods of a node (GPUs nobody recorded, swaps in progress) and
    /// on a namespace's pods (PodDisruptionBudgets).
    pub(super) fn assemble<'e>(
        &self,
        np: &NodePart,
        hp: &HeadPart,
        entries: impl Iterator<Item = (&'e str, &'e Entry)>,
    ) -> Built {
        let mut out = Built::default();
        out.snapshot.nodes = np.nodes.clone();
        out.snapshot.queues = hp.queues.clone();
        out.snapshot.groups = hp.groups.clone();
        out.problems.extend(np.problems.iter().cloned());
        out.problems.extend(hp.problems.iter().cloned());
        for w in self.dra.warnings() {
            out.problems.push(Problem::NodeWarning {
                node: "(resourceslices)".into(),
                warning: w.clone(),
            });
        }
        let exhausted = self.budget_exhausted();
        let n_nodes = out.snapshot.nodes.len();
        // GPUs taken per node by pods whose GPUs are known
        let mut taken: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); n_nodes];
        let mut shared: Vec<BTreeMap<u32, u64>> = vec![BTreeMap::new(); n_nodes];
        let mut undecided: Vec<(usize, NodeId)> = Vec::new();
        // bound whole-GPU pods: (index, node, listed by the agent, decided GPUs)
        let mut whole_bound: Vec<(usize, NodeId, bool, Vec<u32>)> = Vec::new();
        for (uid, e) in entries {
            match e {
                Entry::Skip => {}
                Entry::Unseen {
                    queue,
                    class,
                    problem,
                } => {
                    *out.pending_by_queue.entry(queue.clone()).or_default() += 1;
                    if let Some(c) = class {
                        *out.unseen_by_queue
                            .entry(queue.clone())
                            .or_default()
                            .entry(*c)
                            .or_default() += 1;
                    }
                    out.problems.push(problem.clone());
                }
                Entry::Placed(p) => {
                    out.problems.extend(p.problems.iter().cloned());
                    if let Some(q) = &p.pending_queue {
                        *out.pending_by_queue.entry(q.clone()).or_default() += 1;
                    }
                    let i = out.snapshot.pods.len();
                    let mut state = p.state.clone();
                    if p.bound {
                        state.pod.disruption_budget_exhausted = exhausted.contains(uid);
                    }
                    if let Some((n, gpus)) = state.holding() {
                        if p.undecided {
                            undecided.push((i, n));
                        } else {
                            mark(&mut taken[n as usize], &mut shared[n as usize], gpus);
                        }
                        if let Some((listed, d)) = &p.whole {
                            whole_bound.push((i, n, *listed, d.clone()));
                        }
                    }
                    if let Some(r) = &p.replicas {
                        out.replicas.insert(i, r.clone());
                    }
                    out.pods.push(p.pref.clone());
                    out.snapshot.pods.push(state);
                }
            }
        }
        swaps_in_progress(&mut out.snapshot.pods, &whole_bound, &mut taken);
        // DRA GPUs held by claims that no pod of the snapshot is counted on
        // (allocated by someone else, or their pods are gone and the claim
        // is not deallocated yet): in use, so the core never gives them
        let mut touched = BTreeSet::new();
        for (d, _) in self.dra.held() {
            if let Some(&(n, p)) = np.dra_gpus.get(d)
                && taken[n as usize].insert(p)
                && let Some(g) = out.snapshot.nodes[n as usize].gpus.get_mut(p as usize)
            {
                if g.is_healthy() {
                    g.health = gpusched_model::GpuHealth::NotAllocatable;
                }
                touched.insert(n);
            }
        }
        for n in touched {
            out.snapshot.nodes[n as usize].sync_gpu_allocatable();
        }
        // Pods placed by others hold GPUs the kubelet chose; we do not know
        // which, so they get the lowest free ones (healthy first): the count
        // per node is what matters for the next placement.
        for (i, n) in undecided {
            let node = &out.snapshot.nodes[n as usize];
            let want = out.snapshot.pods[i].pod.gpu;
            let a = match (&out.snapshot.pods[i].pod.mig, want) {
                // MIG instances: the lowest free ones of its profile
                (Some(ask), _) => undecided_mig(&out.snapshot, n, ask),
                (None, want) => match want {
                    GpuRequest::Whole(k) => {
                        let mut order: Vec<u32> = (0..node.gpus.len() as u32)
                            .filter(|g| {
                                !taken[n as usize].contains(g)
                                    && !shared[n as usize].contains_key(g)
                                    && !node.gpus[*g as usize].is_mig()
                            })
                            .collect();
                        order.sort_by_key(|&g| (!node.gpus[g as usize].is_healthy(), g));
                        order.truncate(k as usize);
                        GpuAssignment::Whole(order)
                    }
                    GpuRequest::Share { milli, memory_mib } => {
                        let gpu = (0..node.gpus.len() as u32)
                            .filter(|g| {
                                !taken[n as usize].contains(g) && !node.gpus[*g as usize].is_mig()
                            })
                            .min_by_key(|g| (shared[n as usize].get(g).copied().unwrap_or(0), *g));
                        match gpu {
                            Some(gpu) => GpuAssignment::Share {
                                gpu,
                                milli,
                                memory_mib,
                            },
                            None => GpuAssignment::None,
                        }
                    }
                    GpuRequest::None => GpuAssignment::None,
                },
            };
            mark(&mut taken[n as usize], &mut shared[n as usize], &a);
            match &mut out.snapshot.pods[i].phase {
                PodPhase::Running { gpus, .. } | PodPhase::Terminating { gpus, .. } => *gpus = a,
                PodPhase::Pending { .. } => {}
            }
        }
        out
    }
}

/// A swap in progress (`docs/protocol.md`): pod B, listed by its agent on
/// GPUs its decision did not name, holds a GPU pod A was decided onto, and
/// A is not admitted yet (not listed). The agent will give A a GPU a listed
/// pod was decided onto but does not hold; counting A on its decision would
/// count one GPU twice and leave that one looking free, and the next
/// decision would land on it (seen on a real kubelet, issue 29). A is
/// counted there instead, as the agent will serve it (lowest such GPU no
/// pod is counted on).
fn swaps_in_progress(
    pods: &mut [PodState],
    bound: &[(usize, NodeId, bool, Vec<u32>)],
    taken: &mut [BTreeSet<u32>],
) {
    let whole = |p: &PodState| match &p.phase {
        PodPhase::Running {
            gpus: GpuAssignment::Whole(v),
            ..
        }
        | PodPhase::Terminating {
            gpus: GpuAssignment::Whole(v),
            ..
        } => v.clone(),
        _ => Vec::new(),
    };
    let nodes: BTreeSet<NodeId> = bound
        .iter()
        .filter(|(i, _, listed, d)| {
            *listed
                && whole(&pods[*i]).iter().collect::<BTreeSet<_>>()
                    != d.iter().collect::<BTreeSet<_>>()
        })
        .map(|(_, n, _, _)| *n)
        .collect();
    for n in nodes {
        let on: Vec<&(usize, NodeId, bool, Vec<u32>)> = bound.iter().filter(|b| b.1 == n).collect();
        let held_listed: BTreeSet<u32> = on
            .iter()
            .filter(|b| b.2)
            .flat_map(|b| whole(&pods[b.0]))
            .collect();
        let mut counted: BTreeSet<u32> = on.iter().flat_map(|b| whole(&pods[b.0])).collect();
        let mut spare: BTreeSet<u32> = on
            .iter()
            .filter(|b| b.2)
            .flat_map(|b| b.3.iter().copied())
            .filter(|g| !counted.contains(g))
            .collect();
        for b in on.iter().filter(|b| !b.2) {
            let mut gpus = whole(&pods[b.0]);
            let mut changed = false;
            for g in gpus.iter_mut() {
                if held_listed.contains(g)
                    && let Some(h) = spare.pop_first()
                {
                    *g = h;
                    counted.insert(h);
                    taken[n as usize].insert(h);
                    changed = true;
                }
            }
            if changed {
                gpus.sort_unstable();
                match &mut pods[b.0].phase {
                    PodPhase::Running { gpus: a, .. } | PodPhase::Terminating { gpus: a, .. } => {
                        *a = GpuAssignment::Whole(gpus)
                    }
                    PodPhase::Pending { .. } => {}
                }
            }
        }
    }
}

/// A gang member is in its group's queue (the PodGroup's `spec.queue`,
/// else its members' label): the core admits the gang there, so its usage
/// must be counted there too, not in the member's own label or `default`.
/// `groups` is sorted by name.
fn group_queue(groups: &[MGroup], pod: &mut gpusched_model::Pod) {
    if let Some(g) = pod.group.as_deref()
        && let Ok(i) = groups.binary_search_by(|x| x.name.as_str().cmp(g))
    {
        pod.queue = groups[i].queue.clone();
    }
}

/// The lowest free MIG instances of `ask` on node `n` (by GPU position,
/// healthy GPUs first) for a bound pod without a usable decision (placed by
/// another scheduler): the kubelet chose, we do not know which, and the
/// count per node is what matters for the next placement.
fn undecided_mig(
    snap: &gpusched_core::Snapshot,
    n: NodeId,
    ask: &gpusched_model::MigAsk,
) -> GpuAssignment {
    let node = &snap.nodes[n as usize];
    let mut used: BTreeSet<(u32, u32)> = BTreeSet::new();
    for p in &snap.pods {
        if let PodPhase::Running {
            node: pn,
            gpus: GpuAssignment::Mig { gpu, instances, .. },
            ..
        }
        | PodPhase::Terminating {
            node: pn,
            gpus: GpuAssignment::Mig { gpu, instances, .. },
        } = &p.phase
            && *pn == n
        {
            used.extend(instances.iter().map(|&i| (*gpu, i)));
        }
    }
    let mut order: Vec<usize> = (0..node.gpus.len()).collect();
    order.sort_by_key(|&g| (!node.gpus[g].is_healthy(), g));
    for g in order {
        let free: Vec<u32> = node.gpus[g]
            .mig
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                m.resource == ask.resource
                    && m.profile == ask.profile
                    && !used.contains(&(g as u32, *i as u32))
            })
            .map(|(i, _)| i as u32)
            .take(ask.count as usize)
            .collect();
        if free.len() == ask.count as usize {
            let milli = free
                .iter()
                .map(|&i| node.gpus[g].mig[i as usize].milli)
                .sum();
            return GpuAssignment::Mig {
                gpu: g as u32,
                instances: free,
                milli,
            };
        }
    }
    GpuAssignment::None
}

fn mark(taken: &mut BTreeSet<u32>, shared: &mut BTreeMap<u32, u64>, a: &GpuAssignment) {
    match a {
        GpuAssignment::None => {}
        GpuAssignment::Whole(v) => taken.extend(v.iter().copied()),
        GpuAssignment::Share { gpu, milli, .. } | GpuAssignment::Mig { gpu, milli, .. } => {
            *shared.entry(*gpu).or_default() += *milli as u64;
        }
    }
}

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

mod assemble;
mod entry;

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
    /// Those of them that are shared GPUs (`crate::dra::gpus::is_shared_gpu`).
    pub(super) dra_shared: BTreeSet<DeviceId>,
    /// DRA MIG instances: the node, the position of their GPU (in MIG
    /// mode) and their slot among its instances.
    pub(super) dra_mig: BTreeMap<DeviceId, (NodeId, u32, u32)>,
}

impl NodePart {
    /// A pod's GPUs on `node` from its claims' allocation results (those
    /// on other nodes, or not the core's GPUs, aside): `None` when they
    /// hold none; else its demand (with its MIG ask) and its assignment —
    /// one share of one shared GPU when that is all they take of GPUs (the
    /// milli they consume); MIG instances of one GPU when they take only
    /// instances; else every GPU device they touch, whole (shares of
    /// several GPUs, or beside whole GPUs, count as those GPUs whole:
    /// never less than is held; instances beside GPU devices are left to
    /// the allocator's counters).
    fn claim_hold<'a>(
        &self,
        node: NodeId,
        results: impl IntoIterator<Item = &'a crate::dra::AllocatedDevice>,
    ) -> Option<(GpuRequest, Option<gpusched_model::MigAsk>, GpuAssignment)> {
        let mut by_pos: BTreeMap<u32, u32> = BTreeMap::new();
        let mut mig: BTreeMap<u32, BTreeSet<u32>> = BTreeMap::new();
        for r in results {
            if let Some(&(n, p)) = self.dra_gpus.get(&r.id)
                && n == node
            {
                let m = by_pos.entry(p).or_default();
                *m = (*m + crate::dra::gpus::result_milli(r)).min(1000);
            } else if let Some(&(n, p, k)) = self.dra_mig.get(&r.id)
                && n == node
            {
                mig.entry(p).or_default().insert(k);
            }
        }
        match by_pos
            .iter()
            .map(|(g, m)| (*g, *m))
            .collect::<Vec<_>>()
            .as_slice()
        {
            [] => {}
            &[(gpu, milli)] if milli < 1000 => {
                return Some((
                    GpuRequest::Share {
                        milli,
                        memory_mib: 0,
                    },
                    None,
                    GpuAssignment::Share {
                        gpu,
                        milli,
                        memory_mib: 0,
                    },
                ));
            }
            v => {
                return Some((
                    GpuRequest::Whole(v.len() as u32),
                    None,
                    GpuAssignment::Whole(by_pos.keys().copied().collect()),
                ));
            }
        }
        let (gpu, instances) = mig.into_iter().next()?;
        let slots = &self.nodes.get(node as usize)?.gpus.get(gpu as usize)?.mig;
        let milli: u32 = instances
            .iter()
            .filter_map(|&k| slots.get(k as usize))
            .map(|s| s.milli)
            .sum();
        let first = slots.get(*instances.first()? as usize)?;
        let ask = instances
            .iter()
            .filter_map(|&k| slots.get(k as usize))
            .all(|s| s.profile == first.profile)
            .then(|| gpusched_model::MigAsk {
                resource: first.resource.clone(),
                profile: first.profile.clone(),
                count: instances.len() as u32,
            });
        Some((
            GpuRequest::Share {
                milli,
                memory_mib: 0,
            },
            ask,
            GpuAssignment::Mig {
                gpu,
                instances: instances.into_iter().collect(),
                milli,
            },
        ))
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
    /// [`crate::dra::state::ClaimGpusMemo`] of this build.
    gpu_memo: crate::dra::state::ClaimGpusMemo,
    /// The pods the core counts claimed GPUs on: what they hold of shared
    /// GPUs is free for the feasibility check (the core's question).
    core_pods: BTreeSet<String>,
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
        let held = w.dra.held();
        let core_pods = held
            .iter()
            .filter_map(|(_, owner)| *owner)
            .filter(|u| w.placed_in_core(u))
            .map(str::to_string)
            .collect();
        let in_use = held
            .into_iter()
            .filter(|(d, owner)| !(gpus.contains(d) && owner.is_some_and(|u| w.placed_in_core(u))))
            .map(|(d, _)| d.clone())
            .collect();
        DraCtx {
            nodes: w.nodes.keys().map(String::as_str).collect(),
            devices,
            in_use,
            memo: BTreeMap::new(),
            gpu_memo: BTreeMap::new(),
            core_pods,
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
            let devices = self.dra.core_gpus_on(name);
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
                n.gpus = crate::dra::gpus::model_core_gpus(&devices);
                n.sync_gpu_allocatable();
                for (p, g) in devices.iter().enumerate() {
                    match g {
                        crate::dra::gpus::CoreGpu::Device(d) => {
                            out.dra_gpus.insert(d.id.clone(), (i as NodeId, p as u32));
                            if crate::dra::gpus::is_shared_gpu(d) {
                                out.dra_shared.insert(d.id.clone());
                            }
                        }
                        crate::dra::gpus::CoreGpu::Mig { instances, .. } => {
                            for (k, (d, _)) in instances.iter().enumerate() {
                                out.dra_mig
                                    .insert(d.id.clone(), (i as NodeId, p as u32, k as u32));
                            }
                        }
                    }
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
        for (key, r) in &self.gang_jobs {
            if let Err(e) = r {
                out.problems.push(Problem::InvalidGroup {
                    group: format!("Job {key}"),
                    error: e.clone(),
                });
            }
        }
        for ((kind, key), w) in &self.workloads {
            if let Err(e) = w {
                out.problems.push(Problem::InvalidGroup {
                    group: format!("{} {key}", kind.api_kind()),
                    error: e.clone(),
                });
            }
        }
    }
}

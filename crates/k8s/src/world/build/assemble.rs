//! The assembly: the parts and the pods' entries laid out in snapshot
//! order, and the GPUs placed that depend on the other pods of a node
//! (GPUs nobody recorded, swaps in progress) or of a namespace
//! (PodDisruptionBudgets).

use super::*;

impl World {
    /// Lays out the parts and the pods' entries (in snapshot order, with
    /// their uids) as the core's snapshot, and places what depends on the
    /// other pods of a node (GPUs nobody recorded, swaps in progress) and
    /// on a namespace's pods (PodDisruptionBudgets).
    pub(in crate::world) fn assemble<'e>(
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
        // gpusched.io/ keys of our pods it does not know (typos)
        for v in self.pods.values().filter(|v| v.ours) {
            for w in &v.key_warnings {
                out.problems.push(Problem::PodKeyWarning {
                    pod: PodRef {
                        uid: v.uid.clone(),
                        namespace: v.namespace.clone(),
                        name: v.name.clone(),
                    },
                    warning: w.clone(),
                });
            }
        }
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
        // pods counted on GPUs (their claims' shares are theirs)
        let mut holders: BTreeSet<&str> = BTreeSet::new();
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
                    // (the pod record is shared: copied only when it changes)
                    if p.bound && state.pod.disruption_budget_exhausted != exhausted.contains(uid) {
                        std::sync::Arc::make_mut(&mut state.pod).disruption_budget_exhausted =
                            exhausted.contains(uid);
                    }
                    if let Some((n, gpus)) = state.holding() {
                        if !matches!(gpus, GpuAssignment::None) {
                            holders.insert(uid);
                        }
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
        // is not deallocated yet): in use, so the core never gives them (a
        // share of a shared GPU, or a MIG instance, held so takes the whole
        // GPU out until it is deallocated: never less than is held — unless
        // pods the core counts hold shares or instances of it too: out,
        // their holdings would not fit the core's state and their pods
        // would go uncounted, so the GPU stays and the allocator, the
        // authority at bind time, refuses what does not fit beside the
        // held share)
        let mut touched = BTreeSet::new();
        for (d, owner) in self.dra.held_results() {
            let part = shared_gpu(np, &d.id);
            if part && owner.is_some_and(|o| holders.contains(o)) {
                continue;
            }
            let at = np
                .dra_gpus
                .get(&d.id)
                .copied()
                .or_else(|| np.dra_mig.get(&d.id).map(|&(n, p, _)| (n, p)));
            if let Some((n, p)) = at
                && !(part && shared[n as usize].contains_key(&p))
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

/// Whether DRA device `d` is a shared GPU of the core or a MIG instance
/// (held by a pod the core counts, it is counted on that pod).
fn shared_gpu(np: &NodePart, d: &crate::dra::DeviceId) -> bool {
    np.dra_shared.contains(d) || np.dra_mig.contains_key(d)
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

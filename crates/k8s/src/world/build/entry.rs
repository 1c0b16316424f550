//! One pod's entry in the snapshot: what the core sees of it (pending,
//! bound, being bound, invalid) and where its GPUs are.

use super::*;

impl World {
    /// One pod's entry. `dra` is made on first need.
    pub(in crate::world) fn pod_entry<'a>(
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
            PodKind::Finished { pod, node } => {
                // `status.phase` is anyone's with pods/status: a pod whose
                // node's agent still lists it (the kubelet shows its
                // devices in use) holds them there, whatever its status
                let Some(&n) = np.ids.get(node.as_str()) else {
                    return Entry::Skip;
                };
                let nv = &np.nodes[n as usize];
                let Some(gpus) = self
                    .served(node, &v.uid, nv)
                    .filter(|g| g.milli() == pod.gpu.milli())
                else {
                    return Entry::Skip;
                };
                let mut pod = pod.clone();
                pod.group = self.group_of(v);
                self.inherit_queue(v, &mut pod);
                group_queue(&hp.groups, &mut pod);
                Entry::Placed(Box::new(Placed {
                    pref: pref(v),
                    state: PodState {
                        pod: pod.into(),
                        phase: PodPhase::Running {
                            node: n,
                            gpus,
                            since_ms: self.bound_since(v),
                        },
                    },
                    replicas: None,
                    problems: Vec::new(),
                    pending_queue: None,
                    bound: true,
                    whole: None,
                    undecided: false,
                    node: Some(node.clone()),
                }))
            }
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
                // its Job asked a gang with a value that is not a flag
                if !self.assumed.contains_key(&v.uid)
                    && let Some(e) = self.gang_job_error(v)
                {
                    return unseen(
                        Some(PendingClass::InvalidSpec),
                        Problem::InvalidPod {
                            pod: pref(v),
                            error: e.to_string(),
                        },
                    );
                }
                let mut pod = pod.clone();
                let replicas = match crate::sharing::resolve(&mut pod, &np.sharing) {
                    Ok(r) => r,
                    Err(why) => {
                        return unseen(
                            Some(PendingClass::InvalidSpec),
                            Problem::InvalidPod {
                                pod: pref(v),
                                error: why.to_string(),
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
                let mut claim_gpus = crate::dra::state::ClaimDemand::default();
                let mut claim_gpu_set = None;
                if !v.claims.is_empty() && !self.assumed.contains_key(&v.uid) {
                    let d = dra.get_or_insert_with(|| DraCtx::new(self));
                    let (class, message) = match self.dra.pod_claims(
                        &v.namespace,
                        &v.claims,
                        &d.nodes,
                        &d.devices,
                        &d.in_use,
                        &d.core_pods,
                        &mut d.memo,
                    ) {
                        PodClaims::None => (None, String::new()),
                        PodClaims::Waiting(m) => (Some(PendingClass::WaitingForClaim), m),
                        PodClaims::Unallocatable(m) => (Some(PendingClass::UnallocatableClaim), m),
                        PodClaims::Nodes(n, g) => {
                            // which of those nodes' GPUs the claims may
                            // take, and which must go together
                            // (MIG instances are placed by the core's
                            // instances, not by GPU: not for them)
                            if !g.gpu.is_none() && g.mig.is_none() {
                                claim_gpu_set = self.dra.claim_gpus(
                                    &v.namespace,
                                    &v.claims,
                                    &n,
                                    &mut d.gpu_memo,
                                );
                            }
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
                // KEP-5004: a special claim that still exists (a retry
                // after a failed cleanup) is how the pod gets the GPUs it
                // asks as a resource, not a second ask
                let special_only = v
                    .claims
                    .iter()
                    .all(|c| c.entry == crate::dra::extended::IN_MEMORY_NAME);
                if !claim_gpus.gpu.is_none() && (pod.gpu.is_none() || !special_only) {
                    if !pod.gpu.is_none() {
                        return unseen(
                            Some(PendingClass::InvalidSpec),
                            Problem::InvalidPod {
                                pod: pref(v),
                                error: format!(
                                    "pod {}/{}: asks GPUs both as a resource ({}) and through its ResourceClaims ({}); gpusched places one or the other",
                                    v.namespace,
                                    v.name,
                                    gpu_amount(&pod.gpu),
                                    gpu_amount(&claim_gpus.gpu),
                                ),
                            },
                        );
                    }
                    // one world: its claims' GPUs are its GPU demand
                    pod.gpu = claim_gpus.gpu;
                    pod.mig = claim_gpus.mig.map(Box::new);
                }
                let mut pending_queue = None;
                let mut node = None;
                let phase = match self.assumed.get(&v.uid) {
                    Some(a) => match np.ids.get(a.node.as_str()) {
                        Some(&n) => {
                            node = Some(a.node.clone());
                            // being bound with claims: counted on the GPUs
                            // its claims got
                            let held = np.claim_hold(
                                n,
                                self.dra.held_results_by(&v.uid, &v.namespace, &v.claims),
                            );
                            let gpus = match held {
                                Some((req, mig, held)) if pod.gpu.is_none() || pod.gpu == req => {
                                    pod.gpu = req;
                                    pod.mig = mig.map(Box::new);
                                    held
                                }
                                _ => a.gpus.clone(),
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
                        // the scheduler's own nomination first (the
                        // status field is anyone's with pods/status); the
                        // core checks that it can still fit and bounds
                        // its age
                        let name = self.nominated.get(&v.uid).or(nominated.as_ref());
                        PodPhase::Pending {
                            nominated: name.and_then(|n| np.ids.get(n.as_str()).copied()),
                            nominated_at_ms: name.and_then(|n| {
                                self.nominated_at
                                    .get(&v.uid)
                                    .filter(|(at, _)| at == n)
                                    .map(|(_, ms)| *ms)
                            }),
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
                if let Some(c) = claim_gpu_set {
                    pod.constraints_mut().claim_gpus = Some(c);
                }
                pod.group = group;
                self.inherit_queue(v, &mut pod);
                group_queue(&hp.groups, &mut pod);
                Entry::Placed(Box::new(Placed {
                    pref: pref(v),
                    state: PodState {
                        pod: pod.into(),
                        phase,
                    },
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
                let dra_held = if v.claims.is_empty() && v.extended.is_empty() {
                    None
                } else {
                    np.claim_hold(n, self.dra.held_results_by(&v.uid, &v.namespace, &v.claims))
                };
                // (a KEP-5004 pod asks `nvidia.com/gpu` and holds its
                // special claim's devices: the same count)
                let dra_held = dra_held.filter(|(req, _, _)| pod.gpu.is_none() || pod.gpu == *req);
                let is_dra = dra_held.is_some();
                let gpus = match (decision, dra_held) {
                    (_, Some((req, mig, held))) => {
                        pod.gpu = req;
                        pod.mig = mig.map(Box::new);
                        Some(held)
                    }
                    (decision, None) => match decision {
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
                    },
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
                    // no decision (it bypassed the scheduler): the GPUs the
                    // agent says the kubelet gave it, not a guess
                    (None, Some(real)) if !pod.gpu.is_none() && real.milli() == pod.gpu.milli() => {
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
                        since_ms: self.bound_since(v),
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
                    state: PodState {
                        pod: pod.into(),
                        phase,
                    },
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
}

/// A GPU demand as a pod's spec would say it: `2 GPU(s)`, `300 milli-GPU`.
fn gpu_amount(g: &GpuRequest) -> String {
    match g {
        GpuRequest::Share { milli, .. } => format!("{milli} milli-GPU"),
        g => format!("{} GPU(s)", g.milli() / gpusched_model::GPU_MILLI),
    }
}

fn pref(v: &PodView) -> PodRef {
    PodRef {
        uid: v.uid.clone(),
        namespace: v.namespace.clone(),
        name: v.name.clone(),
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

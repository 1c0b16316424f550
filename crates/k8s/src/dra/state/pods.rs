//! A pod's claims: which claims it names, the devices they hold, and
//! allocating them on a node (the pod's own claims and its extended
//! resources' special claim, KEP-5004).

use super::ClaimDemand;
use super::*;
use gpusched_model::GpuRequest;

impl DraState {
    /// The claims of a pod: the keys, or why it waits.
    pub(super) fn pod_claim_keys(
        &self,
        ns: &str,
        claims: &[PodClaim],
    ) -> Result<Vec<String>, String> {
        let mut keys = Vec::new();
        for pc in claims {
            let Some(name) = &pc.claim else {
                return Err(format!(
                    "waiting for the ResourceClaim of spec.resourceClaims[{}] to be created from its template",
                    pc.entry
                ));
            };
            let k = format!("{ns}/{name}");
            let special = pc.entry == crate::dra::extended::IN_MEMORY_NAME;
            match self.claims.get(&k) {
                // a special claim that is gone is made again
                None | Some(Claim { deleting: true, .. }) if special => continue,
                None => return Err(format!("waiting for ResourceClaim {k} to exist")),
                Some(c) if c.deleting => {
                    return Err(format!("ResourceClaim {k} is being deleted"));
                }
                Some(_) => {}
            }
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
        Ok(keys)
    }

    /// Where a pending pod's claims can be allocated, among `nodes` (the
    /// nodes the scheduler knows, sorted).
    ///
    /// `memo` keeps the answers of one build: pods whose unallocated
    /// claims ask the same ([`ask_key`]: requests and constraints, the
    /// claims' and requests' names aside) get the same nodes, so replicas
    /// of one job are looked at once. The allocator spends at most
    /// [`alloc::MAX_CLAIM_STEPS`] device choices on one ask per build, over
    /// all nodes; an ask that spends it before any node fits is
    /// unallocatable, saying so.
    #[allow(clippy::too_many_arguments)]
    pub fn pod_claims(
        &self,
        ns: &str,
        claims: &[PodClaim],
        nodes: &[&str],
        by_node: &BTreeMap<Option<&str>, Vec<&Device>>,
        in_use: &BTreeSet<DeviceId>,
        core_pods: &BTreeSet<String>,
        memo: &mut BTreeMap<String, PodClaims>,
    ) -> PodClaims {
        if claims.is_empty() {
            return PodClaims::None;
        }
        let keys = match self.pod_claim_keys(ns, claims) {
            Ok(k) => k,
            Err(e) => return PodClaims::Waiting(e),
        };
        // allocated claims pin the node; the others are allocated there
        let mut pinned: Option<&str> = None;
        let mut open: Vec<&Claim> = Vec::new();
        for k in &keys {
            match self.allocation_of(k) {
                Some(a) => {
                    if let Some(n) = a.node.as_deref() {
                        if pinned.is_some_and(|p| p != n) {
                            return PodClaims::Unallocatable(format!(
                                "its allocated ResourceClaims are on different nodes ({} and {n})",
                                pinned.unwrap_or_default()
                            ));
                        }
                        pinned = Some(n);
                    }
                }
                None => open.push(&self.claims[k]),
            }
        }
        for c in &open {
            if let Err(e) = &c.requests {
                return PodClaims::Unallocatable(e.clone());
            }
        }
        // same ask, same answer (claim names put back in the message)
        let memo_key = (pinned.is_none() && !open.is_empty()).then(|| ask_key(&open));
        let named = |r: &PodClaims, to_slot: bool| -> PodClaims {
            match r {
                PodClaims::Unallocatable(m) => {
                    let mut m = m.clone();
                    for (name, slot) in names_and_slots(&open) {
                        m = if to_slot {
                            m.replace(&name, &slot)
                        } else {
                            m.replace(&slot, &name)
                        };
                    }
                    PodClaims::Unallocatable(m)
                }
                other => other.clone(),
            }
        };
        if let Some(r) = memo_key.as_ref().and_then(|k| memo.get(k)) {
            return named(r, false);
        }
        let r = self.open_claims(&open, pinned, nodes, by_node, in_use, core_pods);
        if let Some(k) = memo_key {
            memo.insert(k, named(&r, true));
        }
        r
    }

    /// [`DraState::pod_claims`] for the unallocated claims `open`.
    fn open_claims(
        &self,
        open: &[&Claim],
        pinned: Option<&str>,
        nodes: &[&str],
        by_node: &BTreeMap<Option<&str>, Vec<&Device>>,
        in_use: &BTreeSet<DeviceId>,
        core_pods: &BTreeSet<String>,
    ) -> PodClaims {
        let candidates: Vec<&str> = match pinned {
            Some(p) => nodes.iter().copied().filter(|n| *n == p).collect(),
            None => nodes.to_vec(),
        };
        if open.is_empty() {
            return if candidates.is_empty() {
                PodClaims::Unallocatable(format!(
                    "its ResourceClaims are allocated on node {}, which the scheduler does not know",
                    pinned.unwrap_or_default()
                ))
            } else {
                PodClaims::Nodes(
                    candidates.into_iter().map(String::from).collect(),
                    ClaimDemand::default(),
                )
            };
        }
        let mut sel = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
        let mut ok = Vec::new();
        // why not, with the nodes it applies to
        let mut why: BTreeMap<String, Vec<&str>> = BTreeMap::new();
        let mut failed = 0;
        let mut gpus: Option<ClaimDemand> = None;
        let mut budget = alloc::MAX_CLAIM_STEPS;
        let (all, mut tried) = (candidates.len(), 0);
        for n in candidates {
            if budget == 0 {
                break;
            }
            tried += 1;
            match self.allocate_on(
                open,
                n,
                by_node,
                in_use,
                Some(core_pods),
                &mut sel,
                &mut budget,
            ) {
                Ok(allocs) => {
                    let local = by_node.get(&Some(n)).map_or(&[][..], Vec::as_slice);
                    let g = self.demand_in(&allocs, local);
                    gpus = Some(match gpus {
                        Some(x) if x.gpu.milli() <= g.gpu.milli() => x,
                        _ => g,
                    });
                    ok.push(n.to_string());
                }
                Err(e) => {
                    failed += 1;
                    let e = e
                        .strip_prefix(&format!("node {n}: "))
                        .map(str::to_string)
                        .unwrap_or(e);
                    why.entry(e).or_default().push(n);
                }
            }
        }
        if ok.is_empty() && budget == 0 {
            // #38: the claims' work for this cycle is spent
            let (e, ns) = why
                .iter()
                .find(|(e, _)| e.contains(alloc::GAVE_UP))
                .or_else(|| why.iter().next())
                .map(|(e, ns)| (e.as_str(), ns.first().copied().unwrap_or_default()))
                .unwrap_or_default();
            return PodClaims::Unallocatable(format!(
                "its ResourceClaims were not allocated within the allocator's bound of {} device choices per scheduling cycle: {tried} of {all} node(s) tried, none fits (node {ns}: {e}); simplify the claims' requests and constraints",
                alloc::MAX_CLAIM_STEPS
            ));
        }
        if ok.is_empty() {
            if why.is_empty() {
                return PodClaims::Unallocatable(
                    "its ResourceClaims cannot be allocated: no node is known".into(),
                );
            }
            let mut why: Vec<(String, Vec<&str>)> = why.into_iter().collect();
            why.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.cmp(&b.0)));
            let shown: Vec<String> = why
                .iter()
                .take(3)
                .map(|(e, ns)| match ns.as_slice() {
                    [one] => format!("node {one}: {e}"),
                    _ => format!("{} nodes (e.g. {}): {e}", ns.len(), ns[0]),
                })
                .collect();
            return PodClaims::Unallocatable(format!(
                "its ResourceClaims cannot be allocated on any of {failed} node(s): {}",
                shown.join("; ")
            ));
        }
        // `firstAvailable`: which alternative a request gets depends on
        // what is free on the node, so the count above (the GPUs of pods
        // counted as free, so the core may preempt them) takes the first
        // alternative where a later one fits now. While some node can
        // allocate the claims from what is really free, the pod asks the
        // most GPUs one node gives it now (the allocator answers the
        // core's choice there); else the count above, for preemption.
        let prioritized = open.iter().any(|c| {
            c.requests
                .as_ref()
                .is_ok_and(|rs| rs.iter().any(|r| r.alternatives.len() > 1))
        });
        if prioritized {
            let held = self.in_use();
            let now = ok
                .iter()
                .filter_map(|n| {
                    let allocs = self
                        .allocate_on(open, n, by_node, &held, None, &mut sel, &mut budget)
                        .ok()?;
                    let local = by_node
                        .get(&Some(n.as_str()))
                        .map_or(&[][..], Vec::as_slice);
                    Some(self.demand_in(&allocs, local))
                })
                .max_by_key(|d| d.gpu.milli());
            if now.is_some() {
                gpus = now;
            }
        }
        PodClaims::Nodes(ok, gpus.unwrap_or_default())
    }

    /// The core's GPUs among the devices of `allocs`: per GPU device the
    /// milli-GPUs the allocations take of it (1000: whole; less: shares of
    /// a shared GPU), and per GPU in MIG mode (its counter set) the
    /// instances taken; `local`: the node's own devices, sorted by id.
    #[allow(clippy::type_complexity)]
    fn gpus_of<'d>(
        &self,
        allocs: &[Allocation],
        local: &[&'d Device],
    ) -> (
        BTreeMap<&'d DeviceId, u32>,
        BTreeMap<CounterSetId, Vec<super::super::gpus::MigInfo>>,
    ) {
        let mut whole: BTreeMap<&DeviceId, u32> = BTreeMap::new();
        let mut mig: BTreeMap<CounterSetId, Vec<super::super::gpus::MigInfo>> = BTreeMap::new();
        for r in allocs.iter().flat_map(|a| &a.devices).filter(|d| !d.admin) {
            let Ok(i) = local.binary_search_by(|x| x.id.cmp(&r.id)) else {
                continue;
            };
            let d = local[i];
            // a tainted GPU is unhealthy in the core, which never
            // chooses one: a claim tolerating the taint takes it beside
            // the core's count
            if d.untolerated(&[]).is_some() {
                continue;
            }
            if self.gpu_drivers.is_gpu(d) {
                let m = whole.entry(&d.id).or_default();
                *m = (*m + super::super::gpus::result_milli(r)).min(1000);
            } else if self.gpu_drivers.is_mig(d)
                && let (Some(u), Some(info)) = (
                    d.consumes.first(),
                    super::super::gpus::mig_info(d, &self.counter_sets),
                )
            {
                mig.entry(super::super::gpus::counter_set(d, &u.set))
                    .or_default()
                    .push(info);
            }
        }
        (whole, mig)
    }

    /// How many core GPUs the allocations take (whole, in part, or
    /// instances of).
    fn gpus_in(&self, allocs: &[Allocation], local: &[&Device]) -> u32 {
        let (whole, mig) = self.gpus_of(allocs, local);
        (whole.len() + mig.len()) as u32
    }

    /// The core's GPU demand of the allocations ([`DraState::gpus_of`]):
    /// a share of one GPU when they take less than all of one GPU and
    /// nothing else; MIG instances when they take only instances, of one
    /// profile of one GPU; else every GPU device they touch, whole (MIG
    /// instances beside GPU devices, or of several GPUs or profiles, are
    /// left to the allocator).
    fn demand_in(&self, allocs: &[Allocation], local: &[&Device]) -> ClaimDemand {
        let (whole, mig) = self.gpus_of(allocs, local);
        let gpu = match whole.values().copied().collect::<Vec<u32>>().as_slice() {
            [] => GpuRequest::None,
            &[milli] if milli < 1000 => GpuRequest::Share {
                milli,
                memory_mib: 0,
            },
            v => GpuRequest::Whole(v.len() as u32),
        };
        if !gpu.is_none() {
            return ClaimDemand { gpu, mig: None };
        }
        match mig.iter().collect::<Vec<_>>().as_slice() {
            [(set, instances)] if instances.iter().all(|i| i.profile == instances[0].profile) => {
                let count = instances.len() as u32;
                ClaimDemand {
                    gpu: GpuRequest::Share {
                        milli: instances.iter().map(|i| i.milli).sum(),
                        memory_mib: 0,
                    },
                    mig: Some(gpusched_model::MigAsk {
                        resource: super::super::gpus::mig_resource(
                            &set.driver,
                            &instances[0].profile,
                        ),
                        profile: instances[0].profile.clone(),
                        count,
                    }),
                }
            }
            _ => ClaimDemand::default(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn allocate_on(
        &self,
        open: &[&Claim],
        node: &str,
        by_node: &BTreeMap<Option<&str>, Vec<&Device>>,
        in_use: &BTreeSet<DeviceId>,
        core_pods: Option<&BTreeSet<String>>,
        sel: &mut Selectors,
        budget: &mut u32,
    ) -> Result<Vec<Allocation>, String> {
        let mut devices: Vec<&Device> = Vec::new();
        devices.extend(by_node.get(&Some(node)).into_iter().flatten());
        devices.extend(
            by_node
                .get(&None)
                .into_iter()
                .flatten()
                .filter(|d| self.available_on(d, node)),
        );
        devices.sort_by(|a, b| a.id.cmp(&b.id));
        let shared = self.shared_on(node, &devices, core_pods);
        let inp = Inputs {
            node,
            devices: &devices,
            in_use,
            classes: &self.classes,
            counter_sets: &self.counter_sets,
            shared: &shared,
        };
        alloc::allocate_within(open, &inp, sel, budget)
    }

    /// Allocates the pod's claims on `node` now (the core placed it there)
    /// and remembers the allocations as tentative until the claims show
    /// them: what to write to each claim before the Binding.
    ///
    /// `core_gpus`: the positions of the node's GPUs the core chose for the
    /// pod ([`DraState::gpu_devices_on`]). When the allocator's own answer
    /// takes as many GPUs as the core chose, the claims get the core's
    /// GPUs if their selectors and constraints allow them (the allocator
    /// is run again with every other GPU of the node held); otherwise, or
    /// when they do not, the allocator's own answer stands (the next
    /// snapshot counts the pod on the GPUs it really got).
    pub fn allocate(
        &mut self,
        pod_uid: &str,
        ns: &str,
        claims: &[PodClaim],
        node: &str,
        core_gpus: &[u32],
    ) -> Result<Vec<ClaimWrite>, String> {
        let keys = self.pod_claim_keys(ns, claims)?;
        let mut open: Vec<&Claim> = Vec::new();
        let mut writes = Vec::new();
        for k in &keys {
            let c = &self.claims[k];
            match self.allocation_of(k) {
                Some(a) => {
                    if a.node.as_deref().is_some_and(|n| n != node) {
                        return Err(format!(
                            "ResourceClaim {k} is allocated on node {}, not {node}",
                            a.node.as_deref().unwrap_or_default()
                        ));
                    }
                    writes.push(ClaimWrite {
                        namespace: c.namespace.clone(),
                        name: c.name.clone(),
                        uid: c.uid.clone(),
                        allocate: None,
                        extended: None,
                    });
                }
                None => open.push(c),
            }
        }
        if !open.is_empty() {
            let by_node = BTreeMap::from([(Some(node), self.devices_on(node))]);
            let in_use = self.in_use_on(node);
            let mut sel = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
            let mut budget = alloc::MAX_CLAIM_STEPS;
            let mut allocs =
                self.allocate_on(&open, node, &by_node, &in_use, None, &mut sel, &mut budget)?;
            if let Some(a) =
                self.core_choice(&open, node, &by_node, &in_use, &allocs, core_gpus, &mut sel)
            {
                allocs = a;
            }
            drop(sel);
            let mut made = Vec::new();
            for (c, a) in open.iter().zip(allocs) {
                writes.push(ClaimWrite {
                    namespace: c.namespace.clone(),
                    name: c.name.clone(),
                    uid: c.uid.clone(),
                    allocate: Some(a.clone()),
                    extended: None,
                });
                made.push((c.key(), a));
            }
            for (k, a) in made {
                self.add_tentative(
                    k,
                    Tentative {
                        pod: pod_uid.to_string(),
                        allocation: a,
                    },
                );
            }
        }
        writes.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        Ok(writes)
    }

    /// The allocator's answer again with every GPU of `node` but the
    /// core's choice (`core_gpus`, positions in
    /// [`DraState::gpu_devices_on`]) held — a shared GPU, which is never
    /// "in use", left out of the devices instead — when its own answer
    /// `allocs` takes as many GPUs as the core chose: the claims get
    /// exactly the core's GPUs. `None`: no such answer (the allocator's
    /// own stands).
    #[allow(clippy::too_many_arguments)]
    fn core_choice(
        &self,
        open: &[&Claim],
        node: &str,
        by_node: &BTreeMap<Option<&str>, Vec<&Device>>,
        in_use: &BTreeSet<DeviceId>,
        allocs: &[Allocation],
        core_gpus: &[u32],
        sel: &mut Selectors,
    ) -> Option<Vec<Allocation>> {
        let local: Vec<&Device> = by_node
            .get(&Some(node))
            .map_or(&[][..], Vec::as_slice)
            .iter()
            .copied()
            .filter(|d| d.node.is_some())
            .collect();
        if core_gpus.is_empty() || self.gpus_in(allocs, &local) as usize != core_gpus.len() {
            return None;
        }
        let mut others: BTreeSet<&DeviceId> = BTreeSet::new();
        for (i, g) in self.core_gpus_on(node).into_iter().enumerate() {
            if core_gpus.contains(&(i as u32)) {
                continue;
            }
            match g {
                super::super::gpus::CoreGpu::Device(d) => {
                    others.insert(&d.id);
                }
                super::super::gpus::CoreGpu::Mig { instances, .. } => {
                    others.extend(instances.into_iter().map(|(d, _)| &d.id));
                }
            }
        }
        let mut held = in_use.clone();
        held.extend(others.iter().map(|d| (*d).clone()));
        let only: BTreeMap<Option<&str>, Vec<&Device>> = by_node
            .iter()
            .map(|(k, v)| {
                let v = v
                    .iter()
                    .copied()
                    .filter(|d| !(d.multiple && others.contains(&d.id)))
                    .collect();
                (*k, v)
            })
            .collect();
        let mut budget = alloc::MAX_CLAIM_STEPS;
        self.allocate_on(open, node, &only, &held, None, sel, &mut budget)
            .ok()
    }

    /// Extended resource name → DeviceClass (KEP-5004).
    pub fn class_mapping(&self) -> BTreeMap<String, String> {
        crate::dra::extended::class_mapping(&self.classes)
    }

    /// KEP-5004: allocates pod `pod_uid`'s special claim (`reqs`, what
    /// `node` does not serve itself) on `node`, holding the devices in
    /// memory until the created claim shows them: the write that creates,
    /// allocates and reserves it. `core_gpus` as for
    /// [`DraState::allocate`].
    pub fn allocate_extended(
        &mut self,
        pod_uid: &str,
        ns: &str,
        reqs: &[crate::dra::extended::ExtendedRequest],
        node: &str,
        core_gpus: &[u32],
    ) -> Result<ClaimWrite, String> {
        let claim = crate::dra::extended::claim(ns, reqs);
        let by_node = BTreeMap::from([(Some(node), self.devices_on(node))]);
        let in_use = self.in_use_on(node);
        let mut sel = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
        let mut budget = alloc::MAX_CLAIM_STEPS;
        let mut allocs = self
            .allocate_on(
                &[&claim],
                node,
                &by_node,
                &in_use,
                None,
                &mut sel,
                &mut budget,
            )
            .map_err(|e| format!("the pod's extended resources through DRA: {e}"))?;
        // the core's GPUs, when the claim can have exactly them (as for
        // the pod's own claims)
        if let Some(a) = self.core_choice(
            &[&claim],
            node,
            &by_node,
            &in_use,
            &allocs,
            core_gpus,
            &mut sel,
        ) {
            allocs = a;
        }
        drop(sel);
        let Some(a) = allocs.pop() else {
            return Err("the allocator gave no allocation for the extended resources".into());
        };
        self.add_tentative(
            crate::dra::extended::special_key(ns, pod_uid),
            Tentative {
                pod: pod_uid.to_string(),
                allocation: a.clone(),
            },
        );
        Ok(ClaimWrite {
            namespace: ns.to_string(),
            name: crate::dra::extended::IN_MEMORY_NAME.to_string(),
            uid: String::new(),
            allocate: Some(a),
            extended: Some(reqs.to_vec()),
        })
    }

    /// Whether pod `pod_uid`'s claims include its special claim, existing.
    pub fn has_special_claim(&self, ns: &str, claims: &[PodClaim]) -> bool {
        claims.iter().any(|pc| {
            pc.entry == crate::dra::extended::IN_MEMORY_NAME
                && pc
                    .claim
                    .as_ref()
                    .and_then(|n| self.claims.get(&format!("{ns}/{n}")))
                    .is_some_and(|c| !c.deleting)
        })
    }
}

/// What decides where claims can be allocated, as a memo key: per claim,
/// its requests' alternatives (class, selectors, count, admin access,
/// tolerations, capacity) and its constraints with the requests they name
/// by position — not the claims' or requests' names (#38: a name per pod
/// made every pod's claims a new search).
pub(crate) fn ask_key(open: &[&Claim]) -> String {
    use std::fmt::Write;
    let mut k = String::new();
    for c in open {
        let Ok(requests) = &c.requests else {
            let _ = write!(k, "E{:?};", c.requests);
            continue;
        };
        k.push('C');
        for r in requests {
            k.push('R');
            for a in &r.alternatives {
                let _ = write!(
                    k,
                    "A{:?}{:?}{:?}{}{:?}{:?};",
                    a.class, a.selectors, a.count, a.admin, a.tolerations, a.capacity
                );
            }
        }
        let position = |name: &str| -> String {
            for (j, r) in requests.iter().enumerate() {
                if r.name == name {
                    return format!("#{j}");
                }
                if let Some(i) = r.alternatives.iter().position(|a| a.name == name) {
                    return format!("#{j}/{i}");
                }
            }
            format!("{name:?}")
        };
        for x in &c.constraints {
            let named: Vec<String> = x.requests.iter().map(|n| position(n)).collect();
            let _ = write!(
                k,
                "K{named:?}{:?}{:?};",
                x.match_attribute, x.distinct_attribute
            );
        }
    }
    k
}

/// The names messages give the claims and their requests, with the slots
/// a memoized message holds instead (`ResourceClaim #i#`, `request
/// #i.j.k#:`), longest names first.
fn names_and_slots(open: &[&Claim]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (i, c) in open.iter().enumerate() {
        out.push((
            format!("ResourceClaim {}", c.key()),
            format!("ResourceClaim #{i}#"),
        ));
        for (j, r) in c.requests.iter().flatten().enumerate() {
            for (k, a) in r.alternatives.iter().enumerate() {
                out.push((
                    format!("request {}:", a.name),
                    format!("request #{i}.{j}.{k}#:"),
                ));
            }
        }
    }
    out.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
    out
}

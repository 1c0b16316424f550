//! The ledger corrected from what the kubelet reports (PodResources):
//! holders, swapped replicas and MIG devices, restarts.

use super::*;

impl Ledger {
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
        // what the kubelet counts in use, whoever holds it (pods without a
        // decision included: `held_by_others`, `undecided_caller`)
        self.last_held = held.clone();
        // finished pods whose devices the kubelet no longer lists end
        let ended: Vec<String> = self
            .entries
            .iter()
            .filter(|(_, e)| {
                e.pod.terminal && !held.contains_key(&(e.pod.namespace.clone(), e.pod.name.clone()))
            })
            .map(|(u, _)| u.clone())
            .collect();
        for uid in ended {
            if let Some(e) = self.entries.remove(&uid) {
                self.others.insert(uid, e.pod);
            }
        }
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
    pub(super) fn exchange_shares(&mut self, p: &str, q: &str) -> bool {
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

    pub(super) fn correct_mig_swaps(
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

    pub(super) fn correct_replica_swaps(
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
}

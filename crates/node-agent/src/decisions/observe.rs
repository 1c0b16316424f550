//! Pods in and out of the ledger; conflicting decisions refused.

use super::*;

impl Ledger {
    /// Takes in a pod (added or changed). Returns a refusal to report when
    /// the pod's decision is newly refused.
    pub fn observe(&mut self, pod: PodInfo) -> Option<Refusal> {
        if pod.node != self.node {
            self.forget(&pod.uid);
            return None;
        }
        let key = (pod.namespace.clone(), pod.name.clone());
        if pod.terminal
            && self.last_held.contains_key(&key)
            && let Some(e) = self.entries.get_mut(&pod.uid)
            && e.state.as_ref().is_ok_and(Grant::served_any)
            && e.pod.decision == pod.decision
        {
            // `status.phase` is anyone's with pods/status: while the
            // kubelet still shows the pod's devices in use, its decision
            // keeps them (no call is charged to it any more; the next
            // PodResources read without it ends it: `reconcile`)
            e.pod.terminal = true;
            return None;
        }
        if pod.terminal || pod.decision.is_none() {
            // kept as one of the node's other pods: what PodResources shows
            // it holding is published as its, and a pod without a decision
            // is never charged to another's
            if self.entries.remove(&pod.uid).is_some() {
                self.recheck();
            }
            self.others.insert(pod.uid.clone(), pod);
            return None;
        }
        self.others.remove(&pod.uid);
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
        self.others.remove(uid);
        if self.entries.remove(uid).is_some() {
            self.recheck();
        }
    }

    /// Replaces every pod (a fresh LIST). Entries that stay keep what they
    /// were served. Returns new refusals.
    pub fn replace_all(&mut self, pods: Vec<PodInfo>) -> Vec<Refusal> {
        let keep: BTreeSet<String> = pods.iter().map(|p| p.uid.clone()).collect();
        self.entries.retain(|uid, _| keep.contains(uid));
        self.others.retain(|uid, _| keep.contains(uid));
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
    pub(super) fn recheck(&mut self) -> Vec<Refusal> {
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
}

//! A served `Allocate` charged to a decision (whole GPUs or a share).

use super::*;

impl Ledger {
    /// A call that pod `p`, which has no decision, may be making.
    fn undecided_miss(&self, p: &PodInfo, what: &str) -> Miss {
        Miss::NoDecision(format!(
            "pod {} on node {} has no gpusched decision and asks {what} like this call: the kubelet does not say which pod calls, so it is charged to no pod's decision; {}",
            p.key(),
            self.node,
            self.summary()
        ))
    }

    pub(super) fn no_whole(&self, want: &[usize]) -> Miss {
        Miss::NoDecision(format!(
            "no pod placed on node {} by gpusched holds GPUs {}; {}",
            self.node,
            self.show(want),
            self.summary()
        ))
    }

    /// Serves whole GPUs `want` (inventory positions), charging them to a
    /// decision (`docs/protocol.md`, *Allocate*).
    pub fn allocate_whole(&mut self, want: &[usize], healthy: &[bool]) -> Result<Matched, Miss> {
        // GPUs already served (a retry, an init container's GPUs reused)
        // name their decision; the others are new.
        let mut reuse: Option<String> = None;
        let mut new = Vec::new();
        for &g in want {
            let owner = self.entries.iter().find_map(|(uid, e)| match &e.state {
                Ok(Grant::Whole { served, .. }) if served.contains(&g) => Some(uid.clone()),
                _ => None,
            });
            match owner {
                Some(u) if reuse.as_ref().is_some_and(|r| *r != u) => {
                    return Err(Miss::NoDecision(format!(
                        "GPUs {} were handed to different pods; {}",
                        self.show(want),
                        self.summary()
                    )));
                }
                Some(u) => reuse = Some(u),
                None => new.push(g),
            }
        }
        let n = new.len();
        if reuse.is_none()
            && n > 0
            && let Some(p) = self.undecided_caller(n as u32, false)
        {
            return Err(self.undecided_miss(p, &format!("{n} GPU(s)")));
        }
        let target = match &reuse {
            Some(u) => {
                let free = match &self.entries[u].state {
                    Ok(Grant::Whole { gpus, served, .. }) => unserved(gpus, served),
                    _ => Vec::new(),
                };
                if free.len() < n {
                    return Err(self.no_whole(want));
                }
                u.clone()
            }
            None => {
                let cands = self.whole_candidates(n, |_, _| true);
                let owns_all = |e: &Entry| match &e.state {
                    Ok(Grant::Whole { gpus, served, .. }) => {
                        new.iter().all(|g| gpus.contains(g) && !served.contains(g))
                    }
                    _ => false,
                };
                match self.rank(&cands, owns_all) {
                    Some(e) => e.pod.uid.clone(),
                    None => return Err(self.no_whole(want)),
                }
            }
        };
        let tkey = self.entries[&target].pod.key();
        if let Some(&g) = want
            .iter()
            .find(|&&g| !healthy.get(g).copied().unwrap_or(false))
        {
            return Err(Miss::Refused(format!(
                "GPU {} ({}) recorded for pod {tkey} is unhealthy",
                self.gpus[g].index, self.gpus[g].uuid,
            )));
        }
        // New GPUs outside the target's unserved ones are exchanged with
        // unserved GPUs of the target. Each comes from another live
        // decision's unserved GPUs, which takes the target's in return; or
        // it is a GPU no decision names (live, or refused for a conflict
        // and waiting; whole or shared), while no decision of the node is
        // refused, which the target takes in place of one of its own: the
        // kubelet counts that one as in use (a restarted kubelet keeps the
        // devices of pods deleted before it stopped until its pod sources
        // are ready) or ignored the preference. Sizes are kept and live
        // decisions stay disjoint; the GPU given up is free, and a later
        // decision naming the GPU taken gets it (`recheck`).
        let Ok(Grant::Whole { gpus, served, .. }) = &self.entries[&target].state else {
            return Err(self.no_whole(want));
        };
        let tfree = unserved(gpus, served);
        let mut spare = tfree.iter().rev().filter(|g| !new.contains(g));
        let claimed = |g: usize| {
            self.entries.values().any(|e| match &e.state {
                Ok(Grant::Whole { gpus, .. }) => gpus.contains(&g),
                Ok(Grant::Share { gpu, .. }) => *gpu == g,
                // refused for a conflict: it comes back when the holder ends
                Err(m) => m.starts_with(CONFLICT) && e.decided.contains(&g),
            })
        };
        // With a refused decision on the node its pod may be the caller
        // (a forged or copied decision): fail closed, never hand it a GPU.
        let any_refused = self.entries.values().any(|e| e.state.is_err());
        let mut swaps: Vec<(usize, Option<String>, usize)> = Vec::new();
        for &g in new.iter().filter(|g| !tfree.contains(g)) {
            let from = self.entries.iter().find_map(|(uid, e)| match &e.state {
                Ok(Grant::Whole { gpus, served, .. })
                    if *uid != target && gpus.contains(&g) && !served.contains(&g) =>
                {
                    Some(uid.clone())
                }
                _ => None,
            });
            if from.is_none() && (any_refused || claimed(g)) {
                return Err(self.no_whole(want));
            }
            let Some(&h) = spare.next() else {
                return Err(self.no_whole(want));
            };
            swaps.push((g, from, h));
        }
        let mut note = Vec::new();
        for (g, from, h) in swaps {
            match from.and_then(|f| self.entries.get_mut(&f)) {
                Some(e) => {
                    if let Ok(Grant::Whole { gpus, .. }) = &mut e.state {
                        gpus.iter_mut().filter(|x| **x == g).for_each(|x| *x = h);
                        note.push(format!(
                            "GPU {} of pod {}'s decision taken, GPU {} given in exchange",
                            self.gpus[g].index,
                            e.pod.key(),
                            self.gpus[h].index
                        ));
                    }
                }
                None => note.push(format!(
                    "GPU {} (no decision names it) served in place of decided GPU {}, which is left free",
                    self.gpus[g].index, self.gpus[h].index
                )),
            }
            if let Some(e) = self.entries.get_mut(&target)
                && let Ok(Grant::Whole { gpus, .. }) = &mut e.state
            {
                gpus.iter_mut().filter(|x| **x == h).for_each(|x| *x = g);
            }
        }
        if let Some(e) = self.entries.get_mut(&target)
            && let Ok(Grant::Whole { served, slots, .. }) = &mut e.state
        {
            served.extend(new.iter().copied());
            if n > 0 {
                take_slot(slots, n as u32);
            }
        }
        if n > 0 {
            self.last = Some(target);
        }
        Ok(Matched {
            decision: tkey,
            note: (!note.is_empty()).then(|| note.join("; ")),
        })
    }

    /// Serves `n` milli of a share; `hint` is the GPU the kubelet's tokens
    /// came from when they all came from one.
    pub fn allocate_share(
        &mut self,
        n: u32,
        resource: Option<&str>,
        hint: Option<usize>,
        healthy: &[bool],
    ) -> Result<ShareGrant, Miss> {
        if resource.is_none()
            && let Some(p) = self.undecided_caller(n, true)
        {
            return Err(self.undecided_miss(p, &format!("{n} milli-GPU")));
        }
        let cands = self.share_candidates(n, resource);
        let same_gpu =
            |e: &Entry| matches!(&e.state, Ok(Grant::Share { gpu, .. }) if Some(*gpu) == hint);
        let Some(uid) = self.rank(&cands, same_gpu).map(|e| e.pod.uid.clone()) else {
            return Err(Miss::NoDecision(format!(
                "no pod placed on node {} by gpusched has a pending {} of {n} milli; {}",
                self.node,
                resource.map_or("GPU share".to_string(), |r| format!(
                    "share of {r} replicas"
                )),
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
            slots,
            mig,
            ..
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
        // the kubelet still counts the GPU in use by a pod holding it whole
        // (whatever that pod's status says): no share of it is handed out
        let g = *gpu;
        if let Some(((ns, name), _)) = self.last_held.iter().find(|((ns, name), h)| {
            h.whole.contains(&g)
                && (ns.as_str(), name.as_str()) != (e.pod.namespace.as_str(), e.pod.name.as_str())
        }) {
            return Err(Miss::Refused(format!(
                "GPU {} ({}) recorded for pod {key} is still held whole by pod {ns}/{name} (PodResources)",
                self.gpus[g].index, self.gpus[g].uuid
            )));
        }
        *served_milli += n;
        take_slot(slots, n);
        let out = ShareGrant {
            pod: key,
            gpu: *gpu,
            milli: *milli,
            memory_mib: *memory_mib,
            mig: mig.clone(),
        };
        self.last = Some(uid);
        Ok(out)
    }
}

//! Which decision a call would be charged to: candidates, ranking,
//! and the preferred devices they imply.

use super::*;

impl Ledger {
    pub(super) fn live_order(&self) -> Vec<&Entry> {
        let mut v: Vec<&Entry> = self
            .entries
            .values()
            .filter(|e| e.state.is_ok() && !e.pod.terminal)
            .collect();
        v.sort_by(|a, b| (&a.pod.created, a.seq).cmp(&(&b.pod.created, b.seq)));
        v
    }

    /// The candidate a call is charged to: the first that `better` likes,
    /// else the decision the previous call was charged to while it is
    /// partly served (the kubelet allocates a pod's containers one after
    /// the other), else the first in admission order.
    pub(super) fn rank<'a>(
        &self,
        cands: &[&'a Entry],
        better: impl Fn(&Entry) -> bool,
    ) -> Option<&'a Entry> {
        let cont = |e: &Entry| {
            self.last.as_deref() == Some(e.pod.uid.as_str())
                && e.state
                    .as_ref()
                    .is_ok_and(|g| g.served_any() && !g.fully_served())
        };
        cands
            .iter()
            .find(|e| better(e))
            .or_else(|| cands.iter().find(|e| cont(e)))
            .or(cands.first())
            .copied()
    }

    /// Live whole-GPU decisions a call adding `n` GPUs may be charged to:
    /// first those expecting a call of exactly `n` (a container of that
    /// size), and only when there is none, those with `n` GPUs unserved
    /// (a pod whose layout is not known). Admission order within each.
    pub(super) fn whole_candidates(
        &self,
        n: usize,
        ok: impl Fn(&Entry, &[usize]) -> bool,
    ) -> Vec<&Entry> {
        for exact in [true, false] {
            let v: Vec<&Entry> = self
                .live_order()
                .into_iter()
                .filter(|e| match &e.state {
                    Ok(Grant::Whole {
                        gpus,
                        served,
                        slots,
                    }) => {
                        let free = unserved(gpus, served);
                        let fits = if exact {
                            slots.iter().any(|&s| s as usize == n)
                        } else {
                            free.len() >= n
                        };
                        fits && ok(e, &free)
                    }
                    _ => false,
                })
                .collect();
            if !v.is_empty() {
                return v;
            }
        }
        Vec::new()
    }

    /// Whether a live decision expects a call of exactly `n` whole GPUs
    /// (a container of that size). When none does, the call would be
    /// charged to a decision with that much left whose layout says
    /// otherwise: likely our pod watch has not seen the caller's pod yet.
    pub fn expects_whole(&self, n: usize) -> bool {
        self.entries.values().any(|e| {
            e.state.as_ref().is_ok_and(|g| {
                matches!(g, Grant::Whole { slots, .. } if slots.iter().any(|&s| s as usize == n))
            })
        })
    }

    /// Whether a live share decision of `resource` (`None`:
    /// `gpusched.io/gpu-milli`; else a time-sliced resource) expects a call
    /// of exactly `n` milli.
    pub fn expects_share(&self, n: u32, resource: Option<&str>) -> bool {
        self.entries.values().any(|e| {
            e.state.as_ref().is_ok_and(|g| {
                matches!(g, Grant::Share { slots, resource: r, .. }
                    if slots.contains(&n) && r.as_deref() == resource)
            })
        })
    }

    /// How many of `want` no decision was served yet (what a call adds).
    pub fn new_gpus(&self, want: &[usize]) -> usize {
        want.iter()
            .filter(|g| {
                !self.entries.values().any(
                    |e| matches!(&e.state, Ok(Grant::Whole { served, .. }) if served.contains(g)),
                )
            })
            .count()
    }

    /// Whole GPUs to prefer for a container asking `size` (`docs/protocol.md`):
    /// with `must` (an init container's GPUs reused), more of the same
    /// decision; else the unserved GPUs of a decision expecting a call of
    /// exactly this size.
    pub fn preferred_whole(
        &self,
        available: &[usize],
        must: &[usize],
        size: usize,
    ) -> Option<Vec<usize>> {
        if !must.is_empty() {
            let reused = self.entries.values().find_map(|e| match &e.state {
                Ok(Grant::Whole { gpus, served, .. })
                    if must.iter().all(|m| served.contains(m)) =>
                {
                    Some(unserved(gpus, served))
                }
                _ => None,
            });
            if let Some(free) = reused {
                let mut out = must.to_vec();
                out.extend(
                    free.into_iter()
                        .filter(|g| available.contains(g))
                        .take(size.saturating_sub(must.len())),
                );
                return (out.len() == size).then_some(out);
            }
        }
        let pick = |free: &[usize]| -> Option<Vec<usize>> {
            if !must.iter().all(|m| free.contains(m)) {
                return None;
            }
            let mut out = must.to_vec();
            out.extend(
                free.iter()
                    .copied()
                    .filter(|g| available.contains(g) && !must.contains(g))
                    .take(size.saturating_sub(must.len())),
            );
            (out.len() == size).then_some(out)
        };
        let cands = self.whole_candidates(size, |_, free| pick(free).is_some());
        let e = self.rank(&cands, |_| false)?;
        match &e.state {
            Ok(Grant::Whole { gpus, served, .. }) => pick(&unserved(gpus, served)),
            _ => None,
        }
    }

    /// The MIG instances (device ids) of the MIG decision a call of
    /// `size` milli of `resource` would be charged to.
    pub fn preferred_mig(&self, size: u32, resource: &str) -> Option<Vec<String>> {
        let cands = self.share_candidates(size, Some(resource));
        match &self.rank(&cands, |_| false)?.state {
            Ok(Grant::Share { mig, .. }) if !mig.is_empty() => Some(mig.clone()),
            _ => None,
        }
    }

    /// The GPU to take share tokens from: that of the pending share
    /// decision expecting a call of exactly `size` milli (else one with
    /// that much unserved).
    pub fn preferred_share(&self, size: u32, resource: Option<&str>) -> Option<usize> {
        let cands = self.share_candidates(size, resource);
        match &self.rank(&cands, |_| false)?.state {
            Ok(Grant::Share { gpu, .. }) => Some(*gpu),
            _ => None,
        }
    }

    pub(super) fn share_candidates(&self, n: u32, resource: Option<&str>) -> Vec<&Entry> {
        for exact in [true, false] {
            let v: Vec<&Entry> = self
                .live_order()
                .into_iter()
                .filter(|e| match &e.state {
                    Ok(Grant::Share {
                        milli,
                        served_milli,
                        slots,
                        resource: r,
                        mig,
                        ..
                    }) if r.as_deref() == resource => {
                        if exact {
                            slots.contains(&n)
                        } else {
                            // a MIG decision is answered with all its
                            // instances: only a call of its size
                            mig.is_empty() && milli.saturating_sub(*served_milli) >= n
                        }
                    }
                    _ => false,
                })
                .collect();
            if !v.is_empty() {
                return v;
            }
        }
        Vec::new()
    }
}

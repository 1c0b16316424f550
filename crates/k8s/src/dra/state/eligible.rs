//! Claim constraints for the core: which GPUs of each node a pending
//! pod's unallocated claims may take, and which must go together
//! ([`gpusched_model::dra::ClaimGpus`]), so the core never places a pod
//! on GPUs its claims cannot get.
//!
//! Per node the claims can be allocated on, each GPU device (in the core's
//! order) is tested against every *GPU request*: an `exactly` request
//! (one alternative, no admin access) whose class and selectors (and
//! capacity asks) match at least one GPU device of that node. A GPU is
//! allowed when every GPU request could take it (the intersection: exact
//! for one claim, or for claims that all ask alike; conservative for
//! claims asking different GPUs, which then may wait with a reason naming
//! the claim). Its group is the tuple of its values of the
//! `matchAttribute` attributes of the constraints covering a GPU request
//! (a GPU without one of them is not allowed): one group for the whole
//! pod, exact for one claim's constraint, conservative across claims. The
//! `distinctAttribute` attributes of such constraints are read the same
//! way: no two GPUs of the pod share their values (a GPU without one is
//! not allowed), pod-wide (conservative across claims).
//! `firstAvailable` requests do not restrict the core (which alternative
//! wins is the allocator's answer per node); the bind-time re-check
//! covers them.

use super::super::alloc::could_take;
use super::super::{AttrValue, Claim, PodClaim, SubRequest};
use super::DraState;
use gpusched_model::dra::ClaimGpus;
use std::collections::{BTreeMap, BTreeSet};

/// What one build keeps of [`DraState::claim_gpus`]: the answer by ask
/// (requests and constraints; and the candidate nodes when an allocated
/// claim pins them), with the position of the claim its reasons name.
pub type ClaimGpusMemo = BTreeMap<String, Option<(usize, ClaimGpus)>>;

impl DraState {
    /// The claim constraints on GPUs of a pending pod whose unallocated
    /// claims can be allocated on `nodes` (see the module doc); `None`
    /// when they tell no GPU apart (every GPU of every such node allowed,
    /// no `matchAttribute`) or the pod has no unallocated claim.
    pub fn claim_gpus(
        &self,
        ns: &str,
        claims: &[PodClaim],
        nodes: &[String],
        memo: &mut ClaimGpusMemo,
    ) -> Option<ClaimGpus> {
        let keys = self.pod_claim_keys(ns, claims).ok()?;
        let open: Vec<&Claim> = keys
            .iter()
            .filter(|k| self.allocation_of(k).is_none())
            .filter_map(|k| self.claims.get(k))
            .collect();
        if open.is_empty() {
            return None;
        }
        // the nodes follow from the ask unless an allocated claim pins them
        let pinned = open.len() != keys.len();
        let mut memo_key = super::pods::ask_key(&open);
        if pinned {
            memo_key.push_str(&format!("{nodes:?}"));
        }
        let answer = match memo.get(&memo_key) {
            Some(a) => a.clone(),
            None => {
                let a = self.compute_claim_gpus(&open, nodes);
                memo.insert(memo_key, a.clone());
                a
            }
        };
        let (i, mut c) = answer?;
        c.claim = open[i].key();
        Some(c)
    }

    fn compute_claim_gpus(&self, open: &[&Claim], nodes: &[String]) -> Option<(usize, ClaimGpus)> {
        // the exactly-requests: (claim position, subrequest)
        let mut subs: Vec<(usize, &SubRequest)> = Vec::new();
        for (ci, c) in open.iter().enumerate() {
            for r in c.requests.as_ref().ok()? {
                if let [a] = r.alternatives.as_slice()
                    && !a.admin
                {
                    subs.push((ci, a));
                }
            }
        }
        let mut sel = self.selectors.lock().unwrap_or_else(|e| e.into_inner());
        // per node: the GPU devices and, per subrequest, which it could take
        let mut per_node = Vec::with_capacity(nodes.len());
        let mut gpu_sub = vec![false; subs.len()];
        let mut excludes = vec![false; subs.len()];
        for n in nodes {
            let gpus = self.gpu_devices_on(n);
            let masks: Vec<Vec<bool>> = subs
                .iter()
                .map(|(_, a)| {
                    gpus.iter()
                        .map(|d| could_take(a, d, &self.classes, &mut sel))
                        .collect()
                })
                .collect();
            for (s, m) in masks.iter().enumerate() {
                if m.iter().any(|&t| t) {
                    gpu_sub[s] = true;
                    excludes[s] |= m.iter().any(|&t| !t);
                }
            }
            per_node.push((n, gpus, masks));
        }
        // the attributes of the constraints covering a GPU request
        let mut attributes: BTreeSet<&str> = BTreeSet::new();
        let mut distinct: BTreeSet<&str> = BTreeSet::new();
        let mut constrained = vec![false; subs.len()];
        for (s, (ci, a)) in subs.iter().enumerate() {
            if !gpu_sub[s] {
                continue;
            }
            for con in &open[*ci].constraints {
                if !con.covers(&a.name) {
                    continue;
                }
                if let Some(at) = &con.match_attribute {
                    attributes.insert(at);
                    constrained[s] = true;
                }
                if let Some(at) = &con.distinct_attribute {
                    distinct.insert(at);
                    constrained[s] = true;
                }
            }
        }
        if attributes.is_empty() && distinct.is_empty() && !excludes.iter().any(|&e| e) {
            return None;
        }
        let attributes: Vec<String> = attributes.into_iter().map(str::to_string).collect();
        let distinct: Vec<String> = distinct.into_iter().map(str::to_string).collect();
        let mut distinct_values = BTreeMap::new();
        let mut out = BTreeMap::new();
        for (n, gpus, masks) in per_node {
            let values: Vec<Option<Vec<&AttrValue>>> = gpus
                .iter()
                .enumerate()
                .map(|(g, d)| {
                    let allowed = masks
                        .iter()
                        .enumerate()
                        .filter(|(s, m)| gpu_sub[*s] && m.iter().any(|&t| t))
                        .all(|(_, m)| m[g]);
                    // a GPU without a distinct attribute cannot be taken
                    if !allowed || distinct.iter().any(|a| !d.attributes.contains_key(a)) {
                        return None;
                    }
                    attributes.iter().map(|a| d.attributes.get(a)).collect()
                })
                .collect();
            if !distinct.is_empty() {
                let dv: Vec<Option<Vec<&AttrValue>>> = gpus
                    .iter()
                    .zip(&values)
                    .map(|(d, v)| {
                        v.as_ref()?;
                        distinct.iter().map(|a| d.attributes.get(a)).collect()
                    })
                    .collect();
                distinct_values.insert(n.clone(), intern(&dv));
            }
            out.insert(n.clone(), intern(&values));
        }
        // the claim reasons name: the first whose GPU request is
        // constrained or tells GPUs apart
        let named = (0..subs.len())
            .find(|&s| gpu_sub[s] && (constrained[s] || excludes[s]))
            .map_or(0, |s| subs[s].0);
        Some((
            named,
            ClaimGpus {
                claim: String::new(),
                attributes,
                nodes: out,
                distinct,
                values: distinct_values,
            },
        ))
    }
}

/// Per GPU, the id of its values (ids in value order), `None` kept.
fn intern(values: &[Option<Vec<&AttrValue>>]) -> Vec<Option<u32>> {
    let ids: BTreeSet<&Vec<&AttrValue>> = values.iter().flatten().collect();
    let ids: BTreeMap<&Vec<&AttrValue>, u32> = ids
        .into_iter()
        .enumerate()
        .map(|(i, v)| (v, i as u32))
        .collect();
    values
        .iter()
        .map(|v| v.as_ref().and_then(|v| ids.get(v).copied()))
        .collect()
}

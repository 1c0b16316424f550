//! The allocator: the devices of one node for the unallocated claims of one
//! pod. Pure and deterministic: candidates in device order, requests in
//! claim and request order, alternatives (`firstAvailable`) in the order
//! given, a depth-first search that backtracks when a constraint fails and
//! gives up after [`MAX_STEPS`] on one node, or when the claims' budget
//! for the cycle ([`MAX_CLAIM_STEPS`], over all nodes) is spent (#38: a
//! claim of 9 requests of one device on 8-GPU nodes cost 10⁵ steps per
//! node, 10⁸ on 1,000 nodes). Before the search, two cheap checks answer
//! without it: a request without enough candidates, and claims asking more
//! devices than all their requests' candidates together (pigeonholes).
//!
//! Shared counters (partitionable devices): a device that consumes
//! counters may be given only while the counters left in its pool's set
//! (the set's values less what the devices held and picked consume, each
//! device once) cover its consumption, and while its compatibility groups
//! meet those of the other devices held from that set.
//!
//! Consumable capacity: a device with `allowMultipleAllocations` is never
//! "in use"; each (sub)request on it consumes, per capacity, the amount it
//! asks (rounded up by the capacity's request policy; the policy's default,
//! or the whole capacity, when it does not ask), and the sum over all
//! allocations stays within the capacity. Such a result carries the
//! consumed amounts and a share id.

use super::cel::Selectors;
use super::translate::qualify;
use super::{
    AllocatedDevice, Allocation, Claim, Class, Count, CounterSetId, Counters, Device, DeviceId,
    RequestPolicy, SubRequest,
};
use std::collections::{BTreeMap, BTreeSet};

/// Most device choices tried for one pod on one node.
pub const MAX_STEPS: u32 = 100_000;

/// Most device choices tried for one pod's claims in one cycle, over all
/// the nodes tried ([`allocate_within`]'s budget).
pub const MAX_CLAIM_STEPS: u32 = 300_000;

/// The start of the message of a search that spent its budget (the claims'
/// for the cycle, or [`MAX_STEPS`] on the node).
pub const GAVE_UP: &str = "gave up after";

/// What the allocator needs besides the claims.
pub struct Inputs<'a> {
    /// The node.
    pub node: &'a str,
    /// The devices usable on it, sorted by id.
    pub devices: &'a [&'a Device],
    /// Devices held by allocated claims and by this cycle's tentative
    /// allocations (admin-access allocations excluded).
    pub in_use: &'a BTreeSet<DeviceId>,
    /// DeviceClasses by name.
    pub classes: &'a BTreeMap<String, Class>,
    /// The counter sets of the pools (their full values).
    pub counter_sets: &'a BTreeMap<CounterSetId, Counters>,
    /// What allocations (held and tentative) consume of the devices that
    /// allow multiple allocations, by qualified capacity name.
    pub shared: &'a BTreeMap<DeviceId, Counters>,
}

/// What one (sub)request would consume of a device's capacities, by
/// qualified name; `Err` when the device cannot serve it (a capacity it
/// asks that the device lacks, or an amount the policy refuses or the
/// capacity cannot hold).
fn consumption(a: &SubRequest, d: &Device) -> Result<Counters, String> {
    for k in a.capacity.keys() {
        if !d.capacity.contains_key(&qualify(&d.id.driver, k)) {
            return Err(format!("device {} has no capacity {k}", d.id));
        }
    }
    let asked: BTreeMap<String, i128> = a
        .capacity
        .iter()
        .map(|(k, v)| (qualify(&d.id.driver, k), *v))
        .collect();
    let mut out = Counters::new();
    for (k, cap) in &d.capacity {
        let policy = d.capacity_info.get(k).and_then(|i| i.policy.as_ref());
        let v = RequestPolicy::consumed(policy, asked.get(k).copied(), *cap).ok_or_else(|| {
            format!(
                "request {}: device {} capacity {k}: the request policy does not allow {}",
                a.name,
                d.id,
                asked.get(k).copied().unwrap_or_default()
            )
        })?;
        if v > *cap {
            return Err(format!(
                "request {}: device {} capacity {k}: {v} asked of {cap} (milli-units)",
                a.name, d.id
            ));
        }
        out.insert(k.clone(), v);
    }
    Ok(out)
}

/// Whether (sub)request `a` could take device `d` when it is free: its
/// class's and its own selectors match and the device can serve the
/// capacity it asks (what [`allocate`] checks before taints and holders).
/// A missing class or a selector error is "no".
pub fn could_take(
    a: &SubRequest,
    d: &Device,
    classes: &BTreeMap<String, Class>,
    sel: &mut Selectors,
) -> bool {
    let Some(class) = classes.get(&a.class) else {
        return false;
    };
    if (d.multiple || !a.capacity.is_empty()) && consumption(a, d).is_err() {
        return false;
    }
    class
        .selectors
        .iter()
        .chain(&a.selectors)
        .all(|e| sel.matches(e, d) == Ok(true))
}

/// Counters left per set and the compatibility groups of what holds them.
#[derive(Clone, Debug, Default)]
struct CounterState {
    left: BTreeMap<CounterSetId, Counters>,
    /// Per set with devices held: `None` when they declare no groups,
    /// else the groups all of them share.
    groups: BTreeMap<CounterSetId, Option<BTreeSet<String>>>,
}

impl CounterState {
    fn new(inp: &Inputs) -> Self {
        let mut st = CounterState::default();
        for d in inp.devices {
            for u in &d.consumes {
                let id = Self::set(d, &u.set);
                if !st.left.contains_key(&id)
                    && let Some(c) = inp.counter_sets.get(&id)
                {
                    st.left.insert(id, c.clone());
                }
            }
        }
        for d in inp.devices {
            let held =
                inp.in_use.contains(&d.id) || inp.shared.get(&d.id).is_some_and(|c| !c.is_empty());
            if held && !d.consumes.is_empty() {
                // held devices count whether or not they still fit
                st.take(d);
            }
        }
        st
    }

    fn set(d: &Device, set: &str) -> CounterSetId {
        CounterSetId {
            driver: d.id.driver.clone(),
            pool: d.id.pool.clone(),
            name: set.to_string(),
        }
    }

    /// Why `d` cannot take its counters now, if it cannot.
    fn refuses(&self, d: &Device) -> Option<String> {
        for u in &d.consumes {
            let id = Self::set(d, &u.set);
            let Some(left) = self.left.get(&id) else {
                return Some(format!(
                    "device {}: counter set {id} is not published",
                    d.id
                ));
            };
            for (k, v) in &u.counters {
                let have = left.get(k).copied();
                if have.is_none_or(|h| h < *v) {
                    return Some(format!(
                        "device {}: counter {k} of set {id}: {} left, {v} needed (milli-units)",
                        d.id,
                        have.map_or("none".to_string(), |h| h.to_string())
                    ));
                }
            }
            match self.groups.get(&id) {
                None => {}
                Some(None) if u.groups.is_empty() => {}
                Some(Some(g)) if u.groups.iter().any(|x| g.contains(x)) => {}
                Some(_) => {
                    return Some(format!(
                        "device {}: its compatibility groups on counter set {id} differ from those of the devices in use",
                        d.id
                    ));
                }
            }
        }
        None
    }

    /// Takes `d`'s counters; returns what to give back to undo it.
    fn take(&mut self, d: &Device) -> Vec<(CounterSetId, Option<Option<BTreeSet<String>>>)> {
        let mut undo = Vec::new();
        for u in &d.consumes {
            let id = Self::set(d, &u.set);
            if let Some(left) = self.left.get_mut(&id) {
                for (k, v) in &u.counters {
                    if let Some(h) = left.get_mut(k) {
                        *h -= v;
                    }
                }
            }
            let mine: BTreeSet<String> = u.groups.iter().cloned().collect();
            let prev = self.groups.get(&id).cloned();
            let next = match &prev {
                None => (!mine.is_empty()).then_some(mine),
                Some(None) => None,
                Some(Some(g)) => Some(g.intersection(&mine).cloned().collect()),
            };
            self.groups.insert(id.clone(), next);
            undo.push((id, prev));
        }
        undo
    }

    fn give_back(
        &mut self,
        d: &Device,
        undo: Vec<(CounterSetId, Option<Option<BTreeSet<String>>>)>,
    ) {
        for u in &d.consumes {
            let id = Self::set(d, &u.set);
            if let Some(left) = self.left.get_mut(&id) {
                for (k, v) in &u.counters {
                    if let Some(h) = left.get_mut(k) {
                        *h += v;
                    }
                }
            }
        }
        for (id, prev) in undo.into_iter().rev() {
            match prev {
                None => self.groups.remove(&id),
                Some(g) => self.groups.insert(id, g),
            };
        }
    }
}

/// One (claim, request) to satisfy, with the candidates of each
/// alternative.
struct Slot<'a> {
    claim: usize,
    alternatives: Vec<(&'a SubRequest, Result<Vec<usize>, String>)>,
}

/// A device picked for a (sub)request.
#[derive(Clone, Debug)]
struct Pick {
    request: String,
    device: usize,
    admin: bool,
    /// On a device allowing multiple allocations: what it consumes.
    consumed: Option<Counters>,
}

struct Search<'a> {
    claims: &'a [&'a Claim],
    devices: &'a [&'a Device],
    slots: Vec<Slot<'a>>,
    /// Per claim: the devices picked so far.
    picked: Vec<Vec<Pick>>,
    used: BTreeSet<usize>,
    /// Devices whose counters are taken (held or picked), with how many
    /// picks hold them (devices allowing multiple allocations).
    counted: BTreeMap<usize, u32>,
    counters: CounterState,
    /// Capacity consumed of the devices allowing multiple allocations.
    shared: BTreeMap<usize, Counters>,
    steps: u32,
    /// Most steps of this search: [`MAX_STEPS`], or what is left of the
    /// claims' budget.
    limit: u32,
}

/// Allocates `claims` (none allocated yet) on `inp.node`: one allocation
/// per claim, in order, or why not; with a budget of [`MAX_CLAIM_STEPS`].
pub fn allocate(
    claims: &[&Claim],
    inp: &Inputs,
    sel: &mut Selectors,
) -> Result<Vec<Allocation>, String> {
    allocate_within(claims, inp, sel, &mut MAX_CLAIM_STEPS.clone())
}

/// [`allocate`] spending at most `budget` device choices (and at most
/// [`MAX_STEPS`]); what it spends is taken off `budget`.
pub fn allocate_within(
    claims: &[&Claim],
    inp: &Inputs,
    sel: &mut Selectors,
    budget: &mut u32,
) -> Result<Vec<Allocation>, String> {
    let mut slots = Vec::new();
    for (ci, c) in claims.iter().enumerate() {
        let requests = c.requests.as_ref().map_err(Clone::clone)?;
        for r in requests {
            let alternatives = r
                .alternatives
                .iter()
                .map(|a| (a, candidates(a, inp, sel)))
                .collect();
            slots.push(Slot {
                claim: ci,
                alternatives,
            });
        }
    }
    if let Some(why) = short(claims, &slots, inp) {
        return Err(why);
    }
    let mut counted = BTreeMap::new();
    let mut shared = BTreeMap::new();
    for (i, d) in inp.devices.iter().enumerate() {
        if inp.in_use.contains(&d.id) && !d.multiple {
            counted.insert(i, 1);
        }
        if d.multiple {
            let c = inp.shared.get(&d.id).cloned().unwrap_or_default();
            if !c.is_empty() {
                counted.insert(i, 1);
            }
            shared.insert(i, c);
        }
    }
    let mut s = Search {
        claims,
        devices: inp.devices,
        slots,
        picked: vec![Vec::new(); claims.len()],
        used: BTreeSet::new(),
        counted,
        counters: CounterState::new(inp),
        shared,
        steps: 0,
        limit: MAX_STEPS.min(*budget),
    };
    let solved = s.solve(0);
    *budget -= s.steps.min(*budget);
    if solved {
        // a claim that took a device of one node, or of the nodes a
        // selector picks, is for this node; one that took only devices of
        // every node is for none (#38: pinned by what it took, not by
        // what else the node offers)
        return Ok(s
            .picked
            .iter()
            .enumerate()
            .map(|(ci, p)| Allocation {
                node: p
                    .iter()
                    .map(|pk| inp.devices[pk.device])
                    .any(|d| d.node.is_some() || d.selector.is_some())
                    .then(|| inp.node.to_string()),
                devices: p
                    .iter()
                    .enumerate()
                    .map(|(k, pk)| {
                        let d = inp.devices[pk.device];
                        let consumed: BTreeMap<String, i128> = pk
                            .consumed
                            .iter()
                            .flatten()
                            .map(|(q, v)| {
                                let name = d
                                    .capacity_info
                                    .get(q)
                                    .map_or_else(|| q.clone(), |i| i.name.clone());
                                (name, *v)
                            })
                            .collect();
                        let share = pk
                            .consumed
                            .is_some()
                            .then(|| share_id(&claims[ci].uid, &pk.request, &d.id, k));
                        AllocatedDevice {
                            request: pk.request.clone(),
                            id: d.id.clone(),
                            admin: pk.admin,
                            consumed,
                            share,
                            binding: d.binding.clone(),
                        }
                    })
                    .collect(),
            })
            .collect());
    }
    if s.steps >= s.limit {
        let whose = if s.limit < MAX_STEPS {
            format!("the claims' bound of {MAX_CLAIM_STEPS} per scheduling cycle spent")
        } else {
            format!("the bound of {MAX_STEPS} per node")
        };
        return Err(format!(
            "node {}: {GAVE_UP} {} device choices ({whose}; the claims' requests and constraints allow too many combinations)",
            inp.node, s.steps
        ));
    }
    Err(format!(
        "node {}: no set of free devices meets the claims' constraints ({})",
        inp.node,
        claims
            .iter()
            .map(|c| format!("ResourceClaim {}", c.key()))
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Why the claims cannot be allocated on the node, when that shows
/// without a search: a request without enough candidates (the first), or
/// requests that together ask more devices than all their candidates
/// (each device serving one of them: no admin access, no device allowing
/// multiple allocations).
fn short(claims: &[&Claim], slots: &[Slot], inp: &Inputs) -> Option<String> {
    for slot in slots {
        let c = claims[slot.claim];
        let mut reasons = Vec::new();
        let mut enough = false;
        for (a, cands) in &slot.alternatives {
            match cands {
                Err(e) => reasons.push(e.clone()),
                Ok(v) => match a.count {
                    Count::Exact(n) if (v.len() as u32) < n => reasons.push(format!(
                        "request {}: {} of {n} device(s) available",
                        a.name,
                        v.len()
                    )),
                    _ => enough = true,
                },
            }
        }
        if !enough {
            return Some(format!(
                "node {}: ResourceClaim {}: {}",
                inp.node,
                c.key(),
                reasons.join("; ")
            ));
        }
    }
    // pigeonholes: each exclusive slot needs its smallest alternative's
    // count of distinct devices, from the union of its candidates
    let mut need = 0usize;
    let mut union: BTreeSet<usize> = BTreeSet::new();
    for slot in slots {
        let exclusive = slot.alternatives.iter().all(|(a, cands)| {
            !a.admin
                && cands
                    .as_ref()
                    .map_or(true, |v| v.iter().all(|&i| !inp.devices[i].multiple))
        });
        if !exclusive {
            continue;
        }
        let least = slot
            .alternatives
            .iter()
            .filter_map(|(a, cands)| {
                let v = cands.as_ref().ok()?;
                Some(match a.count {
                    Count::Exact(n) => n as usize,
                    Count::All => v.len(),
                })
            })
            .min()
            .unwrap_or(0);
        need += least;
        for (_, cands) in &slot.alternatives {
            union.extend(cands.iter().flatten());
        }
    }
    (need > union.len()).then(|| {
        format!(
            "node {}: the claims ask {need} devices, and only {} free ones match their requests ({})",
            inp.node,
            union.len(),
            claims
                .iter()
                .map(|c| format!("ResourceClaim {}", c.key()))
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

/// A share id for an allocation on a device that allows multiple
/// allocations: UUID-shaped, derived from the claim's uid, the request,
/// the device and the result's place (the same allocation gets the same
/// id; different claims different ones).
fn share_id(claim_uid: &str, request: &str, d: &DeviceId, k: usize) -> String {
    // FNV-1a, 128 bits: deterministic across builds and platforms
    let mut h: u128 = 0x6c62272e07bb014262b821756295c58d;
    for b in format!("{claim_uid}\0{request}\0{d}\0{k}").bytes() {
        h ^= u128::from(b);
        h = h.wrapping_mul(0x0000000001000000000000000000013B);
    }
    // version 8 (custom), RFC 4122 variant
    h = (h & !(0xf << 76)) | (0x8 << 76);
    h = (h & !(0x3 << 62)) | (0x2 << 62);
    let x = format!("{h:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &x[0..8],
        &x[8..12],
        &x[12..16],
        &x[16..20],
        &x[20..32]
    )
}

/// The devices a (sub)request may take on the node, by index into
/// `inp.devices`; an error when it can take none, saying why.
fn candidates(a: &SubRequest, inp: &Inputs, sel: &mut Selectors) -> Result<Vec<usize>, String> {
    let class = inp.classes.get(&a.class).ok_or_else(|| {
        format!(
            "request {}: DeviceClass {:?} does not exist",
            a.name, a.class
        )
    })?;
    let mut out = Vec::new();
    let (mut selected, mut tainted, mut busy, mut short) = (0, 0, 0, 0);
    let mut error = None;
    let mut short_why = None;
    let counters = CounterState::new(inp);
    for (i, d) in inp.devices.iter().enumerate() {
        // capacity asked: a device without it, or too small, does not match
        let consumed = if a.capacity.is_empty() && !d.multiple {
            // the whole device, which it has: nothing to check
            Counters::new()
        } else {
            match consumption(a, d) {
                Ok(c) => c,
                Err(e) => {
                    if !a.capacity.is_empty() {
                        error.get_or_insert(e);
                    }
                    continue;
                }
            }
        };
        let mut ok = true;
        for e in class.selectors.iter().chain(&a.selectors) {
            match sel.matches(e, d) {
                Ok(true) => {}
                Ok(false) => {
                    ok = false;
                    break;
                }
                Err(msg) => {
                    error.get_or_insert(msg);
                    ok = false;
                    break;
                }
            }
        }
        if !ok {
            continue;
        }
        selected += 1;
        if d.untolerated(&a.tolerations).is_some() {
            tainted += 1;
            continue;
        }
        if !a.admin {
            if d.multiple {
                let used = inp.shared.get(&d.id);
                let full = consumed.iter().any(|(k, v)| {
                    used.and_then(|u| u.get(k)).copied().unwrap_or(0) + v
                        > d.capacity.get(k).copied().unwrap_or(0)
                });
                if full {
                    busy += 1;
                    continue;
                }
            } else if inp.in_use.contains(&d.id) {
                busy += 1;
                continue;
            }
            let held =
                inp.in_use.contains(&d.id) || inp.shared.get(&d.id).is_some_and(|c| !c.is_empty());
            if !held && let Some(why) = counters.refuses(d) {
                short += 1;
                short_why.get_or_insert(why);
                continue;
            }
        }
        out.push(i);
    }
    if a.count == Count::All && (tainted > 0 || busy > 0 || short > 0) {
        return Err(format!(
            "request {}: allocationMode All, but {} of the {selected} matching device(s) are in use and {tainted} tainted",
            a.name,
            busy + short
        ));
    }
    if out.is_empty() {
        let mut why = format!(
            "request {}: no device available ({selected} match the class and selectors, {tainted} of them with untolerated taints, {busy} in use",
            a.name
        );
        if short > 0 {
            why.push_str(&format!(", {short} without enough shared counters left"));
        }
        why.push(')');
        for e in [short_why, error].into_iter().flatten() {
            why.push_str(&format!("; {e}"));
        }
        return Err(why);
    }
    Ok(out)
}

impl Search<'_> {
    fn solve(&mut self, slot: usize) -> bool {
        if slot == self.slots.len() {
            return true;
        }
        for alt in 0..self.slots[slot].alternatives.len() {
            let (a, cands) = &self.slots[slot].alternatives[alt];
            let Ok(cands) = cands else { continue };
            let want = match a.count {
                Count::Exact(n) => n as usize,
                Count::All => cands.len(),
            };
            let cands = cands.clone();
            let a: &SubRequest = a;
            let a = a.clone();
            if self.pick(slot, &a, &cands, 0, want) {
                return true;
            }
            if self.steps >= self.limit {
                return false;
            }
        }
        false
    }

    /// Picks `left` more devices for `a` from `cands[from..]`, then goes
    /// on with the next slot.
    fn pick(
        &mut self,
        slot: usize,
        a: &SubRequest,
        cands: &[usize],
        from: usize,
        left: usize,
    ) -> bool {
        if left == 0 {
            return self.solve(slot + 1);
        }
        let claim = self.slots[slot].claim;
        for k in from..cands.len() {
            if cands.len() - k < left {
                return false;
            }
            self.steps += 1;
            if self.steps >= self.limit {
                return false;
            }
            let d = cands[k];
            let dev = self.devices[d];
            let multiple = dev.multiple && !a.admin;
            if multiple {
                // another request may share it; one request takes it once
                if self.picked[claim]
                    .iter()
                    .any(|p| p.device == d && p.request == a.name)
                {
                    continue;
                }
            } else if self.used.contains(&d) || self.picked[claim].iter().any(|p| p.device == d) {
                continue;
            }
            if !self.fits(claim, &a.name, d) {
                continue;
            }
            let consumed = if multiple {
                let Ok(c) = consumption(a, dev) else { continue };
                let used = self.shared.get(&d);
                if c.iter().any(|(k, v)| {
                    used.and_then(|u| u.get(k)).copied().unwrap_or(0) + v
                        > dev.capacity.get(k).copied().unwrap_or(0)
                }) {
                    continue;
                }
                Some(c)
            } else {
                None
            };
            // counters: taken once per device, by its first holder
            let first = !a.admin && !self.counted.contains_key(&d);
            if first && self.counters.refuses(dev).is_some() {
                continue;
            }
            let undo = first.then(|| self.counters.take(dev));
            if !a.admin {
                *self.counted.entry(d).or_insert(0) += 1;
                if !multiple {
                    self.used.insert(d);
                }
            }
            if let Some(c) = &consumed {
                let u = self.shared.entry(d).or_default();
                for (k, v) in c {
                    *u.entry(k.clone()).or_insert(0) += v;
                }
            }
            self.picked[claim].push(Pick {
                request: a.name.clone(),
                device: d,
                admin: a.admin,
                consumed: consumed.clone(),
            });
            if self.pick(slot, a, cands, k + 1, left - 1) {
                return true;
            }
            self.picked[claim].pop();
            if let Some(c) = &consumed
                && let Some(u) = self.shared.get_mut(&d)
            {
                for (k, v) in c {
                    if let Some(x) = u.get_mut(k) {
                        *x -= v;
                    }
                }
            }
            if !a.admin {
                if !multiple {
                    self.used.remove(&d);
                }
                if let Some(n) = self.counted.get_mut(&d) {
                    *n -= 1;
                    if *n == 0 {
                        self.counted.remove(&d);
                    }
                }
            }
            if let Some(undo) = undo {
                self.counters.give_back(dev, undo);
            }
            if self.steps >= self.limit {
                return false;
            }
        }
        false
    }

    /// Whether device `d` for request `req` of `claim` keeps the claim's
    /// constraints with what it already has.
    fn fits(&self, claim: usize, req: &str, d: usize) -> bool {
        let dev = self.devices[d];
        for k in &self.claims[claim].constraints {
            if !k.covers(req) {
                continue;
            }
            let others = self.picked[claim]
                .iter()
                .filter(|p| k.covers(&p.request))
                .map(|p| self.devices[p.device]);
            if let Some(attr) = &k.match_attribute {
                let Some(v) = dev.attributes.get(attr) else {
                    return false;
                };
                if others.clone().any(|o| o.attributes.get(attr) != Some(v)) {
                    return false;
                }
            }
            if let Some(attr) = &k.distinct_attribute {
                let Some(v) = dev.attributes.get(attr) else {
                    return false;
                };
                if others.clone().any(|o| o.attributes.get(attr) == Some(v)) {
                    return false;
                }
            }
        }
        true
    }
}

#[cfg(test)]
mod tests;

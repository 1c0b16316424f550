//! The allocator: the devices of one node for the unallocated claims of one
//! pod. Pure and deterministic: candidates in device order, requests in
//! claim and request order, alternatives (`firstAvailable`) in the order
//! given, a depth-first search that backtracks when a constraint fails and
//! gives up after [`MAX_STEPS`].
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
}

/// Allocates `claims` (none allocated yet) on `inp.node`: one allocation
/// per claim, in order, or why not.
pub fn allocate(
    claims: &[&Claim],
    inp: &Inputs,
    sel: &mut Selectors,
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
    };
    if s.solve(0) {
        let on_node = inp.devices.iter().any(|d| d.node.is_some());
        return Ok(s
            .picked
            .iter()
            .enumerate()
            .map(|(ci, p)| Allocation {
                node: on_node.then(|| inp.node.to_string()),
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
    if s.steps >= MAX_STEPS {
        return Err(format!(
            "node {}: gave up after {MAX_STEPS} device choices (the claims' constraints allow too many combinations)",
            inp.node
        ));
    }
    // why: the first request without enough candidates, else the constraints
    for slot in &s.slots {
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
            return Err(format!(
                "node {}: ResourceClaim {}: {}",
                inp.node,
                c.key(),
                reasons.join("; ")
            ));
        }
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
            if self.steps >= MAX_STEPS {
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
            if self.steps >= MAX_STEPS {
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
            if self.steps >= MAX_STEPS {
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
mod tests {
    use super::*;
    use crate::dra::cel::device_value;
    use crate::dra::{AttrValue, Constraint, DeviceTaint, DeviceToleration, Request};

    const DRV: &str = "gpu.gpusched.io";

    fn gpu(node: &str, i: u32, nvlink: &str, model: &str) -> Device {
        let attributes = BTreeMap::from([
            (format!("{DRV}/index"), AttrValue::Int(i as i64)),
            (format!("{DRV}/model"), AttrValue::Str(model.into())),
            (format!("{DRV}/nvlinkDomain"), AttrValue::Str(nvlink.into())),
        ]);
        let capacity = BTreeMap::new();
        Device {
            id: DeviceId {
                driver: DRV.into(),
                pool: node.into(),
                device: format!("gpu-{i}"),
            },
            node: Some(node.into()),
            cel: device_value(DRV, &attributes, &capacity),
            attributes,
            capacity,
            taints: vec![],
            serial: u64::from(i) + 1,
            consumes: vec![],
            multiple: false,
            capacity_info: BTreeMap::new(),
            binding: Default::default(),
        }
    }

    fn classes() -> BTreeMap<String, Class> {
        BTreeMap::from([(
            DRV.to_string(),
            Class {
                name: DRV.into(),
                selectors: vec![format!("device.driver == \"{DRV}\"")],
                extended_resource: None,
                created_ns: 0,
            },
        )])
    }

    fn sub(name: &str, count: Count) -> SubRequest {
        SubRequest {
            name: name.into(),
            class: DRV.into(),
            selectors: vec![],
            count,
            admin: false,
            tolerations: vec![],
            capacity: BTreeMap::new(),
        }
    }

    fn claim(name: &str, requests: Vec<Request>, constraints: Vec<Constraint>) -> Claim {
        Claim {
            namespace: "ml".into(),
            name: name.into(),
            uid: format!("uid-{name}"),
            requests: Ok(requests),
            constraints,
            allocation: None,
            reserved_for: vec![],
            deleting: false,
        }
    }

    fn exactly(name: &str, n: u32) -> Request {
        Request {
            name: name.into(),
            alternatives: vec![sub(name, Count::Exact(n))],
        }
    }

    fn run(
        claims: &[&Claim],
        devices: &[Device],
        in_use: &BTreeSet<DeviceId>,
    ) -> Result<Vec<Vec<String>>, String> {
        let refs: Vec<&Device> = devices.iter().collect();
        let classes = classes();
        let inp = Inputs {
            node: "n1",
            devices: &refs,
            in_use,
            classes: &classes,
            counter_sets: &BTreeMap::new(),
            shared: &BTreeMap::new(),
        };
        let mut sel = Selectors::default();
        allocate(claims, &inp, &mut sel).map(|v| {
            v.into_iter()
                .map(|a| {
                    assert_eq!(a.node.as_deref(), Some("n1"));
                    a.devices
                        .into_iter()
                        .map(|d| format!("{}={}", d.request, d.id.device))
                        .collect()
                })
                .collect()
        })
    }

    fn node8() -> Vec<Device> {
        (0..8)
            .map(|i| gpu("n1", i, if i < 4 { "a" } else { "b" }, "H100"))
            .collect()
    }

    #[test]
    fn exact_count_takes_the_first_free_devices_and_never_one_in_use() {
        let c = claim("c", vec![exactly("gpus", 2)], vec![]);
        let none = BTreeSet::new();
        assert_eq!(
            run(&[&c], &node8(), &none).unwrap(),
            vec![vec!["gpus=gpu-0", "gpus=gpu-1"]]
        );
        let busy: BTreeSet<DeviceId> = node8()[..7].iter().map(|d| d.id.clone()).collect();
        let e = run(&[&c], &node8(), &busy).unwrap_err();
        assert!(e.contains("1 of 2 device(s) available"), "{e}");
        let busy: BTreeSet<DeviceId> = node8()[..6].iter().map(|d| d.id.clone()).collect();
        assert_eq!(
            run(&[&c], &node8(), &busy).unwrap(),
            vec![vec!["gpus=gpu-6", "gpus=gpu-7"]]
        );
    }

    #[test]
    fn two_claims_of_one_pod_never_share_a_device() {
        let a = claim("a", vec![exactly("g", 4)], vec![]);
        let b = claim("b", vec![exactly("g", 4)], vec![]);
        let r = run(&[&a, &b], &node8(), &BTreeSet::new()).unwrap();
        let all: BTreeSet<&String> = r.iter().flatten().collect();
        assert_eq!(all.len(), 8);
        let c = claim("c", vec![exactly("g", 1)], vec![]);
        assert!(run(&[&a, &b, &c], &node8(), &BTreeSet::new()).is_err());
    }

    #[test]
    fn match_attribute_keeps_a_claim_in_one_nvlink_domain_backtracking_if_needed() {
        let k = Constraint {
            requests: vec![],
            match_attribute: Some(format!("{DRV}/nvlinkDomain")),
            distinct_attribute: None,
        };
        let c = claim("c", vec![exactly("g", 3)], vec![k.clone()]);
        // gpu-0 and gpu-1 busy: domain a has 2 free, so the 3 come from b
        let busy: BTreeSet<DeviceId> = node8()[..2].iter().map(|d| d.id.clone()).collect();
        assert_eq!(
            run(&[&c], &node8(), &busy).unwrap(),
            vec![vec!["g=gpu-4", "g=gpu-5", "g=gpu-6"]]
        );
        let c5 = claim("c", vec![exactly("g", 5)], vec![k]);
        let e = run(&[&c5], &node8(), &BTreeSet::new()).unwrap_err();
        assert!(e.contains("constraints"), "{e}");
    }

    #[test]
    fn distinct_attribute_spreads_the_devices() {
        let k = Constraint {
            requests: vec![],
            match_attribute: None,
            distinct_attribute: Some(format!("{DRV}/nvlinkDomain")),
        };
        let c = claim("c", vec![exactly("g", 2)], vec![k]);
        assert_eq!(
            run(&[&c], &node8(), &BTreeSet::new()).unwrap(),
            vec![vec!["g=gpu-0", "g=gpu-4"]]
        );
    }

    #[test]
    fn first_available_takes_the_first_alternative_that_fits() {
        let mut devs = node8();
        devs[7] = gpu("n1", 7, "b", "A100");
        let mut big = sub("g/h100x8", Count::Exact(8));
        big.selectors = vec![format!("device.attributes[\"{DRV}\"].model == \"H100\"")];
        let mut small = sub("g/any2", Count::Exact(2));
        small.selectors = vec![format!(
            "device.attributes[\"{DRV}\"].model == \"A100\" || device.attributes[\"{DRV}\"].index < 2"
        )];
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![big, small],
            }],
            vec![],
        );
        assert_eq!(
            run(&[&c], &devs, &BTreeSet::new()).unwrap(),
            vec![vec!["g/any2=gpu-0", "g/any2=gpu-1"]]
        );
    }

    #[test]
    fn all_mode_takes_every_matching_device_or_none() {
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![sub("g", Count::All)],
            }],
            vec![],
        );
        assert_eq!(run(&[&c], &node8(), &BTreeSet::new()).unwrap()[0].len(), 8);
        let busy = BTreeSet::from([node8()[3].id.clone()]);
        let e = run(&[&c], &node8(), &busy).unwrap_err();
        assert!(
            e.contains("1 of the 8 matching device(s) are in use"),
            "{e}"
        );
    }

    #[test]
    fn tainted_devices_need_a_toleration_and_admin_access_ignores_use() {
        let mut devs: Vec<Device> = node8().into_iter().take(1).collect();
        devs[0].taints.push(DeviceTaint {
            key: "gpusched.io/xid".into(),
            value: "79".into(),
            effect: "NoSchedule".into(),
        });
        let c = claim("c", vec![exactly("g", 1)], vec![]);
        let e = run(&[&c], &devs, &BTreeSet::new()).unwrap_err();
        assert!(e.contains("1 of them with untolerated taints"), "{e}");
        let mut tol = sub("g", Count::Exact(1));
        tol.tolerations.push(DeviceToleration {
            key: "gpusched.io/xid".into(),
            exists: true,
            value: String::new(),
            effect: String::new(),
        });
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![tol],
            }],
            vec![],
        );
        assert!(run(&[&c], &devs, &BTreeSet::new()).is_ok());
        // admin access: a device in use is still given, marked admin
        let busy = BTreeSet::from([node8()[0].id.clone()]);
        let mut adm = sub("g", Count::Exact(1));
        adm.admin = true;
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![adm],
            }],
            vec![],
        );
        let refs: Vec<Device> = node8();
        let r = run(&[&c], &refs, &busy).unwrap();
        assert_eq!(r, vec![vec!["g=gpu-0"]]);
    }

    #[test]
    fn a_missing_class_or_a_bad_selector_is_named() {
        let mut s = sub("g", Count::Exact(1));
        s.class = "nope".into();
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![s],
            }],
            vec![],
        );
        let e = run(&[&c], &node8(), &BTreeSet::new()).unwrap_err();
        assert!(e.contains("DeviceClass \"nope\" does not exist"), "{e}");
        let mut s = sub("g", Count::Exact(1));
        s.selectors = vec!["device.attributes[\"x\"].y == 1".into()];
        let c = claim(
            "c",
            vec![Request {
                name: "g".into(),
                alternatives: vec![s],
            }],
            vec![],
        );
        let e = run(&[&c], &node8(), &BTreeSet::new()).unwrap_err();
        assert!(e.contains("CEL selector"), "{e}");
    }

    #[test]
    fn a_hopeless_search_gives_up_with_a_reason() {
        // 16 devices each in its own domain, 9 wanted in one domain: every
        // combination fails
        let devs: Vec<Device> = (0..16)
            .map(|i| gpu("n1", i, &format!("d{i}"), "H100"))
            .collect();
        let k = Constraint {
            requests: vec![],
            match_attribute: Some(format!("{DRV}/nvlinkDomain")),
            distinct_attribute: None,
        };
        let c = claim("c", vec![exactly("g", 9)], vec![k]);
        let e = run(&[&c], &devs, &BTreeSet::new()).unwrap_err();
        assert!(e.contains("constraints") || e.contains("gave up"), "{e}");
    }

    fn run_with(
        claims: &[&Claim],
        devices: &[Device],
        in_use: &BTreeSet<DeviceId>,
        sets: &BTreeMap<CounterSetId, Counters>,
        shared: &BTreeMap<DeviceId, Counters>,
    ) -> Result<Vec<Allocation>, String> {
        let refs: Vec<&Device> = devices.iter().collect();
        let classes = classes();
        let inp = Inputs {
            node: "n1",
            devices: &refs,
            in_use,
            classes: &classes,
            counter_sets: sets,
            shared,
        };
        allocate(claims, &inp, &mut Selectors::default())
    }

    fn names(r: &[Allocation]) -> Vec<Vec<String>> {
        r.iter()
            .map(|a| a.devices.iter().map(|d| d.id.device.clone()).collect())
            .collect()
    }

    /// A MIG-like GPU: the whole GPU `gpu-0` consumes all 7 slices and
    /// 80 units of memory of counter set `gpu-0`; `mig-3g-<k>` each 3
    /// slices and 40, `mig-1g-<k>` 1 slice and 10.
    fn mig_layout(groups: bool) -> (Vec<Device>, BTreeMap<CounterSetId, Counters>) {
        let part = |name: &str, slices: i128, mem: i128, g: &[&str]| {
            let mut d = gpu("n1", 0, "a", "H100");
            d.id.device = name.into();
            d.consumes = vec![crate::dra::CounterUse {
                set: "gpu-0".into(),
                counters: BTreeMap::from([
                    ("slices".to_string(), slices * 1000),
                    ("memory".to_string(), mem * 1000),
                ]),
                groups: if groups {
                    g.iter().map(|s| s.to_string()).collect()
                } else {
                    vec![]
                },
            }];
            d
        };
        let devs = vec![
            part("gpu-0", 7, 80, &["whole"]),
            part("mig-1g-0", 1, 10, &["mig"]),
            part("mig-3g-0", 3, 40, &["mig"]),
            part("mig-3g-1", 3, 40, &["mig"]),
            part("mig-3g-2", 3, 40, &["mig"]),
        ];
        let sets = BTreeMap::from([(
            CounterSetId {
                driver: DRV.into(),
                pool: "n1".into(),
                name: "gpu-0".into(),
            },
            BTreeMap::from([("slices".to_string(), 7000), ("memory".to_string(), 80_000)]),
        )]);
        (devs, sets)
    }

    /// A request for devices whose name starts with `prefix` (a class of
    /// its own per partition size).
    fn of(name: &str, n: u32, prefix: &str, classes: &mut BTreeMap<String, Class>) -> Request {
        classes.insert(
            prefix.into(),
            Class {
                name: prefix.into(),
                selectors: vec![],
                extended_resource: None,
                created_ns: 0,
            },
        );
        let mut s = sub(name, Count::Exact(n));
        s.class = prefix.into();
        Request {
            name: name.into(),
            alternatives: vec![s],
        }
    }

    fn run_classes(
        claims: &[&Claim],
        devices: &[Device],
        in_use: &BTreeSet<DeviceId>,
        sets: &BTreeMap<CounterSetId, Counters>,
        prefixes: &BTreeMap<String, Class>,
    ) -> Result<Vec<Vec<String>>, String> {
        // each class picks the devices whose name starts with its name
        let mut devs: Vec<Device> = devices.to_vec();
        for (i, d) in devs.iter_mut().enumerate() {
            // selector results are cached per serial
            d.serial = 100 + i as u64;
            d.attributes.insert(
                format!("{DRV}/kind"),
                AttrValue::Str(d.id.device.rsplit_once('-').map_or("", |x| x.0).into()),
            );
            d.cel = crate::dra::cel::device_value(DRV, &d.attributes, &d.capacity);
        }
        let mut classes = classes();
        for (k, c) in prefixes {
            let mut c = c.clone();
            c.selectors = vec![format!("device.attributes[\"{DRV}\"].kind == \"{k}\"")];
            classes.insert(k.clone(), c);
        }
        let refs: Vec<&Device> = devs.iter().collect();
        let inp = Inputs {
            node: "n1",
            devices: &refs,
            in_use,
            classes: &classes,
            counter_sets: sets,
            shared: &BTreeMap::new(),
        };
        allocate(claims, &inp, &mut Selectors::default()).map(|r| names(&r))
    }

    #[test]
    fn shared_counters_keep_a_whole_gpu_and_its_partitions_apart() {
        let (devs, sets) = mig_layout(false);
        let mut cls = BTreeMap::new();
        // two 3g partitions fit (6 of 7 slices, 80 of 80 memory); a third
        // does not
        let two = claim("two", vec![of("p", 2, "mig-3g", &mut cls)], vec![]);
        let none = BTreeSet::new();
        assert_eq!(
            run_classes(&[&two], &devs, &none, &sets, &cls).unwrap(),
            vec![vec!["mig-3g-0", "mig-3g-1"]]
        );
        let three = claim("three", vec![of("p", 3, "mig-3g", &mut cls)], vec![]);
        let e = run_classes(&[&three], &devs, &none, &sets, &cls).unwrap_err();
        assert!(e.contains("constraints"), "{e}");
        // across the claims of one pod: a partition, then the whole GPU
        let part = claim("part", vec![of("p", 1, "mig-1g", &mut cls)], vec![]);
        let whole = claim("whole", vec![of("g", 1, "gpu", &mut cls)], vec![]);
        let e = run_classes(&[&part, &whole], &devs, &none, &sets, &cls).unwrap_err();
        assert!(e.contains("constraints"), "{e}");
        assert!(run_classes(&[&whole], &devs, &none, &sets, &cls).is_ok());
        // held elsewhere: a partition in use leaves no whole GPU, and says why
        let held = BTreeSet::from([devs[1].id.clone()]);
        let e = run_classes(&[&whole], &devs, &held, &sets, &cls).unwrap_err();
        assert!(e.contains("1 without enough shared counters left"), "{e}");
        assert!(
            e.contains("counter memory of set gpu.gpusched.io/n1/gpu-0: 70000 left, 80000 needed"),
            "{e}"
        );
        // ... but two 3g partitions still fit beside the 1g (7 slices, 90 > 80 memory: no)
        let e = run_classes(&[&two], &devs, &held, &sets, &cls).unwrap_err();
        assert!(e.contains("constraints"), "{e}");
        let one = claim("one", vec![of("p", 1, "mig-3g", &mut cls)], vec![]);
        assert_eq!(
            run_classes(&[&one], &devs, &held, &sets, &cls).unwrap(),
            vec![vec!["mig-3g-0"]]
        );
        // the whole GPU held: no partition at all
        let held = BTreeSet::from([devs[0].id.clone()]);
        let e = run_classes(&[&one], &devs, &held, &sets, &cls).unwrap_err();
        assert!(e.contains("3 without enough shared counters left"), "{e}");
        // a set nobody published: its devices are never given
        let e = run_classes(&[&one], &devs, &none, &BTreeMap::new(), &cls).unwrap_err();
        assert!(e.contains("is not published"), "{e}");
    }

    #[test]
    fn compatibility_groups_decide_which_devices_of_a_set_go_together() {
        // with groups, 3g partitions and the 1g share "mig"; the whole GPU
        // ("whole") goes with none of them even if counters allowed it
        let (mut devs, mut sets) = mig_layout(true);
        for v in sets.values_mut() {
            // counters plenty: only the groups decide
            v.values_mut().for_each(|x| *x *= 10);
        }
        let mut cls = BTreeMap::new();
        let one = claim("one", vec![of("p", 1, "mig-1g", &mut cls)], vec![]);
        let whole = claim("whole", vec![of("g", 1, "gpu", &mut cls)], vec![]);
        let none = BTreeSet::new();
        assert!(run_classes(&[&one, &whole], &devs, &none, &sets, &cls).is_err());
        let three = claim("three", vec![of("p", 3, "mig-3g", &mut cls)], vec![]);
        assert!(run_classes(&[&one, &three], &devs, &none, &sets, &cls).is_ok());
        let held = BTreeSet::from([devs[0].id.clone()]);
        let e = run_classes(&[&one], &devs, &held, &sets, &cls).unwrap_err();
        assert!(e.contains("compatibility groups"), "{e}");
        // no groups goes only with no groups
        devs[1].consumes[0].groups.clear();
        devs[2].consumes[0].groups.clear();
        let held = BTreeSet::from([devs[1].id.clone()]);
        let a = claim("a", vec![of("p", 1, "mig-3g", &mut cls)], vec![]);
        assert_eq!(
            run_classes(&[&a], &devs, &held, &sets, &cls).unwrap(),
            vec![vec!["mig-3g-0"]]
        );
        let b = claim("b", vec![of("p", 2, "mig-3g", &mut cls)], vec![]);
        assert!(run_classes(&[&b], &devs, &held, &sets, &cls).is_err());
    }

    fn shareable(mem: i128, policy: Option<RequestPolicy>) -> Device {
        let mut d = gpu("n1", 0, "a", "H100");
        d.multiple = true;
        d.capacity.insert(format!("{DRV}/memory"), mem * 1000);
        d.capacity_info.insert(
            format!("{DRV}/memory"),
            crate::dra::CapacityInfo {
                name: "memory".into(),
                policy,
            },
        );
        d
    }

    fn asking(name: &str, mem: Option<i128>) -> Request {
        let mut s = sub(name, Count::Exact(1));
        if let Some(m) = mem {
            s.capacity.insert("memory".into(), m * 1000);
        }
        Request {
            name: name.into(),
            alternatives: vec![s],
        }
    }

    #[test]
    fn request_policies_round_up_or_refuse() {
        let range = RequestPolicy {
            default: Some(8000),
            values: vec![],
            range: Some((4000, Some(64_000), Some(4000))),
        };
        let c = |p: Option<&RequestPolicy>, a: Option<i128>| RequestPolicy::consumed(p, a, 80_000);
        assert_eq!(c(None, None), Some(80_000));
        assert_eq!(c(None, Some(5)), Some(5));
        assert_eq!(c(Some(&range), None), Some(8000));
        assert_eq!(c(Some(&range), Some(1000)), Some(4000));
        assert_eq!(c(Some(&range), Some(9000)), Some(12_000));
        assert_eq!(c(Some(&range), Some(64_000)), Some(64_000));
        assert_eq!(c(Some(&range), Some(64_001)), None);
        let values = RequestPolicy {
            default: Some(10_000),
            values: vec![10_000, 20_000, 40_000],
            range: None,
        };
        assert_eq!(c(Some(&values), Some(15_000)), Some(20_000));
        assert_eq!(c(Some(&values), Some(40_001)), None);
        let no_default = RequestPolicy {
            default: None,
            values: vec![],
            range: None,
        };
        assert_eq!(c(Some(&no_default), None), Some(80_000));
    }

    #[test]
    fn consumable_capacity_shares_a_device_within_its_capacity() {
        let policy = RequestPolicy {
            default: Some(10_000),
            values: vec![],
            range: Some((1000, None, Some(1000))),
        };
        let devs = vec![shareable(80, Some(policy))];
        let none = BTreeSet::new();
        let a = claim("a", vec![asking("m", Some(30))], vec![]);
        let b = claim("b", vec![asking("m", Some(30))], vec![]);
        let r = run_with(&[&a, &b], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert_eq!(names(&r), vec![vec!["gpu-0"], vec!["gpu-0"]]);
        let d0 = &r[0].devices[0];
        let d1 = &r[1].devices[0];
        assert_eq!(
            d0.consumed,
            BTreeMap::from([("memory".to_string(), 30_000)])
        );
        let (s0, s1) = (d0.share.clone().unwrap(), d1.share.clone().unwrap());
        assert_ne!(s0, s1);
        assert_eq!(s0.len(), 36);
        assert_eq!(s0.as_bytes()[14], b'8');
        // the same allocation gets the same share id
        let again = run_with(&[&a, &b], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert_eq!(again, r);
        // a third 30 does not fit in 80
        let c = claim("c", vec![asking("m", Some(30))], vec![]);
        assert!(
            run_with(
                &[&a, &b, &c],
                &devs,
                &none,
                &BTreeMap::new(),
                &BTreeMap::new()
            )
            .is_err()
        );
        // held elsewhere: 60 consumed, 25 does not fit, 20 does; a request
        // without an amount takes the default 10; 15.5 rounds up to 16
        let used = BTreeMap::from([(
            devs[0].id.clone(),
            BTreeMap::from([(format!("{DRV}/memory"), 60_000)]),
        )]);
        let held = BTreeSet::from([devs[0].id.clone()]);
        let big = claim("big", vec![asking("m", Some(25))], vec![]);
        let e = run_with(&[&big], &devs, &held, &BTreeMap::new(), &used).unwrap_err();
        assert!(e.contains("1 in use"), "{e}");
        let fits = claim("fits", vec![asking("m", Some(20))], vec![]);
        assert!(run_with(&[&fits], &devs, &held, &BTreeMap::new(), &used).is_ok());
        let dflt = claim("dflt", vec![asking("m", None)], vec![]);
        let r = run_with(&[&dflt], &devs, &held, &BTreeMap::new(), &used).unwrap();
        assert_eq!(r[0].devices[0].consumed["memory"], 10_000);
        let mut odd = claim("odd", vec![asking("m", None)], vec![]);
        if let Ok(reqs) = &mut odd.requests {
            reqs[0].alternatives[0]
                .capacity
                .insert("memory".into(), 15_500);
        }
        let r = run_with(&[&odd], &devs, &held, &BTreeMap::new(), &used).unwrap();
        assert_eq!(r[0].devices[0].consumed["memory"], 16_000);
        // a capacity the device lacks, or more than it has: not a match
        let mut lacks = claim("lacks", vec![asking("m", None)], vec![]);
        if let Ok(reqs) = &mut lacks.requests {
            reqs[0].alternatives[0]
                .capacity
                .insert("bandwidth".into(), 1);
        }
        let e = run_with(&[&lacks], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("has no capacity bandwidth"), "{e}");
        let huge = claim("huge", vec![asking("m", Some(81))], vec![]);
        let e = run_with(&[&huge], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("81000 asked of 80000"), "{e}");
    }

    #[test]
    fn without_a_policy_a_request_that_names_no_amount_takes_the_whole_shareable_device() {
        let devs = vec![shareable(80, None)];
        let none = BTreeSet::new();
        let a = claim("a", vec![asking("m", None)], vec![]);
        let b = claim("b", vec![asking("m", Some(1))], vec![]);
        let r = run_with(&[&a], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert_eq!(r[0].devices[0].consumed["memory"], 80_000);
        assert!(run_with(&[&a, &b], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).is_err());
        // two requests of one claim may share the device; one request
        // never takes it twice
        let two = claim(
            "two",
            vec![asking("x", Some(10)), asking("y", Some(10))],
            vec![],
        );
        let r = run_with(&[&two], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).unwrap();
        assert_eq!(names(&r), vec![vec!["gpu-0", "gpu-0"]]);
        let twice = claim("twice", vec![exactly("x", 2)], vec![]);
        assert!(run_with(&[&twice], &devs, &none, &BTreeMap::new(), &BTreeMap::new()).is_err());
    }
}

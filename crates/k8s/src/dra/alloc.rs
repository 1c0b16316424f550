//! The allocator: the devices of one node for the unallocated claims of one
//! pod. Pure and deterministic: candidates in device order, requests in
//! claim and request order, alternatives (`firstAvailable`) in the order
//! given, a depth-first search that backtracks when a constraint fails and
//! gives up after [`MAX_STEPS`].

use super::cel::Selectors;
use super::{AllocatedDevice, Allocation, Claim, Class, Count, Device, DeviceId, SubRequest};
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
}

/// One (claim, request) to satisfy, with the candidates of each
/// alternative.
struct Slot<'a> {
    claim: usize,
    alternatives: Vec<(&'a SubRequest, Result<Vec<usize>, String>)>,
}

struct Search<'a> {
    claims: &'a [&'a Claim],
    devices: &'a [&'a Device],
    slots: Vec<Slot<'a>>,
    /// Per claim: the devices picked so far (sub-request name, device index, admin).
    picked: Vec<Vec<(String, usize, bool)>>,
    used: BTreeSet<usize>,
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
    let mut s = Search {
        claims,
        devices: inp.devices,
        slots,
        picked: vec![Vec::new(); claims.len()],
        used: BTreeSet::new(),
        steps: 0,
    };
    if s.solve(0) {
        let on_node = inp.devices.iter().any(|d| d.node.is_some());
        return Ok(s
            .picked
            .iter()
            .map(|p| Allocation {
                node: on_node.then(|| inp.node.to_string()),
                devices: p
                    .iter()
                    .map(|(req, d, admin)| AllocatedDevice {
                        request: req.clone(),
                        id: inp.devices[*d].id.clone(),
                        admin: *admin,
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
    let (mut selected, mut tainted, mut busy) = (0, 0, 0);
    let mut error = None;
    for (i, d) in inp.devices.iter().enumerate() {
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
        if !a.admin && inp.in_use.contains(&d.id) {
            busy += 1;
            continue;
        }
        out.push(i);
    }
    if a.count == Count::All && (tainted > 0 || busy > 0) {
        return Err(format!(
            "request {}: allocationMode All, but {busy} of the {selected} matching device(s) are in use and {tainted} tainted",
            a.name
        ));
    }
    if out.is_empty() {
        let mut why = format!(
            "request {}: no device available ({selected} match the class and selectors, {tainted} of them with untolerated taints, {busy} in use)",
            a.name
        );
        if let Some(e) = error {
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
            if self.used.contains(&d) || self.picked[claim].iter().any(|(_, x, _)| *x == d) {
                continue;
            }
            if !self.fits(claim, &a.name, d) {
                continue;
            }
            if !a.admin {
                self.used.insert(d);
            }
            self.picked[claim].push((a.name.clone(), d, a.admin));
            if self.pick(slot, a, cands, k + 1, left - 1) {
                return true;
            }
            self.picked[claim].pop();
            self.used.remove(&d);
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
                .filter(|(r, _, _)| k.covers(r))
                .map(|(_, x, _)| self.devices[*x]);
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
        }
    }

    fn classes() -> BTreeMap<String, Class> {
        BTreeMap::from([(
            DRV.to_string(),
            Class {
                name: DRV.into(),
                selectors: vec![format!("device.driver == \"{DRV}\"")],
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
}

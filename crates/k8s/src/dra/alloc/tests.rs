//! Tests of [`super`] (the module's own file stays the code).

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
        selector: None,
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

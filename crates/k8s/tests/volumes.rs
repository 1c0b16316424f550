//! Fixture tests of PersistentVolumeClaim resolution (kube-scheduler's
//! VolumeBinding, VolumeZone, VolumeRestrictions semantics) and of the
//! world's volume reservations: objects as the API serves them → the
//! core's `ClaimNeed`s → the writes the binder makes.

use gpusched_k8s::volumes::{self, PodClaim, VolumeWrite, Volumes};
use gpusched_k8s::world::{Assumed, World};
use gpusched_model::{ClaimNeed, CsiVolume, VolumeConflict, pick_volumes};
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSINode, CSIStorageCapacity, StorageClass};
use serde_json::{Value, json};

fn de<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn pvc(name: &str, class: &str, modes: &[&str], size: &str) -> PersistentVolumeClaim {
    de(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}")},
        "spec": {"storageClassName": class, "accessModes": modes,
                 "resources": {"requests": {"storage": size}}},
        "status": {"phase": "Pending"}
    }))
}

fn local_pv(name: &str, class: &str, host: &str, size: &str) -> PersistentVolume {
    de(json!({
        "metadata": {"name": name, "resourceVersion": "7"},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                 "capacity": {"storage": size}, "local": {"path": "/mnt/x"},
                 "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                     {"key": "kubernetes.io/hostname", "operator": "In", "values": [host]}]}]}}},
        "status": {"phase": "Available"}
    }))
}

fn class(name: &str, mode: &str, provisioner: &str) -> StorageClass {
    de(json!({"metadata": {"name": name}, "provisioner": provisioner, "volumeBindingMode": mode}))
}

fn vols() -> Volumes {
    let mut v = Volumes::default();
    v.classes.insert(
        "local".into(),
        class("local", "WaitForFirstConsumer", volumes::NO_PROVISIONER),
    );
    v.classes
        .insert("fast".into(), class("fast", "Immediate", "csi.example"));
    v
}

fn claims(names: &[&str]) -> Vec<PodClaim> {
    names
        .iter()
        .map(|n| PodClaim {
            name: n.to_string(),
            ephemeral: false,
        })
        .collect()
}

fn blocked_reason(n: &ClaimNeed) -> &str {
    match n {
        ClaimNeed::Blocked { reason } => reason,
        other => panic!("not blocked: {other:?}"),
    }
}

#[test]
fn missing_and_unbound_immediate_claims_block_naming_the_claim() {
    let mut v = vols();
    v.claims.insert(
        "ml/fast-data".into(),
        pvc("fast-data", "fast", &["ReadWriteOnce"], "1Gi"),
    );
    v.claims.insert(
        "ml/no-class".into(),
        pvc("no-class", "", &["ReadWriteOnce"], "1Gi"),
    );
    v.claims.insert(
        "ml/ghost-class".into(),
        pvc("ghost-class", "ghost", &["ReadWriteOnce"], "1Gi"),
    );
    let (needs, _) = volumes::resolve(
        &v,
        "ml",
        "u",
        &claims(&["data", "fast-data", "no-class", "ghost-class"]),
    );
    assert_eq!(
        blocked_reason(&needs[0]),
        "persistentvolumeclaim \"data\" not found"
    );
    assert_eq!(
        blocked_reason(&needs[1]),
        "pod has unbound immediate PersistentVolumeClaims (persistentvolumeclaim \"fast-data\")"
    );
    assert!(blocked_reason(&needs[2]).contains("unbound immediate"));
    assert!(
        blocked_reason(&needs[3]).contains("storageclass.storage.k8s.io \"ghost\" not found"),
        "{:?}",
        needs[3]
    );
}

#[test]
fn a_delayed_claim_lists_matching_free_volumes_smallest_first() {
    let mut v = vols();
    v.claims.insert(
        "ml/data".into(),
        pvc("data", "local", &["ReadWriteOnce"], "10Gi"),
    );
    for pv in [
        local_pv("big-n3", "local", "n3", "100Gi"),
        local_pv("small-n3", "local", "n3", "20Gi"),
        local_pv("too-small", "local", "n1", "5Gi"),
        local_pv("other-class", "fast", "n1", "50Gi"),
    ] {
        v.volumes
            .insert(pv.metadata.name.clone().unwrap(), pv.clone());
    }
    // a volume claimed by another claim, and one that is not Available
    let mut taken = local_pv("taken", "local", "n1", "50Gi");
    taken.spec.as_mut().unwrap().claim_ref = Some(de(json!({"namespace": "ml", "name": "other"})));
    v.volumes.insert("taken".into(), taken);
    let mut released = local_pv("released", "local", "n1", "50Gi");
    released.status = Some(de(json!({"phase": "Released"})));
    v.volumes.insert("released".into(), released);
    let (needs, exclusive) = volumes::resolve(&v, "ml", "u", &claims(&["data"]));
    assert!(exclusive.is_empty());
    let ClaimNeed::Delayed { pvs, provision, .. } = &needs[0] else {
        panic!("{needs:?}")
    };
    let names: Vec<&str> = pvs.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["small-n3", "big-n3"]);
    assert_eq!(*provision, None, "no-provisioner class");
    // access modes must all be offered
    v.claims.insert(
        "ml/data".into(),
        pvc("data", "local", &["ReadWriteMany"], "10Gi"),
    );
    let (needs, _) = volumes::resolve(&v, "ml", "u", &claims(&["data"]));
    assert!(matches!(&needs[0], ClaimNeed::Delayed { pvs, .. } if pvs.is_empty()));
}

#[test]
fn a_volume_pre_bound_to_the_claim_comes_first() {
    let mut v = vols();
    v.claims.insert(
        "ml/data".into(),
        pvc("data", "local", &["ReadWriteOnce"], "1Gi"),
    );
    v.volumes
        .insert("a-small".into(), local_pv("a-small", "local", "n1", "1Gi"));
    let mut mine = local_pv("z-mine", "local", "n2", "500Gi");
    mine.spec.as_mut().unwrap().claim_ref = Some(de(
        json!({"namespace": "ml", "name": "data", "uid": "uid-data"}),
    ));
    v.volumes.insert("z-mine".into(), mine);
    let (needs, _) = volumes::resolve(&v, "ml", "u", &claims(&["data"]));
    let ClaimNeed::Delayed { pvs, .. } = &needs[0] else {
        panic!()
    };
    assert_eq!(pvs[0].name, "z-mine");
}

#[test]
fn bound_volumes_carry_node_affinity_and_zone_labels() {
    let mut v = vols();
    let mut c = pvc("disk", "fast", &["ReadWriteOnce"], "1Gi");
    c.spec.as_mut().unwrap().volume_name = Some("pv-zonal".into());
    c.status = Some(de(json!({"phase": "Bound"})));
    v.claims.insert("ml/disk".into(), c);
    let pv: PersistentVolume = de(json!({
        "metadata": {"name": "pv-zonal", "labels": {"topology.kubernetes.io/zone": "a__b"}},
        "spec": {"storageClassName": "fast", "capacity": {"storage": "1Gi"}}
    }));
    v.volumes.insert("pv-zonal".into(), pv);
    let (needs, _) = volumes::resolve(&v, "ml", "u", &claims(&["disk"]));
    let zone = |z: &str| {
        let mut n = gpusched_model::Node::new("x", Default::default(), Vec::new());
        n.labels
            .insert("topology.kubernetes.io/zone".into(), z.into());
        n
    };
    assert!(pick_volumes(&needs, &zone("b"), |_, _| true).is_ok());
    assert_eq!(
        pick_volumes(&needs, &zone("c"), |_, _| true)
            .unwrap_err()
            .reason(),
        "node(s) had volume node affinity conflict"
    );
    // bound to a volume that is gone
    v.volumes.clear();
    let (needs, _) = volumes::resolve(&v, "ml", "u", &claims(&["disk"]));
    assert!(blocked_reason(&needs[0]).contains("\"pv-zonal\", which does not exist"));
}

#[test]
fn read_write_once_pod_claims_are_exclusive_and_ephemeral_ones_must_be_owned() {
    let mut v = vols();
    v.claims.insert(
        "ml/solo".into(),
        pvc("solo", "local", &["ReadWriteOncePod"], "1Gi"),
    );
    let (_, exclusive) = volumes::resolve(&v, "ml", "u", &claims(&["solo"]));
    assert_eq!(exclusive, ["ml/solo"]);
    let mut eph = pvc("p-scratch", "local", &["ReadWriteOnce"], "1Gi");
    v.claims.insert("ml/p-scratch".into(), eph.clone());
    let e = [PodClaim {
        name: "p-scratch".into(),
        ephemeral: true,
    }];
    let (needs, _) = volumes::resolve(&v, "ml", "pod-uid", &e);
    assert!(blocked_reason(&needs[0]).contains("pod is not owner"));
    eph.metadata.owner_references = Some(vec![de(json!({"apiVersion": "v1", "kind": "Pod",
        "name": "p", "uid": "pod-uid", "controller": true}))]);
    v.claims.insert("ml/p-scratch".into(), eph);
    let (needs, _) = volumes::resolve(&v, "ml", "pod-uid", &e);
    assert!(matches!(needs[0], ClaimNeed::Delayed { .. }));
    // the claim names of a pod's volumes
    let p: Pod = de(
        json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"containers": [],
        "volumes": [{"name": "a", "persistentVolumeClaim": {"claimName": "data"}},
                    {"name": "tmp", "emptyDir": {}},
                    {"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]}}),
    );
    assert_eq!(
        volumes::pod_claims(&p),
        [
            PodClaim {
                name: "data".into(),
                ephemeral: false
            },
            PodClaim {
                name: "p-scratch".into(),
                ephemeral: true
            }
        ]
    );
}

fn node(name: &str) -> Node {
    de(json!({
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"},
                   "conditions": [{"type": "Ready", "status": "True"}]}
    }))
}

fn claim_pod(name: &str, claim: &str) -> Pod {
    de(json!({
        "metadata": {"name": name, "namespace": "ml", "uid": format!("uid-{name}"),
                     "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"schedulerName": "gpusched", "containers": [
            {"name": "main", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
            "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": claim}}]},
        "status": {"phase": "Pending"}
    }))
}

#[test]
fn the_world_reserves_a_chosen_volume_until_the_pod_is_bound_or_forgotten() {
    let mut w = World::default();
    for n in ["n1", "n3"] {
        w.upsert_node(&node(n));
    }
    w.upsert_storage_class(&class(
        "local",
        "WaitForFirstConsumer",
        volumes::NO_PROVISIONER,
    ));
    w.upsert_pv(&local_pv("pv-n3", "local", "n3", "10Gi"));
    w.upsert_pvc(&pvc("a", "local", &["ReadWriteOnce"], "1Gi"));
    w.upsert_pvc(&pvc("b", "local", &["ReadWriteOnce"], "1Gi"));
    w.upsert_pod(&claim_pod("pa", "a"));
    w.upsert_pod(&claim_pod("pb", "b"));
    // the pod's claims reach the core
    let built = w.build();
    let i = built.pods.iter().position(|p| p.name == "pa").unwrap();
    let c = built.snapshot.pods[i].pod.constraints();
    assert!(matches!(&c.volumes[0], ClaimNeed::Delayed { pvs, .. } if pvs[0].name == "pv-n3"));
    // on the wrong node: refused, nothing reserved
    assert!(w.reserve_volumes("uid-pa", "n1").is_err());
    let writes = w.reserve_volumes("uid-pa", "n3").unwrap();
    assert_eq!(
        writes,
        [VolumeWrite::BindVolume {
            volume: "pv-n3".into(),
            resource_version: "7".into(),
            namespace: "ml".into(),
            claim: "a".into(),
            claim_uid: "uid-a".into(),
        }]
    );
    // the other claim no longer sees the volume; pa's claim is pinned to it
    let built = w.build();
    let need = |name: &str| {
        let i = built.pods.iter().position(|p| p.name == name).unwrap();
        built.snapshot.pods[i].pod.constraints().volumes[0].clone()
    };
    assert!(matches!(need("pb"), ClaimNeed::Delayed { pvs, .. } if pvs.is_empty()));
    assert!(matches!(need("pa"), ClaimNeed::Bound { .. }));
    assert!(w.reserve_volumes("uid-pb", "n3").is_err());
    // the binding failed: the volume is free again
    w.assume(
        "uid-pa",
        Assumed {
            node: "n3".into(),
            decision: gpusched_k8s::decision::make(
                "uid-pa",
                &w.build().snapshot.nodes[1],
                1,
                &gpusched_core::GpuAssignment::Whole(vec![0]),
            ),
            gpus: gpusched_core::GpuAssignment::Whole(vec![0]),
        },
    );
    w.forget("uid-pa");
    assert!(w.reserve_volumes("uid-pb", "n3").is_ok());
    assert!(!w.claim_bound("ml/b"));
    let mut bound = pvc("b", "local", &["ReadWriteOnce"], "1Gi");
    bound.spec.as_mut().unwrap().volume_name = Some("pv-n3".into());
    bound.status = Some(de(json!({"phase": "Bound"})));
    w.upsert_pvc(&bound);
    assert!(w.claim_bound("ml/b"));
}

fn csi_pv(name: &str, driver: &str, handle: &str) -> PersistentVolume {
    de(json!({
        "metadata": {"name": name},
        "spec": {"storageClassName": "dyn", "accessModes": ["ReadWriteOnce"],
                 "capacity": {"storage": "10Gi"}, "csi": {"driver": driver, "volumeHandle": handle}},
        "status": {"phase": "Bound"}
    }))
}

fn bound_pvc(name: &str, class: &str, volume: &str) -> PersistentVolumeClaim {
    let mut c = pvc(name, class, &["ReadWriteOnce"], "1Gi");
    c.spec.as_mut().unwrap().volume_name = Some(volume.into());
    c.status = Some(de(json!({"phase": "Bound"})));
    c
}

fn csi_node(name: &str, drivers: Value) -> CSINode {
    de(json!({"metadata": {"name": name}, "spec": {"drivers": drivers}}))
}

#[test]
fn csi_volumes_count_bound_volumes_by_handle_and_unbound_claims_by_provisioner() {
    let mut v = vols();
    v.classes.insert(
        "dyn".into(),
        class("dyn", "WaitForFirstConsumer", "csi.example"),
    );
    v.volumes
        .insert("pv-1".into(), csi_pv("pv-1", "csi.example", "vol-1"));
    v.volumes.insert(
        "pv-local".into(),
        local_pv("pv-local", "local", "n1", "1Gi"),
    );
    v.claims
        .insert("ml/bound".into(), bound_pvc("bound", "dyn", "pv-1"));
    v.claims
        .insert("ml/intree".into(), bound_pvc("intree", "local", "pv-local"));
    v.claims.insert(
        "ml/new".into(),
        pvc("new", "dyn", &["ReadWriteOnce"], "1Gi"),
    );
    v.claims.insert(
        "ml/lost".into(),
        bound_pvc("lost", "dyn", "pv-that-went-away"),
    );
    v.claims.insert(
        "ml/no-class".into(),
        pvc("no-class", "", &["ReadWriteOnce"], "1Gi"),
    );
    let got = volumes::csi_volumes(
        &v,
        "ml",
        &claims(&["bound", "intree", "new", "lost", "no-class", "missing"]),
    );
    let csi = |d: &str, h: &str| CsiVolume {
        driver: d.into(),
        handle: h.into(),
    };
    assert_eq!(
        got,
        [
            csi("csi.example", "vol-1"),
            csi("csi.example", "claim:ml/new"),
            csi("csi.example", "claim:ml/lost"),
        ]
    );
    // limits: drivers with a count; none without a CSINode
    v.csi_nodes.insert(
        "n1".into(),
        csi_node(
            "n1",
            json!([{"name": "csi.example", "nodeID": "n1", "allocatable": {"count": 2}},
                   {"name": "csi.unlimited", "nodeID": "n1"}]),
        ),
    );
    assert!(volumes::any_attach_limit(&v));
    assert_eq!(
        volumes::attach_limits(&v, "n1"),
        [("csi.example".to_string(), 2)].into()
    );
    assert!(volumes::attach_limits(&v, "n2").is_empty());
}

#[test]
fn the_world_gives_nodes_their_csinode_limits_and_pods_their_csi_volumes() {
    let mut w = World::default();
    for n in ["n1", "n2"] {
        w.upsert_node(&node(n));
    }
    w.upsert_storage_class(&class("dyn", "WaitForFirstConsumer", "csi.example"));
    w.upsert_pv(&csi_pv("pv-1", "csi.example", "vol-1"));
    w.upsert_pvc(&bound_pvc("old", "dyn", "pv-1"));
    w.upsert_pvc(&pvc("new", "dyn", &["ReadWriteOnce"], "1Gi"));
    let mut running = claim_pod("running", "old");
    running.spec.as_mut().unwrap().node_name = Some("n1".into());
    running.status = Some(de(json!({"phase": "Running"})));
    w.upsert_pod(&running);
    w.upsert_pod(&claim_pod("next", "new"));
    // (the incremental snapshot, checked against a full build in debug
    // builds) without CSINode limits nothing is resolved
    let built = w.snapshot();
    assert!(
        built
            .snapshot
            .nodes
            .iter()
            .all(|n| n.attach_limits.is_empty())
    );
    assert!(
        built
            .snapshot
            .pods
            .iter()
            .all(|p| p.pod.constraints().csi_volumes.is_empty())
    );
    w.upsert_csi_node(&csi_node(
        "n1",
        json!([{"name": "csi.example", "nodeID": "n1", "allocatable": {"count": 1}}]),
    ));
    let built = w.snapshot();
    let node = |n: &str| built.snapshot.nodes.iter().find(|x| x.name == n).unwrap();
    assert_eq!(node("n1").attach_limits, [("csi.example".into(), 1)].into());
    assert!(node("n2").attach_limits.is_empty());
    let vols = |name: &str| {
        let i = built.pods.iter().position(|p| p.name == name).unwrap();
        built.snapshot.pods[i].pod.constraints().csi_volumes.clone()
    };
    assert_eq!(vols("running")[0].handle, "vol-1");
    assert_eq!(vols("next")[0].handle, "claim:ml/new");
    // the core keeps the new pod off the full node
    let mut cfg = gpusched_plugins::SchedulerConfig::default();
    cfg.actions.min_runtime_ms = 0;
    let out = gpusched_plugins::build(&cfg)
        .unwrap()
        .cycle(&built.snapshot, 1_000, 7);
    let placed = gpusched_testkit::binds(&built.snapshot, &out);
    assert_eq!(placed["ml/next"].0, "n2", "{placed:?}");
    // the CSINode goes: no limit
    w.remove(gpusched_k8s::world::ObjectKind::CsiNode, "n1");
    assert!(
        w.build()
            .snapshot
            .nodes
            .iter()
            .all(|n| n.attach_limits.is_empty())
    );
}

#[test]
fn storage_capacity_limits_provisioning_when_the_driver_publishes_it() {
    let mut v = vols();
    v.classes.insert(
        "dyn".into(),
        class("dyn", "WaitForFirstConsumer", "csi.cap"),
    );
    v.claims.insert(
        "ml/data".into(),
        pvc("data", "dyn", &["ReadWriteOnce"], "10Gi"),
    );
    let capacity = |v: &Volumes| match &volumes::resolve(v, "ml", "u", &claims(&["data"])).0[0] {
        ClaimNeed::Delayed { capacity, .. } => capacity.clone(),
        other => panic!("{other:?}"),
    };
    // no CSIDriver object, or one without storageCapacity: not checked
    assert_eq!(capacity(&v), None);
    v.csi_drivers.insert(
        "csi.cap".into(),
        de(json!({"metadata": {"name": "csi.cap"}, "spec": {"storageCapacity": false}})),
    );
    assert_eq!(capacity(&v), None);
    v.csi_drivers.insert(
        "csi.cap".into(),
        de(json!({"metadata": {"name": "csi.cap"}, "spec": {"storageCapacity": true}})),
    );
    // tracked, nothing published: nowhere
    assert_eq!(capacity(&v), Some(vec![]));
    let cap = |name: &str, class: &str, host: Option<&str>, capacity: &str, max: Option<&str>| {
        let mut o = json!({"metadata": {"name": name, "namespace": "csi"},
                           "storageClassName": class, "capacity": capacity});
        if let Some(h) = host {
            o["nodeTopology"] = json!({"matchLabels": {"kubernetes.io/hostname": h}});
        }
        if let Some(m) = max {
            o["maximumVolumeSize"] = json!(m);
        }
        de::<CSIStorageCapacity>(o)
    };
    for c in [
        cap("small", "dyn", Some("n1"), "5Gi", None),
        cap("max-too-small", "dyn", Some("n2"), "100Gi", Some("8Gi")),
        cap("enough", "dyn", Some("n3"), "20Gi", None),
        cap("max-enough", "dyn", Some("n4"), "1Gi", Some("10Gi")),
        cap("other-class", "fast", Some("n5"), "1Ti", None),
        cap("no-topology", "dyn", None, "1Ti", None),
    ] {
        let k = format!("csi/{}", c.metadata.name.clone().unwrap());
        v.capacities.insert(k, c);
    }
    let Some(ok) = capacity(&v) else {
        panic!("tracked")
    };
    assert_eq!(ok.len(), 2, "{ok:?}");
    let (needs, _) = volumes::resolve(&v, "ml", "u", &claims(&["data"]));
    let mut w = World::default();
    for n in ["n1", "n2", "n3", "n4", "n5"] {
        w.upsert_node(&node(n));
    }
    let built = w.build();
    for n in &built.snapshot.nodes {
        let got = pick_volumes(&needs, n, |_, _| true);
        if n.name == "n3" || n.name == "n4" {
            assert!(got.is_ok(), "{}: {got:?}", n.name);
        } else {
            assert_eq!(got, Err(VolumeConflict::NoSpace), "{}", n.name);
        }
    }
}

//! Volumes: binding, CSI attach limits and storage capacity as kube-scheduler does.

use super::*;

/// The volume rows, on kube-scheduler and gpusched in turn, with
/// kube-controller-manager's PV controller binding the claims for real:
/// a `WaitForFirstConsumer` claim whose only matching volume is local to
/// n3 puts the pod on n3 and binds that volume; a missing claim and an
/// unbound `Immediate` claim keep the pod pending, told which claim.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn volumes_bind_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::StorageClass;
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "local"}, "provisioner": "kubernetes.io/no-provisioner",
               "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await;
    create_obj(
        &classes,
        json!({"metadata": {"name": "remote"}, "provisioner": "example.com/nobody",
               "volumeBindingMode": "Immediate"}),
    )
    .await;
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    let claim_pod = |name: &str, scheduler: &str, claim: &str| {
        let mut p = spec_pod(
            name,
            1,
            json!({}),
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        p
    };
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        // a local volume on n3 only, a decoy on n1 that is too small
        for (pv, node, size) in [
            (format!("local-n3-{tag}"), "n3", "10Gi"),
            (format!("small-n1-{tag}"), "n1", "1Gi"),
        ] {
            create_obj(
                &pvs,
                json!({"metadata": {"name": pv},
                       "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                                "capacity": {"storage": size}, "local": {"path": "/mnt/disk"},
                                "persistentVolumeReclaimPolicy": "Retain",
                                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                    {"key": HOST, "operator": "In", "values": [node]}]}]}}}}),
            )
            .await;
        }
        let claim = format!("data-{tag}");
        create_obj(
            &pvcs,
            json!({"metadata": {"name": claim},
                   "spec": {"storageClassName": "local", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "5Gi"}}}}),
        )
        .await;
        create_obj(
            &pvcs,
            json!({"metadata": {"name": format!("immediate-{tag}")},
                   "spec": {"storageClassName": "remote", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "5Gi"}}}}),
        )
        .await;
        let wffc = format!("wffc-{tag}");
        let missing = format!("missing-{tag}");
        let immediate = format!("immediate-{tag}");
        create(&pods, claim_pod(&wffc, scheduler, &claim)).await;
        create(&pods, claim_pod(&missing, scheduler, "no-such-claim")).await;
        create(
            &pods,
            claim_pod(&immediate, scheduler, &format!("immediate-{tag}")),
        )
        .await;
        let node = wait_for(Duration::from_secs(90), || async {
            pods.get(&wffc).await.ok()?.spec?.node_name
        })
        .await;
        kcm.check();
        assert_eq!(
            node.as_deref(),
            Some("n3"),
            "{scheduler}: the volume's node"
        );
        let c = pvcs.get(&claim).await.unwrap();
        assert_eq!(
            c.spec.and_then(|s| s.volume_name).as_deref(),
            Some(format!("local-n3-{tag}").as_str()),
            "{scheduler}: the claim is bound to the local volume"
        );
        assert_eq!(
            c.status.and_then(|s| s.phase).as_deref(),
            Some("Bound"),
            "{scheduler}"
        );
        let small = pvs.get(&format!("small-n1-{tag}")).await.unwrap();
        assert!(
            small.spec.and_then(|s| s.claim_ref).is_none(),
            "{scheduler}: the decoy stays free"
        );
        for (pod, phrase) in [
            (
                &missing,
                "persistentvolumeclaim \"no-such-claim\" not found",
            ),
            (&immediate, "unbound immediate PersistentVolumeClaims"),
        ] {
            let ev = wait_event(&e.c, "ml", pod, "FailedScheduling: ", 60)
                .await
                .unwrap_or_else(|| panic!("{scheduler}: {pod} told why"));
            assert!(ev.iter().any(|m| m.contains(phrase)), "{scheduler}: {ev:?}");
            if tag == "ours" && pod == &immediate {
                assert!(
                    ev.iter().any(|m| m.contains("immediate-ours")),
                    "gpusched names the claim: {ev:?}"
                );
            }
            assert!(
                pods.get(pod)
                    .await
                    .unwrap()
                    .spec
                    .unwrap()
                    .node_name
                    .is_none(),
                "{scheduler}: {pod} stays pending"
            );
        }
        eprintln!(
            "{scheduler}: {wffc} on n3 with local-n3-{tag}; missing and immediate claims pending"
        );
        pods.delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &ListParams::default(),
        )
        .await
        .unwrap();
        wait_for(Duration::from_secs(60), || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await
        .expect("pods deleted");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// CSI attach limits (kube-scheduler's NodeVolumeLimits), on kube-scheduler
/// and gpusched in turn: n2's CSINode allows one volume of the driver.
/// Claims pre-bound to CSI volumes (kube-controller-manager's PV
/// controller completes the binding); a pod using volume a goes to n2; a
/// pod with another volume pinned to n2 stays pending (`node(s) exceed max
/// volume count`), while a pod sharing volume a fits beside the first.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn csi_attach_limits_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSINode, StorageClass};
    const DRIVER: &str = "csi.example.com";
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let csinodes: Api<CSINode> = Api::all(e.c.client.clone());
    create_obj(
        &csinodes,
        json!({"metadata": {"name": "n2"}, "spec": {"drivers": [
            {"name": DRIVER, "nodeID": "n2", "allocatable": {"count": 1}}]}}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "csi"}, "provisioner": DRIVER,
               "volumeBindingMode": "Immediate"}),
    )
    .await;
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    let claim_pod = |name: &str, scheduler: &str, claim: &str| {
        let mut p = spec_pod(
            name,
            1,
            json!({}),
            json!({"nodeSelector": {HOST: "n2"},
                   "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        p
    };
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        for v in ["a", "b"] {
            let claim = format!("{v}-{tag}");
            create_obj(
                &pvs,
                json!({"metadata": {"name": format!("csi-{claim}")},
                       "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                                "capacity": {"storage": "1Gi"},
                                "persistentVolumeReclaimPolicy": "Retain",
                                "csi": {"driver": DRIVER, "volumeHandle": format!("handle-{claim}")},
                                "claimRef": {"namespace": "ml", "name": claim}}}),
            )
            .await;
            create_obj(
                &pvcs,
                json!({"metadata": {"name": claim},
                       "spec": {"storageClassName": "csi", "accessModes": ["ReadWriteOnce"],
                                "volumeName": format!("csi-{claim}"),
                                "resources": {"requests": {"storage": "1Gi"}}}}),
            )
            .await;
        }
        wait_for(Duration::from_secs(60), || async {
            let all = pvcs.list(&ListParams::default()).await.ok()?.items;
            all.iter()
                .filter(|c| c.metadata.name.as_deref().is_some_and(|n| n.ends_with(tag)))
                .all(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .then_some(())
        })
        .await
        .expect("the PV controller binds the pre-bound claims");
        kcm.check();
        let first = format!("first-{tag}");
        create(&pods, claim_pod(&first, scheduler, &format!("a-{tag}"))).await;
        let node = wait_for(Duration::from_secs(60), || async {
            pods.get(&first).await.ok()?.spec?.node_name
        })
        .await;
        assert_eq!(node.as_deref(), Some("n2"), "{scheduler}");
        let second = format!("second-{tag}");
        let shares = format!("shares-{tag}");
        create(&pods, claim_pod(&second, scheduler, &format!("b-{tag}"))).await;
        create(&pods, claim_pod(&shares, scheduler, &format!("a-{tag}"))).await;
        let node = wait_for(Duration::from_secs(60), || async {
            pods.get(&shares).await.ok()?.spec?.node_name
        })
        .await;
        assert_eq!(
            node.as_deref(),
            Some("n2"),
            "{scheduler}: a volume already on the node counts once"
        );
        let ev = wait_event(&e.c, "ml", &second, "FailedScheduling: ", 60)
            .await
            .unwrap_or_else(|| panic!("{scheduler}: {second} told why"));
        assert!(
            ev.iter().any(|m| m.contains("exceed max volume count")),
            "{scheduler}: {ev:?}"
        );
        assert!(
            pods.get(&second)
                .await
                .unwrap()
                .spec
                .unwrap()
                .node_name
                .is_none(),
            "{scheduler}: {second} stays pending"
        );
        eprintln!("{scheduler}: {first} and {shares} on n2; {second} pending: {ev:?}");
        pods.delete_collection(
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
            &ListParams::default(),
        )
        .await
        .unwrap();
        wait_for(Duration::from_secs(60), || async {
            pods.list(&ListParams::default())
                .await
                .ok()?
                .items
                .is_empty()
                .then_some(())
        })
        .await
        .expect("pods deleted");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

/// Storage capacity for provisioning, on kube-scheduler and gpusched in
/// turn: the class's CSI driver publishes capacity (`CSIDriver`
/// `storageCapacity: true`), and only n4's `CSIStorageCapacity` holds the
/// 10Gi claim (n1's holds 1Gi, the others publish none), so the pod goes to
/// n4. The test plays the external provisioner: it waits for
/// `volume.kubernetes.io/selected-node` on the claim and creates a volume
/// bound to it on that node, as the external-provisioner sidecar does;
/// kube-controller-manager's PV controller completes the binding.
#[tokio::test(flavor = "multi_thread")]
#[ignore = "needs the e2e control plane with kube-scheduler and kube-controller-manager (e2e/run)"]
async fn storage_capacity_as_with_kube_scheduler() {
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use k8s_openapi::api::storage::v1::{CSIDriver, CSIStorageCapacity, StorageClass};
    const DRIVER: &str = "capacity.example.com";
    let mut e = env().await;
    let mut kcm =
        controllers::kube_controller_manager_with(&e.c, "persistentvolume-binder-controller");
    let drivers: Api<CSIDriver> = Api::all(e.c.client.clone());
    create_obj(
        &drivers,
        json!({"metadata": {"name": DRIVER}, "spec": {"storageCapacity": true}}),
    )
    .await;
    let classes: Api<StorageClass> = Api::all(e.c.client.clone());
    create_obj(
        &classes,
        json!({"metadata": {"name": "cap"}, "provisioner": DRIVER,
               "volumeBindingMode": "WaitForFirstConsumer"}),
    )
    .await;
    let caps: Api<CSIStorageCapacity> = Api::namespaced(e.c.client.clone(), "ml");
    for (node, size) in [("n1", "1Gi"), ("n4", "100Gi")] {
        create_obj(
            &caps,
            json!({"metadata": {"name": format!("cap-{node}")}, "storageClassName": "cap",
                   "capacity": size,
                   "nodeTopology": {"matchLabels": {HOST: node}}}),
        )
        .await;
    }
    let pvs: Api<PersistentVolume> = Api::all(e.c.client.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(e.c.client.clone(), "ml");
    let pods = e.c.pods("ml");
    for (tag, scheduler) in [("kube", "default-scheduler"), ("ours", "gpusched")] {
        let claim = format!("scratch-{tag}");
        create_obj(
            &pvcs,
            json!({"metadata": {"name": claim},
                   "spec": {"storageClassName": "cap", "accessModes": ["ReadWriteOnce"],
                            "resources": {"requests": {"storage": "10Gi"}}}}),
        )
        .await;
        let name = format!("cap-{tag}");
        let mut p = spec_pod(
            &name,
            1,
            json!({}),
            json!({"volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}),
        );
        p["spec"]["schedulerName"] = json!(scheduler);
        create(&pods, p).await;
        // the provisioner's part
        let selected = wait_for(Duration::from_secs(60), || async {
            pvcs.get(&claim)
                .await
                .ok()?
                .metadata
                .annotations?
                .get("volume.kubernetes.io/selected-node")
                .cloned()
        })
        .await;
        assert_eq!(
            selected.as_deref(),
            Some("n4"),
            "{scheduler}: provisioning asked where the capacity is"
        );
        create_obj(
            &pvs,
            json!({"metadata": {"name": format!("pv-{claim}")},
                   "spec": {"storageClassName": "cap", "accessModes": ["ReadWriteOnce"],
                            "capacity": {"storage": "10Gi"},
                            "persistentVolumeReclaimPolicy": "Retain",
                            "csi": {"driver": DRIVER, "volumeHandle": format!("h-{claim}")},
                            "claimRef": {"namespace": "ml", "name": claim},
                            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                                {"key": HOST, "operator": "In", "values": ["n4"]}]}]}}}}),
        )
        .await;
        let node = wait_for(Duration::from_secs(90), || async {
            pods.get(&name).await.ok()?.spec?.node_name
        })
        .await;
        kcm.check();
        assert_eq!(node.as_deref(), Some("n4"), "{scheduler}");
        eprintln!("{scheduler}: {name} provisioned and bound on n4");
    }
    kcm.check();
    if let Some(s) = e.sched.take() {
        s.stop().await;
    }
}

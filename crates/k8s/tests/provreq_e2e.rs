//! ProvisioningRequests for gangs on the real control plane, with the
//! real CRD (`config/crd` of `k8s.io/autoscaler/cluster-autoscaler/apis`,
//! cached by `e2e/cluster/build autoscaler-apis`).
//!
//! The test plays cluster-autoscaler: cluster-autoscaler cannot be built
//! here (the Go module proxy answers 403 for every
//! `k8s.io/autoscaler/cluster-autoscaler` version; only its `apis` module
//! fetches), so the test does what its best-effort-atomic-scale-up
//! orchestrator with the kwok cloud provider would: on a request, it adds
//! kwok GPU nodes for the whole request at once (as many nodes as pods,
//! one node per 8-GPU pod) and sets `Provisioned=True`, or, for the
//! second case, `Failed=True`.

mod common;

use common::*;
use gpusched_k8s::provreq::{
    self, ANNOTATION_CLASS, ANNOTATION_CONSUME, CLASS_BEST_EFFORT_ATOMIC, ProvisioningRequest,
};
use k8s_openapi::api::core::v1::{Node, Pod, PodTemplate};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

fn crd_file() -> PathBuf {
    let dir = controllers::paths()
        .get("GPUSCHED_E2E_AUTOSCALER_APIS_CONFIG")
        .cloned()
        .expect("e2e/cluster/paths names the autoscaler-apis config");
    PathBuf::from(dir).join("crd/autoscaling.x-k8s.io_provisioningrequests.yaml")
}

async fn up() -> Cluster {
    let c = Cluster::up().await;
    controllers::install_crds(&c.client, &[crd_file()]).await;
    c
}

fn provreq_opts() -> gpusched_k8s::controller::Options {
    let mut o = opts();
    o.provisioning = Some(provreq::Config {
        retry_base: Duration::from_secs(3),
        retry_max: Duration::from_secs(10),
        ..Default::default()
    });
    o
}

async fn requests(c: &Cluster) -> Vec<ProvisioningRequest> {
    let api: Api<ProvisioningRequest> = Api::namespaced(c.client.clone(), "ml");
    api.list(&ListParams::default()).await.unwrap().items
}

fn member(name: &str, group: &str, gpus: u32) -> serde_json::Value {
    let mut p = gpu_pod(name, gpus);
    p["metadata"]["labels"] = json!({"gpusched.io/pod-group": group});
    p
}

/// What cluster-autoscaler's kwok provider does for a request it can
/// satisfy: one node per pod of the request (8-GPU pods here), all at once.
async fn scale_up(c: &Cluster, prefix: &str, count: usize) -> Vec<String> {
    let yaml = format!(
        "nodes:
  - name: {prefix}
    count: {count}
    cpu: \"64\"
    memory: 512Gi
    gpus: {{count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}}
"
    );
    c.nodes_from_yaml(&yaml).await
}

async fn set_condition(c: &Cluster, name: &str, type_: &str, reason: &str, message: &str) {
    let api: Api<ProvisioningRequest> = Api::namespaced(c.client.clone(), "ml");
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let mut conds = vec![
        json!({"type": "Accepted", "status": "True", "reason": "Accepted",
        "message": "", "lastTransitionTime": now}),
    ];
    conds.push(json!({"type": type_, "status": "True", "reason": reason,
        "message": message, "lastTransitionTime": now}));
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"conditions": conds}})),
    )
    .await
    .unwrap();
}

/// A capacity-blocked gang gets one request for all its members (one pod
/// set of 4, its template from their spec, the consume annotation on each,
/// its condition `WaitingForProvisioning`); a gang held by its queue's
/// limit and a gang that fits get none. When the stand-in autoscaler adds
/// the nodes and sets `Provisioned=True`, the gang starts whole on them —
/// never partly bound beyond its bindings' spread — though a pending pod
/// that asked first waits
/// for the same nodes; then the request and its template are deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_capacity_blocked_gang_is_provisioned_whole_and_starts_on_its_nodes() {
    let c = up().await;
    c.nodes_from_yaml(
        "nodes:
  - name: h100
    count: 1
    cpu: \"64\"
    memory: 512Gi
    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}
",
    )
    .await;
    let pods = c.pods("ml");
    // a gang that fits (2 × 2 GPUs on the one node)
    c.group("ml", "fits", json!({"minMember": 2})).await;
    for i in 0..2 {
        create(&pods, member(&format!("fits-{i}"), "fits", 2)).await;
    }
    // a gang held by its queue's limit (1 GPU; it asks 2)
    c.queue("capped", json!({"limit": {"nvidia.com/gpu": "1"}}))
        .await;
    c.group("ml", "capped", json!({"minMember": 2, "queue": "capped"}))
        .await;
    for i in 0..2 {
        let mut p = member(&format!("capped-{i}"), "capped", 1);
        p["metadata"]["labels"]["gpusched.io/queue"] = json!("capped");
        create(&pods, p).await;
    }
    let s = c.scheduler(provreq_opts()).await;
    wait_for(Duration::from_secs(60), || async {
        let b = bound(&pods).await;
        (b.contains_key("fits-0") && b.contains_key("fits-1")).then_some(())
    })
    .await
    .expect("the gang that fits is bound");
    // a pod asking a whole node, before the gang: it must not take the
    // gang's new nodes
    create(&pods, gpu_pod("early", 8)).await;
    // the gang: 4 × 8 GPUs, more than the cluster has
    c.group("ml", "train", json!({"minMember": 4})).await;
    for i in 0..4 {
        create(&pods, member(&format!("train-{i}"), "train", 8)).await;
    }
    let pr = wait_for(Duration::from_secs(60), || async {
        let l = requests(&c).await;
        (!l.is_empty()).then_some(l)
    })
    .await
    .expect("a ProvisioningRequest for the capacity-blocked gang");
    assert_eq!(pr.len(), 1, "one request: {pr:?}");
    let pr = &pr[0];
    let name = pr.metadata.name.clone().unwrap();
    assert_eq!(pr.spec.provisioning_class_name, CLASS_BEST_EFFORT_ATOMIC);
    assert_eq!(pr.spec.pod_sets.len(), 1, "{:?}", pr.spec.pod_sets);
    assert_eq!(pr.spec.pod_sets[0].count, 4);
    assert_eq!(
        pr.metadata.annotations.as_ref().unwrap()[provreq::ANNOTATION_GANG],
        "ml/train"
    );
    // owned by the PodGroup (garbage-collected with it)
    let owner = &pr.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str()),
        ("PodGroup", "train")
    );
    let templates: Api<PodTemplate> = Api::namespaced(c.client.clone(), "ml");
    let t = templates
        .get(&pr.spec.pod_sets[0].pod_template_ref.name)
        .await
        .expect("the pod set's PodTemplate exists");
    let spec = t.template.unwrap().spec.unwrap();
    assert_eq!(
        spec.containers[0]
            .resources
            .as_ref()
            .unwrap()
            .limits
            .as_ref()
            .unwrap()["nvidia.com/gpu"]
            .0,
        "8"
    );
    // the members consume it and say so; the others do not
    let marked = wait_for(Duration::from_secs(60), || async {
        let mut out = BTreeMap::new();
        for i in 0..4 {
            let p = pods.get(&format!("train-{i}")).await.ok()?;
            let ann = p.metadata.annotations.clone().unwrap_or_default();
            let (reason, message) = scheduled_reason(&p)?;
            if ann.get(ANNOTATION_CONSUME) != Some(&name)
                || ann.get(ANNOTATION_CLASS).map(String::as_str) != Some(CLASS_BEST_EFFORT_ATOMIC)
                || reason != provreq::CONDITION_REASON
            {
                return None;
            }
            out.insert(i, message);
        }
        Some(out)
    })
    .await
    .expect("the members carry the consume annotation and read WaitingForProvisioning");
    assert!(marked[&0].contains(&name), "{marked:?}");
    for p in ["capped-0", "early"] {
        let p = pods.get(p).await.unwrap();
        assert!(
            !p.metadata
                .annotations
                .unwrap_or_default()
                .contains_key(ANNOTATION_CONSUME)
        );
    }
    assert_eq!(
        scheduled_reason(&pods.get("capped-0").await.unwrap()).map(|r| r.0),
        Some("QueueQuota".into())
    );
    // the stand-in autoscaler: provisioned, then the nodes register
    set_condition(
        &c,
        &name,
        "Provisioned",
        "Provisioned",
        "4 nodes in group gpu-h100",
    )
    .await;
    wait_event(&c, "ml", "train-0", "Provisioned:", 60)
        .await
        .expect("a Provisioned event on the members");
    // the nodes register while the gangs are polled: the gang is never
    // partly bound beyond its bindings' spread (controllers::BINDING_SPREAD:
    // the members' bindings are separate calls made in one cycle)
    static GROUP: fn(&Pod) -> Option<String> = |p| {
        p.metadata
            .labels
            .as_ref()?
            .get("gpusched.io/pod-group")
            .cloned()
    };
    let (new, g) = tokio::join!(
        scale_up(&c, "scaled", 4),
        controllers::poll_gangs_by(
            &pods,
            &GROUP,
            &|name| if name == "train" { 4 } else { 2 },
            90,
            "the gang starts on the provisioned nodes",
            |g| controllers::bound_of(g, "train") == 4,
        )
    );
    assert_eq!(controllers::bound_of(&g, "capped"), 0, "{g:?}");
    assert!(
        !bound(&pods).await.contains_key("early"),
        "the earlier pod took a provisioned node"
    );
    let b = bound(&pods).await;
    for i in 0..4 {
        let node = b[&format!("train-{i}")]
            .spec
            .as_ref()
            .unwrap()
            .node_name
            .clone()
            .unwrap();
        assert!(
            new.contains(&node),
            "train-{i} on {node}, not a provisioned node"
        );
    }
    assert_no_double_booking(&c.client).await;
    // the gang runs: its request and template go
    wait_for(Duration::from_secs(60), || async {
        let gone = requests(&c).await.is_empty()
            && templates
                .get_opt(&pr.spec.pod_sets[0].pod_template_ref.name)
                .await
                .ok()?
                .is_none();
        gone.then_some(())
    })
    .await
    .expect("the request and its template are deleted once the gang runs");
    // never a request for the other gangs
    assert!(requests(&c).await.is_empty());
    // the early pod still waits (no node left), and never got a request
    assert!(!bound(&pods).await.contains_key("early"));
    let nodes: Api<Node> = Api::all(c.client.clone());
    assert_eq!(
        nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        5
    );
    s.stop().await;
}

/// A request the autoscaler fails is reported (event, condition message)
/// and kept until its backoff has passed, then replaced by the next
/// attempt; a gang that goes away takes its request with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e control plane: e2e/run"]
async fn a_failed_request_is_reported_and_retried() {
    let c = up().await;
    let pods = c.pods("ml");
    c.group("ml", "train", json!({"minMember": 2})).await;
    for i in 0..2 {
        create(&pods, member(&format!("train-{i}"), "train", 8)).await;
    }
    let s = c.scheduler(provreq_opts()).await;
    let first = wait_for(Duration::from_secs(60), || async {
        requests(&c).await.into_iter().next()
    })
    .await
    .expect("a request for the gang");
    let first = first.metadata.name.unwrap();
    assert!(first.ends_with("-1"), "{first}");
    set_condition(
        &c,
        &first,
        "Failed",
        "NoNodeGroup",
        "no node group can hold 2 pods of 8 GPUs",
    )
    .await;
    let ev = wait_event(&c, "ml", "train-0", "ProvisioningFailed:", 60)
        .await
        .expect("a ProvisioningFailed event");
    assert!(
        ev.iter()
            .any(|e| e.starts_with("ProvisioningFailed:") && e.contains("NoNodeGroup")),
        "{ev:?}"
    );
    // the next attempt after the 3 s backoff, the failed one deleted
    let second = wait_for(Duration::from_secs(60), || async {
        let l = requests(&c).await;
        (l.len() == 1 && l[0].metadata.name.as_deref() != Some(first.as_str()))
            .then(|| l[0].metadata.name.clone().unwrap())
    })
    .await
    .expect("a second request replaces the failed one");
    assert!(second.ends_with("-2"), "{second}");
    let p = wait_for(Duration::from_secs(30), || async {
        let p = pods.get("train-1").await.ok()?;
        (p.metadata.annotations.as_ref()?.get(ANNOTATION_CONSUME) == Some(&second)).then_some(p)
    })
    .await
    .expect("the members consume the new request");
    assert!(p.metadata.annotations.is_some());
    // the gang goes: so does its request
    for i in 0..2 {
        pods.delete(&format!("train-{i}"), &Default::default())
            .await
            .unwrap();
    }
    wait_for(Duration::from_secs(60), || async {
        requests(&c).await.is_empty().then_some(())
    })
    .await
    .expect("the request goes with the gang");
    s.stop().await;
}

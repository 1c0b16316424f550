//! KubeRay's RayCluster and Kubeflow's PyTorchJob and MPIJob gangs with
//! their real CRDs (from the operators' Go modules, pinned: KubeRay
//! ray-operator v1.4.2, training-operator v1.9.3, MPI Operator v0.8.2) and
//! pods shaped as those operators write them (their labels and owner). The
//! operators themselves are not run here (not built in this suite).

mod common;

use common::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, PostParams};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

/// The directory of a Go module version (downloaded into the module cache
/// through the Go module proxy, as e2e/cluster/build does).
fn module_dir(module: &str) -> PathBuf {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new("go")
        .args(["mod", "download", "-json", module])
        .current_dir(scratch.path())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=mod")
        .output()
        .expect("go (needed to fetch the operators' CRDs)");
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "go mod download {module}: {e}: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    PathBuf::from(
        v["Dir"]
            .as_str()
            .unwrap_or_else(|| panic!("go mod download {module}: {v}")),
    )
}

async fn install_crd(c: &Cluster, path: PathBuf) {
    let text = std::fs::read_to_string(&path).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&text).unwrap();
    let name = crd.metadata.name.clone().unwrap();
    let api: Api<CustomResourceDefinition> = Api::all(c.client.clone());
    api.create(&PostParams::default(), &crd).await.unwrap();
    wait_for(Duration::from_secs(30), || async {
        api.get(&name)
            .await
            .ok()?
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Established" && c.status == "True")
            .then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("CRD {name} not established"));
}

async fn create_custom(c: &Cluster, doc: Value) -> DynamicObject {
    let (group, version) = doc["apiVersion"].as_str().unwrap().split_once('/').unwrap();
    let gvk = GroupVersionKind::gvk(group, version, doc["kind"].as_str().unwrap());
    let api: Api<DynamicObject> =
        Api::namespaced_with(c.client.clone(), "ml", &ApiResource::from_gvk(&gvk));
    api.create(
        &PostParams::default(),
        &serde_json::from_value(doc).unwrap(),
    )
    .await
    .unwrap()
}

fn template(gpus: u32) -> Value {
    json!({"spec": {"containers": [{"name": "main", "image": "x",
        "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]}})
}

/// A pod as the operator makes it: its labels, owned by `owner`.
fn member(name: &str, gpus: u32, labels: Value, owner: &DynamicObject) -> Value {
    let mut p = gpu_pod(name, gpus);
    p["metadata"]["labels"] = labels;
    p["metadata"]["ownerReferences"] = json!([{
        "apiVersion": owner.types.as_ref().unwrap().api_version,
        "kind": owner.types.as_ref().unwrap().kind,
        "name": owner.metadata.name, "uid": owner.metadata.uid,
        "controller": true, "blockOwnerDeletion": true}]);
    p
}

async fn bound_with(api: &Api<Pod>, prefix: &str) -> usize {
    bound(api)
        .await
        .keys()
        .filter(|k| k.starts_with(prefix))
        .count()
}

/// Asserts that no pod with `prefix` is bound for `secs` seconds.
async fn stays_unbound(api: &Api<Pod>, prefix: &str, secs: u64) {
    let until = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < until {
        assert_eq!(bound_with(api, prefix).await, 0, "{prefix}: a partial gang");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and Go (for the CRDs): e2e/run"]
async fn ray_clusters_and_kubeflow_jobs_are_gangs() {
    let ray = module_dir("github.com/ray-project/kuberay/ray-operator@v1.4.2");
    let training = module_dir("github.com/kubeflow/training-operator@v1.9.3");
    let mpi = module_dir("github.com/kubeflow/mpi-operator@v0.8.2");
    let c = Cluster::up().await;
    install_crd(&c, ray.join("config/crd/bases/ray.io_rayclusters.yaml")).await;
    install_crd(
        &c,
        training.join("manifests/base/crds/kubeflow.org_pytorchjobs.yaml"),
    )
    .await;
    install_crd(&c, mpi.join("manifests/base/kubeflow.org_mpijobs.yaml")).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let s = c.scheduler(opts()).await;

    // a RayCluster: head + 3 workers of 2 GPUs, in queue a by its label
    let rc = create_custom(
        &c,
        json!({"apiVersion": "ray.io/v1", "kind": "RayCluster",
               "metadata": {"name": "rc", "labels": {"gpusched.io/queue": "a"}},
               "spec": {"headGroupSpec": {"rayStartParams": {}, "template": template(2)},
                        "workerGroupSpecs": [{"groupName": "gpu", "replicas": 3, "minReplicas": 0,
                            "maxReplicas": 5, "rayStartParams": {}, "template": template(2)}]}}),
    )
    .await;
    let ray_labels = |t: &str| json!({"ray.io/cluster": "rc", "ray.io/node-type": t, "ray.io/group": if t == "head" { "headgroup" } else { "gpu" }});
    create(&pods, member("rc-head", 2, ray_labels("head"), &rc)).await;
    for i in 0..2 {
        create(
            &pods,
            member(&format!("rc-gpu-{i}"), 2, ray_labels("worker"), &rc),
        )
        .await;
    }
    // three of four exist: the gang waits
    stays_unbound(&pods, "rc-", 5).await;
    create(&pods, member("rc-gpu-2", 2, ray_labels("worker"), &rc)).await;
    wait_for(Duration::from_secs(60), || async {
        (bound_with(&pods, "rc-").await == 4).then_some(())
    })
    .await
    .expect("the RayCluster's head and workers start together");

    // a PyTorchJob of 1 master + 3 workers × 4 GPUs with 8 free: none starts
    let pt = create_custom(
        &c,
        json!({"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
               "metadata": {"name": "pt"},
               "spec": {"pytorchReplicaSpecs": {
                   "Master": {"replicas": 1, "template": template(4)},
                   "Worker": {"replicas": 3, "template": template(4)}}}}),
    )
    .await;
    for (i, t) in ["master", "worker", "worker", "worker"].iter().enumerate() {
        let idx = if i == 0 { 0 } else { i - 1 };
        create(
            &pods,
            member(
                &format!("pt-{t}-{idx}"),
                4,
                json!({"training.kubeflow.org/job-name": "pt",
                       "training.kubeflow.org/operator-name": "pytorchjob-controller",
                       "training.kubeflow.org/replica-type": t,
                       "training.kubeflow.org/replica-index": idx.to_string()}),
                &pt,
            ),
        )
        .await;
    }
    stays_unbound(&pods, "pt-", 6).await;

    // an MPIJob (launcher + 1 worker × 4 GPUs): 8 GPUs, fits, starts whole
    let mj = create_custom(
        &c,
        json!({"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
               "metadata": {"name": "mj"},
               "spec": {"mpiReplicaSpecs": {
                   "Launcher": {"replicas": 1, "template": template(4)},
                   "Worker": {"replicas": 1, "template": template(4)}}}}),
    )
    .await;
    for role in ["launcher", "worker"] {
        create(
            &pods,
            member(
                &format!("mj-{role}"),
                4,
                json!({"training.kubeflow.org/job-name": "mj",
                       "training.kubeflow.org/operator-name": "mpi-operator",
                       "training.kubeflow.org/job-role": role}),
                &mj,
            ),
        )
        .await;
    }
    wait_for(Duration::from_secs(60), || async {
        (bound_with(&pods, "mj-").await == 2).then_some(())
    })
    .await
    .expect("the MPIJob's launcher and worker start together");
    assert_eq!(bound_with(&pods, "pt-").await, 0);
    // the RayCluster's pods go: the PyTorchJob still does not fit (16 GPUs
    // with 8 free) and stays whole-or-nothing
    for n in ["rc-head", "rc-gpu-0", "rc-gpu-1", "rc-gpu-2"] {
        pods.delete(n, &Default::default()).await.unwrap();
    }
    stays_unbound(&pods, "pt-", 5).await;
    for n in ["mj-launcher", "mj-worker"] {
        pods.delete(n, &Default::default()).await.unwrap();
    }
    wait_for(Duration::from_secs(60), || async {
        (bound_with(&pods, "pt-").await == 4).then_some(())
    })
    .await
    .expect("the PyTorchJob starts whole once 16 GPUs are free");
    assert_no_double_booking(&c.client).await;
    s.stop().await;
}

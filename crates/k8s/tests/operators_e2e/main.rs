//! Gangs of the real training and serving operators, built from their Go
//! modules (e2e/cluster/build: KubeRay ray-operator v1.5.0, Kubeflow
//! training-operator v1.9.3, MPI Operator v0.8.2), their CRDs from the same
//! module versions, with kube-controller-manager (Jobs, garbage collection)
//! on the e2e control plane and kwok GPU nodes. For each kind: a workload
//! that fits starts all its pods; one that does not fit starts none (no
//! gang partly bound at any poll); a failed member is replaced as its
//! operator defines and the replacement is placed; two queues share.
//!
//! A member fails through kwok: the test annotates one running pod with
//! `gpusched.io/e2e-fail-exit-code` (e2e/cluster/stages/pod-failed.yaml)
//! and kwok writes phase Failed with that exit code, as a kubelet would.

#[path = "../common/mod.rs"]
mod common;

use common::controllers::*;
use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

// the tests, one file an operator (this file: the operators' installation,
// the test bed and the checks the three share)
mod mpi_jobs;
mod ray_clusters;
mod training_jobs;

/// The operator's binary and the directory it was built into (its
/// manifests are under `config/` there).
fn operator_home(comp: &str) -> (String, PathBuf) {
    let key = format!("GPUSCHED_E2E_{}_BIN", comp.to_uppercase().replace('-', "_"));
    let bin = paths()
        .get(&key)
        .cloned()
        .unwrap_or_else(|| panic!("e2e/cluster/paths has no {key}"));
    let home = PathBuf::from(&bin).parent().unwrap().to_path_buf();
    (bin, home)
}

async fn namespace(c: &Cluster, name: &str) {
    let ns: Api<Namespace> = Api::all(c.client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap(),
    )
    .await
    .unwrap();
}

/// KubeRay's operator with its three CRDs; no webhooks (off by default).
async fn kuberay(c: &Cluster) -> Proc {
    let (bin, home) = operator_home("kuberay");
    let crds = home.join("config/crd/bases");
    install_crds(
        &c.client,
        &["rayclusters", "rayjobs", "rayservices"].map(|k| crds.join(format!("ray.io_{k}.yaml"))),
    )
    .await;
    let probe = free_port();
    let mut p = Proc::start(
        c.dir.path(),
        "kuberay",
        &bin,
        &[
            format!("--kubeconfig={}", c.kubeconfig().display()),
            format!("--metrics-addr=127.0.0.1:{}", free_port()),
            format!("--health-probe-bind-address=127.0.0.1:{probe}"),
            "--enable-leader-election=false".into(),
        ],
    );
    until_ready(&mut p, probe, 120).await;
    p
}

/// The training-operator with the PyTorchJob, TFJob and (v1) MPIJob
/// controllers. Its validating webhooks are not registered (the apiserver
/// could not reach a Service here); the operator still makes its own
/// serving certificate, in the Secret its manifests create, and starts its
/// controllers only once that certificate is in its certificate directory
/// — which the kubelet would fill from the Secret and the test does here
/// (`/tmp/k8s-webhook-server/serving-certs`, fixed in the operator).
async fn training_operator(c: &Cluster) -> Proc {
    let (bin, home) = operator_home("training-operator");
    let crds = home.join("config/base/crds");
    install_crds(
        &c.client,
        &["pytorchjobs", "tfjobs", "mpijobs"].map(|k| crds.join(format!("kubeflow.org_{k}.yaml"))),
    )
    .await;
    namespace(c, "kubeflow").await;
    let secrets: Api<Secret> = Api::namespaced(c.client.clone(), "kubeflow");
    secrets
        .create(
            &PostParams::default(),
            &serde_json::from_value(
                json!({"metadata": {"name": "training-operator-webhook-cert"}}),
            )
            .unwrap(),
        )
        .await
        .unwrap();
    let probe = free_port();
    let mut p = Proc::start(
        c.dir.path(),
        "training-operator",
        &bin,
        &[
            format!("--kubeconfig={}", c.kubeconfig().display()),
            "--metrics-bind-address=0".into(),
            format!("--health-probe-bind-address=127.0.0.1:{probe}"),
            format!("--webhook-server-port={}", free_port()),
            "--enable-scheme=pytorchjob".into(),
            "--enable-scheme=tfjob".into(),
            "--enable-scheme=mpijob".into(),
        ],
    );
    // what a Secret volume would hold, once the operator has written it
    let certs = PathBuf::from("/tmp/k8s-webhook-server/serving-certs");
    let t0 = Instant::now();
    loop {
        p.check();
        let data = secrets
            .get("training-operator-webhook-cert")
            .await
            .unwrap()
            .data
            .unwrap_or_default();
        if ["tls.crt", "tls.key", "ca.crt"]
            .iter()
            .all(|k| data.contains_key(*k))
        {
            std::fs::create_dir_all(&certs).unwrap();
            for (k, v) in &data {
                std::fs::write(certs.join(k), &v.0).unwrap();
            }
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "the training-operator wrote no certificate in 60 s; log {}",
            p.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    until_ready(&mut p, probe, 120).await;
    p
}

/// The MPI Operator (v2beta1 MPIJobs); it always elects a leader, in the
/// `mpi-operator` namespace.
async fn mpi_operator(c: &Cluster) -> Proc {
    let (bin, home) = operator_home("mpi-operator");
    install_crds(
        &c.client,
        &[home.join("config/base/kubeflow.org_mpijobs.yaml")],
    )
    .await;
    namespace(c, "mpi-operator").await;
    let mut p = Proc::start(
        c.dir.path(),
        "mpi-operator",
        &bin,
        &[
            format!("--kubeConfig={}", c.kubeconfig().display()),
            "--lock-namespace=mpi-operator".into(),
            "--threadiness=2".into(),
        ],
    );
    // no probe port: ready once it holds its lease
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(c.client.clone(), "mpi-operator");
    let t0 = Instant::now();
    while leases
        .list(&ListParams::default())
        .await
        .map(|l| l.items.is_empty())
        .unwrap_or(true)
    {
        p.check();
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "mpi-operator took no lease in 120 s; log {}",
            p.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    p
}

fn container(gpus: u32) -> Value {
    let mut limits = json!({});
    if gpus > 0 {
        limits["nvidia.com/gpu"] = json!(gpus.to_string());
    }
    json!({"name": "main", "image": "cuda",
           "resources": {"limits": limits, "requests": {"cpu": "100m"}}})
}

/// A pod template for gpusched with one container of `gpus` GPUs.
fn template(gpus: u32, restart: &str) -> Value {
    json!({"spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
                    "restartPolicy": restart, "containers": [container(gpus)]}})
}

/// A Kubeflow job of `kind` with these replica types (`(type, replicas,
/// gpus)`), failures of exit code ≥ 128 retried (`restartPolicy:
/// ExitCode`).
fn kubeflow(
    kind: &str,
    version: &str,
    name: &str,
    queue: &str,
    types: &[(&str, u32, u32)],
) -> Value {
    let field = match kind {
        "PyTorchJob" => "pytorchReplicaSpecs",
        "TFJob" => "tfReplicaSpecs",
        _ => "mpiReplicaSpecs",
    };
    let mut specs = serde_json::Map::new();
    for &(t, n, gpus) in types {
        let mut tpl = template(gpus, "Never");
        if kind == "TFJob" {
            tpl["spec"]["containers"][0]["name"] = json!("tensorflow");
        }
        if kind == "PyTorchJob" {
            tpl["spec"]["containers"][0]["name"] = json!("pytorch");
        }
        let restart = if kind == "MPIJob" {
            "Never"
        } else {
            "ExitCode"
        };
        specs.insert(
            t.into(),
            json!({"replicas": n, "restartPolicy": restart, "template": tpl}),
        );
    }
    let mut spec = json!({field: specs});
    if kind == "MPIJob" && version == "v2beta1" {
        spec["sshAuthMountPath"] = json!("/root/.ssh");
        spec["runPolicy"] = json!({"backoffLimit": 3});
    }
    json!({"apiVersion": format!("kubeflow.org/{version}"), "kind": kind,
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": spec})
}

/// A pod's gang as the test knows it: the RayCluster's or Kubeflow job's
/// name.
fn gang_of(p: &Pod) -> Option<String> {
    let l = p.metadata.labels.as_ref()?;
    l.get("ray.io/cluster")
        .or_else(|| l.get("training.kubeflow.org/job-name"))
        .cloned()
}

async fn poll(
    api: &Api<Pod>,
    size: &dyn Fn(&str) -> usize,
    secs: u64,
    what: &str,
    done: impl Fn(&BTreeMap<String, (usize, usize)>) -> bool,
) -> BTreeMap<String, (usize, usize)> {
    poll_gangs_by(api, &gang_of, size, secs, what, done).await
}

/// The running (bound, not terminating, not finished) pods of a gang, by
/// name → uid.
async fn running_members(api: &Api<Pod>, gang: &str) -> BTreeMap<String, String> {
    api.list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| gang_of(p).as_deref() == Some(gang))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .filter(|p| {
            !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Failed" | "Succeeded")
            )
        })
        .map(|p| (p.metadata.name.unwrap(), p.metadata.uid.unwrap()))
        .collect()
}

/// Fails the running member `pod` with `exit_code` (through kwok) and
/// waits until the gang has `size` running members again, one of them new:
/// the operator's replacement, placed by gpusched. Returns the new pod's
/// name.
async fn fail_and_replace(
    api: &Api<Pod>,
    gang: &str,
    pod: &str,
    exit_code: u32,
    size: usize,
) -> String {
    let before = running_members(api, gang).await;
    assert_eq!(before.len(), size, "{gang} before the failure: {before:?}");
    api.patch(
        pod,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"annotations": {
            "gpusched.io/e2e-fail-exit-code": exit_code.to_string()}}})),
    )
    .await
    .unwrap();
    let after = wait_for(Duration::from_secs(120), || async {
        let now = running_members(api, gang).await;
        let new: Vec<String> = now
            .iter()
            .filter(|(n, uid)| before.get(*n) != Some(*uid))
            .map(|(n, _)| n.clone())
            .collect();
        (now.len() == size && new.len() == 1 && !now.values().any(|u| u == &before[pod]))
            .then(|| new[0].clone())
    })
    .await;
    match after {
        Some(name) => name,
        None => panic!(
            "{gang}: {pod} failed and no replacement was placed in 120 s; its pods: {}",
            describe(api, gang).await
        ),
    }
}

/// A gang's pods with phase, node and whether deleted (for failures).
async fn describe(api: &Api<Pod>, gang: &str) -> String {
    let mut out = Vec::new();
    for p in api.list(&ListParams::default()).await.unwrap().items {
        if gang_of(&p).as_deref() != Some(gang) {
            continue;
        }
        out.push(format!(
            "{} [{} on {} {}]",
            p.metadata.name.as_deref().unwrap_or("?"),
            p.status
                .as_ref()
                .and_then(|s| s.phase.as_deref())
                .unwrap_or("-"),
            p.spec
                .as_ref()
                .and_then(|s| s.node_name.as_deref())
                .unwrap_or("-"),
            if p.metadata.deletion_timestamp.is_some() {
                "deleting"
            } else {
                ""
            },
        ));
    }
    out.join(", ")
}

/// Two queues of equal weight, each with four 8-GPU workloads on 16 GPUs:
/// each queue runs one, whole.
async fn queues_share(
    c: &Cluster,
    pods: &Api<Pod>,
    make: &dyn Fn(&str, &str) -> Value,
    size: &dyn Fn(&str) -> usize,
) {
    for q in ["a", "b"] {
        for i in 0..4 {
            create_workload(&c.client, "ml", make(&format!("{q}{i}"), q)).await;
        }
    }
    poll(pods, size, 120, "eight workloads' pods exist", |g| {
        ["a", "b"]
            .iter()
            .all(|q| (0..4).all(|i| existing_of(g, &format!("{q}{i}")) == size(&format!("{q}{i}"))))
    })
    .await;
    let full = |g: &BTreeMap<String, (usize, usize)>, q: &str| {
        (0..4)
            .filter(|i| {
                let n = format!("{q}{i}");
                bound_of(g, &n) == size(&n)
            })
            .count()
    };
    poll(pods, size, 120, "each queue starts one", |g| {
        full(g, "a") == 1 && full(g, "b") == 1
    })
    .await;
    let until = Instant::now() + Duration::from_secs(5);
    let g = poll(pods, size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!((full(&g, "a"), full(&g, "b")), (1, 1), "{g:?}");
}

/// Asserts the workload's pods all exist and none is bound for `secs`.
async fn stays_whole_or_nothing(
    pods: &Api<Pod>,
    size: &dyn Fn(&str) -> usize,
    name: &str,
    secs: u64,
) {
    poll(pods, size, 120, &format!("{name}'s pods exist"), |g| {
        existing_of(g, name) == size(name)
    })
    .await;
    let until = Instant::now() + Duration::from_secs(secs);
    let g = poll(
        pods,
        size,
        secs + 30,
        &format!("{name} stays unbound"),
        |_| Instant::now() > until,
    )
    .await;
    assert_eq!(bound_of(&g, name), 0, "{name}: {g:?}");
}

/// The e2e control plane with kube-controller-manager, the operator
/// `start` starts, two 8-GPU nodes, queues `a` and `b` of equal weight and
/// gpusched.
struct Bed {
    c: Cluster,
    kcm: Proc,
    op: Proc,
    pods: Api<Pod>,
    s: RunningScheduler,
}

impl Bed {
    async fn up(op: &str) -> Bed {
        let c = Cluster::up().await;
        let kcm = kube_controller_manager(&c);
        let op = match op {
            "kuberay" => kuberay(&c).await,
            "training-operator" => training_operator(&c).await,
            _ => mpi_operator(&c).await,
        };
        c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
        c.queue("a", json!({"weight": 1})).await;
        c.queue("b", json!({"weight": 1})).await;
        let pods = c.pods("ml");
        let s = c.scheduler(opts()).await;
        Bed {
            c,
            kcm,
            op,
            pods,
            s,
        }
    }

    /// `toobig` (created by the caller) waits whole while the workloads in
    /// `first` (`(apiVersion, kind, name)`) hold the GPUs, starts whole
    /// once they are deleted, and goes; then two queues share (`share`
    /// makes a workload of 8 GPUs); no GPU is ever held twice.
    async fn toobig_waits_then_queues_share(
        mut self,
        size: &dyn Fn(&str) -> usize,
        toobig: (&str, &str),
        first: &[(&str, &str, &str)],
        share: &dyn Fn(&str, &str) -> Value,
    ) {
        let pods = &self.pods;
        stays_whole_or_nothing(pods, size, "toobig", 10).await;
        for (api, kind, name) in first {
            delete_workload(&self.c.client, "ml", api, kind, name).await;
        }
        poll(
            pods,
            size,
            120,
            "toobig starts once the others are gone",
            |g| bound_of(g, "toobig") == size("toobig"),
        )
        .await;
        delete_workload(&self.c.client, "ml", toobig.0, toobig.1, "toobig").await;
        poll(pods, size, 120, "all gone", |g| g.is_empty()).await;
        queues_share(&self.c, pods, share, size).await;
        assert_no_double_booking(&self.c.client).await;
        self.kcm.check();
        self.op.check();
        self.s.stop().await;
    }
}

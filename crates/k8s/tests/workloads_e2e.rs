//! Gangs of the real workload controllers: JobSet v0.12.0 and
//! LeaderWorkerSet v0.9.0, built from their Go modules (e2e/cluster/build),
//! with their webhooks served on loopback from a self-signed certificate,
//! their CRDs and webhook manifests from the same module versions, and
//! kube-controller-manager (Jobs, StatefulSets, garbage collection) on the
//! e2e control plane. For each kind: a workload that fits starts all its
//! pods; one that does not fit starts none; no gang is ever partly bound at
//! any poll; two queues share.

mod common;

use common::controllers::*;
use common::*;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    JobSet,
    Lws,
}

impl Kind {
    fn component(self) -> &'static str {
        match self {
            Kind::JobSet => "jobset",
            Kind::Lws => "lws",
        }
    }
    /// The label the controller's pod webhooks select on (their
    /// kustomize patch adds it as the objectSelector).
    fn pod_label(self) -> &'static str {
        match self {
            Kind::JobSet => "jobset.sigs.k8s.io/jobset-name",
            Kind::Lws => "leaderworkerset.sigs.k8s.io/name",
        }
    }
    fn config_api(self) -> &'static str {
        match self {
            Kind::JobSet => "config.jobset.x-k8s.io/v1alpha1",
            Kind::Lws => "config.lws.x-k8s.io/v1alpha1",
        }
    }
    /// CRD and webhook manifests under the module's `config/`.
    fn crd_dir(self) -> &'static str {
        match self {
            Kind::JobSet => "config/components/crd/bases",
            Kind::Lws => "config/crd/bases",
        }
    }
    fn webhooks(self) -> &'static str {
        match self {
            Kind::JobSet => "config/components/webhook/manifests.yaml",
            Kind::Lws => "config/webhook/manifests.yaml",
        }
    }
}

/// configurations from the module's manifests pointed at that server.
async fn workload_controller(c: &Cluster, kind: Kind) -> Proc {
    let comp = kind.component();
    let bin = paths()[&format!("GPUSCHED_E2E_{}_BIN", comp.to_uppercase())].clone();
    let home = Path::new(&bin).parent().unwrap().to_path_buf();
    let dir = c.dir.path();
    let crd_files: Vec<PathBuf> = std::fs::read_dir(home.join(kind.crd_dir()))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    install_crds(&c.client, &crd_files).await;
    // serving certificate
    let certs = dir.join(format!("{comp}-certs"));
    let pem = loopback_serving_cert(&certs);
    let port = free_port();
    let probe = free_port();
    let config = dir.join(format!("{comp}-config.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: {}\nkind: Configuration\nleaderElection: {{leaderElect: false}}\n\
             internalCertManagement: {{enable: false}}\n\
             webhook: {{port: {port}, host: 127.0.0.1, certDir: {}}}\n\
             metrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{probe}\"}}\n",
            kind.config_api(),
            certs.display()
        ),
    )
    .unwrap();
    let kc = c.kubeconfig().display().to_string();
    let mut args = vec![
        format!("--kubeconfig={kc}"),
        format!("--config={}", config.display()),
    ];
    if kind == Kind::Lws {
        args.push("--leader-elect=false".into());
    }
    let mut p = Proc::start(dir, comp, &bin, &args);
    // webhook configurations, each webhook sent to the loopback server
    let ca = serde_json::to_value(k8s_openapi::ByteString(pem.into_bytes())).unwrap();
    for mut doc in yaml_docs(&home.join(kind.webhooks())) {
        let name = doc["metadata"]["name"].as_str().unwrap().to_string();
        doc["metadata"] = json!({"name": format!("{comp}-{name}")});
        for w in doc["webhooks"].as_array_mut().unwrap() {
            let path = w["clientConfig"]["service"]["path"]
                .as_str()
                .unwrap()
                .to_string();
            w["clientConfig"] =
                json!({"url": format!("https://127.0.0.1:{port}{path}"), "caBundle": ca});
            if path == "/mutate--v1-pod" || path == "/validate--v1-pod" {
                w["objectSelector"] =
                    json!({"matchExpressions": [{"key": kind.pod_label(), "operator": "Exists"}]});
            }
        }
        create_dynamic(&c.client, &doc).await;
    }
    // ready: the probe answers 200 once its webhook server listens
    until_ready(&mut p, probe, 90).await;
    p
}

fn gpu_container(gpus: u32) -> Value {
    json!({"name": "main", "image": "cuda", "resources": {
        "limits": {"nvidia.com/gpu": gpus.to_string()}, "requests": {"cpu": "100m"}}})
}

fn pod_template(gpus: u32) -> Value {
    json!({"spec": {"schedulerName": "gpusched", "terminationGracePeriodSeconds": 1,
                    "restartPolicy": "Never", "containers": [gpu_container(gpus)]}})
}

/// A JobSet: `(name, replicas, parallelism, gpus per pod)` per replicated
/// job, in queue `queue` (the JobSet's label only: its pods inherit it).
fn jobset(name: &str, queue: &str, rjobs: &[(&str, u32, u32, u32)]) -> Value {
    let rj: Vec<Value> = rjobs
        .iter()
        .map(|&(n, replicas, par, gpus)| {
            json!({"name": n, "replicas": replicas, "template": {"spec": {
                "parallelism": par, "completions": par, "backoffLimit": 0,
                "template": pod_template(gpus)}}})
        })
        .collect();
    json!({"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"replicatedJobs": rj, "network": {"enableDNSHostnames": false}}})
}

/// A LeaderWorkerSet: `replicas` groups of `size` pods of `gpus` GPUs.
fn lws(name: &str, queue: &str, replicas: u32, size: u32, gpus: u32) -> Value {
    let mut t = pod_template(gpus);
    t["spec"]["restartPolicy"] = json!("Always");
    json!({"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"replicas": replicas, "leaderWorkerTemplate": {"size": size, "workerTemplate": t}}})
}

/// The gang of a pod as the test knows it (JobSet name, or
/// LeaderWorkerSet name + group index).
fn gang_of(p: &Pod) -> Option<String> {
    let l = p.metadata.labels.as_ref()?;
    if let Some(j) = l.get("jobset.sigs.k8s.io/jobset-name") {
        return Some(j.clone());
    }
    Some(format!(
        "{}/{}",
        l.get("leaderworkerset.sigs.k8s.io/name")?,
        l.get("leaderworkerset.sigs.k8s.io/group-index")?
    ))
}

/// [`poll_gangs_by`] with this file's gangs.
async fn poll_gangs(
    api: &Api<Pod>,
    size: &dyn Fn(&str) -> usize,
    secs: u64,
    what: &str,
    done: impl Fn(&BTreeMap<String, (usize, usize)>) -> bool,
) -> BTreeMap<String, (usize, usize)> {
    poll_gangs_by(api, &gang_of, size, secs, what, done).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn jobsets_start_whole_or_not_at_all_and_queues_share() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::JobSet).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    c.queue("b", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let sizes: BTreeMap<&str, usize> = [("fits", 4), ("toobig", 3)].into_iter().collect();
    let size = |n: &str| sizes.get(n).copied().unwrap_or(2);
    let s = c.scheduler(opts()).await;
    // 1 × 2 GPUs + 3 × 2 GPUs: all four pods start
    create_workload(
        &c.client,
        "ml",
        jobset("fits", "a", &[("leader", 1, 1, 2), ("workers", 3, 1, 2)]),
    )
    .await;
    poll_gangs(&pods, &size, 120, "fits starts whole", |g| {
        bound_of(g, "fits") == 4
    })
    .await;
    // 3 × 4 GPUs with 8 free: none starts, while its pods all exist
    create_workload(&c.client, "ml", jobset("toobig", "a", &[("w", 3, 1, 4)])).await;
    poll_gangs(&pods, &size, 60, "toobig's pods exist", |g| {
        existing_of(g, "toobig") == 3
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    poll_gangs(&pods, &size, 30, "toobig stays unbound", |g| {
        assert_eq!(bound_of(g, "toobig"), 0, "{g:?}");
        Instant::now() > until
    })
    .await;
    // the space frees: now it starts, whole
    delete_workload(
        &c.client,
        "ml",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "fits",
    )
    .await;
    poll_gangs(&pods, &size, 120, "toobig starts once fits is gone", |g| {
        bound_of(g, "toobig") == 3 && existing_of(g, "fits") == 0
    })
    .await;
    delete_workload(
        &c.client,
        "ml",
        "jobset.x-k8s.io/v1alpha2",
        "JobSet",
        "toobig",
    )
    .await;
    poll_gangs(&pods, &size, 120, "all gone", |g| g.is_empty()).await;
    kcm.check();
    ctl.check();
    // two queues, four 4-GPU JobSets each, all pending before the scheduler
    // looks: each queue gets half of the 16 GPUs, in whole JobSets
    s.stop().await;
    for q in ["a", "b"] {
        for i in 0..4 {
            create_workload(
                &c.client,
                "ml",
                jobset(&format!("{q}{i}"), q, &[("w", 2, 1, 2)]),
            )
            .await;
        }
    }
    poll_gangs(&pods, &size, 120, "sixteen pods exist", |g| {
        g.values().map(|x| x.1).sum::<usize>() == 16
    })
    .await;
    let s = c.scheduler(opts()).await;
    let g = poll_gangs(&pods, &size, 120, "the cluster fills", |g| {
        g.values().map(|x| x.0).sum::<usize>() == 8
    })
    .await;
    let running = |q: char| {
        g.iter()
            .filter(|(n, x)| n.starts_with(q) && x.0 > 0)
            .count()
    };
    assert_eq!((running('a'), running('b')), (2, 2), "{g:?}");
    // and it stays so
    let until = Instant::now() + Duration::from_secs(5);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(g2.values().map(|x| x.0).sum::<usize>(), 8, "{g2:?}");
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn leader_worker_groups_start_whole_or_not_at_all_and_queues_share() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::Lws).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    c.queue("b", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let size = |n: &str| match n.split('/').next().unwrap_or("") {
        "serve" | "toobig" => 3,
        _ => 2,
    };
    let s = c.scheduler(opts()).await;
    // two groups of 3 × 2 GPUs: both start, whole
    create_workload(&c.client, "ml", lws("serve", "a", 2, 3, 2)).await;
    poll_gangs(&pods, &size, 120, "serve starts", |g| {
        bound_of(g, "serve/0") == 3 && bound_of(g, "serve/1") == 3
    })
    .await;
    // two groups of 2 × 2 GPUs with 4 free: exactly one starts (replicas are
    // independent gangs), the other starts none
    create_workload(&c.client, "ml", lws("pair", "a", 2, 2, 2)).await;
    let g = poll_gangs(&pods, &size, 120, "one pair group starts", |g| {
        existing_of(g, "pair/0") == 2
            && existing_of(g, "pair/1") == 2
            && bound_of(g, "pair/0") + bound_of(g, "pair/1") == 2
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(
        bound_of(&g2, "pair/0") + bound_of(&g2, "pair/1"),
        2,
        "{g:?} {g2:?}"
    );
    // a group that can never fit now: none of its pods starts
    create_workload(&c.client, "ml", lws("toobig", "a", 1, 3, 4)).await;
    poll_gangs(&pods, &size, 60, "toobig's pods exist", |g| {
        existing_of(g, "toobig/0") == 3
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    poll_gangs(&pods, &size, 30, "toobig stays unbound", |g| {
        assert_eq!(bound_of(g, "toobig/0"), 0, "{g:?}");
        Instant::now() > until
    })
    .await;
    for n in ["serve", "pair", "toobig"] {
        delete_workload(
            &c.client,
            "ml",
            "leaderworkerset.x-k8s.io/v1",
            "LeaderWorkerSet",
            n,
        )
        .await;
    }
    poll_gangs(&pods, &size, 120, "all gone", |g| g.is_empty()).await;
    kcm.check();
    ctl.check();
    // two queues, four groups of 2 × 2 GPUs each, all pending before the
    // scheduler looks: each queue gets half of the GPUs, in whole groups
    s.stop().await;
    create_workload(&c.client, "ml", lws("qa", "a", 4, 2, 2)).await;
    create_workload(&c.client, "ml", lws("qb", "b", 4, 2, 2)).await;
    poll_gangs(&pods, &size, 120, "sixteen pods exist", |g| {
        g.values().map(|x| x.1).sum::<usize>() == 16
    })
    .await;
    let s = c.scheduler(opts()).await;
    let g = poll_gangs(&pods, &size, 120, "the cluster fills", |g| {
        g.values().map(|x| x.0).sum::<usize>() == 16 / 2
    })
    .await;
    let running = |q: &str| {
        g.iter()
            .filter(|(n, x)| n.starts_with(q) && x.0 > 0)
            .count()
    };
    assert_eq!((running("qa/"), running("qb/")), (2, 2), "{g:?}");
    let until = Instant::now() + Duration::from_secs(5);
    let g2 = poll_gangs(&pods, &size, 30, "steady", |_| Instant::now() > until).await;
    assert_eq!(g2.values().map(|x| x.0).sum::<usize>(), 8, "{g2:?}");
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

/// The pods of a JobSet's restart attempt `attempt` that are bound and
/// running.
async fn attempt_running(pods: &Api<Pod>, jobset: &str, attempt: &str) -> usize {
    pods.list(&kube::api::ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|p| {
            let l = p.metadata.labels.clone().unwrap_or_default();
            l.get("jobset.sigs.k8s.io/jobset-name").map(String::as_str) == Some(jobset)
                && l.get("jobset.sigs.k8s.io/restart-attempt")
                    .map(String::as_str)
                    == Some(attempt)
        })
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some())
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn a_failed_jobset_member_restarts_the_jobset_as_a_new_whole_gang() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::JobSet).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let size = |_: &str| 3;
    let s = c.scheduler(opts()).await;
    // 3 pods × 4 GPUs, a Job failing at its first failed pod, the JobSet
    // restarting at most twice
    let mut js = jobset("r", "a", &[("w", 3, 1, 4)]);
    js["spec"]["failurePolicy"] = json!({"maxRestarts": 2});
    create_workload(&c.client, "ml", js).await;
    poll_gangs(&pods, &size, 120, "attempt 0 starts whole", |g| {
        bound_of(g, "r") == 3
    })
    .await;
    wait_for(Duration::from_secs(60), || async {
        (attempt_running(&pods, "r", "0").await == 3).then_some(())
    })
    .await
    .expect("attempt 0 runs");
    // one member fails: its Job fails, the JobSet controller deletes every
    // Job and makes them again as attempt 1 — a new gang, placed whole
    let victim = bound(&pods)
        .await
        .into_keys()
        .next()
        .expect("a bound member");
    pods.patch(
        &victim,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"metadata": {"annotations": {"gpusched.io/e2e-fail-exit-code": "1"}}}),
        ),
    )
    .await
    .unwrap();
    // only attempt 1's pods: attempt 0 is partly bound while it is torn down
    fn attempt_1(p: &Pod) -> Option<String> {
        let l = p.metadata.labels.as_ref()?;
        (l.get("jobset.sigs.k8s.io/restart-attempt")? == "1")
            .then(|| l.get("jobset.sigs.k8s.io/jobset-name").cloned())?
    }
    poll_gangs_by(
        &pods,
        &attempt_1,
        &size,
        120,
        "attempt 1 starts whole",
        |g| bound_of(g, "r") == 3,
    )
    .await;
    wait_for(Duration::from_secs(120), || async {
        (attempt_running(&pods, "r", "1").await == 3).then_some(())
    })
    .await
    .expect("the JobSet restarted as attempt 1, all three members running");
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

/// Kubeflow Trainer v2's controller manager: its CRDs, the upstream
/// `torch-distributed` ClusterTrainingRuntime with `schedulerName:
/// gpusched` added to its pod template (what a platform team running
/// gpusched does to its runtimes: a TrainJob cannot name a scheduler), its
/// webhook server on loopback from a certificate the test makes (certificate
/// management off; the trainer reads it from controller-runtime's fixed
/// directory). Its webhook configurations are not registered: the trainer
/// validates, it does not default.
async fn trainer(c: &Cluster) -> Proc {
    let bin = paths()["GPUSCHED_E2E_TRAINER_BIN"].clone();
    let home = Path::new(&bin).parent().unwrap().to_path_buf();
    let crd_files: Vec<PathBuf> = std::fs::read_dir(home.join("config/base/crds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    install_crds(&c.client, &crd_files).await;
    loopback_serving_cert(Path::new("/tmp/k8s-webhook-server/serving-certs"));
    let dir = c.dir.path();
    let probe = free_port();
    let config = dir.join("trainer-config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: config.trainer.kubeflow.org/v1alpha1\nkind: Configuration\n\
             leaderElection: {{leaderElect: false}}\ncertManagement: {{enable: false}}\n\
             webhook: {{port: {}, host: 127.0.0.1}}\nmetrics: {{bindAddress: \"0\"}}\n\
             health: {{healthProbeBindAddress: \"127.0.0.1:{probe}\"}}\n",
            free_port()
        ),
    )
    .unwrap();
    let mut p = Proc::start(
        dir,
        "trainer",
        &bin,
        &[
            format!("--kubeconfig={}", c.kubeconfig().display()),
            format!("--config={}", config.display()),
        ],
    );
    for mut rt in yaml_docs(&home.join("config/base/runtimes/torch_distributed.yaml")) {
        let pod = &mut rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
            ["spec"];
        pod["schedulerName"] = json!("gpusched");
        pod["terminationGracePeriodSeconds"] = json!(1);
        create_dynamic(&c.client, &rt).await;
    }
    until_ready(&mut p, probe, 90).await;
    p
}

/// A TrainJob on the `torch-distributed` runtime: `nodes` trainer nodes of
/// `gpus` GPUs, in queue `queue` (its labels reach the JobSet).
fn train_job(name: &str, queue: &str, nodes: u32, gpus: u32) -> Value {
    json!({"apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
           "metadata": {"name": name, "labels": {"gpusched.io/queue": queue}},
           "spec": {"runtimeRef": {"name": "torch-distributed"},
                    "labels": {"gpusched.io/queue": queue},
                    "trainer": {"numNodes": nodes,
                                "resourcesPerNode": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn train_jobs_start_whole_or_not_at_all_through_their_jobsets() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut js = workload_controller(&c, Kind::JobSet).await;
    let mut tr = trainer(&c).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let size = |n: &str| if n == "fits" { 3 } else { 2 };
    let s = c.scheduler(opts()).await;
    // 3 nodes × 4 GPUs: starts whole
    create_workload(&c.client, "ml", train_job("fits", "a", 3, 4)).await;
    poll_gangs(&pods, &size, 120, "fits starts whole", |g| {
        bound_of(g, "fits") == 3
    })
    .await;
    // 2 nodes × 4 GPUs with 4 free: none starts until fits is gone
    create_workload(&c.client, "ml", train_job("toobig", "a", 2, 4)).await;
    poll_gangs(&pods, &size, 120, "toobig's pods exist", |g| {
        existing_of(g, "toobig") == 2
    })
    .await;
    let until = Instant::now() + Duration::from_secs(8);
    poll_gangs(&pods, &size, 30, "toobig stays unbound", |g| {
        assert_eq!(bound_of(g, "toobig"), 0, "{g:?}");
        Instant::now() > until
    })
    .await;
    delete_workload(
        &c.client,
        "ml",
        "trainer.kubeflow.org/v1alpha1",
        "TrainJob",
        "fits",
    )
    .await;
    poll_gangs(&pods, &size, 120, "toobig starts once fits is gone", |g| {
        bound_of(g, "toobig") == 2
    })
    .await;
    // the pods are the JobSet's the trainer made for the TrainJob
    for p in bound(&pods).await.values() {
        let l = p.metadata.labels.clone().unwrap_or_default();
        assert_eq!(
            l.get("jobset.sigs.k8s.io/jobset-name").map(String::as_str),
            Some("toobig")
        );
    }
    assert_no_double_booking(&c.client).await;
    kcm.check();
    js.check();
    tr.check();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore = "needs the e2e control plane and the workload controllers: e2e/run"]
async fn a_restarted_leader_worker_member_recreates_its_group_as_a_whole_gang() {
    let c = Cluster::up().await;
    let mut kcm = kube_controller_manager(&c);
    let mut ctl = workload_controller(&c, Kind::Lws).await;
    c.nodes_from_yaml(H100).await; // 2 × 8 GPUs
    c.queue("a", json!({"weight": 1})).await;
    let pods = c.pods("ml");
    let size = |_: &str| 3;
    let s = c.scheduler(opts()).await;
    // one group of 3 × 4 GPUs (restartPolicy RecreateGroupOnPodRestart,
    // the default)
    create_workload(&c.client, "ml", lws("g", "a", 1, 3, 4)).await;
    poll_gangs(&pods, &size, 120, "the group starts whole", |g| {
        bound_of(g, "g/0") == 3
    })
    .await;
    let before: BTreeMap<String, String> = bound(&pods)
        .await
        .into_iter()
        .map(|(n, p)| (n, p.metadata.uid.unwrap()))
        .collect();
    // a worker's container restarts (what the kubelet reports after a
    // crash): the controller deletes the leader, and the whole group is
    // made again — placed whole, every member new
    let worker = before
        .keys()
        .find(|n| n.matches('-').count() >= 2)
        .expect("a worker pod (name <set>-<group>-<index>)")
        .clone();
    let mut status = pods.get_status(&worker).await.unwrap().status.unwrap();
    for cs in status.container_statuses.iter_mut().flatten() {
        cs.restart_count = 1;
    }
    pods.patch_status(
        &worker,
        &kube::api::PatchParams::default(),
        &kube::api::Patch::Merge(
            json!({"status": {"containerStatuses": status.container_statuses}}),
        ),
    )
    .await
    .unwrap();
    let all_new = wait_for(Duration::from_secs(120), || async {
        let now = bound(&pods).await;
        let fresh = now
            .iter()
            .filter(|(n, p)| before.get(*n) != p.metadata.uid.as_ref())
            .filter(|(_, p)| p.metadata.deletion_timestamp.is_none())
            .count();
        (fresh == 3).then_some(())
    })
    .await;
    assert!(
        all_new.is_some(),
        "the group was not recreated whole: {:?}",
        gangs(&pods, &gang_of).await
    );
    poll_gangs(&pods, &size, 30, "the new group is whole", |g| {
        bound_of(g, "g/0") == 3
    })
    .await;
    assert_no_double_booking(&c.client).await;
    kcm.check();
    ctl.check();
    s.stop().await;
}

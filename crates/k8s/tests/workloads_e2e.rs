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
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let certs = dir.join(format!("{comp}-certs"));
    std::fs::create_dir_all(&certs).unwrap();
    let pem = cert.cert.pem();
    std::fs::write(certs.join("tls.crt"), &pem).unwrap();
    std::fs::write(certs.join("tls.key"), cert.signing_key.serialize_pem()).unwrap();
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
    let t0 = Instant::now();
    while !ready(probe) {
        p.check();
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "{comp} not ready in 90 s; log {}",
            p.log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
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

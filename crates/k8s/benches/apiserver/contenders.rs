//! The contenders: gpusched (in-process or a process), kube-scheduler, the
//! round-robin binder.

use super::*;

/// The ceiling: binds every pending pod of `schedulerName: bench-rr` to the
/// next node in turn, deciding nothing.
pub(crate) fn start_rr(
    client: &Client,
    nodes: Vec<String>,
    qps: f64,
    burst: u32,
    conc: usize,
    events: bool,
) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let recorder = kube::runtime::events::Recorder::new(
        client.clone(),
        kube::runtime::events::Reporter {
            controller: "bench-rr".into(),
            instance: None,
        },
    );
    tokio::spawn(async move {
        let limit = Arc::new(Limiter::new(qps, burst));
        let slots = Arc::new(tokio::sync::Semaphore::new(conc));
        let mut next = 0usize;
        let mut sent: std::collections::HashSet<String> = Default::default();
        let cfg = watcher::Config::default().fields("spec.nodeName=");
        let mut s = watcher::watcher(api.clone(), cfg).boxed();
        while let Some(ev) = s.next().await {
            let p = match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => p,
                _ => continue,
            };
            let name = p.metadata.name.clone().unwrap_or_default();
            if !sent.insert(name.clone()) {
                continue;
            }
            let node = nodes[next % nodes.len()].clone();
            next += 1;
            let permit = slots.clone().acquire_owned().await.unwrap();
            let api = api.clone();
            let limit = limit.clone();
            let recorder = recorder.clone();
            let uid = p.metadata.uid.clone();
            tokio::spawn(async move {
                let _permit = permit;
                limit.acquire().await;
                let b = Binding {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.clone()),
                        namespace: Some(NS.into()),
                        ..Default::default()
                    },
                    target: ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Node".into()),
                        name: Some(node.clone()),
                        ..Default::default()
                    },
                };
                let r = api
                    .create_subresource::<Binding, Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &b,
                    )
                    .await;
                if let Err(e) = r {
                    eprintln!("rr bind {name}: {e}");
                } else if events {
                    // the same second write per pod gpusched and
                    // kube-scheduler make: a Scheduled event
                    limit.acquire().await;
                    let ev = kube::runtime::events::Event {
                        type_: kube::runtime::events::EventType::Normal,
                        reason: "Scheduled".into(),
                        note: Some(format!("Successfully assigned {NS}/{name} to {node}")),
                        action: "Binding".into(),
                        secondary: None,
                    };
                    let r = ObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        namespace: Some(NS.into()),
                        name: Some(name.clone()),
                        uid,
                        ..Default::default()
                    };
                    let _ = recorder.publish(&ev, &r).await;
                }
            });
        }
    })
}

pub(crate) enum Running {
    InProcess {
        stop: tokio::sync::oneshot::Sender<()>,
        thread: std::thread::JoinHandle<()>,
        metrics_port: u16,
    },
    Process {
        child: Child,
        metrics_port: Option<u16>,
    },
    Task(tokio::task::JoinHandle<()>),
}

impl Running {
    pub(crate) fn pid(&self) -> Option<u32> {
        match self {
            Running::Process { child, .. } => Some(child.id()),
            _ => None,
        }
    }

    pub(crate) async fn stop(self) {
        match self {
            Running::InProcess { stop, thread, .. } => {
                let _ = stop.send(());
                let _ = tokio::task::spawn_blocking(move || thread.join()).await;
            }
            Running::Process { mut child, .. } => {
                unsafe_kill(child.id());
                let _ = child.wait();
            }
            Running::Task(t) => t.abort(),
        }
    }
}

pub(crate) fn unsafe_kill(pid: u32) {
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

pub(crate) async fn start_contender(
    a: &Args,
    c: &Cluster,
    who: &str,
    qps: f64,
    nodes: &[String],
) -> (Running, Instant) {
    let burst = (qps * 2.0).max(1.0) as u32;
    match who {
        "gpusched" => {
            let port = free_port();
            if let Some(bin) = &a.gpusched_bin {
                let log = std::fs::File::create(c.dir.path().join("gpusched.log")).unwrap();
                let child = Command::new(bin)
                    .args(["scheduler", "--kubeconfig", &c.kubeconfig()])
                    .args(["--http-addr", &format!("127.0.0.1:{port}")])
                    .args(["--kube-api-qps", &qps.to_string()])
                    .args(["--kube-api-burst", &burst.to_string()])
                    .args(["--bind-concurrency", &a.bind_concurrency.to_string()])
                    .args(
                        std::env::var("GPUSCHED_BENCH_ARGS")
                            .unwrap_or_default()
                            .split_whitespace(),
                    )
                    .stdin(Stdio::null())
                    .stdout(log.try_clone().unwrap())
                    .stderr(log)
                    .spawn()
                    .expect("gpusched binary");
                let t = Instant::now();
                wait_ready(port).await;
                (
                    Running::Process {
                        child,
                        metrics_port: Some(port),
                    },
                    t,
                )
            } else {
                let kubeconfig = c.kubeconfig();
                let opts = Options {
                    http_addr: Some(([127, 0, 0, 1], port).into()),
                    exec: ExecOptions {
                        qps,
                        burst,
                        bind_concurrency: a.bind_concurrency,
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let (tx, rx) = tokio::sync::oneshot::channel::<()>();
                let t = Instant::now();
                // its own runtime, so every task it spawned (watches,
                // writes) dies with it at the end of the row
                let thread = std::thread::spawn(move || {
                    let rt = tokio::runtime::Builder::new_multi_thread()
                        .worker_threads(2)
                        .enable_all()
                        .build()
                        .unwrap();
                    rt.block_on(async move {
                        let client = client_for(&kubeconfig).await;
                        if let Err(e) = controller::run_with_client(client, opts, async {
                            let _ = rx.await;
                        })
                        .await
                        {
                            eprintln!("gpusched: {e:#}");
                        }
                    });
                    rt.shutdown_timeout(Duration::from_secs(1));
                });
                wait_ready(port).await;
                (
                    Running::InProcess {
                        stop: tx,
                        thread,
                        metrics_port: port,
                    },
                    t,
                )
            }
        }
        "kube-scheduler" => {
            let bin = ks_bin();
            let (q, b) = if qps > 0.0 {
                (qps, burst as f64)
            } else {
                (5000.0, 10000.0)
            };
            let cfg = c.dir.path().join("kube-scheduler-bench.yaml");
            std::fs::write(
                &cfg,
                format!(
                    "apiVersion: kubescheduler.config.k8s.io/v1\nkind: KubeSchedulerConfiguration\nclientConnection:\n  kubeconfig: {}\n  qps: {q}\n  burst: {b}\nleaderElection:\n  leaderElect: false\n",
                    c.kubeconfig()
                ),
            )
            .unwrap();
            let port = free_port();
            let log = std::fs::File::create(c.dir.path().join("kube-scheduler-bench.log")).unwrap();
            let kc = c.kubeconfig();
            let child = Command::new(bin)
                .arg(format!("--config={}", cfg.display()))
                .args(["--authentication-kubeconfig", &kc])
                .args(["--authorization-kubeconfig", &kc])
                .args(["--bind-address", "127.0.0.1"])
                .args(["--secure-port", &port.to_string()])
                .arg(format!(
                    "--cert-dir={}",
                    c.dir.path().join("ks-certs").display()
                ))
                .stdin(Stdio::null())
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("kube-scheduler");
            let t = Instant::now();
            // ready: /healthz ok over TLS (curl, as the cluster script does)
            let t0 = Instant::now();
            loop {
                let out = Command::new("curl")
                    .args(["-ksS", "--max-time", "2"])
                    .arg(format!("https://127.0.0.1:{port}/healthz"))
                    .output();
                if out.is_ok_and(|o| o.stdout == b"ok") {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(60),
                    "kube-scheduler not healthy"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            (
                Running::Process {
                    child,
                    metrics_port: None,
                },
                t,
            )
        }
        "rr" | "rr-ev" => {
            let t = Instant::now();
            (
                Running::Task(start_rr(
                    &c.client,
                    nodes.to_vec(),
                    qps,
                    burst,
                    a.bind_concurrency,
                    who == "rr-ev",
                )),
                t,
            )
        }
        other => panic!("unknown contender {other}"),
    }
}

pub(crate) fn ks_bin() -> String {
    let out = Command::new(repo_root().join("e2e/cluster/paths"))
        .output()
        .expect("e2e/cluster/paths");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("GPUSCHED_E2E_KUBE_SCHEDULER_BIN="))
        .expect("kube-scheduler binary (e2e/cluster/build)")
        .to_string()
}

pub(crate) async fn wait_ready(port: u16) {
    let t0 = Instant::now();
    loop {
        if http_get(port, "/readyz")
            .await
            .is_some_and(|b| b.starts_with("ready"))
        {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "gpusched not ready");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

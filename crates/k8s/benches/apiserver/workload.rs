//! The pods of a row: the seeded workload (single or gang mix, queues), the
//! creator and the watch that records when each pod is bound.

use super::*;

/// A tiny deterministic generator (no rand dependency for a bench).
pub(crate) struct Lcg(pub(crate) u64);

impl Lcg {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }
}

/// A pod to create: its name and its pod group, if any.
pub(crate) type PodSpec = (String, Option<String>);

/// The workload: pods (name, group) and groups (name, size). `gang`: 60 %
/// of the pods in groups of 8–32 (the last group may be smaller); a group's
/// members are created consecutively, as a job controller would, with
/// singles interleaved between groups in proportion (40:60).
pub(crate) fn workload(pods: usize, gang: bool) -> (Vec<PodSpec>, Vec<(String, usize)>) {
    let mut out = Vec::with_capacity(pods);
    let mut groups = Vec::new();
    if !gang {
        for i in 0..pods {
            out.push((format!("p-{i}"), None));
        }
        return (out, groups);
    }
    let mut rng = Lcg(42);
    let gang_pods = pods * 6 / 10;
    let mut g = 0;
    let mut placed = 0;
    let mut singles = 0;
    // interleave: after each group, singles in proportion (40:60)
    while placed < gang_pods {
        let size = (8 + (rng.next() % 25) as usize).min(gang_pods - placed);
        let name = format!("g-{g}");
        for m in 0..size {
            out.push((format!("{name}-{m}"), Some(name.clone())));
        }
        groups.push((name, size));
        placed += size;
        g += 1;
        let want_singles = (placed * 4).div_ceil(6).min(pods - gang_pods);
        while singles < want_singles {
            out.push((format!("s-{singles}"), None));
            singles += 1;
        }
    }
    while singles < pods - gang_pods {
        out.push((format!("s-{singles}"), None));
        singles += 1;
    }
    (out, groups)
}

/// The queue of a pod (`--queues N`): by its gang's name, else its own, so a
/// gang's members share one queue; a stable hash, the same for every row.
pub(crate) fn queue_of(name: &str, group: Option<&str>, queues: usize) -> Option<String> {
    if queues == 0 {
        return None;
    }
    let key = group.unwrap_or(name);
    let h = key.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    Some(format!("q-{}", h % queues as u64))
}

/// Creates the Queues q-0..q-`n`-1, equal weights, borrowing allowed.
pub(crate) async fn make_queues(client: &Client, n: usize) {
    let api: Api<Queue> = Api::all(client.clone());
    for i in 0..n {
        let q: Queue = serde_json::from_value(json!({
            "apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
            "metadata": {"name": format!("q-{i}")},
            "spec": {"weight": 1, "borrow": true}}))
        .unwrap();
        api.create(&PostParams::default(), &q).await.unwrap();
    }
}

pub(crate) fn pod_json(
    name: &str,
    group: Option<&str>,
    queue: Option<&str>,
    scheduler: &str,
) -> Value {
    let mut labels = json!({"app": "bench"});
    if let Some(g) = group {
        labels["gpusched.io/pod-group"] = json!(g);
    }
    if let Some(q) = queue {
        labels["gpusched.io/queue"] = json!(q);
    }
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels},
        "spec": {"schedulerName": scheduler, "terminationGracePeriodSeconds": 0, "containers": [{
            "name": "main", "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "1"}, "requests": {"cpu": "100m", "memory": "128Mi"}}}]}
    })
}

/// Watch-observed bind times, by pod name.
#[derive(Default)]
pub(crate) struct Seen {
    pub(crate) bound: Mutex<HashMap<String, Instant>>,
    pub(crate) count: AtomicUsize,
}

pub(crate) fn start_watch(client: &Client, seen: Arc<Seen>) -> tokio::task::JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    tokio::spawn(async move {
        let cfg = watcher::Config::default();
        let mut s = watcher::watcher(api, cfg).boxed();
        while let Some(ev) = s.next().await {
            let now = Instant::now();
            let pods: Vec<Pod> = match ev {
                Ok(watcher::Event::Apply(p)) | Ok(watcher::Event::InitApply(p)) => vec![p],
                _ => continue,
            };
            for p in pods {
                if p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_none() {
                    continue;
                }
                let name = p.metadata.name.clone().unwrap_or_default();
                let mut b = seen.bound.lock().unwrap();
                if let std::collections::hash_map::Entry::Vacant(e) = b.entry(name) {
                    e.insert(now);
                    seen.count.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    })
}

/// Creates the pods (and PodGroups first); returns create-completion times
/// by name, the start instant and seconds taken.
pub(crate) async fn create_pods(
    client: &Client,
    pods: &[PodSpec],
    groups: &[(String, usize)],
    scheduler: &str,
    conc: usize,
    queues: usize,
) -> (HashMap<String, Instant>, Instant, f64) {
    if scheduler == "gpusched" {
        let api: Api<PodGroup> = Api::namespaced(client.clone(), NS);
        futures::stream::iter(groups)
            .for_each_concurrent(conc, |(name, size)| {
                let api = api.clone();
                let queue = queue_of(name, Some(name), queues);
                async move {
                    let g: PodGroup = serde_json::from_value(json!({
                        "apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
                        "metadata": {"name": name, "namespace": NS},
                        "spec": {"minMember": size, "queue": queue}}))
                    .unwrap();
                    api.create(&PostParams::default(), &g).await.unwrap();
                }
            })
            .await;
    }
    let api: Api<Pod> = Api::namespaced(client.clone(), NS);
    let done: Arc<Mutex<HashMap<String, Instant>>> = Arc::new(Mutex::new(HashMap::new()));
    let t0 = Instant::now();
    futures::stream::iter(pods)
        .for_each_concurrent(conc, |(name, group)| {
            let api = api.clone();
            let done = done.clone();
            // kube-scheduler and rr get the same pods without gang semantics
            let group = if scheduler == "gpusched" {
                group.as_deref()
            } else {
                None
            };
            let queue = queue_of(name, group, queues);
            let obj: Pod =
                serde_json::from_value(pod_json(name, group, queue.as_deref(), scheduler)).unwrap();
            async move {
                let mut tries = 0;
                loop {
                    match api.create(&PostParams::default(), &obj).await {
                        Ok(_) => break,
                        Err(e) if tries < 5 => {
                            tries += 1;
                            eprintln!("create {name}: {e} (retrying)");
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => panic!("create {name}: {e}"),
                    }
                }
                done.lock().unwrap().insert(name.clone(), Instant::now());
            }
        })
        .await;
    let secs = t0.elapsed().as_secs_f64();
    let m = std::mem::take(&mut *done.lock().unwrap());
    (m, t0, secs)
}

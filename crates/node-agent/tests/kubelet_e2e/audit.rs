//! The audit of a real node: every container's GPUs against the scheduler's
//! decisions, the agent's published allocations and exclusivity; reclaiming
//! and the doctor's verdict after a test.

use super::*;

/// What the containers of the live pods on the node hold, checked.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    /// Pods whose containers hold other GPUs than decided (same size).
    pub(crate) swaps: Vec<String>,
    /// Violations: a GPU held twice, a share over a GPU, a wrong size, a
    /// swap not published, a container without its env.
    pub(crate) errors: Vec<String>,
    /// Whole GPUs / share GPUs in use, by UUID.
    pub(crate) whole: BTreeMap<String, String>,
    pub(crate) shares: BTreeMap<String, u32>,
    /// GPUs each pod's containers hold (whole) or its share GPU, by pod name.
    pub(crate) held: BTreeMap<String, Vec<String>>,
}

impl Audit {
    pub(crate) fn double(&self) -> usize {
        self.errors
            .iter()
            .filter(|e| e.starts_with("held twice"))
            .count()
    }
}

pub(crate) fn visible(r: &Record) -> Vec<String> {
    r.env
        .get("NVIDIA_VISIBLE_DEVICES")
        .map(|v| v.split(',').map(String::from).collect())
        .unwrap_or_default()
}

/// Checks every live pod of `pods` (Running, with a decision) against the
/// runtime's records and the agent's published allocations.
pub(crate) fn audit(
    pods: &[Pod],
    records: &BTreeMap<(String, String), Record>,
    alloc: &NodeAllocations,
) -> Audit {
    let mut a = Audit::default();
    let published: BTreeMap<&str, &gpusched_model::protocol::PodAllocation> =
        alloc.pods.iter().map(|p| (p.uid.as_str(), p)).collect();
    for p in pods {
        if phase(p) != "Running" {
            continue;
        }
        let name = p.metadata.name.clone().unwrap();
        let uid = p.metadata.uid.clone().unwrap();
        let d = decision(p);
        let spec = p.spec.as_ref().unwrap();
        let mut held: BTreeSet<String> = BTreeSet::new();
        let mut share_gpu: Option<(String, u32)> = None;
        let all = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter());
        for c in all {
            let limits = c
                .resources
                .as_ref()
                .and_then(|r| r.limits.clone())
                .unwrap_or_default();
            let Some(r) = records.get(&(uid.clone(), c.name.clone())) else {
                a.errors
                    .push(format!("{name}/{}: no container created", c.name));
                continue;
            };
            let v = visible(r);
            if let Some(q) = limits.get("nvidia.com/gpu") {
                let n: usize = q.0.parse().unwrap();
                if v.len() != n || v.iter().collect::<BTreeSet<_>>().len() != n {
                    a.errors.push(format!(
                        "{name}/{}: asked {n} GPUs, NVIDIA_VISIBLE_DEVICES={v:?} ({})",
                        c.name, r.id
                    ));
                }
                held.extend(v);
            } else if let Some(q) = limits.get("gpusched.io/gpu-milli") {
                let m: u32 = q.0.parse().unwrap();
                let got = r.env.get("GPUSCHED_GPU_MILLI").cloned().unwrap_or_default();
                if v.len() != 1 || got != m.to_string() {
                    a.errors.push(format!(
                        "{name}/{}: asked {m} milli, NVIDIA_VISIBLE_DEVICES={v:?} GPUSCHED_GPU_MILLI={got:?}",
                        c.name
                    ));
                } else {
                    let (g, sum) = share_gpu.get_or_insert((v[0].clone(), 0));
                    if *g != v[0] {
                        a.errors
                            .push(format!("{name}: containers on two share GPUs"));
                    }
                    *sum += m;
                }
            } else if !v.is_empty() {
                a.errors.push(format!(
                    "{name}/{}: asked no GPU but NVIDIA_VISIBLE_DEVICES={v:?}",
                    c.name
                ));
            }
        }
        let want: BTreeSet<String> = d.gpus.iter().cloned().collect();
        if let Some((g, m)) = share_gpu {
            let dm = d.share.as_ref().map(|s| s.milli).unwrap_or(0);
            if dm != m {
                a.errors
                    .push(format!("{name}: served {m} milli, decided {dm}"));
            }
            if !want.contains(&g) {
                // a same-milli share admitted in another order (docs/protocol.md, shares 4)
                a.swaps
                    .push(format!("{name}: share on {g}, decided {:?}", d.gpus));
            }
            *a.shares.entry(g.clone()).or_default() += m;
            a.held.insert(name.clone(), vec![g]);
        } else {
            if held.len() != want.len() {
                a.errors.push(format!(
                    "{name}: holds {} GPUs {held:?}, decided {}",
                    held.len(),
                    want.len()
                ));
            }
            if held != want {
                a.swaps
                    .push(format!("{name}: holds {held:?}, decided {want:?}"));
                // a swap must be what the agent publishes
                let pubd: BTreeSet<String> = published
                    .get(uid.as_str())
                    .map(|p| p.gpus.iter().cloned().collect())
                    .unwrap_or_default();
                if pubd != held {
                    a.errors.push(format!(
                        "swap not published: {name} holds {held:?}, allocations say {pubd:?}"
                    ));
                }
            }
            for g in &held {
                if let Some(prev) = a.whole.insert(g.clone(), name.clone()) {
                    a.errors
                        .push(format!("held twice: GPU {g} by {prev} and {name}"));
                }
            }
            a.held.insert(name.clone(), held.into_iter().collect());
        }
    }
    for (g, m) in &a.shares {
        if *m > 1000 {
            a.errors
                .push(format!("held twice: GPU {g} shared {m} milli > 1000"));
        }
        if let Some(owner) = a.whole.get(g) {
            a.errors.push(format!(
                "held twice: GPU {g} whole by {owner} and shared ({m} milli)"
            ));
        }
    }
    a
}

/// Audits the live pods of the namespace, retrying a few seconds while
/// only the agent's publication lags (it follows PodResources).
pub(crate) async fn audit_now(c: &Cluster, n: &RealNode) -> Audit {
    let pods = c.pods(NS);
    let t0 = Instant::now();
    loop {
        let list = pods.list(&ListParams::default()).await.unwrap().items;
        let alloc = allocations(c).await.unwrap_or_default();
        let a = audit(&list, &n.records(), &alloc);
        let lagging = a.errors.iter().all(|e| e.starts_with("swap not published"));
        if a.errors.is_empty() || !lagging || t0.elapsed() > Duration::from_secs(15) {
            return a;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Deletes the named pods and waits until they are gone and the agent no
/// longer lists them: the kubelet and the agent gave their devices back.
pub(crate) async fn delete_and_reclaim(c: &Cluster, names: &[String]) {
    let pods = c.pods(NS);
    for n in names {
        let _ = pods.delete(n, &DeleteParams::default()).await;
    }
    let gone = wait_for(Duration::from_secs(60), || async {
        let left: BTreeSet<String> = pods
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter_map(|p| p.metadata.name)
            .filter(|p| names.contains(p))
            .collect();
        let alloc = allocations(c).await.unwrap_or_default();
        let listed = alloc.pods.iter().any(|p| names.contains(&p.name));
        (left.is_empty() && !listed).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "pods {names:?} not deleted and reclaimed within 60 s"
    );
}

/// `gpusched doctor` finds nothing wrong.
pub(crate) async fn doctor_clean(c: &Cluster) {
    let r = wait_for(Duration::from_secs(20), || async {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .ok()?;
        r.healthy.then_some(r)
    })
    .await;
    if r.is_none() {
        let r = gpusched_k8s::tools::doctor::diagnose(
            &c.client,
            &gpusched_k8s::tools::doctor::DoctorOptions::default(),
        )
        .await
        .unwrap();
        panic!("doctor is not clean:\n{}", r.render());
    }
}

pub(crate) fn assert_clean(a: &Audit, what: &str) {
    assert!(a.errors.is_empty(), "{what}: {:#?}", a.errors);
}

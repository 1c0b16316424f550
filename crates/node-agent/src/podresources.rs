//! Reads what the kubelet says each pod holds (PodResources `List`) and
//! rebuilds the served part of the decisions from it after an agent
//! restart (`docs/protocol.md`, *Restart*).

use crate::agent::Agent;
use crate::decisions::HeldPod;
use crate::podresources_api::ListPodResourcesRequest;
use crate::podresources_api::pod_resources_lister_client::PodResourcesListerClient;
use std::collections::BTreeMap;
use std::path::Path;

/// What one pod holds of our resources: resource → device ids.
pub type Held = BTreeMap<(String, String), BTreeMap<String, Vec<String>>>;

/// Calls `List` on the kubelet's PodResources socket.
pub async fn list(socket: &Path) -> Result<Held, String> {
    let ch = crate::server::unix_channel(socket)
        .await
        .map_err(|e| e.to_string())?;
    let resp = PodResourcesListerClient::new(ch)
        .list(ListPodResourcesRequest {})
        .await
        .map_err(|s| format!("PodResources List: {:?}: {}", s.code(), s.message()))?
        .into_inner();
    let mut out = Held::new();
    for p in resp.pod_resources {
        let e = out.entry((p.namespace, p.name)).or_default();
        for c in p.containers {
            for d in c.devices {
                e.entry(d.resource_name).or_default().extend(d.device_ids);
            }
        }
    }
    Ok(out)
}

/// What each listed pod holds of the resources decisions govern (whole
/// GPUs as inventory positions, share tokens counted, time-sliced replicas
/// as their milli).
pub fn held_pods(agent: &Agent, held: &Held) -> BTreeMap<(String, String), HeldPod> {
    let mut out = BTreeMap::new();
    for (key, res) in held {
        let mut h = HeldPod::default();
        for plan in &agent.plans {
            let Some(ids) = res.get(&plan.name) else {
                continue;
            };
            let gpus = ids
                .iter()
                .filter_map(|id| plan.by_id.get(id))
                .map(|&d| plan.units[plan.devices[d].unit].gpu);
            if plan.is_whole_gpu() {
                h.whole.extend(gpus);
            } else if plan.is_share() {
                // Tokens of init containers reused by app containers are
                // listed under each: count each token once.
                let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
                h.milli = h
                    .milli
                    .saturating_add(u32::try_from(distinct.len()).unwrap_or(u32::MAX));
            } else if plan.is_time_sliced_gpu() || plan.is_mig() {
                // replicas or MIG devices, in the decisions' measure
                // (k·⌊1000/N⌋, k·⌊1000·g/G⌋), and the GPU their Allocate
                // named, when it is known
                let distinct: std::collections::BTreeSet<&String> = ids.iter().collect();
                h.milli = h.milli.saturating_add(plan.share_call(distinct.len()).0);
                if plan.is_mig()
                    && let Ok(told) = agent.mig_told.lock()
                {
                    // the instances its containers were told (the ids
                    // themselves when the kubelet took the preference, or
                    // after a restart)
                    h.mig.extend(
                        distinct
                            .iter()
                            .map(|id| told.get(*id).cloned().unwrap_or_else(|| (*id).clone())),
                    );
                }
                if let Ok(told) = agent.replica_told.lock() {
                    let gpus: std::collections::BTreeSet<Option<usize>> =
                        distinct.iter().map(|id| told.get(*id).copied()).collect();
                    if let [Some(g)] = gpus.into_iter().collect::<Vec<_>>()[..] {
                        h.replica_gpu = Some(g);
                    }
                }
            }
        }
        if !h.whole.is_empty() || h.milli > 0 {
            out.insert(key.clone(), h);
        }
    }
    out
}

/// Takes in what the kubelet reports (after a restart: `restart`, shares
/// included). Returns how many pods matched a decision, `None` when the
/// list disagreed with what was served (nothing changed).
pub fn restore(agent: &Agent, held: &Held, restart: bool) -> Option<usize> {
    let coord = agent.coord.get()?;
    let pods = held_pods(agent, held);
    let r = coord.ledger().reconcile(&pods, restart)?;
    for m in &r.moved {
        tracing::info!("PodResources: {m}");
    }
    for h in pods.values() {
        for &g in &h.whole {
            agent.mark_allocated(g);
        }
    }
    Some(r.restored)
}

/// Reads PodResources while no `Allocate` runs and takes it in: the pods
/// the kubelet admitted onto other decisions' GPUs are known by what they
/// hold (`docs/protocol.md`).
pub async fn reconcile(agent: &Agent) -> Result<Option<usize>, String> {
    let Some(coord) = agent.coord.get() else {
        return Ok(None);
    };
    let _serial = coord.serial.lock().await;
    let held = list(&agent.settings.pod_resources_socket).await?;
    let r = restore(agent, &held, false);
    if r.is_some() {
        coord.reconciled.notify_one();
    }
    Ok(r)
}

/// How often PodResources is read besides after `Allocate`.
pub const RECONCILE: std::time::Duration = std::time::Duration::from_secs(5);

/// How long after a served `Allocate` PodResources is read (the kubelet
/// records the devices once the call has returned).
const AFTER_ALLOCATE: std::time::Duration = std::time::Duration::from_millis(200);

/// Reads PodResources shortly after each served `Allocate` (the kubelet
/// records the devices when the call returns) and every [`RECONCILE`],
/// until `stop`.
pub async fn reconcile_loop(
    agent: std::sync::Arc<Agent>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let Some(coord) = agent.coord.get().cloned() else {
        return;
    };
    let mut failures = 0u64;
    loop {
        tokio::select! {
            _ = coord.allocated.notified() => {
                tokio::time::sleep(AFTER_ALLOCATE).await;
            }
            _ = tokio::time::sleep(RECONCILE) => {}
            _ = stop.changed() => return,
        }
        match reconcile(&agent).await {
            Ok(Some(_)) => failures = 0,
            Ok(None) => tracing::debug!(
                "PodResources disagrees with what was served (a call in flight); next time"
            ),
            Err(e) => {
                failures += 1;
                if failures == 1 || failures.is_multiple_of(100) {
                    tracing::warn!(
                        failures,
                        "PodResources: {e}; who holds which GPU is the decisions' guess"
                    );
                }
            }
        }
    }
}

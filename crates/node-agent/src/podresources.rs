//! Reads what the kubelet says each pod holds (PodResources `List`) and
//! rebuilds the served part of the decisions from it after an agent
//! restart (`docs/protocol.md`, *Restart*).

use crate::agent::Agent;
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

/// Marks as served what the kubelet reports. Returns how many pods matched
/// a decision.
pub fn restore(agent: &Agent, held: &Held) -> usize {
    let Some(coord) = agent.coord.get() else {
        return 0;
    };
    let mut n = 0;
    for ((ns, name), res) in held {
        let mut whole = Vec::new();
        let mut milli = 0u32;
        for plan in &agent.plans {
            let Some(ids) = res.get(&plan.name) else {
                continue;
            };
            let gpus = ids
                .iter()
                .filter_map(|id| plan.by_id.get(id))
                .map(|&d| plan.units[plan.devices[d].unit].gpu);
            if plan.is_whole_gpu() {
                whole.extend(gpus);
            } else if plan.is_share() {
                milli += u32::try_from(gpus.count()).unwrap_or(u32::MAX);
            }
        }
        if (whole.is_empty() && milli == 0) || !coord.ledger().restore(ns, name, &whole, milli) {
            continue;
        }
        for &g in &whole {
            agent.mark_allocated(g);
        }
        n += 1;
    }
    n
}

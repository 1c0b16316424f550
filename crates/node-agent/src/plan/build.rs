//! Building the plans: which resources the node offers (whole GPUs, MIG
//! devices by strategy, time-slicing, GPU shares) and their device ids.

use super::{MAX_DEVICES_PER_RESOURCE, PlanDevice, PlanError, ResourcePlan, SHARE_TOKENS, Unit};
use crate::backend::Inventory;
use crate::config::{DeviceIdStrategy, MigStrategy, Settings};
use gpusched_model::labels::{RESOURCE_GPU, RESOURCE_GPU_MILLI, RESOURCE_MIG_PREFIX};
use std::collections::BTreeMap;

impl ResourcePlan {
    pub(super) fn new(name: String, units: Vec<Unit>, s: &Settings) -> Self {
        let rep = s
            .replication
            .iter()
            .find(|r| r.name == name || r.advertised == name);
        let (advertised, replicas) = match rep {
            Some(r) => (r.advertised.clone(), r.replicas),
            None => (name, 1),
        };
        let mut devices = Vec::new();
        for (u, unit) in units.iter().enumerate() {
            let base = match s.device_id_strategy {
                DeviceIdStrategy::Uuid => unit.uuid.clone(),
                DeviceIdStrategy::Index => unit.index_id.clone(),
            };
            if replicas > 1 {
                for k in 0..replicas {
                    devices.push(PlanDevice {
                        id: format!("{base}::{k}"),
                        unit: u,
                        replica: Some(k),
                    });
                }
            } else {
                devices.push(PlanDevice {
                    id: base,
                    unit: u,
                    replica: None,
                });
            }
        }
        let by_id = devices
            .iter()
            .enumerate()
            .map(|(i, d)| (d.id.clone(), i))
            .collect();
        ResourcePlan {
            name: advertised,
            unit_topos: units.iter().map(|u| u.topo).collect(),
            units,
            devices,
            by_id,
            replicas,
            fail_requests_greater_than_one: s.fail_requests_greater_than_one && replicas > 1,
            unit_milli: 0,
        }
    }
}

fn whole(inv: &Inventory, gi: usize) -> Unit {
    let g = &inv.gpus[gi];
    Unit {
        gpu: gi,
        mig: None,
        uuid: g.uuid.clone(),
        index_id: g.index.to_string(),
        topo: g.topo,
        minor: g.minor,
        caps: Vec::new(),
    }
}

fn mig_unit(inv: &Inventory, gi: usize, mi: usize) -> Unit {
    let g = &inv.gpus[gi];
    Unit {
        gpu: gi,
        mig: Some(mi),
        uuid: g.mig[mi].uuid.clone(),
        index_id: format!("{}:{mi}", g.index),
        topo: g.topo,
        minor: g.minor,
        caps: g.mig[mi].caps.clone(),
    }
}

/// Time-slicing entries that match no resource the node offers (a MIG
/// profile under `migStrategy: none`, a profile the node does not have …),
/// as warnings naming the entry: they are ignored, but not silently.
pub fn unused_replication(plans: &[ResourcePlan], s: &Settings) -> Vec<String> {
    let strategy = match s.mig_strategy {
        MigStrategy::None => "none",
        MigStrategy::Single => "single",
        MigStrategy::Mixed => "mixed",
    };
    let offered: Vec<&str> = plans.iter().map(|p| p.name.as_str()).collect();
    s.replication
        .iter()
        .enumerate()
        .filter(|(_, r)| !offered.contains(&r.advertised.as_str()))
        .map(|(i, r)| {
            format!(
                "sharing.timeSlicing.resources[{i}] ({}) is ignored: this node offers no such \
                 resource with migStrategy {strategy} (it offers {})",
                r.name,
                offered.join(", ")
            )
        })
        .collect()
}

/// Builds the resources the node offers.
pub fn build_plans(inv: &Inventory, s: &Settings) -> Result<Vec<ResourcePlan>, PlanError> {
    let mut groups: BTreeMap<String, Vec<Unit>> = BTreeMap::new();
    let any_mig = inv.gpus.iter().any(|g| g.mig_enabled && !g.mig.is_empty());
    match s.mig_strategy {
        MigStrategy::None => {
            groups.insert(
                RESOURCE_GPU.into(),
                (0..inv.gpus.len()).map(|i| whole(inv, i)).collect(),
            );
        }
        MigStrategy::Single if !any_mig => {
            groups.insert(
                RESOURCE_GPU.into(),
                (0..inv.gpus.len()).map(|i| whole(inv, i)).collect(),
            );
        }
        MigStrategy::Single => {
            let mut profiles: Vec<&str> = Vec::new();
            for g in &inv.gpus {
                if !g.mig_enabled || g.mig.is_empty() {
                    return Err(PlanError::MixedMig(format!(
                        "GPU {} ({}) has no MIG devices",
                        g.index, g.uuid
                    )));
                }
                for m in &g.mig {
                    if !profiles.contains(&m.profile.as_str()) {
                        profiles.push(&m.profile);
                    }
                }
            }
            if profiles.len() > 1 {
                return Err(PlanError::MixedMig(format!(
                    "profiles {}",
                    profiles.join(", ")
                )));
            }
            let units = inv
                .gpus
                .iter()
                .enumerate()
                .flat_map(|(gi, g)| (0..g.mig.len()).map(move |mi| (gi, mi)))
                .map(|(gi, mi)| mig_unit(inv, gi, mi))
                .collect();
            groups.insert(RESOURCE_GPU.into(), units);
        }
        MigStrategy::Mixed => {
            let mut gpus = Vec::new();
            for (gi, g) in inv.gpus.iter().enumerate() {
                if g.mig_enabled {
                    for (mi, m) in g.mig.iter().enumerate() {
                        groups
                            .entry(format!("{RESOURCE_MIG_PREFIX}{}", m.profile))
                            .or_default()
                            .push(mig_unit(inv, gi, mi));
                    }
                } else {
                    gpus.push(whole(inv, gi));
                }
            }
            if !gpus.is_empty() || groups.is_empty() {
                groups.insert(RESOURCE_GPU.into(), gpus);
            }
        }
    }
    let mut plans: Vec<ResourcePlan> = Vec::new();
    for (name, units) in groups {
        if let Some((i, r)) = s
            .replication
            .iter()
            .enumerate()
            .find(|(_, r)| r.name == name || r.advertised == name)
        {
            let devices = u64::from(r.replicas) * units.len() as u64;
            if devices > MAX_DEVICES_PER_RESOURCE as u64 {
                return Err(PlanError::TooManyDevices {
                    field: format!("sharing.timeSlicing.resources[{i}].replicas"),
                    resource: name,
                    replicas: r.replicas,
                    units: units.len(),
                    devices,
                    max: MAX_DEVICES_PER_RESOURCE,
                });
            }
        }
        let mut p = ResourcePlan::new(name, units, s);
        if p.replicas <= 1 && !p.units.is_empty() && p.units.iter().all(|u| u.mig.is_some()) {
            p.unit_milli = mig_instance(inv, &p.units[0]).map_or(0, |m| m.milli());
        }
        if plans.iter().any(|q| q.name == p.name) {
            return Err(PlanError::DuplicateResource(p.name));
        }
        plans.push(p);
    }
    if s.shares {
        // GPU shares (`docs/protocol.md`): 1000 tokens per whole, non-MIG
        // GPU; off (with a warning) where that passes the device limit.
        let units: Vec<Unit> = (0..inv.gpus.len())
            .filter(|&i| !inv.gpus[i].mig_enabled)
            .map(|i| whole(inv, i))
            .collect();
        let n = units.len() * SHARE_TOKENS as usize;
        if units.is_empty() {
            tracing::warn!("shares: no whole non-MIG GPU; {RESOURCE_GPU_MILLI} not advertised");
        } else if n > MAX_DEVICES_PER_RESOURCE {
            tracing::warn!(
                "shares: {} GPUs × {SHARE_TOKENS} tokens = {n} devices, over {MAX_DEVICES_PER_RESOURCE}; {RESOURCE_GPU_MILLI} not advertised",
                units.len()
            );
        } else {
            let mut p = ResourcePlan::new(RESOURCE_GPU_MILLI.into(), Vec::new(), s);
            let mut devices = Vec::with_capacity(n);
            for (u, unit) in units.iter().enumerate() {
                for k in 0..SHARE_TOKENS {
                    devices.push(PlanDevice {
                        id: format!("{}::{k}", unit.uuid),
                        unit: u,
                        replica: Some(k),
                    });
                }
            }
            p.by_id = devices
                .iter()
                .enumerate()
                .map(|(i, d)| (d.id.clone(), i))
                .collect();
            p.unit_topos = units.iter().map(|u| u.topo).collect();
            p.units = units;
            p.devices = devices;
            p.replicas = SHARE_TOKENS;
            p.fail_requests_greater_than_one = false;
            plans.push(p);
        }
    }
    Ok(plans)
}

/// A MIG unit as the scheduler sees it (`gpusched.io/sharing`): profile,
/// compute slices of its GPU; `id` and `resource` left for the caller.
/// `None` for a whole GPU or a profile that names no slices.
pub fn mig_instance(inv: &Inventory, u: &Unit) -> Option<gpusched_model::sharing::MigInstance> {
    let g = inv.gpus.get(u.gpu)?;
    let m = g.mig.get(u.mig?)?;
    let (_, compute) = crate::labels::mig_slices(&m.profile)?;
    let of = crate::labels::gpu_compute_slices(&g.model);
    (compute >= 1 && compute <= of).then(|| gpusched_model::sharing::MigInstance {
        id: String::new(),
        profile: m.profile.clone(),
        slices: compute,
        of,
        memory_mib: m.memory_mib,
        resource: String::new(),
    })
}

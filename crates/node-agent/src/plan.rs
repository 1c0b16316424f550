//! Which resources the node offers and which device ids make them up
//! (whole GPUs, MIG devices, time-sliced replicas), and the pure answers to
//! `Allocate` and `GetPreferredAllocation` over them.

use crate::api;
use crate::backend::Inventory;
use crate::config::{DeviceIdStrategy, MigStrategy, Settings};
use crate::text::shown;
use gpusched_model::labels::{RESOURCE_GPU, RESOURCE_MIG_PREFIX};
use gpusched_model::topology::{GpuTopo, choose};
use std::collections::{BTreeMap, HashMap, HashSet};

/// A device unit: a whole GPU or one MIG device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unit {
    /// Index into [`Inventory::gpus`].
    pub gpu: usize,
    /// Index into the GPU's MIG devices.
    pub mig: Option<usize>,
    /// UUID of the unit (GPU or MIG device).
    pub uuid: String,
    /// Id in the index strategy (`3`, or `3:1` for MIG device 1 of GPU 3).
    pub index_id: String,
    /// Where its GPU sits.
    pub topo: GpuTopo,
    /// Its GPU's `/dev/nvidia<minor>`.
    pub minor: u32,
    /// MIG capability device nodes (empty for whole GPUs).
    pub caps: Vec<String>,
}

/// One id advertised to the kubelet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanDevice {
    /// The id (UUID or index id, with `::<replica>` under time-slicing).
    pub id: String,
    /// Index into [`ResourcePlan::units`].
    pub unit: usize,
    /// Replica number under time-slicing.
    pub replica: Option<u32>,
}

/// One resource served by one plugin socket.
#[derive(Clone, Debug)]
pub struct ResourcePlan {
    /// Name advertised to the kubelet.
    pub name: String,
    /// The GPUs or MIG devices offered.
    pub units: Vec<Unit>,
    /// The ids advertised, `replicas` per unit.
    pub devices: Vec<PlanDevice>,
    /// Id → index into `devices`.
    pub by_id: HashMap<String, usize>,
    /// 1 when not shared.
    pub replicas: u32,
    /// Refuse containers asking for more than one replica.
    pub fail_requests_greater_than_one: bool,
    /// Topology of each unit (index = unit), for preferred allocation.
    pub unit_topos: Vec<GpuTopo>,
    /// For MIG devices not time-sliced: one device's measure in milli-GPU
    /// of its GPU (`⌊1000 · g / G⌋`, all devices of a resource have one
    /// profile); 0 otherwise.
    pub unit_milli: u32,
}

/// The node's resources cannot be built from its devices and settings.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PlanError {
    /// Under `migStrategy: single`, a GPU without MIG devices or with two profiles (which, in words).
    #[error("mig strategy single needs every GPU in MIG mode with MIG devices of one profile: {0}")]
    MixedMig(String),
    /// Two plans would advertise this name.
    #[error("two resources would be advertised as {0:?}")]
    DuplicateResource(String),
    #[error(
        "field `{field}`: {replicas} replicas × {units} devices = {devices} devices for {resource}; \
         at most {max} per resource (a kubelet refuses device lists over 4 MiB)"
    )]
    /// Time-slicing would advertise more than [`MAX_DEVICES_PER_RESOURCE`] ids.
    TooManyDevices {
        /// The config field (`sharing.timeSlicing.resources[0].replicas`).
        field: String,
        /// The resource.
        resource: String,
        /// Replicas asked.
        replicas: u32,
        /// Devices of the resource.
        units: usize,
        /// `replicas × units`.
        devices: u64,
        /// [`MAX_DEVICES_PER_RESOURCE`].
        max: usize,
    },
}

/// Most device ids one resource may advertise. A `ListAndWatch` message of
/// this many devices with the longest ids (MIG UUIDs with a replica suffix)
/// encodes to about 1.2 MB, well under the 4 MiB a kubelet accepts.
pub const MAX_DEVICES_PER_RESOURCE: usize = 16_384;

/// A request the kubelet (or anyone) should not have made.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    /// The request is malformed (unknown id, wrong count …): `INVALID_ARGUMENT`.
    #[error("{0}")]
    Invalid(String),
    /// The request is well formed but cannot be served now (unhealthy device …): `FAILED_PRECONDITION`.
    #[error("{0}")]
    Precondition(String),
}

impl RequestError {
    /// The gRPC status to answer with.
    pub fn into_status(self) -> tonic::Status {
        match self {
            RequestError::Invalid(m) => tonic::Status::invalid_argument(m),
            RequestError::Precondition(m) => tonic::Status::failed_precondition(m),
        }
    }
}

fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .collect()
}

impl ResourcePlan {
    fn new(name: String, units: Vec<Unit>, s: &Settings) -> Self {
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

    /// Socket file name for this resource, e.g. `gpusched-nvidia.com-gpu.sock`.
    pub fn socket_name(&self) -> String {
        format!("gpusched-{}.sock", sanitize(&self.name))
    }

    /// The device list for the kubelet, given each unit's health.
    pub fn device_list(&self, unit_healthy: &[bool]) -> Vec<api::Device> {
        self.devices
            .iter()
            .map(|d| {
                let unit = &self.units[d.unit];
                api::Device {
                    id: d.id.clone(),
                    health: if unit_healthy.get(d.unit).copied().unwrap_or(false) {
                        "Healthy".into()
                    } else {
                        "Unhealthy".into()
                    },
                    topology: unit.topo.numa.map(|n| api::TopologyInfo {
                        nodes: vec![api::NumaNode { id: n as i64 }],
                    }),
                }
            })
            .collect()
    }

    /// Looks up request ids; rejects empty, unknown and duplicated ids.
    fn lookup(&self, ids: &[String], what: &str) -> Result<Vec<usize>, RequestError> {
        let mut seen = HashSet::new();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            let Some(&d) = self.by_id.get(id) else {
                return Err(RequestError::Invalid(format!(
                    "{what}: unknown device id {} for resource {}",
                    shown(id),
                    self.name
                )));
            };
            if !seen.insert(d) {
                return Err(RequestError::Invalid(format!(
                    "{what}: device id {} listed twice",
                    shown(id)
                )));
            }
            out.push(d);
        }
        Ok(out)
    }

    /// The response for one container of an `Allocate` call.
    /// `unit_healthy[u]`: current health of unit `u`.
    pub fn allocate(
        &self,
        ids: &[String],
        unit_healthy: &[bool],
        s: &Settings,
        inv: &Inventory,
    ) -> Result<api::ContainerAllocateResponse, RequestError> {
        if ids.is_empty() {
            return Err(RequestError::Invalid(format!(
                "allocate: no device ids for resource {}",
                self.name
            )));
        }
        let devs = self.lookup(ids, "allocate")?;
        if self.fail_requests_greater_than_one && devs.len() > 1 {
            return Err(RequestError::Invalid(format!(
                "allocate: request for '{}: {}' too large: shared resources allow at most 1 per container (failRequestsGreaterThanOne)",
                self.name,
                devs.len()
            )));
        }
        for &d in &devs {
            let dev = &self.devices[d];
            if !unit_healthy.get(dev.unit).copied().unwrap_or(false) {
                return Err(RequestError::Precondition(format!(
                    "allocate: device {:?} is unhealthy",
                    dev.id
                )));
            }
        }
        let mut units: Vec<usize> = Vec::new();
        for &d in &devs {
            let u = self.devices[d].unit;
            if !units.contains(&u) {
                units.push(u);
            }
        }
        let visible: Vec<String> = units
            .iter()
            .map(|&u| match s.device_id_strategy {
                DeviceIdStrategy::Uuid => self.units[u].uuid.clone(),
                DeviceIdStrategy::Index => self.units[u].index_id.clone(),
            })
            .collect();
        let mut resp = api::ContainerAllocateResponse::default();
        resp.envs
            .insert("NVIDIA_VISIBLE_DEVICES".into(), visible.join(","));
        if s.pass_device_specs {
            let spec = |p: String| api::DeviceSpec {
                container_path: p.clone(),
                host_path: p,
                permissions: "rw".into(),
            };
            for p in ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"] {
                resp.devices.push(spec(p.to_string()));
            }
            let mut minors: Vec<u32> = units.iter().map(|&u| self.units[u].minor).collect();
            minors.sort_unstable();
            minors.dedup();
            for m in minors {
                resp.devices.push(spec(format!("/dev/nvidia{m}")));
            }
            for &u in &units {
                for c in &self.units[u].caps {
                    resp.devices.push(spec(c.clone()));
                }
            }
        }
        if s.cdi_enabled {
            for &u in &units {
                resp.cdi_devices.push(api::CdiDevice {
                    name: format!("nvidia.com/gpu={}", self.units[u].uuid),
                });
            }
        }
        let _ = inv;
        Ok(resp)
    }

    /// The preferred ids for one container of a `GetPreferredAllocation`.
    pub fn preferred(
        &self,
        available: &[String],
        must_include: &[String],
        size: i32,
        unit_healthy: &[bool],
    ) -> Result<Vec<String>, RequestError> {
        let size = usize::try_from(size)
            .ok()
            .filter(|&n| n > 0)
            .ok_or_else(|| {
                RequestError::Invalid(format!(
                    "preferred allocation: allocation_size must be positive, got {size}"
                ))
            })?;
        let avail = self.lookup(available, "preferred allocation (available)")?;
        let must = self.lookup(must_include, "preferred allocation (must_include)")?;
        if let Some(m) = must.iter().find(|m| !avail.contains(m)) {
            return Err(RequestError::Invalid(format!(
                "preferred allocation: must_include device {:?} is not among the available devices",
                self.devices[*m].id
            )));
        }
        if must.len() > size {
            return Err(RequestError::Invalid(format!(
                "preferred allocation: {} must_include devices exceed allocation_size {size}",
                must.len()
            )));
        }
        // Unhealthy devices are never added to the set. must_include ones
        // are returned as given, healthy or not: the kubelet has already
        // chosen them (its available list holds only devices it saw healthy,
        // so an unhealthy one here turned unhealthy since), and `Allocate`
        // refuses an unhealthy device with FailedPrecondition.
        let healthy = |d: &usize| {
            unit_healthy
                .get(self.devices[*d].unit)
                .copied()
                .unwrap_or(false)
        };
        let avail: Vec<usize> = avail
            .into_iter()
            .filter(|d| healthy(d) || must.contains(d))
            .collect();
        if avail.len() < size {
            return Err(RequestError::Invalid(format!(
                "preferred allocation: allocation_size {size} exceeds the {} healthy available devices",
                avail.len()
            )));
        }
        let picked = if self.replicas <= 1 {
            let a_units: Vec<usize> = avail.iter().map(|&d| self.devices[d].unit).collect();
            let m_units: Vec<usize> = must.iter().map(|&d| self.devices[d].unit).collect();
            let chosen = choose(&self.unit_topos, &a_units, &m_units, size).ok_or_else(|| {
                RequestError::Invalid("preferred allocation: no set of that size fits".into())
            })?;
            // Map units back to device ids (one device per unit here).
            chosen
                .into_iter()
                .filter_map(|u| avail.iter().copied().find(|&d| self.devices[d].unit == u))
                .collect::<Vec<usize>>()
        } else {
            self.spread_replicas(&avail, &must, size)
        };
        Ok(picked
            .into_iter()
            .map(|d| self.devices[d].id.clone())
            .collect())
    }

    /// Replicas: spread over the least-used GPUs (most free replicas first),
    /// one replica per GPU before doubling up.
    fn spread_replicas(&self, avail: &[usize], must: &[usize], size: usize) -> Vec<usize> {
        let mut free: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for &d in avail {
            if !must.contains(&d) {
                free.entry(self.devices[d].unit).or_default().push(d);
            }
        }
        let mut out: Vec<usize> = must.to_vec();
        let mut used: HashMap<usize, usize> = HashMap::new();
        for &d in must {
            *used.entry(self.devices[d].unit).or_default() += 1;
        }
        while out.len() < size {
            let pick = free
                .iter()
                .filter(|(_, v)| !v.is_empty())
                .min_by_key(|(u, v)| (used.get(u).copied().unwrap_or(0), usize::MAX - v.len(), **u))
                .map(|(u, _)| *u);
            let Some(u) = pick else { break };
            if let Some(list) = free.get_mut(&u)
                && !list.is_empty()
            {
                out.push(list.remove(0));
                *used.entry(u).or_default() += 1;
            }
        }
        out
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

/// Tokens of `gpusched.io/gpu-milli` per GPU.
pub const SHARE_TOKENS: u32 = 1000;
pub use gpusched_model::labels::RESOURCE_GPU_MILLI;

impl ResourcePlan {
    /// This plan carries GPU shares.
    pub fn is_share(&self) -> bool {
        self.name == RESOURCE_GPU_MILLI
    }

    /// This plan is time-sliced replicas of whole GPUs (under
    /// `nvidia.com/gpu` or a renamed resource; not MIG): the scheduler
    /// places a pod's replicas as a share of one GPU
    /// (`gpusched_model::sharing`), and decisions govern.
    pub fn is_time_sliced_gpu(&self) -> bool {
        !self.is_share()
            && self.replicas > 1
            && !self.units.is_empty()
            && self.units.iter().all(|u| u.mig.is_none())
    }

    /// What a call for `n` devices of this plan is in the decisions'
    /// measure: `(milli, resource)`, the resource `None` for
    /// `gpusched.io/gpu-milli` tokens, else the time-sliced resource.
    pub fn share_call(&self, n: usize) -> (u32, Option<&str>) {
        let n = u32::try_from(n).unwrap_or(u32::MAX);
        if self.is_share() {
            (n, None)
        } else if self.is_mig() {
            (n.saturating_mul(self.unit_milli), Some(self.name.as_str()))
        } else {
            (
                n.saturating_mul(gpusched_model::sharing::replica_milli(self.replicas)),
                Some(self.name.as_str()),
            )
        }
    }

    /// This plan is MIG devices, not time-sliced, of a known measure: the
    /// scheduler places a pod's devices as MIG instances of one GPU
    /// (`GpuDecision::mig`), and decisions govern. A call for `k` devices
    /// is `k ·` [`ResourcePlan::unit_milli`] of that resource
    /// ([`ResourcePlan::share_call`]).
    pub fn is_mig(&self) -> bool {
        !self.is_share()
            && self.replicas <= 1
            && self.unit_milli > 0
            && !self.units.is_empty()
            && self.units.iter().all(|u| u.mig.is_some())
    }

    /// This plan is whole, non-shared GPUs (`nvidia.com/gpu`, no MIG, no
    /// time-slicing): the resource decisions govern.
    pub fn is_whole_gpu(&self) -> bool {
        self.name == RESOURCE_GPU
            && self.replicas <= 1
            && self.units.iter().all(|u| u.mig.is_none())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;
    use crate::config::Replication;

    fn inv(yaml: &str) -> Inventory {
        FakeBackend::from_yaml(yaml, "t")
            .unwrap()
            .inventory_ref()
            .clone()
    }

    const PCIE4: &str = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus: {count: 4, model: L40S, memory: 48Gi, interconnect: pcie, pcie_switches: 2}\n";

    #[test]
    fn replicas_and_fail_greater_than_one() {
        let i = inv(PCIE4);
        let s = Settings {
            replication: vec![Replication {
                name: RESOURCE_GPU.into(),
                replicas: 3,
                advertised: "nvidia.com/gpu.shared".into(),
            }],
            fail_requests_greater_than_one: true,
            ..Default::default()
        };
        let p = &build_plans(&i, &s).unwrap()[0];
        assert_eq!(p.name, "nvidia.com/gpu.shared");
        assert_eq!(p.devices.len(), 12);
        assert!(p.devices[4].id.ends_with("::1"));
        let h = vec![true; 4];
        let e = p
            .allocate(
                &[p.devices[0].id.clone(), p.devices[1].id.clone()],
                &h,
                &s,
                &i,
            )
            .unwrap_err();
        assert!(matches!(e, RequestError::Invalid(m) if m.contains("too large")));
        let r = p.allocate(&[p.devices[5].id.clone()], &h, &s, &i).unwrap();
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], i.gpus[1].uuid);
        // spread: 4 replicas land on 4 different GPUs
        let all: Vec<String> = p.devices.iter().map(|d| d.id.clone()).collect();
        let got = p.preferred(&all, &[], 4, &h).unwrap();
        let gpus: HashSet<&str> = got.iter().map(|g| g.split("::").next().unwrap()).collect();
        assert_eq!(gpus.len(), 4);
    }

    #[test]
    fn allocate_errors() {
        let i = inv(PCIE4);
        let s = Settings {
            pass_device_specs: true,
            cdi_enabled: true,
            ..Default::default()
        };
        let p = &build_plans(&i, &s).unwrap()[0];
        let h = vec![true, false, true, true];
        let id = |k: usize| i.gpus[k].uuid.clone();
        assert!(matches!(
            p.allocate(&[id(1)], &h, &s, &i),
            Err(RequestError::Precondition(_))
        ));
        assert!(matches!(
            p.allocate(&[id(0), id(0)], &h, &s, &i),
            Err(RequestError::Invalid(m)) if m.contains("twice")
        ));
        assert!(matches!(
            p.allocate(&["GPU-nope".into()], &h, &s, &i),
            Err(RequestError::Invalid(m)) if m.contains("unknown")
        ));
        assert!(p.allocate(&[], &h, &s, &i).is_err());
        let r = p.allocate(&[id(2), id(3)], &h, &s, &i).unwrap();
        assert_eq!(
            r.envs["NVIDIA_VISIBLE_DEVICES"],
            format!("{},{}", id(2), id(3))
        );
        let paths: Vec<&str> = r.devices.iter().map(|d| d.host_path.as_str()).collect();
        assert_eq!(
            paths,
            vec![
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidia2",
                "/dev/nvidia3"
            ]
        );
        assert_eq!(r.cdi_devices[1].name, format!("nvidia.com/gpu={}", id(3)));
        // unhealthy devices are not preferred
        let all: Vec<String> = (0..4).map(id).collect();
        let got = p.preferred(&all, &[], 2, &h).unwrap();
        assert_eq!(got, vec![id(2), id(3)]);
        assert!(p.preferred(&all, &[], 4, &h).is_err());
        assert!(p.preferred(&all, &[], 0, &h).is_err());
        assert!(p.preferred(&all[..2], &[id(3)], 1, &h).is_err());
    }

    /// The docs said unhealthy devices are never preferred, yet one in
    /// must_include was returned. Decided: must_include is returned as
    /// given (documented), and only healthy devices are added to it.
    #[test]
    fn must_include_unhealthy_device_is_returned() {
        let i = inv(PCIE4);
        let s = Settings::default();
        let p = &build_plans(&i, &s).unwrap()[0];
        let h = vec![true, false, true, true];
        let id = |k: usize| i.gpus[k].uuid.clone();
        let all: Vec<String> = (0..4).map(id).collect();
        let got = p.preferred(&all, &[id(1)], 2, &h).unwrap();
        assert_eq!(got.len(), 2);
        assert!(got.contains(&id(1)), "{got:?}");
        assert!(got.iter().filter(|g| **g != id(1)).all(|g| g != &id(1)));
        // Allocate then refuses it.
        assert!(matches!(
            p.allocate(&[id(1)], &h, &s, &i),
            Err(RequestError::Precondition(_))
        ));
    }

    #[test]
    fn mig_strategies() {
        let y = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus:\n      count: 2\n      model: A100\n      memory: 80Gi\n      devices:\n        - index: 0\n          mig: [{profile: 3g.40gb}, {profile: 1g.10gb}]\n";
        let i = inv(y);
        let mixed = Settings {
            mig_strategy: MigStrategy::Mixed,
            ..Default::default()
        };
        let names: Vec<String> = build_plans(&i, &mixed)
            .unwrap()
            .into_iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(
            names,
            vec![
                "nvidia.com/gpu",
                "nvidia.com/mig-1g.10gb",
                "nvidia.com/mig-3g.40gb"
            ]
        );
        let single = Settings {
            mig_strategy: MigStrategy::Single,
            ..Default::default()
        };
        assert!(matches!(
            build_plans(&i, &single),
            Err(PlanError::MixedMig(_))
        ));
        // Without the NVIDIA runtime, MIG devices need their capability nodes.
        let mut i2 = i.clone();
        i2.gpus[0].mig[1].caps = vec!["/dev/nvidia-caps/nvidia-cap21".into()];
        let specs = Settings {
            mig_strategy: MigStrategy::Mixed,
            pass_device_specs: true,
            ..Default::default()
        };
        let plans = build_plans(&i2, &specs).unwrap();
        let p = plans
            .iter()
            .find(|p| p.name == "nvidia.com/mig-1g.10gb")
            .unwrap();
        let r = p
            .allocate(&[p.devices[0].id.clone()], &[true], &specs, &i2)
            .unwrap();
        let paths: Vec<&str> = r.devices.iter().map(|d| d.host_path.as_str()).collect();
        assert!(paths.contains(&"/dev/nvidia0"), "{paths:?}");
        assert!(
            paths.contains(&"/dev/nvidia-caps/nvidia-cap21"),
            "{paths:?}"
        );
        assert_eq!(r.envs["NVIDIA_VISIBLE_DEVICES"], i2.gpus[0].mig[1].uuid);
        let none = build_plans(&i, &Settings::default()).unwrap();
        assert_eq!(none.len(), 1);
        assert_eq!(none[0].devices.len(), 2);
    }
}

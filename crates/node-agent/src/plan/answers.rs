//! The kubelet's questions over one plan, answered without I/O: the
//! device list, `Allocate` and `GetPreferredAllocation`.

use super::{RequestError, ResourcePlan};
use crate::api;
use crate::backend::Inventory;
use crate::config::{DeviceIdStrategy, Settings};
use crate::text::shown;
use gpusched_model::topology::choose;
use std::collections::{BTreeMap, HashMap, HashSet};

impl ResourcePlan {
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

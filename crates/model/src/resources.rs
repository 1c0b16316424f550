//! Integer resource vectors.
//!
//! Units: CPU in millicores, memory in bytes, GPU in milli-GPU (one whole GPU
//! is [`GPU_MILLI`]; a 0.3-GPU share is 300), GPU memory in MiB (only for
//! shared GPUs, where a share may be asked for by memory), extended resources
//! as integers. Quotas, fair share, monitoring and the simulator all count
//! GPUs in milli-GPU so that whole GPUs and shares add up the same way.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt;

/// One whole GPU in milli-GPU.
pub const GPU_MILLI: u64 = 1000;

/// A dimension of a [`ResourceVec`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ResourceKind {
    /// CPU, milli-cores.
    Cpu,
    /// Memory, bytes.
    Memory,
    /// GPUs, milli-GPU.
    Gpu,
    /// GPU memory, MiB.
    GpuMemory,
    /// Another extended resource, by name.
    Extended(String),
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResourceKind::Cpu => f.write_str("cpu"),
            ResourceKind::Memory => f.write_str("memory"),
            ResourceKind::Gpu => f.write_str(crate::labels::RESOURCE_GPU),
            ResourceKind::GpuMemory => f.write_str("gpu memory"),
            ResourceKind::Extended(n) => f.write_str(n),
        }
    }
}

/// A vector of integer resource amounts.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ResourceVec {
    /// CPU, milli-cores.
    pub cpu_milli: u64,
    /// Memory, bytes.
    pub memory: u64,
    /// GPUs, milli-GPU (1000 = one whole GPU).
    pub gpu_milli: u64,
    /// GPU memory, MiB.
    pub gpu_mem_mib: u64,
    /// Other extended resources, by name, in their own integer units.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ext: BTreeMap<String, u64>,
}

impl ResourceVec {
    /// CPU, memory and GPU; GPU memory and extended resources zero.
    pub fn new(cpu_milli: u64, memory: u64, gpu_milli: u64) -> Self {
        ResourceVec {
            cpu_milli,
            memory,
            gpu_milli,
            ..Default::default()
        }
    }

    /// Whether every dimension is zero.
    pub fn is_zero(&self) -> bool {
        self.cpu_milli == 0
            && self.memory == 0
            && self.gpu_milli == 0
            && self.gpu_mem_mib == 0
            && self.ext.values().all(|v| *v == 0)
    }

    /// Adds `o` dimension by dimension.
    pub fn add(&mut self, o: &ResourceVec) {
        self.cpu_milli += o.cpu_milli;
        self.memory += o.memory;
        self.gpu_milli += o.gpu_milli;
        self.gpu_mem_mib += o.gpu_mem_mib;
        for (k, v) in &o.ext {
            *self.ext.entry(k.clone()).or_insert(0) += v;
        }
    }

    /// Subtracts, saturating at zero per dimension.
    pub fn sub(&mut self, o: &ResourceVec) {
        self.cpu_milli = self.cpu_milli.saturating_sub(o.cpu_milli);
        self.memory = self.memory.saturating_sub(o.memory);
        self.gpu_milli = self.gpu_milli.saturating_sub(o.gpu_milli);
        self.gpu_mem_mib = self.gpu_mem_mib.saturating_sub(o.gpu_mem_mib);
        for (k, v) in &o.ext {
            if let Some(x) = self.ext.get_mut(k) {
                *x = x.saturating_sub(*v);
            }
        }
    }

    /// `self + o`.
    pub fn plus(&self, o: &ResourceVec) -> ResourceVec {
        let mut r = self.clone();
        r.add(o);
        r
    }

    /// `self - o`, saturating at zero per dimension.
    pub fn minus(&self, o: &ResourceVec) -> ResourceVec {
        let mut r = self.clone();
        r.sub(o);
        r
    }

    /// Amount of an extended resource (0 when absent).
    pub fn ext_get(&self, name: &str) -> u64 {
        self.ext.get(name).copied().unwrap_or(0)
    }

    /// Whether every dimension of `self` is at most the same dimension of
    /// `cap`.
    pub fn fits_in(&self, cap: &ResourceVec) -> bool {
        self.first_exceeding(cap).is_none()
    }

    /// The first dimension (in a fixed order) where `self` exceeds `cap`.
    pub fn first_exceeding(&self, cap: &ResourceVec) -> Option<ResourceKind> {
        self.exceeding(cap).next()
    }

    /// Every dimension where `self` exceeds `cap`, in a fixed order.
    pub fn exceeding<'a>(
        &'a self,
        cap: &'a ResourceVec,
    ) -> impl Iterator<Item = ResourceKind> + 'a {
        let base = [
            (self.cpu_milli > cap.cpu_milli, ResourceKind::Cpu),
            (self.memory > cap.memory, ResourceKind::Memory),
            (self.gpu_milli > cap.gpu_milli, ResourceKind::Gpu),
            (self.gpu_mem_mib > cap.gpu_mem_mib, ResourceKind::GpuMemory),
        ];
        base.into_iter().filter(|(b, _)| *b).map(|(_, k)| k).chain(
            self.ext
                .iter()
                .filter(|(k, v)| **v > cap.ext_get(k))
                .map(|(k, _)| ResourceKind::Extended(k.clone())),
        )
    }

    /// Per-dimension minimum.
    pub fn min(&self, o: &ResourceVec) -> ResourceVec {
        let mut ext = BTreeMap::new();
        for (k, v) in &self.ext {
            let m = (*v).min(o.ext_get(k));
            if m > 0 {
                ext.insert(k.clone(), m);
            }
        }
        ResourceVec {
            cpu_milli: self.cpu_milli.min(o.cpu_milli),
            memory: self.memory.min(o.memory),
            gpu_milli: self.gpu_milli.min(o.gpu_milli),
            gpu_mem_mib: self.gpu_mem_mib.min(o.gpu_mem_mib),
            ext,
        }
    }

    /// The dominant share of `self` against `total`, in parts per million
    /// (integer, so orderings are exact). Dimensions where `total` is zero
    /// are ignored.
    pub fn dominant_share_ppm(&self, total: &ResourceVec) -> u64 {
        fn share(a: u64, t: u64) -> u64 {
            if t == 0 {
                0
            } else {
                ((a as u128 * 1_000_000) / t as u128) as u64
            }
        }
        let mut m = share(self.cpu_milli, total.cpu_milli)
            .max(share(self.memory, total.memory))
            .max(share(self.gpu_milli, total.gpu_milli))
            .max(share(self.gpu_mem_mib, total.gpu_mem_mib));
        for (k, v) in &self.ext {
            m = m.max(share(*v, total.ext_get(k)));
        }
        m
    }

    /// Amount of one dimension.
    pub fn get(&self, k: &ResourceKind) -> u64 {
        match k {
            ResourceKind::Cpu => self.cpu_milli,
            ResourceKind::Memory => self.memory,
            ResourceKind::Gpu => self.gpu_milli,
            ResourceKind::GpuMemory => self.gpu_mem_mib,
            ResourceKind::Extended(n) => self.ext_get(n),
        }
    }
}

impl fmt::Display for ResourceVec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cpu={}m memory={}Mi gpu={}.{:03}",
            self.cpu_milli,
            self.memory >> 20,
            self.gpu_milli / GPU_MILLI,
            self.gpu_milli % GPU_MILLI
        )?;
        if self.gpu_mem_mib > 0 {
            write!(f, " gpu-memory={}Mi", self.gpu_mem_mib)?;
        }
        for (k, v) in &self.ext {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_and_fit() {
        let mut a = ResourceVec::new(1000, 1 << 30, 2000);
        a.ext.insert("rdma/hca".into(), 1);
        let cap = ResourceVec::new(4000, 8 << 30, 1500);
        assert_eq!(
            a.exceeding(&cap).collect::<Vec<_>>(),
            vec![ResourceKind::Gpu, ResourceKind::Extended("rdma/hca".into())]
        );
        let b = a.plus(&a);
        assert_eq!(b.gpu_milli, 4000);
        assert_eq!(b.ext_get("rdma/hca"), 2);
        assert_eq!(b.minus(&a), a);
        assert_eq!(a.minus(&b).gpu_milli, 0);
    }

    #[test]
    fn dominant_share() {
        let total = ResourceVec::new(100_000, 1000, 10_000);
        let a = ResourceVec::new(10_000, 500, 1000);
        assert_eq!(a.dominant_share_ppm(&total), 500_000);
        assert_eq!(ResourceVec::default().dominant_share_ppm(&total), 0);
    }
}

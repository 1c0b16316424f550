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

impl ResourceKind {
    /// The dimension a Kubernetes resource name counts in: `cpu`, `memory`,
    /// `nvidia.com/gpu` and `gpusched.io/gpu-milli` (both GPUs, in
    /// milli-GPU), anything else an extended resource of that name.
    pub fn from_resource_name(name: &str) -> ResourceKind {
        match name {
            "cpu" => ResourceKind::Cpu,
            "memory" => ResourceKind::Memory,
            crate::labels::RESOURCE_GPU | crate::labels::RESOURCE_GPU_MILLI => ResourceKind::Gpu,
            other => ResourceKind::Extended(other.to_string()),
        }
    }
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
///
/// JSON field names are camelCase (`cpuMilli`, `gpuMilli`, `gpuMemMib`), as
/// every JSON gpusched writes; the snake_case names of files written before
/// 0.2 are still read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceVec {
    /// CPU, milli-cores.
    #[serde(alias = "cpu_milli")]
    pub cpu_milli: u64,
    /// Memory, bytes.
    pub memory: u64,
    /// GPUs, milli-GPU (1000 = one whole GPU).
    #[serde(alias = "gpu_milli")]
    pub gpu_milli: u64,
    /// GPU memory, MiB.
    #[serde(alias = "gpu_mem_mib")]
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

/// A cap on some dimensions of a [`ResourceVec`]: only the dimensions a
/// limit names are capped, every other one is unbounded. A queue limit of
/// `{nvidia.com/gpu: 4}` caps GPUs at 4 and leaves CPU, memory, GPU memory
/// and every extended resource free (a `ResourceVec` would read the missing
/// dimensions as a cap of zero).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourceLimit {
    /// CPU cap, milli-cores; `None`: uncapped.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "cpu_milli")]
    pub cpu_milli: Option<u64>,
    /// Memory cap, bytes; `None`: uncapped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// GPU cap, milli-GPU; `None`: uncapped.
    #[serde(default, skip_serializing_if = "Option::is_none", alias = "gpu_milli")]
    pub gpu_milli: Option<u64>,
    /// GPU memory cap, MiB; `None`: uncapped.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        alias = "gpu_mem_mib"
    )]
    pub gpu_mem_mib: Option<u64>,
    /// Caps on extended resources, by name; a name not listed is uncapped.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ext: BTreeMap<String, u64>,
}

impl ResourceLimit {
    /// A limit on GPUs only (milli-GPU).
    pub fn gpus(gpu_milli: u64) -> Self {
        ResourceLimit {
            gpu_milli: Some(gpu_milli),
            ..Default::default()
        }
    }

    /// The limit that caps exactly the `named` dimensions of `v` at their
    /// values in `v` (a name given twice counts once).
    pub fn named<'a>(v: &ResourceVec, named: impl IntoIterator<Item = &'a ResourceKind>) -> Self {
        let mut l = ResourceLimit::default();
        for k in named {
            l.set(k, v.get(k));
        }
        l
    }

    /// Caps dimension `k` at `cap`.
    pub fn set(&mut self, k: &ResourceKind, cap: u64) {
        match k {
            ResourceKind::Cpu => self.cpu_milli = Some(cap),
            ResourceKind::Memory => self.memory = Some(cap),
            ResourceKind::Gpu => self.gpu_milli = Some(cap),
            ResourceKind::GpuMemory => self.gpu_mem_mib = Some(cap),
            ResourceKind::Extended(n) => {
                self.ext.insert(n.clone(), cap);
            }
        }
    }

    /// The cap on dimension `k`; `None` when it is not capped.
    pub fn cap(&self, k: &ResourceKind) -> Option<u64> {
        match k {
            ResourceKind::Cpu => self.cpu_milli,
            ResourceKind::Memory => self.memory,
            ResourceKind::Gpu => self.gpu_milli,
            ResourceKind::GpuMemory => self.gpu_mem_mib,
            ResourceKind::Extended(n) => self.ext.get(n).copied(),
        }
    }

    /// The capped dimensions with their caps, in a fixed order (CPU,
    /// memory, GPU, GPU memory, then extended resources by name).
    pub fn caps(&self) -> impl Iterator<Item = (ResourceKind, u64)> + '_ {
        [
            (ResourceKind::Cpu, self.cpu_milli),
            (ResourceKind::Memory, self.memory),
            (ResourceKind::Gpu, self.gpu_milli),
            (ResourceKind::GpuMemory, self.gpu_mem_mib),
        ]
        .into_iter()
        .filter_map(|(k, c)| c.map(|c| (k, c)))
        .chain(
            self.ext
                .iter()
                .map(|(n, c)| (ResourceKind::Extended(n.clone()), *c)),
        )
    }

    /// Whether no dimension is capped.
    pub fn is_unbounded(&self) -> bool {
        self.caps().next().is_none()
    }

    /// The first capped dimension (in the order of [`caps`](Self::caps))
    /// that `v` exceeds.
    pub fn first_exceeded_by(&self, v: &ResourceVec) -> Option<ResourceKind> {
        self.caps().find(|(k, c)| v.get(k) > *c).map(|(k, _)| k)
    }

    /// `v` with every capped dimension lowered to its cap.
    pub fn clamp(&self, v: &ResourceVec) -> ResourceVec {
        let mut r = v.clone();
        let c = |x: u64, cap: Option<u64>| cap.map_or(x, |cap| x.min(cap));
        r.cpu_milli = c(r.cpu_milli, self.cpu_milli);
        r.memory = c(r.memory, self.memory);
        r.gpu_milli = c(r.gpu_milli, self.gpu_milli);
        r.gpu_mem_mib = c(r.gpu_mem_mib, self.gpu_mem_mib);
        for (n, x) in r.ext.iter_mut() {
            *x = c(*x, self.ext.get(n).copied());
        }
        r
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
    fn a_limit_caps_only_the_dimensions_it_names() {
        let mut used = ResourceVec::new(64_000, 512 << 30, 3000);
        used.ext.insert("rdma/hca".into(), 9);
        let gpus = ResourceLimit::gpus(4000);
        assert_eq!(
            gpus.first_exceeded_by(&used),
            None,
            "CPU/memory/ext are not capped"
        );
        used.gpu_milli = 4001;
        assert_eq!(gpus.first_exceeded_by(&used), Some(ResourceKind::Gpu));
        assert_eq!(gpus.cap(&ResourceKind::Cpu), None);
        assert_eq!(gpus.cap(&ResourceKind::Gpu), Some(4000));

        let mut spec = ResourceVec::new(8000, 0, 2000);
        spec.ext.insert("rdma/hca".into(), 2);
        let named = [
            ResourceKind::Cpu,
            ResourceKind::Extended("rdma/hca".into()),
            ResourceKind::Cpu,
        ];
        let l = ResourceLimit::named(&spec, &named);
        assert_eq!(l.gpu_milli, None, "GPUs were not named");
        assert_eq!(
            l.caps().collect::<Vec<_>>(),
            vec![
                (ResourceKind::Cpu, 8000),
                (ResourceKind::Extended("rdma/hca".into()), 2)
            ]
        );
        // A named zero is a real cap of zero.
        let zero = ResourceLimit::named(&ResourceVec::default(), &[ResourceKind::Memory]);
        assert_eq!(
            ResourceKind::from_resource_name("nvidia.com/gpu"),
            ResourceKind::Gpu
        );
        assert_eq!(
            ResourceKind::from_resource_name("gpusched.io/gpu-milli"),
            ResourceKind::Gpu
        );
        assert_eq!(
            ResourceKind::from_resource_name("rdma/hca"),
            ResourceKind::Extended("rdma/hca".into())
        );
        assert_eq!(zero.first_exceeded_by(&used), Some(ResourceKind::Memory));
        assert!(ResourceLimit::default().is_unbounded());
        assert!(!zero.is_unbounded());

        let c = l.clamp(&used);
        assert_eq!(c.cpu_milli, 8000);
        assert_eq!(c.gpu_milli, 4001, "uncapped dimension kept");
        assert_eq!(c.memory, 512 << 30);
        assert_eq!(c.ext_get("rdma/hca"), 2);
    }

    #[test]
    fn a_limit_round_trips_and_reads_older_files_as_fully_named() {
        let l = ResourceLimit::gpus(2000);
        let j = serde_json::to_string(&l).unwrap();
        assert_eq!(j, r#"{"gpuMilli":2000}"#);
        // the snake_case names of files written before 0.2 still read
        assert_eq!(
            serde_json::from_str::<ResourceLimit>(r#"{"gpu_milli":2000}"#).unwrap(),
            l
        );
        assert_eq!(serde_json::from_str::<ResourceLimit>(&j).unwrap(), l);
        // A limit written as a full ResourceVec (older snapshot files) caps
        // every dimension it lists, as it did then.
        let old: ResourceLimit =
            serde_json::from_str(r#"{"cpu_milli":1,"memory":2,"gpu_milli":3,"gpu_mem_mib":4}"#)
                .unwrap();
        assert_eq!(old.caps().count(), 4);
    }

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

//! Free capacity of every node, kept in step as pods are placed and removed.
//!
//! Every change goes through [`ClusterState::assign`] and
//! [`ClusterState::release`], which refuse to overcommit any dimension or any
//! GPU, so a placement bug surfaces as an error instead of a double-booked
//! GPU. Each node carries a version number, bumped on every change, which
//! lets scorers cache per-node results.

use crate::snapshot::{GpuAssignment, NodeId, Snapshot};
use gpusched_model::{GPU_MILLI, GpuRequest, Node, Pod, ResourceVec};

/// Free capacity of one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeState {
    /// Free CPU, memory, extended resources; `gpu_milli` and `gpu_mem_mib`
    /// are the sums over usable GPUs.
    pub free: ResourceVec,
    /// Free milli-GPU per GPU position (0 for an unusable GPU).
    pub gpu_free_milli: Vec<u32>,
    /// Free memory (MiB) per GPU position.
    pub gpu_free_mem: Vec<u64>,
    /// Whether each GPU may be used whole or shared (healthy, not in MIG
    /// mode).
    pub gpu_usable: Vec<bool>,
    /// Whether each GPU in MIG mode may give out instances (healthy; false
    /// for GPUs not in MIG mode).
    pub mig_usable: Vec<bool>,
    /// Instances in use per GPU in MIG mode, bit `i` = instance `i`.
    pub mig_used: Vec<u64>,
    /// Free milli-GPU per GPU in MIG mode (1000 less its used instances'
    /// measure; 0 when unusable or not in MIG mode).
    pub mig_free_milli: Vec<u32>,
    /// Bumped on every change.
    pub version: u64,
    /// Pods placed on the node.
    pub pods: u32,
}

impl NodeState {
    /// An empty node (healthy GPUs usable, everything free).
    pub fn new(node: &Node) -> Self {
        let usable: Vec<bool> = node
            .gpus
            .iter()
            .map(|g| g.is_healthy() && !g.is_mig())
            .collect();
        let mig_usable: Vec<bool> = node
            .gpus
            .iter()
            .map(|g| g.is_healthy() && g.is_mig())
            .collect();
        let mig_free_milli: Vec<u32> = mig_usable
            .iter()
            .map(|u| if *u { GPU_MILLI as u32 } else { 0 })
            .collect();
        let mut free = node.allocatable.clone();
        free.gpu_milli = 0;
        free.gpu_mem_mib = 0;
        let gpu_free_milli: Vec<u32> = usable
            .iter()
            .map(|u| if *u { GPU_MILLI as u32 } else { 0 })
            .collect();
        let gpu_free_mem: Vec<u64> = node
            .gpus
            .iter()
            .zip(&usable)
            .map(|(g, u)| if *u { g.memory_mib } else { 0 })
            .collect();
        free.gpu_milli = gpu_free_milli
            .iter()
            .chain(&mig_free_milli)
            .map(|m| *m as u64)
            .sum();
        free.gpu_mem_mib = gpu_free_mem.iter().sum();
        NodeState {
            free,
            gpu_free_milli,
            gpu_free_mem,
            gpu_usable: usable,
            mig_used: vec![0; node.gpus.len()],
            mig_usable,
            mig_free_milli,
            version: 0,
            pods: 0,
        }
    }

    /// Number of usable GPUs that are completely free.
    pub fn whole_free(&self) -> u32 {
        self.gpu_free_milli
            .iter()
            .filter(|m| **m as u64 == GPU_MILLI)
            .count() as u32
    }

    /// Milli-GPU of the node's usable GPUs, whole, shared or in MIG mode
    /// (each GPU counts 1000 once).
    pub fn gpu_capacity_milli(&self) -> u64 {
        let n = self
            .gpu_usable
            .iter()
            .zip(&self.mig_usable)
            .filter(|(a, b)| **a || **b)
            .count() as u64;
        n * GPU_MILLI
    }

    /// Free instances of `(resource, profile)` on GPU `g` of `node`
    /// (positions in its [`gpusched_model::Gpu::mig`], ascending); empty
    /// when the GPU is not usable in MIG mode.
    pub fn free_mig(&self, node: &Node, g: usize, resource: &str, profile: &str) -> Vec<u32> {
        if !self.mig_usable.get(g).copied().unwrap_or(false) {
            return Vec::new();
        }
        let used = self.mig_used[g];
        node.gpus[g]
            .mig
            .iter()
            .enumerate()
            .filter(|(i, m)| {
                *i < 64 && used & (1 << i) == 0 && m.resource == resource && m.profile == profile
            })
            .map(|(i, _)| i as u32)
            .collect()
    }
}

/// Why an assignment was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// Not enough of a resource is free.
    #[error("node {node}: not enough {what}")]
    Insufficient {
        /// The node's name.
        node: String,
        /// The resource.
        what: String,
    },
    /// The GPU does not exist or is unusable.
    #[error("node {node}: gpu {gpu} does not exist or is unusable")]
    BadGpu {
        /// The node's name.
        node: String,
        /// The GPU's position.
        gpu: u32,
    },
    /// A GPU listed twice in one assignment.
    #[error("node {node}: gpu {gpu} listed twice")]
    DuplicateGpu {
        /// The node's name.
        node: String,
        /// The GPU's position.
        gpu: u32,
    },
    /// No such node.
    #[error("node id {0} out of range")]
    BadNode(NodeId),
}

/// The free capacity of a set of nodes.
#[derive(Clone, Debug)]
pub struct ClusterState<'a> {
    nodes: &'a [Node],
    state: Vec<NodeState>,
    models: std::sync::Arc<NodeModels<'a>>,
    /// Free GPU milli per model index, kept by assign/release.
    free_by_model: Vec<u64>,
    /// With [`ClusterState::keep_originals`]: each node's state before the
    /// first change since, to put back with
    /// [`ClusterState::restore_originals`].
    originals: Option<std::collections::BTreeMap<NodeId, NodeState>>,
}

/// The owned part of a [`ClusterState`]: every node's free capacity,
/// without the borrowed nodes (kept by the incremental core between
/// cycles).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateParts {
    /// Per node, by [`NodeId`].
    pub state: Vec<NodeState>,
}

/// The GPU model of every node as a small index (the model of the node's
/// first GPU, `""` without GPUs), interned once per [`ClusterState`]: a
/// scorer that sums per model in every decision reads an integer per node
/// instead of comparing names.
#[derive(Debug, Default)]
struct NodeModels<'a> {
    names: Vec<&'a str>,
    of_node: Vec<u32>,
}

impl<'a> NodeModels<'a> {
    fn new(nodes: &'a [Node]) -> Self {
        let mut m = NodeModels {
            names: Vec::new(),
            of_node: Vec::with_capacity(nodes.len()),
        };
        for n in nodes {
            let name = n.gpus.first().map_or("", |g| g.model.as_str());
            // a handful of models per cluster: a search beats a map
            let k = match m.names.iter().position(|x| *x == name) {
                Some(k) => k,
                None => {
                    m.names.push(name);
                    m.names.len() - 1
                }
            };
            m.of_node.push(k as u32);
        }
        m
    }
}

/// Effective milli-GPU of a share on a given GPU: a memory-only share
/// counts its fraction of the GPU's memory, rounded up.
pub fn share_milli(milli: u32, memory_mib: u64, gpu_memory_mib: u64) -> u32 {
    if milli > 0 || gpu_memory_mib == 0 {
        milli
    } else {
        (memory_mib
            .saturating_mul(GPU_MILLI)
            .div_ceil(gpu_memory_mib))
        .min(GPU_MILLI) as u32
    }
}

impl<'a> ClusterState<'a> {
    /// Empty nodes.
    pub fn new(nodes: &'a [Node]) -> Self {
        let state: Vec<NodeState> = nodes.iter().map(NodeState::new).collect();
        let models = NodeModels::new(nodes);
        let mut free_by_model = vec![0; models.names.len()];
        for (st, &k) in state.iter().zip(&models.of_node) {
            free_by_model[k as usize] += st.free.gpu_milli;
        }
        ClusterState {
            nodes,
            state,
            models: std::sync::Arc::new(models),
            free_by_model,
            originals: None,
        }
    }

    /// The state of `nodes` from parts an earlier [`ClusterState`] over the
    /// same nodes gave ([`ClusterState::into_parts`]): the incremental
    /// core keeps the free capacity across cycles instead of rebuilding it
    /// from every pod. `None` when the parts do not match the nodes (a
    /// different count or GPU layout).
    pub fn from_parts(nodes: &'a [Node], parts: StateParts) -> Option<Self> {
        let StateParts { state } = parts;
        if state.len() != nodes.len()
            || state
                .iter()
                .zip(nodes)
                .any(|(s, n)| s.gpu_usable.len() != n.gpus.len())
        {
            return None;
        }
        let models = NodeModels::new(nodes);
        let mut free_by_model = vec![0; models.names.len()];
        for (st, &k) in state.iter().zip(&models.of_node) {
            free_by_model[k as usize] += st.free.gpu_milli;
        }
        Some(ClusterState {
            nodes,
            state,
            models: std::sync::Arc::new(models),
            free_by_model,
            originals: None,
        })
    }

    /// From now on, keeps each node's state as it was before its first
    /// change, for [`ClusterState::restore_originals`] (the incremental
    /// core: a cycle's trials, holds and binds are all undone, whatever
    /// path made them).
    pub fn keep_originals(&mut self) {
        self.originals = Some(Default::default());
    }

    /// Puts back every node's state as it was at
    /// [`ClusterState::keep_originals`] (the per-model free totals are not
    /// kept up: for [`ClusterState::into_parts`] only).
    pub fn restore_originals(&mut self) {
        for (n, st) in self.originals.take().unwrap_or_default() {
            self.state[n as usize] = st;
        }
    }

    /// The owned part of this state (what [`ClusterState::from_parts`]
    /// takes back).
    pub fn into_parts(self) -> StateParts {
        StateParts { state: self.state }
    }

    /// Nodes with every pod of the snapshot that holds resources placed.
    /// Pods whose holdings do not fit are reported, never double-booked.
    pub fn from_snapshot(s: &'a Snapshot) -> (Self, Vec<(usize, StateError)>) {
        let mut cs = ClusterState::new(&s.nodes);
        let mut errors = Vec::new();
        for (i, p) in s.pods.iter().enumerate() {
            if let Some((node, gpus)) = p.holding()
                && let Err(e) = cs.assign(node, &p.pod.requests, gpus)
            {
                errors.push((i, e));
            }
        }
        (cs, errors)
    }

    /// Node `id`.
    pub fn node(&self, id: NodeId) -> &'a Node {
        &self.nodes[id as usize]
    }

    /// The nodes, by [`NodeId`].
    pub fn nodes(&self) -> &'a [Node] {
        self.nodes
    }

    /// The state of every node, by [`NodeId`] (read-only: changes go
    /// through [`ClusterState::assign`] and [`ClusterState::release`]).
    pub fn states(&self) -> &[NodeState] {
        &self.state
    }

    /// The state of node `id`.
    pub fn get(&self, id: NodeId) -> &NodeState {
        &self.state[id as usize]
    }

    /// The GPU models of the nodes (each once, in order of first node).
    pub fn model_names(&self) -> &[&'a str] {
        &self.models.names
    }

    /// Index into [`ClusterState::model_names`] of the model of node `id`
    /// (its first GPU's; `""` for a node without GPUs).
    pub fn model_index(&self, id: NodeId) -> usize {
        self.models.of_node[id as usize] as usize
    }

    /// Free GPU milli of the nodes of each model, by the index of
    /// [`ClusterState::model_names`] (kept in step by assign and release).
    pub fn free_gpu_milli_by_model(&self) -> &[u64] {
        &self.free_by_model
    }

    /// How many nodes.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether there are no nodes.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Places `requests` (CPU, memory, extended) and `gpus` on `node`.
    /// Checks everything first; changes nothing on error.
    pub fn assign(
        &mut self,
        node: NodeId,
        requests: &ResourceVec,
        gpus: &GpuAssignment,
    ) -> Result<(), StateError> {
        let n = self
            .nodes
            .get(node as usize)
            .ok_or(StateError::BadNode(node))?;
        if let Some(o) = &mut self.originals {
            o.entry(node)
                .or_insert_with(|| self.state[node as usize].clone());
        }
        let st = &mut self.state[node as usize];
        let free_before = st.free.gpu_milli;
        let mut cpu_mem = requests.clone();
        cpu_mem.gpu_milli = 0;
        cpu_mem.gpu_mem_mib = 0;
        let mut cap = st.free.clone();
        cap.gpu_milli = 0;
        cap.gpu_mem_mib = 0;
        if let Some(k) = cpu_mem.first_exceeding(&cap) {
            return Err(StateError::Insufficient {
                node: n.name.clone(),
                what: k.to_string(),
            });
        }
        match gpus {
            GpuAssignment::None => {}
            GpuAssignment::Whole(list) => {
                for (i, &g) in list.iter().enumerate() {
                    let gi = g as usize;
                    if gi >= st.gpu_usable.len() || !st.gpu_usable[gi] {
                        return Err(StateError::BadGpu {
                            node: n.name.clone(),
                            gpu: g,
                        });
                    }
                    if list[..i].contains(&g) {
                        return Err(StateError::DuplicateGpu {
                            node: n.name.clone(),
                            gpu: g,
                        });
                    }
                    if st.gpu_free_milli[gi] as u64 != GPU_MILLI
                        || st.gpu_free_mem[gi] != n.gpus[gi].memory_mib
                    {
                        return Err(StateError::Insufficient {
                            node: n.name.clone(),
                            what: format!("whole gpu {g} (in use)"),
                        });
                    }
                }
                for &g in list {
                    let gi = g as usize;
                    st.gpu_free_milli[gi] = 0;
                    st.free.gpu_mem_mib -= st.gpu_free_mem[gi];
                    st.gpu_free_mem[gi] = 0;
                    st.free.gpu_milli -= GPU_MILLI;
                }
            }
            GpuAssignment::Share {
                gpu,
                milli,
                memory_mib,
            } => {
                let gi = *gpu as usize;
                if gi >= st.gpu_usable.len() || !st.gpu_usable[gi] {
                    return Err(StateError::BadGpu {
                        node: n.name.clone(),
                        gpu: *gpu,
                    });
                }
                if st.gpu_free_milli[gi] < *milli || st.gpu_free_mem[gi] < *memory_mib {
                    return Err(StateError::Insufficient {
                        node: n.name.clone(),
                        what: format!("share of gpu {gpu}"),
                    });
                }
                st.gpu_free_milli[gi] -= milli;
                st.gpu_free_mem[gi] -= memory_mib;
                st.free.gpu_milli -= *milli as u64;
                st.free.gpu_mem_mib -= memory_mib;
            }
            GpuAssignment::Mig {
                gpu,
                instances,
                milli,
            } => {
                let gi = *gpu as usize;
                if gi >= st.mig_usable.len() || !st.mig_usable[gi] {
                    return Err(StateError::BadGpu {
                        node: n.name.clone(),
                        gpu: *gpu,
                    });
                }
                let slots = &n.gpus[gi].mig;
                let mut mask = 0u64;
                let mut sum = 0u32;
                for &i in instances {
                    let Some(m) = slots.get(i as usize).filter(|_| i < 64) else {
                        return Err(StateError::BadGpu {
                            node: n.name.clone(),
                            gpu: *gpu,
                        });
                    };
                    if mask & (1 << i) != 0 {
                        return Err(StateError::DuplicateGpu {
                            node: n.name.clone(),
                            gpu: *gpu,
                        });
                    }
                    if st.mig_used[gi] & (1 << i) != 0 {
                        return Err(StateError::Insufficient {
                            node: n.name.clone(),
                            what: format!("MIG instance {} of gpu {gpu} (in use)", m.id),
                        });
                    }
                    mask |= 1 << i;
                    sum += m.milli;
                }
                if instances.is_empty() || sum != *milli || st.mig_free_milli[gi] < sum {
                    return Err(StateError::Insufficient {
                        node: n.name.clone(),
                        what: format!(
                            "MIG instances of gpu {gpu} ({milli} milli asked, {sum} named)"
                        ),
                    });
                }
                st.mig_used[gi] |= mask;
                st.mig_free_milli[gi] -= sum;
                st.free.gpu_milli -= sum as u64;
            }
        }
        st.free.sub(&cpu_mem);
        st.version += 1;
        st.pods += 1;
        let taken = free_before - st.free.gpu_milli;
        self.free_by_model[self.models.of_node[node as usize] as usize] -= taken;
        Ok(())
    }

    /// Gives back what [`ClusterState::assign`] took.
    pub fn release(&mut self, node: NodeId, requests: &ResourceVec, gpus: &GpuAssignment) {
        let Some(n) = self.nodes.get(node as usize) else {
            return;
        };
        if let Some(o) = &mut self.originals {
            o.entry(node)
                .or_insert_with(|| self.state[node as usize].clone());
        }
        let st = &mut self.state[node as usize];
        let free_before = st.free.gpu_milli;
        let mut cpu_mem = requests.clone();
        cpu_mem.gpu_milli = 0;
        cpu_mem.gpu_mem_mib = 0;
        st.free.add(&cpu_mem);
        match gpus {
            GpuAssignment::None => {}
            GpuAssignment::Whole(list) => {
                for &g in list {
                    let gi = g as usize;
                    if gi < st.gpu_usable.len() && st.gpu_usable[gi] {
                        st.gpu_free_milli[gi] = GPU_MILLI as u32;
                        st.free.gpu_mem_mib += n.gpus[gi].memory_mib - st.gpu_free_mem[gi];
                        st.gpu_free_mem[gi] = n.gpus[gi].memory_mib;
                        st.free.gpu_milli += GPU_MILLI;
                    }
                }
            }
            GpuAssignment::Share {
                gpu,
                milli,
                memory_mib,
            } => {
                let gi = *gpu as usize;
                if gi < st.gpu_usable.len() && st.gpu_usable[gi] {
                    st.gpu_free_milli[gi] += milli;
                    st.gpu_free_mem[gi] += memory_mib;
                    st.free.gpu_milli += *milli as u64;
                    st.free.gpu_mem_mib += memory_mib;
                }
            }
            GpuAssignment::Mig { gpu, instances, .. } => {
                let gi = *gpu as usize;
                if gi < st.mig_usable.len() && st.mig_usable[gi] {
                    for &i in instances {
                        if i < 64
                            && st.mig_used[gi] & (1 << i) != 0
                            && let Some(m) = n.gpus[gi].mig.get(i as usize)
                        {
                            st.mig_used[gi] &= !(1 << i);
                            st.mig_free_milli[gi] += m.milli;
                            st.free.gpu_milli += m.milli as u64;
                        }
                    }
                }
            }
        }
        st.version += 1;
        st.pods = st.pods.saturating_sub(1);
        let given = st.free.gpu_milli - free_before;
        self.free_by_model[self.models.of_node[node as usize] as usize] += given;
    }

    /// Where `pod`'s MIG instances would go on `node`, if it asks MIG
    /// instances and a usable GPU of an allowed model has `count` free
    /// instances of its (resource, profile): the GPU with the fewest such
    /// instances left after placing (best fit), then the lowest position;
    /// its lowest free instances. `None` when the pod asks none or none fit.
    pub fn mig_choice(&self, pod: &Pod, node: NodeId) -> Option<GpuAssignment> {
        let ask = pod.mig.as_ref()?;
        let n = self.node(node);
        let st = self.get(node);
        let want = ask.count as usize;
        (0..n.gpus.len())
            .filter(|&g| st.mig_usable[g] && pod.allows_model(&n.gpus[g].model))
            .filter_map(|g| {
                let free = st.free_mig(n, g, &ask.resource, &ask.profile);
                (want > 0 && free.len() >= want).then(|| (free.len() - want, g, free))
            })
            .min_by_key(|(left, g, _)| (*left, *g))
            .map(|(_, g, mut free)| {
                free.truncate(want);
                let milli = free.iter().map(|&i| n.gpus[g].mig[i as usize].milli).sum();
                GpuAssignment::Mig {
                    gpu: g as u32,
                    instances: free,
                    milli,
                }
            })
    }

    /// Whether GPU `g` of `node` is allowed for `pod` (model, memory, and
    /// what its DRA claims may take: [`gpusched_model::dra::ClaimGpus`]).
    pub fn gpu_allowed(&self, pod: &Pod, node: NodeId, g: usize) -> bool {
        let n = self.node(node);
        let gpu = &n.gpus[g];
        pod.allows_model(&gpu.model)
            && gpu.memory_mib >= pod.min_gpu_memory_mib
            && claim_gpus(pod).is_none_or(|c| c.allows(&n.name, g))
    }

    /// `k` whole GPUs for a pod with DRA claim constraints
    /// ([`gpusched_model::dra::ClaimGpus`]): the topology-best set of `k`
    /// allowed free GPUs of one group (the group with the fewest such GPUs
    /// that has `k`). `None` when no group has `k` free.
    pub fn claim_whole_choice(&self, pod: &Pod, node: NodeId, k: usize) -> Option<Vec<u32>> {
        let free = self.free_whole_gpus(pod, node);
        let n = self.node(node);
        let group = match claim_gpus(pod) {
            Some(c) => c.pick_group(&n.name, &free, k)?,
            None if free.len() >= k => free,
            None => return None,
        };
        let set = gpusched_model::topology::choose(&n.topos(), &group, &[], k)?;
        Some(set.into_iter().map(|g| g as u32).collect())
    }

    /// Whether `gpus` on `node` keep `pod`'s DRA claim constraints (every
    /// GPU allowed, all of one group); true for a pod without them.
    pub fn claim_gpus_admit(&self, pod: &Pod, node: NodeId, gpus: &GpuAssignment) -> bool {
        let Some(c) = claim_gpus(pod) else {
            return true;
        };
        let name = &self.node(node).name;
        match gpus {
            GpuAssignment::None => true,
            GpuAssignment::Whole(v) => c.admits(name, v.iter().map(|&g| g as usize)),
            GpuAssignment::Share { gpu, .. } | GpuAssignment::Mig { gpu, .. } => {
                c.allows(name, *gpu as usize)
            }
        }
    }

    /// Whether CPU, memory and extended resources fit on the node.
    pub fn fits_non_gpu(&self, pod: &Pod, node: NodeId) -> bool {
        let f = &self.get(node).free;
        let r = &pod.requests;
        r.cpu_milli <= f.cpu_milli
            && r.memory <= f.memory
            && r.ext.iter().all(|(k, v)| *v <= f.ext_get(k))
    }

    /// Usable, allowed GPUs that are completely free.
    pub fn free_whole_gpus(&self, pod: &Pod, node: NodeId) -> Vec<usize> {
        let st = self.get(node);
        (0..st.gpu_free_milli.len())
            .filter(|&g| st.gpu_free_milli[g] as u64 == GPU_MILLI && self.gpu_allowed(pod, node, g))
            .collect()
    }

    /// The GPUs a share of `pod` could go on: `(gpu, effective milli)`.
    pub fn share_candidates(&self, pod: &Pod, node: NodeId) -> Vec<(usize, u32)> {
        let GpuRequest::Share { milli, memory_mib } = pod.gpu else {
            return Vec::new();
        };
        let st = self.get(node);
        let n = self.node(node);
        (0..st.gpu_free_milli.len())
            .filter(|&g| st.gpu_usable[g] && self.gpu_allowed(pod, node, g))
            .filter_map(|g| {
                let m = share_milli(milli, memory_mib, n.gpus[g].memory_mib);
                (st.gpu_free_milli[g] >= m && st.gpu_free_mem[g] >= memory_mib && m > 0)
                    .then_some((g, m))
            })
            .collect()
    }

    /// The default GPU choice for `pod` on `node`, or `None` if its GPU
    /// request cannot be met there. Whole GPUs: the topology-best set
    /// ([`gpusched_model::topology::choose`]). Shares: best fit (the GPU with
    /// the least compute left after placing, then the lowest position).
    /// CPU, memory and extended resources are not checked here.
    pub fn default_gpu_choice(&self, pod: &Pod, node: NodeId) -> Option<GpuAssignment> {
        match pod.gpu {
            _ if pod.mig.is_some() => self.mig_choice(pod, node),
            GpuRequest::None | GpuRequest::Whole(0) => Some(GpuAssignment::None),
            GpuRequest::Whole(k) if claim_gpus(pod).is_some() => self
                .claim_whole_choice(pod, node, k as usize)
                .map(GpuAssignment::Whole),
            GpuRequest::Whole(k) => {
                let free = self.free_whole_gpus(pod, node);
                if free.len() < k as usize {
                    return None;
                }
                let topos = self.node(node).topos();
                let set = gpusched_model::topology::choose(&topos, &free, &[], k as usize)?;
                Some(GpuAssignment::Whole(
                    set.into_iter().map(|g| g as u32).collect(),
                ))
            }
            GpuRequest::Share { memory_mib, .. } => {
                let st = self.get(node);
                self.share_candidates(pod, node)
                    .into_iter()
                    .min_by_key(|&(g, m)| (st.gpu_free_milli[g] - m, g))
                    .map(|(g, m)| GpuAssignment::Share {
                        gpu: g as u32,
                        milli: m,
                        memory_mib,
                    })
            }
        }
    }

    /// Total usable GPU milli and used GPU milli over all nodes.
    pub fn gpu_milli_totals(&self) -> (u64, u64) {
        let mut total = 0;
        let mut free = 0;
        for st in &self.state {
            total += st.gpu_capacity_milli();
            free += st.free.gpu_milli;
        }
        (total, total - free)
    }
}

/// A pod's DRA claim constraints on GPUs, if it has any.
pub fn claim_gpus(pod: &Pod) -> Option<&gpusched_model::dra::ClaimGpus> {
    pod.constraints.as_deref()?.claim_gpus.as_ref()
}

#[cfg(test)]
pub(crate) mod tests;

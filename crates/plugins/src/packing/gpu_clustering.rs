//! `gpu-clustering`: the FGD paper's "GpuClustering" baseline — keep pods
//! of the same GPU shape together.
//!
//! A GPU pod's tag is `share` (a share of one GPU) or `k-gpu` (k whole
//! GPUs). With `b = ⌊25 · (8000 − gpu_free) / 8000⌋` (more used → higher):
//! - the node runs pods of this tag only: `75 + b`;
//! - it runs this tag among others: `50 + b`;
//! - it runs no GPU pod: `25 + b`;
//! - it runs only other tags: `b`.
//!
//! CPU-only pods score 0 everywhere. The tags on each node are counted in
//! `prepare` from the snapshot's pods that hold resources; a node changed
//! later in the same cycle keeps the tags it had then. Shares go on the
//! best-fit GPU, whole GPUs on the topology choice.

use super::util::{WholeChooser, share_best_fit};
use gpusched_core::{ClusterState, NodeId, PackEnv, Packer, Placement};
use gpusched_model::{GpuRequest, Pod};

/// Tag of a GPU request: 0 = share, k = k whole GPUs, `None` = no GPU.
pub fn tag(gpu: &GpuRequest) -> Option<u32> {
    match *gpu {
        GpuRequest::None | GpuRequest::Whole(0) => None,
        GpuRequest::Whole(k) => Some(k),
        GpuRequest::Share { .. } => Some(0),
    }
}

/// Tags present on one node (tag, pods), tiny.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeTags(Vec<(u32, u32)>);

impl NodeTags {
    /// Adds the shape tag `t`.
    pub fn add(&mut self, t: u32) {
        match self.0.iter_mut().find(|(x, _)| *x == t) {
            Some((_, c)) => *c += 1,
            None => self.0.push((t, 1)),
        }
    }
    /// Whether the shape tag `t` is present.
    pub fn has(&self, t: u32) -> bool {
        self.0.iter().any(|(x, c)| *x == t && *c > 0)
    }
    /// How many distinct shape tags are present.
    pub fn kinds(&self) -> usize {
        self.0.len()
    }
}

/// GPU clustering placement.
#[derive(Default)]
pub struct GpuClusteringPacker {
    tags: Vec<NodeTags>,
    whole: WholeChooser,
}

impl GpuClusteringPacker {
    /// The policy (tags recounted in `prepare`).
    pub fn new() -> Self {
        Self::default()
    }
}

/// The reference score for a pod with tag `t` on a node with `tags` and
/// `gpu_free` milli free.
pub fn gpu_clustering_score(t: Option<u32>, tags: &NodeTags, gpu_free: u64) -> i64 {
    let Some(t) = t else { return 0 };
    let b = 25 * (8000 - gpu_free.min(8000) as i64) / 8000;
    if tags.has(t) {
        if tags.kinds() == 1 { 75 + b } else { 50 + b }
    } else if tags.kinds() == 0 {
        25 + b
    } else {
        b
    }
}

impl Packer for GpuClusteringPacker {
    fn name(&self) -> &'static str {
        super::names::PolicyName::GpuClustering.as_str()
    }

    fn prepare(&mut self, env: &PackEnv<'_, '_>) {
        self.tags.clear();
        self.tags
            .resize(env.snapshot.nodes.len(), NodeTags::default());
        for p in &env.snapshot.pods {
            if let Some((node, _)) = p.holding()
                && let Some(t) = tag(&p.pod.gpu)
                && let Some(nt) = self.tags.get_mut(node as usize)
            {
                nt.add(t);
            }
        }
    }

    fn place(&self, pod: &Pod, node: NodeId, state: &ClusterState<'_>) -> Option<Placement> {
        let gpus = self
            .whole
            .assignment(state, pod, node, || share_best_fit(state, pod, node))?;
        let empty = NodeTags::default();
        let tags = self.tags.get(node as usize).unwrap_or(&empty);
        Some(Placement {
            score: gpu_clustering_score(tag(&pod.gpu), tags, state.get(node).free.gpu_milli).into(),
            gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::{GpuAssignment, PodPhase, PodState, Snapshot};
    use gpusched_testkit::packing::*;

    #[test]
    fn keeps_shapes_together() {
        let nodes = vec![
            node("empty", 4, 32_000, "T4"),
            node("shares", 4, 32_000, "T4"),
            node("mixed", 4, 32_000, "T4"),
            node("whole", 4, 32_000, "T4"),
        ];
        let mut snap = Snapshot {
            nodes: nodes.clone(),
            ..Default::default()
        };
        let mut running = |n: NodeId, gpu: GpuRequest, g: GpuAssignment| {
            let mut p = pod(1000, gpu);
            p.name = format!("r{}", snap.pods.len());
            snap.pods.push(PodState {
                pod: p.into(),
                phase: PodPhase::Running {
                    node: n,
                    gpus: g,
                    since_ms: 0,
                },
            });
        };
        let sh = |gpu| GpuAssignment::Share {
            gpu,
            milli: 300,
            memory_mib: 0,
        };
        running(1, share(300), sh(0));
        running(2, share(300), sh(0));
        running(2, GpuRequest::Whole(1), GpuAssignment::Whole(vec![1]));
        running(3, GpuRequest::Whole(1), GpuAssignment::Whole(vec![0]));
        let (cs, errs) = ClusterState::from_snapshot(&snap);
        assert!(errs.is_empty());
        let mut p = GpuClusteringPacker::new();
        prepare(&mut p, &snap, &cs, 0);
        let s = |pd: &Pod, n| p.place(pd, n, &cs).unwrap().score;
        let shp = pod(1000, share(300));
        // b = 25 * (8000 - free) / 8000 for free = 4000, 3700, 2700, 3000
        assert_eq!(s(&shp, 0), 25 + 12);
        assert_eq!(s(&shp, 1), 75 + 13);
        assert_eq!(s(&shp, 2), 50 + 16);
        assert_eq!(s(&shp, 3), 15);
        assert_eq!(pick(&p, &shp, &cs).unwrap().0, 1);
        assert_eq!(pick(&p, &pod(100, GpuRequest::Whole(1)), &cs).unwrap().0, 3);
        assert_eq!(s(&pod(100, GpuRequest::None), 1), 0);
    }
}

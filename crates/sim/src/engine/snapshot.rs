//! The incremental snapshot: the scheduler's view of the world, rebuilt
//! only where something changed (node cache, reused pod states), and a
//! fresh one to verify it against.

use super::*;

impl<'a> Sim<'a> {
    /// Builds the snapshot of the live cluster: nodes that are up, pods
    /// pending or running. Returns it with the maps snapshot id → sim id.
    pub(super) fn snapshot(
        &mut self,
    ) -> (Snapshot, Vec<SimPod>, Vec<SimNode>, Vec<Option<NodeId>>) {
        if self.node_cache.is_none() {
            let mut node_map = Vec::new();
            let mut rev = vec![None; self.nodes.len()];
            let mut nodes = Vec::new();
            for (i, n) in self.nodes.iter().enumerate() {
                if n.up {
                    rev[i] = Some(nodes.len() as NodeId);
                    node_map.push(SimNode(i as u32));
                    nodes.push(n.node.clone());
                }
            }
            self.cached_nodes = nodes;
            self.node_cache = Some((node_map, rev));
        }
        let (node_map, rev) = self.node_cache.clone().unwrap_or_default();
        let nodes = std::mem::take(&mut self.cached_nodes);
        let mut pod_map = Vec::with_capacity(self.active.len());
        let mut pods = Vec::with_capacity(self.active.len());
        let mut groups_in: BTreeSet<SimGroup> = BTreeSet::new();
        // Reuse last snapshot's pod states (same id order): only new pods
        // are cloned, only changed phases rebuilt.
        let old_ids = std::mem::take(&mut self.snap_ids);
        let old_pods = std::mem::take(&mut self.snap_pods);
        let mut old = old_ids.into_iter().zip(old_pods).peekable();
        for &id in &self.active {
            let p = &self.pods[id.ix()];
            let same = |ph: &PodPhase| match (&p.phase, ph) {
                (Ph::Pending { nominated }, PodPhase::Pending { nominated: sn, .. }) => {
                    nominated.and_then(|n| rev[n.ix()]) == *sn
                }
                (
                    Ph::Running { node, gpus, since },
                    PodPhase::Running {
                        node: sn,
                        gpus: sg,
                        since_ms,
                    },
                ) => rev[node.ix()] == Some(*sn) && gpus == sg && since == since_ms,
                (Ph::Terminating { node, gpus }, PodPhase::Terminating { node: sn, gpus: sg }) => {
                    rev[node.ix()] == Some(*sn) && gpus == sg
                }
                _ => false,
            };
            let phase = || match &p.phase {
                Ph::Pending { nominated } => Some(PodPhase::Pending {
                    nominated: nominated.and_then(|n| rev[n.ix()]),
                    nominated_at_ms: None,
                }),
                Ph::Running { node, gpus, since } => rev[node.ix()].map(|sn| PodPhase::Running {
                    node: sn,
                    gpus: gpus.clone(),
                    since_ms: *since,
                }),
                Ph::Terminating { node, gpus } => rev[node.ix()].map(|sn| PodPhase::Terminating {
                    node: sn,
                    gpus: gpus.clone(),
                }),
                _ => None,
            };
            while old.peek().is_some_and(|(o, _)| *o < id) {
                old.next();
            }
            let reused = match old.peek() {
                Some((o, _)) if *o == id => old.next().map(|x| x.1),
                _ => None,
            };
            let ps = match reused {
                Some(ps) if same(&ps.phase) => ps,
                Some(mut ps) => match phase() {
                    Some(ph) => {
                        ps.phase = ph;
                        ps
                    }
                    None => continue,
                },
                None => match phase() {
                    Some(ph) => PodState {
                        pod: p.pod.clone(),
                        phase: ph,
                    },
                    None => continue, // backoff etc. are not in `active`
                },
            };
            if let Some(g) = p.group {
                groups_in.insert(g);
            }
            pod_map.push(id);
            pods.push(ps);
        }
        let snap = Snapshot {
            nodes,
            queues: self.sc.queues.clone(),
            groups: groups_in
                .iter()
                .map(|&g| self.groups[g.ix()].pg.clone())
                .collect(),
            pods,
        };
        (snap, pod_map, node_map, rev)
    }

    /// The snapshot built from scratch, without the caches of
    /// [`Sim::snapshot`]; verify mode checks that both agree.
    pub(super) fn snapshot_uncached(&self) -> (Snapshot, Vec<SimPod>) {
        let mut rev = vec![None; self.nodes.len()];
        let mut nodes = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            if n.up {
                rev[i] = Some(nodes.len() as NodeId);
                nodes.push(n.node.clone());
            }
        }
        let mut pod_map = Vec::new();
        let mut pods = Vec::new();
        let mut groups_in: BTreeSet<SimGroup> = BTreeSet::new();
        for &id in &self.active {
            let p = &self.pods[id.ix()];
            let phase = match &p.phase {
                Ph::Pending { nominated } => PodPhase::Pending {
                    nominated: nominated.and_then(|n| rev[n.ix()]),
                    nominated_at_ms: None,
                },
                Ph::Running { node, gpus, since } => match rev[node.ix()] {
                    Some(sn) => PodPhase::Running {
                        node: sn,
                        gpus: gpus.clone(),
                        since_ms: *since,
                    },
                    None => continue,
                },
                Ph::Terminating { node, gpus } => match rev[node.ix()] {
                    Some(sn) => PodPhase::Terminating {
                        node: sn,
                        gpus: gpus.clone(),
                    },
                    None => continue,
                },
                _ => continue,
            };
            if let Some(g) = p.group {
                groups_in.insert(g);
            }
            pod_map.push(id);
            pods.push(PodState {
                pod: p.pod.clone(),
                phase,
            });
        }
        let snap = Snapshot {
            nodes,
            queues: self.sc.queues.clone(),
            groups: groups_in
                .iter()
                .map(|&g| self.groups[g.ix()].pg.clone())
                .collect(),
            pods,
        };
        (snap, pod_map)
    }

    /// Takes back the nodes and pod states lent to a snapshot.
    pub(super) fn give_back(&mut self, snap: Snapshot, pod_map: Vec<SimPod>) {
        if self.node_cache.is_some() {
            self.cached_nodes = snap.nodes;
        }
        self.snap_pods = snap.pods;
        self.snap_ids = pod_map;
    }
}

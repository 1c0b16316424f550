//! Fault injection and cluster edits: the scenario's cluster events
//! (node failures and recoveries, GPU faults, drains, added nodes).

use super::*;

impl<'a> Sim<'a> {
    pub(super) fn cluster_event(&mut self, i: usize) {
        let e = &self.sc.events[i];
        let Some(&n) = self.node_idx.get(&e.node) else {
            self.error(format!("event on unknown node {:?}", e.node));
            return;
        };
        let on_node = |s: &Self| -> Vec<SimPod> { s.node_pods[n.ix()].iter().copied().collect() };
        self.node_cache = None;
        self.frag = None;
        let mut stopped = 0u32;
        let what;
        match e.kind {
            EventKind::NodeFailure => {
                what = "node failure".to_string();
                self.nodes[n.ix()].up = false;
                for p in on_node(self) {
                    // a terminating pod on a failed node is simply gone
                    if matches!(self.pods[p.ix()].phase, Ph::Terminating { .. }) {
                        let epoch = self.pods[p.ix()].epoch;
                        self.gone(p, epoch);
                        continue;
                    }
                    stopped += self.kill(p, Cause::Failure).len() as u32;
                }
            }
            EventKind::NodeRecovery => {
                what = "node recovery".to_string();
                self.nodes[n.ix()].up = true;
            }
            EventKind::GpuFailure | EventKind::GpuRecovery => {
                let g = e.gpu.unwrap_or(0) as usize;
                let fail = e.kind == EventKind::GpuFailure;
                what = format!("gpu {g} {}", if fail { "failure" } else { "recovery" });
                let node = &mut self.nodes[n.ix()].node;
                if let Some(gpu) = node.gpus.get_mut(g) {
                    gpu.health = if fail {
                        GpuHealth::Unhealthy
                    } else {
                        GpuHealth::Healthy
                    };
                }
                node.sync_gpu_allocatable();
                if fail {
                    let victims: Vec<SimPod> = on_node(self)
                        .into_iter()
                        .filter(|&p| match &self.pods[p.ix()].phase {
                            Ph::Running { gpus, .. } => match gpus {
                                GpuAssignment::Whole(l) => l.contains(&(g as u32)),
                                GpuAssignment::Share { gpu, .. }
                                | GpuAssignment::Mig { gpu, .. } => *gpu as usize == g,
                                GpuAssignment::None => false,
                            },
                            _ => false,
                        })
                        .collect();
                    for p in victims {
                        stopped += self.kill(p, Cause::Failure).len() as u32;
                    }
                }
            }
            EventKind::Drain => {
                what = "drain".to_string();
                self.nodes[n.ix()].node.unschedulable = true;
                for p in on_node(self) {
                    stopped += self.kill(p, Cause::Drain).len() as u32;
                }
            }
            EventKind::Uncordon => {
                what = "uncordon".to_string();
                self.nodes[n.ix()].node.unschedulable = false;
            }
        }
        // forget nominations of a node that can no longer take them
        if matches!(
            e.kind,
            EventKind::NodeFailure | EventKind::Drain | EventKind::GpuFailure
        ) {
            for &p in &self.active {
                if let Ph::Pending { nominated } = &mut self.pods[p.ix()].phase
                    && *nominated == Some(n)
                {
                    *nominated = None;
                }
            }
        }
        self.incidents.push(Incident {
            t_ms: self.now,
            what,
            node: e.node.clone(),
            pods_stopped: stopped,
        });
    }
}

//! Pod, group and job lifecycle: arrival, completion, stops and kills
//! (with their gang and retry backoff), pod-group time-outs.

use super::*;

impl<'a> Sim<'a> {
    pub(super) fn arrive(&mut self, j: SimJob) {
        let first = self.jobs[j.ix()].first_pod;
        let n = self.sc.jobs[j.ix()].pods;
        for id in (first.0..first.0 + n).map(SimPod) {
            let p = &mut self.pods[id.ix()];
            if p.phase == Ph::NotArrived {
                p.phase = Ph::Pending { nominated: None };
                self.active.insert(id);
            }
        }
    }

    pub(super) fn complete(&mut self, pod: SimPod, epoch: u32) -> bool {
        let p = &self.pods[pod.ix()];
        if p.epoch != epoch || !matches!(p.phase, Ph::Running { .. }) {
            return false;
        }
        self.stop(pod);
        let p = &mut self.pods[pod.ix()];
        p.phase = Ph::Succeeded;
        self.t.pods_succeeded += 1;
        let j = &mut self.jobs[p.job.ix()];
        j.left = j.left.saturating_sub(1);
        if j.left == 0 && !j.failed {
            j.end = Some(self.now);
        }
        true
    }

    /// Takes a running pod off its node (accounting only).
    pub(super) fn stop(&mut self, pod: SimPod) -> Option<(SimNode, GpuAssignment)> {
        let p = &mut self.pods[pod.ix()];
        let Ph::Running { node, gpus, .. } = std::mem::replace(&mut p.phase, Ph::Backoff) else {
            return None;
        };
        p.epoch += 1;
        self.active.remove(&pod);
        self.queue_used[p.queue] = self.queue_used[p.queue].saturating_sub(gpus.milli());
        self.node_used[node.ix()] = self.node_used[node.ix()].saturating_sub(gpus.milli());
        self.node_pods[node.ix()].remove(&pod);
        if let Some(g) = p.group {
            let g = &mut self.groups[g.ix()];
            g.running = g.running.saturating_sub(1);
        }
        Some((node, gpus))
    }

    /// A terminating pod is gone (its grace period is over, or its node
    /// failed): it gives back what it held and waits again.
    pub(super) fn gone(&mut self, pod: SimPod, epoch: u32) -> bool {
        let p = &mut self.pods[pod.ix()];
        if p.epoch != epoch {
            return false;
        }
        let Ph::Terminating { node, gpus } =
            std::mem::replace(&mut p.phase, Ph::Pending { nominated: None })
        else {
            return false;
        };
        p.epoch += 1;
        self.queue_used[p.queue] = self.queue_used[p.queue].saturating_sub(gpus.milli());
        self.node_used[node.ix()] = self.node_used[node.ix()].saturating_sub(gpus.milli());
        self.node_pods[node.ix()].remove(&pod);
        true
    }

    /// Evicts `pod` with its gang over the termination grace period: each
    /// running member turns terminating (still holding) and is gone at the
    /// end of the period. Returns the pods evicted with what they hold.
    pub(super) fn evict_with_grace(
        &mut self,
        pod: SimPod,
    ) -> Vec<(SimPod, SimNode, GpuAssignment)> {
        let targets: Vec<SimPod> = match self.pods[pod.ix()].group {
            Some(g) => self.groups[g.ix()]
                .members
                .iter()
                .copied()
                .filter(|&m| matches!(self.pods[m.ix()].phase, Ph::Running { .. }))
                .collect(),
            None => vec![pod],
        };
        let until = self.now + self.sc.settings.termination_grace_ms;
        let mut out = Vec::new();
        for t in targets {
            let p = &mut self.pods[t.ix()];
            let Ph::Running { node, gpus, .. } = p.phase.clone() else {
                continue;
            };
            p.phase = Ph::Terminating {
                node,
                gpus: gpus.clone(),
            };
            p.epoch += 1;
            let epoch = p.epoch;
            if let Some(g) = p.group {
                let g = &mut self.groups[g.ix()];
                g.running = g.running.saturating_sub(1);
            }
            self.t.requeues += 1;
            self.push(until, Ev::Gone { pod: t, epoch });
            out.push((t, node, gpus));
        }
        if !out.is_empty() && self.pods[pod.ix()].group.is_some() {
            self.t.gang_restarts += 1;
        }
        out
    }

    /// Stops `pod` for `cause`, with its gang, and decides what comes next.
    /// Returns the pods stopped with what they held.
    pub(super) fn kill(
        &mut self,
        pod: SimPod,
        cause: Cause,
    ) -> Vec<(SimPod, SimNode, GpuAssignment)> {
        let targets: Vec<SimPod> = match self.pods[pod.ix()].group {
            Some(g) => {
                let mut v: Vec<SimPod> = self.groups[g.ix()]
                    .members
                    .iter()
                    .copied()
                    .filter(|&m| matches!(self.pods[m.ix()].phase, Ph::Running { .. }))
                    .collect();
                if !v.contains(&pod) {
                    v.push(pod);
                }
                v
            }
            None => vec![pod],
        };
        let mut stopped = Vec::new();
        for &t in &targets {
            if let Some((n, g)) = self.stop(t) {
                stopped.push((t, n, g));
            }
        }
        if stopped.is_empty() {
            return stopped;
        }
        let group = self.pods[pod.ix()].group;
        if group.is_some() {
            self.t.gang_restarts += 1;
        }
        match cause {
            Cause::Preempt | Cause::Drain => {
                for &(t, _, _) in &stopped {
                    self.pods[t.ix()].phase = Ph::Pending { nominated: None };
                    self.active.insert(t);
                    self.t.requeues += 1;
                }
            }
            Cause::Failure => {
                self.t.failure_kills += stopped.len() as u64;
                let retries = match group {
                    Some(g) => {
                        self.groups[g.ix()].retries += 1;
                        self.groups[g.ix()].retries
                    }
                    None => {
                        self.pods[pod.ix()].retries += 1;
                        self.pods[pod.ix()].retries
                    }
                };
                if retries > self.sc.settings.retry_limit {
                    // give up on the whole unit (its waiting members too)
                    let unit: Vec<SimPod> = match group {
                        Some(g) => self.groups[g.ix()].members.clone(),
                        None => vec![pod],
                    };
                    for m in unit {
                        let p = &mut self.pods[m.ix()];
                        if matches!(p.phase, Ph::Succeeded | Ph::Failed) {
                            continue;
                        }
                        if matches!(p.phase, Ph::Running { .. }) {
                            continue; // not in this gang attempt
                        }
                        p.phase = Ph::Failed;
                        p.epoch += 1;
                        self.active.remove(&m);
                        self.t.pods_failed += 1;
                        self.t.retry_limit_failures += 1;
                        let j = &mut self.jobs[p.job.ix()];
                        if !j.failed {
                            j.failed = true;
                            j.end = None;
                            j.failed_why = Some((self.now, "retry limit reached"));
                        }
                    }
                } else {
                    let s = &self.sc.settings;
                    let back = s
                        .backoff_ms
                        .saturating_mul(1u64 << (retries - 1).min(30))
                        .min(s.backoff_max_ms.max(s.backoff_ms));
                    for &(t, _, _) in &stopped {
                        let p = &mut self.pods[t.ix()];
                        p.phase = Ph::Backoff;
                        let epoch = p.epoch;
                        self.t.retries += 1;
                        self.push(self.now + back, Ev::Retry { pod: t, epoch });
                    }
                }
            }
        }
        stopped
    }

    pub(super) fn time_out(&mut self, group: &str) {
        let Some(&g) = self.group_idx.get(group) else {
            self.error(format!("timeout of unknown group {group:?}"));
            return;
        };
        let mut any = false;
        for m in self.groups[g.ix()].members.clone() {
            let p = &mut self.pods[m.ix()];
            if matches!(p.phase, Ph::Pending { .. } | Ph::Backoff | Ph::NotArrived) {
                p.phase = Ph::Failed;
                p.epoch += 1;
                self.active.remove(&m);
                self.t.pods_failed += 1;
                let j = &mut self.jobs[p.job.ix()];
                if !j.failed {
                    j.failed_why = Some((self.now, "gang timed out"));
                }
                j.failed = true;
                any = true;
            }
        }
        if any {
            self.t.groups_timed_out += 1;
        }
    }
}

//! One scheduling cycle: build the snapshot, call the scheduler and apply
//! its decisions defensively (evictions, binds, nominations, group phases),
//! each checked against a cluster state built from the same snapshot.

use super::*;

impl<'a> Sim<'a> {
    pub(super) fn cycle(&mut self, engine: &mut Engine, hooks: &mut dyn Hooks) {
        self.last_cycle = Some(self.now);
        self.cycles += 1;
        let (snap, pod_map, node_map, _) = self.snapshot();
        if self.sc.settings.verify {
            let (fresh, fresh_map) = self.snapshot_uncached();
            if fresh != snap || fresh_map != pod_map {
                self.error("incremental snapshot differs from a fresh one".into());
            }
        }
        let cycle_seed = self
            .seed
            .wrapping_add(self.cycles.wrapping_mul(gpusched_model::mix::GOLDEN));
        // the snapshot as changes: only what differs from the engine's
        // state is applied, in the snapshot's order (ids are positions)
        if let Err(e) = engine.sync(&snap) {
            self.error(format!("the scheduler refused the cluster's changes: {e}"));
        }
        hooks.before_cycle(self.now);
        let mut out = engine.cycle(self.now, cycle_seed);
        let seen = engine.divergences().len();
        if seen > self.divergences {
            for d in &engine.divergences()[self.divergences..] {
                self.error(format!("incremental core: {d}"));
            }
            self.divergences = seen;
        }
        if hooks.every_explanation() {
            engine.explain_parked(&mut out);
        }
        hooks.after_cycle(self.now, &out);
        hooks.cycle_seen(self.now, &snap, &out);
        self.classify_waiting(&snap, &mut out, engine);
        let (mut cs, errs) = ClusterState::from_snapshot(&snap);
        for (i, e) in errs {
            self.error(format!(
                "conservation: pod {} does not fit where it runs: {e}",
                snap.pods[i].pod.name
            ));
        }
        self.t.backfilled += out.stats.backfilled as u64;
        let mut changed = false;
        let rev_snap = |sim_node: SimNode| node_map.iter().position(|&n| n == sim_node);

        // pass 1: evictions. What the evicted pods held is given back to
        // `cs` only after the binds (pass 2): on a real cluster a victim
        // keeps its GPUs until it is gone, so a bind of the same cycle
        // onto them is refused here as the Kubernetes executor refuses it
        // ("would be overbooked").
        let mut stopped_now: BTreeSet<SimPod> = BTreeSet::new();
        let mut leaving: Vec<(NodeId, SimPod, GpuAssignment)> = Vec::new();
        for d in &out.decisions {
            let Decision::Evict { pod, reason } = d else {
                continue;
            };
            let Some(&sp) = pod_map.get(*pod as usize) else {
                self.error(format!("evict of unknown pod id {pod}"));
                continue;
            };
            if stopped_now.contains(&sp) {
                continue; // already stopped with its gang in this cycle
            }
            if !matches!(self.pods[sp.ix()].phase, Ph::Running { .. }) {
                let name = self.pods[sp.ix()].pod.name.clone();
                self.error(format!("evict of pod {name} that is not running"));
                continue;
            }
            let kind = reason.kind();
            *self
                .t
                .evictions_by_reason
                .entry(kind.label().to_string())
                .or_insert(0) += 1;
            match kind {
                EvictionKind::Reclaim => self.t.reclaims += 1,
                EvictionKind::Preempt => self.t.preemptions += 1,
                EvictionKind::Consolidate => {
                    // a move restarts the pod: its run so far is lost
                    self.t.moves += 1;
                    if let Ph::Running { since, .. } = self.pods[sp.ix()].phase {
                        self.t.move_lost_pod_s += self.now.saturating_sub(since) as f64 / 1000.0;
                    }
                }
            }
            if kind != EvictionKind::Consolidate {
                let q = self.pods[sp.ix()].queue;
                self.queue_preempted[q] += 1;
            }
            if kind != EvictionKind::Consolidate {
                self.count_churn(sp);
            }
            if self.sc.settings.termination_grace_ms > 0 {
                // terminating: holds on until its grace period ends
                for (t, _, _) in self.evict_with_grace(sp) {
                    stopped_now.insert(t);
                }
                changed = true;
                continue;
            }
            for (t, n, g) in self.kill(sp, Cause::Preempt) {
                stopped_now.insert(t);
                if let Some(sn) = rev_snap(n) {
                    leaving.push((sn as NodeId, t, g));
                }
            }
            changed = true;
        }

        // pass 2: binds, nominations, group phases
        let fresh: BTreeMap<SimGroup, bool> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| (SimGroup(i as u32), g.running == 0))
            .filter(|(_, f)| *f)
            .collect();
        let mut binds_by_group: BTreeMap<SimGroup, u32> = BTreeMap::new();
        // A nomination holds its node for the next cycle only: the core
        // renews the ones still needed (reservations, pending preemptors).
        let mut prev_nominated: BTreeSet<(SimPod, SimNode)> = BTreeSet::new();
        for (i, p) in self.pods.iter_mut().enumerate() {
            if let Ph::Pending { nominated: Some(n) } = p.phase {
                prev_nominated.insert((SimPod(i as u32), n));
            }
        }
        for p in &mut self.pods {
            if let Ph::Pending { nominated } = &mut p.phase {
                *nominated = None;
            }
        }
        for d in &out.decisions {
            match d {
                Decision::Evict { .. } => {}
                Decision::Bind { pod, node, gpus } => {
                    if self.bind(*pod, *node, gpus, &pod_map, &node_map, &mut cs) {
                        changed = true;
                        if let Some(g) = self.pods[pod_map[*pod as usize].ix()].group {
                            *binds_by_group.entry(g).or_insert(0) += 1;
                        }
                    }
                }
                Decision::Nominate { pod, node } => {
                    let (Some(&sp), Some(&sn)) =
                        (pod_map.get(*pod as usize), node_map.get(*node as usize))
                    else {
                        self.error(format!("nominate with unknown ids pod {pod} node {node}"));
                        continue;
                    };
                    if let Ph::Pending { nominated } = &mut self.pods[sp.ix()].phase {
                        if !prev_nominated.contains(&(sp, sn)) {
                            self.t.nominations += 1;
                            if self.marks.reservations_ms.len() < MAX_MARKS {
                                self.marks.reservations_ms.push(self.now);
                            }
                        }
                        *nominated = Some(sn);
                    }
                }
                Decision::Group { group, phase } => {
                    if *phase == GroupPhase::TimedOut {
                        self.time_out(group);
                        changed = true;
                    }
                }
            }
        }
        for (n, t, g) in leaving {
            cs.release(n, &self.pods[t.ix()].pod.requests, &g);
        }
        for (g, n) in binds_by_group {
            if !fresh.contains_key(&g) {
                continue;
            }
            let min = self.groups[g.ix()].pg.min_member;
            if n >= min {
                self.t.gang_starts += 1;
                if self.marks.gang_starts_ms.len() < MAX_MARKS {
                    self.marks.gang_starts_ms.push(self.now);
                }
            } else {
                self.t.gangs_started_partially += 1;
                let name = self.groups[g.ix()].pg.name.clone();
                self.error(format!(
                    "gang {name} started partially: {n} of minMember {min} bound in one cycle"
                ));
            }
        }
        if changed {
            self.last_change = self.now;
        }
        self.sample(&cs);
        drop(cs);
        self.give_back(snap, pod_map);
        if self.sc.settings.verify {
            self.verify("after cycle");
        }
    }

    /// Counts the churn of evicting `pod` (with its running gang) for a
    /// preemption or a reclaim: the pods and how long each had run.
    fn count_churn(&mut self, pod: SimPod) {
        let group = self.pods[pod.ix()].group;
        let unit: Vec<SimPod> = match group {
            Some(g) => self.groups[g.ix()].members.clone(),
            None => vec![pod],
        };
        let mut any = false;
        for m in unit {
            if let Ph::Running { since, .. } = self.pods[m.ix()].phase {
                any = true;
                let ran = self.now.saturating_sub(since);
                self.t.evicted_pods += 1;
                self.t.evicted_within_1m += u64::from(ran < 60_000);
                self.t.evicted_within_10m += u64::from(ran < 600_000);
            }
        }
        if any && group.is_some() {
            self.t.gangs_evicted += 1;
        }
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn bind(
        &mut self,
        pod: PodId,
        node: NodeId,
        gpus: &GpuAssignment,
        pod_map: &[SimPod],
        node_map: &[SimNode],
        cs: &mut ClusterState<'_>,
    ) -> bool {
        let (Some(&sp), Some(&sn)) = (pod_map.get(pod as usize), node_map.get(node as usize))
        else {
            self.error(format!("bind with unknown ids pod {pod} node {node}"));
            return false;
        };
        let p = &self.pods[sp.ix()];
        let name = p.pod.name.clone();
        let n = &self.nodes[sn.ix()];
        if !matches!(p.phase, Ph::Pending { .. }) {
            self.error(format!("bind of pod {name} that is not pending"));
            return false;
        }
        if !n.up || n.node.unschedulable {
            let nn = n.node.name.clone();
            self.error(format!("bind of pod {name} onto unschedulable node {nn}"));
            return false;
        }
        let ok_shape = match (p.pod.gpu, gpus) {
            (GpuRequest::None | GpuRequest::Whole(0), GpuAssignment::None) => true,
            (GpuRequest::Whole(k), GpuAssignment::Whole(l)) => l.len() == k as usize,
            (
                GpuRequest::Share { milli, memory_mib },
                GpuAssignment::Share {
                    gpu,
                    milli: m,
                    memory_mib: mm,
                },
            ) => {
                let gm = n
                    .node
                    .gpus
                    .get(*gpu as usize)
                    .map(|g| g.memory_mib)
                    .unwrap_or(0);
                *m == share_milli(milli, memory_mib, gm) && *mm == memory_mib
            }
            _ => false,
        };
        if !ok_shape {
            self.error(format!(
                "bind of pod {name}: assignment {gpus:?} does not match request {:?}",
                p.pod.gpu
            ));
            return false;
        }
        if let Err(e) = cs.assign(node, &p.pod.requests, gpus) {
            self.error(format!(
                "bind of pod {name} refused (would overcommit): {e}"
            ));
            return false;
        }
        let now = self.now;
        let p = &mut self.pods[sp.ix()];
        p.phase = Ph::Running {
            node: sn,
            gpus: gpus.clone(),
            since: now,
        };
        p.epoch += 1;
        let epoch = p.epoch;
        let q = p.queue;
        if p.first_start.is_none() {
            p.first_start = Some(now);
            let arrival = p.pod.arrival_ms;
            self.waits[q].push(now.saturating_sub(arrival));
        }
        let job = p.job.ix();
        if let Some(g) = p.group {
            self.groups[g.ix()].running += 1;
        }
        self.queue_used[q] += gpus.milli();
        self.node_used[sn.ix()] += gpus.milli();
        self.node_pods[sn.ix()].insert(sp);
        self.t.binds += 1;
        let dur = self.jobs[job].duration;
        self.push(now + dur, Ev::Complete { pod: sp, epoch });
        true
    }
}

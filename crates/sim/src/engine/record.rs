//! Metric recording: conservation checks, samples (series, heat map,
//! fairness integrals) and the final [`SimResult`].

use super::*;

impl<'a> Sim<'a> {
    /// Rebuilds the cluster state from scratch and checks that nothing is
    /// overcommitted and no gang runs below `minMember` at its start.
    pub(super) fn verify(&mut self, when: &str) {
        let (snap, pod_map, _, _) = self.snapshot();
        let (_, errs) = ClusterState::from_snapshot(&snap);
        for (i, e) in errs {
            self.error(format!(
                "conservation ({when}): pod {}: {e}",
                snap.pods[i].pod.name
            ));
        }
        self.give_back(snap, pod_map);
    }

    /// Why the pending GPU pods wait (the classification the scheduler's
    /// Queue status uses), at most once a virtual minute: pods this cycle
    /// binds are not waiting.
    pub(super) fn classify_waiting(
        &mut self,
        snap: &Snapshot,
        out: &mut CycleOutput,
        engine: &Engine,
    ) {
        if self
            .idle_classified_at
            .is_some_and(|t| self.now < t + 60_000)
        {
            return;
        }
        // every waiting pod, the parked ones with what parked them
        engine.explain_parked(out);
        self.idle_classified_at = Some(self.now);
        let bound = out.bound_pods();
        let mut by: BTreeMap<String, u32> = BTreeMap::new();
        for (id, classes) in gpusched_core::report::classify::classify_cycle(out, snap) {
            if bound.contains(&id) || snap.pods[id as usize].pod.gpu.milli() == 0 {
                continue;
            }
            let c = classes
                .first()
                .copied()
                .unwrap_or(gpusched_core::report::classify::PendingClass::FitsNow);
            *by.entry(c.reason_name().to_string()).or_default() += 1;
        }
        self.idle_reasons = by.into_iter().collect();
    }

    /// Closes the idle-while-pending interval at `now` and opens the next
    /// with `idle` GPU milli free on schedulable nodes.
    fn note_idle(&mut self, idle: u64, pending_gpu_pods: u64) {
        if let Some((t0, idle0, reasons)) = self.idle_prev.take() {
            let dt = self.now.saturating_sub(t0) as f64;
            if !reasons.is_empty() {
                self.idle_milli_ms += idle0 as f64 * dt;
                if idle0 >= GPU_MILLI {
                    for (r, n) in &reasons {
                        *self.idle_by_reason.entry(r.clone()).or_default() += *n as f64 * dt;
                    }
                }
            }
        }
        let reasons = if pending_gpu_pods > 0 && idle > 0 {
            self.idle_reasons.clone()
        } else {
            Vec::new()
        };
        self.idle_prev = Some((self.now, idle, reasons));
    }

    pub(super) fn sample(&mut self, cs: &ClusterState<'_>) {
        let mut cap = 0u64;
        let mut used = 0u64;
        for (i, st) in cs.states().iter().enumerate() {
            let usable = st.gpu_usable.iter().filter(|u| **u).count() as u64 * GPU_MILLI;
            let u = usable - st.free.gpu_milli.min(usable);
            used += u;
            if !cs.nodes()[i].unschedulable {
                cap += usable;
            }
        }
        if self.frag.is_none() {
            self.frag = Some(engine_for(self.pods.iter().map(|p| &*p.pod)));
        }
        let frag = self
            .frag
            .as_ref()
            .map(|e| fragmentation_milli(cs, e))
            .unwrap_or(0);
        let mut pending = 0u64;
        let mut pending_gpu = 0u64;
        let mut running = 0u64;
        let nq = self.sc.queues.len();
        let mut qdemand = vec![0u64; nq];
        for &p in &self.active {
            let pr = &self.pods[p.ix()];
            match pr.phase {
                Ph::Pending { .. } => {
                    pending += 1;
                    if pr.pod.gpu.milli() > 0 {
                        pending_gpu += 1;
                    }
                    qdemand[pr.queue] += pr.pod.gpu.milli();
                }
                Ph::Running { .. } => running += 1,
                _ => {}
            }
        }
        for (q, d) in qdemand.iter_mut().enumerate() {
            *d += self.queue_used[q];
        }
        self.note_idle(cap.saturating_sub(used), pending_gpu);
        let pct = |a: u64| {
            if cap > 0 {
                a as f64 * 100.0 / cap as f64
            } else {
                0.0
            }
        };
        let row = [
            pct(used),
            pct(frag),
            used as f64 / GPU_MILLI as f64,
            cap as f64 / GPU_MILLI as f64,
            pending as f64,
            running as f64,
        ];
        if self.series.last().map(|s| s.1) != Some(row) {
            if self.series.last().map(|s| s.0) == Some(self.now) {
                self.series.pop();
            }
            self.series.push((self.now, row));
        }
        // per node: used fraction, −1 when down or cordoned
        for (i, n) in self.nodes.iter().enumerate() {
            let v = if !n.up || n.node.unschedulable {
                -1.0
            } else {
                let total = n.node.gpus.len().max(1) as f64 * GPU_MILLI as f64;
                let u = self.node_used[i];
                u as f64 / total
            };
            let steps = &mut self.node_steps[i];
            if steps.last().map(|s| s.1) != Some(v) {
                if steps.last().map(|s| s.0) == Some(self.now) {
                    steps.pop();
                }
                steps.push((self.now, v));
            }
        }
        // fairness integrals
        self.close_integrals(self.now);
        let fair = metrics::fair_shares(
            &self.sc.queues,
            &qdemand.iter().map(|d| Some(*d)).collect::<Vec<_>>(),
            cap,
        );
        self.prev_q = Some((self.queue_used.clone(), fair, cap, self.now));
    }

    pub(super) fn close_integrals(&mut self, now: u64) {
        if let Some((used, fair, cap, t0)) = &self.prev_q {
            let dt = now.saturating_sub(*t0) as f64;
            let mut gap = 0.0;
            for q in 0..used.len() {
                self.used_int[q] += used[q] as f64 * dt;
                self.fair_int[q] += fair[q] as f64 * dt;
                gap += (used[q] as f64 - fair[q] as f64).abs();
            }
            self.gap_int += gap / 2.0 * dt;
            self.cap_int += *cap as f64 * dt;
            self.prev_q = Some((used.clone(), fair.clone(), *cap, now));
        }
        self.last_sample = Some(now);
    }

    pub(super) fn result(mut self, scheduler: &str) -> SimResult {
        let end = self.now.max(1);
        let r4 = metrics::r4;
        // series
        let bucket_ms = metrics::nice_bucket(end, BUCKETS);
        let mut cols: Vec<Vec<f64>> = Vec::new();
        for c in 0..6 {
            let steps: Vec<(u64, f64)> = self.series.iter().map(|(t, r)| (*t, r[c])).collect();
            cols.push(metrics::bucketize_w(&steps, end, bucket_ms));
        }
        let t_ms: Vec<u64> = (0..cols[0].len() as u64).map(|k| k * bucket_ms).collect();
        let series = Series {
            bucket_ms,
            t_ms,
            alloc_pct: cols[0].clone(),
            frag_pct: cols[1].clone(),
            used_gpus: cols[2].clone(),
            capacity_gpus: cols[3].clone(),
            pending_pods: cols[4].clone(),
            running_pods: cols[5].clone(),
        };
        let mut cells = Vec::new();
        for steps in &self.node_steps {
            // mark buckets mostly down/cordoned as −1, else average use
            let used: Vec<(u64, f64)> = steps.iter().map(|&(t, v)| (t, v.max(0.0))).collect();
            let down: Vec<(u64, f64)> = steps
                .iter()
                .map(|&(t, v)| (t, if v < 0.0 { 1.0 } else { 0.0 }))
                .collect();
            let u = metrics::bucketize_w(&used, end, bucket_ms);
            let d = metrics::bucketize_w(&down, end, bucket_ms);
            cells.push(
                u.iter()
                    .zip(&d)
                    .map(|(u, d)| {
                        if *d > 0.5 {
                            -1.0
                        } else {
                            r4(u / (1.0 - d).max(1e-9))
                        }
                    })
                    .collect(),
            );
        }
        let heatmap = Heatmap {
            bucket_ms,
            nodes: self.nodes.iter().map(|n| n.node.name.clone()).collect(),
            node_gpus: self
                .nodes
                .iter()
                .map(|n| n.node.gpus.len() as u32)
                .collect(),
            cells,
        };
        // totals
        let endf = end as f64;
        // time integral of column `c` of the step series
        let integral = |c: usize| -> f64 {
            self.series
                .iter()
                .enumerate()
                .map(|(i, (t, r))| {
                    let t1 = self.series.get(i + 1).map(|x| x.0).unwrap_or(end);
                    r[c] * (t1 - t) as f64
                })
                .sum()
        };
        let alloc_mean = {
            let (used, cap) = (integral(2), integral(3));
            if cap > 0.0 { used * 100.0 / cap } else { 0.0 }
        };
        let frag_mean = integral(1) / endf;
        self.t.alloc_mean_pct = r4(alloc_mean);
        self.t.alloc_peak_pct = r4(self.series.iter().map(|s| s.1[0]).fold(0.0, f64::max));
        self.t.frag_mean_pct = r4(frag_mean);
        self.t.fairness_gap_pct = if self.cap_int > 0.0 {
            r4(self.gap_int * 100.0 / self.cap_int)
        } else {
            0.0
        };
        let mut all_waits: Vec<u64> = self.waits.iter().flatten().copied().collect();
        all_waits.sort_unstable();
        self.t.wait_p50_s = metrics::pct_s(&all_waits, 50.0);
        self.t.wait_p95_s = metrics::pct_s(&all_waits, 95.0);
        self.t.wait_p99_s = metrics::pct_s(&all_waits, 99.0);
        let mut jct_q: Vec<Vec<u64>> = vec![Vec::new(); self.sc.queues.len()];
        let mut jobs_q = vec![0u64; self.sc.queues.len()];
        for j in &self.jobs {
            jobs_q[j.queue] += 1;
            if j.failed {
                self.t.jobs_failed += 1;
            } else if let Some(e) = j.end {
                self.t.jobs_completed += 1;
                jct_q[j.queue].push(e - j.arrival);
            } else {
                self.t.jobs_unfinished += 1;
            }
        }
        let mut all_jct: Vec<u64> = jct_q.iter().flatten().copied().collect();
        all_jct.sort_unstable();
        self.t.jct_p50_s = metrics::pct_s(&all_jct, 50.0);
        self.t.jct_mean_s = metrics::mean_s(&all_jct);
        let total_cap = self
            .sc
            .nodes
            .iter()
            .map(|n| n.gpus.len() as u64)
            .sum::<u64>()
            * GPU_MILLI;
        let entitled = metrics::fair_shares(
            &self.sc.queues,
            &vec![None; self.sc.queues.len()],
            total_cap,
        );
        let mut queues = Vec::new();
        let mut wait_cdf = Vec::new();
        for (qi, q) in self.sc.queues.iter().enumerate() {
            let mut w = self.waits[qi].clone();
            w.sort_unstable();
            let mut jc = jct_q[qi].clone();
            jc.sort_unstable();
            let avg = self.used_int[qi] / endf;
            let fair = self.fair_int[qi] / endf;
            queues.push(QueueReport {
                name: q.name.clone(),
                weight: q.weight,
                guarantee_gpus: metrics::gpus(metrics::guarantee_milli(q) as f64),
                jobs: jobs_q[qi],
                jobs_completed: jc.len() as u64,
                pods: self.pods.iter().filter(|p| p.queue == qi).count() as u64,
                pods_started: w.len() as u64,
                wait_p50_s: metrics::pct_s(&w, 50.0),
                wait_p95_s: metrics::pct_s(&w, 95.0),
                wait_p99_s: metrics::pct_s(&w, 99.0),
                jct_p50_s: metrics::pct_s(&jc, 50.0),
                jct_p95_s: metrics::pct_s(&jc, 95.0),
                jct_mean_s: metrics::mean_s(&jc),
                avg_gpus: metrics::gpus(avg),
                fair_gpus: metrics::gpus(fair),
                entitled_gpus: metrics::gpus(entitled[qi] as f64),
                fairness_ratio: if fair > 0.0 { r4(avg / fair) } else { 0.0 },
                preempted: self.queue_preempted[qi],
            });
            // CDF: at most 101 points (every percentile)
            let points = if w.is_empty() {
                Vec::new()
            } else {
                let n = w.len();
                let mut pts: Vec<(f64, f64)> = Vec::new();
                for k in 0..=100usize {
                    let idx = ((k * n) / 100).min(n - 1);
                    let frac = (idx + 1) as f64 / n as f64;
                    let x = r4(w[idx] as f64 / 1000.0);
                    if pts.last().map(|p| p.0) == Some(x) {
                        pts.pop();
                    }
                    pts.push((x, r4(frac)));
                }
                pts
            };
            wait_cdf.push(Cdf {
                queue: q.name.clone(),
                points,
            });
        }
        // the last interval runs to the end
        self.note_idle(0, 0);
        let failed_jobs: Vec<FailedJob> = self
            .jobs
            .iter()
            .filter_map(|j| {
                let (at, why) = j.failed_why?;
                let first = &self.pods[j.first_pod.ix()].pod.name;
                let job = first
                    .strip_suffix("-p0")
                    .unwrap_or(first.as_str())
                    .to_string();
                Some(FailedJob {
                    job,
                    queue: self.sc.queues[j.queue].name.clone(),
                    at_ms: at,
                    why: why.to_string(),
                })
            })
            .take(100)
            .collect();
        let pod_ms: f64 = self.idle_by_reason.values().sum();
        let mut by_reason: Vec<IdleReason> = self
            .idle_by_reason
            .iter()
            .map(|(r, ms)| IdleReason {
                reason: r.clone(),
                pod_hours: r4(ms / 3_600_000.0),
                share_pct: if pod_ms > 0.0 {
                    r4(ms * 100.0 / pod_ms)
                } else {
                    0.0
                },
            })
            .collect();
        by_reason.sort_by(|a, b| {
            b.pod_hours
                .total_cmp(&a.pod_hours)
                .then(a.reason.cmp(&b.reason))
        });
        let idle = IdleWhilePending {
            gpu_hours: r4(self.idle_milli_ms / GPU_MILLI as f64 / 3_600_000.0),
            capacity_pct: if self.cap_int > 0.0 {
                r4(self.idle_milli_ms * 100.0 / self.cap_int)
            } else {
                0.0
            },
            by_reason,
        };
        SimResult {
            scenario: self.sc.name.clone(),
            seed: self.seed,
            scheduler: scheduler.to_string(),
            nodes: self.sc.nodes.len() as u32,
            gpus: (total_cap / GPU_MILLI) as u32,
            end_ms: self.now,
            cycles: self.cycles,
            ended_by: self.ended_by.to_string(),
            totals: self.t,
            queues,
            series,
            heatmap,
            wait_cdf,
            incidents: self.incidents,
            failed_jobs,
            idle,
            marks: self.marks,
            errors: self.errors,
            engine: self.engine,
        }
    }
}

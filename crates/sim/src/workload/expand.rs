//! The expansion of a [`WorkloadFile`] into a [`Scenario`]: names and
//! renames checked, each job's instances, times and pod template, its gang,
//! the cluster events and the settings (errors located in the file).

use super::*;

/// A field renamed to the CRD's spelling: the value under the new name,
/// else under the old one (with a warning), and the name it came from;
/// both at once is an error. `field` is the queue's path (`queues[2].`).
fn renamed<'v, T, N>(
    ctx: &Ctx<'_>,
    at: &Spanned<N>,
    field: &str,
    new: (&'v Option<T>, &'static str),
    old: (&'v Option<T>, &'static str),
    warnings: &mut Vec<String>,
) -> Result<(Option<&'v T>, &'static str), LoadError> {
    match (new.0, old.0) {
        (Some(_), Some(_)) => Err(ctx.err(
            at,
            format!("{field}{}", old.1),
            format!("give {} or its old name {}, not both", new.1, old.1),
        )),
        (Some(v), None) => Ok((Some(v), new.1)),
        (None, Some(v)) => {
            warnings.push(format!(
                "{}:{}: {field}{} is deprecated: write {} (the Queue CRD's name)",
                ctx.file,
                at.referenced.line(),
                old.1,
                new.1
            ));
            Ok((Some(v), old.1))
        }
        (None, None) => Ok((None, new.1)),
    }
}

/// Builds errors that point into one file.
pub(crate) struct Ctx<'a> {
    pub file: &'a str,
    pub text: &'a str,
}

impl Ctx<'_> {
    pub fn err<T>(
        &self,
        at: &Spanned<T>,
        field: impl Into<String>,
        msg: impl Into<String>,
    ) -> LoadError {
        LoadError::at(
            self.file,
            self.text,
            at.referenced.line(),
            at.referenced.column(),
            field,
            msg,
        )
    }

    fn dur(&self, v: &S<String>, field: impl Into<String>) -> Result<u64, LoadError> {
        parse_duration_ms(&v.value).map_err(|e| self.err(v, field, e.to_string()))
    }

    fn opt_dur(&self, v: &Option<S<String>>, field: &str) -> Result<Option<u64>, LoadError> {
        v.as_ref().map(|v| self.dur(v, field)).transpose()
    }

    fn resources(
        &self,
        m: &BTreeMap<String, S<String>>,
        field: &str,
    ) -> Result<ResourceVec, LoadError> {
        use gpusched_model::quantity::{Quantity, parse_bytes, parse_cpu_milli, parse_integer};
        let mut r = ResourceVec::default();
        for (k, v) in m {
            let f = format!("{field}.{k}");
            let e = |x: gpusched_model::QuantityError| self.err(v, &f, x.to_string());
            match k.as_str() {
                "cpu" => r.cpu_milli = parse_cpu_milli(&v.value).map_err(e)?,
                "memory" => r.memory = parse_bytes(&v.value).map_err(e)?,
                "gpu" | "nvidia.com/gpu" => {
                    r.gpu_milli = Quantity::parse(&v.value)
                        .and_then(|q| q.to_milli_u64(&v.value))
                        .map_err(e)?
                }
                other => {
                    r.ext
                        .insert(other.to_string(), parse_integer(&v.value).map_err(e)?);
                }
            }
        }
        Ok(r)
    }

    /// A queue limit: caps exactly the resources the map names, the others
    /// stay unbounded.
    fn limit(
        &self,
        m: &BTreeMap<String, S<String>>,
        field: &str,
    ) -> Result<ResourceLimit, LoadError> {
        let v = self.resources(m, field)?;
        let named: Vec<ResourceKind> = m
            .keys()
            .map(|k| match k.as_str() {
                "gpu" => ResourceKind::Gpu,
                other => ResourceKind::from_resource_name(other),
            })
            .collect();
        Ok(ResourceLimit::named(&v, &named))
    }
}

/// A job's gang: its minimum members, topology and schedule timeout.
type GangShape = (u32, Option<TopologyConstraint>, Option<u64>);

/// A job's first arrival, gap, and run time range `(min, max)` in ms,
/// checked; `f` names a field of the job.
fn job_times(
    ctx: &Ctx<'_>,
    j: &JobSpec,
    f: &dyn Fn(&str) -> String,
) -> Result<(u64, u64, u64, Option<u64>), LoadError> {
    let first = ctx.opt_dur(&j.arrival, &f("arrival"))?.unwrap_or(0);
    let every = ctx.opt_dur(&j.every, &f("every"))?.unwrap_or(0);
    let dmin = ctx.dur(&j.duration, f("duration"))?;
    let dmax = ctx.opt_dur(&j.duration_max, &f("duration_max"))?;
    if let (Some(d), Some(v)) = (dmax, &j.duration_max)
        && d < dmin
    {
        return Err(ctx.err(v, f("duration_max"), "must not be less than `duration`"));
    }
    if dmin == 0 {
        return Err(ctx.err(&j.duration, f("duration"), "must be positive"));
    }
    Ok((first, every, dmin, dmax))
}

/// The pod template every instance of job `j` copies, and its gang;
/// `f` names a field of the job.
fn job_template(
    ctx: &Ctx<'_>,
    j: &JobSpec,
    f: &dyn Fn(&str) -> String,
) -> Result<(Pod, Option<GangShape>), LoadError> {
    // requests: limits = requests (extended resources need limits)
    let mut cr = ContainerResources {
        name: j.name.value.clone(),
        ..Default::default()
    };
    for (k, v) in &j.requests {
        cr.requests.insert(k.clone(), v.value.clone());
        cr.limits.insert(k.clone(), v.value.clone());
    }
    let (requests, gpu) = pod_resources(&[cr]).map_err(|e| {
        // name the first resource the error mentions, else the map
        let (field, at) = j
            .requests
            .iter()
            .find(|(k, _)| e.to_string().contains(&format!("{k:?}")))
            .map(|(k, v)| (f(&format!("requests.{k}")), v))
            .unwrap_or_else(|| (f("requests"), j.requests.values().next().unwrap_or(&j.name)));
        ctx.err(at, field, e.to_string())
    })?;
    let mut template = Pod::new(j.name.value.clone(), j.queue.value.clone());
    template.priority = j.priority;
    template.requests = requests;
    template.gpu = gpu;
    template.gpu_models = j.gpu_models.clone();
    template.min_gpu_memory_mib = match &j.min_gpu_memory {
        Some(v) => gpusched_model::quantity::parse_mib(&v.value)
            .map_err(|e| ctx.err(v, f("min_gpu_memory"), e.to_string()))?,
        None => 0,
    };
    template.node_selector = j.node_selector.clone();
    template.tolerations = j.tolerations.clone();
    template.preemptible = j.preemptible;
    let gang = match &j.gang {
        Some(g) => {
            let mm = g
                .min_member
                .as_ref()
                .map(|m| m.value)
                .unwrap_or(j.pods.value);
            if mm == 0 || mm > j.pods.value {
                let at = g.min_member.as_ref().unwrap_or(&j.pods);
                return Err(ctx.err(
                    at,
                    f("gang.min_member"),
                    format!("must be between 1 and pods ({})", j.pods.value),
                ));
            }
            Some((
                mm,
                g.topology.map(|level| TopologyConstraint {
                    level,
                    required: g.required,
                }),
                ctx.opt_dur(&g.timeout, &f("gang.timeout"))?,
            ))
        }
        None => None,
    };
    Ok((template, gang))
}

/// Salt of the workload's random stream (Poisson gaps, run times) on the
/// run's seed, so it differs from the scheduler's stream of the same seed.
const WORKLOAD_SALT: u64 = 0x5EED_F0A1;

impl WorkloadFile {
    /// Checks the file against the cluster and expands it into a scenario.
    /// Random parts (Poisson gaps, durations in a range) come from `seed`.
    /// Each section is checked and expanded in file order (queues, jobs,
    /// events, settings), so the first error reported is the first in
    /// that order.
    pub(crate) fn expand(
        &self,
        ctx: &Ctx<'_>,
        nodes: Vec<Node>,
        seed: u64,
    ) -> Result<Scenario, LoadError> {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ WORKLOAD_SALT);
        let mut warnings = Vec::new();
        let (queues, qnames) = self.expand_queues(ctx, &mut warnings)?;
        let jobs = self.expand_jobs(ctx, &qnames, &mut rng)?;
        let events = self.expand_events(ctx, &nodes)?;
        let settings = self.expand_settings(ctx)?;
        Ok(Scenario {
            name: self.name.clone().unwrap_or_else(|| ctx.file.to_string()),
            nodes,
            queues,
            jobs,
            events,
            settings,
            warnings,
        })
    }

    /// `queues`: the queue tree and the set of its names (every parent
    /// checked against it); deprecated spellings add to `warnings`.
    fn expand_queues(
        &self,
        ctx: &Ctx<'_>,
        warnings: &mut Vec<String>,
    ) -> Result<(Vec<Queue>, BTreeSet<String>), LoadError> {
        let mut queues = Vec::new();
        let mut qnames = BTreeSet::new();
        for (i, q) in self.queues.iter().enumerate() {
            let f = |x: &str| format!("queues[{i}].{x}");
            if q.name.value.is_empty() {
                return Err(ctx.err(&q.name, f("name"), "must not be empty"));
            }
            if !qnames.insert(q.name.value.clone()) {
                return Err(ctx.err(
                    &q.name,
                    f("name"),
                    format!("duplicate queue {:?}", q.name.value),
                ));
            }
            if q.weight.value == 0 {
                return Err(ctx.err(&q.weight, f("weight"), "must be at least 1"));
            }
            let mut queue = Queue::new(q.name.value.clone());
            queue.weight = q.weight.value;
            // one spelling per concept, the CRD's; the old one still reads
            let (guaranteed, g_field) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.guaranteed, "guaranteed"),
                (&q.guarantee, "guarantee"),
                warnings,
            )?;
            if let Some(m) = guaranteed {
                queue.guarantee = ctx.resources(m, &f(g_field))?;
            }
            let (by_model, m_field) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.guaranteed_gpus_by_model, "guaranteed_gpus_by_model"),
                (&q.gpu_guarantee_by_model, "gpu_guarantee_by_model"),
                warnings,
            )?;
            for (m, v) in by_model.into_iter().flatten() {
                let g = gpusched_model::Quantity::parse(&v.value)
                    .and_then(|x| x.to_milli_u64(&v.value))
                    .map_err(|e| ctx.err(v, f(&format!("{m_field}.{m}")), e.to_string()))?;
                queue.gpu_guarantee_by_model.insert(m.clone(), g);
            }
            queue.limit = q
                .limit
                .as_ref()
                .map(|l| ctx.limit(l, &f("limit")))
                .transpose()?;
            let (borrow, _) = renamed(
                ctx,
                &q.name,
                &f(""),
                (&q.borrow, "borrow"),
                (&q.can_borrow, "can_borrow"),
                warnings,
            )?;
            queue.can_borrow = borrow.copied().unwrap_or(true);
            queue.reclaimable = q.reclaimable;
            queue.min_runtime_ms = ctx.opt_dur(&q.min_runtime, &f("min_runtime"))?;
            queue.parent = q.parent.as_ref().map(|p| p.value.clone());
            queues.push(queue);
        }
        for (i, q) in self.queues.iter().enumerate() {
            if let Some(p) = &q.parent
                && !qnames.contains(&p.value)
            {
                return Err(ctx.err(
                    p,
                    format!("queues[{i}].parent"),
                    format!("unknown queue {:?}", p.value),
                ));
            }
        }
        Ok((queues, qnames))
    }

    /// `jobs`: every instance of every job kind, by arrival (ties: file
    /// order), on queues of `qnames`.
    fn expand_jobs(
        &self,
        ctx: &Ctx<'_>,
        qnames: &BTreeSet<String>,
        rng: &mut ChaCha8Rng,
    ) -> Result<Vec<Job>, LoadError> {
        let mut jobs = Vec::new();
        let mut kinds = BTreeSet::new();
        for (i, j) in self.jobs.iter().enumerate() {
            let f = |x: &str| format!("jobs[{i}].{x}");
            if j.name.value.is_empty() {
                return Err(ctx.err(&j.name, f("name"), "must not be empty"));
            }
            if !kinds.insert(j.name.value.clone()) {
                return Err(ctx.err(
                    &j.name,
                    f("name"),
                    format!("duplicate job name {:?}", j.name.value),
                ));
            }
            if !qnames.contains(&j.queue.value) {
                return Err(ctx.err(
                    &j.queue,
                    f("queue"),
                    format!(
                        "unknown queue {:?} (declare it under `queues`)",
                        j.queue.value
                    ),
                ));
            }
            if j.pods.value == 0 {
                return Err(ctx.err(&j.pods, f("pods"), "must be at least 1"));
            }
            let (first, every, dmin, dmax) = job_times(ctx, j, &f)?;
            let (template, gang) = job_template(ctx, j, &f)?;
            let mut t = first;
            for n in 0..j.count.value {
                if n > 0 {
                    t += if j.poisson && every > 0 {
                        let u: f64 = rng.random_range(0.0..1.0);
                        (-(1.0 - u).ln() * every as f64).round() as u64
                    } else {
                        every
                    };
                }
                let duration_ms = match dmax {
                    Some(d) if d > dmin => rng.random_range(dmin..=d),
                    _ => dmin,
                };
                let name = if j.count.value == 1 {
                    j.name.value.clone()
                } else {
                    format!("{}-{n}", j.name.value)
                };
                let mut tp = template.clone();
                tp.name = name.clone();
                tp.labels = j.labels.clone();
                tp.labels.insert(LABEL_SIM_JOB.into(), name.clone());
                if let Some(c) = &j.constraints
                    && !c.is_empty()
                {
                    tp.constraints = Some(Box::new(for_instance(c, &name)));
                }
                tp.arrival_ms = t;
                let group = gang.map(|(min_member, topology, timeout)| {
                    tp.group = Some(name.clone());
                    PodGroup {
                        name: name.clone(),
                        queue: j.queue.value.clone(),
                        min_member,
                        priority: j.priority,
                        topology,
                        schedule_timeout_ms: timeout,
                    }
                });
                jobs.push(Job {
                    name,
                    kind: j.name.value.clone(),
                    queue: j.queue.value.clone(),
                    arrival_ms: t,
                    duration_ms,
                    pods: j.pods.value,
                    template: tp,
                    group,
                });
            }
        }
        // stable order by arrival (ties: file order)
        jobs.sort_by_key(|j| j.arrival_ms);
        Ok(jobs)
    }

    /// `events`: the cluster events on `nodes`, a recovery added for each
    /// `recover_after`, by time.
    fn expand_events(&self, ctx: &Ctx<'_>, nodes: &[Node]) -> Result<Vec<ClusterEvent>, LoadError> {
        let node_names: BTreeMap<&str, &Node> =
            nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let mut events = Vec::new();
        for (i, e) in self.events.iter().enumerate() {
            let f = |x: &str| format!("events[{i}].{x}");
            let at_ms = ctx.dur(&e.at, f("at"))?;
            let Some(node) = node_names.get(e.node.value.as_str()) else {
                return Err(ctx.err(
                    &e.node,
                    f("node"),
                    format!("unknown node {:?} (not in the cluster)", e.node.value),
                ));
            };
            let needs_gpu = matches!(e.kind, EventKind::GpuFailure | EventKind::GpuRecovery);
            let gpu = match (&e.gpu, needs_gpu) {
                (Some(g), true) => {
                    if g.value as usize >= node.gpus.len() {
                        return Err(ctx.err(
                            g,
                            f("gpu"),
                            format!(
                                "node {:?} has {} GPUs (positions 0..{})",
                                node.name,
                                node.gpus.len(),
                                node.gpus.len()
                            ),
                        ));
                    }
                    Some(g.value)
                }
                (None, true) => {
                    return Err(ctx.err(&e.node, f("gpu"), "required for gpu events"));
                }
                (Some(g), false) => {
                    return Err(ctx.err(g, f("gpu"), "only gpu events take a gpu"));
                }
                (None, false) => None,
            };
            events.push(ClusterEvent {
                at_ms,
                kind: e.kind,
                node: e.node.value.clone(),
                gpu,
            });
            if let Some(r) = &e.recover_after {
                let d = ctx.dur(r, f("recover_after"))?;
                let kind = match e.kind {
                    EventKind::NodeFailure => EventKind::NodeRecovery,
                    EventKind::GpuFailure => EventKind::GpuRecovery,
                    EventKind::Drain => EventKind::Uncordon,
                    _ => {
                        return Err(ctx.err(
                            r,
                            f("recover_after"),
                            "only node-failure, gpu-failure and drain take recover_after",
                        ));
                    }
                };
                events.push(ClusterEvent {
                    at_ms: at_ms + d,
                    kind,
                    node: e.node.value.clone(),
                    gpu,
                });
            }
        }
        events.sort_by_key(|e| e.at_ms);

        Ok(events)
    }

    /// `settings`: the defaults with what the file sets.
    fn expand_settings(&self, ctx: &Ctx<'_>) -> Result<SimSettings, LoadError> {
        let mut settings = SimSettings::default();
        if let Some(s) = &self.settings {
            if let Some(v) = ctx.opt_dur(&s.cycle_interval, "settings.cycle_interval")? {
                settings.cycle_interval_ms = v;
            }
            if let Some(t) = &s.tick {
                let v = ctx.dur(t, "settings.tick")?;
                if v == 0 {
                    return Err(ctx.err(t, "settings.tick", "must be positive"));
                }
                settings.tick_ms = v;
            }
            if let Some(v) = s.retry_limit {
                settings.retry_limit = v;
            }
            if let Some(v) = ctx.opt_dur(&s.backoff, "settings.backoff")? {
                settings.backoff_ms = v;
            }
            if let Some(v) = ctx.opt_dur(&s.backoff_max, "settings.backoff_max")? {
                settings.backoff_max_ms = v;
            }
            settings.until_ms = ctx.opt_dur(&s.until, "settings.until")?;
            if let Some(v) = ctx.opt_dur(&s.idle_stop, "settings.idle_stop")? {
                settings.idle_stop_ms = v;
            }
            if let Some(v) = ctx.opt_dur(&s.termination_grace, "settings.termination_grace")? {
                settings.termination_grace_ms = v;
            }
        }
        Ok(settings)
    }
}

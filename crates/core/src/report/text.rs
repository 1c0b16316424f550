//! The reports as text: amounts in users' units and the `Display` of
//! [`PodReport`], [`QueueReport`], [`PendingList`] and [`Hint`] (what
//! `gpusched explain` prints). The figures themselves are built in the
//! parent module; nothing here decides anything.

use super::*;

/// GPUs as text: whole numbers plain, fractions exactly (`2`, `2.5`,
/// `0.125`).
pub fn gpus_text(milli: u64) -> String {
    let whole = milli / GPU_MILLI;
    match milli % GPU_MILLI {
        0 => whole.to_string(),
        frac => {
            let digits = format!("{frac:03}");
            format!("{whole}.{}", digits.trim_end_matches('0'))
        }
    }
}

/// An amount of one dimension as text in users' units: GPUs, CPU cores,
/// binary bytes (`2.5 GPU`, `0.5 CPU`, `64 GiB of memory`, `80 GiB of GPU
/// memory`).
pub fn amount_text(kind: &ResourceKind, v: u64) -> String {
    match kind {
        ResourceKind::Gpu => format!("{} GPU", gpus_text(v)),
        ResourceKind::Cpu => format!("{} CPU", gpus_text(v)),
        ResourceKind::Memory => format!("{} of memory", bytes_text(v)),
        ResourceKind::GpuMemory => {
            format!("{} of GPU memory", bytes_text(v.saturating_mul(1 << 20)))
        }
        ResourceKind::Extended(n) => format!("{v} {n}"),
    }
}

/// Bytes in the largest binary unit that shows them to 0.1 (`64 GiB`,
/// `1.5 GiB`, `512 MiB`, `100 bytes`).
pub fn bytes_text(v: u64) -> String {
    const UNITS: [(&str, u64); 5] = [
        ("PiB", 1 << 50),
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    for (name, size) in UNITS {
        if v >= size {
            return if v.is_multiple_of(size) {
                format!("{} {name}", v / size)
            } else {
                format!("{:.1} {name}", v as f64 / size as f64)
            };
        }
    }
    format!("{v} bytes")
}

fn nearest_text(n: &Option<NearestNode>, share: bool) -> String {
    match n {
        None => String::new(),
        Some(n) if share => format!(
            " (closest now: {} with {} free on one GPU)",
            n.node,
            gpus_text(u64::from(n.best_gpu_free_milli))
        ),
        Some(n) => format!(" (closest now: {} with {} free)", n.node, n.free_gpus),
    }
}

impl fmt::Display for Hint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Hint::FitsNow => f.write_str("fits now; it is placed in a following cycle"),
            Hint::FreeGpusOnOneNode { gpus, nearest } => write!(
                f,
                "fits if {gpus} GPU(s) are free on one node that passes its filters{}",
                nearest_text(nearest, false)
            ),
            Hint::FreeShareOnOneGpu { milli, nearest } => write!(
                f,
                "fits if one GPU of a node that passes its filters has {} GPU free{}",
                gpus_text(u64::from(*milli)),
                nearest_text(nearest, true)
            ),
            Hint::FreeResource { resource, amount } => write!(
                f,
                "fits if a node that passes its filters has {} free",
                amount_text(resource, *amount)
            ),
            Hint::FreeGpusInOneDomain { level, gpus, best } => {
                write!(
                    f,
                    "fits if {} GPU(s) are free on one {}",
                    gpus_text(*gpus),
                    level_name(*level)
                )?;
                match best {
                    Some((d, free)) => write!(f, " (most free now: {d} with {})", gpus_text(*free)),
                    None => Ok(()),
                }
            }
            Hint::RaiseQuota {
                queue,
                dimension,
                needs,
            } => write!(
                f,
                "never fits in queue {queue:?} as it is: its quota must allow at least {} (or the job must ask less)",
                amount_text(dimension, *needs)
            ),
            Hint::QueueFrees {
                queue,
                dimension,
                amount,
            } => write!(
                f,
                "fits once queue {queue:?} uses {} less",
                amount_text(dimension, *amount)
            ),
            Hint::MoreMembers { group, missing } => write!(
                f,
                "fits once {missing} more member(s) of pod group {group:?} exist"
            ),
            Hint::MoreMembersFit { group, fit, need } => write!(
                f,
                "fits once all {need} required members of pod group {group:?} fit at once ({fit} do now)"
            ),
            Hint::CreateQueue { queue } => write!(f, "create queue {queue:?}"),
            Hint::CreateGroup { group } => write!(f, "create pod group {group:?}"),
            Hint::WaitForNode { node } => {
                write!(f, "fits once the pods leaving {node} are gone")
            }
            Hint::Recreate { group } => {
                write!(f, "pod group {group:?} timed out; recreate its pods")
            }
            Hint::NeverFits => f.write_str(
                "never fits as the cluster is: change its request, selectors or tolerations, or add nodes that can hold it",
            ),
            Hint::RemoveGates { gates } => {
                write!(f, "scheduled once its gates are removed: {}", gates.join(", "))
            }
            Hint::FixSpec { error } => write!(f, "fix the pod: {error}"),
        }
    }
}

/// GPU always; CPU, memory and the rest only where not zero (a line of
/// "cpu 0m, memory 0" says nothing).
fn res_text(r: &ResourceVec) -> String {
    let mut parts = vec![format!("gpu {}", gpus_text(r.gpu_milli))];
    if r.cpu_milli > 0 {
        parts.push(format!("cpu {}m", r.cpu_milli));
    }
    if r.memory > 0 {
        parts.push(format!("memory {}", mem_text(r.memory)));
    }
    if r.gpu_mem_mib > 0 {
        parts.push(format!("gpu memory {} MiB", r.gpu_mem_mib));
    }
    for (k, v) in &r.ext {
        if *v > 0 {
            parts.push(format!("{k} {v}"));
        }
    }
    parts.join(", ")
}

/// Only the capped dimensions; "none" when the limit names none.
fn limit_text(l: &ResourceLimit) -> String {
    // GPU first, as in every other resource line of the report.
    let mut caps: Vec<(ResourceKind, u64)> = l.caps().collect();
    caps.sort_by_key(|(k, _)| *k != ResourceKind::Gpu);
    let parts: Vec<String> = caps
        .into_iter()
        .map(|(k, c)| match k {
            ResourceKind::Gpu => format!("gpu {}", gpus_text(c)),
            ResourceKind::Cpu => format!("cpu {c}m"),
            ResourceKind::Memory => format!("memory {}", mem_text(c)),
            ResourceKind::GpuMemory => format!("gpu memory {c} MiB"),
            ResourceKind::Extended(n) => format!("{n} {c}"),
        })
        .collect();
    if parts.is_empty() {
        "none".to_string()
    } else {
        parts.join(", ")
    }
}

fn mem_text(b: u64) -> String {
    const GI: u64 = 1 << 30;
    const MI: u64 = 1 << 20;
    if b >= GI && b.is_multiple_of(GI) {
        format!("{}Gi", b / GI)
    } else if b >= MI && b.is_multiple_of(MI) {
        format!("{}Mi", b / MI)
    } else {
        b.to_string()
    }
}

fn write_queue(f: &mut fmt::Formatter<'_>, q: &QueueState, indent: &str) -> fmt::Result {
    writeln!(
        f,
        "{indent}queue {}{}: weight {}, {}{}",
        q.name,
        q.parent
            .as_ref()
            .map(|p| format!(" (parent {p})"))
            .unwrap_or_default(),
        q.weight,
        if q.can_borrow {
            "may borrow"
        } else {
            "no borrowing"
        },
        if q.reclaimable { ", reclaimable" } else { "" }
    )?;
    writeln!(f, "{indent}  guarantee   {}", res_text(&q.guarantee))?;
    if let Some(l) = &q.limit {
        writeln!(f, "{indent}  limit       {}", limit_text(l))?;
    }
    writeln!(f, "{indent}  fair share  {}", res_text(&q.fair_share))?;
    writeln!(f, "{indent}  usage       {}", res_text(&q.usage))?;
    writeln!(f, "{indent}  borrowed    {}", res_text(&q.borrowed))?;
    writeln!(f, "{indent}  pending     {}", res_text(&q.pending))?;
    if q.share_ppm >= u64::MAX / 4 {
        writeln!(
            f,
            "{indent}  share       over-served (uses a dimension it has no fair share of)"
        )
    } else {
        writeln!(
            f,
            "{indent}  share       {:.1}% of its fair share (dominant dimension)",
            q.share_ppm as f64 / 10_000.0
        )
    }
}

fn write_placement(f: &mut fmt::Formatter<'_>, p: &Placement) -> fmt::Result {
    writeln!(f, "  node:     {}", p.node)?;
    if !p.gpus.is_empty() {
        let ids: Vec<String> = p
            .gpus
            .iter()
            .map(|g| format!("{} ({}, {})", g.index, g.uuid, g.model))
            .collect();
        writeln!(f, "  gpus:     {}", ids.join(", "))?;
    }
    if let Some((milli, mem)) = p.share {
        writeln!(
            f,
            "  share:    {} GPU{}",
            gpus_text(u64::from(milli)),
            if mem > 0 {
                format!(", {mem} MiB")
            } else {
                String::new()
            }
        )?;
    }
    if let Some(t) = p.topology {
        // judged against what this node allows, not the all-NVLink ideal
        // a PCIe node never reaches
        let n = p.gpus.len();
        if t.cost <= t.node_best {
            writeln!(
                f,
                "  topology: link cost {}: the best {n} GPUs of this node allow{}",
                t.cost,
                if t.cost == t.ideal {
                    " (all NVLink)"
                } else {
                    ""
                }
            )?;
        } else {
            writeln!(
                f,
                "  topology: link cost {} (the best {n} GPUs of this node allow {})",
                t.cost, t.node_best
            )?;
        }
    }
    Ok(())
}

impl fmt::Display for PodReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let gpu = match self.gpu {
            GpuRequest::None => "no GPU".to_string(),
            GpuRequest::Whole(n) => format!("{n} GPU(s)"),
            GpuRequest::Share { milli, memory_mib } => format!(
                "a GPU share ({} GPU{})",
                gpus_text(u64::from(milli)),
                if memory_mib > 0 {
                    format!(", {memory_mib} MiB")
                } else {
                    String::new()
                }
            ),
        };
        writeln!(f, "pod {}", self.pod)?;
        writeln!(
            f,
            "  queue {}{}, priority {}, asks {}",
            self.queue,
            self.group
                .as_ref()
                .map(|g| format!(", pod group {g}"))
                .unwrap_or_default(),
            self.priority,
            gpu
        )?;
        match &self.status {
            PodStatus::Bound {
                placement,
                since_ms,
            } => {
                // a span, not a clock reading: the simulator's times start at
                // 0, a cluster's are Unix milliseconds
                writeln!(
                    f,
                    "status: Bound (for {})",
                    fmt_duration(self.at_ms.saturating_sub(*since_ms))
                )?;
                write_placement(f, placement)?;
            }
            PodStatus::Binding { placement } => {
                writeln!(f, "status: Binding (placed by the last cycle)")?;
                write_placement(f, placement)?;
            }
            PodStatus::Terminating { placement } => {
                writeln!(f, "status: Terminating")?;
                write_placement(f, placement)?;
            }
            PodStatus::Gated { gates } => {
                let c = classify::PendingClass::Gated;
                writeln!(f, "status: Pending: {c} ({})", gates.join(", "))?;
                writeln!(f, "  condition: PodScheduled=False, reason {c}")?;
            }
            PodStatus::Invalid { error } => {
                let c = classify::PendingClass::InvalidSpec;
                writeln!(f, "status: Pending: {c}")?;
                writeln!(f, "  condition: PodScheduled=False, reason {c}")?;
                writeln!(f, "  {error}")?;
            }
            PodStatus::Pending {
                verdict,
                classes,
                condition,
                message,
                reasons,
                evictions,
                queue_position,
                nominated,
            } => {
                // the class names every other surface shows; the verdict
                // is in them (NeverFits)
                match classes.split_first() {
                    Some((main, rest)) => {
                        write!(f, "status: Pending: {main}")?;
                        if !rest.is_empty() {
                            let rest: Vec<&str> = rest.iter().map(|c| c.reason_name()).collect();
                            write!(f, " (also {})", rest.join(", "))?;
                        }
                        writeln!(f)?;
                    }
                    None if *verdict == Some(Verdict::Unresolvable) => {
                        writeln!(f, "status: Pending: {}", classify::PendingClass::NeverFits)?
                    }
                    None => writeln!(f, "status: Pending")?,
                }
                if let Some(c) = condition {
                    writeln!(f, "  condition: PodScheduled=False, reason {c}")?;
                }
                writeln!(f, "  {message}")?;
                if let Some(p) = queue_position {
                    writeln!(
                        f,
                        "  queue position: {} of {} job(s) in queue {}",
                        p.position, p.jobs, self.queue
                    )?;
                }
                if let Some(n) = nominated {
                    writeln!(f, "  nominated node: {n}")?;
                }
                if !reasons.is_empty() {
                    writeln!(f, "reasons:")?;
                    for r in reasons {
                        match r {
                            PendingReason::Nodes(s) => {
                                writeln!(f, "  - 0/{} nodes are available:", s.total)?;
                                for (nr, c) in &s.counts {
                                    let plugin = match nr {
                                        NodeReason::Filter { plugin, .. } => {
                                            format!(" [filter {plugin}]")
                                        }
                                        _ => String::new(),
                                    };
                                    writeln!(f, "      {c} {nr}{plugin}")?;
                                }
                            }
                            other => writeln!(f, "  - {other}")?,
                        }
                    }
                }
                if !evictions.is_empty() {
                    writeln!(f, "preemption and reclaim:")?;
                    for a in evictions {
                        writeln!(f, "  - {a}")?;
                    }
                }
            }
        }
        if let Some(g) = &self.gang {
            write!(
                f,
                "gang {}: minMember {}, {} running, {} pending",
                g.group, g.min_member, g.running, g.pending
            )?;
            if g.terminating > 0 {
                write!(f, ", {} terminating", g.terminating)?;
            }
            if let Some(p) = g.phase {
                write!(f, ", phase {p:?}")?;
            }
            if let Some(t) = g.topology {
                write!(
                    f,
                    ", {} {}",
                    if t.required { "required" } else { "preferred" },
                    level_name(t.level)
                )?;
            }
            match (g.timeout_ms, g.timeout_left_ms) {
                (Some(t), Some(0)) => write!(f, ", timed out (timeout {})", fmt_duration(t))?,
                (Some(t), Some(l)) => write!(
                    f,
                    ", times out in {} (timeout {})",
                    fmt_duration(l),
                    fmt_duration(t)
                )?,
                (Some(t), None) => write!(f, ", timeout {}", fmt_duration(t))?,
                _ => {}
            }
            writeln!(f)?;
        }
        for (i, q) in self.queues.iter().enumerate() {
            write_queue(f, q, if i == 0 { "" } else { "  " })?;
        }
        if !self.hints.is_empty() {
            writeln!(f, "what would make it fit:")?;
            for h in &self.hints {
                writeln!(f, "  - {h}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Display for QueueReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_queue(f, &self.queue, "")?;
        if !self.children.is_empty() {
            writeln!(f, "  children    {}", self.children.join(", "))?;
        }
        writeln!(f, "  running     {} pod(s)", self.running_pods)?;
        let pending: u32 = self.pending_by_reason.values().sum();
        writeln!(f, "  pending     {pending} pod(s)")?;
        for (r, c) in &self.pending_by_reason {
            writeln!(f, "    {c:>5} {r}")?;
        }
        for p in &self.problems {
            writeln!(f, "  problem: {p}")?;
        }
        for a in &self.ancestors {
            write_queue(f, a, "  ")?;
        }
        Ok(())
    }
}

impl fmt::Display for PendingList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.table(false))
    }
}

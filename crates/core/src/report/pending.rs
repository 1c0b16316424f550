//! The pending pods of a queue in the order the cycle tried their jobs
//! ([`pending_list`]; `gpusched explain queue --pending`).

use super::*;

/// One pending pod of [`pending_list`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingEntry {
    /// The pod (`namespace/name` on Kubernetes).
    pub pod: String,
    /// Its queue (its gang's, for a gang member).
    pub queue: String,
    /// Its gang.
    pub group: Option<String>,
    /// Its priority (its gang's, for a gang member).
    pub priority: i32,
    /// Its GPU request in GPUs (`2`, `0.5`; `0` for none).
    pub gpus: String,
    /// Its job's place in its queue's order now (1: tried first; `None`:
    /// not explained), computed when asked (`report::queue_positions`).
    pub position: Option<u32>,
    /// Jobs of its queue this cycle.
    pub jobs: Option<u32>,
    /// Its main class's name ([`classify::PendingClass::reason_name`]: the
    /// Queue status's, doctor's and the metrics'); `NotExplained` when the
    /// cycle did not explain it.
    pub reason: String,
    /// The explanation in kube-scheduler's words.
    pub message: String,
    /// How long it has waited (ms) at the cycle's time.
    pub waiting_ms: u64,
}

/// The pending pods of one queue (or every queue) in the order the cycle
/// tried their jobs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingList {
    /// The queue asked for (`None`: every queue).
    pub queue: Option<String>,
    /// Pending pods: by queue name, then the job's position in the queue
    /// (unexplained pods last), then the pod's name.
    pub pods: Vec<PendingEntry>,
    /// The time of the cycle the list is from (ms).
    pub at_ms: u64,
}

/// The pending pods of `queue` (`None`: of every queue) in queue order,
/// each with its main class: `reason_of` names it where the caller
/// classified the pod itself; where it gives none, the cycle's own
/// classification ([`classify::classify_cycle`], the one the Queue status
/// uses). `None` when `queue` names no queue.
/// Pods the last cycle placed (binding in flight) are not pending.
pub fn pending_list(
    view: &CycleView<'_>,
    queue: Option<&str>,
    reason_of: &dyn Fn(PodId) -> Option<String>,
) -> Option<PendingList> {
    let snap = view.snapshot;
    if let Some(q) = queue {
        let (tree, _) = queue_tree(snap);
        tree.idx(q)?;
    }
    let index = CycleIndex::new(view);
    let classes = classify::classify_cycle(view.output, snap);
    let mut pods = Vec::new();
    for (i, ps) in snap.pods.iter().enumerate() {
        let id = i as PodId;
        if !ps.is_pending() || index.placed(id) {
            continue;
        }
        let pod = &ps.pod;
        let group = index.group(pod);
        let q = index.queue_of(pod);
        if queue.is_some_and(|want| want != q) {
            continue;
        }
        let e = index.explanation(id);
        let reason = reason_of(id).unwrap_or_else(|| {
            match (e, classes.get(&id).and_then(|c| c.first())) {
                (Some(_), Some(c)) => c.reason_name(),
                (Some(_), None) => classify::PendingClass::FitsNow.reason_name(),
                (None, _) => "NotExplained",
            }
            .to_string()
        });
        pods.push(PendingEntry {
            pod: pod.name.clone(),
            queue: q.to_string(),
            group: pod.group.clone(),
            priority: group.map_or(pod.priority, |g| g.priority),
            gpus: gpus_text(pod.gpu.milli()),
            position: index.position(id).map(|p| p.position),
            jobs: index.position(id).map(|p| p.jobs),
            reason,
            message: e.map_or_else(
                || "not explained by the last cycle".to_string(),
                |e| e.message(),
            ),
            waiting_ms: view.now_ms.saturating_sub(pod.arrival_ms),
        });
    }
    pods.sort_by(|a, b| {
        (&a.queue, a.position.unwrap_or(u32::MAX), &a.pod).cmp(&(
            &b.queue,
            b.position.unwrap_or(u32::MAX),
            &b.pod,
        ))
    });
    Some(PendingList {
        queue: queue.map(str::to_string),
        pods,
        at_ms: view.now_ms,
    })
}

impl PendingList {
    /// A table as `kubectl get` prints one: QUEUE, POS, POD, GPUS, WAITING,
    /// REASON; `wide` adds PRIORITY, GANG and the message.
    pub fn table(&self, wide: bool) -> String {
        let mut rows: Vec<Vec<String>> = Vec::new();
        let mut head = vec!["QUEUE", "POS", "POD", "GPUS", "WAITING", "REASON"];
        if wide {
            head.extend(["PRIORITY", "GANG", "MESSAGE"]);
        }
        rows.push(head.into_iter().map(str::to_string).collect());
        for p in &self.pods {
            let mut r = vec![
                p.queue.clone(),
                match (p.position, p.jobs) {
                    (Some(i), Some(n)) => format!("{i}/{n}"),
                    _ => "-".to_string(),
                },
                p.pod.clone(),
                p.gpus.clone(),
                fmt_duration(p.waiting_ms),
                p.reason.clone(),
            ];
            if wide {
                r.push(p.priority.to_string());
                r.push(p.group.clone().unwrap_or_else(|| "-".to_string()));
                r.push(p.message.clone());
            }
            rows.push(r);
        }
        if self.pods.is_empty() {
            return match &self.queue {
                Some(q) => format!("No pending pods in queue {q}.\n"),
                None => "No pending pods.\n".to_string(),
            };
        }
        let cols = rows[0].len();
        let width: Vec<usize> = (0..cols)
            .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
            .collect();
        let mut out = String::new();
        for r in &rows {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(c, v)| {
                    if c + 1 == cols {
                        v.clone()
                    } else {
                        format!("{v:<w$}", w = width[c])
                    }
                })
                .collect();
            out.push_str(line.join("   ").trim_end());
            out.push('\n');
        }
        out
    }
}

//! Carries out a cycle's decisions against the API: bindings (with the GPU
//! decision in the Binding's annotations), evictions, nominations, events,
//! pod conditions and pod-group phases. Each write runs as its own task
//! under a concurrency bound and the client-side rate limit, so the loop is
//! never blocked by the API.

use crate::decision::{ANNOTATION_DECISION, GpuDecision};
use crate::limiter::Limiter;
use crate::metrics::{KindLabel, Metrics};
use crate::watch::Shared;
use crate::world::{Assumed, Built, Problem};
use gpusched_core::{CycleOutput, Decision, EvictionKind, GroupPhase, Verdict};
use k8s_openapi::api::core::v1::{Binding, ObjectReference, Pod};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Api, Client};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Tunables of the executor.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Bindings in flight at once.
    pub bind_concurrency: usize,
    /// Other writes (events, status) in flight at once.
    pub write_concurrency: usize,
    /// Attempts per binding on retryable errors.
    pub bind_attempts: u32,
    /// Write rate limit (0: none) and burst, for bindings and status.
    pub qps: f64,
    /// Burst of the rate limit.
    pub burst: u32,
    /// Reporting instance (pod name) for events.
    pub instance: String,
}

impl Default for ExecOptions {
    fn default() -> Self {
        ExecOptions {
            bind_concurrency: 64,
            write_concurrency: 32,
            bind_attempts: 4,
            qps: 0.0,
            burst: 100,
            instance: "gpusched".into(),
        }
    }
}

/// State the executor keeps across cycles to avoid repeating writes.
pub struct Executor {
    client: Client,
    shared: Shared,
    metrics: Arc<Metrics>,
    opts: ExecOptions,
    bind_slots: Arc<Semaphore>,
    write_slots: Arc<Semaphore>,
    bind_limit: Arc<Limiter>,
    write_limit: Arc<Limiter>,
    recorder: Recorder,
    seq: AtomicU64,
    explained: BTreeMap<String, (String, Instant)>,
    evicting: BTreeSet<String>,
    nominated: BTreeMap<String, String>,
    group_phase: BTreeMap<String, String>,
}

fn pod_ref(ns: &str, name: &str, uid: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Pod".into()),
        namespace: Some(ns.into()),
        name: Some(name.into()),
        uid: Some(uid.into()),
        ..Default::default()
    }
}

/// Least time between two different explanations written for one pod.
const EXPLAIN_INTERVAL: Duration = Duration::from_secs(10);

/// Longest event note the API accepts (events.k8s.io: 1 kB).
const NOTE_MAX: usize = 1000;

fn clip(s: &str) -> String {
    if s.len() <= NOTE_MAX {
        return s.to_string();
    }
    let mut end = NOTE_MAX - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

fn add_held(held: &mut BTreeMap<(u32, u32), u64>, node: u32, g: &gpusched_core::GpuAssignment) {
    use gpusched_core::GpuAssignment as A;
    match g {
        A::None => {}
        A::Whole(v) => {
            for &i in v {
                *held.entry((node, i)).or_default() += gpusched_model::GPU_MILLI;
            }
        }
        A::Share { gpu, milli, .. } => *held.entry((node, *gpu)).or_default() += u64::from(*milli),
    }
}

/// The first GPU that `g` would push past one whole GPU on `node`.
fn overbooked(
    held: &BTreeMap<(u32, u32), u64>,
    node: u32,
    g: &gpusched_core::GpuAssignment,
) -> Option<u32> {
    use gpusched_core::GpuAssignment as A;
    let now = |i: u32| held.get(&(node, i)).copied().unwrap_or(0);
    match g {
        A::None => None,
        A::Whole(v) => v.iter().copied().find(|&i| now(i) > 0),
        A::Share { gpu, milli, .. } => {
            (now(*gpu) + u64::from(*milli) > gpusched_model::GPU_MILLI).then_some(*gpu)
        }
    }
}

/// Kinds of binding failure, as the metrics label them.
fn error_kind(e: &kube::Error) -> (&'static str, bool) {
    match e {
        kube::Error::Api(s) => match s.code {
            409 => ("conflict", false),
            404 => ("not_found", false),
            400 | 403 | 422 => ("rejected", false),
            429 => ("throttled", true),
            _ => ("server", true),
        },
        _ => ("transport", true),
    }
}

impl Executor {
    /// A new executor.
    pub fn new(client: Client, shared: Shared, metrics: Arc<Metrics>, opts: ExecOptions) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: "gpusched".into(),
                instance: Some(opts.instance.clone()),
            },
        );
        let seq = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_micros() as u64)
            .unwrap_or(0);
        Executor {
            bind_slots: Arc::new(Semaphore::new(opts.bind_concurrency.max(1))),
            write_slots: Arc::new(Semaphore::new(opts.write_concurrency.max(1))),
            bind_limit: Arc::new(Limiter::new(opts.qps, opts.burst)),
            write_limit: Arc::new(Limiter::new(opts.qps, opts.burst)),
            client,
            shared,
            metrics,
            opts,
            recorder,
            seq: AtomicU64::new(seq),
            explained: BTreeMap::new(),
            evicting: BTreeSet::new(),
            nominated: BTreeMap::new(),
            group_phase: BTreeMap::new(),
        }
    }

    /// Waits until every binding in flight has finished (for shutdown), at
    /// most `timeout`.
    pub async fn drain(&self, timeout: Duration) {
        let n = self.opts.bind_concurrency.max(1) as u32;
        let _ = tokio::time::timeout(timeout, self.bind_slots.acquire_many(n)).await;
    }

    fn write<F>(&self, f: F)
    where
        F: Future<Output = Result<(), kube::Error>> + Send + 'static,
    {
        let slots = self.write_slots.clone();
        let limit = self.write_limit.clone();
        tokio::spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return;
            };
            limit.acquire().await;
            if let Err(e) = f.await {
                tracing::debug!("write: {e}");
            }
        });
    }

    fn event(
        &self,
        r: ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let recorder = self.recorder.clone();
        let ev = Event {
            type_,
            reason: reason.into(),
            note: Some(clip(&note)),
            action: action.into(),
            secondary: None,
        };
        self.write(async move { recorder.publish(&ev, &r).await });
    }

    fn pod_condition(&self, ns: &str, name: &str, reason: &str, message: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let name = name.to_string();
        let now = k8s_openapi::jiff::Timestamp::now().to_string();
        let patch = json!({"status": {"conditions": [{
            "type": "PodScheduled", "status": "False", "reason": reason,
            "message": clip(message), "lastTransitionTime": now,
        }]}});
        self.write(async move {
            api.patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
                .map(|_| ())
        });
    }

    /// Carries out one cycle's output. `built` is the snapshot it was made from.
    pub fn apply(&mut self, out: &CycleOutput, built: &Built) {
        let snap = &built.snapshot;
        let mut bound: BTreeSet<u32> = BTreeSet::new();
        // Last line of defence against double booking: what every pod in the
        // snapshot holds, per (node, GPU) in milli-GPU.
        let mut held: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for p in &snap.pods {
            if let Some((n, g)) = p.holding() {
                add_held(&mut held, n, g);
            }
        }
        for d in &out.decisions {
            match d {
                Decision::Bind { pod, node, gpus } => {
                    let (Some(pr), Some(n)) = (
                        built.pods.get(*pod as usize),
                        snap.nodes.get(*node as usize),
                    ) else {
                        continue;
                    };
                    if let Some(g) = overbooked(&held, *node, gpus) {
                        tracing::error!(
                            "refusing to bind {}/{}: GPU {g} of {} would be overbooked (a scheduler bug)",
                            pr.namespace,
                            pr.name,
                            n.name
                        );
                        self.metrics
                            .bind_errors
                            .get_or_create(&KindLabel {
                                kind: "overbooked".into(),
                            })
                            .inc();
                        continue;
                    }
                    add_held(&mut held, *node, gpus);
                    bound.insert(*pod);
                    let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                    let decision = crate::decision::make(&pr.uid, n, seq, gpus);
                    let created_ms = snap.pods[*pod as usize].pod.arrival_ms;
                    self.shared.with(|w| {
                        w.assume(
                            &pr.uid,
                            Assumed {
                                node: n.name.clone(),
                                decision: decision.clone(),
                                gpus: gpus.clone(),
                            },
                        )
                    });
                    self.explained.remove(&pr.uid);
                    self.spawn_bind(
                        pr.namespace.clone(),
                        pr.name.clone(),
                        pr.uid.clone(),
                        n.name.clone(),
                        decision,
                        created_ms,
                    );
                }
                Decision::Evict { pod, reason } => {
                    let kind = &reason.kind();
                    let Some(pr) = built.pods.get(*pod as usize) else {
                        continue;
                    };
                    if !self.evicting.insert(pr.uid.clone()) {
                        continue;
                    }
                    let k = match kind {
                        EvictionKind::Preempt => "preempt",
                        EvictionKind::Reclaim => "reclaim",
                        EvictionKind::Consolidate => "consolidate",
                    };
                    self.metrics
                        .evictions
                        .get_or_create(&KindLabel { kind: k.into() })
                        .inc();
                    // a moved pod is deleted like a preempted one (its
                    // controller recreates it); the message names the pod
                    // it makes room for: "Moved by gpusched: moved to make
                    // room for NS/NAME (planned to restart on NODE)"
                    let (reason_word, what) = match kind {
                        EvictionKind::Preempt => ("Preempted", "Preempted"),
                        EvictionKind::Reclaim => ("Preempted", "Reclaimed"),
                        EvictionKind::Consolidate => ("Preempted", "Moved"),
                    };
                    self.event(
                        pod_ref(&pr.namespace, &pr.name, &pr.uid),
                        EventType::Normal,
                        reason_word,
                        "Preempting",
                        format!("{what} by gpusched: {reason}"),
                    );
                    self.shared.with(|w| w.assume_evicted(&pr.uid));
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &pr.namespace);
                    let name = pr.name.clone();
                    let uid = pr.uid.clone();
                    let shared = self.shared.clone();
                    let dp = DeleteParams {
                        preconditions: Some(Preconditions {
                            uid: Some(pr.uid.clone()),
                            resource_version: None,
                        }),
                        ..Default::default()
                    };
                    self.write(async move {
                        match api.delete(&name, &dp).await {
                            Ok(_) => Ok(()),
                            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                            Err(e) => {
                                shared.with(|w| w.forget_eviction(&uid));
                                shared.changed.notify_one();
                                Err(e)
                            }
                        }
                    });
                }
                Decision::Nominate { pod, node } => {
                    let (Some(pr), Some(n)) = (
                        built.pods.get(*pod as usize),
                        snap.nodes.get(*node as usize),
                    ) else {
                        continue;
                    };
                    // the planned node of a pod moved by consolidation: the
                    // pod is being deleted (its replacement is a new pod)
                    if self.evicting.contains(&pr.uid) {
                        continue;
                    }
                    if self.nominated.get(&pr.uid) == Some(&n.name) {
                        continue;
                    }
                    self.nominated.insert(pr.uid.clone(), n.name.clone());
                    self.shared.with(|w| w.nominate(&pr.uid, &n.name));
                    let api: Api<Pod> = Api::namespaced(self.client.clone(), &pr.namespace);
                    let name = pr.name.clone();
                    let patch = json!({"status": {"nominatedNodeName": n.name}});
                    self.write(async move {
                        api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                            .await
                            .map(|_| ())
                    });
                }
                Decision::Group { group, phase } => {
                    let p = match phase {
                        GroupPhase::Pending => "Pending",
                        GroupPhase::Inqueue => "Inqueue",
                        GroupPhase::Running => "Running",
                        GroupPhase::TimedOut => "TimedOut",
                    };
                    self.set_group_phase(group, p);
                }
            }
        }
        let mut unschedulable = 0;
        for e in &out.explanations {
            if bound.contains(&e.pod) {
                continue;
            }
            let Some(pr) = built.pods.get(e.pod as usize) else {
                continue;
            };
            unschedulable += 1;
            let message = e.message();
            if !self.should_explain(&pr.uid, &message) {
                continue;
            }
            let reason = match e.verdict {
                Verdict::Unschedulable | Verdict::Unresolvable => "Unschedulable",
            };
            self.event(
                pod_ref(&pr.namespace, &pr.name, &pr.uid),
                EventType::Warning,
                "FailedScheduling",
                "Scheduling",
                message.clone(),
            );
            self.pod_condition(&pr.namespace, &pr.name, reason, &message);
        }
        for _ in 0..unschedulable {
            self.metrics.attempt("unschedulable");
        }
        for p in &built.problems {
            self.problem(p);
        }
        // forget per-pod memory of pods that are gone
        let live: BTreeSet<&str> = built.pods.iter().map(|p| p.uid.as_str()).collect();
        self.explained.retain(|k, _| live.contains(k.as_str()));
        self.evicting.retain(|k| live.contains(k.as_str()));
        self.nominated.retain(|k, _| live.contains(k.as_str()));
    }

    /// Whether to write a pending pod's explanation now: the first one at
    /// once, a changed one at most every [`EXPLAIN_INTERVAL`] (a gang's
    /// message changes with every member that arrives; events and
    /// condition patches must not compete with bindings for the API).
    fn should_explain(&mut self, uid: &str, message: &str) -> bool {
        let now = Instant::now();
        match self.explained.get(uid) {
            Some((m, _)) if m == message => false,
            Some((_, at)) if now.duration_since(*at) < EXPLAIN_INTERVAL => false,
            _ => {
                self.explained
                    .insert(uid.to_string(), (message.to_string(), now));
                true
            }
        }
    }

    fn set_group_phase(&mut self, group: &str, phase: &str) {
        if self.group_phase.get(group).map(String::as_str) == Some(phase) {
            return;
        }
        self.group_phase
            .insert(group.to_string(), phase.to_string());
        let Some((ns, name)) = group.split_once('/') else {
            return;
        };
        let api: Api<crate::crd::PodGroup> = Api::namespaced(self.client.clone(), ns);
        let name = name.to_string();
        let patch = json!({"status": {"phase": phase}});
        self.write(async move {
            api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map(|_| ())
        });
    }

    fn problem(&mut self, p: &Problem) {
        match p {
            Problem::InvalidPod { pod, error } => {
                if !self.should_explain(&pod.uid, error) {
                    return;
                }
                self.metrics.attempt("error");
                self.event(
                    pod_ref(&pod.namespace, &pod.name, &pod.uid),
                    EventType::Warning,
                    "FailedScheduling",
                    "Scheduling",
                    error.clone(),
                );
                self.pod_condition(&pod.namespace, &pod.name, "Unschedulable", error);
            }
            Problem::GatedPod { pod, gates } => {
                let msg = format!("waiting for scheduling gates: {}", gates.join(", "));
                if !self.should_explain(&pod.uid, &msg) {
                    return;
                }
                self.pod_condition(&pod.namespace, &pod.name, "SchedulingGated", &msg);
            }
            Problem::InvalidGroup { group, error } => {
                if self.group_phase.get(group).map(String::as_str) == Some("Invalid") {
                    return;
                }
                self.group_phase.insert(group.clone(), "Invalid".into());
                let Some((ns, name)) = group.split_once('/') else {
                    return;
                };
                let api: Api<crate::crd::PodGroup> = Api::namespaced(self.client.clone(), ns);
                let name = name.to_string();
                let now = k8s_openapi::jiff::Timestamp::now().to_string();
                let patch = json!({"status": {"phase": "Invalid", "conditions": [{
                    "type": "Valid", "status": "False", "reason": "InvalidSpec",
                    "message": clip(error), "lastTransitionTime": now,
                }]}});
                self.write(async move {
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
                        .await
                        .map(|_| ())
                });
            }
            Problem::InvalidQueue { .. }
            | Problem::BadDecision { .. }
            | Problem::NodeWarning { .. } => {}
        }
    }

    fn spawn_bind(
        &self,
        ns: String,
        name: String,
        uid: String,
        node: String,
        decision: GpuDecision,
        created_ms: u64,
    ) {
        let client = self.client.clone();
        let slots = self.bind_slots.clone();
        let limit = self.bind_limit.clone();
        let shared = self.shared.clone();
        let metrics = self.metrics.clone();
        let attempts = self.opts.bind_attempts.max(1);
        let recorder = self.recorder.clone();
        let write_slots = self.write_slots.clone();
        let write_limit = self.write_limit.clone();
        tokio::spawn(async move {
            let Ok(_permit) = slots.acquire_owned().await else {
                return;
            };
            let api: Api<Pod> = Api::namespaced(client, &ns);
            let binding = Binding {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(name.clone()),
                    namespace: Some(ns.clone()),
                    uid: Some(uid.clone()),
                    annotations: Some(BTreeMap::from([(
                        ANNOTATION_DECISION.to_string(),
                        decision.to_annotation(),
                    )])),
                    ..Default::default()
                },
                target: ObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Node".into()),
                    name: Some(node.clone()),
                    ..Default::default()
                },
            };
            for attempt in 1..=attempts {
                limit.acquire().await;
                let t0 = Instant::now();
                let r = api
                    .create_subresource::<Binding, serde_json::Value>(
                        "binding",
                        &name,
                        &PostParams::default(),
                        &binding,
                    )
                    .await;
                metrics.binding_seconds.observe(t0.elapsed().as_secs_f64());
                match r {
                    Ok(_) => {
                        metrics.attempt("scheduled");
                        let now_ms = SystemTime::now()
                            .duration_since(UNIX_EPOCH)
                            .map(|d| d.as_millis() as u64)
                            .unwrap_or(0);
                        if created_ms > 0 {
                            metrics
                                .e2e_seconds
                                .observe(now_ms.saturating_sub(created_ms) as f64 / 1000.0);
                        }
                        let ev = Event {
                            type_: EventType::Normal,
                            reason: "Scheduled".into(),
                            note: Some(format!("Successfully assigned {ns}/{name} to {node}")),
                            action: "Binding".into(),
                            secondary: None,
                        };
                        let r = pod_ref(&ns, &name, &uid);
                        tokio::spawn(async move {
                            let Ok(_p) = write_slots.acquire_owned().await else {
                                return;
                            };
                            write_limit.acquire().await;
                            let _ = recorder.publish(&ev, &r).await;
                        });
                        return;
                    }
                    Err(e) => {
                        let (kind, retry) = error_kind(&e);
                        metrics
                            .bind_errors
                            .get_or_create(&KindLabel { kind: kind.into() })
                            .inc();
                        if retry && attempt < attempts {
                            tracing::debug!(
                                "binding {ns}/{name} to {node} (attempt {attempt}): {e}"
                            );
                            tokio::time::sleep(Duration::from_millis(50 << attempt)).await;
                            continue;
                        }
                        tracing::info!("binding {ns}/{name} to {node} failed: {e}");
                        metrics.attempt("error");
                        shared.with(|w| w.forget(&uid));
                        shared.changed.notify_one();
                        return;
                    }
                }
            }
        });
    }
}

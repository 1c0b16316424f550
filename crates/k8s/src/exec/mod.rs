//! Carries out a cycle's decisions against the API: bindings (with the GPU
//! decision in the Binding's annotations, [`bind`]), evictions and
//! nominations ([`evict`]), events with kube-scheduler's series semantics
//! ([`events`]), the problems of objects (`problems.rs`), and every status
//! write — pod conditions, the level-triggered PodGroup and Queue status
//! ([`status`]). Each write runs
//! as its own task under a concurrency bound and the client-side rate
//! limit, so the loop is never blocked by the API.

pub mod bind;
pub mod claims;
pub mod events;
mod evict;
pub(crate) mod patch;
mod problems;
pub mod status;

use crate::crd::{PodGroupStatus, QueueStatus};
use crate::limiter::Limiter;
use crate::metrics::{KindLabel, Metrics};
use crate::watch::Shared;
use crate::world::{Assumed, Built, Problem};
use events::{Event, EventType, ProblemLog, Recorder};
use gpusched_core::report::classify::PendingClass;
use gpusched_core::{CycleOutput, Decision, GroupPhase};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::api::PatchParams;
use status::StatusWriter;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::Semaphore;

/// Field manager of every write the scheduler makes (`managedFields`
/// names it, not `unknown`).
pub const FIELD_MANAGER: &str = "gpusched-scheduler";

/// Patch parameters naming [`FIELD_MANAGER`].
pub(crate) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Create parameters naming [`FIELD_MANAGER`].
pub(crate) fn post_params() -> kube::api::PostParams {
    kube::api::PostParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..Default::default()
    }
}

/// Tunables of the executor.
#[derive(Clone, Debug)]
pub struct ExecOptions {
    /// Bindings in flight at once.
    pub bind_concurrency: usize,
    /// Other writes (events, status) in flight at once.
    pub write_concurrency: usize,
    /// Attempts per binding on errors the client does not retry itself
    /// ([`bind::RetryPolicy`]).
    pub bind_attempts: u32,
    /// Write rate limit (0: none) and burst, for bindings and status.
    pub qps: f64,
    /// Burst of the rate limit.
    pub burst: u32,
    /// Reporting instance (pod name) for events.
    pub instance: String,
    /// How long a binding waits for the PV controller to bind the pod's
    /// delayed PersistentVolumeClaims before it gives up and the pod is
    /// retried (kube-scheduler's `bindTimeoutSeconds`).
    pub volume_bind_timeout: Duration,
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
            volume_bind_timeout: Duration::from_secs(120),
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
    /// Groups the last cycle timed out.
    timed_out: BTreeSet<String>,
    /// Why each group's pending members waited in the last cycle.
    group_waiting: BTreeMap<String, (PendingClass, String)>,
    /// The last cycle's explained pending pods, by queue and class.
    queue_waiting: BTreeMap<String, BTreeMap<PendingClass, u32>>,
    problems: ProblemLog,
    group_status: StatusWriter<PodGroupStatus>,
    queue_status: StatusWriter<QueueStatus>,
}

pub(crate) fn pod_ref(ns: &str, name: &str, uid: &str) -> ObjectReference {
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

pub(crate) fn clip(s: &str) -> String {
    if s.len() <= NOTE_MAX {
        return s.to_string();
    }
    let mut end = NOTE_MAX - 3;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &s[..end])
}

impl Executor {
    /// A new executor.
    pub fn new(client: Client, shared: Shared, metrics: Arc<Metrics>, opts: ExecOptions) -> Self {
        let recorder = Recorder::new(client.clone(), "gpusched", &opts.instance);
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
            timed_out: BTreeSet::new(),
            group_waiting: BTreeMap::new(),
            queue_waiting: BTreeMap::new(),
            problems: ProblemLog::default(),
            group_status: StatusWriter::default(),
            queue_status: StatusWriter::default(),
        }
    }

    /// Waits until every binding in flight has finished (for shutdown), at
    /// most `timeout`.
    pub async fn drain(&self, timeout: Duration) {
        let n = self.opts.bind_concurrency.max(1) as u32;
        let _ = tokio::time::timeout(timeout, self.bind_slots.acquire_many(n)).await;
    }

    /// One write, made by `make` once a write slot is free. The request's
    /// future (kilobytes: the client's whole request state) exists only
    /// while it holds a slot; a write waiting for one is the small closure
    /// that makes it (10,000 waiting condition writes held 40 MB as
    /// futures at 1,250 nodes, heaptrack).
    fn write<M, F>(&self, make: M)
    where
        M: FnOnce() -> F + Send + 'static,
        F: Future<Output = Result<(), kube::Error>> + Send + 'static,
    {
        let slots = self.write_slots.clone();
        let limit = self.write_limit.clone();
        tokio::spawn(async move {
            let Ok(permit) = slots.acquire_owned().await else {
                return;
            };
            tokio::spawn(async move {
                let _permit = permit;
                limit.acquire().await;
                if let Err(e) = make().await {
                    tracing::debug!("write: {e}");
                }
            });
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
        let ev = self.recorder.prepare(
            Event {
                type_,
                reason: reason.into(),
                action: action.into(),
                note,
            },
            r,
        );
        self.write(move || ev.publish());
    }

    /// Carries out one cycle's output. `built` is the snapshot it was made from.
    /// `classes`: the cycle's [`gpusched_core::report::classify::classify_cycle`]
    /// on cycles that publish status (the PodGroup and Queue reasons are
    /// counted from it); on other cycles `None`, and only pods whose
    /// condition is rewritten are classified (classification walks the
    /// nodes' GPUs: not for every pending pod in every cycle).
    pub fn apply(
        &mut self,
        out: &CycleOutput,
        built: &Built,
        classes: Option<&BTreeMap<gpusched_core::PodId, Vec<PendingClass>>>,
    ) {
        let snap = &built.snapshot;
        let mut bound: BTreeSet<u32> = BTreeSet::new();
        // Last line of defence against double booking: what every pod in the
        // snapshot holds, per (node, GPU) in milli-GPU.
        let mut held: BTreeMap<(u32, u32), u64> = BTreeMap::new();
        for p in &snap.pods {
            if let Some((n, g)) = p.holding() {
                bind::add_held(&mut held, n, g);
            }
        }
        let mut timed_out = BTreeSet::new();
        for d in &out.decisions {
            match d {
                Decision::Bind { pod, node, gpus } => {
                    let (Some(pr), Some(n)) = (
                        built.pods.get(*pod as usize),
                        snap.nodes.get(*node as usize),
                    ) else {
                        continue;
                    };
                    if let Some(g) = bind::overbooked(&held, *node, gpus) {
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
                    let seq = self.seq.fetch_add(1, Ordering::Relaxed);
                    let mut decision = crate::decision::make(&pr.uid, n, seq, gpus);
                    if let (Some(share), Some(r)) = (
                        decision.share.as_mut(),
                        built.replicas.get(&(*pod as usize)),
                    ) {
                        share.resource = Some(r.resource.clone());
                        share.replicas = Some(r.replicas);
                    }
                    let size = decision.to_annotation().len();
                    if size > crate::decision::MAX_DECISION_BYTES {
                        // the agent would refuse it at Allocate: say so now
                        // instead of binding a pod that can never start
                        let msg = format!(
                            "the GPU decision for {} GPU(s) on {} would be {size} bytes, more than the {} bytes the scheduler and the node agent accept; ask for fewer GPUs per pod",
                            decision.indices.len(),
                            n.name,
                            crate::decision::MAX_DECISION_BYTES
                        );
                        if self.should_explain(&pr.uid, &msg) {
                            self.event(
                                pod_ref(&pr.namespace, &pr.name, &pr.uid),
                                EventType::Warning,
                                "FailedScheduling",
                                "Scheduling",
                                msg.clone(),
                            );
                            self.pod_condition(&pr.namespace, &pr.name, "Unschedulable", &msg);
                        }
                        bound.insert(*pod);
                        continue;
                    }
                    // DRA: allocate its claims on that node now (held
                    // from here on, written before the Binding)
                    // (the core's GPUs, when the claims allow them)
                    let core_gpus = match gpus {
                        gpusched_core::GpuAssignment::Whole(v) => v.as_slice(),
                        gpusched_core::GpuAssignment::Share { gpu, .. }
                        | gpusched_core::GpuAssignment::Mig { gpu, .. } => {
                            std::slice::from_ref(gpu)
                        }
                        _ => &[],
                    };
                    let claims = match self
                        .shared
                        .with(|w| w.allocate_claims_at(&pr.uid, &n.name, core_gpus))
                    {
                        Ok(c) => c,
                        Err(e) => {
                            let msg = format!(
                                "its ResourceClaims cannot be allocated on {} now: {e}",
                                n.name
                            );
                            tracing::info!("pod {}/{}: {msg}", pr.namespace, pr.name);
                            if self.should_explain(&pr.uid, &msg) {
                                self.pod_condition(
                                    &pr.namespace,
                                    &pr.name,
                                    PendingClass::UnallocatableClaim.condition_reason(),
                                    &msg,
                                );
                            }
                            bound.insert(*pod);
                            continue;
                        }
                    };
                    bind::add_held(&mut held, *node, gpus);
                    bound.insert(*pod);
                    let created_ms = snap.pods[*pod as usize].pod.arrival_ms;
                    let volumes = self.shared.with(|w| {
                        w.assume(
                            &pr.uid,
                            Assumed {
                                node: n.name.clone(),
                                decision: decision.clone(),
                                gpus: gpus.clone(),
                            },
                        );
                        let r = w.reserve_volumes(&pr.uid, &n.name);
                        if r.is_err() {
                            w.forget(&pr.uid);
                        }
                        r
                    });
                    let volumes = match volumes {
                        Ok(v) => v,
                        Err(why) => {
                            // the claims changed since the snapshot: retried
                            tracing::info!(
                                "not binding {}/{} to {}: its volumes no longer fit there ({why}); retried",
                                pr.namespace,
                                pr.name,
                                n.name
                            );
                            self.shared.changed.notify_one();
                            continue;
                        }
                    };
                    self.explained.remove(&pr.uid);
                    self.spawn_bind(bind::BindJob {
                        ns: pr.namespace.clone(),
                        name: pr.name.clone(),
                        uid: pr.uid.clone(),
                        node: n.name.clone(),
                        decision,
                        created_ms,
                        volumes,
                        claims,
                    });
                }
                Decision::Evict { pod, reason } => {
                    if let Some(pr) = built.pods.get(*pod as usize) {
                        self.evict(pr, reason);
                    }
                }
                Decision::Nominate { pod, node } => {
                    if let (Some(pr), Some(n)) = (
                        built.pods.get(*pod as usize),
                        snap.nodes.get(*node as usize),
                    ) {
                        self.nominate(pr, &n.name);
                    }
                }
                // the phase follows from the members (status::wanted_phase);
                // only the core knows a group timed out
                Decision::Group { group, phase } => {
                    if *phase == GroupPhase::TimedOut {
                        timed_out.insert(group.clone());
                    }
                }
            }
        }
        self.timed_out = timed_out;
        let mut unschedulable = 0;
        let mut group_waiting = BTreeMap::new();
        let mut queue_waiting: BTreeMap<String, BTreeMap<PendingClass, u32>> = BTreeMap::new();
        // gangs waiting for a ProvisioningRequest (crate::provreq)
        let provisioning = self.shared.with(|w| w.provisioning_notes().clone());
        // one classifier for the cycle: what the snapshot's GPUs say of a
        // GPU ask is looked up once per distinct ask
        let classifier = gpusched_core::report::classify::Classifier::new(snap);
        for e in &out.explanations {
            if bound.contains(&e.pod) {
                continue;
            }
            let Some(pr) = built.pods.get(e.pod as usize) else {
                continue;
            };
            unschedulable += 1;
            let mut message = e.message();
            let note = snap
                .pods
                .get(e.pod as usize)
                .and_then(|ps| ps.pod.group.as_ref())
                .and_then(|g| provisioning.get(g));
            if let Some(note) = note {
                message = format!("{message}; {note}");
            }
            let counted = classes.map(|c| c.get(&e.pod).map(Vec::as_slice).unwrap_or(&[]));
            if let (Some(cls), Some(ps)) = (counted, snap.pods.get(e.pod as usize)) {
                *queue_waiting
                    .entry(ps.pod.queue.clone())
                    .or_default()
                    .entry(cls.first().copied().unwrap_or(PendingClass::FitsNow))
                    .or_default() += 1;
                if let (Some(g), Some(&c)) = (ps.pod.group.as_ref(), cls.first())
                    && group_waiting.get(g).is_none_or(|(had, _)| c < *had)
                {
                    group_waiting.insert(g.clone(), (c, message.clone()));
                }
            }
            let own;
            let cls = match counted {
                Some(c) => c,
                None => {
                    own = snap
                        .pods
                        .get(e.pod as usize)
                        .map(|ps| classifier.classify(e, &ps.pod))
                        .unwrap_or_default();
                    &own
                }
            };
            // the class's name, as explain, pending, the Queue status,
            // doctor and the metrics show it
            let message = gpusched_core::report::classify::tagged_message(
                &message,
                cls.first().copied().unwrap_or(PendingClass::FitsNow),
            );
            if !self.should_explain(&pr.uid, &message) {
                continue;
            }
            let mut reason = gpusched_core::report::classify::condition_reason(e, cls);
            if note.is_some() && reason == "Unschedulable" {
                reason = crate::provreq::CONDITION_REASON;
            }
            self.event(
                pod_ref(&pr.namespace, &pr.name, &pr.uid),
                EventType::Warning,
                "FailedScheduling",
                "Scheduling",
                message.clone(),
            );
            self.pod_condition(&pr.namespace, &pr.name, reason, &message);
        }
        if classes.is_some() {
            self.group_waiting = group_waiting;
            self.queue_waiting = queue_waiting;
        }
        for _ in 0..unschedulable {
            self.metrics.attempt("unschedulable");
        }
        for p in &built.problems {
            self.problem(p);
        }
        self.report_problems(&built.problems);
        // forget per-pod memory of pods that are gone; the pods the core
        // never sees (invalid, gated, claims pending) are not gone: their
        // explanation is written once, then on change at most every
        // EXPLAIN_INTERVAL, like any pending pod's
        let live: BTreeSet<&str> = built.pods.iter().map(|p| p.uid.as_str()).collect();
        let unseen: BTreeSet<&str> = built
            .problems
            .iter()
            .filter_map(Problem::pending_pod)
            .map(|p| p.uid.as_str())
            .collect();
        self.explained
            .retain(|k, _| live.contains(k.as_str()) || unseen.contains(k.as_str()));
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clip_keeps_notes_under_the_api_limit() {
        let long = "é".repeat(800);
        let c = clip(&long);
        assert!(c.len() <= NOTE_MAX && c.ends_with("..."), "{}", c.len());
        assert_eq!(clip("short"), "short");
    }
}

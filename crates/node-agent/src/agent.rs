//! The agent's shared state: inventory, resource plans, health, and the
//! device lists published to every ListAndWatch stream.

use crate::api;
use crate::backend::{BackendError, DeviceBackend, HealthEvent, HealthWatch, Inventory};
use crate::config::Settings;
use crate::health::{HealthPolicy, HealthTracker, Outcome};
use crate::metrics::{GpuLabels, Metrics};
use crate::plan::{PlanError, ResourcePlan, build_plans};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, watch};

/// A published device list.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// The devices sent in `ListAndWatch`.
    pub devices: Vec<api::Device>,
    /// Health of each unit of the plan.
    pub unit_healthy: Vec<bool>,
}

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Discovering GPUs or starting health monitoring failed.
    #[error(transparent)]
    Backend(#[from] BackendError),
    /// The node's GPUs cannot be offered as configured.
    #[error(transparent)]
    Plan(#[from] PlanError),
}

/// Everything the servers share.
pub struct Agent {
    /// The effective settings.
    pub settings: Settings,
    /// The GPUs found at start.
    pub inventory: Inventory,
    /// One plan per advertised resource (the index is the resource's `r`).
    pub plans: Vec<ResourcePlan>,
    /// The Prometheus registry and its families.
    pub metrics: Metrics,
    backend: Arc<dyn DeviceBackend>,
    health: Mutex<HealthTracker>,
    views: Vec<watch::Sender<Arc<View>>>,
    registered: Vec<AtomicBool>,
    /// MIG device UUID → parent GPU UUID, for events that name a MIG device.
    parent_of: HashMap<String, String>,
    gpu_labels: Vec<GpuLabels>,
    /// Decisions of this node, when the agent runs with `--node-name`.
    pub coord: std::sync::OnceLock<Arc<crate::coord::Coordinator>>,
    /// Bumped on every health change (node publishing waits on it).
    pub health_gen: watch::Sender<u64>,
    /// Time-sliced replica id → the GPU (inventory position) the `Allocate`
    /// that handed it out named: PodResources then tells which pod was told
    /// which GPU (`docs/protocol.md`, replica swaps). Since this start.
    pub replica_told: std::sync::Mutex<std::collections::BTreeMap<String, usize>>,
    /// MIG device id the kubelet passed → the decided instance (device id)
    /// the answer named in its place: PodResources then tells which pod
    /// holds which instances. Since this start.
    pub mig_told: std::sync::Mutex<std::collections::BTreeMap<String, String>>,
}

impl Agent {
    /// Discovers devices and builds the plans. Health events go to the
    /// returned receiver, to be driven by [`Agent::run_health`].
    pub fn new(
        settings: Settings,
        backend: Arc<dyn DeviceBackend>,
    ) -> Result<Arc<Agent>, AgentError> {
        let inventory = backend.discover()?;
        let initially_unhealthy = &backend.initial_faults();
        let plans = build_plans(&inventory, &settings)?;
        let uuids: Vec<String> = inventory.gpus.iter().map(|g| g.uuid.clone()).collect();
        let tracker = HealthTracker::new(
            HealthPolicy {
                quiet_period: settings.quiet_period,
                recover: settings.recover,
                ignored_xids: settings.ignored_xids.clone(),
            },
            &uuids,
            initially_unhealthy,
        );
        let parent_of = inventory
            .gpus
            .iter()
            .flat_map(|g| g.mig.iter().map(move |m| (m.uuid.clone(), g.uuid.clone())))
            .collect();
        let gpu_labels = inventory
            .gpus
            .iter()
            .map(|g| GpuLabels {
                gpu: g.uuid.clone(),
                index: g.index.to_string(),
                model: g.model.clone(),
            })
            .collect();
        let gpu_healthy: Vec<bool> = (0..uuids.len()).map(|i| tracker.is_healthy(i)).collect();
        let views = plans
            .iter()
            .map(|p| watch::channel(Arc::new(view_of(p, &gpu_healthy))).0)
            .collect();
        let registered = plans.iter().map(|_| AtomicBool::new(false)).collect();
        let agent = Agent {
            settings,
            inventory,
            plans,
            metrics: Metrics::new(),
            backend,
            health: Mutex::new(tracker),
            views,
            registered,
            parent_of,
            gpu_labels,
            coord: std::sync::OnceLock::new(),
            health_gen: watch::channel(0).0,
            replica_told: Default::default(),
            mig_told: Default::default(),
        };
        // Counters exist from the start at 0, so `increase()` sees the
        // first event (a series born at 1 hides it).
        for l in &agent.gpu_labels {
            let _ = agent.metrics.xid.get_or_create(l);
            let _ = agent.metrics.health_transitions.get_or_create(l);
        }
        for p in &agent.plans {
            let l = crate::metrics::ResourceLabels {
                resource: p.name.clone(),
            };
            let _ = agent.metrics.registrations.get_or_create(&l);
            let _ = agent.metrics.list_updates.get_or_create(&l);
        }
        agent.refresh_health_metrics();
        Ok(Arc::new(agent))
    }

    /// Starts the backend's health monitoring and returns its event stream.
    pub fn start_health(&self) -> Result<mpsc::UnboundedReceiver<HealthEvent>, AgentError> {
        let (tx, rx) = mpsc::unbounded_channel();
        if !self.settings.health_disabled {
            self.backend.watch_health(
                HealthWatch {
                    check_interval: self.settings.check_interval,
                },
                tx,
            )?;
        } else {
            // Keep the channel open so the loop does not spin.
            std::mem::forget(tx);
        }
        Ok(rx)
    }

    /// Applies events and recoveries until `events` closes and nothing is
    /// left to recover, or `stop` fires.
    pub async fn run_health(
        self: Arc<Self>,
        mut events: mpsc::UnboundedReceiver<HealthEvent>,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut open = true;
        loop {
            let deadline = self.lock_health().next_deadline();
            let sleep = async {
                match deadline {
                    Some(d) => tokio::time::sleep_until(d.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                ev = events.recv(), if open => match ev {
                    Some(ev) => self.on_event(ev, Instant::now()),
                    None => open = false,
                },
                _ = sleep => self.tick(Instant::now()),
                _ = stop.changed() => return,
            }
            if !open && deadline.is_none() && self.lock_health().next_deadline().is_none() {
                // Nothing more can change; wait for stop.
                let _ = stop.changed().await;
                return;
            }
        }
    }

    fn lock_health(&self) -> std::sync::MutexGuard<'_, HealthTracker> {
        // A panic while holding the lock cannot leave the tracker torn (every
        // method finishes its writes), so a poisoned lock is still usable.
        self.health.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Applies one health event now.
    pub fn on_event(&self, ev: HealthEvent, now: Instant) {
        let ev = match self.parent_of.get(ev.gpu()) {
            Some(parent) => retarget(ev, parent),
            None => ev,
        };
        let outcome = self.lock_health().apply(&ev, now);
        if let HealthEvent::Xid { gpu, xid } = &ev
            && *xid != 0
        {
            if let Some(l) = self.gpu_labels.iter().find(|l| &l.gpu == gpu) {
                self.metrics.xid.get_or_create(l).inc();
            }
            tracing::warn!(gpu = %gpu, xid, "xid event");
        }
        match outcome {
            Outcome::Changed { gpu, healthy } => {
                tracing::warn!(gpu = %self.inventory.gpus[gpu].uuid, healthy, event = ?ev, "gpu health changed");
                if let Some(l) = self.gpu_labels.get(gpu) {
                    self.metrics.health_transitions.get_or_create(l).inc();
                }
                self.publish();
            }
            Outcome::Unchanged => {}
            Outcome::UnknownGpu => tracing::warn!(event = ?ev, "health event for an unknown GPU"),
        }
    }

    /// Recovers GPUs whose quiet period passed.
    pub fn tick(&self, now: Instant) {
        let recovered = self.lock_health().tick(now);
        for &g in &recovered {
            tracing::info!(gpu = %self.inventory.gpus[g].uuid, "gpu recovered after quiet period");
            if let Some(l) = self.gpu_labels.get(g) {
                self.metrics.health_transitions.get_or_create(l).inc();
            }
        }
        if !recovered.is_empty() {
            self.publish();
        }
    }

    /// Health of every GPU (inventory order).
    pub fn gpu_healthy(&self) -> Vec<bool> {
        let t = self.lock_health();
        (0..self.inventory.gpus.len())
            .map(|i| t.is_healthy(i))
            .collect()
    }

    /// Health of every GPU (inventory order) with the reason of a fault, as
    /// the DRA slice shows it.
    pub fn gpu_conditions(&self) -> Vec<crate::dra::slice::GpuCondition> {
        use crate::dra::slice::GpuCondition;
        use crate::health::State;
        self.lock_health()
            .gpus()
            .iter()
            .map(|g| match &g.state {
                State::Healthy => GpuCondition::Healthy,
                State::Unhealthy { reason, .. } | State::Forced { reason } => {
                    GpuCondition::Unhealthy(reason.clone())
                }
            })
            .collect()
    }

    /// Recomputes every device list and wakes the streams whose list changed.
    pub fn publish(&self) {
        let healthy = self.gpu_healthy();
        for (p, tx) in self.plans.iter().zip(&self.views) {
            let v = view_of(p, &healthy);
            let changed = tx.send_if_modified(|cur| {
                if **cur == v {
                    false
                } else {
                    *cur = Arc::new(v);
                    true
                }
            });
            if changed {
                self.metrics
                    .list_updates
                    .get_or_create(&crate::metrics::ResourceLabels {
                        resource: p.name.clone(),
                    })
                    .inc();
            }
        }
        self.refresh_health_metrics();
        self.health_gen.send_modify(|g| *g += 1);
    }

    fn refresh_health_metrics(&self) {
        let healthy = self.gpu_healthy();
        for (l, h) in self.gpu_labels.iter().zip(healthy) {
            self.metrics.healthy.get_or_create(l).set(h as i64);
        }
    }

    /// The current device list of resource `r`.
    pub fn view(&self, r: usize) -> Arc<View> {
        self.views[r].borrow().clone()
    }

    /// A receiver that sees every new device list of resource `r`.
    pub fn subscribe(&self, r: usize) -> watch::Receiver<Arc<View>> {
        self.views[r].subscribe()
    }

    /// Records whether resource `r` is registered with the kubelet (see [`Agent::ready`]).
    pub fn set_registered(&self, r: usize, v: bool) {
        if let Some(b) = self.registered.get(r) {
            b.store(v, Ordering::SeqCst);
        }
    }

    /// Ready: every resource is registered with the kubelet.
    pub fn ready(&self) -> bool {
        self.registered.iter().all(|b| b.load(Ordering::SeqCst))
    }

    /// Records that `gpu` (inventory index) was handed out.
    pub fn mark_allocated(&self, gpu: usize) {
        if let Some(l) = self.gpu_labels.get(gpu) {
            self.metrics.allocated.get_or_create(l).set(1);
        }
    }

    /// Refreshes live readings and renders `/metrics`.
    pub fn render_metrics(&self) -> String {
        for s in self.backend.sample() {
            let Some(l) = self.gpu_labels.iter().find(|l| l.gpu == s.uuid) else {
                continue;
            };
            if let Some(v) = s.utilization_ratio {
                self.metrics.utilization.get_or_create(l).set(v);
            }
            if let Some(v) = s.memory_used_bytes {
                self.metrics
                    .memory_used
                    .get_or_create(l)
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
            if let Some(v) = s.memory_total_bytes {
                self.metrics
                    .memory_total
                    .get_or_create(l)
                    .set(i64::try_from(v).unwrap_or(i64::MAX));
            }
            if let Some(v) = s.power_watts {
                self.metrics.power.get_or_create(l).set(v);
            }
            if let Some(v) = s.temperature_celsius {
                self.metrics.temperature.get_or_create(l).set(v);
            }
        }
        for l in &self.gpu_labels {
            let _ = self.metrics.allocated.get_or_create(l);
        }
        self.refresh_health_metrics();
        self.metrics.encode()
    }
}

fn retarget(ev: HealthEvent, gpu: &str) -> HealthEvent {
    let gpu = gpu.to_string();
    match ev {
        HealthEvent::Xid { xid, .. } => HealthEvent::Xid { gpu, xid },
        HealthEvent::CheckFailed { reason, .. } => HealthEvent::CheckFailed { gpu, reason },
        HealthEvent::Force { reason, .. } => HealthEvent::Force { gpu, reason },
        HealthEvent::Release { .. } => HealthEvent::Release { gpu },
    }
}

fn view_of(p: &ResourcePlan, gpu_healthy: &[bool]) -> View {
    let unit_healthy: Vec<bool> = p
        .units
        .iter()
        .map(|u| gpu_healthy.get(u.gpu).copied().unwrap_or(false))
        .collect();
    View {
        devices: p.device_list(&unit_healthy),
        unit_healthy,
    }
}

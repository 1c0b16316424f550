//! Glue between the kubelet's calls and the decisions on this node
//! (`docs/protocol.md`): where pods come from ([`PodSource`]), where
//! refusals go ([`EventSink`]), where the node's facts go ([`NodeSink`]),
//! and the serialized `Allocate` path with one fresh LIST on a miss.
//! Kubernetes implementations live in [`crate::kube`]; tests inject their
//! own.

use crate::decisions::{Ledger, LedgerGpu, Matched, Miss, PodInfo, Refusal, ShareGrant};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

/// A boxed future.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The pods bound to this node.
pub trait PodSource: Send + Sync + 'static {
    /// Every pod of the node now (a fresh LIST).
    fn list(&self) -> BoxFuture<'_, Result<Vec<PodInfo>, String>>;
    /// Feeds changes into `coord` until `stop`; a source without a watch
    /// may simply wait for `stop` (misses then LIST).
    fn watch(
        self: Arc<Self>,
        coord: Arc<Coordinator>,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> BoxFuture<'static, ()>;
}

/// Where refusals are reported (pod events).
pub trait EventSink: Send + Sync + 'static {
    /// A pod's `Allocate` was refused: `reason` is the event's reason, `message` its text.
    fn refused(&self, pod: &PodInfo, reason: &str, message: &str);
}

/// The node's facts for the scheduler.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeFacts {
    /// Labels to set on the Node.
    pub labels: BTreeMap<String, String>,
    /// Annotations to set on the Node.
    pub annotations: BTreeMap<String, String>,
    /// Extended resources to put in the node's capacity.
    pub capacity: BTreeMap<String, String>,
}

/// Where the node's facts go (the Node object).
pub trait NodeSink: Send + Sync + 'static {
    /// Writes `facts` to the Node; the error is the API's, in words.
    fn publish(&self, facts: NodeFacts) -> BoxFuture<'_, Result<(), String>>;
}

/// Events nobody reads (no credentials for events).
pub struct NoEvents;
impl EventSink for NoEvents {
    fn refused(&self, _pod: &PodInfo, _reason: &str, _message: &str) {}
}

/// The Kubernetes side of a running agent.
#[derive(Clone)]
pub struct KubeSide {
    /// The Node this agent runs on.
    pub node: String,
    /// The pods of this node and their decisions.
    pub pods: Arc<dyn PodSource>,
    /// Where refusals are reported.
    pub events: Arc<dyn EventSink>,
    /// Where the node's facts go (none: they are not published).
    pub node_sink: Option<Arc<dyn NodeSink>>,
    /// Refuse `Allocate` calls that match no decision.
    pub require_decision: bool,
}

/// Decisions of this node plus the I/O around them.
pub struct Coordinator {
    /// The Kubernetes side this coordinator serves.
    pub side: KubeSide,
    ledger: Mutex<Ledger>,
    /// One `Allocate` at a time.
    pub serial: tokio::sync::Mutex<()>,
    /// Signalled after a served `Allocate` (PodResources is read then).
    pub allocated: tokio::sync::Notify,
    /// Signalled after PodResources was taken in (the allocations are
    /// published then if they changed).
    pub reconciled: tokio::sync::Notify,
}

impl Coordinator {
    /// A coordinator for `side` with an empty ledger of `gpus`.
    pub fn new(side: KubeSide, gpus: Vec<LedgerGpu>) -> Arc<Self> {
        Arc::new(Coordinator {
            ledger: Mutex::new(Ledger::new(&side.node, gpus)),
            side,
            serial: tokio::sync::Mutex::new(()),
            allocated: tokio::sync::Notify::new(),
            reconciled: tokio::sync::Notify::new(),
        })
    }

    /// The ledger of decisions (a poisoned lock is taken over: the ledger is rebuilt from pods anyway).
    pub fn ledger(&self) -> std::sync::MutexGuard<'_, Ledger> {
        self.ledger.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn report(&self, r: Vec<Refusal>) {
        for r in r {
            tracing::warn!(pod = %r.pod.key(), "decision refused: {}", r.message);
            self.side
                .events
                .refused(&r.pod, "GpuDecisionRefused", &r.message);
        }
    }

    /// A pod was added or changed.
    pub fn observe(&self, pod: PodInfo) {
        let r = self.ledger().observe(pod);
        self.report(r.into_iter().collect());
    }

    /// A pod was deleted.
    pub fn forget(&self, uid: &str) {
        self.ledger().forget(uid);
    }

    /// Replaces the pods with a fresh list.
    pub fn replace_all(&self, pods: Vec<PodInfo>) {
        let r = self.ledger().replace_all(pods);
        self.report(r);
    }

    /// A fresh LIST from the source.
    pub async fn refresh(&self) -> Result<(), String> {
        let pods = self.side.pods.list().await?;
        self.replace_all(pods);
        Ok(())
    }

    /// Whole GPUs through the ledger, with one refresh on a miss. A call
    /// no decision expects exactly (it would be charged to one with that
    /// much left) takes the fresh LIST first: the decision of the pod
    /// calling may not have reached the watch yet.
    pub async fn allocate_whole(&self, want: &[usize], healthy: &[bool]) -> Result<Matched, Miss> {
        let unexpected = {
            let l = self.ledger();
            let n = l.new_gpus(want);
            n > 0 && !l.expects_whole(n)
        };
        if unexpected && let Err(e) = self.refresh().await {
            tracing::warn!("pod list on an unexpected allocate failed: {e}");
        }
        let first = self.ledger().allocate_whole(want, healthy);
        match first {
            Err(Miss::NoDecision(_)) => {
                if let Err(e) = self.refresh().await {
                    tracing::warn!("pod list on an allocate miss failed: {e}");
                }
                self.ledger().allocate_whole(want, healthy)
            }
            r => r,
        }
    }

    /// A share through the ledger, with one refresh on a miss.
    pub async fn allocate_share(
        &self,
        n: u32,
        resource: Option<&str>,
        hint: Option<usize>,
        healthy: &[bool],
    ) -> Result<ShareGrant, Miss> {
        // (as for whole GPUs: no exact match, fresh LIST first)
        let unexpected = !self.ledger().expects_share(n, resource);
        if unexpected && let Err(e) = self.refresh().await {
            tracing::warn!("pod list on an unexpected allocate failed: {e}");
        }
        let first = self.ledger().allocate_share(n, resource, hint, healthy);
        match first {
            Err(Miss::NoDecision(_)) => {
                if let Err(e) = self.refresh().await {
                    tracing::warn!("pod list on an allocate miss failed: {e}");
                }
                self.ledger().allocate_share(n, resource, hint, healthy)
            }
            r => r,
        }
    }

    /// Reports a refused `Allocate` on the pending pods that could have
    /// been the caller: those expecting a call of this size; if none, those
    /// with that much left; if none, every pending pod of that kind (the
    /// kubelet does not say which pod calls).
    pub fn report_allocate_refusal(&self, size: usize, share: bool, message: &str) {
        use crate::decisions::Grant;
        let pods: Vec<PodInfo> = {
            let l = self.ledger();
            let pending: Vec<(&crate::decisions::Entry, &Vec<u32>)> = l
                .entries()
                .values()
                .filter_map(|e| match &e.state {
                    Ok(Grant::Whole { slots, .. }) if !share && !slots.is_empty() => {
                        Some((e, slots))
                    }
                    Ok(Grant::Share { slots, .. }) if share && !slots.is_empty() => {
                        Some((e, slots))
                    }
                    _ => None,
                })
                .collect();
            let left = |s: &Vec<u32>| s.iter().map(|&x| x as usize).sum::<usize>();
            let exact: Vec<PodInfo> = pending
                .iter()
                .filter(|(_, s)| s.iter().any(|&x| x as usize == size))
                .map(|(e, _)| e.pod.clone())
                .collect();
            let enough: Vec<PodInfo> = pending
                .iter()
                .filter(|(_, s)| left(s) >= size)
                .map(|(e, _)| e.pod.clone())
                .collect();
            if !exact.is_empty() {
                exact
            } else if !enough.is_empty() {
                enough
            } else {
                pending.iter().map(|(e, _)| e.pod.clone()).collect()
            }
        };
        for p in pods {
            self.side
                .events
                .refused(&p, "GpuAllocationRefused", message);
        }
    }
}

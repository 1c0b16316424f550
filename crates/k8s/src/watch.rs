//! Watches that feed the [`World`]: each object is translated as it
//! arrives and dropped (no object store is kept, so memory is what the core
//! needs, not what the API sends). A relist replaces the kind's objects.

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::world::{ObjectKind, World};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

mod jobs;
mod kinds;

pub use jobs::run_job_gangs;
pub use kinds::{Kind, kinds};

/// Long-lived tasks of one scheduler run, aborted together when it ends or
/// is dropped (so an in-process run that is cancelled leaves nothing behind,
/// in particular nothing holding the leader lease).
#[derive(Default)]
pub struct Tasks(Vec<tokio::task::AbortHandle>);

impl Tasks {
    /// Spawns a task owned by this run.
    pub fn spawn<F>(&mut self, f: F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.0.push(tokio::spawn(f).abort_handle());
    }
}

impl Drop for Tasks {
    fn drop(&mut self) {
        for t in &self.0 {
            t.abort();
        }
    }
}

/// Shared state between the watches and the loop.
#[derive(Clone)]
pub struct Shared {
    /// The world.
    pub world: Arc<Mutex<World>>,
    /// Woken on every change.
    pub changed: Arc<Notify>,
}

impl Shared {
    /// Runs `f` on the world.
    pub fn with<R>(&self, f: impl FnOnce(&mut World) -> R) -> R {
        let mut w = self.world.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut w)
    }
}

fn ns_key<K: Resource>(o: &K) -> String {
    let m = o.meta();
    format!(
        "{}/{}",
        m.namespace.as_deref().unwrap_or_default(),
        m.name.as_deref().unwrap_or_default()
    )
}

fn name_key<K: Resource>(o: &K) -> String {
    o.meta().name.clone().unwrap_or_default()
}

fn uid_key<K: Resource>(o: &K) -> String {
    o.meta().uid.clone().unwrap_or_default()
}

/// How one watch stands: listed yet, and what keeps it from working (a
/// missing permission, a CRD that is not installed), for `/readyz`,
/// `/healthz` and the logs.
#[derive(Debug)]
pub struct WatchHealth {
    /// What it watches.
    pub kind: ObjectKind,
    /// Readiness waits for it (optional kinds are CRDs that may be absent).
    pub required: bool,
    /// Its first list is complete.
    pub synced: AtomicBool,
    /// The permission it lacks (the API server's 403 message), while it
    /// lacks it.
    forbidden: Mutex<Option<String>>,
}

impl WatchHealth {
    /// A watch's health, not yet synced.
    pub fn new(kind: ObjectKind, required: bool) -> Self {
        WatchHealth {
            kind,
            required,
            synced: AtomicBool::new(false),
            forbidden: Mutex::new(None),
        }
    }

    /// The missing permission, while the API server refuses the watch.
    pub fn forbidden(&self) -> Option<String> {
        self.forbidden
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_forbidden(&self, v: Option<String>) {
        *self.forbidden.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }

    /// A list completed: permitted, and synced.
    fn listed(&self) {
        if self.forbidden().is_some() {
            tracing::info!(kind = ?self.kind, "watch permitted now");
            self.set_forbidden(None);
        }
        if !self.synced.swap(true, Ordering::SeqCst) {
            tracing::info!(kind = ?self.kind, "watch synced");
        }
    }
}

/// What a failed watch request says, sorted into what the loop does with it.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// 403: the credentials may not list or watch this kind.
    Forbidden(String),
    /// 404: the resource is not served (a CRD that is not installed).
    NotServed,
    /// Anything else (retried with backoff).
    Other(String),
}

fn classify(e: &watcher::Error) -> Failure {
    let status = match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => Some(s.as_ref()),
        watcher::Error::WatchError(s) => Some(s.as_ref()),
        _ => None,
    };
    match status {
        Some(s) if s.code == 403 => Failure::Forbidden(s.message.clone()),
        Some(s) if s.code == 404 => Failure::NotServed,
        _ => Failure::Other(e.to_string()),
    }
}

/// Logs a repeated problem at most once a minute (with how often it
/// happened meanwhile).
struct Throttled {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl Throttled {
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    fn new() -> Self {
        Throttled {
            last: None,
            suppressed: 0,
        }
    }

    /// Whether to log now; `Some(n)`: log, `n` occurrences were suppressed.
    fn due(&mut self) -> Option<u64> {
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            self.suppressed += 1;
            return None;
        }
        self.last = Some(std::time::Instant::now());
        Some(std::mem::take(&mut self.suppressed))
    }
}

/// How a watch's failures are logged: a missing permission and other
/// errors each at most once a minute.
struct FailureLog {
    forbidden: Throttled,
    other: Throttled,
}

impl Default for FailureLog {
    fn default() -> Self {
        FailureLog {
            forbidden: Throttled::new(),
            other: Throttled::new(),
        }
    }
}

impl FailureLog {
    /// Logs a failed request and records a missing permission in
    /// `health`; returns what kind of failure it was.
    fn failed(&mut self, e: &watcher::Error, health: &WatchHealth) -> Failure {
        let kind = health.kind;
        let f = classify(e);
        match &f {
            Failure::Forbidden(msg) => {
                if let Some(n) = self.forbidden.due() {
                    tracing::error!(
                        ?kind,
                        suppressed = n,
                        "watch forbidden: {msg} (grant the scheduler's ClusterRole the permission; deploy/README.md)"
                    );
                }
                health.set_forbidden(Some(msg.clone()));
            }
            Failure::NotServed | Failure::Other(_) => {
                if let Some(n) = self.other.due() {
                    tracing::warn!(?kind, suppressed = n, "watch: {e}");
                }
            }
        }
        f
    }
}

/// Whether the API server serves `ar` (discovery is open to every
/// authenticated user).
pub(crate) async fn served(client: &Client, ar: &ApiResource) -> bool {
    match client.list_api_group_resources(&ar.api_version).await {
        Ok(list) => list.resources.iter().any(|r| r.name == ar.plural),
        Err(_) => false,
    }
}

/// Objects per page of a watch's (re)list.
const LIST_PAGE_SIZE: u32 = 500;

/// How every watch of the world lists: the most recent state, in pages of
/// [`LIST_PAGE_SIZE`]. A list at `resourceVersion=0` (the "any" semantic)
/// is answered from the API server's cache in ONE response whatever the
/// limit: at 50,000 pods that is a ~100 MB body decoded at once. A
/// paginated list keeps one page in memory at a time (measured: it did
/// not lower the scheduler's peak RSS at 5,000 nodes / 50,000 pods,
/// BENCHMARKS.md §5; it bounds the list's own transient memory). Since
/// Kubernetes 1.31 the API server serves consistent lists from its watch
/// cache, so this costs it little.
fn list_config() -> watcher::Config {
    watcher::Config::default().page_size(LIST_PAGE_SIZE)
}

async fn run_watch<K>(
    api: Api<K>,
    cfg: watcher::Config,
    health: Arc<WatchHealth>,
    shared: Shared,
    key: fn(&K) -> String,
    apply: fn(&mut World, &K),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let kind = health.kind;
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen: Option<BTreeSet<String>> = None;
    let mut log = FailureLog::default();
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(o)) => shared.with(|w| apply(w, &o)),
            Ok(Event::Delete(o)) => {
                let k = key(&o);
                shared.with(|w| w.remove(kind, &k));
            }
            Ok(Event::Init) => seen = Some(BTreeSet::new()),
            Ok(Event::InitApply(o)) => {
                if let Some(s) = seen.as_mut() {
                    s.insert(key(&o));
                }
                shared.with(|w| apply(w, &o));
            }
            Ok(Event::InitDone) => {
                if let Some(s) = seen.take() {
                    shared.with(|w| w.retain_only(kind, &s));
                }
                health.listed();
            }
            Err(e) => {
                log.failed(&e, &health);
                continue;
            }
        }
        shared.changed.notify_one();
    }
}

/// Why a watch stopped.
enum Gone {
    /// Its resource is not served (any more).
    NotServed,
    /// The stream ended.
    Ended,
}

/// Watches an optional custom resource while it is served: checks
/// discovery every `recheck` until it is, watches it, and goes back to
/// checking when it is removed (its objects are dropped then). Each object
/// is decoded on its own: one that does not decode is reported by `bad`
/// (name and the field at fault) and skipped, never the whole list.
async fn run_optional<K>(
    client: Client,
    health: Arc<WatchHealth>,
    shared: Shared,
    apply: fn(&mut World, Result<&K, (&str, String)>),
    recheck: std::time::Duration,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let ar = ApiResource::erase::<K>(&());
    let kind = health.kind;
    let mut said_absent = false;
    loop {
        if !served(&client, &ar).await {
            if !said_absent {
                tracing::info!(
                    ?kind,
                    "{}/{} is not served (CRD not installed); checking again every {}s",
                    ar.api_version,
                    ar.plural,
                    recheck.as_secs()
                );
                said_absent = true;
            }
            shared.with(|w| w.retain_only(kind, &BTreeSet::new()));
            tokio::time::sleep(recheck).await;
            continue;
        }
        said_absent = false;
        tracing::info!(?kind, "watching {}/{}", ar.api_version, ar.plural);
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
        let gone = run_dynamic(api, health.clone(), shared.clone(), apply).await;
        if let Gone::Ended = gone {
            return;
        }
    }
}

/// The watch of one custom resource as [`DynamicObject`]s, each decoded
/// into `K` by itself.
async fn run_dynamic<K>(
    api: Api<DynamicObject>,
    health: Arc<WatchHealth>,
    shared: Shared,
    apply: fn(&mut World, Result<&K, (&str, String)>),
) -> Gone
where
    K: DeserializeOwned,
{
    // `run_watch` needs a plain fn pointer per kind: keep the decoder in a
    // per-K static through a generic helper instead of a closure.
    fn decode_apply<K: DeserializeOwned>(
        w: &mut World,
        o: &DynamicObject,
        apply: fn(&mut World, Result<&K, (&str, String)>),
    ) {
        let name = dyn_key(o);
        match decode::<K>(o) {
            Ok(k) => apply(w, Ok(&k)),
            Err(e) => apply(w, Err((&name, e))),
        }
    }
    let kind = health.kind;
    let cfg = list_config();
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen: Option<BTreeSet<String>> = None;
    let mut log = FailureLog::default();
    let key = dyn_key;
    while let Some(ev) = stream.next().await {
        match ev {
            Ok(Event::Apply(o)) => shared.with(|w| decode_apply(w, &o, apply)),
            Ok(Event::Delete(o)) => {
                let k = key(&o);
                shared.with(|w| w.remove(kind, &k));
            }
            Ok(Event::Init) => seen = Some(BTreeSet::new()),
            Ok(Event::InitApply(o)) => {
                if let Some(s) = seen.as_mut() {
                    s.insert(key(&o));
                }
                shared.with(|w| decode_apply(w, &o, apply));
            }
            Ok(Event::InitDone) => {
                if let Some(s) = seen.take() {
                    shared.with(|w| w.retain_only(kind, &s));
                }
                health.listed();
            }
            Err(e) => {
                if log.failed(&e, &health) == Failure::NotServed {
                    return Gone::NotServed;
                }
                continue;
            }
        }
        shared.changed.notify_one();
    }
    Gone::Ended
}

/// The world's key of a custom object: `namespace/name`, or the name of a
/// cluster-scoped one.
fn dyn_key(o: &DynamicObject) -> String {
    match o.metadata.namespace {
        Some(_) => ns_key(o),
        None => name_key(o),
    }
}

/// Decodes one custom object; the error names the field at fault
/// (`spec.weight: invalid value: integer 4294967296, expected u32`).
pub fn decode<K: DeserializeOwned>(o: &DynamicObject) -> Result<K, String> {
    let v = serde_json::to_value(o).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path.is_empty() || path == "." {
            inner.to_string()
        } else {
            format!("{path}: {inner}")
        }
    })
}

/// Starts every watch ([`kinds`]); returns each one's health. Optional
/// kinds (CRDs that may not be installed) do not hold readiness back and
/// are watched only while served.
pub fn start(client: &Client, shared: &Shared, tasks: &mut Tasks) -> Vec<Arc<WatchHealth>> {
    kinds()
        .iter()
        .map(|k| k.start(client, shared, tasks))
        .collect()
}

/// How often an optional CRD that is not installed is looked for again.
pub const OPTIONAL_RECHECK: std::time::Duration = std::time::Duration::from_secs(30);

#[cfg(test)]
mod tests;

#[cfg(test)]
mod invalid_queue_tests;

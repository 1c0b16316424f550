//! Watches that feed the [`World`]: each object is translated as it
//! arrives and dropped (no object store is kept, so memory is what the core
//! needs, not what the API sends). A relist replaces the kind's objects.

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::world::{ObjectKind, World};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::Notify;

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

async fn run_watch<K>(
    api: Api<K>,
    kind: ObjectKind,
    shared: Shared,
    synced: Arc<AtomicBool>,
    key: fn(&K) -> String,
    apply: fn(&mut World, &K),
) where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let cfg = watcher::Config::default().any_semantic();
    let mut stream = watcher::watcher(api, cfg).default_backoff().boxed();
    let mut seen: Option<BTreeSet<String>> = None;
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
                    shared.with(|w| {
                        for k in w.keys(kind) {
                            if !s.contains(&k) {
                                w.remove(kind, &k);
                            }
                        }
                    });
                }
                if !synced.swap(true, Ordering::SeqCst) {
                    tracing::info!(?kind, "watch synced");
                }
            }
            Err(e) => {
                tracing::warn!(?kind, "watch: {e}");
                continue;
            }
        }
        shared.changed.notify_one();
    }
}

/// Starts every watch; returns one flag per watch that becomes true once its
/// first list is complete. `optional` kinds (CRDs that may not be installed)
/// do not hold readiness back.
pub fn start(
    client: &Client,
    shared: &Shared,
    tasks: &mut Tasks,
) -> Vec<(ObjectKind, Arc<AtomicBool>, bool)> {
    let mut flags = Vec::new();
    macro_rules! spawn {
        ($k:ty, $kind:expr, $api:expr, $key:expr, $apply:expr, $required:expr) => {{
            let f = Arc::new(AtomicBool::new(false));
            flags.push(($kind, f.clone(), $required));
            tasks.spawn(run_watch::<$k>(
                $api,
                $kind,
                shared.clone(),
                f,
                $key,
                $apply,
            ));
        }};
    }
    spawn!(
        Node,
        ObjectKind::Node,
        Api::all(client.clone()),
        name_key,
        |w, o| w.upsert_node(o),
        true
    );
    spawn!(
        Pod,
        ObjectKind::Pod,
        Api::all(client.clone()),
        uid_key,
        |w, o| w.upsert_pod(o),
        true
    );
    spawn!(
        PriorityClass,
        ObjectKind::PriorityClass,
        Api::all(client.clone()),
        name_key,
        |w, o| w.upsert_priority_class(o),
        true
    );
    spawn!(
        k8s_openapi::api::policy::v1::PodDisruptionBudget,
        ObjectKind::Pdb,
        Api::all(client.clone()),
        ns_key,
        |w, o| w.upsert_pdb(o),
        true
    );
    spawn!(
        Queue,
        ObjectKind::Queue,
        Api::all(client.clone()),
        name_key,
        |w, o| w.upsert_queue(o),
        false
    );
    spawn!(
        PodGroup,
        ObjectKind::PodGroup,
        Api::all(client.clone()),
        ns_key,
        |w, o| w.upsert_group(o),
        false
    );
    spawn!(
        SpPodGroup,
        ObjectKind::SpPodGroup,
        Api::all(client.clone()),
        ns_key,
        |w, o| w.upsert_sp_group(o),
        false
    );
    flags
}

/// Watches `batch/v1` Jobs labelled `gpusched.io/gang: "true"` and creates
/// a PodGroup for each (named after the Job, minMember = parallelism, owned
/// by the Job so it goes with it). Runs on the leader only: `leading`
/// gates the writes.
pub async fn run_job_gangs(client: Client, leading: tokio::sync::watch::Receiver<bool>) {
    use crate::translate::{ANNOTATION_FOR_JOB, LABEL_GANG, LABEL_QUEUE};
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::PostParams;
    let jobs: Api<Job> = Api::all(client.clone());
    let cfg = watcher::Config::default().labels(&format!("{LABEL_GANG}=true"));
    let mut stream = watcher::watcher(jobs, cfg).default_backoff().boxed();
    let mut done: BTreeSet<String> = BTreeSet::new();
    while let Some(ev) = stream.next().await {
        let job = match ev {
            Ok(Event::Apply(j)) | Ok(Event::InitApply(j)) => j,
            Ok(_) => continue,
            Err(e) => {
                tracing::warn!("watch jobs: {e}");
                continue;
            }
        };
        let (Some(ns), Some(name), Some(uid)) = (
            job.metadata.namespace.clone(),
            job.metadata.name.clone(),
            job.metadata.uid.clone(),
        ) else {
            continue;
        };
        if !*leading.borrow() || done.contains(&uid) {
            continue;
        }
        let min = job
            .spec
            .as_ref()
            .and_then(|s| s.parallelism)
            .unwrap_or(1)
            .max(1);
        let queue = job
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL_QUEUE))
            .cloned();
        let pg = serde_json::json!({
            "apiVersion": "gpusched.io/v1alpha1", "kind": "PodGroup",
            "metadata": {
                "name": name, "namespace": ns,
                "annotations": {ANNOTATION_FOR_JOB: name},
                "ownerReferences": [{"apiVersion": "batch/v1", "kind": "Job", "name": name,
                                     "uid": uid, "controller": true, "blockOwnerDeletion": true}]
            },
            "spec": {"minMember": min, "queue": queue},
        });
        let pg: PodGroup = match serde_json::from_value(pg) {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!("job {ns}/{name}: {e}");
                continue;
            }
        };
        let api: Api<PodGroup> = Api::namespaced(client.clone(), &ns);
        match api.create(&PostParams::default(), &pg).await {
            Ok(_) => {
                tracing::info!(
                    "created PodGroup {ns}/{name} (minMember {min}) for Job {ns}/{name}"
                );
                done.insert(uid);
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {
                done.insert(uid);
            }
            Err(e) => tracing::warn!("creating PodGroup for job {ns}/{name}: {e}"),
        }
    }
}

//! Every kind of object the scheduler reads, in one list ([`kinds`]): the
//! watches start from it ([`super::start`]), and the tools (`gpusched
//! doctor`, `gpusched snapshot capture`) list the same kinds and feed them
//! to a [`World`] through the same functions ([`Kind::read`]), so they see
//! what the scheduler sees (a DRA pod's claims, a PVC pod's volumes, a
//! JobSet's gang) and a captured snapshot replays as the scheduler decides.

use super::*;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::resource::v1::{DeviceClass, DeviceTaintRule, ResourceClaim, ResourceSlice};
use k8s_openapi::api::scheduling::v1beta1::PodGroup as UpstreamPodGroup;
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, CSIStorageCapacity, StorageClass};

type Start = dyn Fn(&Client, &Shared, &mut Tasks) -> Arc<WatchHealth> + Send + Sync;
type Read = dyn Fn(&mut World, &DynamicObject) -> Result<(), String> + Send + Sync;

/// One kind of object the scheduler reads.
pub struct Kind {
    /// What it is.
    pub kind: ObjectKind,
    /// Served by every API server the scheduler supports: readiness waits
    /// for its first list. Else optional (a CRD, an API a cluster may not
    /// serve): watched while served, and absent is no error.
    pub required: bool,
    /// Only the objects with this label selector (Jobs: those labelled
    /// `gpusched.io/gang`).
    pub selector: Option<&'static str>,
    /// Its group, version and plural.
    pub resource: ApiResource,
    start: Box<Start>,
    read: Box<Read>,
}

impl Kind {
    /// Starts its watch into `shared`'s world; its health.
    pub fn start(&self, client: &Client, shared: &Shared, tasks: &mut Tasks) -> Arc<WatchHealth> {
        (self.start)(client, shared, tasks)
    }

    /// One listed object into `w`, as its watch would apply it (an object
    /// that does not decode: `Err` naming it and the field, for a core
    /// kind; an optional kind's is kept as invalid, as the watch does).
    pub fn read(&self, w: &mut World, o: &DynamicObject) -> Result<(), String> {
        (self.read)(w, o)
    }

    /// Whether this kind's watch waits for the scheduler's readiness and
    /// lives through its process (core kinds), or comes and goes with its
    /// API (optional kinds).
    pub fn optional(&self) -> bool {
        !self.required
    }
}

/// A kind every API server serves, watched with a typed watcher.
fn core<K>(
    kind: ObjectKind,
    required: bool,
    selector: Option<&'static str>,
    key: fn(&K) -> String,
    apply: fn(&mut World, &K),
) -> Kind
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    Kind {
        kind,
        required,
        selector,
        resource: ApiResource::erase::<K>(&()),
        start: Box::new(move |client, shared, tasks| {
            let h = Arc::new(WatchHealth::new(kind, required));
            let api: Api<K> = Api::all(client.clone());
            let cfg = match selector {
                Some(s) => list_config().labels(s),
                None => list_config(),
            };
            tasks.spawn(run_watch::<K>(
                api,
                cfg,
                h.clone(),
                shared.clone(),
                key,
                apply,
            ));
            h
        }),
        read: Box::new(move |w, o| {
            let k: K = decode(o).map_err(|e| format!("{kind:?} {}: {e}", dyn_key(o)))?;
            apply(w, &k);
            Ok(())
        }),
    }
}

/// A kind a cluster may not serve (a CRD), watched while served, each
/// object decoded on its own (`apply` gets the one that does not decode
/// with its key and what is wrong).
fn optional<K>(kind: ObjectKind, apply: fn(&mut World, Result<&K, (&str, String)>)) -> Kind
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static,
{
    Kind {
        kind,
        required: false,
        selector: None,
        resource: ApiResource::erase::<K>(&()),
        start: Box::new(move |client, shared, tasks| {
            let h = Arc::new(WatchHealth::new(kind, false));
            tasks.spawn(run_optional::<K>(
                client.clone(),
                h.clone(),
                shared.clone(),
                apply,
                OPTIONAL_RECHECK,
            ));
            h
        }),
        read: Box::new(move |w, o| {
            let name = dyn_key(o);
            match decode::<K>(o) {
                Ok(k) => apply(w, Ok(&k)),
                Err(e) => apply(w, Err((&name, e))),
            }
            Ok(())
        }),
    }
}

/// Every kind the scheduler reads, in the order its watches start.
pub fn kinds() -> Vec<Kind> {
    use crate::workloads::{self, JobSet, LeaderWorkerSet, WorkloadKind};
    let mut out = vec![
        core::<Node>(ObjectKind::Node, true, None, name_key, |w, o| {
            w.upsert_node(o)
        }),
        core::<Pod>(ObjectKind::Pod, true, None, uid_key, |w, o| w.upsert_pod(o)),
        core::<PriorityClass>(ObjectKind::PriorityClass, true, None, name_key, |w, o| {
            w.upsert_priority_class(o)
        }),
        core::<PodDisruptionBudget>(ObjectKind::Pdb, true, None, ns_key, |w, o| w.upsert_pdb(o)),
        core::<Namespace>(ObjectKind::Namespace, true, None, name_key, |w, o| {
            w.upsert_namespace(o)
        }),
        core::<PersistentVolumeClaim>(ObjectKind::Pvc, true, None, ns_key, |w, o| w.upsert_pvc(o)),
        core::<PersistentVolume>(ObjectKind::Pv, true, None, name_key, |w, o| w.upsert_pv(o)),
        core::<StorageClass>(ObjectKind::StorageClass, true, None, name_key, |w, o| {
            w.upsert_storage_class(o)
        }),
        core::<CSINode>(ObjectKind::CsiNode, true, None, name_key, |w, o| {
            w.upsert_csi_node(o)
        }),
        core::<CSIDriver>(ObjectKind::CsiDriver, true, None, name_key, |w, o| {
            w.upsert_csi_driver(o)
        }),
        core::<CSIStorageCapacity>(
            ObjectKind::CsiStorageCapacity,
            true,
            None,
            ns_key,
            |w, o| w.upsert_storage_capacity(o),
        ),
        // Jobs labelled gpusched.io/gang (any value): a value that is not
        // a flag keeps the Job's pods waiting (the leader's run_job_gangs
        // makes the PodGroups of the "true" ones)
        core::<Job>(
            ObjectKind::Job,
            false,
            Some(crate::translate::LABEL_GANG),
            ns_key,
            |w, o| w.upsert_gang_job(o),
        ),
        optional::<Queue>(ObjectKind::Queue, |w, r| match r {
            Ok(q) => w.upsert_queue(q),
            Err((name, e)) => w.invalid_queue(name, e),
        }),
        optional::<PodGroup>(ObjectKind::PodGroup, |w, r| match r {
            Ok(g) => w.upsert_group(g),
            Err((key, e)) => w.invalid_group(key, e),
        }),
        optional::<SpPodGroup>(ObjectKind::SpPodGroup, |w, r| match r {
            Ok(g) => w.upsert_sp_group(g),
            Err((key, e)) => w.invalid_sp_group(key, e),
        }),
        // DRA (resource.k8s.io/v1): watched while served, so a cluster
        // without it (before 1.34) still works
        optional::<ResourceClaim>(ObjectKind::ResourceClaim, |w, r| match r {
            Ok(c) => w.upsert_claim(c),
            Err((key, e)) => tracing::warn!("ResourceClaim {key}: {e}"),
        }),
        optional::<ResourceSlice>(ObjectKind::ResourceSlice, |w, r| match r {
            Ok(s) => w.upsert_slice(s),
            Err((key, e)) => tracing::warn!("ResourceSlice {key}: {e}"),
        }),
        optional::<DeviceClass>(ObjectKind::DeviceClass, |w, r| match r {
            Ok(c) => w.upsert_device_class(c),
            Err((key, e)) => tracing::warn!("DeviceClass {key}: {e}"),
        }),
        // device taints set by admins on devices of any driver (GA in 1.37)
        optional::<DeviceTaintRule>(ObjectKind::DeviceTaintRule, |w, r| match r {
            Ok(t) => w.upsert_device_taint_rule(t),
            Err((key, e)) => tracing::warn!("DeviceTaintRule {key}: {e}"),
        }),
        optional::<JobSet>(ObjectKind::JobSet, |w, r| match r {
            Ok(j) => w.upsert_workload(WorkloadKind::JobSet, &ns_key(j), workloads::jobset(j)),
            Err((key, e)) => {
                w.upsert_workload(WorkloadKind::JobSet, key, Err(format!("jobset {key}: {e}")))
            }
        }),
        optional::<workloads::RayCluster>(ObjectKind::RayCluster, |w, r| match r {
            Ok(c) => w.upsert_workload(
                WorkloadKind::RayCluster,
                &ns_key(c),
                workloads::ray_cluster(c),
            ),
            Err((key, e)) => w.upsert_workload(
                WorkloadKind::RayCluster,
                key,
                Err(format!("raycluster {key}: {e}")),
            ),
        }),
    ];
    macro_rules! kubeflow {
        ($k:ty, $okind:expr, $wkind:expr, $what:literal) => {
            out.push(optional::<$k>($okind, |w, r| match r {
                Ok(j) => w.upsert_workload(
                    $wkind,
                    &ns_key(j),
                    workloads::kubeflow_job($wkind, &j.metadata, &j.spec),
                ),
                Err((key, e)) => {
                    w.upsert_workload($wkind, key, Err(format!("{} {key}: {e}", $what)))
                }
            }))
        };
    }
    kubeflow!(
        workloads::PyTorchJob,
        ObjectKind::PyTorchJob,
        WorkloadKind::PyTorchJob,
        "pytorchjob"
    );
    kubeflow!(
        workloads::TfJob,
        ObjectKind::TfJob,
        WorkloadKind::TfJob,
        "tfjob"
    );
    kubeflow!(
        workloads::MpiJob,
        ObjectKind::MpiJob,
        WorkloadKind::MpiJob,
        "mpijob"
    );
    kubeflow!(
        workloads::MpiJobV1,
        ObjectKind::MpiJobV1,
        WorkloadKind::MpiJobV1,
        "mpijob"
    );
    out.push(optional::<UpstreamPodGroup>(
        ObjectKind::UpstreamPodGroup,
        |w, r| match r {
            Ok(g) => w.upsert_workload(
                WorkloadKind::PodGroup,
                &ns_key(g),
                workloads::upstream_pod_group(g),
            ),
            Err((key, e)) => w.upsert_workload(
                WorkloadKind::PodGroup,
                key,
                Err(format!("podgroup.scheduling.k8s.io {key}: {e}")),
            ),
        },
    ));
    out.push(optional::<LeaderWorkerSet>(
        ObjectKind::LeaderWorkerSet,
        |w, r| match r {
            Ok(l) => w.upsert_workload(
                WorkloadKind::LeaderWorkerSet,
                &ns_key(l),
                workloads::leader_worker_set(l),
            ),
            Err((key, e)) => w.upsert_workload(
                WorkloadKind::LeaderWorkerSet,
                key,
                Err(format!("leaderworkerset {key}: {e}")),
            ),
        },
    ));
    out
}

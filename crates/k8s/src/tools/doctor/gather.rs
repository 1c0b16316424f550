//! Reads what `doctor` and `snapshot capture` need from the API server,
//! once: every kind the scheduler watches ([`crate::watch::kinds`], the
//! one list), read into a [`World`] through the watches' own functions.

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::watch::{self, Kind};
use crate::world::{ObjectKind, World};
use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::{DynamicObject, ListParams};
use kube::{Api, Client};
use serde::de::DeserializeOwned;

/// The cluster's objects at one moment (plain API objects, so checks run on
/// fixtures as well as on a live cluster).
#[derive(Clone, Debug, Default)]
pub struct Facts {
    /// Nodes.
    pub nodes: Vec<Node>,
    /// Pods of every namespace.
    pub pods: Vec<Pod>,
    /// gpusched Queues (empty when the CRD is not installed).
    pub queues: Vec<Queue>,
    /// gpusched PodGroups.
    pub groups: Vec<PodGroup>,
    /// scheduler-plugins PodGroups.
    pub sp_groups: Vec<SpPodGroup>,
    /// PriorityClasses.
    pub priority_classes: Vec<PriorityClass>,
    /// PodDisruptionBudgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// The objects of every other kind the scheduler reads (and those of
    /// the kinds above that do not decode, which the scheduler keeps as
    /// invalid), by kind, as listed: claims, volumes, storage, DRA,
    /// workloads, gang Jobs.
    pub more: Vec<(ObjectKind, Vec<DynamicObject>)>,
    /// What could not be read (a kind the credentials may not list, an
    /// object that does not decode): the report says what it leaves out.
    pub unread: Vec<String>,
    /// When it was read (ms since the Unix epoch): the cycle's `now`.
    pub now_ms: u64,
}

impl Facts {
    /// The scheduler's world of these objects (what the watches would have
    /// built).
    pub fn world(&self) -> World {
        let mut w = World::default();
        for n in &self.nodes {
            w.upsert_node(n);
        }
        for pc in &self.priority_classes {
            w.upsert_priority_class(pc);
        }
        for q in &self.queues {
            w.upsert_queue(q);
        }
        for g in &self.groups {
            w.upsert_group(g);
        }
        for g in &self.sp_groups {
            w.upsert_sp_group(g);
        }
        for p in &self.pdbs {
            w.upsert_pdb(p);
        }
        let kinds = watch::kinds();
        for (kind, objects) in &self.more {
            let Some(k) = kinds.iter().find(|k| k.kind == *kind) else {
                continue;
            };
            for o in objects {
                if let Err(e) = k.read(&mut w, o) {
                    tracing::warn!("{e}");
                }
            }
        }
        for p in &self.pods {
            w.upsert_pod(p);
        }
        w
    }
}

/// Lists one kind as the watch would (its label selector); `None`: not
/// served or not permitted, said in `unread` (an optional kind that is
/// not served is no news).
async fn list(
    client: &Client,
    k: &Kind,
    unread: &mut Vec<String>,
) -> anyhow::Result<Option<Vec<DynamicObject>>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &k.resource);
    let mut lp = ListParams::default();
    if let Some(s) = k.selector {
        lp = lp.labels(s);
    }
    let what = format!("{}.{}", k.resource.plural, k.resource.group);
    let what = what.trim_end_matches('.');
    match api.list(&lp).await {
        Ok(l) => Ok(Some(l.items)),
        // a CRD that is not installed, an API this cluster does not serve
        Err(kube::Error::Api(s)) if k.optional() && s.code == 404 => Ok(None),
        // the scheduler's own inputs: without them nothing can be said
        Err(e) if matches!(k.kind, ObjectKind::Node | ObjectKind::Pod) => {
            Err(e).with_context(|| format!("listing {what}"))
        }
        Err(e) => {
            unread.push(format!("{what}: {e}"));
            Ok(None)
        }
    }
}

/// Decodes `objects` into `into`; those that do not decode go to `bad`.
fn typed<K: DeserializeOwned>(
    objects: Vec<DynamicObject>,
    into: &mut Vec<K>,
    bad: &mut Vec<DynamicObject>,
) {
    for o in objects {
        match watch::decode::<K>(&o) {
            Ok(k) => into.push(k),
            Err(_) => bad.push(o),
        }
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Lists everything the scheduler watches ([`watch::kinds`]).
pub async fn gather(client: &Client) -> anyhow::Result<Facts> {
    let mut f = Facts::default();
    for k in watch::kinds() {
        let Some(objects) = list(client, &k, &mut f.unread).await? else {
            continue;
        };
        let mut bad = Vec::new();
        match k.kind {
            ObjectKind::Node => typed(objects, &mut f.nodes, &mut bad),
            ObjectKind::Pod => typed(objects, &mut f.pods, &mut bad),
            ObjectKind::Queue => typed(objects, &mut f.queues, &mut bad),
            ObjectKind::PodGroup => typed(objects, &mut f.groups, &mut bad),
            ObjectKind::SpPodGroup => typed(objects, &mut f.sp_groups, &mut bad),
            ObjectKind::PriorityClass => typed(objects, &mut f.priority_classes, &mut bad),
            ObjectKind::Pdb => typed(objects, &mut f.pdbs, &mut bad),
            _ => bad = objects,
        }
        if !bad.is_empty() {
            f.more.push((k.kind, bad));
        }
    }
    f.now_ms = now_ms();
    Ok(f)
}

//! Reads what `doctor` and `snapshot capture` need from the API server, once.

use crate::crd::{PodGroup, Queue, SpPodGroup};
use crate::world::World;
use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::api::ListParams;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use std::fmt::Debug;

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
        for p in &self.pods {
            w.upsert_pod(p);
        }
        w
    }
}

async fn list<K>(client: &Client, optional: bool) -> anyhow::Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
{
    let api: Api<K> = Api::all(client.clone());
    match api.list(&ListParams::default()).await {
        Ok(l) => Ok(l.items),
        // a CRD that is not installed
        Err(kube::Error::Api(s)) if optional && s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e).with_context(|| format!("listing {}", K::plural(&()))),
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Lists everything the scheduler watches.
pub async fn gather(client: &Client) -> anyhow::Result<Facts> {
    Ok(Facts {
        nodes: list(client, false).await?,
        pods: list(client, false).await?,
        queues: list(client, true).await?,
        groups: list(client, true).await?,
        sp_groups: list(client, true).await?,
        priority_classes: list(client, false).await?,
        pdbs: list(client, false).await?,
        now_ms: now_ms(),
    })
}

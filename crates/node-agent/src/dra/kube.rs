//! The DRA mode's API server side: claims read by namespace and name, and
//! this node's ResourceSlice kept published.
//!
//! The slice is checked on every health change, when the kubelet registers
//! the plugin, and every `resync` (the kubelet deletes a node's slices when
//! it starts and some time after a driver goes away, so a slice can vanish
//! under a running agent). The pool generation goes up whenever the
//! published devices change; a slice that is already what it should be is
//! left alone.

use super::prepare::ClaimSource;
use super::slice;
use crate::agent::Agent;
use crate::coord::BoxFuture;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{
    CounterSet, Device, ResourceClaim, ResourceSlice, ResourceSliceSpec,
};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Field manager of the slice apply.
pub const FIELD_MANAGER: &str = "gpusched-agent";

/// First wait after a failed slice write; it doubles with each failure in a
/// row, up to the resync period.
const RETRY_FIRST: Duration = Duration::from_millis(200);

/// Claims from the API server.
pub struct KubeClaims {
    client: Client,
}

impl KubeClaims {
    /// Claims read through `client`.
    pub fn new(client: Client) -> Self {
        KubeClaims { client }
    }
}

impl ClaimSource for KubeClaims {
    fn get<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceClaim>, String>> {
        Box::pin(async move {
            Api::<ResourceClaim>::namespaced(self.client.clone(), namespace)
                .get_opt(name)
                .await
                .map_err(|e| e.to_string())
        })
    }
}

/// Where the node's slices live (a fake in tests), by object name.
pub trait SliceStore: Send + Sync + 'static {
    /// The published slice's spec, `None` when there is none.
    fn get<'a>(&'a self, name: &'a str)
    -> BoxFuture<'a, Result<Option<ResourceSliceSpec>, String>>;
    /// Creates or replaces the slice.
    fn apply<'a>(
        &'a self,
        name: &'a str,
        spec: ResourceSliceSpec,
    ) -> BoxFuture<'a, Result<(), String>>;
}

/// This node's slice on the API server, owned by its Node (so it goes with
/// the Node), written with server-side apply.
pub struct KubeSlices {
    client: Client,
    node: String,
    node_uid: tokio::sync::Mutex<Option<String>>,
}

impl KubeSlices {
    /// The ResourceSlices of `node`, written through `client`.
    pub fn new(client: Client, node: &str) -> Self {
        KubeSlices {
            client,
            node: node.to_string(),
            node_uid: tokio::sync::Mutex::new(None),
        }
    }

    async fn node_uid(&self) -> Option<String> {
        let mut uid = self.node_uid.lock().await;
        if uid.is_none() {
            match Api::<Node>::all(self.client.clone()).get(&self.node).await {
                Ok(n) => *uid = n.metadata.uid,
                Err(e) => {
                    tracing::warn!(node = %self.node, "cannot read the Node for the slice's owner: {e}")
                }
            }
        }
        uid.clone()
    }
}

impl SliceStore for KubeSlices {
    fn get<'a>(
        &'a self,
        name: &'a str,
    ) -> BoxFuture<'a, Result<Option<ResourceSliceSpec>, String>> {
        Box::pin(async move {
            let Some(s) = Api::<ResourceSlice>::all(self.client.clone())
                .get_opt(name)
                .await
                .map_err(|e| format!("get ResourceSlice {name}: {e}"))?
            else {
                return Ok(None);
            };
            // Published before the Node existed (no owner): once the Node
            // is there, the slice counts as not published, so it is
            // written again with its owner.
            let owned = s
                .metadata
                .owner_references
                .iter()
                .flatten()
                .any(|o| o.kind == "Node" && o.name == self.node);
            if !owned && self.node_uid().await.is_some() {
                return Ok(None);
            }
            Ok(Some(s.spec))
        })
    }

    fn apply<'a>(
        &'a self,
        name: &'a str,
        spec: ResourceSliceSpec,
    ) -> BoxFuture<'a, Result<(), String>> {
        Box::pin(async move {
            let mut meta = json!({"name": name});
            if let Some(uid) = self.node_uid().await {
                meta["ownerReferences"] = json!([{
                    "apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid,
                    "controller": true,
                }]);
            }
            let obj = json!({
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": meta,
                "spec": spec,
            });
            Api::<ResourceSlice>::all(self.client.clone())
                .patch(
                    name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&obj),
                )
                .await
                .map(|_| ())
                .map_err(|e| format!("apply ResourceSlice {name}: {e}"))
        })
    }
}

/// Devices compared without what the API server fills in (taint times).
fn normalized(devs: &[Device]) -> Vec<Device> {
    devs.iter()
        .cloned()
        .map(|mut d| {
            for t in d.taints.iter_mut().flatten() {
                t.time_added = None;
            }
            if d.taints.as_ref().is_some_and(|t| t.is_empty()) {
                d.taints = None;
            }
            d
        })
        .collect()
}

/// Keeps one node's slice what it should be.
pub struct Publisher {
    node: String,
    generation: i64,
}

impl Publisher {
    /// A publisher of `node`'s slices that has published nothing yet.
    pub fn new(node: &str) -> Self {
        Publisher {
            node: node.to_string(),
            generation: 0,
        }
    }

    /// The generation last published (0: none yet).
    pub fn generation(&self) -> i64 {
        self.generation
    }

    /// Publishes `devices` (and the `counters` slice, when there are
    /// counter sets) unless the slices already show them; returns whether
    /// it wrote. All slices of the pool are written with one new generation.
    pub async fn sync(
        &mut self,
        devices: Vec<Device>,
        counters: Vec<CounterSet>,
        store: &dyn SliceStore,
    ) -> Result<bool, String> {
        let want = slice::pool_specs(&self.node, devices, counters, 0);
        let mut same = true;
        let mut newest = self.generation;
        for (name, spec) in &want {
            let cur = store.get(name).await?;
            match &cur {
                Some(cur) => {
                    newest = newest.max(cur.pool.generation);
                    same &= cur.driver == gpusched_model::dra::DRIVER
                        && cur.pool.name == self.node
                        && cur.node_name.as_deref() == Some(self.node.as_str())
                        && cur.pool.resource_slice_count == spec.pool.resource_slice_count
                        && normalized(cur.devices.as_deref().unwrap_or(&[]))
                            == normalized(spec.devices.as_deref().unwrap_or(&[]))
                        && cur.shared_counters == spec.shared_counters
                        && cur.pool.generation >= self.generation;
                }
                None => same = false,
            }
        }
        if same {
            self.generation = newest;
            return Ok(false);
        }
        self.generation = newest;
        let next = self.generation + 1;
        // Counters before devices: a device is never seen consuming a set
        // that is not published.
        for (name, mut spec) in want.into_iter().rev() {
            spec.pool.generation = next;
            store.apply(&name, spec).await?;
        }
        self.generation = next;
        Ok(true)
    }
}

/// Publishes the slice of `agent`'s node until `stop` fires: at start, on
/// every health change and registration, and every `resync`.
pub async fn publish_loop(
    agent: Arc<Agent>,
    node: String,
    store: Arc<dyn SliceStore>,
    resync: Duration,
    mut registered: watch::Receiver<Option<bool>>,
    mut stop: watch::Receiver<bool>,
) {
    let mut p = Publisher::new(&node);
    let mut health = agent.health_gen.subscribe();
    let mut failures = 0u32;
    loop {
        let opts = slice::SliceOptions {
            shares: agent.settings.shares,
        };
        let devices = slice::devices(&agent.inventory, &agent.gpu_conditions(), opts);
        let counters = slice::counter_sets(&agent.inventory);
        let wait = match p.sync(devices, counters, store.as_ref()).await {
            Ok(wrote) => {
                if wrote {
                    tracing::info!(node = %node, generation = p.generation(), "published the ResourceSlice");
                }
                failures = 0;
                resync
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(node = %node, "ResourceSlice: {e}");
                // Retry soon, backing off to the resync period.
                resync.min(RETRY_FIRST * 2u32.saturating_pow(failures.min(8)))
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            r = health.changed() => if r.is_err() { return },
            r = registered.changed() => if r.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

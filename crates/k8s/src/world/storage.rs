//! Namespaces and storage: the namespaces' labels pods select, and the
//! claims, volumes, storage classes and CSI objects of [`Volumes`] with
//! the scheduler's volume reservations.

use super::*;

impl World {
    /// A Namespace was added or changed.
    pub fn upsert_namespace(&mut self, n: &k8s_openapi::api::core::v1::Namespace) {
        let name = n.metadata.name.clone().unwrap_or_default();
        let labels = n.metadata.labels.clone().unwrap_or_default();
        if self.namespaces.get(&name) != Some(&labels) {
            self.namespaces.insert(name, labels);
            self.cache.dirty.namespaces = true;
            self.generation += 1;
        }
    }

    /// Fills in the namespaces each of `pod`'s affinity terms'
    /// `namespaceSelector` selects, from the Namespaces watched (as
    /// kube-scheduler resolves them when it evaluates the pod).
    pub(super) fn select_namespaces(&self, pod: &mut gpusched_model::Pod) {
        if !pod
            .constraints
            .as_deref()
            .is_some_and(|c| c.has_namespace_selectors())
        {
            return;
        }
        for t in pod.constraints_mut().terms_mut() {
            if let Some(sel) = &t.namespace_selector {
                t.selected_namespaces = self
                    .namespaces
                    .iter()
                    .filter(|(_, labels)| sel.matches(labels))
                    .map(|(name, _)| name.clone())
                    .collect();
            }
        }
    }

    /// A PersistentVolumeClaim was added or changed.
    pub fn upsert_pvc(&mut self, c: &PersistentVolumeClaim) {
        let k = key(c.metadata.namespace.as_ref(), c.metadata.name.as_ref());
        self.volumes.claims.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A PersistentVolume was added or changed.
    pub fn upsert_pv(&mut self, v: &PersistentVolume) {
        let k = v.metadata.name.clone().unwrap_or_default();
        self.volumes.volumes.insert(k, v.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A StorageClass was added or changed.
    pub fn upsert_storage_class(&mut self, c: &StorageClass) {
        let k = c.metadata.name.clone().unwrap_or_default();
        self.volumes.classes.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A CSINode was added or changed (attach limits).
    pub fn upsert_csi_node(&mut self, c: &k8s_openapi::api::storage::v1::CSINode) {
        let k = c.metadata.name.clone().unwrap_or_default();
        // the node's limits, and every pod's CSI volumes when the first
        // limit appears or the last goes
        self.cache.dirty.nodes.insert(k.clone());
        self.cache.dirty.volumes = true;
        self.volumes.csi_nodes.insert(k, c.clone());
        self.generation += 1;
    }

    /// A CSIDriver was added or changed (storage capacity tracking).
    pub fn upsert_csi_driver(&mut self, d: &k8s_openapi::api::storage::v1::CSIDriver) {
        let k = d.metadata.name.clone().unwrap_or_default();
        self.volumes.csi_drivers.insert(k, d.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// A CSIStorageCapacity was added or changed.
    pub fn upsert_storage_capacity(
        &mut self,
        c: &k8s_openapi::api::storage::v1::CSIStorageCapacity,
    ) {
        let k = key(c.metadata.namespace.as_ref(), c.metadata.name.as_ref());
        self.volumes.capacities.insert(k, c.clone());
        self.cache.dirty.volumes = true;
        self.generation += 1;
    }

    /// Decides the delayed claims of pod `uid`, just placed on `node`, as
    /// the core did ([`gpusched_model::pick_volumes`] over the same
    /// objects), reserves what they get until the pod is bound or
    /// forgotten, and returns the writes that bind them. `Err`: they no
    /// longer fit there (the pod should be forgotten and retried).
    pub fn reserve_volumes(&mut self, uid: &str, node: &str) -> Result<Vec<VolumeWrite>, String> {
        let (Some(claims), Some(v), Some(nv)) = (
            self.pod_claims.get(uid),
            self.pods.get(uid),
            self.nodes.get(node),
        ) else {
            return Ok(Vec::new());
        };
        let (needs, _) = crate::volumes::resolve(&self.volumes, &v.namespace, uid, claims);
        let picks =
            gpusched_model::pick_volumes(&needs, &nv.node, |_, _| true).map_err(|e| e.reason())?;
        let writes = crate::volumes::writes(&self.volumes, &picks, node);
        for (claim, pick) in picks {
            self.cache.dirty.volumes = true;
            self.volumes.reserved.insert(
                claim.to_string(),
                Reservation {
                    pick,
                    node: node.to_string(),
                    uid: uid.to_string(),
                },
            );
        }
        if !writes.is_empty() {
            self.generation += 1;
        }
        Ok(writes)
    }

    /// Drops the volume reservations made for pod `uid`.
    pub fn release_volumes(&mut self, uid: &str) {
        let before = self.volumes.reserved.len();
        self.volumes.reserved.retain(|_, r| r.uid != uid);
        if self.volumes.reserved.len() != before {
            self.cache.dirty.volumes = true;
            self.generation += 1;
        }
    }

    /// Whether claim `namespace/name` is bound to a volume (as last seen).
    pub fn claim_bound(&self, claim: &str) -> bool {
        self.volumes
            .claims
            .get(claim)
            .is_some_and(crate::volumes::claim_bound)
    }
}

//! DRA: ResourceClaims, ResourceSlices, DeviceClasses and DeviceTaintRules
//! kept in [`crate::dra::state::DraState`], and the claims and extended
//! resources allocated for a pod.

use super::*;

impl World {
    /// A ResourceClaim was added or changed.
    pub fn upsert_claim(&mut self, c: &k8s_openapi::api::resource::v1::ResourceClaim) {
        self.dra.upsert_claim(c);
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A ResourceSlice was added or changed.
    pub fn upsert_slice(&mut self, s: &k8s_openapi::api::resource::v1::ResourceSlice) {
        // its GPUs are its node's GPUs in the core (before and after)
        let name = s.metadata.name.clone().unwrap_or_default();
        self.cache.dirty.nodes.extend(self.dra.slice_node(&name));
        self.dra.upsert_slice(s);
        self.cache.dirty.nodes.extend(self.dra.slice_node(&name));
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A DeviceClass was added or changed.
    pub fn upsert_device_class(&mut self, c: &k8s_openapi::api::resource::v1::DeviceClass) {
        if self.dra.upsert_class(c) {
            // a class mapping nvidia.com/gpu: its driver's devices are
            // their nodes' GPUs now (or no longer)
            self.cache.dirty.nodes.extend(self.dra.slice_nodes());
        }
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// A DeviceTaintRule was added or changed.
    pub fn upsert_device_taint_rule(
        &mut self,
        r: &k8s_openapi::api::resource::v1::DeviceTaintRule,
    ) {
        self.dra.upsert_taint_rule(r);
        self.cache.dirty.nodes.extend(self.dra.slice_nodes());
        self.cache.dirty.dra = true;
        self.generation += 1;
    }

    /// The DRA objects.
    pub fn dra(&self) -> &crate::dra::state::DraState {
        &self.dra
    }

    /// Allocates the ResourceClaims of pending pod `uid` on `node` (where
    /// the core placed it), holding the devices until the claims show the
    /// allocation or [`World::forget`] drops it: what to write to each
    /// claim before the Binding (empty: the pod has no claims).
    pub fn allocate_claims(
        &mut self,
        uid: &str,
        node: &str,
    ) -> Result<Vec<crate::dra::state::ClaimWrite>, String> {
        self.allocate_claims_at(uid, node, &[])
    }

    /// [`World::allocate_claims`], giving the claims the GPUs the core
    /// chose (positions on the node) when they allow them
    /// ([`crate::dra::state::DraState::allocate`]).
    pub fn allocate_claims_at(
        &mut self,
        uid: &str,
        node: &str,
        core_gpus: &[u32],
    ) -> Result<Vec<crate::dra::state::ClaimWrite>, String> {
        let Some(v) = self.pods.get(uid) else {
            return Ok(Vec::new());
        };
        // KEP-5004: extended resources a DeviceClass maps and the node does
        // not serve itself get a special claim, unless it has one
        let special = self.extended_requests(uid, node)?;
        if v.claims.is_empty() && special.is_empty() {
            return Ok(Vec::new());
        }
        let (ns, claims) = (v.namespace.clone(), v.claims.clone());
        let mut r = if claims.is_empty() {
            Ok(Vec::new())
        } else {
            self.dra.allocate(uid, &ns, &claims, node, core_gpus)
        };
        if !special.is_empty()
            && let Ok(writes) = &mut r
        {
            match self
                .dra
                .allocate_extended(uid, &ns, &special, node, core_gpus)
            {
                Ok(w) => writes.push(w),
                Err(e) => {
                    self.dra.forget_pod(uid);
                    r = Err(e);
                }
            }
        }
        self.cache.dirty.dra = true;
        self.generation += 1;
        r
    }

    /// KEP-5004: the special claim's requests pod `uid` needs on `node`:
    /// the extended resources a DeviceClass maps that `node`'s allocatable
    /// lacks (empty: none, or its special claim exists already).
    pub fn extended_requests(
        &self,
        uid: &str,
        node: &str,
    ) -> Result<Vec<crate::dra::extended::ExtendedRequest>, String> {
        let Some(v) = self.pods.get(uid) else {
            return Ok(Vec::new());
        };
        if v.extended.is_empty() || self.dra.has_special_claim(&v.namespace, &v.claims) {
            return Ok(Vec::new());
        }
        let mapping = self.dra.class_mapping();
        if !crate::dra::extended::asks_mapped(&v.extended, &mapping) {
            return Ok(Vec::new());
        }
        let nv = self.nodes.get(node);
        let served = |name: &str| {
            nv.is_some_and(
                |nv| match gpusched_model::ResourceKind::from_resource_name(name) {
                    gpusched_model::ResourceKind::Gpu => {
                        !nv.node.gpus.is_empty() || nv.node.allocatable.gpu_milli > 0
                    }
                    gpusched_model::ResourceKind::Extended(n) => {
                        nv.node.allocatable.ext_get(&n) > 0
                    }
                    _ => true,
                },
            )
        };
        crate::dra::extended::requests(&v.extended, &mapping, served)
            .map_err(|e| format!("pod {}/{}: {e}", v.namespace, v.name))
    }
}

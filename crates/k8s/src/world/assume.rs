//! Placements in flight: assumed bindings, evictions, nominations, and the
//! nodes reserved for gangs whose ProvisioningRequest is provisioned.

use super::*;

impl World {
    /// Remembers a placement being bound: it counts as held until the API
    /// confirms or refuses it.
    pub fn assume(&mut self, uid: &str, a: Assumed) {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.cache.dirty.pods.insert(uid.to_string());
        self.assumed_at.insert(uid.to_string(), now);
        self.assumed.insert(uid.to_string(), a);
        self.generation += 1;
    }

    /// Remembers an eviction being carried out: the pod counts as
    /// terminating (still holding, never a victim again) until the API shows
    /// it terminating or gone.
    pub fn assume_evicted(&mut self, uid: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        self.evicting.insert(uid.to_string());
        self.generation += 1;
    }

    /// The eviction failed: the pod runs on.
    pub fn forget_eviction(&mut self, uid: &str) {
        if self.evicting.remove(uid) {
            self.cache.dirty.pods.insert(uid.to_string());
            self.generation += 1;
        }
    }

    /// Remembers a nomination until the pod's status shows it (or the pod
    /// stops pending), so the next cycle sees it at once.
    pub fn nominate(&mut self, uid: &str, node: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        self.note_nominated(uid, node);
        self.nominated.insert(uid.to_string(), node.to_string());
    }

    /// Reserves for `gang`, whose ProvisioningRequest (made at `since_ms`)
    /// is provisioned, the `nodes` that came for it, and from now on every
    /// node that registers ([`crate::provreq::Reservations`]): its pending
    /// `members` (uids) are nominated to them. Returns whether anything
    /// changed.
    pub fn reserve_provisioned(
        &mut self,
        gang: &str,
        since_ms: u64,
        members: Vec<String>,
        nodes: &[String],
    ) -> bool {
        let noms = self.provisioned.reserve(gang, since_ms, members, nodes);
        let changed = !noms.is_empty();
        for (uid, node) in noms {
            self.cache.dirty.pods.insert(uid.clone());
            self.note_nominated(&uid, &node);
            self.nominated.insert(uid, node);
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Ends the reservations of gangs not in `keep` (their nominations
    /// go). Returns whether anything changed.
    pub fn retain_provisioned(&mut self, keep: &BTreeSet<String>) -> bool {
        let uids = self.provisioned.retain(keep);
        let changed = !uids.is_empty();
        for uid in uids {
            self.nominated.remove(&uid);
            self.nominated_at.remove(&uid);
            self.cache.dirty.pods.insert(uid);
        }
        if changed {
            self.generation += 1;
        }
        changed
    }

    /// Replaces the notes of gangs waiting for a ProvisioningRequest.
    /// Returns whether they changed.
    pub fn set_provisioning_notes(&mut self, notes: BTreeMap<String, String>) -> bool {
        if self.provisioning_notes == notes {
            return false;
        }
        self.provisioning_notes = notes;
        self.generation += 1;
        true
    }

    /// The notes of gangs waiting for a ProvisioningRequest, by group name.
    pub fn provisioning_notes(&self) -> &BTreeMap<String, String> {
        &self.provisioning_notes
    }

    /// Drops an assumption (the binding failed): the pod is pending again.
    pub fn forget(&mut self, uid: &str) {
        self.release_holds(uid);
        self.assumed_at.remove(uid);
        if self.assumed.remove(uid).is_some() {
            self.generation += 1;
        }
    }

    /// What the scheduler holds for pod `uid` in memory — its volume
    /// reservations and tentative claim allocations — is let go, and the
    /// pod (and, when it has claims, every pod reading DRA) is recomputed
    /// by the next snapshot: the common part of [`World::forget`] and
    /// [`World::delete_pod`].
    pub(super) fn release_holds(&mut self, uid: &str) {
        self.cache.dirty.pods.insert(uid.to_string());
        if self
            .pods
            .get(uid)
            .is_some_and(|v| !v.claims.is_empty() || !v.extended.is_empty())
        {
            self.cache.dirty.dra = true;
        }
        self.release_volumes(uid);
        self.dra.forget_pod(uid);
    }
}

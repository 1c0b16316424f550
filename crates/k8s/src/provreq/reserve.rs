//! The nodes a provisioned request brought ([`new_nodes`]) and their
//! reservation for the gang ([`Reservations`], nominations).

use super::*;

/// Nodes that came for a request made at `since_ms`: created since (the
/// API's times have whole seconds, so from the start of that second),
/// Ready, by name.
pub fn new_nodes(nodes: &[Node], since_ms: u64) -> Vec<String> {
    let from = since_ms - since_ms % 1000;
    let mut out: Vec<String> = nodes
        .iter()
        .filter(|n| {
            n.metadata
                .creation_timestamp
                .as_ref()
                .and_then(|t| u64::try_from(t.0.as_millisecond()).ok())
                .is_some_and(|c| c >= from)
                && crate::translate::node_ready(n)
        })
        .filter_map(|n| n.metadata.name.clone())
        .collect();
    out.sort();
    out
}

/// The provisioned requests' reservations, kept in the world so a node
/// that registers for one is reserved for its gang in the same update
/// (before any cycle could give it to another pod). A reservation is a
/// nomination of a pending member to the node: the core then keeps the
/// node for the gang and tries the gang first in its queue. One node per
/// member at most (a pod has one nomination); extra nodes are not held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reservations {
    gangs: BTreeMap<String, Reserved>,
}

/// One gang's reservation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Reserved {
    /// The request's creation (Unix ms).
    since_ms: u64,
    /// Pending members' uids, by name.
    members: Vec<String>,
    /// Nodes nominated so far, in order (the i-th to the i-th member).
    nodes: Vec<String>,
}

impl Reserved {
    fn nominate(&mut self, node: &str) -> Option<(String, String)> {
        if self.nodes.iter().any(|n| n == node) || self.nodes.len() >= self.members.len() {
            return None;
        }
        let uid = self.members[self.nodes.len()].clone();
        self.nodes.push(node.to_string());
        Some((uid, node.to_string()))
    }
}

impl Reservations {
    /// Reserves for `gang` (provisioned by a request made at `since_ms`)
    /// the `nodes` that came for it; returns the nominations to add
    /// (member uid, node). When the pending members changed, the nodes
    /// already held are handed to the members given, in order.
    pub fn reserve(
        &mut self,
        gang: &str,
        since_ms: u64,
        members: Vec<String>,
        nodes: &[String],
    ) -> Vec<(String, String)> {
        let r = self.gangs.entry(gang.to_string()).or_default();
        let mut held = Vec::new();
        if r.since_ms != since_ms || r.members != members {
            // the same request with other members pending (some bound):
            // the nodes it holds go to the members pending now
            if r.since_ms == since_ms {
                held = std::mem::take(&mut r.nodes);
            }
            *r = Reserved {
                since_ms,
                members,
                nodes: Vec::new(),
            };
        }
        held.iter()
            .chain(nodes)
            .filter_map(|n| r.nominate(n))
            .collect()
    }

    /// A node registered at `created_ms`: the nomination that reserves it
    /// for the first gang (by name) whose request was made before it and
    /// that has a member left without a node.
    pub fn on_new_node(&mut self, node: &str, created_ms: u64) -> Option<(String, String)> {
        self.gangs
            .values_mut()
            .filter(|r| r.since_ms - r.since_ms % 1000 <= created_ms)
            .find_map(|r| r.nominate(node))
    }

    /// Keeps only the reservations of `keep`; returns the uids whose
    /// nominations go.
    pub fn retain(&mut self, keep: &BTreeSet<String>) -> Vec<String> {
        let gone: Vec<String> = self
            .gangs
            .keys()
            .filter(|k| !keep.contains(*k))
            .cloned()
            .collect();
        let mut uids = Vec::new();
        for k in gone {
            if let Some(r) = self.gangs.remove(&k) {
                uids.extend(r.members.into_iter().take(r.nodes.len()));
            }
        }
        uids
    }
}

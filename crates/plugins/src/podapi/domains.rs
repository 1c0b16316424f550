//! Topology domains: the values of a node label, interned per cycle. A
//! node without `kubernetes.io/hostname` (the simulator's) is its own
//! domain of that key.

use gpusched_core::NodeId;
use gpusched_model::Node;
use std::collections::BTreeMap;

/// No domain: the node lacks the label.
pub(super) const NONE: u32 = u32::MAX;

/// The value of topology key `key` on node `n`: its label, or the node's
/// name for `kubernetes.io/hostname` (every kubelet sets it; the
/// simulator's nodes go without).
pub(super) fn value<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.label(key)
        .or_else(|| (key == gpusched_model::labels::LABEL_HOSTNAME).then_some(n.name.as_str()))
}

/// The domains of one topology key.
pub(super) struct KeyDomains {
    /// Domain of each node ([`NONE`] without the label).
    pub of_node: Vec<u32>,
    /// How many domains.
    pub count: usize,
}

/// Domains of every topology key used so far in the cycle.
#[derive(Default)]
pub(super) struct Domains {
    keys: Vec<KeyDomains>,
    index: BTreeMap<String, usize>,
}

impl Domains {
    /// The index of `key`'s domains (interned the first time).
    pub fn key(&mut self, nodes: &[Node], key: &str) -> usize {
        if let Some(&k) = self.index.get(key) {
            return k;
        }
        let mut values: BTreeMap<&str, u32> = BTreeMap::new();
        let of_node = nodes
            .iter()
            .map(|n| {
                match n.label(key).or_else(|| {
                    // every kubelet sets it; the simulator's nodes go without
                    (key == gpusched_model::labels::LABEL_HOSTNAME).then_some(n.name.as_str())
                }) {
                    Some(v) => {
                        let next = values.len() as u32;
                        *values.entry(v).or_insert(next)
                    }
                    None => NONE,
                }
            })
            .collect();
        self.keys.push(KeyDomains {
            of_node,
            count: values.len(),
        });
        self.index.insert(key.to_string(), self.keys.len() - 1);
        self.keys.len() - 1
    }

    /// The domains of key index `k`.
    pub fn get(&self, k: usize) -> &KeyDomains {
        &self.keys[k]
    }

    /// The domain of node `n` for key index `k`.
    pub fn of(&self, k: usize, n: NodeId) -> u32 {
        self.keys[k].of_node[n as usize]
    }
}

/// Pods placed per node (a pod placed twice, e.g. a consolidation move
/// held at its destination, is listed twice).
pub(super) struct Placed {
    pub on: Vec<Vec<u32>>,
}

impl Placed {
    pub fn new(nodes: usize) -> Self {
        Placed {
            on: vec![Vec::new(); nodes],
        }
    }

    pub fn add(&mut self, p: u32, n: NodeId) {
        if let Some(v) = self.on.get_mut(n as usize) {
            v.push(p);
        }
    }

    pub fn remove(&mut self, p: u32, n: NodeId) {
        if let Some(v) = self.on.get_mut(n as usize)
            && let Some(i) = v.iter().position(|&x| x == p)
        {
            v.swap_remove(i);
        }
    }
}

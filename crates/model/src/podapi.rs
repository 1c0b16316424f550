//! The pod-to-pod and preference constraints of the Kubernetes Pod API:
//! inter-pod affinity and anti-affinity, topology spread, host ports,
//! preferred node affinity. Pure data plus the matching rules; the
//! scheduler core evaluates them against what runs where.

use crate::node::Node;
use crate::pod::{NodeSelectorOp, NodeSelectorRequirement, NodeSelectorTerm};
use crate::volume::ClaimNeed;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A label selector (`metav1.LabelSelector`): requirements ANDed;
/// `matchLabels` entries are `In` requirements with one value. An empty
/// selector selects every pod.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LabelSelector {
    /// The requirements; all must hold.
    #[serde(default)]
    pub requirements: Vec<NodeSelectorRequirement>,
}

impl LabelSelector {
    /// A selector of `key = value` pairs (`matchLabels`).
    pub fn equals<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Self {
        LabelSelector {
            requirements: pairs
                .into_iter()
                .map(|(k, v)| NodeSelectorRequirement {
                    key: k.to_string(),
                    operator: NodeSelectorOp::In,
                    values: vec![v.to_string()],
                })
                .collect(),
        }
    }

    /// Whether labels `labels` are selected.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Adds `matchLabelKeys` (`In` the pod's value) and `mismatchLabelKeys`
    /// (`NotIn` the pod's value) for the keys the pod carries, as the
    /// apiserver and kube-scheduler do; keys the pod lacks are ignored.
    pub fn with_label_keys(
        mut self,
        pod_labels: &BTreeMap<String, String>,
        match_keys: &[String],
        mismatch_keys: &[String],
    ) -> Self {
        for (keys, operator) in [
            (match_keys, NodeSelectorOp::In),
            (mismatch_keys, NodeSelectorOp::NotIn),
        ] {
            for k in keys {
                if let Some(v) = pod_labels.get(k) {
                    self.requirements.push(NodeSelectorRequirement {
                        key: k.clone(),
                        operator,
                        values: vec![v.clone()],
                    });
                }
            }
        }
        self
    }
}

/// One pod affinity or anti-affinity term (`PodAffinityTerm`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodAffinityTerm {
    /// Which pods the term is about (`None`: a null selector, which selects
    /// no pod). `matchLabelKeys`/`mismatchLabelKeys` are already merged in.
    #[serde(default)]
    pub selector: Option<LabelSelector>,
    /// Namespaces of the pods it is about; empty (and not
    /// `all_namespaces`): the namespace of the pod carrying the term.
    #[serde(default)]
    pub namespaces: Vec<String>,
    /// `namespaceSelector: {}`: pods of every namespace.
    #[serde(default)]
    pub all_namespaces: bool,
    /// A `namespaceSelector` narrower than `{}`: pods of the namespaces
    /// whose labels it selects count too (and the owner's namespace no
    /// longer counts by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    /// The namespaces `namespace_selector` selects, as the adapter saw them
    /// (it watches Namespaces and fills this in).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub selected_namespaces: Vec<String>,
    /// The node label whose value is the domain (`kubernetes.io/hostname`,
    /// `topology.kubernetes.io/zone`, …).
    pub topology_key: String,
}

impl PodAffinityTerm {
    /// A term about pods labelled `key = value` in the owner's namespace,
    /// over `topology_key`.
    pub fn labelled(key: &str, value: &str, topology_key: &str) -> Self {
        PodAffinityTerm {
            selector: Some(LabelSelector::equals([(key, value)])),
            namespaces: Vec::new(),
            all_namespaces: false,
            namespace_selector: None,
            selected_namespaces: Vec::new(),
            topology_key: topology_key.to_string(),
        }
    }

    /// Whether the term, carried by a pod of namespace `owner_ns`, is about
    /// a pod of namespace `ns` with labels `labels`.
    pub fn matches(&self, owner_ns: &str, ns: &str, labels: &BTreeMap<String, String>) -> bool {
        // kube-scheduler: `namespaces` ∪ the selector's namespaces; the
        // owner's namespace only when both are absent
        let ns_ok = self.all_namespaces
            || self.namespaces.iter().any(|n| n == ns)
            || self.selected_namespaces.iter().any(|n| n == ns)
            || (self.namespaces.is_empty() && self.namespace_selector.is_none() && ns == owner_ns);
        ns_ok && self.selector.as_ref().is_some_and(|s| s.matches(labels))
    }
}

/// A preferred pod (anti-)affinity term with its weight (1–100).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct WeightedPodAffinityTerm {
    /// 1–100.
    pub weight: i32,
    /// The term.
    pub term: PodAffinityTerm,
}

/// A preferred node affinity term with its weight (1–100).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PreferredNodeTerm {
    /// 1–100.
    pub weight: i32,
    /// The node selector term.
    pub term: NodeSelectorTerm,
}

/// What a spread constraint does when it cannot be met.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum WhenUnsatisfiable {
    /// A filter: nodes that would break `maxSkew` are refused.
    #[default]
    DoNotSchedule,
    /// A score: nodes in less crowded domains are preferred.
    ScheduleAnyway,
}

/// `nodeAffinityPolicy` / `nodeTaintsPolicy` of a spread constraint.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SpreadPolicy {
    /// Only nodes the pod could go to (by its node affinity, or by its
    /// tolerations) count as domains.
    Honor,
    /// Every node with the topology key counts.
    Ignore,
}

fn honor() -> SpreadPolicy {
    SpreadPolicy::Honor
}

fn ignore() -> SpreadPolicy {
    SpreadPolicy::Ignore
}

/// One `topologySpreadConstraints` entry.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SpreadConstraint {
    /// How much the matching pods of two domains may differ (≥ 1).
    pub max_skew: u32,
    /// The node label whose value is the domain.
    pub topology_key: String,
    /// Filter or score.
    #[serde(default)]
    pub when_unsatisfiable: WhenUnsatisfiable,
    /// The pods counted (in the pod's namespace; `None` counts none).
    /// `matchLabelKeys` are already merged in.
    #[serde(default)]
    pub selector: Option<LabelSelector>,
    /// Fewer eligible domains than this: the global minimum counts as 0.
    #[serde(default)]
    pub min_domains: Option<u32>,
    /// Whether the pod's node selector and required node affinity limit
    /// the domains (default `Honor`).
    #[serde(default = "honor")]
    pub node_affinity_policy: SpreadPolicy,
    /// Whether the pod's tolerations limit the domains (default `Ignore`).
    #[serde(default = "ignore")]
    pub node_taints_policy: SpreadPolicy,
}

/// Protocol of a host port.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    #[serde(rename = "TCP")]
    Tcp,
    /// UDP.
    #[serde(rename = "UDP")]
    Udp,
    /// SCTP.
    #[serde(rename = "SCTP")]
    Sctp,
}

/// A `hostPort` a container asks for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HostPort {
    /// Protocol.
    #[serde(default)]
    pub protocol: Protocol,
    /// Host IP (empty or `0.0.0.0`: every address).
    #[serde(default)]
    pub host_ip: String,
    /// The port (1–65535).
    pub port: u16,
}

impl HostPort {
    fn wildcard(&self) -> bool {
        self.host_ip.is_empty() || self.host_ip == "0.0.0.0" || self.host_ip == "::"
    }

    /// Whether two host ports cannot both be used on one node: same
    /// protocol and port, and the same address or either one every address.
    pub fn conflicts(&self, other: &HostPort) -> bool {
        self.protocol == other.protocol
            && self.port == other.port
            && (self.wildcard() || other.wildcard() || self.host_ip == other.host_ip)
    }
}

/// The constraints of one pod that depend on other pods or rank nodes.
/// Everything empty: the pod has none (see [`PodConstraints::is_empty`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PodConstraints {
    /// Required pod affinity: every term must have a matching pod in the
    /// node's domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_affinity: Vec<PodAffinityTerm>,
    /// Required pod anti-affinity: no term may have a matching pod in the
    /// node's domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub required_anti_affinity: Vec<PodAffinityTerm>,
    /// Preferred pod affinity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_affinity: Vec<WeightedPodAffinityTerm>,
    /// Preferred pod anti-affinity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_anti_affinity: Vec<WeightedPodAffinityTerm>,
    /// Topology spread constraints.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub spread: Vec<SpreadConstraint>,
    /// Host ports of its containers (init containers included).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_ports: Vec<HostPort>,
    /// Preferred node affinity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub preferred_node_affinity: Vec<PreferredNodeTerm>,
    /// Its PersistentVolumeClaims, resolved (only for a pending pod).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<ClaimNeed>,
    /// `namespace/name` of its `ReadWriteOncePod` claims: no other pod
    /// may use one at the same time.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclusive_claims: Vec<String>,
    /// The volumes it attaches through CSI drivers, for the nodes' attach
    /// limits (pending and placed pods; set only where a node has limits).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub csi_volumes: Vec<crate::volume::CsiVolume>,
    /// DRA: the nodes (by name, sorted) on which the pod's ResourceClaims
    /// can be allocated; `None`: no claims, any node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_nodes: Option<Vec<String>>,
    /// DRA: which GPUs of each node the pod's claims may take and which
    /// must go together; `None`: any GPU (no selector or constraint that
    /// tells the node's GPUs apart).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_gpus: Option<crate::dra::ClaimGpus>,
}

impl PodConstraints {
    /// Whether there is no constraint at all.
    pub fn is_empty(&self) -> bool {
        self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty()
            && self.spread.is_empty()
            && self.host_ports.is_empty()
            && self.preferred_node_affinity.is_empty()
            && self.volumes.is_empty()
            && self.exclusive_claims.is_empty()
            && self.csi_volumes.is_empty()
            && self.claim_nodes.is_none()
            && self.claim_gpus.is_none()
    }

    /// Every inter-pod affinity term, mutable (for resolving namespace
    /// selectors).
    pub fn terms_mut(&mut self) -> impl Iterator<Item = &mut PodAffinityTerm> {
        self.required_affinity
            .iter_mut()
            .chain(self.required_anti_affinity.iter_mut())
            .chain(self.preferred_affinity.iter_mut().map(|w| &mut w.term))
            .chain(self.preferred_anti_affinity.iter_mut().map(|w| &mut w.term))
    }

    /// Whether any term has a `namespaceSelector` narrower than `{}`.
    pub fn has_namespace_selectors(&self) -> bool {
        self.required_affinity
            .iter()
            .chain(&self.required_anti_affinity)
            .chain(self.preferred_affinity.iter().map(|w| &w.term))
            .chain(self.preferred_anti_affinity.iter().map(|w| &w.term))
            .any(|t| t.namespace_selector.is_some())
    }

    /// Whether any inter-pod term (required or preferred) is present.
    pub fn has_pod_terms(&self) -> bool {
        !(self.required_affinity.is_empty()
            && self.required_anti_affinity.is_empty()
            && self.preferred_affinity.is_empty()
            && self.preferred_anti_affinity.is_empty())
    }
}

/// The domain of `node` for a topology key (the label's value).
pub fn domain<'a>(node: &'a Node, topology_key: &str) -> Option<&'a str> {
    node.label(topology_key)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn terms_match_by_namespace_and_selector() {
        let t = PodAffinityTerm::labelled("app", "web", "zone");
        let web = labels(&[("app", "web")]);
        assert!(t.matches("a", "a", &web));
        assert!(!t.matches("a", "b", &web), "owner's namespace by default");
        assert!(!t.matches("a", "a", &labels(&[("app", "db")])));
        let all = PodAffinityTerm {
            all_namespaces: true,
            ..t.clone()
        };
        assert!(all.matches("a", "b", &web));
        let listed = PodAffinityTerm {
            namespaces: vec!["b".into()],
            ..t.clone()
        };
        assert!(listed.matches("a", "b", &web) && !listed.matches("a", "a", &web));
        let narrow = PodAffinityTerm {
            namespace_selector: Some(LabelSelector::equals([("team", "x")])),
            selected_namespaces: vec!["b".into()],
            ..t.clone()
        };
        assert!(narrow.matches("a", "b", &web));
        assert!(
            !narrow.matches("a", "a", &web),
            "a selector replaces the owner's namespace"
        );
        let nothing = PodAffinityTerm {
            selected_namespaces: Vec::new(),
            ..narrow.clone()
        };
        assert!(
            !nothing.matches("a", "a", &web) && !nothing.matches("a", "b", &web),
            "a selector that selects no namespace selects no pod"
        );
        let both = PodAffinityTerm {
            namespaces: vec!["c".into()],
            ..narrow
        };
        assert!(both.matches("a", "c", &web) && both.matches("a", "b", &web));
        let null = PodAffinityTerm {
            selector: None,
            ..t.clone()
        };
        assert!(
            !null.matches("a", "a", &web),
            "a null selector selects nothing"
        );
        let empty = PodAffinityTerm {
            selector: Some(LabelSelector::default()),
            ..t
        };
        assert!(
            empty.matches("a", "a", &BTreeMap::new()),
            "an empty one selects all"
        );
    }

    #[test]
    fn label_keys_become_requirements_for_keys_the_pod_has() {
        let own = labels(&[("app", "web"), ("rev", "7")]);
        let s = LabelSelector::equals([("app", "web")]).with_label_keys(
            &own,
            &["rev".into(), "missing".into()],
            &["app".into()],
        );
        assert_eq!(s.requirements.len(), 3);
        // app In [web] and app NotIn [web] together select nothing
        assert!(!s.matches(&own));
        let s = LabelSelector::default().with_label_keys(&own, &["rev".into()], &[]);
        assert!(s.matches(&labels(&[("rev", "7")])));
        assert!(!s.matches(&labels(&[("rev", "8")])));
    }

    #[test]
    fn host_ports_conflict_on_protocol_port_and_address() {
        let p = |proto, ip: &str, port| HostPort {
            protocol: proto,
            host_ip: ip.into(),
            port,
        };
        assert!(p(Protocol::Tcp, "", 80).conflicts(&p(Protocol::Tcp, "10.0.0.1", 80)));
        assert!(!p(Protocol::Tcp, "", 80).conflicts(&p(Protocol::Udp, "", 80)));
        assert!(!p(Protocol::Tcp, "", 80).conflicts(&p(Protocol::Tcp, "", 81)));
        assert!(!p(Protocol::Tcp, "10.0.0.1", 80).conflicts(&p(Protocol::Tcp, "10.0.0.2", 80)));
        assert!(p(Protocol::Tcp, "10.0.0.1", 80).conflicts(&p(Protocol::Tcp, "10.0.0.1", 80)));
        assert!(p(Protocol::Tcp, "0.0.0.0", 80).conflicts(&p(Protocol::Tcp, "10.0.0.1", 80)));
    }
}

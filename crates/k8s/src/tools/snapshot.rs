//! `gpusched snapshot capture`: one moment of a live cluster as one file —
//! the core [`Snapshot`] the scheduler would build from it (through the same
//! [`World`](crate::world::World)), which object each pod is, and the
//! scheduler configuration — for offline replay (`gpusched simulate
//! --snapshot`). With redaction, names, namespaces, label values, queue and
//! group names, UIDs and GPU UUIDs become stable pseudonyms that keep their
//! sort order (so tie-breaks by name stay the same).
//!
//! The file is JSON with a format marker and a version; [`load`] names the
//! file and what is wrong with it.

use crate::tools::doctor::Facts;
use gpusched_core::{PodPhase, Snapshot};
use gpusched_plugins::SchedulerConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// The `format` marker of a snapshot file.
pub const FORMAT: &str = "gpusched-snapshot";
/// Version of the file format.
pub const VERSION: u32 = 1;

/// Which API object a snapshot pod is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodName {
    /// `metadata.uid`.
    pub uid: String,
    /// `metadata.namespace`.
    pub namespace: String,
    /// `metadata.name`.
    pub name: String,
}

/// A snapshot file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SnapshotFile {
    /// Always [`FORMAT`].
    pub format: String,
    /// [`VERSION`].
    pub v: u32,
    /// When it was captured (ms since the Unix epoch): the replay's start.
    pub captured_at_ms: u64,
    /// Whether names were replaced by pseudonyms.
    pub redacted: bool,
    /// The scheduler configuration in force (the replay's default).
    pub config: SchedulerConfig,
    /// The core's input, as the scheduler would build it.
    pub snapshot: Snapshot,
    /// `pods[i]` is `snapshot.pods[i]`.
    pub pods: Vec<PodName>,
    /// Known run times of pods, by `namespace/name` (ms from their start);
    /// a running pod without one keeps running in a replay. Capture leaves
    /// it empty (Kubernetes does not know); edit it for what-if runs.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub durations_ms: BTreeMap<String, u64>,
}

/// A file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// Cannot be read.
    #[error("{file}: cannot read: {error}")]
    Io {
        /// The file.
        file: String,
        /// Why.
        error: std::io::Error,
    },
    /// Not a snapshot file, or a corrupt one.
    #[error("{file}: not a gpusched snapshot: {what}")]
    NotSnapshot {
        /// The file.
        file: String,
        /// What is wrong.
        what: String,
    },
    /// A version this build does not read.
    #[error("{file}: snapshot format version {found} (this build reads version {VERSION})")]
    Version {
        /// The file.
        file: String,
        /// Its version.
        found: u64,
    },
    /// Parsed, but its parts disagree.
    #[error("{file}: inconsistent snapshot: {what}")]
    Inconsistent {
        /// The file.
        file: String,
        /// What disagrees.
        what: String,
    },
}

impl SnapshotFile {
    /// The file for the facts of a cluster, as the scheduler would see them.
    pub fn from_facts(facts: &Facts, config: &SchedulerConfig) -> Self {
        let built = facts.world().build();
        SnapshotFile {
            format: FORMAT.into(),
            v: VERSION,
            captured_at_ms: facts.now_ms,
            redacted: false,
            config: config.clone(),
            pods: built
                .pods
                .iter()
                .map(|p| PodName {
                    uid: p.uid.clone(),
                    namespace: p.namespace.clone(),
                    name: p.name.clone(),
                })
                .collect(),
            snapshot: built.snapshot,
            durations_ms: BTreeMap::new(),
        }
    }

    /// JSON text.
    pub fn to_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self).unwrap_or_default();
        s.push('\n');
        s
    }

    /// Parses a file's text (`file` names it in errors).
    pub fn parse(file: &str, text: &str) -> Result<Self, SnapshotError> {
        let not = |what: String| SnapshotError::NotSnapshot {
            file: file.to_string(),
            what,
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| not(format!("not JSON: {e}")))?;
        match v.get("format").and_then(|f| f.as_str()) {
            Some(FORMAT) => {}
            Some(other) => return Err(not(format!("format is {other:?}, expected {FORMAT:?}"))),
            None => return Err(not(format!("no \"format\": {FORMAT:?} field"))),
        }
        match v.get("v").and_then(|x| x.as_u64()) {
            Some(n) if n == VERSION as u64 => {}
            Some(n) => {
                return Err(SnapshotError::Version {
                    file: file.to_string(),
                    found: n,
                });
            }
            None => return Err(not("no version field \"v\"".into())),
        }
        let f: SnapshotFile =
            serde_json::from_value(v).map_err(|e| not(format!("corrupt: {e}")))?;
        f.check().map_err(|what| SnapshotError::Inconsistent {
            file: file.to_string(),
            what,
        })?;
        Ok(f)
    }

    /// Cross-checks: one name per pod, nodes and GPUs that exist.
    fn check(&self) -> Result<(), String> {
        let s = &self.snapshot;
        if self.pods.len() != s.pods.len() {
            return Err(format!(
                "{} pod names for {} pods",
                self.pods.len(),
                s.pods.len()
            ));
        }
        for (i, p) in s.pods.iter().enumerate() {
            let (node, gpus) = match &p.phase {
                PodPhase::Pending { nominated, .. } => match nominated {
                    Some(n) => (*n, None),
                    None => continue,
                },
                PodPhase::Running { node, gpus, .. } | PodPhase::Terminating { node, gpus } => {
                    (*node, Some(gpus))
                }
            };
            let Some(n) = s.nodes.get(node as usize) else {
                return Err(format!(
                    "snapshot.pods[{i}] ({}) names node {node}, there are {}",
                    p.pod.name,
                    s.nodes.len()
                ));
            };
            let positions: Vec<u32> = match gpus {
                Some(gpusched_core::GpuAssignment::Whole(v)) => v.clone(),
                Some(gpusched_core::GpuAssignment::Share { gpu, .. }) => vec![*gpu],
                _ => Vec::new(),
            };
            if let Some(g) = positions.iter().find(|&&g| g as usize >= n.gpus.len()) {
                return Err(format!(
                    "snapshot.pods[{i}] ({}) holds GPU {g} of node {}, which has {}",
                    p.pod.name,
                    n.name,
                    n.gpus.len()
                ));
            }
        }
        Ok(())
    }

    /// Replaces names by pseudonyms that keep their order.
    pub fn redact(&mut self) {
        let s = &mut self.snapshot;
        let mut nodes = Pseudo::default();
        let mut values = Pseudo::default();
        let mut pods = Pseudo::default();
        let mut nss = Pseudo::default();
        let mut queues = Pseudo::default();
        let mut groups = Pseudo::default();
        let mut uids = Pseudo::default();
        let mut uuids = Pseudo::default();
        for n in &s.nodes {
            nodes.see(&n.name);
            n.labels.values().for_each(|v| values.see(v));
            n.gpus.iter().for_each(|g| uuids.see(&g.uuid));
        }
        for q in &s.queues {
            queues.see(&q.name);
        }
        for g in &s.groups {
            groups.see(&g.name);
            queues.see(&g.queue);
        }
        for p in &s.pods {
            pods.see(&p.pod.name);
            queues.see(&p.pod.queue);
            if let Some(g) = &p.pod.group {
                groups.see(g);
            }
            p.pod.node_selector.values().for_each(|v| values.see(v));
            for t in &p.pod.affinity {
                for r in &t.match_expressions {
                    r.values.iter().for_each(|v| values.see(v));
                }
                t.match_fields.iter().for_each(|f| nodes.see(&f.name));
            }
            p.pod.labels.values().for_each(|v| values.see(v));
            if !p.pod.namespace.is_empty() {
                nss.see(&p.pod.namespace);
            }
            if let Some(c) = &p.pod.constraints {
                let mut c = (**c).clone();
                constraint_values(&mut c, &mut |v| values.see(v), &mut |n| nss.see(n));
            }
        }
        for p in &self.pods {
            nss.see(&p.namespace);
            uids.see(&p.uid);
        }
        for k in groups.0.iter().chain(pods.0.iter()) {
            if let Some((ns, _)) = k.split_once('/') {
                nss.see(ns);
            }
        }
        let nodes = nodes.finish("node", &[]);
        let values = values.finish("v", &[]);
        let queues = queues.finish("queue", &[crate::translate::DEFAULT_QUEUE]);
        let nss = nss.finish("ns", &[]);
        let uids = uids.finish("uid", &[]);
        let uuids = uuids.finish("GPU", &[]);
        // `namespace/name` keys: the namespace's pseudonym, then a name
        // numbered in the order of the full key
        let split = |p: Pseudo, prefix: &str, nss: &BTreeMap<String, String>| {
            let all: Vec<String> = p.0.into_iter().collect();
            let width = all.len().to_string().len();
            all.into_iter()
                .enumerate()
                .map(|(i, k)| {
                    let v = match k.split_once('/') {
                        Some((ns, _)) => format!(
                            "{}/{prefix}-{i:0width$}",
                            nss.get(ns).cloned().unwrap_or_else(|| "ns".into())
                        ),
                        None => format!("{prefix}-{i:0width$}"),
                    };
                    (k, v)
                })
                .collect::<BTreeMap<String, String>>()
        };
        let pods = split(pods, "pod", &nss);
        let groups = split(groups, "group", &nss);
        let m = |map: &BTreeMap<String, String>, k: &str| map.get(k).cloned().unwrap_or_default();
        for n in &mut s.nodes {
            n.name = m(&nodes, &n.name);
            for v in n.labels.values_mut() {
                *v = m(&values, v);
            }
            for g in &mut n.gpus {
                g.uuid = m(&uuids, &g.uuid);
            }
        }
        for q in &mut s.queues {
            q.name = m(&queues, &q.name);
            if let Some(p) = &mut q.parent {
                *p = queues
                    .get(p.as_str())
                    .cloned()
                    .unwrap_or_else(|| "queue-missing".into());
            }
        }
        for g in &mut s.groups {
            g.name = m(&groups, &g.name);
            g.queue = m(&queues, &g.queue);
        }
        for p in &mut s.pods {
            let pod = std::sync::Arc::make_mut(&mut p.pod);
            pod.name = m(&pods, &pod.name);
            pod.queue = m(&queues, &pod.queue);
            if let Some(g) = &mut pod.group {
                *g = m(&groups, g);
            }
            for v in pod.node_selector.values_mut() {
                *v = m(&values, v);
            }
            for t in &mut pod.affinity {
                for r in &mut t.match_expressions {
                    for v in &mut r.values {
                        *v = m(&values, v);
                    }
                }
                for f in &mut t.match_fields {
                    f.name = m(&nodes, &f.name);
                }
            }
            for v in pod.labels.values_mut() {
                *v = m(&values, v);
            }
            if !pod.namespace.is_empty() {
                pod.namespace = m(&nss, &pod.namespace);
            }
            if let Some(c) = &mut pod.constraints {
                constraint_values(c, &mut |v| *v = m(&values, v), &mut |n| *n = m(&nss, n));
            }
        }
        for (i, p) in self.pods.iter_mut().enumerate() {
            let full = s
                .pods
                .get(i)
                .map(|x| x.pod.name.clone())
                .unwrap_or_default();
            let (ns, name) = full.split_once('/').unwrap_or(("", &full));
            p.uid = m(&uids, &p.uid);
            p.namespace = ns.to_string();
            p.name = name.to_string();
        }
        self.durations_ms = std::mem::take(&mut self.durations_ms)
            .into_iter()
            .map(|(k, v)| (pods.get(&k).cloned().unwrap_or(k), v))
            .collect();
        self.redacted = true;
    }
}

/// Names seen, then numbered in sorted order.
#[derive(Default)]
struct Pseudo(BTreeSet<String>);

impl Pseudo {
    fn see(&mut self, s: &str) {
        self.0.insert(s.to_string());
    }

    /// `prefix-N`, zero-padded so the order is kept; `keep` stay as they are.
    fn finish(self, prefix: &str, keep: &[&str]) -> BTreeMap<String, String> {
        let width = self.0.len().to_string().len();
        self.0
            .into_iter()
            .enumerate()
            .map(|(i, k)| {
                let v = if keep.contains(&k.as_str()) {
                    k.clone()
                } else {
                    format!("{prefix}-{i:0width$}")
                };
                (k, v)
            })
            .collect()
    }
}

/// Captures a live cluster (through `kubeconfig`, else the environment).
pub async fn capture(
    client: &kube::Client,
    config: &SchedulerConfig,
) -> anyhow::Result<SnapshotFile> {
    let facts = crate::tools::doctor::gather(client).await?;
    Ok(SnapshotFile::from_facts(&facts, config))
}

/// [`capture`] on its own runtime (for the binary).
pub fn capture_blocking(
    kubeconfig: Option<&Path>,
    config: &SchedulerConfig,
) -> anyhow::Result<SnapshotFile> {
    super::block_on(async {
        let client = crate::client::client(kubeconfig).await?;
        capture(&client, config).await
    })
}

/// Reads and checks a snapshot file.
pub fn load(path: &Path) -> Result<SnapshotFile, SnapshotError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|error| SnapshotError::Io {
        file: file.clone(),
        error,
    })?;
    SnapshotFile::parse(&file, &text)
}

/// Visits every label value and namespace the Pod API constraints name
/// (selector values, preferred node term values; term namespaces), for
/// redaction.
fn constraint_values(
    c: &mut gpusched_model::PodConstraints,
    value: &mut dyn FnMut(&mut String),
    namespace: &mut dyn FnMut(&mut String),
) {
    let terms = c
        .required_affinity
        .iter_mut()
        .chain(c.required_anti_affinity.iter_mut())
        .chain(c.preferred_affinity.iter_mut().map(|w| &mut w.term))
        .chain(c.preferred_anti_affinity.iter_mut().map(|w| &mut w.term));
    for t in terms {
        for r in t
            .selector
            .iter_mut()
            .flat_map(|s| s.requirements.iter_mut())
        {
            r.values.iter_mut().for_each(&mut *value);
        }
        t.namespaces.iter_mut().for_each(&mut *namespace);
    }
    for sp in &mut c.spread {
        for r in sp
            .selector
            .iter_mut()
            .flat_map(|s| s.requirements.iter_mut())
        {
            r.values.iter_mut().for_each(&mut *value);
        }
    }
    for t in &mut c.preferred_node_affinity {
        for r in &mut t.term.match_expressions {
            r.values.iter_mut().for_each(&mut *value);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gpusched_core::Decision;
    use serde_json::json;

    fn facts() -> Facts {
        let node = |name: &str, zone: &str| {
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"zone": zone, "nvidia.com/gpu.product": "H100"}},
                "spec": {},
                "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": "4"},
                           "conditions": [{"type": "Ready", "status": "True"}]}
            }))
            .unwrap()
        };
        let pod = |name: &str, gpus: u32, zone: Option<&str>, node: Option<&str>| {
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": "team-x", "uid": format!("uid-{name}"),
                             "creationTimestamp": "2026-12-01T10:00:00Z",
                             "labels": {"gpusched.io/queue": "research"}},
                "spec": {"schedulerName": "gpusched", "nodeName": node,
                         "nodeSelector": zone.map(|z| json!({"zone": z})),
                         "containers": [{"name": "m", "image": "x",
                             "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}}]},
                "status": {"phase": if node.is_some() {"Running"} else {"Pending"}}
            }))
            .unwrap()
        };
        Facts {
            nodes: vec![node("alpha", "east"), node("beta", "west")],
            pods: vec![
                pod("run", 2, None, Some("alpha")),
                pod("w1", 2, Some("west"), None),
                pod("w2", 2, None, None),
                pod("w3", 4, Some("east"), None),
            ],
            queues: vec![
                serde_json::from_value(
                    json!({"apiVersion": "gpusched.io/v1alpha1", "kind": "Queue",
                "metadata": {"name": "research"}, "spec": {}}),
                )
                .unwrap(),
            ],
            now_ms: 1_796_119_300_000,
            ..Facts::default()
        }
    }

    fn binds(f: &SnapshotFile) -> Vec<(String, String, Vec<u32>)> {
        let mut s = gpusched_plugins::config::build(&f.config).unwrap();
        let out = s.cycle(&f.snapshot, f.captured_at_ms, 1);
        out.decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Bind { pod, node, gpus } => Some((
                    f.snapshot.pods[*pod as usize].pod.name.clone(),
                    f.snapshot.nodes[*node as usize].name.clone(),
                    match gpus {
                        gpusched_core::GpuAssignment::Whole(v) => v.clone(),
                        _ => Vec::new(),
                    },
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn round_trip_and_redaction_keep_the_decisions() {
        let f = SnapshotFile::from_facts(&facts(), &SchedulerConfig::default());
        assert_eq!(f.pods.len(), 4);
        let back = SnapshotFile::parse("x.json", &f.to_json()).unwrap();
        assert_eq!(back, f);
        let plain = binds(&f);
        assert_eq!(plain.len(), 2, "{plain:?}");
        let mut r = f.clone();
        r.redact();
        let text = r.to_json();
        for secret in [
            "team-x", "alpha", "beta", "\"east\"", "\"west\"", "uid-run", "research", "\"run\"",
        ] {
            assert!(!text.contains(secret), "{secret} left in the redacted file");
        }
        assert!(r.redacted);
        // same decisions, names mapped one to one, GPU positions unchanged
        let red = binds(&SnapshotFile::parse("r.json", &text).unwrap());
        assert_eq!(red.len(), plain.len());
        let pod_map: BTreeMap<&str, &str> = f
            .snapshot
            .pods
            .iter()
            .zip(&r.snapshot.pods)
            .map(|(a, b)| (a.pod.name.as_str(), b.pod.name.as_str()))
            .collect();
        let node_map: BTreeMap<&str, &str> = f
            .snapshot
            .nodes
            .iter()
            .zip(&r.snapshot.nodes)
            .map(|(a, b)| (a.name.as_str(), b.name.as_str()))
            .collect();
        for (a, b) in plain.iter().zip(&red) {
            assert_eq!(pod_map[a.0.as_str()], b.0);
            assert_eq!(node_map[a.1.as_str()], b.1);
            assert_eq!(a.2, b.2);
        }
        // stable: redacting the same capture again gives the same file
        let mut r2 = f.clone();
        r2.redact();
        assert_eq!(r2.to_json(), text);
        assert_eq!(
            r.pods[0].namespace,
            r.snapshot.pods[0].pod.name.split('/').next().unwrap()
        );
    }

    #[test]
    fn redaction_maps_node_names_in_match_fields() {
        // w2 pinned to beta by name (a DaemonSet pod's matchFields)
        let mut facts = facts();
        facts.pods[2].spec.as_mut().unwrap().affinity = Some(
            serde_json::from_value(
                json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": ["beta"]}]}]}}}),
            )
            .unwrap(),
        );
        let f = SnapshotFile::from_facts(&facts, &SchedulerConfig::default());
        let on = |f: &SnapshotFile, pod: &str| {
            binds(f)
                .into_iter()
                .find(|b| b.0.ends_with(pod))
                .map(|b| b.1)
        };
        assert_eq!(on(&f, "/w2").as_deref(), Some("beta"));
        let mut r = f.clone();
        r.redact();
        let text = r.to_json();
        assert!(!text.contains("beta"), "beta left in the redacted file");
        let w2 = f
            .snapshot
            .pods
            .iter()
            .position(|p| p.pod.name.ends_with("/w2"))
            .unwrap();
        let beta = f
            .snapshot
            .nodes
            .iter()
            .position(|n| n.name == "beta")
            .unwrap();
        let red = SnapshotFile::parse("r.json", &text).unwrap();
        let red_w2 = red.snapshot.pods[w2].pod.name.clone();
        let red_beta = red.snapshot.nodes[beta].name.clone();
        let placed = binds(&red).into_iter().find(|b| b.0 == red_w2).map(|b| b.1);
        assert_eq!(placed, Some(red_beta), "the pin follows the pseudonym");
    }

    #[test]
    fn wrong_or_corrupt_files_are_named() {
        let f = SnapshotFile::from_facts(&facts(), &SchedulerConfig::default());
        let err = |t: &str| SnapshotFile::parse("f.json", t).unwrap_err().to_string();
        assert!(err("not json").contains("f.json: not a gpusched snapshot: not JSON"));
        assert!(err(r#"{"v":1}"#).contains("no \"format\""));
        assert!(err(r#"{"format":"other","v":1}"#).contains("\"other\""));
        assert!(err(r#"{"format":"gpusched-snapshot","v":9}"#).contains("version 9"));
        let mut v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        v["snapshot"]["pods"][0]["phase"]["Running"]["node"] = json!(7);
        assert!(
            err(&v.to_string()).contains("names node 7, there are 2"),
            "{}",
            err(&v.to_string())
        );
        let mut v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        v["pods"].as_array_mut().unwrap().pop();
        assert!(err(&v.to_string()).contains("3 pod names for 4 pods"));
        let mut v: serde_json::Value = serde_json::from_str(&f.to_json()).unwrap();
        v["surprise"] = json!(1);
        assert!(err(&v.to_string()).contains("corrupt"));
        let missing = load(Path::new("/nonexistent/snap.json"))
            .unwrap_err()
            .to_string();
        assert!(
            missing.starts_with("/nonexistent/snap.json: cannot read"),
            "{missing}"
        );
    }
}

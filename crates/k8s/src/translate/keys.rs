//! gpusched's own label and annotation keys (`gpusched.io/…`) on a pod: a
//! key outside the vocabulary is a typo that would be ignored in silence
//! (`gpusched.io/gpu-model`, `gpusched.io/min-gpu-memroy`), so it is named
//! with the nearest known key ([`unknown_keys`]); the world reports it as
//! a warning event on the pod, once ([`crate::world::Problem::PodKeyWarning`]).

use std::collections::BTreeMap;

/// Every `gpusched.io/` key gpusched, its agent, its chart and its tools
/// read or write on any object (pods, nodes, groups, workloads).
pub const KNOWN_KEYS: &[&str] = &[
    "gpusched.io/queue",
    "gpusched.io/pod-group",
    "gpusched.io/gang",
    "gpusched.io/job",
    "gpusched.io/movable",
    "gpusched.io/preemptible",
    "gpusched.io/gpu-models",
    "gpusched.io/min-gpu-memory",
    "gpusched.io/decision",
    "gpusched.io/provisioning-attempt",
    "gpusched.io/allow-node-name",
    "gpusched.io/gpu-milli",
    "gpusched.io/gpu-memory-mib",
    "gpusched.io/gpus",
    "gpusched.io/allocations",
    "gpusched.io/sharing",
    "gpusched.io/xid",
    "gpusched.io/rack",
    "gpusched.io/block",
    "gpusched.io/nvlink-domain",
    "gpusched.io/gpu.interconnect",
    "gpusched.io/gpu.mig-enabled-count",
    "gpusched.io/gpu.numa-nodes",
    "gpusched.io/gpu.nvlink-domains",
    "gpusched.io/gpu.pcie-switches",
    "gpusched.io/sim-job",
    "gpusched.io/e2e-fail-exit-code",
    "gpusched.io/e2e-run-ms",
];

const PREFIX: &str = "gpusched.io/";

/// Edit distance (insertions, deletions, substitutions, adjacent swaps).
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// The known key nearest `key` (at most 3 edits), if any.
pub fn nearest(key: &str) -> Option<&'static str> {
    KNOWN_KEYS
        .iter()
        .map(|k| (distance(key, k), *k))
        .filter(|(d, _)| *d <= 3)
        .min()
        .map(|(_, k)| k)
}

/// A warning for each `gpusched.io/` label or annotation key of a pod that
/// gpusched does not know, naming the nearest known key.
pub fn unknown_keys(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (what, m) in [("label", labels), ("annotation", annotations)] {
        for k in m.keys() {
            if !k.starts_with(PREFIX) || KNOWN_KEYS.contains(&k.as_str()) {
                continue;
            }
            out.push(match nearest(k) {
                Some(n) => format!(
                    "unknown {what} {k} is ignored: gpusched knows no such key; did you mean {n}?"
                ),
                None => format!(
                    "unknown {what} {k} is ignored: gpusched knows no such key (docs/kubernetes.md lists its labels and annotations)"
                ),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// #39 item 4: the typos a user wrote, each named with the key meant.
    #[test]
    fn a_typo_in_a_gpusched_key_names_the_nearest_known_key() {
        let w = unknown_keys(
            &map(&[
                ("gpusched.io/queue", "a"),
                ("gpusched.io/podgroup", "g"),
                ("app", "x"),
            ]),
            &map(&[
                ("gpusched.io/gpu-model", "H100"),
                ("gpusched.io/min-gpu-memroy", "40Gi"),
                ("gpusched.io/gpu-models", "H100"),
                ("gpusched.io/something-else-entirely", "1"),
                ("example.com/gpu-model", "x"),
            ]),
        );
        assert_eq!(w.len(), 4, "{w:#?}");
        assert!(
            w[0].contains("label gpusched.io/podgroup")
                && w[0].ends_with("did you mean gpusched.io/pod-group?"),
            "{w:#?}"
        );
        assert!(
            w[1].contains("annotation gpusched.io/gpu-model ")
                && w[1].ends_with("did you mean gpusched.io/gpu-models?"),
            "{w:#?}"
        );
        assert!(
            w[2].contains("annotation gpusched.io/min-gpu-memroy")
                && w[2].ends_with("did you mean gpusched.io/min-gpu-memory?"),
            "{w:#?}"
        );
        assert!(
            w[3].contains("gpusched.io/something-else-entirely") && !w[3].contains("did you mean"),
            "{w:#?}"
        );
        // every key gpusched itself uses is known
        for k in KNOWN_KEYS {
            assert_eq!(nearest(k), Some(*k));
        }
    }
}

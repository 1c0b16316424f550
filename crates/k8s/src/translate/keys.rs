//! gpusched's own label and annotation keys (`gpusched.io/…`) on a pod: a
//! key outside the vocabulary is a typo that would be ignored in silence
//! (`gpusched.io/gpu-model`, `gpusched.io/min-gpu-memroy`), so it is named
//! with the nearest known key ([`unknown_keys`]); the world reports it as
//! a warning event on the pod, once ([`crate::world::Problem::PodKeyWarning`]).
//! A known key where gpusched does not read it (`gpusched.io/preemptible`
//! as a label, `gpusched.io/queue` as an annotation) is named the same way.
//!
//! Values: a key with a closed vocabulary (the flags `gpusched.io/gang`,
//! `gpusched.io/movable`, `gpusched.io/preemptible`; the quantity
//! `gpusched.io/min-gpu-memory`) with a value outside it is refused where it
//! is read ([`super::model_pod`], a Job's gang label in the world): the pod
//! waits, its event and condition naming the key, the value and the values
//! accepted, rather than being placed as something the user did not ask.

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

/// Where gpusched reads a key on a pod (the keys it reads on pods; the
/// others are read on other objects or not on pods at all).
const POD_KEYS: &[(&str, Where)] = &[
    ("gpusched.io/queue", Where::Label),
    ("gpusched.io/pod-group", Where::Label),
    ("gpusched.io/movable", Where::Either),
    ("gpusched.io/preemptible", Where::Annotation),
    ("gpusched.io/gpu-models", Where::Annotation),
    ("gpusched.io/min-gpu-memory", Where::Annotation),
];

#[derive(Clone, Copy, PartialEq, Eq)]
enum Where {
    Label,
    Annotation,
    Either,
}

/// A warning for each `gpusched.io/` label or annotation key of a pod that
/// gpusched does not know, naming the nearest known key; and for each
/// known pod key in the place gpusched does not read it (a label read as
/// an annotation, or the other way).
pub fn unknown_keys(
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Vec<String> {
    let mut out = Vec::new();
    for (what, m) in [("label", labels), ("annotation", annotations)] {
        for k in m.keys() {
            if !k.starts_with(PREFIX) {
                continue;
            }
            if KNOWN_KEYS.contains(&k.as_str()) {
                let read = POD_KEYS.iter().find(|(key, _)| key == k).map(|(_, w)| *w);
                let other = match (what, read) {
                    ("label", Some(Where::Annotation)) => "an annotation",
                    ("annotation", Some(Where::Label)) => "a label",
                    _ => continue,
                };
                out.push(format!(
                    "{what} {k} is ignored: gpusched reads {k} as {other}; move it there"
                ));
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

    /// #39 item 4: a known key where gpusched does not read it is ignored
    /// as silently as a typo (`gpusched.io/preemptible: "false"` as a label
    /// left the pod evictable): named, with where it belongs.
    #[test]
    fn a_known_key_in_the_wrong_place_is_named_with_where_it_is_read() {
        let w = unknown_keys(
            &map(&[
                ("gpusched.io/preemptible", "false"),
                ("gpusched.io/movable", "true"),
                ("gpusched.io/queue", "a"),
            ]),
            &map(&[
                ("gpusched.io/queue", "a"),
                ("gpusched.io/movable", "true"),
                ("gpusched.io/min-gpu-memory", "40Gi"),
            ]),
        );
        assert_eq!(
            w,
            [
                "label gpusched.io/preemptible is ignored: gpusched reads gpusched.io/preemptible as an annotation; move it there",
                "annotation gpusched.io/queue is ignored: gpusched reads gpusched.io/queue as a label; move it there",
            ]
        );
    }
}

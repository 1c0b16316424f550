//! The dashboards (`deploy/dashboards/`) and the metrics reference
//! (`docs/metrics.md`) name only metrics the scheduler and the agent
//! register, and the reference names all of them, with their type.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `# TYPE name kind` lines of an exposition.
fn families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

/// Names of a registry's families from its debug text (`Descriptor {
/// name: "…"`), which lists them all, sampled or not.
fn descriptor_names(debug: &str, prefix: &str) -> BTreeSet<String> {
    debug
        .split("Descriptor { name: \"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .map(|n| format!("{prefix}{n}"))
        .collect()
}

/// Every registered family: (name as queried for the table, kind). Kinds
/// come from the exposition, which shows a family only once it has a
/// sample: every family gets one here, and a family registered without one
/// fails the test.
fn registered() -> BTreeMap<String, String> {
    use gpusched_k8s::metrics::{FreeLabel, KindLabel, QueueLabel, ReasonLabel, StateLabel};
    use gpusched_node_agent::metrics::{GpuLabels, RequestLabels, ResourceLabels};
    let m = gpusched_k8s::metrics::Metrics::new();
    let q = QueueLabel { queue: "q".into() };
    let _ = m.pending.get_or_create(&q);
    let _ = m.queue_allocated_gpus.get_or_create(&q);
    let _ = m.queue_fair_share_gpus.get_or_create(&q);
    let _ = m.bind_errors.get_or_create(&KindLabel {
        kind: "conflict".into(),
    });
    let _ = m.pending_by_reason.get_or_create(&ReasonLabel {
        reason: "QueueQuota".into(),
    });
    let _ = m.gpus.get_or_create(&StateLabel {
        state: "total".into(),
    });
    let _ = m
        .nodes_by_free_gpus
        .get_or_create(&FreeLabel { free: "0".into() });
    let a = gpusched_node_agent::metrics::Metrics::new();
    let g = GpuLabels {
        gpu: "GPU-0".into(),
        index: "0".into(),
        model: "H100".into(),
    };
    let _ = a.utilization.get_or_create(&g);
    let _ = a.memory_used.get_or_create(&g);
    let _ = a.memory_total.get_or_create(&g);
    let _ = a.power.get_or_create(&g);
    let _ = a.temperature.get_or_create(&g);
    let _ = a.healthy.get_or_create(&g);
    let _ = a.allocated.get_or_create(&g);
    let _ = a.xid.get_or_create(&g);
    let _ = a.health_transitions.get_or_create(&g);
    let r = ResourceLabels {
        resource: "nvidia.com/gpu".into(),
    };
    let _ = a.registrations.get_or_create(&r);
    let _ = a.list_updates.get_or_create(&r);
    let _ = a.requests.get_or_create(&RequestLabels {
        resource: "nvidia.com/gpu".into(),
        method: "Allocate".into(),
        code: "Ok".into(),
    });
    let mut kinds = families(&m.render());
    kinds.extend(families(&a.encode()));
    let mut names = descriptor_names(&m.registry_debug(), "gpusched_");
    names.extend(descriptor_names(&format!("{:?}", a.registry), ""));
    assert!(names.len() >= 20, "too few metrics found: {names:?}");
    names
        .into_iter()
        .map(|n| {
            let k = kinds
                .get(&n)
                .unwrap_or_else(|| panic!("{n} has no sample here: give it one in registered()"))
                .clone();
            let name = if k == "counter" {
                format!("{n}_total")
            } else {
                n
            };
            (name, k)
        })
        .collect()
}

/// Every series name a query may use: ours, and the scheduler's standard
/// `process_*` metrics (read from /proc at each scrape).
fn queryable() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let exposition = gpusched_k8s::metrics::Metrics::new().render();
    for (n, k) in families(&exposition) {
        if n.starts_with("process_") {
            out.insert(if k == "counter" {
                format!("{n}_total")
            } else {
                n
            });
        }
    }
    assert!(
        out.contains("process_cpu_seconds_total"),
        "no process metrics: {exposition}"
    );
    for (n, k) in registered() {
        if k == "histogram" {
            for s in ["_bucket", "_sum", "_count"] {
                out.insert(format!("{n}{s}"));
            }
        } else {
            out.insert(n);
        }
    }
    out
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while let Some(p) = ["gpusched_", "process_"]
        .iter()
        .filter_map(|m| expr[i..].find(m))
        .min()
    {
        let s = i + p;
        let boundary = s == 0 || !(b[s - 1].is_ascii_alphanumeric() || b[s - 1] == b'_');
        let mut e = s;
        while e < b.len() && (b[e].is_ascii_alphanumeric() || b[e] == b'_') {
            e += 1;
        }
        if boundary {
            out.push(expr[s..e].to_string());
        }
        i = e;
    }
    out
}

fn exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => exprs(x, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| exprs(x, out)),
        _ => {}
    }
}

#[test]
fn dashboards_use_only_registered_metrics() {
    let known = queryable();
    let dir = root().join("deploy/dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "dashboards missing in {}", dir.display());
    let mut used = BTreeSet::new();
    for f in &files {
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap())
            .unwrap_or_else(|e| {
                panic!("{}: {e}", f.display());
            });
        let mut ex = Vec::new();
        exprs(&v, &mut ex);
        // query variables (`label_values(metric, label)`)
        for var in v["templating"]["list"].as_array().into_iter().flatten() {
            if var["type"] == "query"
                && let Some(q) = var["query"]["query"].as_str()
            {
                ex.push(q.to_string());
            }
        }
        assert!(!ex.is_empty(), "{}: no queries", f.display());
        for e in &ex {
            let names = metric_names(e);
            assert!(!names.is_empty(), "{}: {e:?} names no metric", f.display());
            for n in names {
                assert!(
                    known.contains(&n),
                    "{}: {n} (in {e:?}) is not registered",
                    f.display()
                );
                used.insert(n);
            }
        }
    }
    // the panels the issue asks for read these
    for n in [
        "gpusched_queue_fair_share_gpus",
        "gpusched_pending_pods_by_reason",
        "gpusched_gpus_fragmented",
        "gpusched_agent_gpu_utilization_ratio",
        "gpusched_agent_gpu_power_watts",
        "gpusched_agent_gpu_healthy",
    ] {
        assert!(used.contains(n), "no dashboard shows {n}");
    }
}

#[test]
fn metrics_reference_matches_the_registries() {
    let text = std::fs::read_to_string(root().join("docs/metrics.md")).unwrap();
    let mut documented: BTreeMap<String, String> = BTreeMap::new();
    for l in text.lines() {
        let cells: Vec<&str> = l.split('|').map(str::trim).collect();
        if cells.len() < 4 || !cells[1].starts_with("`gpusched_") {
            continue;
        }
        let name = cells[1].trim_matches('`').to_string();
        assert!(
            documented
                .insert(name.clone(), cells[2].to_string())
                .is_none(),
            "{name} documented twice"
        );
    }
    let reg = registered();
    assert_eq!(
        documented.keys().collect::<Vec<_>>(),
        reg.keys().collect::<Vec<_>>(),
        "docs/metrics.md and the registries disagree"
    );
    for (n, k) in &reg {
        assert_eq!(&documented[n], k, "{n}: documented type");
    }
}

#[test]
fn metric_name_extraction() {
    assert_eq!(
        metric_names(
            "histogram_quantile(0.99, sum by (le) (rate(gpusched_cycle_duration_seconds_bucket[5m]))) / xgpusched_no + process_open_fds"
        ),
        vec!["gpusched_cycle_duration_seconds_bucket", "process_open_fds"]
    );
}

/// The workspace's crate names as Rust paths (`gpusched_core`, …): prose
/// names them beside metrics, with the same prefix.
fn crate_names() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(root().join("crates")).unwrap() {
        let toml = e.unwrap().path().join("Cargo.toml");
        let Ok(text) = std::fs::read_to_string(&toml) else {
            continue;
        };
        let name = text
            .lines()
            .find_map(|l| l.strip_prefix("name = \""))
            .and_then(|l| l.split('"').next())
            .unwrap_or_else(|| panic!("{}: no package name", toml.display()));
        out.insert(name.replace('-', "_"));
    }
    assert!(out.contains("gpusched_core"), "{out:?}");
    out
}

/// Every metric name the docs mention anywhere (README.md, docs/*.md,
/// deploy/README.md, examples/: prose, tables, PromQL), not only
/// docs/metrics.md's table, is one a query can use: a registered family
/// (counters with `_total`, histograms by their family name or with
/// `_bucket`/`_sum`/`_count`) or a `process_*` metric; a name ending in `_`
/// (`process_*`) is a prefix of some. Crate names (`gpusched_core::…`) are
/// not metrics.
#[test]
fn docs_name_only_registered_metrics() {
    // a histogram's family name is a name too (`…_seconds` beside
    // `…_seconds_bucket`)
    let mut known = queryable();
    known.extend(registered().into_keys());
    let crates = crate_names();
    let root = root();
    let mut docs = vec![root.join("README.md"), root.join("deploy/README.md")];
    let mut stack = vec![root.join("docs"), root.join("examples")];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                docs.push(p);
            }
        }
    }
    docs.sort();
    let mut misses = Vec::new();
    let mut seen = 0;
    for f in &docs {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            for name in metric_names(line) {
                if crates.contains(&name) {
                    continue;
                }
                seen += 1;
                // a prefix (`process_*`) names the metrics it starts
                let prefix_known =
                    name.ends_with('_') && known.iter().any(|k| k.starts_with(&name));
                if !known.contains(&name) && !prefix_known {
                    misses.push(format!(
                        "{}:{}: {name} is not a registered metric",
                        f.strip_prefix(&root).unwrap_or(f).display(),
                        n + 1
                    ));
                }
            }
        }
    }
    for m in &misses {
        eprintln!("{m}");
    }
    assert!(seen > 30, "too few metric names found ({seen})");
    assert!(
        misses.is_empty(),
        "{} metric name(s) in the docs are not registered (listed above)",
        misses.len()
    );
}

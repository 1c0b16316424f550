//! Bad cluster and workload files give errors naming the file, the line and
//! the field, and never panic.

mod common;

use gpusched_sim::{LoadError, Source};
use proptest::prelude::*;

const CLUSTER: &str = "nodes:
  - name: n
    count: 2
    cpu: \"16\"
    memory: 64Gi
    gpus: {count: 4, model: L40S, memory: 48Gi}
";

const WORKLOAD: &str = "queues:
  - name: q
    weight: 2
jobs:
  - name: j
    queue: q
    duration: 1h
    requests: {cpu: \"1\", nvidia.com/gpu: \"1\"}
events:
  - {at: 10m, kind: node-failure, node: n-0, recover_after: 5m}
";

fn load(cluster: &str, workload: &str) -> Result<gpusched_sim::Scenario, LoadError> {
    gpusched_sim::scenario(
        Some(Source {
            name: "c.yaml",
            text: cluster,
        }),
        Some(Source {
            name: "w.yaml",
            text: workload,
        }),
        1,
    )
}

/// Replaces `from` (which must occur) in the valid workload.
fn bad_workload(from: &str, to: &str) -> LoadError {
    assert!(WORKLOAD.contains(from), "{from:?}");
    load(CLUSTER, &WORKLOAD.replacen(from, to, 1)).expect_err("must be refused")
}

fn bad_cluster(from: &str, to: &str) -> LoadError {
    assert!(CLUSTER.contains(from), "{from:?}");
    load(&CLUSTER.replacen(from, to, 1), WORKLOAD).expect_err("must be refused")
}

#[track_caller]
fn check(e: &LoadError, file: &str, line: u64, field: &str, msg: &str) {
    let shown = e.to_string();
    assert_eq!(e.file, file, "{shown}");
    assert_eq!(e.line, line, "{shown}");
    assert_eq!(e.field, field, "{shown}");
    assert!(
        e.message.contains(msg),
        "message should mention {msg:?}: {shown}"
    );
    assert!(shown.starts_with(&format!("{file}:{line}:")), "{shown}");
    assert!(shown.contains(field), "{shown}");
}

#[test]
fn the_valid_files_load() {
    let sc = load(CLUSTER, WORKLOAD).unwrap();
    assert_eq!(sc.nodes.len(), 2);
    assert_eq!(sc.jobs.len(), 1);
    assert_eq!(sc.events.len(), 2, "failure and its recovery");
}

#[test]
fn workload_type_and_schema_errors() {
    check(
        &bad_workload("    weight: 2\n", "    weight: 2\n    colour: red\n"),
        "w.yaml",
        4,
        "queues[0].colour",
        "unknown field",
    );
    check(
        &bad_workload("weight: 2", "weight: two"),
        "w.yaml",
        3,
        "queues[0].weight",
        "must be a whole number from 0 to 4294967295",
    );
    // in words a user reads, never the parser's type names
    let e = bad_workload("weight: 2", "weight: -2");
    assert!(!e.message.contains("u32"), "{e}");
    check(
        &e,
        "w.yaml",
        3,
        "queues[0].weight",
        "must be a whole number",
    );
    check(
        &bad_workload("    duration: 1h\n", ""),
        "w.yaml",
        5,
        "jobs[0].duration",
        "missing field",
    );
    check(
        &bad_workload("kind: node-failure", "kind: node-explodes"),
        "w.yaml",
        10,
        "events[0].kind",
        "node-explodes",
    );
}

#[test]
fn workload_value_errors() {
    check(
        &bad_workload("duration: 1h", "duration: 1x"),
        "w.yaml",
        7,
        "jobs[0].duration",
        "unknown unit",
    );
    check(
        &bad_workload("nvidia.com/gpu: \"1\"", "nvidia.com/gpu: \"1.5\""),
        "w.yaml",
        8,
        "jobs[0].requests.nvidia.com/gpu",
        "whole number",
    );
    check(
        &bad_workload("cpu: \"1\"", "cpu: \"lots\""),
        "w.yaml",
        8,
        "jobs[0].requests.cpu",
        "invalid quantity",
    );
    check(
        &bad_workload("queue: q", "queue: nope"),
        "w.yaml",
        6,
        "jobs[0].queue",
        "unknown queue",
    );
    check(
        &bad_workload("node: n-0", "node: n-9"),
        "w.yaml",
        10,
        "events[0].node",
        "unknown node",
    );
    check(
        &bad_workload("kind: node-failure", "kind: gpu-failure, gpu: 7"),
        "w.yaml",
        10,
        "events[0].gpu",
        "4 GPUs",
    );
    check(
        &bad_workload("weight: 2", "weight: 0"),
        "w.yaml",
        3,
        "queues[0].weight",
        "at least 1",
    );
    check(
        &bad_workload(
            "    duration: 1h\n",
            "    duration: 1h\n    pods: 2\n    gang: {min_member: 3}\n",
        ),
        "w.yaml",
        9,
        "jobs[0].gang.min_member",
        "between 1 and pods",
    );
}

#[test]
fn yaml_syntax_errors_have_a_line() {
    let e = bad_workload("queues:\n", "queues: [\n");
    assert_eq!(e.file, "w.yaml");
    assert!(e.line >= 1, "{e}");
    let e = load(CLUSTER, "jobs: {").expect_err("refused");
    assert!(e.line >= 1 && e.to_string().starts_with("w.yaml:"), "{e}");
}

#[test]
fn cluster_errors() {
    check(
        &bad_cluster("memory: 48Gi", "memory: 48Gx"),
        "c.yaml",
        6,
        "nodes[0].gpus.memory",
        "unknown suffix",
    );
    check(
        &bad_cluster("    cpu: \"16\"\n", "    cpu: \"16\"\n    cpus: 3\n"),
        "c.yaml",
        5,
        "nodes[0].cpus",
        "unknown field",
    );
    check(
        &bad_cluster("cpu: \"16\"", "cpu: \"sixteen\""),
        "c.yaml",
        4,
        "nodes[0].cpu",
        "invalid quantity",
    );
    check(
        &bad_cluster("count: 2", "count: 0"),
        "c.yaml",
        3,
        "nodes[0].count",
        "at least 1",
    );
    let e = load("nodes: []\n", WORKLOAD).expect_err("no nodes");
    assert!(e.to_string().contains("nodes"), "{e}");
}

#[test]
fn unreadable_file_is_named() {
    let e = gpusched_sim::load::read(std::path::Path::new("/nonexistent/w.yaml")).unwrap_err();
    assert_eq!(e.file, "/nonexistent/w.yaml");
    assert!(e.to_string().contains("cannot read"), "{e}");
}

#[test]
fn scheduler_config_errors_are_located() {
    let e = gpusched_plugins::SchedulerConfig::from_yaml(
        "s.yaml",
        "version: v1\nactions:\n  backfill: true\n  reserve: 3\n",
    )
    .unwrap_err();
    assert_eq!((e.line, e.field.as_str()), (4, "actions.reserve"), "{e}");
    let e = gpusched_sim::sched::build(None, Some("no-such-policy")).err();
    assert!(e.is_some_and(|e| e.contains("no-such-policy")));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    /// Any edit of a valid file loads or is refused with a located error;
    /// it never panics.
    #[test]
    fn mutated_files_never_panic(
        pos in 0usize..WORKLOAD.len(),
        len in 0usize..8,
        junk in "[ -~\n]{0,6}",
        which in any::<bool>(),
    ) {
        let base = if which { WORKLOAD } else { CLUSTER };
        let mut s: Vec<char> = base.chars().collect();
        let p = pos.min(s.len());
        let end = (p + len).min(s.len());
        s.splice(p..end, junk.chars());
        let text: String = s.into_iter().collect();
        let r = if which { load(CLUSTER, &text) } else { load(&text, WORKLOAD) };
        if let Err(e) = r {
            // Usually the edited file is named; a valid edit can also break a
            // reference held by the other file (a workload event naming a
            // node the edited cluster no longer has), reported there.
            prop_assert!(e.file == "w.yaml" || e.file == "c.yaml", "{}", e.file);
            if e.file != if which { "w.yaml" } else { "c.yaml" } {
                prop_assert!(!which, "an edited workload cannot break the cluster file: {e}");
            }
            prop_assert!(!e.message.is_empty());
        }
    }
}

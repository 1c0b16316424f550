//! Bad configuration and node files fail with the file and field named.

use gpusched_node_agent::backend::fake::FakeBackend;
use gpusched_node_agent::cli::AgentArgs;
use std::path::PathBuf;

fn write(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn err(args: AgentArgs) -> String {
    format!("{:#}", args.settings().unwrap_err())
}

#[test]
fn config_file_errors_name_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    let args = |p: PathBuf| AgentArgs {
        config: Some(p),
        backend: Some(gpusched_node_agent::config::BackendKind::Fake),
        node_file: Some("x.yaml".into()),
        ..Default::default()
    };
    let e = err(args(write(
        d.path(),
        "a.yaml",
        "version: v1\nplugin:\n  dirr: /x\n",
    )));
    assert!(e.contains("a.yaml") && e.contains("dirr"), "{e}");
    let e = err(args(write(d.path(), "b.yaml", "version: v0\n")));
    assert!(e.contains("b.yaml") && e.contains("`version`"), "{e}");
    let e = err(args(write(
        d.path(),
        "c.yaml",
        "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: amd.com/gpu\n        replicas: 2\n",
    )));
    assert!(e.contains("sharing.timeSlicing.resources[0].name"), "{e}");
    let e = err(args(write(
        d.path(),
        "d.yaml",
        "version: v1\nmetrics:\n  address: nowhere\n",
    )));
    assert!(e.contains("metrics.address"), "{e}");
    let e = err(args(write(
        d.path(),
        "e.yaml",
        "version: v1\nplugin:\n  passDeviceSpecs: maybe\n",
    )));
    assert!(e.contains("e.yaml"), "{e}");
    let e = err(args(d.path().join("missing.yaml")));
    assert!(e.contains("missing.yaml"), "{e}");
}

#[test]
fn flags_are_checked() {
    let e = err(AgentArgs {
        backend: Some(gpusched_node_agent::config::BackendKind::Fake),
        ..Default::default()
    });
    assert!(e.contains("node file"), "{e}");
    let e = err(AgentArgs {
        backend: Some(gpusched_node_agent::config::BackendKind::Fake),
        node_file: Some("n.yaml".into()),
        quiet_period: Some("soon".into()),
        ..Default::default()
    });
    assert!(e.contains("--quiet-period"), "{e}");
}

#[test]
fn node_file_errors_name_file_and_field() {
    let d = tempfile::tempdir().unwrap();
    let p = write(
        d.path(),
        "node.yaml",
        "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus: {count: 2, model: X, memory: 80Gi, colour: red}\n",
    );
    let e = FakeBackend::from_file(&p, None).unwrap_err().to_string();
    assert!(e.contains("node.yaml") && e.contains("colour"), "{e}");
    let p = write(
        d.path(),
        "node2.yaml",
        "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: lots\n",
    );
    let e = FakeBackend::from_file(&p, None).unwrap_err().to_string();
    assert!(e.contains("node2.yaml") && e.contains("memory"), "{e}");
}

#[test]
fn fixtures_parse() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/nodes");
    for (f, n) in [
        ("dgx-h100.yaml", 8),
        ("pcie-l40s.yaml", 8),
        ("mig-a100.yaml", 8),
        ("nvl72.yaml", 72),
    ] {
        let b = FakeBackend::from_file(&dir.join(f), None).unwrap();
        assert_eq!(b.inventory_ref().gpus.len(), n, "{f}");
    }
}

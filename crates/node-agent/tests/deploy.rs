//! The deployment files agree with the code: the chart's CRDs are exactly
//! what `gpusched crds` prints. `GPUSCHED_BLESS=1` rewrites them.

use std::path::Path;

#[test]
fn chart_crds_match_the_code() {
    let want = gpusched_k8s::crd::crds_yaml().expect("crds");
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/helm/gpusched/crds/crds.yaml");
    if std::env::var_os("GPUSCHED_BLESS").is_some() {
        std::fs::write(&path, &want).unwrap();
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{} is stale: run GPUSCHED_BLESS=1 cargo test -p gpusched-node-agent --test deploy",
        path.display()
    );
}

//! Queue fields in a workload file take the Queue CRD's names
//! (`guaranteed`, `guaranteed_gpus_by_model`, `borrow`); the old names
//! still read, with a deprecation warning naming file and line, and give
//! the same queue; both spellings at once are an error.

use gpusched_sim::load::{Source, scenario};

const CLUSTER: &str = include_str!("../../../fixtures/clusters/tiny.yaml");

fn load(workload: &str) -> Result<gpusched_sim::Scenario, String> {
    scenario(
        Some(Source {
            name: "tiny.yaml",
            text: CLUSTER,
        }),
        Some(Source {
            name: "w.yaml",
            text: workload,
        }),
        1,
    )
    .map_err(|e| e.to_string())
}

#[test]
fn new_and_old_names_give_the_same_queue() {
    let new = load(
        "queues:\n  - name: a\n    guaranteed: {gpu: \"4\"}\n    guaranteed_gpus_by_model: {H100-SXM5-80GB: \"2\"}\n    borrow: false\njobs: []\n",
    )
    .unwrap();
    assert!(new.warnings.is_empty(), "{:?}", new.warnings);
    let old = load(
        "queues:\n  - name: a\n    guarantee: {gpu: \"4\"}\n    gpu_guarantee_by_model: {H100-SXM5-80GB: \"2\"}\n    can_borrow: false\njobs: []\n",
    )
    .unwrap();
    assert_eq!(new.queues, old.queues);
    let q = &new.queues[0];
    assert_eq!(q.guarantee.gpu_milli, 4000);
    assert_eq!(q.gpu_guarantee_by_model.get("H100-SXM5-80GB"), Some(&2000));
    assert!(!q.can_borrow);
    assert_eq!(old.warnings.len(), 3, "{:?}", old.warnings);
    assert!(
        old.warnings[0]
            .starts_with("w.yaml:2: queues[0].guarantee is deprecated: write guaranteed"),
        "{:?}",
        old.warnings
    );
    assert!(
        old.warnings
            .iter()
            .any(|w| w.contains("can_borrow") && w.contains("write borrow"))
    );
}

#[test]
fn both_spellings_are_refused() {
    let e = load("queues:\n  - name: a\n    borrow: true\n    can_borrow: false\njobs: []\n")
        .unwrap_err();
    assert!(e.contains("queues[0].can_borrow"), "{e}");
    assert!(e.contains("not both"), "{e}");
}

#[test]
fn the_shipped_workloads_use_the_new_names() {
    let dir = format!("{}/../../fixtures/workloads", env!("CARGO_MANIFEST_DIR"));
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let path = e.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        for old in ["guarantee:", "gpu_guarantee_by_model", "can_borrow"] {
            assert!(!text.contains(old), "{}: {old}", path.display());
        }
        n += 1;
    }
    assert!(n >= 5, "{n} workloads");
    // the embedded default loads without warnings
    let s = scenario(None, None, 1).unwrap();
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
}

//! Node feature labels in the GPU Feature Discovery vocabulary, plus our
//! topology facts under `gpusched.io/`, written as a node-feature-discovery
//! local feature file (`key=value` lines).

use crate::backend::Inventory;
use crate::config::{MigStrategy, Settings};
use gpusched_model::labels as l;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// GPU models that support MIG (hardware capability, whatever the mode).
fn mig_capable_model(model: &str) -> bool {
    let m = model.to_ascii_uppercase();
    [
        "A100", "A30", "H100", "H200", "H20", "H800", "B200", "GB200", "B100",
    ]
    .iter()
    .any(|k| m.contains(k))
}

/// Computes the labels of the node.
pub fn node_labels(inv: &Inventory, s: &Settings) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), v);
    };
    put(l::GFD_COUNT, inv.gpus.len().to_string());
    if let Some(g) = inv.gpus.first() {
        put(l::GFD_PRODUCT, g.model.clone());
        put(l::GFD_MEMORY, g.memory_mib.to_string());
    }
    let rep = s
        .replication
        .iter()
        .find(|r| r.name == l::RESOURCE_GPU)
        .map(|r| r.replicas)
        .unwrap_or(1);
    put(l::GFD_REPLICAS, rep.to_string());
    put(
        l::GFD_SHARING_STRATEGY,
        if s.replication.iter().any(|r| r.replicas > 1) {
            "time-slicing".into()
        } else {
            "none".into()
        },
    );
    let capable = inv
        .gpus
        .iter()
        .any(|g| g.mig_enabled || mig_capable_model(&g.model));
    put(l::GFD_MIG_CAPABLE, capable.to_string());
    put(
        "nvidia.com/mig.strategy",
        match s.mig_strategy {
            MigStrategy::None => "none",
            MigStrategy::Single => "single",
            MigStrategy::Mixed => "mixed",
        }
        .into(),
    );
    let mut dv = inv.driver_version.split('.');
    if let (Some(a), Some(b)) = (dv.next(), dv.next()) {
        put("nvidia.com/cuda.driver.major", a.into());
        put("nvidia.com/cuda.driver.minor", b.into());
        put("nvidia.com/cuda.driver.rev", dv.next().unwrap_or("").into());
    }
    put(
        "nvidia.com/cuda.driver-version.full",
        inv.driver_version.clone(),
    );
    let mut cv = inv.cuda_version.split('.');
    if let (Some(a), Some(b)) = (cv.next(), cv.next()) {
        put("nvidia.com/cuda.runtime.major", a.into());
        put("nvidia.com/cuda.runtime.minor", b.into());
    }
    put(
        "nvidia.com/cuda.runtime-version.full",
        inv.cuda_version.clone(),
    );
    let nvlink: BTreeSet<u32> = inv.gpus.iter().filter_map(|g| g.topo.nvlink).collect();
    let switches: BTreeSet<u32> = inv.gpus.iter().filter_map(|g| g.topo.pcie_switch).collect();
    let numa: BTreeSet<u32> = inv.gpus.iter().filter_map(|g| g.topo.numa).collect();
    let all_linked = !inv.gpus.is_empty() && inv.gpus.iter().all(|g| g.topo.nvlink.is_some());
    let interconnect = if nvlink.len() == 1 && all_linked && inv.gpus.len() > 2 {
        "nvswitch"
    } else if !nvlink.is_empty() {
        "nvlink"
    } else {
        "pcie"
    };
    put("gpusched.io/gpu.interconnect", interconnect.into());
    put("gpusched.io/gpu.nvlink-domains", nvlink.len().to_string());
    put("gpusched.io/gpu.pcie-switches", switches.len().to_string());
    put("gpusched.io/gpu.numa-nodes", numa.len().to_string());
    let mig_gpus = inv.gpus.iter().filter(|g| g.mig_enabled).count();
    put("gpusched.io/gpu.mig-enabled-count", mig_gpus.to_string());
    out
}

/// Renders labels as an NFD feature file.
pub fn render(labels: &BTreeMap<String, String>) -> String {
    let mut s = String::from("# written by gpusched agent\n");
    for (k, v) in labels {
        s.push_str(k);
        s.push('=');
        s.push_str(v);
        s.push('\n');
    }
    s
}

/// Writes the file atomically (temporary file + rename).
pub fn write_feature_file(path: &Path, labels: &BTreeMap<String, String>) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, render(labels))?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::fake::FakeBackend;

    #[test]
    fn dgx_labels() {
        let y = "nodes:\n  - name: n\n    cpu: \"8\"\n    memory: 64Gi\n    gpus: {count: 8, model: H100-SXM5-80GB, memory: 80Gi, interconnect: nvswitch, pcie_switches: 4, numa_nodes: 2}\n";
        let inv = FakeBackend::from_yaml(y, "t")
            .unwrap()
            .inventory_ref()
            .clone();
        let m = node_labels(&inv, &Settings::default());
        assert_eq!(m[l::GFD_PRODUCT], "H100-SXM5-80GB");
        assert_eq!(m[l::GFD_COUNT], "8");
        assert_eq!(m[l::GFD_MEMORY], "81920");
        assert_eq!(m[l::GFD_MIG_CAPABLE], "true");
        assert_eq!(m["gpusched.io/gpu.interconnect"], "nvswitch");
        assert_eq!(m["gpusched.io/gpu.pcie-switches"], "4");
        assert_eq!(m["nvidia.com/cuda.driver.major"], "550");
        assert!(render(&m).contains("nvidia.com/gpu.count=8\n"));
    }
}

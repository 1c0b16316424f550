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

/// GFD's architecture family of a compute capability.
pub fn gpu_family(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, m) if m < 5 => "volta",
        (7, _) => "turing",
        (8, m) if m < 9 => "ampere",
        (8, _) => "ada-lovelace",
        (9, _) => "hopper",
        (10, _) | (12, _) => "blackwell",
        _ => "undefined",
    }
}

/// A Kubernetes label value: at most 63 characters of `[A-Za-z0-9-_.]`,
/// starting and ending alphanumeric; other characters become `-`.
pub fn label_value(s: &str) -> String {
    let v: String = s
        .split_whitespace()
        .collect::<Vec<_>>()
        .join("-")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(63)
        .collect();
    v.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Compute slices (GPCs available to MIG) of a GPU model: 4 on an A30,
/// 7 on the A100, H100, H200 and B200 families (NVIDIA's MIG user guide,
/// *Supported MIG profiles*). A MIG instance of `g` slices measures
/// `⌊1000 · g / G⌋` of its GPU (`gpusched_model::sharing::mig_milli`).
pub fn gpu_compute_slices(model: &str) -> u32 {
    if model.to_ascii_uppercase().contains("A30") {
        4
    } else {
        7
    }
}

/// GPU instance and compute instance slices of a MIG profile:
/// `3g.40gb` → (3, 3), `1c.3g.40gb` → (3, 1).
pub fn mig_slices(profile: &str) -> Option<(u32, u32)> {
    let mut gi = None;
    let mut ci = None;
    for part in profile.split('.') {
        if let Some(n) = part.strip_suffix('g').and_then(|n| n.parse().ok()) {
            gi = Some(n);
        } else if let Some(n) = part.strip_suffix('c').and_then(|n| n.parse().ok()) {
            ci = Some(n);
        }
    }
    let gi = gi?;
    Some((gi, ci.unwrap_or(gi)))
}

/// How one advertised resource is shared, as GFD labels it.
struct Sharing {
    replicas: u32,
    /// Shared under its own name (not renamed): the product gets `-SHARED`.
    suffix: bool,
}

fn sharing_of(resource: &str, s: &Settings) -> Sharing {
    match s.replication.iter().find(|r| r.name == resource) {
        Some(r) if r.replicas > 1 => Sharing {
            replicas: r.replicas,
            suffix: r.advertised == r.name,
        },
        _ => Sharing {
            replicas: 1,
            suffix: false,
        },
    }
}

/// The labels of one resource under `prefix` (`nvidia.com/gpu`,
/// `nvidia.com/mig-1g.10gb`): product, count, memory, replicas, sharing
/// strategy, and MIG slices.
fn resource_labels(
    out: &mut BTreeMap<String, String>,
    prefix: &str,
    product: &str,
    count: usize,
    memory_mib: Option<u64>,
    slices: Option<(u32, u32)>,
    sharing: &Sharing,
) {
    let mut put = |k: &str, v: String| {
        out.insert(format!("{prefix}.{k}"), v);
    };
    let product = if sharing.suffix {
        format!("{product}-SHARED")
    } else {
        product.to_string()
    };
    put("product", label_value(&product));
    put("count", count.to_string());
    if let Some(m) = memory_mib {
        put("memory", m.to_string());
    }
    put("replicas", sharing.replicas.to_string());
    put(
        "sharing-strategy",
        if sharing.replicas > 1 {
            "time-slicing"
        } else {
            "none"
        }
        .into(),
    );
    if let Some((gi, ci)) = slices {
        put("slices.gi", gi.to_string());
        put("slices.ci", ci.to_string());
    }
}

/// Computes the labels of the node, as GPU Feature Discovery would for the
/// same devices and settings (so node selectors written for GFD keep
/// working), plus our topology facts under `gpusched.io/`.
///
/// * `migStrategy: none` (or `single` with no MIG GPU): `nvidia.com/gpu.*`
///   describe the whole GPUs.
/// * `single`: they describe the MIG devices: count of MIG devices, MIG
///   memory, product `<model>-MIG-<profile>`, `gpu.slices.gi/ci`.
/// * `mixed`: `nvidia.com/gpu.*` describe the GPUs not in MIG mode, and each
///   profile gets `nvidia.com/mig-<profile>.count/.memory/.product/
///   .slices.gi/.slices.ci/.replicas/.sharing-strategy`.
/// * time-slicing of a resource under its own name appends `-SHARED` to its
///   product (GFD does not when the shared resource is renamed).
pub fn node_labels(inv: &Inventory, s: &Settings) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let any_mig = inv.gpus.iter().any(|g| g.mig_enabled && !g.mig.is_empty());
    let gpu_sharing = sharing_of(l::RESOURCE_GPU, s);
    let whole = |out: &mut BTreeMap<String, String>, gpus: &[&crate::backend::GpuInfo]| {
        let first = gpus.first();
        resource_labels(
            out,
            l::RESOURCE_GPU,
            first.map(|g| g.model.as_str()).unwrap_or(""),
            gpus.len(),
            first.map(|g| g.memory_mib),
            None,
            &gpu_sharing,
        );
        if first.is_none() {
            out.remove(l::GFD_PRODUCT);
        }
    };
    match s.mig_strategy {
        MigStrategy::Single if any_mig => {
            let migs: Vec<(&crate::backend::GpuInfo, &crate::backend::MigInfo)> = inv
                .gpus
                .iter()
                .flat_map(|g| g.mig.iter().map(move |m| (g, m)))
                .collect();
            if let Some((g, m)) = migs.first() {
                resource_labels(
                    &mut out,
                    l::RESOURCE_GPU,
                    &format!("{}-MIG-{}", g.model, m.profile),
                    migs.len(),
                    Some(m.memory_mib),
                    mig_slices(&m.profile),
                    &gpu_sharing,
                );
            }
        }
        MigStrategy::Mixed => {
            let full: Vec<&crate::backend::GpuInfo> =
                inv.gpus.iter().filter(|g| !g.mig_enabled).collect();
            whole(&mut out, &full);
            let mut profiles: BTreeMap<
                &str,
                Vec<(&crate::backend::GpuInfo, &crate::backend::MigInfo)>,
            > = BTreeMap::new();
            for g in inv.gpus.iter().filter(|g| g.mig_enabled) {
                for m in &g.mig {
                    profiles.entry(m.profile.as_str()).or_default().push((g, m));
                }
            }
            for (profile, devs) in profiles {
                let resource = format!("{}{profile}", l::RESOURCE_MIG_PREFIX);
                if let Some((g, m)) = devs.first() {
                    resource_labels(
                        &mut out,
                        &resource,
                        &format!("{}-MIG-{profile}", g.model),
                        devs.len(),
                        Some(m.memory_mib),
                        mig_slices(profile),
                        &sharing_of(&resource, s),
                    );
                }
            }
        }
        MigStrategy::None | MigStrategy::Single => {
            let all: Vec<&crate::backend::GpuInfo> = inv.gpus.iter().collect();
            whole(&mut out, &all);
        }
    }
    let mut put = |k: &str, v: String| {
        out.insert(k.to_string(), v);
    };
    if let Some((major, minor)) = inv.gpus.first().and_then(|g| g.compute_capability) {
        put("nvidia.com/gpu.compute.major", major.to_string());
        put("nvidia.com/gpu.compute.minor", minor.to_string());
        put("nvidia.com/gpu.family", gpu_family(major, minor).into());
    }
    put(
        "nvidia.com/gpu.machine",
        inv.machine
            .as_deref()
            .map(label_value)
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| "unknown".into()),
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
        assert_eq!(m["nvidia.com/gpu.family"], "hopper");
        assert_eq!(m["nvidia.com/gpu.compute.major"], "9");
    }

    #[test]
    fn families_slices_and_label_values() {
        assert_eq!(gpu_family(7, 0), "volta");
        assert_eq!(gpu_family(7, 5), "turing");
        assert_eq!(gpu_family(8, 6), "ampere");
        assert_eq!(gpu_family(8, 9), "ada-lovelace");
        assert_eq!(gpu_family(10, 0), "blackwell");
        assert_eq!(gpu_family(42, 0), "undefined");
        assert_eq!(mig_slices("3g.40gb"), Some((3, 3)));
        assert_eq!(mig_slices("1c.3g.40gb"), Some((3, 1)));
        assert_eq!(mig_slices("weird"), None);
        assert_eq!(label_value(" DGX H100 "), "DGX-H100");
        assert_eq!(label_value("ProLiant (P1)"), "ProLiant--P1");
        assert_eq!(label_value(&"x".repeat(100)).len(), 63);
        use crate::backend::fake::compute_capability_of as cc;
        assert_eq!(cc("A100-SXM4-80GB"), Some((8, 0)));
        assert_eq!(cc("L40S"), Some((8, 9)));
        assert_eq!(cc("GB200"), Some((10, 0)));
        assert_eq!(cc("Mystery-9000"), None);
    }
}

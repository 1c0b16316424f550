//! Reading cluster and workload files, with errors that name the file, the
//! line and the field.

use crate::workload::{Ctx, Scenario, WorkloadFile};
use gpusched_model::Node;
use gpusched_model::spec::ClusterSpec;
use gpusched_model::yaml;
pub use gpusched_model::yaml::LoadError;

/// The embedded default cluster (also `fixtures/clusters/mixed.yaml`).
pub const DEFAULT_CLUSTER: &str = include_str!("../../../fixtures/clusters/mixed.yaml");
/// The embedded default workload (also `fixtures/workloads/mixed.yaml`).
pub const DEFAULT_WORKLOAD: &str = include_str!("../../../fixtures/workloads/mixed.yaml");

/// Parses a cluster file (`model::spec::ClusterSpec`) and builds its nodes.
pub fn parse_cluster(file: &str, text: &str) -> Result<Vec<Node>, LoadError> {
    let spec: ClusterSpec = yaml::parse(file, text)?;
    if spec.nodes.is_empty() {
        return Err(LoadError::file(file, "field `nodes`: no node groups"));
    }
    let located = |path: String, why: String| yaml::at_path(file, text, path, why);
    for (i, g) in spec.nodes.iter().enumerate() {
        if g.count == 0 {
            return Err(located(
                format!("nodes[{i}].count"),
                format!("node group {:?}: must be at least 1", g.name),
            ));
        }
    }
    spec.nodes().map_err(|e| {
        located(
            format!("nodes[{}].{}", e.index, e.field),
            format!("node group {:?}: {}", e.group, e.why),
        )
    })
}

/// Parses a workload file (schema in `docs/simulator.md`).
pub fn parse_workload(file: &str, text: &str) -> Result<WorkloadFile, LoadError> {
    yaml::parse(file, text)
}

/// Reads a file, naming it in the error.
pub fn read(path: &std::path::Path) -> Result<String, LoadError> {
    yaml::read(path)
}

/// A file's name and text.
#[derive(Clone, Copy, Debug)]
pub struct Source<'a> {
    /// Name shown in errors (the path, or `<embedded …>`).
    pub name: &'a str,
    /// The file's contents.
    pub text: &'a str,
}

/// Builds a scenario from a cluster file and a workload file (either
/// defaults to the embedded mixed cluster / workload). Random parts of the
/// workload come from `seed`.
pub fn scenario(
    cluster: Option<Source<'_>>,
    workload: Option<Source<'_>>,
    seed: u64,
) -> Result<Scenario, LoadError> {
    let c = cluster.unwrap_or(Source {
        name: "<default cluster>",
        text: DEFAULT_CLUSTER,
    });
    let w = workload.unwrap_or(Source {
        name: "<default workload>",
        text: DEFAULT_WORKLOAD,
    });
    let nodes = parse_cluster(c.name, c.text)?;
    let wf = parse_workload(w.name, w.text)?;
    let ctx = Ctx {
        file: w.name,
        text: w.text,
    };
    wf.expand(&ctx, nodes, seed)
}

/// The embedded default scenario (mixed cluster, mixed workload).
pub fn default_scenario(seed: u64) -> Scenario {
    match scenario(None, None, seed) {
        Ok(s) => s,
        // The embedded files are checked by tests; this cannot happen in a
        // released build.
        Err(e) => panic!("embedded default scenario is invalid: {e}"),
    }
}

/// The repository's `fixtures/` directory (as seen from this crate's
/// sources), for tests and benchmarks.
pub const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fixtures");

/// A scenario from files (either defaults to the embedded one), errors
/// naming the file.
pub fn scenario_files(
    cluster: Option<&std::path::Path>,
    workload: Option<&std::path::Path>,
    seed: u64,
) -> Result<Scenario, LoadError> {
    let c = cluster.map(|p| Ok::<_, LoadError>((p.display().to_string(), read(p)?)));
    let c = c.transpose()?;
    let w = workload.map(|p| Ok::<_, LoadError>((p.display().to_string(), read(p)?)));
    let w = w.transpose()?;
    scenario(
        c.as_ref().map(|(n, t)| Source { name: n, text: t }),
        w.as_ref().map(|(n, t)| Source { name: n, text: t }),
        seed,
    )
}

/// A scenario from `fixtures/clusters/<cluster>` and
/// `fixtures/workloads/<workload>` (e.g. `("dgx-h100.yaml",
/// "preemption.yaml")`).
pub fn fixture_scenario(cluster: &str, workload: &str, seed: u64) -> Result<Scenario, LoadError> {
    let dir = std::path::Path::new(FIXTURES);
    scenario_files(
        Some(&dir.join("clusters").join(cluster)),
        Some(&dir.join("workloads").join(workload)),
        seed,
    )
}

//! Alibaba GPU trace v2023 ("openb") CSV parsing.
//!
//! Columns are found by header name, so every public variant of the pod list
//! parses (the `multigpu` ones carry only the first five columns).
//!
//! - Node lists `sn,cpu_milli,memory_mib,gpu,model` become [`Node`]s: `gpu`
//!   GPUs of `model`, PCIe topology (two GPUs per PCIe switch, two NUMA
//!   nodes from 8 GPUs up), GPU memory from [`gpu_memory_mib`], GPU Feature
//!   Discovery labels (`nvidia.com/gpu.product`, `.count`, `.memory`).
//! - Pod lists `name,cpu_milli,memory_mib,num_gpu,gpu_milli[,gpu_spec,qos,
//!   pod_phase,creation_time,deletion_time,scheduled_time]` become
//!   [`TracePod`]s: `num_gpu == 1 && gpu_milli < 1000` is a share of one GPU
//!   ([`GpuRequest::Share`]), `num_gpu ≥ 1` with `gpu_milli == 1000` is
//!   `num_gpu` whole GPUs, `num_gpu == 0` (or `gpu_milli == 0`) no GPU.
//!   `gpu_spec` is a `|`-separated set of allowed models (may repeat, may be
//!   empty), de-duplicated into [`Pod::gpu_models`].
//!
//! Every error names the file, the line and the column; nothing panics on
//! bad input.

use gpusched_model::topology::shapes;
use gpusched_model::{Gpu, GpuHealth, GpuRequest, Node, Pod, ResourceVec, labels};
use std::path::Path;

/// Memory of one GPU of a model, in MiB (nominal sizes; the trace does not
/// say). `G2` and `G3` are anonymised models of the trace: we assume 16 GiB
/// and 32 GiB. Unknown models: 16 GiB. Only memory-based shares depend on
/// it; the openb pods ask shares by compute (`gpu_milli`).
pub fn gpu_memory_mib(model: &str) -> u64 {
    match model {
        "V100M16" | "P100" | "T4" | "G2" => 16 * 1024,
        "V100M32" | "G3" => 32 * 1024,
        "A10" => 24 * 1024,
        "A100" => 80 * 1024,
        _ => 16 * 1024,
    }
}

/// A parse error; `file` is the name given to the parser.
#[derive(Debug, thiserror::Error)]
pub enum OpenbError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No header line.
    #[error("{file}: empty file (no header line)")]
    Empty {
        /// The file.
        file: String,
    },
    /// A required column is missing from the header.
    #[error("{file}:1: header has no column {column:?}")]
    MissingColumn {
        /// The file.
        file: String,
        /// The column looked for.
        column: &'static str,
    },
    /// A line is not valid CSV.
    #[error("{file}:{line}: malformed CSV: {message}")]
    Csv {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// What the CSV reader said.
        message: String,
    },
    /// A value cannot be read.
    #[error("{file}:{line}: column {column:?}: {message}")]
    Field {
        /// The file.
        file: String,
        /// 1-based line.
        line: u64,
        /// The column.
        column: &'static str,
        /// Why the value was refused.
        message: String,
    },
    /// A header but no data.
    #[error("{file}: no data rows")]
    NoRows {
        /// The file.
        file: String,
    },
}

/// One pod of a trace with the fields the scheduler does not use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TracePod {
    /// The pod as the scheduler sees it.
    pub pod: Pod,
    /// The trace's QoS class.
    pub qos: Option<String>,
    /// The pod's phase in the trace.
    pub phase: Option<String>,
    /// Seconds since the start of the trace.
    pub creation_time_s: Option<u64>,
    /// Seconds since the start of the trace.
    pub deletion_time_s: Option<u64>,
    /// Seconds since the start of the trace.
    pub scheduled_time_s: Option<u64>,
}

struct Table<'a> {
    file: &'a str,
    headers: csv::StringRecord,
    rows: Vec<(u64, csv::StringRecord)>,
}

fn read_table<'a>(file: &'a str, text: &str) -> Result<Table<'a>, OpenbError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(true)
        .trim(csv::Trim::All)
        .from_reader(text.as_bytes());
    let csv_err = |e: csv::Error| {
        let line = e.position().map(|p| p.line()).unwrap_or(0);
        let message = match e.kind() {
            csv::ErrorKind::UnequalLengths {
                expected_len, len, ..
            } => format!("{len} fields where the header has {expected_len}"),
            _ => e.to_string(),
        };
        OpenbError::Csv {
            file: file.to_string(),
            line,
            message,
        }
    };
    let headers = rdr.headers().map_err(csv_err)?.clone();
    if headers.is_empty() || (headers.len() == 1 && headers[0].is_empty()) {
        return Err(OpenbError::Empty {
            file: file.to_string(),
        });
    }
    let mut rows = Vec::new();
    for rec in rdr.records() {
        let rec = rec.map_err(csv_err)?;
        if rec.len() == 1 && rec[0].is_empty() {
            continue;
        }
        let line = rec.position().map(|p| p.line()).unwrap_or(0);
        rows.push((line, rec));
    }
    if rows.is_empty() {
        return Err(OpenbError::NoRows {
            file: file.to_string(),
        });
    }
    Ok(Table {
        file,
        headers,
        rows,
    })
}

impl Table<'_> {
    fn col(&self, name: &'static str) -> Result<usize, OpenbError> {
        self.opt_col(name).ok_or(OpenbError::MissingColumn {
            file: self.file.to_string(),
            column: name,
        })
    }

    fn opt_col(&self, name: &str) -> Option<usize> {
        self.headers.iter().position(|h| h == name)
    }

    fn field_err(&self, line: u64, column: &'static str, message: String) -> OpenbError {
        OpenbError::Field {
            file: self.file.to_string(),
            line,
            column,
            message,
        }
    }

    fn num(
        &self,
        line: u64,
        rec: &csv::StringRecord,
        idx: usize,
        column: &'static str,
    ) -> Result<u64, OpenbError> {
        let s = rec.get(idx).unwrap_or("");
        if s.is_empty() {
            return Err(self.field_err(line, column, "empty, expected a number".into()));
        }
        s.parse::<u64>().map_err(|_| {
            self.field_err(line, column, format!("{s:?} is not a non-negative integer"))
        })
    }

    fn opt_num(
        &self,
        line: u64,
        rec: &csv::StringRecord,
        idx: Option<usize>,
        column: &'static str,
    ) -> Result<Option<u64>, OpenbError> {
        match idx.and_then(|i| rec.get(i)) {
            None | Some("") => Ok(None),
            Some(_) => self.num(line, rec, idx.unwrap_or(0), column).map(Some),
        }
    }

    fn opt_str(rec: &csv::StringRecord, idx: Option<usize>) -> Option<String> {
        idx.and_then(|i| rec.get(i))
            .filter(|s| !s.is_empty())
            .map(str::to_string)
    }
}

/// Parses a node list; `file` names the source in errors.
pub fn parse_nodes(file: &str, text: &str) -> Result<Vec<Node>, OpenbError> {
    let t = read_table(file, text)?;
    let (c_sn, c_cpu, c_mem, c_gpu, c_model) = (
        t.col("sn")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("gpu")?,
        t.col("model")?,
    );
    let mut nodes = Vec::with_capacity(t.rows.len());
    let mut seen = std::collections::HashSet::new();
    for (line, rec) in &t.rows {
        let line = *line;
        let name = rec.get(c_sn).unwrap_or("").to_string();
        if name.is_empty() {
            return Err(t.field_err(line, "sn", "empty node name".into()));
        }
        if !seen.insert(name.clone()) {
            return Err(t.field_err(line, "sn", format!("duplicate node name {name:?}")));
        }
        let cpu = t.num(line, rec, c_cpu, "cpu_milli")?;
        let mem = t.num(line, rec, c_mem, "memory_mib")?;
        let count = t.num(line, rec, c_gpu, "gpu")?;
        if count > 64 {
            return Err(t.field_err(
                line,
                "gpu",
                format!("{count} GPUs on one node (at most 64)"),
            ));
        }
        let model = rec.get(c_model).unwrap_or("").to_string();
        if count > 0 && model.is_empty() {
            return Err(t.field_err(line, "model", "empty, but the node has GPUs".into()));
        }
        let n = count as usize;
        let gmem = gpu_memory_mib(&model);
        let topos = shapes::pcie(n, n.div_ceil(2).max(1), if n >= 8 { 2 } else { 1 });
        let gpus: Vec<Gpu> = topos
            .into_iter()
            .enumerate()
            .map(|(i, topo)| Gpu {
                index: i as u32,
                uuid: format!("{name}-gpu{i}"),
                model: model.clone(),
                memory_mib: gmem,
                health: GpuHealth::Healthy,
                topo,
                mig: Vec::new(),
            })
            .collect();
        let mut node = Node::new(
            name,
            ResourceVec::new(cpu, mem.saturating_mul(1 << 20), 0),
            gpus,
        );
        if n > 0 {
            node.labels
                .insert(labels::GFD_PRODUCT.to_string(), model.clone());
            node.labels
                .insert(labels::GFD_COUNT.to_string(), n.to_string());
            node.labels
                .insert(labels::GFD_MEMORY.to_string(), gmem.to_string());
        }
        nodes.push(node);
    }
    Ok(nodes)
}

/// Parses a pod list; `file` names the source in errors.
pub fn parse_pods(file: &str, text: &str) -> Result<Vec<TracePod>, OpenbError> {
    let t = read_table(file, text)?;
    let (c_name, c_cpu, c_mem, c_num, c_milli) = (
        t.col("name")?,
        t.col("cpu_milli")?,
        t.col("memory_mib")?,
        t.col("num_gpu")?,
        t.col("gpu_milli")?,
    );
    let c_spec = t.opt_col("gpu_spec");
    let c_qos = t.opt_col("qos");
    let c_phase = t.opt_col("pod_phase");
    let c_ct = t.opt_col("creation_time");
    let c_dt = t.opt_col("deletion_time");
    let c_st = t.opt_col("scheduled_time");
    let mut pods = Vec::with_capacity(t.rows.len());
    for (line, rec) in &t.rows {
        let line = *line;
        let name = rec.get(c_name).unwrap_or("").to_string();
        if name.is_empty() {
            return Err(t.field_err(line, "name", "empty pod name".into()));
        }
        let cpu = t.num(line, rec, c_cpu, "cpu_milli")?;
        let mem = t.num(line, rec, c_mem, "memory_mib")?;
        let num = t.num(line, rec, c_num, "num_gpu")?;
        let milli = t.num(line, rec, c_milli, "gpu_milli")?;
        if milli > 1000 {
            return Err(t.field_err(line, "gpu_milli", format!("{milli} is more than 1000")));
        }
        if num > 64 {
            return Err(t.field_err(line, "num_gpu", format!("{num} GPUs (at most 64)")));
        }
        let gpu = if num == 0 || milli == 0 {
            GpuRequest::None
        } else if milli < 1000 {
            if num != 1 {
                return Err(t.field_err(
                    line,
                    "gpu_milli",
                    format!("a share ({milli} < 1000) of {num} GPUs; shares are of one GPU"),
                ));
            }
            GpuRequest::Share {
                milli: milli as u32,
                memory_mib: 0,
            }
        } else {
            GpuRequest::Whole(num as u32)
        };
        let mut models: Vec<String> = Table::opt_str(rec, c_spec)
            .map(|s| {
                s.split('|')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        models.sort();
        models.dedup();
        let creation = t.opt_num(line, rec, c_ct, "creation_time")?;
        let mut pod = Pod::new(name, "default");
        pod.requests = ResourceVec::new(cpu, mem.saturating_mul(1 << 20), 0);
        pod.gpu = gpu;
        pod.gpu_models = models;
        pod.arrival_ms = creation.unwrap_or(0).saturating_mul(1000);
        pods.push(TracePod {
            pod,
            qos: Table::opt_str(rec, c_qos),
            phase: Table::opt_str(rec, c_phase),
            creation_time_s: creation,
            deletion_time_s: t.opt_num(line, rec, c_dt, "deletion_time")?,
            scheduled_time_s: t.opt_num(line, rec, c_st, "scheduled_time")?,
        });
    }
    Ok(pods)
}

fn read(path: &Path) -> Result<String, OpenbError> {
    std::fs::read_to_string(path).map_err(|source| OpenbError::Io {
        file: path.display().to_string(),
        source,
    })
}

/// Reads and parses a node list file.
pub fn read_nodes(path: &Path) -> Result<Vec<Node>, OpenbError> {
    parse_nodes(&path.display().to_string(), &read(path)?)
}

/// Reads and parses a pod list file.
pub fn read_pods(path: &Path) -> Result<Vec<TracePod>, OpenbError> {
    parse_pods(&path.display().to_string(), &read(path)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_parse_by_header_name() {
        let text =
            "model,gpu,sn,memory_mib,cpu_milli\nV100M32,8,n0,786432,96000\n,0,cpu0,1024,4000\n";
        let nodes = parse_nodes("n.csv", text).unwrap();
        assert_eq!(nodes.len(), 2);
        let n = &nodes[0];
        assert_eq!(n.name, "n0");
        assert_eq!(n.gpus.len(), 8);
        assert_eq!(n.gpus[0].model, "V100M32");
        assert_eq!(n.gpus[0].memory_mib, 32768);
        assert_eq!(n.allocatable.cpu_milli, 96000);
        assert_eq!(n.allocatable.memory, 786432 << 20);
        assert_eq!(n.allocatable.gpu_milli, 8000);
        assert_eq!(n.gpus[0].topo.pcie_switch, n.gpus[1].topo.pcie_switch);
        assert_ne!(n.gpus[1].topo.pcie_switch, n.gpus[2].topo.pcie_switch);
        assert!(n.gpus.iter().all(|g| g.topo.nvlink.is_none()));
        assert!(nodes[1].gpus.is_empty());
    }

    #[test]
    fn pods_full_and_five_column_variants() {
        let full = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
            p0,12000,16384,1,1000,,LS,Running,0,12537496,0\n\
            p1,6000,12288,1,460,V100M16|V100M32|V100M16,BE,Pending,427061,12902960,\n\
            p2,88000,327680,8,1000,,LS,Running,5,6,5\n\
            p3,4000,0,0,0,,BE,Succeeded,1,2,1\n";
        let pods = parse_pods("p.csv", full).unwrap();
        assert_eq!(pods.len(), 4);
        assert_eq!(pods[0].pod.gpu, GpuRequest::Whole(1));
        assert_eq!(
            pods[1].pod.gpu,
            GpuRequest::Share {
                milli: 460,
                memory_mib: 0
            }
        );
        assert_eq!(pods[1].pod.gpu_models, vec!["V100M16", "V100M32"]);
        assert_eq!(pods[1].scheduled_time_s, None);
        assert_eq!(pods[1].phase.as_deref(), Some("Pending"));
        assert_eq!(pods[1].pod.arrival_ms, 427_061_000);
        assert_eq!(pods[2].pod.gpu, GpuRequest::Whole(8));
        assert_eq!(pods[3].pod.gpu, GpuRequest::None);
        assert_eq!(pods[3].pod.requests.memory, 0);
        let five = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\nq0,8000,30000,2,1000\n";
        let pods = parse_pods("m.csv", five).unwrap();
        assert_eq!(pods[0].pod.gpu, GpuRequest::Whole(2));
        assert!(pods[0].pod.gpu_models.is_empty());
        assert_eq!(pods[0].creation_time_s, None);
    }

    fn err(r: Result<Vec<TracePod>, OpenbError>) -> String {
        r.unwrap_err().to_string()
    }

    #[test]
    fn bad_inputs_name_file_line_and_column() {
        assert_eq!(
            err(parse_pods("e.csv", "")),
            "e.csv: empty file (no header line)"
        );
        assert_eq!(
            err(parse_pods("h.csv", "name,cpu_milli\n")),
            "h.csv: no data rows"
        );
        assert_eq!(
            err(parse_pods(
                "h.csv",
                "name,cpu_milli,memory_mib,num_gpu\np,1,1,1\n"
            )),
            "h.csv:1: header has no column \"gpu_milli\""
        );
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1000\np1,x1,1,1,1000\n",
        ));
        assert_eq!(
            e,
            "b.csv:3: column \"cpu_milli\": \"x1\" is not a non-negative integer"
        );
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,-5,1,1000\n",
        ));
        assert!(e.starts_with("b.csv:2: column \"memory_mib\""), "{e}");
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n",
        ));
        assert!(e.starts_with("b.csv:2: column \"gpu_milli\""), "{e}");
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,1001\n",
        ));
        assert!(e.contains("more than 1000"), "{e}");
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1\n",
        ));
        assert!(e.starts_with("b.csv:2: malformed CSV"), "{e}");
        let e = err(parse_pods(
            "b.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,,1,1,1000\n",
        ));
        assert!(e.contains("empty, expected a number"), "{e}");
        let e = err(parse_pods(
            "t.csv",
            "name,cpu_milli,memory_mib,num_gpu,gpu_milli,creation_time\np0,1,1,1,1000,1.5\n",
        ));
        assert!(e.starts_with("t.csv:2: column \"creation_time\""), "{e}");
    }

    #[test]
    fn bad_node_lists() {
        let e = parse_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu\nn0,1,1,1\n")
            .unwrap_err()
            .to_string();
        assert_eq!(e, "n.csv:1: header has no column \"model\"");
        let e = parse_nodes("n.csv", "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,\n")
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("n.csv:2: column \"model\""), "{e}");
        let e = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,2,T4\nn0,1,1,2,T4\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("duplicate node name"), "{e}");
        let e = parse_nodes(
            "n.csv",
            "sn,cpu_milli,memory_mib,gpu,model\nn0,1,1,two,T4\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("n.csv:2: column \"gpu\""), "{e}");
        let e = read_nodes(Path::new("/nonexistent/x.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("/nonexistent/x.csv: cannot read"), "{e}");
    }
}

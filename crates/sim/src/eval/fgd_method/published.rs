//! The published figures of the FGD paper's artifact
//! (`analysis_allo_discrete.csv`) and the names its policies have there.

/// Our policy name for a published `sc_policy` (`"06-FGD"` → `"fgd"`).
pub fn published_policy_name(sc_policy: &str) -> Option<&'static str> {
    let base = sc_policy.split_once('-').map_or(sc_policy, |(_, b)| b);
    Some(match base {
        "Random" => "random",
        "DotProd" => "dot-prod",
        "GpuClustering" => "gpu-clustering",
        "GpuPacking" => "gpu-packing",
        "BestFit" => "best-fit",
        "FGD" => "fgd",
        _ => return None,
    })
}

/// Published alloc % at 100 % arrived for one workload, per policy (our
/// names) as `(seed, value)` pairs, from the reference's
/// `analysis_allo_discrete.csv` (columns `workload, sc_policy, tune, seed,
/// …, 100, …`). An empty map: the workload is not in the file.
pub fn parse_published(
    file: &str,
    text: &str,
    workload: &str,
) -> Result<std::collections::BTreeMap<String, Vec<(u64, f64)>>, crate::openb::OpenbError> {
    use crate::openb::OpenbError;
    let mut rdr = csv::ReaderBuilder::new().from_reader(text.as_bytes());
    let headers = rdr
        .headers()
        .map_err(|e| OpenbError::Csv {
            file: file.to_string(),
            line: 1,
            message: e.to_string(),
        })?
        .clone();
    let col = |name: &'static str| {
        headers
            .iter()
            .position(|h| h == name)
            .ok_or(OpenbError::MissingColumn {
                file: file.to_string(),
                column: name,
            })
    };
    let (cw, cp, cs, c100) = (
        col("workload")?,
        col("sc_policy")?,
        col("seed")?,
        col("100")?,
    );
    let mut out: std::collections::BTreeMap<String, Vec<(u64, f64)>> = Default::default();
    for rec in rdr.records() {
        let rec = rec.map_err(|e| OpenbError::Csv {
            file: file.to_string(),
            line: e.position().map_or(0, |p| p.line()),
            message: e.to_string(),
        })?;
        let line = rec.position().map_or(0, |p| p.line());
        if rec.get(cw) != Some(workload) {
            continue;
        }
        let Some(policy) = rec.get(cp).and_then(published_policy_name) else {
            continue;
        };
        let field = |c: usize, column: &'static str| {
            let s = rec.get(c).unwrap_or("");
            s.parse::<f64>().map_err(|_| OpenbError::Field {
                file: file.to_string(),
                line,
                column,
                message: format!("{s:?} is not a number"),
            })
        };
        let seed = field(cs, "seed")? as u64;
        let v = field(c100, "100")?;
        out.entry(policy.to_string()).or_default().push((seed, v));
    }
    Ok(out)
}

//! `gpusched simulate --openb NODES.csv PODS.csv`: the FGD evaluation method.
//!
//! Runs every requested packing policy over the seeds with the method of
//! DESIGN.md §5 and prints one table: mean ± stdev of the GPU allocation
//! ratio when the arrived GPU demand reaches 100 % of capacity, next to the
//! published means of the FGD paper's artifact where it has the policy.

use anyhow::Context;
use clap::Args;
use gpusched_plugins::packing::gpusched::GpuschedConfig;
use gpusched_plugins::packing::{POLICY_NAMES, PackingConfig};
use gpusched_sim::eval::MethodResult;
use gpusched_sim::eval::consolidate_method::{BudgetRow, budget_table};
use gpusched_sim::eval::fgd_method::{self, FgdMethod, TieBreak};
use gpusched_sim::eval::variants::{self, Variant};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(Args, Debug, Clone, Default)]
pub struct OpenbArgs {
    /// Run the FGD evaluation method on an openb trace: NODES.csv PODS.csv.
    #[arg(long, help_heading = "FGD evaluation on an openb trace (--openb)", num_args = 2, value_names = ["NODES_CSV", "PODS_CSV"])]
    pub openb: Option<Vec<PathBuf>>,
    /// Policies to compare: `all` or a comma-separated list of
    /// spread, binpack, random, dot-prod, gpu-clustering, gpu-packing,
    /// best-fit, fgd, gpusched.
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        default_value = "all",
        requires = "openb"
    )]
    pub policies: String,
    /// Seeds: a range `42-51` or a list `42,43`.
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        default_value = "42-51",
        requires = "openb"
    )]
    pub seeds: String,
    /// Print the result as JSON on stdout (with --openb: per-seed curves
    /// included; without: the simulator's result).
    #[arg(long)]
    pub json: bool,
    /// The FGD artifact's analysis_allo_discrete.csv (default: next to the
    /// trace directory, ../fgd-published-results/).
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        requires = "openb"
    )]
    pub published: Option<PathBuf>,
    /// How equal scores are split: permuted (first in a seeded random node
    /// order, like the reference), random (per decision, upstream
    /// kube-scheduler) or lowest-id (the gpusched core).
    #[arg(long, help_heading = "FGD evaluation on an openb trace (--openb)", default_value = "permuted", value_parser = ["permuted", "random", "lowest-id"], requires = "openb")]
    pub tie_break: String,
    /// Target GPU request as a multiple of capacity.
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        default_value_t = 1.3,
        requires = "openb"
    )]
    pub tune_ratio: f64,
    /// Show progress (runs done of all, elapsed, ETA) on stderr as a line
    /// per finished run even when stderr is not a terminal (on a terminal
    /// a progress bar shows without this flag). Never on stdout.
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        requires = "openb"
    )]
    pub progress: bool,
    /// Worker threads (0: all cores).
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        default_value_t = 0,
        requires = "openb"
    )]
    pub threads: usize,
    /// Consolidation moves allowed per 100 pods placed, one run per value
    /// (`0,1,2,5`): prints the move-budget table instead (every placed pod
    /// may be moved; see `gpusched_sim::eval::consolidate_method`). 0: off.
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        default_value = "0",
        requires = "openb"
    )]
    pub move_budget: String,
    /// Run trace variants built from PODS.csv instead of PODS.csv itself:
    /// `all` (the published family: cpu050…multigpu50) or a comma-separated
    /// list such as `gpushare40,gpuspec10` (gpusched_sim::eval::variants).
    #[arg(
        long,
        help_heading = "FGD evaluation on an openb trace (--openb)",
        requires = "openb"
    )]
    pub variants: Option<String>,
    /// Seed of the variant construction.
    #[arg(long, help_heading = "FGD evaluation on an openb trace (--openb)", default_value_t = variants::DEFAULT_VARIANT_SEED, requires = "openb")]
    pub variant_seed: u64,
}

impl OpenbArgs {
    pub fn is_requested(&self) -> bool {
        self.openb.is_some()
    }
}

/// Parses a move budget list `0,1,2,5`.
fn parse_budgets(s: &str) -> anyhow::Result<Vec<u32>> {
    let v = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.parse::<u32>()
                .with_context(|| format!("--move-budget: {p:?} is not a whole number"))
        })
        .collect::<anyhow::Result<Vec<u32>>>()?;
    anyhow::ensure!(!v.is_empty(), "--move-budget: no value in {s:?}");
    Ok(v)
}

/// Parses `42-51` or `42,43,50`.
pub fn parse_seeds(s: &str) -> anyhow::Result<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        if let Some((a, b)) = part.split_once('-') {
            let a: u64 = a
                .trim()
                .parse()
                .with_context(|| format!("bad seed {a:?}"))?;
            let b: u64 = b
                .trim()
                .parse()
                .with_context(|| format!("bad seed {b:?}"))?;
            anyhow::ensure!(a <= b, "empty seed range {part:?}");
            anyhow::ensure!(b - a < 100_000, "seed range {part:?} too long");
            out.extend(a..=b);
        } else {
            out.push(part.parse().with_context(|| format!("bad seed {part:?}"))?);
        }
    }
    anyhow::ensure!(!out.is_empty(), "no seeds in {s:?}");
    Ok(out)
}

fn parse_policies(s: &str) -> anyhow::Result<Vec<String>> {
    if s.trim() == "all" {
        return Ok(POLICY_NAMES.iter().map(|s| s.to_string()).collect());
    }
    let v: Vec<String> = s
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for p in &v {
        anyhow::ensure!(
            POLICY_NAMES.contains(&p.as_str()),
            "unknown policy {p:?} (known: {})",
            POLICY_NAMES.join(", ")
        );
    }
    anyhow::ensure!(!v.is_empty(), "no policies in {s:?}");
    Ok(v)
}

fn default_published(pods: &Path) -> PathBuf {
    pods.parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("."))
        .join("fgd-published-results")
        .join("analysis_allo_discrete.csv")
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonOut<'a> {
    nodes_csv: String,
    pods_csv: String,
    workload: String,
    seeds: &'a [u64],
    tie_break: &'a str,
    results: Vec<JsonPolicy<'a>>,
}

#[derive(serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct JsonPolicy<'a> {
    policy: &'a str,
    mean: f64,
    stdev: f64,
    published_mean: Option<f64>,
    seconds: f64,
    result: &'a MethodResult,
}

/// One workload's runs: (policy, result, seconds) per policy.
type Rows = Vec<(String, MethodResult, f64)>;

/// The published means of one workload, by policy and seed.
type Published = BTreeMap<String, Vec<(u64, f64)>>;

fn published_for(text: Option<&(PathBuf, String)>, workload: &str) -> anyhow::Result<Published> {
    match text {
        Some((path, text)) => Ok(fgd_method::parse_published(
            &path.display().to_string(),
            text,
            workload,
        )?),
        None => Ok(BTreeMap::new()),
    }
}

/// Mean of the published runs of `policy` (over our seeds where it has
/// them, else over all of its seeds).
fn published_mean(published: &Published, policy: &str, seeds: &[u64]) -> Option<f64> {
    let v = published.get(policy)?;
    let matching: Vec<f64> = v
        .iter()
        .filter(|(s, _)| seeds.contains(s))
        .map(|x| x.1)
        .collect();
    let use_v: Vec<f64> = if matching.is_empty() {
        v.iter().map(|x| x.1).collect()
    } else {
        matching
    };
    Some(gpusched_sim::eval::mean_stdev(use_v).0)
}

/// Progress over the runs of one invocation (a run: one policy over every
/// seed, for one variant or move budget): N of M, elapsed and an ETA from
/// the mean run so far, on stderr only — a bar when stderr is a terminal,
/// a line per finished run with `--progress` otherwise, nothing else.
struct Progress {
    total: usize,
    done: usize,
    start: Instant,
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
}

impl Progress {
    fn new(total: usize, flag: bool) -> Self {
        use std::io::IsTerminal;
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = indicatif::ProgressBar::with_draw_target(
                Some(total as u64),
                indicatif::ProgressDrawTarget::stderr(),
            );
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{wide_bar}] {pos}/{len} runs, ETA {eta} {msg}",
            ) {
                b.set_style(style.progress_chars("=> "));
            }
            b
        });
        Progress {
            total,
            done: 0,
            start: Instant::now(),
            lines: flag && bar.is_none(),
            bar,
        }
    }

    /// A run begins.
    fn begin(&self, what: &str) {
        if let Some(b) = &self.bar {
            b.set_message(what.to_string());
        }
    }

    /// A run ended after `secs`; `note` (when not quiet) is its line.
    fn end(&mut self, note: Option<String>) {
        self.done += 1;
        match &self.bar {
            Some(b) => {
                if let Some(n) = note {
                    b.println(n);
                }
                b.inc(1);
            }
            None => {
                if let Some(n) = note {
                    eprintln!("{n}");
                }
                if self.lines {
                    eprintln!("{}", self.line());
                }
            }
        }
    }

    /// `progress: 3 of 12 runs, 1m 20s elapsed, ETA 4m` (the ETA: the mean
    /// run so far times the runs left).
    fn line(&self) -> String {
        let elapsed = self.start.elapsed().as_millis() as u64;
        let left = (self.total - self.done.min(self.total)) as u64;
        let eta = elapsed / self.done.max(1) as u64 * left;
        format!(
            "progress: {} of {} runs, {} elapsed, ETA {}",
            self.done,
            self.total,
            gpusched_model::duration::fmt_duration(elapsed),
            gpusched_model::duration::fmt_duration(eta)
        )
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

fn run_policies(
    method: &FgdMethod,
    nodes: &[gpusched_model::Node],
    pods: &[gpusched_model::Pod],
    policies: &[String],
    seeds: &[u64],
    quiet: bool,
    progress: &mut Progress,
) -> anyhow::Result<Rows> {
    let mut rows = Vec::new();
    for p in policies {
        progress.begin(p);
        let t0 = Instant::now();
        let r = fgd_method::run(method, nodes, pods, p, seeds)?;
        let secs = t0.elapsed().as_secs_f64();
        progress.end((!quiet).then(|| format!("  {p}: {secs:.1} s")));
        rows.push((p.clone(), r, secs));
    }
    Ok(rows)
}

fn json_policies<'a>(rows: &'a Rows, published: &Published, seeds: &[u64]) -> Vec<JsonPolicy<'a>> {
    rows.iter()
        .map(|(p, r, secs)| {
            let (mean, stdev) = r.headline();
            JsonPolicy {
                policy: p,
                mean,
                stdev,
                published_mean: published_mean(published, p, seeds),
                seconds: *secs,
                result: r,
            }
        })
        .collect()
}

fn print_table(rows: &Rows, published: &Published, seeds: &[u64]) {
    println!(
        "{:<16} {:>18} {:>10} {:>7} {:>10} {:>8}",
        "policy", "alloc@100% (ours)", "published", "diff", "frag@100%", "time"
    );
    for (p, r, secs) in rows {
        let (m, sd) = r.headline();
        let (pm, diff) = match published_mean(published, p, seeds) {
            Some(x) => (format!("{x:.2}"), format!("{:+.2}", m - x)),
            None => ("-".to_string(), "".to_string()),
        };
        let frag = r
            .frag_at(100)
            .map_or("-".to_string(), |f| format!("{f:.2}"));
        println!(
            "{:<16} {:>18} {:>10} {:>7} {:>10} {:>7.1}s",
            p,
            format!("{m:.2} ± {sd:.2}"),
            pm,
            diff,
            frag,
            secs
        );
    }
}

/// The `gpusched` policy's arguments from a scheduler configuration
/// (`--config` with `--openb`). The configuration is checked whole, as the
/// scheduler would (version, filters, argument domains); the FGD method
/// then reads its `packing` section only, which must name gpusched, the one
/// policy with arguments (the policies compared are `--policies`).
fn gpusched_args(path: &Path) -> anyhow::Result<GpuschedConfig> {
    let cfg = crate::scheduler::read_config(Some(path))?;
    gpusched_sim::sched::build(Some(&cfg), None)
        .map_err(|e| anyhow::anyhow!("{}: scheduler configuration: {e}", path.display()))?;
    match cfg.packing {
        PackingConfig::Gpusched(g) => Ok(g),
        other => anyhow::bail!(
            "{}: packing policy {:?} has no arguments; with --openb, --config is read for `packing: {{policy: gpusched, ...}}` only (the policies compared are --policies)",
            path.display(),
            other.policy().as_str()
        ),
    }
}

pub fn run(args: &OpenbArgs, config: Option<&Path>) -> anyhow::Result<()> {
    let paths = args.openb.as_deref().unwrap_or_default();
    let [nodes_csv, pods_csv] = paths else {
        anyhow::bail!("--openb takes NODES.csv PODS.csv");
    };
    let json = args.json;
    let seeds = parse_seeds(&args.seeds)?;
    let policies = parse_policies(&args.policies)?;
    let gpusched = config.map(gpusched_args).transpose()?;
    if let Some(p) = config {
        eprintln!("gpusched policy arguments from {}", p.display());
    }
    let variant_list = args
        .variants
        .as_deref()
        .map(variants::parse_list)
        .transpose()
        .context("--variants")?;
    let nodes = gpusched_sim::openb::read_nodes(nodes_csv)?;
    let pods: Vec<_> = gpusched_sim::openb::read_pods(pods_csv)?
        .into_iter()
        .map(|t| t.pod)
        .collect();
    let workload = pods_csv
        .file_stem()
        .map(|s| s.to_string_lossy().to_string())
        .unwrap_or_default();
    let published_path = args
        .published
        .clone()
        .unwrap_or_else(|| default_published(pods_csv));
    let (published_text, published_note) = match std::fs::read_to_string(&published_path) {
        Ok(text) => (
            Some((published_path.clone(), text)),
            format!("published results: {}", published_path.display()),
        ),
        Err(e) => (
            None,
            format!(
                "published results: not available ({}: {e}); showing ours only",
                published_path.display()
            ),
        ),
    };
    let method = FgdMethod {
        tune_ratio: args.tune_ratio,
        tie_break: match args.tie_break.as_str() {
            "lowest-id" => TieBreak::LowestId,
            "random" => TieBreak::Random,
            _ => TieBreak::Permuted,
        },
        profile: None,
        threads: args.threads,
        gpusched,
        move_budget: 0,
    };
    let budgets = parse_budgets(&args.move_budget)?;
    if budgets != [0] {
        anyhow::ensure!(
            variant_list.is_none(),
            "--move-budget and --variants cannot be combined"
        );
        let mut rows = Vec::new();
        let mut progress = Progress::new(budgets.len() * policies.len(), args.progress);
        for &budget in &budgets {
            for p in &policies {
                let m = FgdMethod {
                    move_budget: budget,
                    ..method.clone()
                };
                progress.begin(&format!("budget {budget}, {p}"));
                let t0 = Instant::now();
                let result = fgd_method::run(&m, &nodes, &pods, p, &seeds)?;
                progress.end(Some(format!(
                    "  budget {budget}, {p}: {:.1} s",
                    t0.elapsed().as_secs_f64()
                )));
                rows.push(BudgetRow { budget, result });
            }
        }
        drop(progress);
        if args.json {
            let v: Vec<_> = rows.iter().map(|r| (r.budget, &r.result)).collect();
            println!("{}", serde_json::to_string_pretty(&v)?);
        } else {
            println!(
                "FGD evaluation method with consolidation moves, seeds {}",
                args.seeds
            );
            print!("{}", budget_table(&rows));
        }
        return Ok(());
    }
    if let Some(list) = variant_list {
        return run_variants(
            args,
            &method,
            &nodes,
            &pods,
            &list,
            &policies,
            &seeds,
            published_text.as_ref(),
            &published_note,
        );
    }
    let published = published_for(published_text.as_ref(), &workload)?;
    let published_note = if published_text.is_some() && published.is_empty() {
        format!(
            "published results: {} has no workload {workload:?}",
            published_path.display()
        )
    } else {
        published_note
    };
    let mut progress = Progress::new(policies.len(), args.progress);
    let rows = run_policies(
        &method,
        &nodes,
        &pods,
        &policies,
        &seeds,
        json,
        &mut progress,
    )?;
    drop(progress);
    if json {
        let out = JsonOut {
            nodes_csv: nodes_csv.display().to_string(),
            pods_csv: pods_csv.display().to_string(),
            workload: workload.clone(),
            seeds: &seeds,
            tie_break: &args.tie_break,
            results: json_policies(&rows, &published, &seeds),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let total_gpus = rows.first().map_or(0, |r| r.1.total_gpus);
    println!(
        "FGD evaluation method: {} nodes, {total_gpus} GPUs ({}), workload {workload} ({} pods), tune {}, seeds {}, tie-break {}",
        nodes.len(),
        nodes_csv.display(),
        pods.len(),
        args.tune_ratio,
        args.seeds,
        args.tie_break
    );
    println!("{published_note}");
    println!();
    print_table(&rows, &published, &seeds);
    println!();
    println!(
        "alloc@100%: GPU allocation ratio (%) when the arrived GPU demand reaches 100% of capacity; mean ± sample stdev over {} seed(s).",
        seeds.len()
    );
    println!(
        "frag@100%: fragmented GPU (FGD definition, trace's typical pods) in % of capacity at that point."
    );
    Ok(())
}

/// `--variants`: every variant built from the pod list, one table each,
/// then a summary (mean per policy, the published FGD mean, and each
/// policy's difference to `fgd` with the seeds where it was ≥ fgd).
#[allow(clippy::too_many_arguments)]
fn run_variants(
    args: &OpenbArgs,
    method: &FgdMethod,
    nodes: &[gpusched_model::Node],
    base: &[gpusched_model::Pod],
    list: &[Variant],
    policies: &[String],
    seeds: &[u64],
    published_text: Option<&(PathBuf, String)>,
    published_note: &str,
) -> anyhow::Result<()> {
    let json = args.json;
    let mut all = Vec::new();
    let mut progress = Progress::new(list.len() * policies.len(), args.progress);
    for &v in list {
        let pods = variants::build(v, base, nodes, args.variant_seed)?;
        let workload = v.workload_name();
        let published = published_for(published_text, &workload)?;
        if !json {
            match &progress.bar {
                Some(b) => b.println(format!("{v}: {} pods", pods.len())),
                None => eprintln!("{v}: {} pods", pods.len()),
            }
        }
        let rows = run_policies(method, nodes, &pods, policies, seeds, json, &mut progress)?;
        all.push((v, pods.len(), published, rows));
    }
    drop(progress);
    if json {
        let out: Vec<JsonOut> = all
            .iter()
            .map(|(v, _, published, rows)| JsonOut {
                nodes_csv: args.openb.as_deref().unwrap_or_default()[0]
                    .display()
                    .to_string(),
                pods_csv: format!(
                    "{} as variant {v} (seed {})",
                    args.openb.as_deref().unwrap_or_default()[1].display(),
                    args.variant_seed
                ),
                workload: v.workload_name(),
                seeds,
                tie_break: &args.tie_break,
                results: json_policies(rows, published, seeds),
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!(
        "FGD evaluation method on trace variants (variant seed {}): {} nodes, tune {}, seeds {}, tie-break {}",
        args.variant_seed,
        nodes.len(),
        args.tune_ratio,
        args.seeds,
        args.tie_break
    );
    println!("{published_note}");
    for (v, n, published, rows) in &all {
        println!();
        println!("== {v} ({n} pods)");
        print_table(rows, published, seeds);
    }
    println!();
    println!(
        "== summary: alloc@100% mean over seeds; pub fgd = published FGD mean; Δ = policy − fgd (won: seeds where ≥ fgd)"
    );
    let fgd = policies.iter().position(|p| p == "fgd");
    print!("{:<12}", "variant");
    for p in policies {
        print!(" {:>14}", p);
    }
    print!(" {:>8}", "pub fgd");
    if fgd.is_some() {
        for p in policies.iter().filter(|p| *p != "fgd") {
            print!(" {:>16}", format!("Δ {p}"));
        }
    }
    println!();
    let mut deltas = vec![0.0; policies.len()];
    for (v, _, published, rows) in &all {
        print!("{:<12}", v.to_string());
        for (_, r, _) in rows {
            print!(" {:>14.2}", r.headline().0);
        }
        let pf =
            published_mean(published, "fgd", seeds).map_or("-".to_string(), |x| format!("{x:.2}"));
        print!(" {pf:>8}");
        if let Some(fi) = fgd {
            let f = &rows[fi].1;
            for (i, (p, r, _)) in rows.iter().enumerate() {
                if p == "fgd" {
                    continue;
                }
                let d = r.headline().0 - f.headline().0;
                deltas[i] += d;
                let won = f
                    .runs
                    .iter()
                    .zip(&r.runs)
                    .filter(|(a, b)| b.alloc_at_100 >= a.alloc_at_100)
                    .count();
                print!(" {:>16}", format!("{d:+.2} ({won}/{})", seeds.len()));
            }
        }
        println!();
    }
    if fgd.is_some() && !all.is_empty() {
        print!("{:<12}", "mean");
        for _ in policies {
            print!(" {:>14}", "");
        }
        print!(" {:>8}", "");
        for (i, p) in policies.iter().enumerate() {
            if p != "fgd" {
                print!(" {:>16}", format!("{:+.2}", deltas[i] / all.len() as f64));
            }
        }
        println!();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_and_policies() {
        assert_eq!(parse_budgets("0, 1,2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_budgets("1,x").is_err());
        assert!(parse_budgets(",").is_err());
        assert_eq!(parse_seeds("42-45").unwrap(), vec![42, 43, 44, 45]);
        assert_eq!(parse_seeds("1,5, 7-8").unwrap(), vec![1, 5, 7, 8]);
        assert!(parse_seeds("5-1").is_err());
        assert!(parse_seeds("x").is_err());
        assert!(parse_seeds("").is_err());
        assert_eq!(parse_policies("all").unwrap().len(), POLICY_NAMES.len());
        assert_eq!(
            parse_policies("fgd, gpusched").unwrap(),
            vec!["fgd", "gpusched"]
        );
        assert!(parse_policies("fgd,tetris").is_err());
    }
}

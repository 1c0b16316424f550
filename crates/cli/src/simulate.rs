//! `gpusched simulate`: run the discrete-event simulator.

use anyhow::Context;
use clap::Args;
use gpusched_sim::metrics::WallTiming;
use gpusched_sim::{Hooks, SimResult};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// `--json` is declared once, in [`crate::openb::OpenbArgs`], and shared:
/// without `--openb` it prints the simulator's result as JSON.
#[derive(Args, Debug, Clone)]
pub struct SimulateArgs {
    #[command(flatten)]
    pub openb: crate::openb::OpenbArgs,

    /// Cluster file (YAML, the cluster-spec vocabulary). Default: the
    /// embedded mixed cluster (fixtures/clusters/mixed.yaml).
    #[arg(long, conflicts_with = "openb", value_name = "FILE")]
    pub cluster: Option<PathBuf>,

    /// Workload file (YAML: queues, jobs, events; see docs/simulator.md).
    /// Default: the embedded mixed workload (fixtures/workloads/mixed.yaml).
    #[arg(long, conflicts_with = "openb", value_name = "FILE")]
    pub workload: Option<PathBuf>,

    /// Seed for the workload's random parts and the scheduler.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,

    /// Scheduler configuration (YAML, `gpusched_plugins::SchedulerConfig`).
    /// Default: the built-in configuration. With --openb only its
    /// `packing` section is read, and it must name gpusched: its arguments
    /// replace the defaults of the `gpusched` policy in that run.
    #[arg(long, value_name = "SCHEDULER_CONFIG.yaml")]
    pub config: Option<PathBuf>,

    /// Packing policy (overrides the configuration's `packing.policy`):
    /// spread, binpack, random, dot-prod, gpu-clustering, gpu-packing,
    /// best-fit, fgd, gpusched.
    #[arg(long, conflicts_with = "openb", value_name = "NAME")]
    pub policy: Option<String>,

    /// Write a self-contained HTML report (charts, tables) to FILE.
    #[arg(long, conflicts_with = "openb", value_name = "FILE.html")]
    pub report: Option<PathBuf>,

    /// Stop at this virtual time (e.g. `6h`, `90m`).
    #[arg(long, conflicts_with = "openb", value_name = "DURATION")]
    pub until: Option<String>,

    /// Check conservation (no GPU overcommitted) after every cycle and event.
    #[arg(long)]
    pub verify: bool,

    /// Replay a captured cluster state (`gpusched snapshot capture`) instead
    /// of a workload: the core's cycles from that moment, with the file's
    /// scheduler configuration unless --config / --policy say otherwise.
    #[arg(long, help_heading = "Replaying a captured cluster (--snapshot)", value_name = "FILE", conflicts_with_all = ["cluster", "workload", "openb"])]
    pub snapshot: Option<PathBuf>,

    /// With --snapshot: run time (e.g. `2h`) of the pods the file gives
    /// none in `durationsMs` — running pods from their start, pending ones
    /// from their binding. Without it such pods run for ever.
    #[arg(
        long,
        help_heading = "Replaying a captured cluster (--snapshot)",
        value_name = "DURATION",
        requires = "snapshot"
    )]
    pub pod_duration: Option<String>,
}

pub fn run(args: SimulateArgs) -> anyhow::Result<()> {
    if args.openb.is_requested() {
        return crate::openb::run(&args.openb, args.config.as_deref());
    }
    if let Some(path) = &args.snapshot {
        return replay(&args, path);
    }
    let mut scenario = gpusched_sim::load::scenario_files(
        args.cluster.as_deref(),
        args.workload.as_deref(),
        args.seed,
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    for w in &scenario.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(u) = &args.until {
        let ms = gpusched_sim::workload::parse_duration_ms(u)
            .map_err(|e| anyhow::anyhow!("--until: {e}"))?;
        scenario.settings.until_ms = Some(ms);
    }
    scenario.settings.verify |= args.verify;

    let mut scheduler = build_scheduler(args.config.as_deref(), args.policy.as_deref())?;
    let mut hooks = CliHooks::new(!args.openb.json);
    let started = Instant::now();
    let result = gpusched_sim::run(&scenario, &mut scheduler, args.seed, &mut hooks);
    let wall = hooks.finish(started.elapsed());

    if let Some(path) = &args.report {
        let html = gpusched_sim::report::render(&result, Some(&wall));
        std::fs::write(path, html).with_context(|| format!("writing {}", path.display()))?;
    }
    if args.openb.json {
        #[derive(serde::Serialize)]
        struct Out<'a> {
            #[serde(flatten)]
            result: &'a SimResult,
            /// Wall-clock timing: differs between runs, unlike everything else.
            wall: &'a WallTiming,
        }
        let mut text = serde_json::to_string_pretty(&Out {
            result: &result,
            wall: &wall,
        })?;
        text.push('\n');
        print_ok(&text)?;
    } else {
        let mut text = gpusched_sim::table::render(&result);
        text += &format!(
            "\n  wall time {:.2}s · cycle mean {:.3}ms · p99 {:.3}ms · max {:.3}ms\n",
            wall.total_s, wall.cycle_mean_ms, wall.cycle_p99_ms, wall.cycle_max_ms
        );
        if let Some(path) = &args.report {
            text += &format!("  report written to {}\n", path.display());
        }
        print_ok(&text)?;
    }
    if result.totals.sim_errors > 0 {
        eprintln!(
            "warning: {} simulator errors (refused decisions or conservation violations); first: {}",
            result.totals.sim_errors,
            result.errors.first().cloned().unwrap_or_default()
        );
    }
    Ok(())
}

/// `simulate --snapshot FILE`: replays the captured moment.
fn replay(args: &SimulateArgs, path: &std::path::Path) -> anyhow::Result<()> {
    use gpusched_sim::replay::{ReplayInput, replay};
    let default_duration_ms = args
        .pod_duration
        .as_deref()
        .map(gpusched_sim::workload::parse_duration_ms)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--pod-duration: {e}"))?;
    let file = gpusched_k8s::tools::snapshot::load(path)?;
    let cfg = match &args.config {
        Some(p) => crate::scheduler::read_config(Some(p))?,
        None => file.config.clone(),
    };
    let mut scheduler = gpusched_sim::sched::build(Some(&cfg), args.policy.as_deref())
        .map_err(|e| anyhow::anyhow!("scheduler configuration: {e}"))?;
    let durations_ms = file
        .pods
        .iter()
        .map(|p| {
            file.durations_ms
                .get(&format!("{}/{}", p.namespace, p.name))
                .copied()
        })
        .collect();
    let input = ReplayInput {
        name: format!("snapshot {}", path.display()),
        snapshot: file.snapshot.clone(),
        durations_ms,
        default_duration_ms,
        start_ms: file.captured_at_ms,
        cycle_interval_ms: 1_000,
        max_cycles: 10_000,
    };
    let out = replay(&input, &mut scheduler);
    if let Some(p) = &args.report {
        let html = gpusched_sim::report::render(&out.result, None);
        std::fs::write(p, html).with_context(|| format!("writing {}", p.display()))?;
    }
    if args.openb.json {
        let mut text = serde_json::to_string_pretty(&out)?;
        text.push('\n');
        return print_ok(&text);
    }
    let mut text = String::new();
    for d in &out.decisions {
        let gpus = if d.gpus.is_empty() {
            String::new()
        } else {
            let ids: Vec<String> = d.gpus.iter().map(u32::to_string).collect();
            match d.milli {
                Some(m) => format!(" GPU {} ({m} milli)", ids.join(",")),
                None => format!(" GPUs [{}]", ids.join(",")),
            }
        };
        text += &format!(
            "cycle {:>3} +{:>6}  {:<8} {} -> {}{}{}\n",
            d.cycle,
            gpusched_sim::workload::fmt_duration(d.at_ms),
            d.action,
            d.pod,
            d.node,
            gpus,
            d.reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        );
    }
    for (pod, why) in &out.pending {
        text += &format!("pending  {pod}: {why}\n");
    }
    text += "\n";
    text += &gpusched_sim::table::render(&out.result);
    if let Some(p) = &args.report {
        text += &format!("  report written to {}\n", p.display());
    }
    print_ok(&text)
}

/// Writes to stdout; a closed pipe (`| head`) is not an error.
fn print_ok(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

/// The scheduler from `--config` (a `gpusched_plugins::SchedulerConfig`)
/// and `--policy` (overrides `packing.policy`).
pub(crate) fn build_scheduler(
    config: Option<&std::path::Path>,
    policy: Option<&str>,
) -> anyhow::Result<gpusched_core::Scheduler> {
    let cfg = match config {
        Some(p) => {
            let text = gpusched_sim::load::read(p)?;
            Some(
                gpusched_plugins::SchedulerConfig::from_yaml(&p.display().to_string(), &text)
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
            )
        }
        None => None,
    };
    gpusched_sim::sched::build(cfg.as_ref(), policy)
        .map_err(|e| anyhow::anyhow!("scheduler configuration: {e}"))
}

/// Wall-clock timing of cycles and a progress bar (stderr, TTY only, after
/// the run has taken a second).
struct CliHooks {
    started: Instant,
    cycle_start: Option<Instant>,
    cycle_ns: Vec<u64>,
    bar: Option<ProgressBar>,
    show_bar: bool,
}

impl CliHooks {
    fn new(allow_bar: bool) -> Self {
        CliHooks {
            started: Instant::now(),
            cycle_start: None,
            cycle_ns: Vec::new(),
            bar: None,
            show_bar: allow_bar && std::io::stderr().is_terminal(),
        }
    }

    fn finish(mut self, total: Duration) -> WallTiming {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
        WallTiming::from_cycle_ns(total.as_secs_f64(), &mut self.cycle_ns)
    }
}

impl Hooks for CliHooks {
    fn before_cycle(&mut self, _now_ms: u64) {
        self.cycle_start = Some(Instant::now());
    }

    fn after_cycle(&mut self, _now_ms: u64, _out: &gpusched_core::CycleOutput) {
        if let Some(s) = self.cycle_start.take() {
            self.cycle_ns.push(s.elapsed().as_nanos() as u64);
        }
    }

    fn progress(&mut self, now_ms: u64, horizon_ms: u64) {
        if !self.show_bar {
            return;
        }
        if self.bar.is_none() && self.started.elapsed() > Duration::from_secs(1) {
            let b = ProgressBar::with_draw_target(Some(horizon_ms), ProgressDrawTarget::stderr());
            if let Ok(style) = ProgressStyle::default_bar()
                .template("{spinner} simulating [{bar:40}] {percent:>3}% {msg} ({elapsed})")
            {
                b.set_style(style.progress_chars("=> "));
            }
            self.bar = Some(b);
        }
        if let Some(b) = &self.bar {
            if horizon_ms > b.length().unwrap_or(0) {
                b.set_length(horizon_ms);
            }
            b.set_position(now_ms);
            b.set_message(format!(
                "t={}",
                gpusched_sim::workload::fmt_duration(now_ms)
            ));
        }
    }
}

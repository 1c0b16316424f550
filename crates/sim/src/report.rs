//! The HTML report: one self-contained page (inline CSS and SVG, no
//! scripts, no external assets) with the run's charts and tables.

use crate::metrics::{SimResult, WallTiming};
use crate::table::secs;
use crate::workload::fmt_duration;
use std::fmt::Write;

const PALETTE: [&str; 8] = [
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A plot area inside an SVG of `w`×`h`.
struct Frame {
    w: f64,
    h: f64,
    left: f64,
    right: f64,
    top: f64,
    bottom: f64,
}

impl Frame {
    fn pw(&self) -> f64 {
        self.w - self.left - self.right
    }
    fn ph(&self) -> f64 {
        self.h - self.top - self.bottom
    }
    fn x(&self, frac: f64) -> f64 {
        self.left + frac.clamp(0.0, 1.0) * self.pw()
    }
    fn y(&self, frac: f64) -> f64 {
        self.top + (1.0 - frac.clamp(0.0, 1.0)) * self.ph()
    }
}

/// A tick step for a time axis of `end` ms: ≤ `max` ticks.
fn time_step(end: u64, max: u64) -> u64 {
    const STEPS: [u64; 14] = [
        1_000,
        5_000,
        15_000,
        60_000,
        300_000,
        900_000,
        1_800_000,
        3_600_000,
        7_200_000,
        10_800_000,
        21_600_000,
        43_200_000,
        86_400_000,
        604_800_000,
    ];
    STEPS
        .iter()
        .copied()
        .find(|s| end / s <= max)
        .unwrap_or(604_800_000)
}

fn time_label(ms: u64) -> String {
    if ms == 0 {
        return "0".into();
    }
    if ms.is_multiple_of(3_600_000) {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms < 3_600_000 {
        format!("{}m", ms / 60_000)
    } else {
        fmt_duration(ms)
    }
}

fn time_axis(s: &mut String, f: &Frame, end: u64, label: bool) {
    time_axis_g(s, f, end, label, true)
}

fn time_axis_g(s: &mut String, f: &Frame, end: u64, label: bool, grid: bool) {
    let step = time_step(end, 12);
    let mut t = 0;
    while t <= end {
        let x = f.x(t as f64 / end as f64);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" class="{}"/><text x="{x:.1}" y="{:.1}" class="tick" text-anchor="middle">{}</text>"##,
            if grid { f.top } else { f.top + f.ph() },
            f.top + f.ph() + 4.0,
            if grid { "grid" } else { "tickline" },
            f.top + f.ph() + 17.0,
            time_label(t)
        );
        t += step;
    }
    if label {
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">virtual time</text>"##,
            f.left + f.pw() / 2.0,
            f.h - 4.0
        );
    }
}

fn y_axis(
    s: &mut String,
    f: &Frame,
    max: f64,
    ticks: &[f64],
    fmt: &dyn Fn(f64) -> String,
    title: &str,
) {
    for &v in ticks {
        let y = f.y(v / max);
        let _ = write!(
            s,
            r##"<line x1="{:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" class="grid"/><text x="{:.1}" y="{:.1}" class="tick" text-anchor="end">{}</text>"##,
            f.left - 4.0,
            f.left + f.pw(),
            f.left - 7.0,
            y + 4.0,
            fmt(v)
        );
    }
    let cy = f.top + f.ph() / 2.0;
    let _ = write!(
        s,
        r##"<text x="14" y="{cy:.1}" class="axis" text-anchor="middle" transform="rotate(-90 14 {cy:.1})">{}</text>"##,
        esc(title)
    );
}

fn is_bad(what: &str) -> bool {
    what.contains("failure") || what == "drain"
}

fn polyline(points: &[(f64, f64)]) -> String {
    let mut p = String::with_capacity(points.len() * 14);
    for (i, (x, y)) in points.iter().enumerate() {
        if i > 0 {
            p.push(' ');
        }
        let _ = write!(p, "{x:.1},{y:.1}");
    }
    p
}

fn legend(s: &mut String, x0: f64, y: f64, items: &[(&str, String, bool)]) {
    let mut x = x0;
    for (color, name, dashed) in items {
        let dash = if *dashed {
            r#" stroke-dasharray="5 3""#
        } else {
            ""
        };
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{color}" stroke-width="3"{dash}/><text x="{:.1}" y="{:.1}" class="legend">{}</text>"##,
            x + 18.0,
            x + 23.0,
            y + 4.0,
            esc(name)
        );
        x += 34.0 + name.chars().count() as f64 * 7.0;
    }
}

/// Steps of a bucketed series as (x, y) points of a staircase.
fn stairs(f: &Frame, t: &[u64], bucket: u64, end: u64, v: &[f64], max: f64) -> Vec<(f64, f64)> {
    let mut pts = Vec::with_capacity(v.len() * 2);
    for (i, val) in v.iter().enumerate() {
        let a = t.get(i).copied().unwrap_or(0);
        let b = (a + bucket).min(end);
        if a >= end {
            break;
        }
        let y = f.y(val / max);
        pts.push((f.x(a as f64 / end as f64), y));
        pts.push((f.x(b as f64 / end as f64), y));
    }
    pts
}

fn alloc_chart(r: &SimResult) -> String {
    let f = Frame {
        w: 1100.0,
        h: 350.0,
        left: 58.0,
        right: 20.0,
        top: 54.0,
        bottom: 40.0,
    };
    let end = r.end_ms.max(1);
    let se = &r.series;
    let mut s = format!(
        r##"<svg viewBox="0 0 {} {}" role="img" aria-label="GPU allocation over time">"##,
        f.w, f.h
    );
    y_axis(
        &mut s,
        &f,
        100.0,
        &[0.0, 25.0, 50.0, 75.0, 100.0],
        &|v| format!("{v:.0}%"),
        "% of schedulable GPUs",
    );
    time_axis(&mut s, &f, end, true);
    // incidents: dashed lines; failures and drains numbered as in the
    // incidents table
    let mut num = 0;
    for inc in &r.incidents {
        let x = f.x(inc.t_ms as f64 / end as f64);
        let bad = is_bad(&inc.what);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" class="{}"><title>{} {} at {}: {} pods stopped</title></line>"##,
            if bad { f.top - 10.0 } else { f.top },
            f.top + f.ph(),
            if bad { "incident" } else { "recovery" },
            esc(&inc.what),
            esc(&inc.node),
            fmt_duration(inc.t_ms),
            inc.pods_stopped
        );
        if bad {
            num += 1;
            let _ = write!(
                s,
                r##"<circle cx="{x:.1}" cy="{:.1}" r="8" fill="#e45756"><title>{} {} at {}</title></circle><text x="{x:.1}" y="{:.1}" class="badge" text-anchor="middle">{num}</text>"##,
                f.top - 12.0,
                esc(&inc.what),
                esc(&inc.node),
                fmt_duration(inc.t_ms),
                f.top - 8.5
            );
        }
    }
    // gang starts (triangles under the top edge) and reservations (ticks
    // on the bottom edge)
    for &t in &r.marks.gang_starts_ms {
        let x = f.x(t as f64 / end as f64);
        let y = f.top + 2.0;
        let _ = write!(
            s,
            r##"<path d="M{:.1},{y:.1} l4,7 l-8,0 z" fill="#b279a2" fill-opacity="0.8"><title>gang started at {}</title></path>"##,
            x,
            fmt_duration(t)
        );
    }
    for &t in &r.marks.reservations_ms {
        let x = f.x(t as f64 / end as f64);
        let y = f.top + f.ph();
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{y:.1}" stroke="#eeca3b" stroke-width="2"><title>node reserved at {}</title></line>"##,
            y - 8.0,
            fmt_duration(t)
        );
    }
    // capacity as % of installed GPUs (dips on failures)
    let installed = r.gpus.max(1) as f64;
    let cap: Vec<f64> = se
        .capacity_gpus
        .iter()
        .map(|c| c * 100.0 / installed)
        .collect();
    let alloc = stairs(&f, &se.t_ms, se.bucket_ms, end, &se.alloc_pct, 100.0);
    if let (Some(first), Some(last)) = (alloc.first(), alloc.last()) {
        let mut area = alloc.clone();
        area.push((last.0, f.y(0.0)));
        area.push((first.0, f.y(0.0)));
        let _ = write!(
            s,
            r##"<polygon points="{}" fill="#4c78a8" fill-opacity="0.22"/><polyline points="{}" fill="none" stroke="#4c78a8" stroke-width="2"/>"##,
            polyline(&area),
            polyline(&alloc)
        );
    }
    let frag = stairs(&f, &se.t_ms, se.bucket_ms, end, &se.frag_pct, 100.0);
    let capl = stairs(&f, &se.t_ms, se.bucket_ms, end, &cap, 100.0);
    let _ = write!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#f58518" stroke-width="2"/><polyline points="{}" fill="none" stroke="#555" stroke-width="1.5" stroke-dasharray="5 3"/>"##,
        polyline(&frag),
        polyline(&capl)
    );
    legend(
        &mut s,
        f.left,
        16.0,
        &[
            ("#4c78a8", "GPU allocation".into(), false),
            ("#f58518", "fragmentation".into(), false),
            ("#555", "capacity (% installed)".into(), true),
            ("#e45756", "failure/drain (see Incidents)".into(), true),
            ("#54a24b", "recovery".into(), true),
            ("#b279a2", "gang start".into(), false),
            ("#eeca3b", "node reserved".into(), false),
        ],
    );
    s.push_str("</svg>");
    s
}

fn pods_chart(r: &SimResult) -> String {
    let f = Frame {
        w: 1100.0,
        h: 200.0,
        left: 58.0,
        right: 20.0,
        top: 30.0,
        bottom: 26.0,
    };
    let end = r.end_ms.max(1);
    let se = &r.series;
    let max = se
        .pending_pods
        .iter()
        .chain(&se.running_pods)
        .fold(1.0f64, |a, b| a.max(*b));
    let step = nice_step(max, 4);
    let top = (max / step).ceil() * step;
    let ticks: Vec<f64> = (0..=((top / step) as usize))
        .map(|k| k as f64 * step)
        .collect();
    let mut s = format!(
        r##"<svg viewBox="0 0 {} {}" role="img" aria-label="pods over time">"##,
        f.w, f.h
    );
    y_axis(&mut s, &f, top, &ticks, &|v| format!("{v:.0}"), "pods");
    time_axis(&mut s, &f, end, false);
    let run = stairs(&f, &se.t_ms, se.bucket_ms, end, &se.running_pods, top);
    let pen = stairs(&f, &se.t_ms, se.bucket_ms, end, &se.pending_pods, top);
    let _ = write!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#54a24b" stroke-width="2"/><polyline points="{}" fill="none" stroke="#e45756" stroke-width="2"/>"##,
        polyline(&run),
        polyline(&pen)
    );
    legend(
        &mut s,
        f.left,
        14.0,
        &[
            ("#54a24b", "running".into(), false),
            ("#e45756", "pending".into(), false),
        ],
    );
    s.push_str("</svg>");
    s
}

fn nice_step(max: f64, n: usize) -> f64 {
    let raw = (max / n as f64).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw {
            return m * mag;
        }
    }
    10.0 * mag
}

fn cdf_chart(r: &SimResult) -> String {
    let f = Frame {
        w: 540.0,
        h: 330.0,
        left: 58.0,
        right: 16.0,
        top: 16.0,
        bottom: 58.0,
    };
    // log axis over 1 + seconds
    let max_s = r
        .wait_cdf
        .iter()
        .flat_map(|c| c.points.iter().map(|p| p.0))
        .fold(1.0f64, f64::max);
    let decades = (1.0 + max_s).log10().ceil().max(1.0);
    let xf = |sec: f64| (1.0 + sec).log10() / decades;
    let mut s = format!(
        r##"<svg viewBox="0 0 {} {}" role="img" aria-label="queue wait CDF">"##,
        f.w, f.h
    );
    y_axis(
        &mut s,
        &f,
        1.0,
        &[0.0, 0.25, 0.5, 0.75, 1.0],
        &|v| format!("{:.0}%", v * 100.0),
        "pods started within",
    );
    let ticks: [(f64, &str); 7] = [
        (0.0, "0"),
        (10.0, "10s"),
        (60.0, "1m"),
        (600.0, "10m"),
        (3600.0, "1h"),
        (36_000.0, "10h"),
        (360_000.0, "100h"),
    ];
    for (v, l) in ticks {
        let fr = xf(v);
        if fr > 1.0001 {
            break;
        }
        let x = f.x(fr);
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" class="grid"/><text x="{x:.1}" y="{:.1}" class="tick" text-anchor="middle">{l}</text>"##,
            f.top,
            f.top + f.ph() + 4.0,
            f.top + f.ph() + 17.0
        );
    }
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">queue wait (log scale)</text>"##,
        f.left + f.pw() / 2.0,
        f.top + f.ph() + 34.0
    );
    let mut items = Vec::new();
    for (i, c) in r.wait_cdf.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        if c.points.is_empty() {
            continue;
        }
        // staircase from (0, 0)
        let mut pts = vec![(f.x(0.0), f.y(0.0))];
        let mut prev = 0.0;
        for &(x, y) in &c.points {
            pts.push((f.x(xf(x)), f.y(prev)));
            pts.push((f.x(xf(x)), f.y(y)));
            prev = y;
        }
        pts.push((f.x(1.0), f.y(prev)));
        let _ = write!(
            s,
            r##"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2.2"/>"##,
            polyline(&pts)
        );
        items.push((color, c.queue.clone(), false));
    }
    // legend in rows of two below the axis title
    for (k, chunk) in items.chunks(4).enumerate() {
        legend(
            &mut s,
            f.left,
            f.h - 8.0 - (items.len().div_ceil(4) - 1 - k) as f64 * 16.0,
            chunk,
        );
    }
    s.push_str("</svg>");
    s
}

fn fair_chart(r: &SimResult) -> String {
    let row = 46.0;
    let f = Frame {
        w: 540.0,
        h: 72.0 + row * r.queues.len() as f64,
        left: 96.0,
        right: 20.0,
        top: 30.0,
        bottom: 42.0,
    };
    let max = r
        .queues
        .iter()
        .flat_map(|q| [q.avg_gpus, q.fair_gpus, q.entitled_gpus])
        .fold(1.0f64, f64::max);
    let step = nice_step(max, 5);
    let top = (max / step).ceil() * step;
    let mut s = format!(
        r##"<svg viewBox="0 0 {} {}" role="img" aria-label="GPU share vs fair share">"##,
        f.w, f.h
    );
    let mut v = 0.0;
    while v <= top + 1e-9 {
        let x = f.left + v / top * f.pw();
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{:.1}" x2="{x:.1}" y2="{:.1}" class="grid"/><text x="{x:.1}" y="{:.1}" class="tick" text-anchor="middle">{v:.0}</text>"##,
            f.top,
            f.top + f.ph(),
            f.top + f.ph() + 15.0
        );
        v += step;
    }
    let _ = write!(
        s,
        r##"<text x="{:.1}" y="{:.1}" class="axis" text-anchor="middle">GPUs (time-averaged)</text>"##,
        f.left + f.pw() / 2.0,
        f.h - 8.0
    );
    for (i, q) in r.queues.iter().enumerate() {
        let y0 = f.top + 8.0 + i as f64 * row;
        let color = PALETTE[i % PALETTE.len()];
        let w = |g: f64| g / top * f.pw();
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{:.1}" class="rowlabel" text-anchor="end">{}</text><rect x="{:.1}" y="{y0:.1}" width="{:.1}" height="14" fill="{color}"><title>{}: {:.1} GPUs held on average</title></rect><rect x="{:.1}" y="{:.1}" width="{:.1}" height="8" fill="{color}" fill-opacity="0.35"><title>{}: fair share {:.1} GPUs</title></rect><line x1="{:.1}" y1="{:.1}" x2="{:.1}" y2="{:.1}" stroke="#222" stroke-width="2"><title>{}: static entitlement {:.1} GPUs</title></line>"##,
            f.left - 8.0,
            y0 + 14.0,
            esc(&q.name),
            f.left,
            w(q.avg_gpus).max(0.5),
            esc(&q.name),
            q.avg_gpus,
            f.left,
            y0 + 17.0,
            w(q.fair_gpus).max(0.5),
            esc(&q.name),
            q.fair_gpus,
            f.left + w(q.entitled_gpus),
            y0 - 3.0,
            f.left + w(q.entitled_gpus),
            y0 + 28.0,
            esc(&q.name),
            q.entitled_gpus
        );
    }
    let _ = write!(
        s,
        r##"<rect x="{:.1}" y="6" width="14" height="10" fill="#888"/><text x="{:.1}" y="15" class="legend">held</text><rect x="{:.1}" y="8" width="14" height="6" fill="#888" fill-opacity="0.35"/><text x="{:.1}" y="15" class="legend">fair share (demand-aware)</text><line x1="{:.1}" y1="4" x2="{:.1}" y2="18" stroke="#222" stroke-width="2"/><text x="{:.1}" y="15" class="legend">entitlement</text>"##,
        f.left,
        f.left + 18.0,
        f.left + 62.0,
        f.left + 80.0,
        f.left + 262.0,
        f.left + 262.0,
        f.left + 268.0
    );
    s.push_str("</svg>");
    s
}

/// Sequential blue scale for 0..1.
fn heat_color(v: f64) -> String {
    const STOPS: [(f64, [f64; 3]); 5] = [
        (0.0, [247.0, 251.0, 255.0]),
        (0.25, [198.0, 219.0, 239.0]),
        (0.5, [107.0, 174.0, 214.0]),
        (0.75, [33.0, 113.0, 181.0]),
        (1.0, [8.0, 48.0, 107.0]),
    ];
    let v = v.clamp(0.0, 1.0);
    let mut k = 0;
    while k + 2 < STOPS.len() && v > STOPS[k + 1].0 {
        k += 1;
    }
    let (a, ca) = STOPS[k];
    let (b, cb) = STOPS[k + 1];
    let t = ((v - a) / (b - a)).clamp(0.0, 1.0);
    let c: Vec<u8> = (0..3)
        .map(|i| (ca[i] + (cb[i] - ca[i]) * t).round() as u8)
        .collect();
    format!("#{:02x}{:02x}{:02x}", c[0], c[1], c[2])
}

/// Heat-map rows: one per node, or, beyond `max` nodes, one per run of
/// consecutive nodes (GPU-weighted average; down when more than half of
/// the run's GPUs were down or cordoned).
fn heat_rows(hm: &crate::metrics::Heatmap, max: usize) -> Vec<(String, u32, Vec<f64>)> {
    let n = hm.nodes.len();
    let k = n.div_ceil(max.max(1)).max(1);
    let mut out = Vec::new();
    let mut i = 0;
    while i < n {
        let j = (i + k).min(n);
        let label = if j - i == 1 {
            hm.nodes[i].clone()
        } else {
            format!("{} … {}", hm.nodes[i], hm.nodes[j - 1])
        };
        let gpus: u32 = hm.node_gpus[i..j].iter().sum();
        let cols = hm.cells.get(i).map(|c| c.len()).unwrap_or(0);
        let mut cells = Vec::with_capacity(cols);
        for b in 0..cols {
            let (mut used, mut up, mut down) = (0.0, 0.0, 0.0);
            for m in i..j {
                let g = hm.node_gpus[m].max(1) as f64;
                let v = hm.cells[m].get(b).copied().unwrap_or(0.0);
                if v < 0.0 {
                    down += g;
                } else {
                    used += v * g;
                    up += g;
                }
            }
            cells.push(if down > up {
                -1.0
            } else if up > 0.0 {
                crate::metrics::r4(used / up)
            } else {
                0.0
            });
        }
        out.push((label, gpus, cells));
        i = j;
    }
    out
}

fn heatmap(r: &SimResult) -> String {
    let hm = &r.heatmap;
    let rows = heat_rows(hm, 60);
    let n = rows.len();
    let cols = hm.cells.first().map(|c| c.len()).unwrap_or(0).max(1);
    let row = 13.0;
    let f = Frame {
        w: 1100.0,
        h: 74.0 + row * n as f64,
        left: if r.heatmap.nodes.len() > 60 {
            170.0
        } else {
            120.0
        },
        right: 20.0,
        top: 34.0,
        bottom: 40.0,
    };
    let end = r.end_ms.max(1);
    let cw = f.pw() / cols as f64;
    let mut s = format!(
        r##"<svg viewBox="0 0 {} {:.0}" role="img" aria-label="per-node GPU occupancy"><defs><pattern id="down" width="6" height="6" patternUnits="userSpaceOnUse" patternTransform="rotate(45)"><rect width="6" height="6" fill="#eee"/><line x1="0" y1="0" x2="0" y2="6" stroke="#c44" stroke-width="2"/></pattern></defs>"##,
        f.w, f.h
    );
    for (i, (name, gpus, cells)) in rows.iter().enumerate() {
        let y = f.top + i as f64 * row;
        if row >= 10.0 {
            let _ = write!(
                s,
                r##"<text x="{:.1}" y="{:.1}" class="rowlabel small" text-anchor="end">{} <tspan class="dim">×{}</tspan></text>"##,
                f.left - 6.0,
                y + row - 3.0,
                esc(name),
                gpus
            );
        }
        // merge runs of identical colour into one rect
        let mut k = 0;
        while k < cells.len() {
            let v = cells[k];
            let mut j = k + 1;
            while j < cells.len() && cells[j] == v {
                j += 1;
            }
            let fill = if v < 0.0 {
                "url(#down)".to_string()
            } else {
                heat_color(v)
            };
            let _ = write!(
                s,
                r##"<rect x="{:.2}" y="{y:.1}" width="{:.2}" height="{:.1}" fill="{fill}"><title>{} · {}–{}: {}</title></rect>"##,
                f.left + k as f64 * cw,
                (j - k) as f64 * cw + 0.3,
                row - 1.0,
                esc(name),
                fmt_duration(k as u64 * hm.bucket_ms),
                fmt_duration((j as u64 * hm.bucket_ms).min(end)),
                if v < 0.0 {
                    "down or cordoned".to_string()
                } else {
                    format!("{:.0}% of GPUs in use", v * 100.0)
                }
            );
            k = j;
        }
    }
    time_axis_g(&mut s, &f, end, true, false);
    // colour legend
    let lx = f.left;
    for k in 0..=20 {
        let v = k as f64 / 20.0;
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="10" width="8" height="12" fill="{}"/>"##,
            lx + 110.0 + k as f64 * 8.0,
            heat_color(v)
        );
    }
    let _ = write!(
        s,
        r##"<text x="{lx:.1}" y="20" class="legend">GPUs in use: 0%</text><text x="{:.1}" y="20" class="legend">100%</text><rect x="{:.1}" y="10" width="16" height="12" fill="url(#down)"/><text x="{:.1}" y="20" class="legend">down or cordoned</text>"##,
        lx + 282.0,
        lx + 340.0,
        lx + 362.0
    );
    s.push_str("</svg>");
    s
}

fn kpi(label: &str, value: String, note: String, class: &str) -> String {
    format!(
        r#"<div class="kpi {class}"><div class="kv">{}</div><div class="kl">{}</div><div class="kn">{}</div></div>"#,
        esc(&value),
        esc(label),
        esc(&note)
    )
}

const CSS: &str = r#"
:root{--fg:#1d232b;--dim:#6b7480;--line:#e3e7ec;--bg:#f5f7fa;--card:#fff;--accent:#4c78a8}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,"Helvetica Neue",Arial,sans-serif}
main{max-width:1180px;margin:0 auto;padding:28px 24px 48px}
h1{font-size:24px;margin:0 0 4px;font-weight:650;letter-spacing:-.01em}
h2{font-size:16px;margin:0 0 2px;font-weight:620}
.sub{color:var(--dim);margin:0 0 20px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:18px 20px;margin:0 0 18px;box-shadow:0 1px 2px rgba(20,30,40,.04)}
.card p.note{color:var(--dim);margin:2px 0 10px;font-size:13px}
.grid2{display:grid;grid-template-columns:1fr 1fr;gap:18px}
.grid2 .card{margin:0}
.kpis{display:grid;grid-template-columns:repeat(6,1fr);gap:12px;margin:0 0 18px}
.kpi{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.kv{font-size:22px;font-weight:650;font-variant-numeric:tabular-nums}
.kl{font-size:12px;color:var(--dim);text-transform:uppercase;letter-spacing:.04em}
.kn{font-size:12px;color:var(--dim)}
.kpi.good .kv{color:#2f7d32}.kpi.bad .kv{color:#c0392b}
svg{width:100%;height:auto;display:block}
svg text{font-family:inherit}
.grid{stroke:#edf0f3;stroke-width:1}
.tick{font-size:11px;fill:#6b7480}
.axis{font-size:12px;fill:#4a525c}
.legend{font-size:12px;fill:#33393f}
.rowlabel{font-size:12px;fill:#33393f}.rowlabel.small{font-size:10.5px}
.dim{fill:#9aa2ab}
.mark{font-size:10.5px;fill:#b03a2e;paint-order:stroke;stroke:#fff;stroke-width:3px;stroke-linejoin:round}
.badge{font-size:10px;font-weight:700;fill:#fff}
.tickline{stroke:#9aa2ab;stroke-width:1}
.incident{stroke:#e45756;stroke-width:1.3;stroke-dasharray:4 3}
.recovery{stroke:#54a24b;stroke-width:1;stroke-dasharray:2 4}
table{border-collapse:collapse;width:100%;font-variant-numeric:tabular-nums}
th,td{padding:6px 7px;font-size:13px;border-bottom:1px solid var(--line);text-align:right;white-space:nowrap}
th{font-size:11px;color:var(--dim);font-weight:600;text-transform:uppercase;letter-spacing:.03em}
th:first-child,td:first-child{text-align:left}
tr:last-child td{border-bottom:none}
table.left th,table.left td{text-align:left}
table.left th:last-child,table.left td:last-child{text-align:right}
.swatch{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:7px;vertical-align:baseline}
dl.tot{display:grid;grid-template-columns:repeat(3,1fr);gap:6px 28px;margin:6px 0 0}
dl.tot div{display:flex;justify-content:space-between;border-bottom:1px dotted var(--line);padding:3px 0}
dl.tot dt{color:var(--dim)}dl.tot dd{margin:0;font-variant-numeric:tabular-nums;font-weight:560}
.err{color:#c0392b;font-family:ui-monospace,Menlo,monospace;font-size:12px}
footer{color:var(--dim);font-size:12px;margin-top:22px}
@media (max-width:900px){.grid2{grid-template-columns:1fr}.kpis{grid-template-columns:repeat(3,1fr)}dl.tot{grid-template-columns:1fr 1fr}}
"#;

/// What a reason means for idle GPUs: why the waiting pods could not use
/// them (the reason names of `gpusched_core::report::classify`).
fn idle_meaning(reason: &str) -> &'static str {
    match reason {
        "GangShort" => {
            "gang: not every member fits at once — the idle GPUs are too few (or on the wrong nodes) for the whole gang, which starts all-or-nothing"
        }
        "Topology" | "NoTopologyDomain" => {
            "topology: no single NVLink domain, rack or block has room for the whole gang, though GPUs are free elsewhere"
        }
        "QueueQuota" => {
            "quota: the pod's queue is at its limit or may not borrow beyond its guarantee, so it may not take the idle GPUs"
        }
        "InsufficientGpus" | "Unschedulable" => {
            "fragmentation: the idle GPUs are spread over nodes (or over GPUs as shares); no node that passes the pod's filters has as many free as it asks"
        }
        "WaitingForNode" => {
            "reserved: GPUs are held for an older job or a preemptor (a node drains for it) or victims are still terminating"
        }
        "GangIncomplete" => "gang incomplete: fewer members exist than minMember",
        "GpuModel" => "GPU model: the idle GPUs are not of a model the pod accepts",
        "GpuMemory" => "GPU memory: the idle GPUs have less memory than the pod asks",
        "NeverFits" => "never fits: the pod asks more than any node (or its queue) can hold",
        "InsufficientResources" => {
            "CPU or memory: the nodes with idle GPUs lack the CPU, memory or other resources the pod asks"
        }
        "NodeUnavailable" => "the matching nodes are cordoned or down",
        "UnhealthyGpus" => "the GPUs it could use are unhealthy",
        "FitsNow" => "fits: placed by the next cycle",
        _ => "see docs/explain.md",
    }
}

/// Capacity idle while GPU pods waited, and why they waited.
fn idle_section(r: &SimResult) -> String {
    let i = &r.idle;
    let mut h = String::new();
    if i.gpu_hours <= 0.0 {
        return h;
    }
    let _ = write!(
        h,
        r#"<section class="card"><h2>Why GPUs sat idle while pods waited</h2><p class="note">{:.1} GPU-hours (idle GPUs × hours) of schedulable capacity ({:.1}% of it over the run) sat idle while GPU pods were pending. While at least one whole GPU was idle, the waiting pods could not use it because of the reasons below, weighed in pod-hours (waiting pods × hours, whatever each asked; not comparable with GPU-hours):</p><table class="left"><tr><th>reason</th><th>pod-hours</th><th>share</th><th>why the idle GPUs did not help</th></tr>"#,
        i.gpu_hours, i.capacity_pct
    );
    for x in &i.by_reason {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{:.1}</td><td>{:.1}%</td><td>{}</td></tr>",
            esc(&x.reason),
            x.pod_hours,
            x.share_pct,
            idle_meaning(&x.reason)
        );
    }
    h.push_str(r#"</table><p class="note">Reasons as the scheduler's Queue status names them (docs/explain.md), classified at most once a virtual minute; a pod counts for its main reason.</p></section>"#);
    h
}

/// Renders the report page. `wall` (timing measured by the caller) is
/// shown in the footer when given.
pub fn render(r: &SimResult, wall: Option<&WallTiming>) -> String {
    let t = &r.totals;
    let mut h = String::with_capacity(256 * 1024);
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>gpusched simulation · {}</title><style>{CSS}</style></head><body><main>"#,
        esc(&r.scenario)
    );
    let _ = write!(
        h,
        r#"<h1>gpusched simulation</h1><p class="sub">{} · seed {} · scheduler <b>{}</b> · {} nodes, {} GPUs · {} of virtual time · {} cycles · ended: {}</p>"#,
        esc(&r.scenario),
        r.seed,
        esc(&r.scheduler),
        r.nodes,
        r.gpus,
        fmt_duration(r.end_ms),
        r.cycles,
        esc(&r.ended_by)
    );
    // the scenario and configuration in one line
    let queue_names: Vec<String> = r.queues.iter().map(|q| esc(&q.name)).collect();
    let _ = write!(
        h,
        r#"<p class="sub">Workload: {} jobs, {} pods in {} queue(s) ({}); packing policy <b>{}</b>; {} node and GPU incident(s).</p>"#,
        t.jobs,
        t.pods,
        r.queues.len(),
        queue_names.join(", "),
        esc(&r.scheduler),
        r.incidents.len()
    );
    h.push_str(r#"<div class="kpis">"#);
    h += &kpi(
        "GPU allocation",
        format!("{:.1}%", t.alloc_mean_pct),
        format!("mean · peak {:.1}%", t.alloc_peak_pct),
        "",
    );
    h += &kpi(
        "fragmentation",
        format!("{:.1}%", t.frag_mean_pct),
        "of capacity, mean".into(),
        "",
    );
    h += &kpi(
        "jobs completed",
        format!("{}/{}", t.jobs_completed, t.jobs),
        format!(
            "{} failed · {} unfinished",
            t.jobs_failed, t.jobs_unfinished
        ),
        "",
    );
    h += &kpi(
        "queue wait p95",
        secs(t.wait_p95_s),
        format!("p50 {} · p99 {}", secs(t.wait_p50_s), secs(t.wait_p99_s)),
        "",
    );
    h += &kpi(
        "gangs started",
        t.gang_starts.to_string(),
        format!(
            "{} partially · {} restarted",
            t.gangs_started_partially, t.gang_restarts
        ),
        if t.gangs_started_partially == 0 {
            ""
        } else {
            "bad"
        },
    );
    // the terminal's "N pods evicted": every pod stopped by a preemption
    // or reclaim, a victim gang's other members included (#39: the card
    // counted the scheduler's eviction decisions plus moves, another
    // figure under the same word)
    h += &kpi(
        "pods evicted",
        t.evicted_pods.to_string(),
        format!(
            "{} preempted · {} reclaimed (scheduler's decisions; a victim gang's members stop with it) · {} moved",
            t.preemptions, t.reclaims, t.moves
        ),
        "",
    );
    h.push_str("</div>");

    let _ = write!(
        h,
        r#"<section class="card"><h2>GPU allocation over time</h2><p class="note">Share of schedulable GPUs in use (time-weighted per bucket of {}), FGD fragmentation (free GPU capacity the workload's pods are expected not to be able to use), and capacity lost to failures and drains.</p>{}{}</section>"#,
        fmt_duration(r.series.bucket_ms),
        alloc_chart(r),
        pods_chart(r)
    );
    h += &idle_section(r);
    let _ = write!(
        h,
        r#"<div class="grid2"><section class="card"><h2>Queue wait</h2><p class="note">Cumulative share of pods started within a given wait (arrival to first start), per queue.</p>{}</section><section class="card"><h2>Fair share</h2><p class="note">GPUs held on average per queue, against the demand-aware fair share (guarantees first, then weights) and the static entitlement.</p>{}</section></div>"#,
        cdf_chart(r),
        fair_chart(r)
    );
    let _ = write!(
        h,
        r#"<section class="card" style="margin-top:18px"><h2>GPU occupancy per node</h2><p class="note">Share of each node's GPUs in use over time (buckets of {}); hatched: down or cordoned.</p>{}</section>"#,
        fmt_duration(r.heatmap.bucket_ms),
        heatmap(r)
    );

    // queue table
    h.push_str(r#"<section class="card"><h2>Queues</h2><table><tr><th>queue</th><th>weight</th><th>guarantee</th><th>jobs</th><th>done</th><th>wait p50</th><th>wait p95</th><th>wait p99</th><th>JCT p50</th><th>JCT p95</th><th>GPUs held</th><th>fair</th><th>entitled</th><th>held/fair</th><th>preempted</th></tr>"#);
    for (i, q) in r.queues.iter().enumerate() {
        let _ = write!(
            h,
            r#"<tr><td><span class="swatch" style="background:{}"></span>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}</td><td>{:.1}</td><td>{:.1}</td><td>{:.2}</td><td>{}</td></tr>"#,
            PALETTE[i % PALETTE.len()],
            esc(&q.name),
            q.weight,
            q.guarantee_gpus,
            q.jobs,
            q.jobs_completed,
            secs(q.wait_p50_s),
            secs(q.wait_p95_s),
            secs(q.wait_p99_s),
            secs(q.jct_p50_s),
            secs(q.jct_p95_s),
            q.avg_gpus,
            q.fair_gpus,
            q.entitled_gpus,
            q.fairness_ratio,
            q.preempted
        );
    }
    h.push_str("</table></section>");

    // totals
    let rows: Vec<(&str, String)> = vec![
        ("jobs", t.jobs.to_string()),
        ("jobs completed", t.jobs_completed.to_string()),
        ("jobs failed", t.jobs_failed.to_string()),
        ("pods", t.pods.to_string()),
        ("pods succeeded", t.pods_succeeded.to_string()),
        ("pods failed", t.pods_failed.to_string()),
        ("binds", t.binds.to_string()),
        ("preemptions", t.preemptions.to_string()),
        ("reclaims", t.reclaims.to_string()),
        ("moves (consolidation)", t.moves.to_string()),
        (
            "run time lost to moves",
            format!("{:.0} pod-s", t.move_lost_pod_s),
        ),
        ("requeues", t.requeues.to_string()),
        ("nominations", t.nominations.to_string()),
        ("backfilled", t.backfilled.to_string()),
        ("gang starts", t.gang_starts.to_string()),
        (
            "gangs started partially",
            t.gangs_started_partially.to_string(),
        ),
        ("gang restarts", t.gang_restarts.to_string()),
        ("groups timed out", t.groups_timed_out.to_string()),
        ("pods stopped by failures", t.failure_kills.to_string()),
        ("retries (with backoff)", t.retries.to_string()),
        ("failed at retry limit", t.retry_limit_failures.to_string()),
        ("JCT p50", secs(t.jct_p50_s)),
        ("JCT mean", secs(t.jct_mean_s)),
        ("fairness gap", format!("{:.1}%", t.fairness_gap_pct)),
        ("allocation mean", format!("{:.1}%", t.alloc_mean_pct)),
        ("fragmentation mean", format!("{:.1}%", t.frag_mean_pct)),
        ("simulator errors", t.sim_errors.to_string()),
    ];
    h.push_str(r#"<section class="card"><h2>Totals</h2><dl class="tot">"#);
    for (k, v) in rows {
        let _ = write!(h, "<div><dt>{}</dt><dd>{}</dd></div>", esc(k), esc(&v));
    }
    h.push_str("</dl>");
    if !t.evictions_by_reason.is_empty() {
        h.push_str(r#"<p class="note" style="margin-top:12px">Evictions by reason: "#);
        let parts: Vec<String> = t
            .evictions_by_reason
            .iter()
            .map(|(k, v)| format!("{} × {v}", esc(k)))
            .collect();
        h += &parts.join(" · ");
        h.push_str("</p>");
    }
    if !r.errors.is_empty() {
        h.push_str(r#"<p class="note">Simulator errors (refused decisions):</p>"#);
        for e in &r.errors {
            let _ = write!(h, r#"<div class="err">{}</div>"#, esc(e));
        }
    }
    h.push_str("</section>");
    if !r.failed_jobs.is_empty() {
        let _ = write!(
            h,
            r#"<section class="card"><h2>Failed jobs</h2><p class="note">{} job(s) failed{}.</p><table class="left"><tr><th>job</th><th>queue</th><th>time</th><th>why</th></tr>"#,
            t.jobs_failed,
            if (t.jobs_failed as usize) > r.failed_jobs.len() {
                format!("; the first {} are listed", r.failed_jobs.len())
            } else {
                String::new()
            }
        );
        for j in &r.failed_jobs {
            let _ = write!(
                h,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(&j.job),
                esc(&j.queue),
                fmt_duration(j.at_ms),
                esc(&j.why)
            );
        }
        h.push_str("</table></section>");
    }
    if !r.incidents.is_empty() {
        h.push_str(r#"<section class="card"><h2>Incidents</h2><table class="left"><tr><th>#</th><th>time</th><th>event</th><th>node</th><th>pods stopped</th></tr>"#);
        let mut num = 0;
        for i in &r.incidents {
            let n = if is_bad(&i.what) {
                num += 1;
                num.to_string()
            } else {
                String::new()
            };
            let _ = write!(
                h,
                "<tr><td>{n}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                fmt_duration(i.t_ms),
                esc(&i.what),
                esc(&i.node),
                i.pods_stopped
            );
        }
        h.push_str("</table></section>");
    }
    h.push_str("<footer>");
    if let Some(w) = wall {
        let _ = write!(
            h,
            "Wall time {:.2} s · {} cycles · per cycle mean {:.3} ms, p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms. ",
            w.total_s, w.cycles, w.cycle_mean_ms, w.cycle_p50_ms, w.cycle_p99_ms, w.cycle_max_ms
        );
    }
    h.push_str("Generated by <code>gpusched simulate</code>; metric definitions in docs/simulator.md.</footer></main></body></html>\n");
    h
}

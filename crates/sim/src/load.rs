//! Reading cluster and workload files, with errors that name the file, the
//! line and the field.

pub use crate::error::LoadError;
use crate::error::source_line;
use crate::workload::{Ctx, Scenario, WorkloadFile};
use gpusched_model::Node;
use gpusched_model::spec::ClusterSpec;
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// The embedded default cluster (also `fixtures/clusters/mixed.yaml`).
pub const DEFAULT_CLUSTER: &str = include_str!("../../../fixtures/clusters/mixed.yaml");
/// The embedded default workload (also `fixtures/workloads/mixed.yaml`).
pub const DEFAULT_WORKLOAD: &str = include_str!("../../../fixtures/workloads/mixed.yaml");

impl LoadError {
    fn from_yaml(file: &str, text: &str, e: &serde_saphyr::Error) -> Self {
        let (line, column) = e
            .location()
            .map(|l| (l.line(), l.column()))
            .unwrap_or((0, 0));
        let mut message = e.without_snippet().to_string();
        // drop the "error: line N column M: " prefix: we print our own
        if let Some(s) = message.strip_prefix("error: ") {
            message = s.to_string();
        }
        if message.starts_with("line ")
            && let Some(i) = message.find(": ")
        {
            message = message[i + 2..].to_string();
        }
        message = message.lines().next().unwrap_or("").trim().to_string();
        if let Some(i) = message.rfind(" at line ") {
            message.truncate(i);
        }
        let message = plain_type_error(&message);
        let named = between(&message, "field `", "`");
        let tree = serde_saphyr::from_str::<Spanned<Tree>>(text).ok();
        let mut line = line;
        let mut column = column;
        let found = tree.as_ref().and_then(|t| {
            let mut best = None;
            t.value.find(line, column, String::new(), &mut best);
            best
        });
        let field = match (named, found) {
            (Some(n), Some(hit)) if message.starts_with("missing field") => {
                // point at the mapping that lacks the field
                if let Some((l, c)) = hit.container_at {
                    line = l;
                    column = c;
                }
                join(&hit.container, &n)
            }
            (_, Some(hit)) => hit.path,
            (Some(n), None) => n,
            (None, None) => key_on_line(text, line).unwrap_or_default(),
        };
        LoadError::at(file, text, line, column, field, message)
    }
}

/// The parser's type names in words a user reads (`invalid u32` →
/// `must be a whole number from 0 to 4294967295`); other messages as they
/// are.
fn plain_type_error(message: &str) -> String {
    let words = match message.trim() {
        "invalid u8" => "must be a whole number from 0 to 255",
        "invalid u16" => "must be a whole number from 0 to 65535",
        "invalid u32" => "must be a whole number from 0 to 4294967295",
        "invalid u64" | "invalid usize" => "must be a whole number ≥ 0",
        "invalid i8" | "invalid i16" | "invalid i32" | "invalid i64" | "invalid isize" => {
            "must be a whole number"
        }
        "invalid f32" | "invalid f64" => "must be a number",
        "invalid bool" => "must be true or false",
        _ => return message.to_string(),
    };
    words.to_string()
}

fn join(parent: &str, key: &str) -> String {
    if parent.is_empty() {
        key.to_string()
    } else {
        format!("{parent}.{key}")
    }
}

fn between(s: &str, a: &str, b: &str) -> Option<String> {
    let i = s.find(a)? + a.len();
    let j = s[i..].find(b)? + i;
    Some(s[i..j].to_string())
}

fn key_on_line(text: &str, line: u64) -> Option<String> {
    let l = source_line(text, line);
    let t = l.trim_start().trim_start_matches("- ").trim_start();
    let (k, _) = t.split_once(':')?;
    (!k.is_empty() && !k.contains(' ')).then(|| k.to_string())
}

/// A YAML document reduced to its shape and locations, to find the line of
/// a field path after typed parsing succeeded.
#[derive(Debug)]
enum Tree {
    Map(Vec<(Spanned<String>, Spanned<Tree>)>),
    Seq(Vec<Spanned<Tree>>),
    Leaf,
}

impl<'de> Deserialize<'de> for Tree {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Tree;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any YAML value")
            }
            fn visit_bool<E>(self, _: bool) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_i64<E>(self, _: i64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_u64<E>(self, _: u64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_f64<E>(self, _: f64) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_str<E>(self, _: &str) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_unit<E>(self) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_none<E>(self) -> Result<Tree, E> {
                Ok(Tree::Leaf)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Tree, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(Tree::Seq(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut a: A) -> Result<Tree, A::Error> {
                let mut v = Vec::new();
                while let Some((k, x)) = a.next_entry::<Spanned<String>, Spanned<Tree>>()? {
                    v.push((k, x));
                }
                Ok(Tree::Map(v))
            }
        }
        d.deserialize_any(V)
    }
}

/// Where an error position falls in a [`Tree`].
struct Hit {
    /// Path of the entry whose key or value is at the position.
    path: String,
    /// Path of the mapping holding that entry, and its first key's place.
    container: String,
    container_at: Option<(u64, u64)>,
    /// Whether the key or value starts exactly at the position.
    exact: bool,
}

impl Tree {
    /// The deepest entry whose key or value starts at `(line, col)`; when
    /// none does, the deepest whose value starts on `line`.
    fn find(&self, line: u64, col: u64, path: String, best: &mut Option<Hit>) {
        match self {
            Tree::Map(m) => {
                let first = m
                    .first()
                    .map(|(k, _)| (k.referenced.line(), k.referenced.column()));
                for (k, v) in m {
                    let p = join(&path, &k.value);
                    let exact = (k.referenced.line() == line && k.referenced.column() == col)
                        || (v.referenced.line() == line && v.referenced.column() == col);
                    let on_line = k.referenced.line() == line || v.referenced.line() == line;
                    let take = match best.as_ref() {
                        None => exact || on_line,
                        Some(h) => exact || (on_line && !h.exact),
                    };
                    if take {
                        *best = Some(Hit {
                            path: p.clone(),
                            container: path.clone(),
                            container_at: first,
                            exact,
                        });
                    }
                    v.value.find(line, col, p, best);
                }
            }
            Tree::Seq(s) => {
                for (i, v) in s.iter().enumerate() {
                    v.value.find(line, col, format!("{path}[{i}]"), best);
                }
            }
            Tree::Leaf => {}
        }
    }

    /// Line of a path like `nodes[2].gpus.memory`: the deepest prefix found.
    fn line_of(&self, segs: &[Seg]) -> Option<(u64, u64)> {
        let (first, rest) = segs.split_first()?;
        let child = match (self, first) {
            (Tree::Map(m), Seg::Key(k)) => m.iter().find(|(x, _)| &x.value == k).map(|x| &x.1),
            (Tree::Seq(s), Seg::Index(i)) => s.get(*i),
            _ => None,
        }?;
        let here = (child.referenced.line(), child.referenced.column());
        Some(child.value.line_of(rest).unwrap_or(here))
    }
}

enum Seg {
    Key(String),
    Index(usize),
}

fn parse_path(p: &str) -> Vec<Seg> {
    let mut out = Vec::new();
    for part in p.split('.') {
        let (key, idx) = match part.split_once('[') {
            Some((k, rest)) => (k, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        if !key.is_empty() {
            out.push(Seg::Key(key.to_string()));
        }
        if let Some(i) = idx {
            out.push(Seg::Index(i));
        }
    }
    out
}

/// Parses a cluster file (`model::spec::ClusterSpec`) and builds its nodes.
pub fn parse_cluster(file: &str, text: &str) -> Result<Vec<Node>, LoadError> {
    let spec: ClusterSpec =
        serde_saphyr::from_str(text).map_err(|e| LoadError::from_yaml(file, text, &e))?;
    if spec.nodes.is_empty() {
        return Err(LoadError::file(file, "field `nodes`: no node groups"));
    }
    let located = |path: String, why: String| {
        let (line, column) = serde_saphyr::from_str::<Spanned<Tree>>(text)
            .ok()
            .and_then(|t| t.value.line_of(&parse_path(&path)))
            .unwrap_or((0, 0));
        LoadError::at(file, text, line, column, path, why)
    };
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

/// Parses any YAML document into `T`, with located errors.
pub fn parse_yaml<T: serde::de::DeserializeOwned>(file: &str, text: &str) -> Result<T, LoadError> {
    serde_saphyr::from_str(text).map_err(|e| LoadError::from_yaml(file, text, &e))
}

/// Parses a workload file (schema in `docs/simulator.md`).
pub fn parse_workload(file: &str, text: &str) -> Result<WorkloadFile, LoadError> {
    serde_saphyr::from_str(text).map_err(|e| LoadError::from_yaml(file, text, &e))
}

/// Reads a file, naming it in the error.
pub fn read(path: &std::path::Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path)
        .map_err(|e| LoadError::file(&path.display().to_string(), format!("cannot read: {e}")))
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

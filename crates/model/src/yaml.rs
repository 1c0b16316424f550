//! YAML files read with errors that say where (file, line, column, field)
//! and why: one reader for every file gpusched takes from a user (the
//! simulator's cluster and workload files, the scheduler configuration).
//! Pure: text in, typed value or located error out (no file system but
//! [`read`]).

use serde::de::{Deserialize, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_saphyr::Spanned;
use std::fmt;

/// A refused file: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadError {
    /// The file's name as given.
    pub file: String,
    /// 1-based; 0 when unknown (e.g. the file could not be read).
    pub line: u64,
    /// 1-based; 0 when unknown.
    pub column: u64,
    /// Path of the offending field (`jobs[2].requests.nvidia.com/gpu`);
    /// empty when the error is not about one field (YAML syntax).
    pub field: String,
    /// What is wrong.
    pub message: String,
    /// The offending source line, for display.
    pub source_line: String,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file)?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.column)?;
        }
        if !self.field.is_empty() {
            write!(f, ": field `{}`", self.field)?;
        }
        write!(f, ": {}", self.message)?;
        if self.line > 0 && !self.source_line.trim().is_empty() {
            write!(f, "\n  {:>4} | {}", self.line, self.source_line)?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

impl LoadError {
    /// An error at `line`:`column` of `file` (whose contents are `text`),
    /// about `field`.
    pub fn at(
        file: &str,
        text: &str,
        line: u64,
        column: u64,
        field: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        LoadError {
            file: file.to_string(),
            line,
            column,
            field: field.into(),
            message: message.into(),
            source_line: source_line(text, line),
        }
    }

    /// An error about the file as a whole.
    pub fn file(file: &str, message: impl Into<String>) -> Self {
        LoadError {
            file: file.to_string(),
            line: 0,
            column: 0,
            field: String::new(),
            message: message.into(),
            source_line: String::new(),
        }
    }
}

/// Line `line` (1-based) of `text`, for display; empty for line 0.
pub fn source_line(text: &str, line: u64) -> String {
    if line == 0 {
        return String::new();
    }
    text.lines()
        .nth(line as usize - 1)
        .unwrap_or("")
        .trim_end()
        .to_string()
}

/// Parses a YAML document of `file` (contents `text`) into `T`, with
/// located errors.
pub fn parse<T: DeserializeOwned>(file: &str, text: &str) -> Result<T, LoadError> {
    serde_saphyr::from_str(text).map_err(|e| LoadError::from_yaml(file, text, &e))
}

/// An error about the field at `path` (`nodes[2].gpus.memory`) of a
/// document that parsed: located at the deepest prefix of the path found.
pub fn at_path(file: &str, text: &str, path: String, why: String) -> LoadError {
    let (line, column) = serde_saphyr::from_str::<Spanned<Tree>>(text)
        .ok()
        .and_then(|t| t.value.line_of(&parse_path(&path)))
        .unwrap_or((0, 0));
    LoadError::at(file, text, line, column, path, why)
}

/// Reads a file, naming it in the error.
pub fn read(path: &std::path::Path) -> Result<String, LoadError> {
    std::fs::read_to_string(path)
        .map_err(|e| LoadError::file(&path.display().to_string(), format!("cannot read: {e}")))
}

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

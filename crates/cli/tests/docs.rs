//! The docs check (issue 40): what README.md, docs/*.md, deploy/README.md
//! and examples/ tell a user names things that exist.
//!
//! * **Paths.** Every token that starts with a top-level directory of the
//!   repository (`crates/`, `docs/`, `deploy/`, `e2e/`, `scripts/`,
//!   `fixtures/`, `examples/`, `.ci/`) or is a top-level file
//!   (`README.md`, `BENCHMARKS.md`, …) exists, wherever it stands: prose,
//!   code spans, code blocks, YAML comments. A token starts after a space,
//!   a backtick, a bracket, a quote, `=`, `,` or the start of a line (not
//!   after `/` or a letter, so URLs and `../shared/…` are not ours), and
//!   ends at a space, a backtick, a quote, a bracket or `|`; trailing
//!   punctuation, a `:LINE` suffix and a `#anchor` are dropped. A
//!   placeholder (`<kind>`, `NAME`-style capitals, `…`, `...`, `*`, `{`)
//!   ends the checked part: the directory before it must exist. Markdown
//!   link targets (`[text](target)`) are resolved from the file's own
//!   directory and must exist too (URLs and `#anchors` aside). On a line
//!   with `kubectl `, a two-part token without a dot (`deploy/NAME`) is
//!   kubectl's TYPE/NAME, not a path.
//! * **Flags.** Every `--flag` shown for `gpusched <verb> [<subverb>]` (or
//!   `kubectl gpusched <verb>`) is in that verb's `--help`: flags on a
//!   command line in a code block or code span (up to `|`, `;`, `&&`,
//!   `#` or the next command; a code line ending in `\`, or one of flags
//!   alone under a command line, continues it), code spans starting with
//!   `--` in a table
//!   row whose first cell is such a command, and those in the first column
//!   of a `| flag |` table, which belongs to the last command named above
//!   the table in the file.
//!   docs/agent.md names every flag of `gpusched agent`, docs/kubernetes.md
//!   every flag of `gpusched scheduler`.
//! * **Tables.** A table row right after a blank line has a header under
//!   it (else a blank line cut a table in two).
//! * **Metrics** are checked by `tests/dashboards.rs` (the registries
//!   themselves, not the source).
//!
//! Every miss is printed as `file:line: …` before the test fails.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

const TOP_DIRS: &[&str] = &[
    "crates/",
    "docs/",
    "deploy/",
    "e2e/",
    "scripts/",
    "fixtures/",
    "examples/",
    ".ci/",
];
const TOP_FILES: &[&str] = &[
    "README.md",
    "BENCHMARKS.md",
    "LICENSE",
    "Cargo.toml",
    "Cargo.lock",
    "plugin.yaml",
];

/// The documents the check reads, relative to the root.
fn documents() -> Vec<PathBuf> {
    let root = root();
    let mut out = vec![
        PathBuf::from("README.md"),
        PathBuf::from("deploy/README.md"),
    ];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| p.strip_prefix(&root).unwrap().to_path_buf())
        .collect();
    docs.sort();
    out.extend(docs);
    let mut stack = vec![root.join("examples")];
    let mut examples = Vec::new();
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read_to_string(&p).is_ok() {
                examples.push(p.strip_prefix(&root).unwrap().to_path_buf());
            }
        }
    }
    examples.sort();
    out.extend(examples);
    assert!(out.len() > 10, "too few documents: {out:?}");
    out
}

// ---------------------------------------------------------------- paths

fn is_boundary_before(c: Option<char>) -> bool {
    match c {
        None => true,
        Some(c) => c.is_whitespace() || "`([{\"'=,>*".contains(c),
    }
}

/// A path ends here (not at `<`/`>`: a placeholder may be part of it).
fn ends_token(c: char) -> bool {
    c.is_whitespace() || "`\"'()[]|".contains(c)
}

/// A placeholder segment: `<kind>`, `NAME`, `NS`, `…`, `...`, `*`, `{a,b}`.
fn is_placeholder(seg: &str) -> bool {
    let stem = seg.split('.').next().unwrap_or(seg);
    seg.contains('<')
        || seg.contains('…')
        || seg.contains("...")
        || seg.contains('*')
        || seg.contains('{')
        || (stem.len() >= 2
            && stem
                .chars()
                .all(|c| c.is_ascii_uppercase() || c == '_' || c.is_ascii_digit())
            && stem.chars().any(|c| c.is_ascii_uppercase())
            && !TOP_FILES.contains(&seg))
}

/// Repository paths named on one line.
fn path_tokens(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let chars: Vec<(usize, char)> = line.char_indices().collect();
    for (k, &(i, _)) in chars.iter().enumerate() {
        let before = if k == 0 { None } else { Some(chars[k - 1].1) };
        if !is_boundary_before(before) {
            continue;
        }
        let rest = &line[i..];
        let rest = rest.strip_prefix("./").unwrap_or(rest);
        let starts_dir = TOP_DIRS.iter().any(|d| rest.starts_with(d));
        let starts_file = TOP_FILES.iter().any(|f| {
            rest.starts_with(f)
                && !rest[f.len()..]
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-' || c == '/')
        });
        if !starts_dir && !starts_file {
            continue;
        }
        let end = rest
            .char_indices()
            .find(|&(_, c)| ends_token(c))
            .map_or(rest.len(), |(j, _)| j);
        out.push(rest[..end].to_string());
    }
    out
}

/// Normalises a token to the part that must exist, or `None` when nothing
/// is left to check.
fn checkable(token: &str) -> Option<String> {
    let mut t = token.split('#').next().unwrap_or("").to_string();
    loop {
        let trimmed = t.trim_end_matches(['.', ',', ';', ':', '!', '?', '\'', '"', '`']);
        // `file.rs:42`
        let trimmed = match trimmed.rsplit_once(':') {
            Some((a, b)) if !b.is_empty() && b.chars().all(|c| c.is_ascii_digit() || c == '-') => a,
            _ => trimmed,
        };
        if trimmed.len() == t.len() {
            break;
        }
        t = trimmed.to_string();
    }
    let mut kept = Vec::new();
    let segs: Vec<&str> = t.split('/').collect();
    for seg in &segs {
        if is_placeholder(seg) {
            // the directory before the placeholder
            return if kept.is_empty() {
                None
            } else {
                Some(format!("{}/", kept.join("/")))
            };
        }
        kept.push(*seg);
    }
    if t.is_empty() { None } else { Some(t) }
}

/// `[text](target)` targets on a line.
fn link_targets(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(p) = rest.find("](") {
        let after = &rest[p + 2..];
        let Some(e) = after.find(')') else { break };
        out.push(after[..e].to_string());
        rest = &after[e..];
    }
    out
}

#[test]
fn every_named_path_exists() {
    let root = root();
    let mut misses = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let dir = doc.parent().unwrap_or(Path::new(""));
        for (n, line) in text.lines().enumerate() {
            let kubectl = line.contains("kubectl ");
            for token in path_tokens(line) {
                // kubectl's TYPE/NAME (`kubectl port-forward deploy/x`)
                if kubectl && token.split('/').count() == 2 && !token.contains('.') {
                    continue;
                }
                let Some(p) = checkable(&token) else { continue };
                checked += 1;
                if !root.join(&p).exists() {
                    misses.push(format!("{}:{}: {p} (from {token:?})", doc.display(), n + 1));
                }
            }
            if doc.extension().is_some_and(|e| e == "md") {
                for target in link_targets(line) {
                    let t = target.split('#').next().unwrap_or("");
                    if t.is_empty() || t.contains("://") || t.starts_with("mailto:") {
                        continue;
                    }
                    checked += 1;
                    if !root.join(dir).join(t).exists() {
                        misses.push(format!(
                            "{}:{}: link target {target:?} (from {})",
                            doc.display(),
                            n + 1,
                            dir.display()
                        ));
                    }
                }
            }
        }
    }
    for m in &misses {
        eprintln!("{m}");
    }
    assert!(
        checked > 100,
        "too few paths found ({checked}): the rule broke"
    );
    assert!(
        misses.is_empty(),
        "{} path(s) named in the docs do not exist (listed above)",
        misses.len()
    );
}

#[test]
fn path_rule() {
    let t = |l: &str| {
        path_tokens(l)
            .iter()
            .filter_map(|t| checkable(t))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        t("see `crates/k8s/src/exec/<kind>.rs` and (docs/dra.md, *One world*)."),
        vec!["crates/k8s/src/exec/", "docs/dra.md"]
    );
    assert_eq!(
        t("https://x.io/docs/a.md ../shared/traces/ `fixtures/clusters/….yaml`"),
        vec!["fixtures/clusters/"]
    );
    assert_eq!(
        t("crates/k8s/src/rbac.rs:42, scripts/tryout up; README.md's table"),
        vec!["crates/k8s/src/rbac.rs", "scripts/tryout", "README.md"]
    );
    assert_eq!(t("--cluster=fixtures/NODES.csv"), vec!["fixtures/"]);
    assert_eq!(
        link_targets("[a](docs/x.md) and [b](../BENCHMARKS.md#5)"),
        vec!["docs/x.md", "../BENCHMARKS.md#5"]
    );
}

// ---------------------------------------------------------------- tables

/// A table row after a blank line starts a new table, which needs a header:
/// a row there without a `|---|` line under it is a table cut in two by a
/// blank line (Markdown renders the rows after it as text).
#[test]
fn no_table_is_cut_by_a_blank_line() {
    let root = root();
    let mut misses = Vec::new();
    for doc in documents() {
        if doc.extension().is_none_or(|e| e != "md") {
            continue;
        }
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        let mut in_block = false;
        for (i, l) in lines.iter().enumerate() {
            if l.trim_start().starts_with("```") {
                in_block = !in_block;
            }
            let starts_table =
                !in_block && l.starts_with('|') && (i == 0 || lines[i - 1].trim().is_empty());
            let has_header = lines
                .get(i + 1)
                .is_some_and(|n| n.starts_with('|') && n.contains("---"));
            if starts_table && !has_header {
                misses.push(format!("{}:{}: {l}", doc.display(), i + 1));
            }
        }
    }
    assert!(
        misses.is_empty(),
        "table rows without a header (a blank line cut the table?):\n{}",
        misses.join("\n")
    );
}

// ---------------------------------------------------------------- flags

/// One verb's `--help`: its flags and its subcommands.
struct Help {
    flags: BTreeSet<String>,
    subcommands: BTreeSet<String>,
}

/// A verb path: (run as `kubectl gpusched`, the verb words).
type Verb = (bool, Vec<String>);

struct Cli {
    bin: PathBuf,
    plugin: PathBuf,
    _dir: tempfile::TempDir,
    cache: std::cell::RefCell<BTreeMap<Verb, Option<std::rc::Rc<Help>>>>,
}

impl Cli {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plugin = dir.path().join("kubectl-gpusched");
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_gpusched"), &plugin).unwrap();
        Cli {
            bin: PathBuf::from(env!("CARGO_BIN_EXE_gpusched")),
            plugin,
            _dir: dir,
            cache: Default::default(),
        }
    }

    /// The `--help` of `path` (empty: the top level); `None` when there is
    /// no such verb.
    fn help(&self, plugin: bool, path: &[String]) -> Option<std::rc::Rc<Help>> {
        let key = (plugin, path.to_vec());
        if let Some(h) = self.cache.borrow().get(&key) {
            return h.clone();
        }
        let bin = if plugin { &self.plugin } else { &self.bin };
        let out = Command::new(bin).args(path).arg("--help").output().unwrap();
        let h = out.status.success().then(|| {
            let text = String::from_utf8(out.stdout).unwrap();
            std::rc::Rc::new(parse_help(&text))
        });
        self.cache.borrow_mut().insert(key, h.clone());
        h
    }
}

fn parse_help(text: &str) -> Help {
    let mut flags = BTreeSet::new();
    let mut subcommands = BTreeSet::new();
    let mut in_commands = false;
    for l in text.lines() {
        let t = l.trim_start();
        if l.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if in_commands {
            if l.trim().is_empty() || !l.starts_with(' ') {
                in_commands = false;
            } else if l.starts_with("  ") && !l.starts_with("        ") {
                if let Some(w) = t.split_whitespace().next() {
                    subcommands.insert(w.to_string());
                }
                continue;
            }
        }
        if t.starts_with('-') {
            for w in t.split([' ', ',', '=', '[', '<']) {
                if w.starts_with("--") && w.len() > 2 {
                    flags.insert(w.to_string());
                }
            }
        }
    }
    subcommands.remove("help");
    Help { flags, subcommands }
}

/// A command found in a document: `gpusched` words (plugin: through
/// kubectl) and the words after it up to the end of the command.
#[derive(Clone, Debug)]
struct Found {
    plugin: bool,
    words: Vec<String>,
}

/// The commands of one command text (a code-block line or a code span).
fn commands(text: &str) -> Vec<Found> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out: Vec<Found> = Vec::new();
    let mut cur: Option<Found> = None;
    for (i, w) in words.iter().enumerate() {
        let bare = w.trim_start_matches(['(', '$', '`']);
        let is_cmd = bare == "gpusched" || bare.ends_with("/gpusched");
        if is_cmd {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            let plugin = i > 0 && words[i - 1].ends_with("kubectl");
            cur = Some(Found {
                plugin,
                words: Vec::new(),
            });
            continue;
        }
        if ["|", "||", "&&", ";", "#", "\\|"].contains(w) || w.starts_with('#') {
            if let Some(c) = cur.take() {
                out.push(c);
            }
            continue;
        }
        if let Some(c) = cur.as_mut() {
            c.words.push(w.to_string());
            if w.ends_with(';') {
                out.push(cur.take().unwrap());
            }
        }
    }
    if let Some(c) = cur {
        out.push(c);
    }
    out
}

fn flag_of(word: &str) -> Option<String> {
    let w = word.trim_start_matches(['[', '(', '`', '\'', '"']);
    if !w.starts_with("--") || w.len() < 3 {
        return None;
    }
    let end = w[2..]
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .map_or(w.len(), |j| j + 2);
    let f = &w[..end];
    (f.len() > 2 && f.as_bytes()[2].is_ascii_alphabetic()).then(|| f.to_string())
}

/// What a document shows of one verb path: flags with their lines.
#[derive(Default)]
struct Shown {
    /// (plugin, verb path, flag, file, line)
    uses: Vec<(bool, Vec<String>, String, String, usize)>,
    misses: Vec<String>,
}

/// Resolves a command's verb path against the CLI; the rest of its words
/// are checked for flags.
fn resolve(cli: &Cli, c: &Found) -> Option<(Vec<String>, Vec<String>)> {
    let mut path = Vec::new();
    let mut i = 0;
    let top = cli.help(c.plugin, &[])?;
    let mut subs = top.subcommands.clone();
    while i < c.words.len() {
        let w = c.words[i].trim_end_matches([',', '.', ')', '`']);
        if !subs.contains(w) {
            break;
        }
        path.push(w.to_string());
        i += 1;
        subs = cli.help(c.plugin, &path)?.subcommands.clone();
    }
    if path.is_empty() {
        // `gpusched` as a word in prose (the binary, the scheduler name)
        return None;
    }
    Some((path, c.words[i..].to_vec()))
}

/// Code-span texts of a line (outside code blocks).
fn spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

fn scan(cli: &Cli, doc: &str, text: &str, shown: &mut Shown) {
    let mut in_block = false;
    let mut last: Option<Verb> = None;
    // the command of the previous code line
    let mut block_cmd: Option<Verb> = None;
    // the command a `| flag |` table belongs to
    let mut flag_table: Option<Verb> = None;
    let mut pending = String::new();
    let use_flag = |plugin: bool, path: &[String], f: String, line: usize, shown: &mut Shown| {
        shown
            .uses
            .push((plugin, path.to_vec(), f, doc.to_string(), line));
    };
    for (n, line) in text.lines().enumerate() {
        let lineno = n + 1;
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            block_cmd = None;
            continue;
        }
        let indented_block = !in_block && line.starts_with("    ") && !line.trim().is_empty();
        if in_block || indented_block || doc.ends_with(".yaml") {
            pending.push_str(line.trim_end_matches('\\'));
            pending.push(' ');
            if line.ends_with('\\') {
                continue;
            }
            let cmdline = std::mem::take(&mut pending);
            let found = commands(&cmdline);
            // a line of flags alone under a command (`    [--a X] [--b]`)
            // continues it
            let t = cmdline.trim_start();
            if found.is_empty() && (t.starts_with("--") || t.starts_with("[--")) {
                if let Some((plugin, path)) = &block_cmd {
                    for w in cmdline.split_whitespace() {
                        if let Some(f) = flag_of(w) {
                            use_flag(*plugin, path, f, lineno, shown);
                        }
                    }
                }
                continue;
            }
            block_cmd = None;
            for c in found {
                if let Some((path, rest)) = resolve(cli, &c) {
                    for w in &rest {
                        if let Some(f) = flag_of(w) {
                            use_flag(c.plugin, &path, f, lineno, shown);
                        }
                    }
                    last = Some((c.plugin, path.clone()));
                    block_cmd = Some((c.plugin, path));
                }
            }
            continue;
        }
        let cells: Vec<&str> = line.split(" | ").collect();
        let is_row = line.trim_start().starts_with('|');
        if is_row {
            let first = cells[0].trim_start_matches('|').trim();
            if first == "flag" {
                flag_table = last.clone();
                if last.is_none() {
                    shown.misses.push(format!(
                        "{doc}:{lineno}: a flag table with no command above it"
                    ));
                }
                continue;
            }
            if line.starts_with("|---") {
                continue;
            }
        } else {
            flag_table = None;
        }
        // commands in code spans
        let mut row_cmd: Option<Verb> = None;
        for (k, cell) in cells.iter().enumerate() {
            for span in spans(cell) {
                let found = commands(span);
                let mut resolved = false;
                for c in &found {
                    if let Some((path, rest)) = resolve(cli, c) {
                        resolved = true;
                        for w in &rest {
                            if let Some(f) = flag_of(w) {
                                use_flag(c.plugin, &path, f, lineno, shown);
                            }
                        }
                        if is_row && k == 0 && row_cmd.is_none() {
                            row_cmd = Some((c.plugin, path.clone()));
                        }
                        last = Some((c.plugin, path));
                    }
                }
                if resolved || found.iter().any(|c| !c.words.is_empty()) {
                    continue;
                }
                // a bare flag span (`--x …`): in a command's table row, or
                // the first column of a flag table
                if !span.trim_start().starts_with("--") {
                    continue;
                }
                let owner = if let Some(rc) = &row_cmd {
                    Some(rc.clone())
                } else if k == 0 {
                    flag_table.clone()
                } else {
                    None
                };
                if let Some((plugin, path)) = owner {
                    for w in span.split_whitespace() {
                        if let Some(f) = flag_of(w) {
                            use_flag(plugin, &path, f, lineno, shown);
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn every_shown_flag_is_in_its_verbs_help() {
    let cli = Cli::new();
    let root = root();
    let mut shown = Shown::default();
    for doc in documents() {
        let d = doc.display().to_string();
        let text = std::fs::read_to_string(root.join(&doc)).unwrap();
        scan(&cli, &d, &text, &mut shown);
    }
    let mut misses = std::mem::take(&mut shown.misses);
    for (plugin, path, flag, doc, line) in &shown.uses {
        if flag == "--help" || flag == "--version" {
            continue;
        }
        let verb = format!(
            "{}gpusched {}",
            if *plugin { "kubectl " } else { "" },
            path.join(" ")
        );
        match cli.help(*plugin, path) {
            None => misses.push(format!("{doc}:{line}: `{verb}` is no command")),
            Some(h) if !h.flags.contains(flag) => {
                misses.push(format!("{doc}:{line}: {flag} is not in `{verb} --help`"))
            }
            Some(_) => {}
        }
    }
    for m in &misses {
        eprintln!("{m}");
    }
    assert!(
        shown.uses.len() > 50,
        "too few flags found ({}): the rule broke",
        shown.uses.len()
    );
    assert!(
        misses.is_empty(),
        "{} flag(s) shown in the docs are not in their verb's --help (listed above)",
        misses.len()
    );
}

/// The flag references: docs/agent.md names every flag of `gpusched agent
/// --help`, docs/kubernetes.md every flag of `gpusched scheduler --help`.
#[test]
fn the_flag_references_are_complete() {
    let cli = Cli::new();
    let mut incomplete = Vec::new();
    for (doc, verb) in [
        ("docs/agent.md", "agent"),
        ("docs/kubernetes.md", "scheduler"),
    ] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap();
        let mut shown = Shown::default();
        scan(&cli, doc, &text, &mut shown);
        let documented: BTreeSet<&str> = shown
            .uses
            .iter()
            .filter(|u| !u.0 && u.1 == [verb])
            .map(|u| u.2.as_str())
            .collect();
        let help = cli.help(false, &[verb.to_string()]).unwrap();
        let missing: Vec<&String> = help
            .flags
            .iter()
            .filter(|f| *f != "--help" && *f != "--version" && !documented.contains(f.as_str()))
            .collect();
        if !missing.is_empty() {
            incomplete.push(format!("{doc} lacks `gpusched {verb}`'s {missing:?}"));
        }
    }
    assert!(incomplete.is_empty(), "{}", incomplete.join("\n"));
}

#[test]
fn command_rule() {
    let c = commands(
        "kubectl gpusched pending --queue research | head; gpusched explain pod a/b --from-sim x",
    );
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(c[0].plugin);
    assert_eq!(c[0].words, vec!["pending", "--queue", "research"]);
    assert_eq!(c[1].words, vec!["explain", "pod", "a/b", "--from-sim", "x"]);
    assert_eq!(flag_of("[--queue"), Some("--queue".into()));
    assert_eq!(
        flag_of("--pass-device-specs[=BOOL]"),
        Some("--pass-device-specs".into())
    );
    assert_eq!(flag_of("--mode=dra`,"), Some("--mode".into()));
    assert_eq!(flag_of("--"), None);
    let h = parse_help(
        "Usage: x\n\nCommands:\n  pod    why\n  queue  a queue\n  help   Print\n\nOptions:\n  -o, --output <F>  out\n      --from-sim <FILE>\n          more --not-a-flag\n",
    );
    assert_eq!(
        h.subcommands.iter().collect::<Vec<_>>(),
        vec!["pod", "queue"]
    );
    assert_eq!(
        h.flags.iter().collect::<Vec<_>>(),
        vec!["--from-sim", "--output"]
    );
}

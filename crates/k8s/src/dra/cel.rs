//! CEL device selectors: the Kubernetes DRA environment on the `cel` crate.
//!
//! A selector sees one variable, `device`, with `device.driver`,
//! `device.attributes[domain].name` and `device.capacity[domain].name`
//! (and `device.allowMultipleAllocations`). Quantities (capacities and
//! `quantity("80Gi")`) are integers of milli-units here, so they compare
//! with `compareTo`, `isGreaterThan`, `isLessThan` as upstream's do, and
//! `asInteger()` gives whole units. `semver("1.2.3")` gives a version that
//! compares the same way with version attributes.
//!
//! Each expression is interned (one id per distinct text) and compiled
//! once; each (expression id, device serial) result is kept. Both caches
//! are bounded by bytes ([`Limits`]): a request may carry 32 selectors of
//! 10 KiB, and a result keyed by the expression's text held one copy of it
//! per device (#38: a few such claims on ~8,000 devices reached the
//! chart's memory limit). When an insert would pass a bound, that cache
//! starts over (clear-on-full: deterministic, and the working set of one
//! cycle is rebuilt by re-evaluating, which costs time, never memory).
//! Compiled programs are accounted by an estimate (the `cel` crate does
//! not expose their size): [`PROGRAM_BYTES_PER_SOURCE_BYTE`] per byte of
//! source plus [`PROGRAM_BYTES_BASE`].

use super::{AttrValue, Device};
use ::cel::extractors::This;
use ::cel::objects::Key;
use ::cel::{Context, Env, ExecutionError, Program, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The byte bounds of the caches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Results: [`RESULT_ENTRY_BYTES`] per entry plus its error text.
    pub results: usize,
    /// Interned expressions and compiled programs.
    pub programs: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            results: 64 << 20,
            programs: 32 << 20,
        }
    }
}

/// What the caches hold now, by their own accounting.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Bytes of results.
    pub result_bytes: usize,
    /// Results kept.
    pub results: usize,
    /// Bytes of interned expressions and programs.
    pub program_bytes: usize,
    /// Distinct expressions interned.
    pub expressions: usize,
    /// Times a cache started over.
    pub clears: u64,
}

/// One result entry: the key (id, serial), the value and the map's own
/// overhead, rounded up.
pub const RESULT_ENTRY_BYTES: usize = 64;
/// An interned expression's entry beside its text (the id maps, the
/// `Arc` header).
pub const EXPRESSION_ENTRY_BYTES: usize = 96;
/// Estimated bytes of a compiled program per byte of its source.
pub const PROGRAM_BYTES_PER_SOURCE_BYTE: usize = 8;
/// Estimated bytes of a compiled program beside its source's.
pub const PROGRAM_BYTES_BASE: usize = 1024;

/// An interned expression.
struct Interned {
    text: Arc<str>,
    program: Result<Arc<Program>, Arc<str>>,
}

/// Compiled selectors and their results per device.
#[derive(Default)]
pub struct Selectors {
    env: Option<Arc<Env>>,
    limits: Limits,
    /// Expression text → id (an index into `exprs`).
    ids: HashMap<Arc<str>, u32>,
    exprs: Vec<Interned>,
    program_bytes: usize,
    /// (expression id, device serial) → matches, or the evaluation error.
    results: HashMap<(u32, u64), Result<bool, Arc<str>>>,
    result_bytes: usize,
    clears: u64,
}

impl std::fmt::Debug for Selectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selectors")
            .field("stats", &self.stats())
            .finish()
    }
}

/// An expression as messages show it: at most 120 characters of it (a
/// selector may be 10 KiB; a pod's condition names it, not copies it).
fn shown(expr: &str) -> String {
    const MAX: usize = 120;
    match expr.char_indices().nth(MAX) {
        None => format!("{expr:?}"),
        Some((i, _)) => format!("{:?}… ({} bytes)", &expr[..i], expr.len()),
    }
}

/// A message cut to at most 1 KiB (on a character boundary).
fn cap(m: &mut String) {
    let mut n = m.len().min(1024);
    while !m.is_char_boundary(n) {
        n -= 1;
    }
    m.truncate(n);
}

impl Selectors {
    /// Caches bounded by `limits`.
    pub fn with_limits(limits: Limits) -> Self {
        Selectors {
            limits,
            ..Selectors::default()
        }
    }

    /// What the caches hold, by their own accounting.
    pub fn stats(&self) -> CacheStats {
        CacheStats {
            result_bytes: self.result_bytes,
            results: self.results.len(),
            program_bytes: self.program_bytes,
            expressions: self.exprs.len(),
            clears: self.clears,
        }
    }

    fn env(&mut self) -> Arc<Env> {
        self.env
            .get_or_insert_with(|| Arc::new(Env::stdlib()))
            .clone()
    }

    /// The id of `expr`, interned and compiled on first sight.
    fn intern(&mut self, expr: &str) -> u32 {
        if let Some(id) = self.ids.get(expr) {
            return *id;
        }
        let env = self.env();
        let program = env.compile(expr).map(Arc::new).map_err(|e| -> Arc<str> {
            let mut m = format!("CEL selector {} does not compile: {e}", shown(expr));
            cap(&mut m);
            m.into()
        });
        let cost = EXPRESSION_ENTRY_BYTES
            + expr.len()
            + match &program {
                Ok(_) => PROGRAM_BYTES_BASE + PROGRAM_BYTES_PER_SOURCE_BYTE * expr.len(),
                Err(m) => m.len(),
            };
        if self.program_bytes + cost > self.limits.programs {
            // ids are reused from 0: results under the old ids go too
            self.ids.clear();
            self.exprs.clear();
            self.program_bytes = 0;
            self.results.clear();
            self.result_bytes = 0;
            self.clears += 1;
        }
        let id = self.exprs.len() as u32;
        let text: Arc<str> = expr.into();
        self.ids.insert(text.clone(), id);
        self.exprs.push(Interned { text, program });
        self.program_bytes += cost;
        id
    }

    /// Compiles `expr` (once).
    pub fn program(&mut self, expr: &str) -> Result<Arc<Program>, String> {
        let id = self.intern(expr);
        self.exprs[id as usize]
            .program
            .clone()
            .map_err(|m| m.to_string())
    }

    /// Whether `device` matches `expr` (an error: the expression does not
    /// compile, fails on this device, or is not a bool).
    pub fn matches(&mut self, expr: &str, device: &Device) -> Result<bool, String> {
        let id = self.intern(expr);
        if let Some(r) = self.results.get(&(id, device.serial)) {
            return r.clone().map_err(|m| m.to_string());
        }
        let r = self.evaluate(id, device);
        self.remember(id, device.serial, r.clone());
        r.map_err(|m| m.to_string())
    }

    /// Keeps a result, within the bound.
    fn remember(&mut self, id: u32, serial: u64, r: Result<bool, Arc<str>>) {
        let cost = RESULT_ENTRY_BYTES + r.as_ref().err().map_or(0, |m| m.len());
        if self.result_bytes + cost > self.limits.results {
            self.results.clear();
            self.result_bytes = 0;
            self.clears += 1;
        }
        if self.results.insert((id, serial), r).is_none() {
            self.result_bytes += cost;
        }
    }

    fn evaluate(&mut self, id: u32, device: &Device) -> Result<bool, Arc<str>> {
        let e = &self.exprs[id as usize];
        let program = e.program.clone()?;
        let expr = shown(&e.text);
        let mut ctx = Context::with_env(self.env());
        add_functions(&mut ctx);
        ctx.add_variable_from_value("device", device.cel.clone());
        let mut m = match program.execute(&ctx) {
            Ok(Value::Bool(b)) => return Ok(b),
            Ok(v) => format!(
                "CEL selector {expr} gave {v:?} for device {}, not a bool",
                device.id
            ),
            Err(e) => format!("CEL selector {expr} failed on device {}: {e}", device.id),
        };
        cap(&mut m);
        Err(m.into())
    }
}

fn add_functions(ctx: &mut Context) {
    // the names are not in the standard library: adding them cannot fail
    let _ = ctx.add_function("quantity", quantity);
    let _ = ctx.add_function("semver", semver);
    let _ = ctx.add_function("compareTo", compare_to);
    let _ = ctx.add_function("isGreaterThan", |This(a): This<Value>, b: Value| {
        compare(&a, &b).map(|o| o == std::cmp::Ordering::Greater)
    });
    let _ = ctx.add_function("isLessThan", |This(a): This<Value>, b: Value| {
        compare(&a, &b).map(|o| o == std::cmp::Ordering::Less)
    });
    let _ = ctx.add_function("asInteger", |This(a): This<i64>| a / 1000);
}

fn quantity(s: Arc<String>) -> Result<Value, ExecutionError> {
    let q = gpusched_model::Quantity::parse(&s)
        .map_err(|e| ExecutionError::function_error("quantity", e))?;
    let m = i64::try_from(q.milli())
        .map_err(|_| ExecutionError::function_error("quantity", "out of range"))?;
    Ok(Value::Int(m))
}

/// A version as CEL sees it: a list of major, minor, patch.
fn version_value(s: &str) -> Option<Value> {
    let core = s.trim_start_matches('v');
    let core = core.split(['-', '+']).next()?;
    let parts: Vec<i64> = core
        .split('.')
        .map(|p| p.parse::<i64>().ok())
        .collect::<Option<_>>()?;
    if parts.len() != 3 {
        return None;
    }
    Some(Value::List(Arc::new(
        parts.into_iter().map(Value::Int).collect(),
    )))
}

fn semver(s: Arc<String>) -> Result<Value, ExecutionError> {
    version_value(&s).ok_or_else(|| {
        ExecutionError::function_error("semver", format!("{s:?} is not a semantic version"))
    })
}

fn compare(a: &Value, b: &Value) -> Result<std::cmp::Ordering, ExecutionError> {
    match (a, b) {
        (Value::Int(x), Value::Int(y)) => Ok(x.cmp(y)),
        (Value::List(x), Value::List(y)) => {
            let ints = |l: &[Value]| -> Vec<i64> {
                l.iter()
                    .map(|v| match v {
                        Value::Int(i) => *i,
                        _ => 0,
                    })
                    .collect()
            };
            Ok(ints(x).cmp(&ints(y)))
        }
        _ => Err(ExecutionError::function_error(
            "compareTo",
            "compares two quantities or two versions",
        )),
    }
}

fn compare_to(This(a): This<Value>, b: Value) -> Result<i64, ExecutionError> {
    Ok(match compare(&a, &b)? {
        std::cmp::Ordering::Less => -1,
        std::cmp::Ordering::Equal => 0,
        std::cmp::Ordering::Greater => 1,
    })
}

/// The CEL value of a device: `driver`, `attributes`, `capacity`,
/// `allowMultipleAllocations` (false).
pub fn device_value(
    driver: &str,
    attributes: &BTreeMap<String, AttrValue>,
    capacity: &BTreeMap<String, i128>,
) -> Value {
    device_value_with(driver, attributes, capacity, false)
}

/// [`device_value`] with `allowMultipleAllocations` given.
pub fn device_value_with(
    driver: &str,
    attributes: &BTreeMap<String, AttrValue>,
    capacity: &BTreeMap<String, i128>,
    multiple: bool,
) -> Value {
    let mut attrs: HashMap<String, HashMap<Key, Value>> = HashMap::new();
    for (k, v) in attributes {
        let (domain, name) = split(k);
        let v = match v {
            AttrValue::Bool(b) => Value::Bool(*b),
            AttrValue::Int(i) => Value::Int(*i),
            AttrValue::Str(s) => Value::String(Arc::new(s.clone())),
            AttrValue::Version(s) => {
                version_value(s).unwrap_or_else(|| Value::String(Arc::new(s.clone())))
            }
        };
        attrs
            .entry(domain.to_string())
            .or_default()
            .insert(Key::String(Arc::new(name.to_string())), v);
    }
    let mut caps: HashMap<String, HashMap<Key, Value>> = HashMap::new();
    for (k, v) in capacity {
        let (domain, name) = split(k);
        caps.entry(domain.to_string()).or_default().insert(
            Key::String(Arc::new(name.to_string())),
            Value::Int(i64::try_from(*v).unwrap_or(i64::MAX)),
        );
    }
    let to_map = |m: HashMap<String, HashMap<Key, Value>>| -> Value {
        let m: HashMap<Key, Value> = m
            .into_iter()
            .map(|(k, v)| (Key::String(Arc::new(k)), Value::from(v)))
            .collect();
        Value::from(m)
    };
    let mut device: HashMap<Key, Value> = HashMap::new();
    device.insert(
        Key::String(Arc::new("driver".into())),
        Value::String(Arc::new(driver.to_string())),
    );
    device.insert(Key::String(Arc::new("attributes".into())), to_map(attrs));
    device.insert(Key::String(Arc::new("capacity".into())), to_map(caps));
    device.insert(
        Key::String(Arc::new("allowMultipleAllocations".into())),
        Value::Bool(multiple),
    );
    Value::from(device)
}

/// `domain/name` → (domain, name); the name may itself hold no slash.
fn split(qualified: &str) -> (&str, &str) {
    qualified.rsplit_once('/').unwrap_or(("", qualified))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dra::DeviceId;

    fn device(serial: u64) -> Device {
        let attributes = BTreeMap::from([
            (
                "gpu.gpusched.io/model".to_string(),
                AttrValue::Str("H100".into()),
            ),
            ("gpu.gpusched.io/index".to_string(), AttrValue::Int(3)),
            (
                "gpu.gpusched.io/driverVersion".to_string(),
                AttrValue::Version("550.54.15".into()),
            ),
            (
                "resource.kubernetes.io/pcieRoot".to_string(),
                AttrValue::Str("pci0000:00".into()),
            ),
        ]);
        let capacity = BTreeMap::from([(
            "gpu.gpusched.io/memory".to_string(),
            80i128 * 1024 * 1024 * 1024 * 1000,
        )]);
        Device {
            id: DeviceId {
                driver: "gpu.gpusched.io".into(),
                pool: "n1".into(),
                device: "gpu-3".into(),
            },
            node: Some("n1".into()),
            selector: None,
            cel: device_value("gpu.gpusched.io", &attributes, &capacity),
            attributes,
            capacity,
            taints: vec![],
            serial,
            consumes: vec![],
            multiple: false,
            capacity_info: BTreeMap::new(),
            binding: Default::default(),
        }
    }

    #[test]
    fn the_kubernetes_environment_reads_driver_attributes_and_capacity() {
        let mut s = Selectors::default();
        let d = device(1);
        let yes = [
            r#"device.driver == "gpu.gpusched.io""#,
            r#"device.attributes["gpu.gpusched.io"].model == "H100""#,
            r#"device.attributes["gpu.gpusched.io"].index >= 3"#,
            r#"device.attributes["resource.kubernetes.io"].pcieRoot.startsWith("pci")"#,
            r#"device.capacity["gpu.gpusched.io"].memory.compareTo(quantity("40Gi")) >= 0"#,
            r#"device.capacity["gpu.gpusched.io"].memory.isGreaterThan(quantity("79Gi"))"#,
            r#"device.capacity["gpu.gpusched.io"].memory.asInteger() == 85899345920"#,
            r#"device.attributes["gpu.gpusched.io"].driverVersion.isGreaterThan(semver("550.0.0"))"#,
            r#""model" in device.attributes["gpu.gpusched.io"]"#,
        ];
        for e in yes {
            assert_eq!(s.matches(e, &d), Ok(true), "{e}");
        }
        let no = [
            r#"device.driver == "other.example.com""#,
            r#"device.capacity["gpu.gpusched.io"].memory.isLessThan(quantity("80Gi"))"#,
            r#"device.attributes["gpu.gpusched.io"].driverVersion.compareTo(semver("560.1.0")) >= 0"#,
        ];
        for e in no {
            assert_eq!(s.matches(e, &d), Ok(false), "{e}");
        }
    }

    #[test]
    fn bad_expressions_are_errors_naming_the_expression() {
        let mut s = Selectors::default();
        let d = device(1);
        let e = s.matches("device.driver ==", &d).unwrap_err();
        assert!(e.contains("does not compile"), "{e}");
        let e = s.matches("device.driver", &d).unwrap_err();
        assert!(e.contains("not a bool"), "{e}");
        let e = s
            .matches(r#"device.attributes["gpu.gpusched.io"].nope == 1"#, &d)
            .unwrap_err();
        assert!(
            e.contains("failed on device gpu.gpusched.io/n1/gpu-3"),
            "{e}"
        );
        let e = s.matches(r#"quantity("lots") == 1"#, &d).unwrap_err();
        assert!(e.contains("failed"), "{e}");
    }

    /// #38: the API server allows 32 selectors of 10 KiB per request; 8
    /// claims with distinct ones on ~8,000 devices. Keyed by the text, the
    /// results held a copy of it per device (about 10 KiB × 2,048,000,
    /// capped at 1,048,576 entries: ~10 GiB); interned and bounded they
    /// stay within [`Limits`].
    #[test]
    fn the_caches_stay_within_their_byte_bounds_at_the_issues_sizes() {
        const SELECTORS: usize = 8 * 32;
        const DEVICES: u64 = 8_000;
        let limits = Limits::default();
        let mut s = Selectors::with_limits(limits);
        let pad = "x".repeat(10 * 1024 - 64);
        let exprs: Vec<String> = (0..SELECTORS)
            .map(|i| format!("device.driver == \"gpu.gpusched.io\" || \"{i:04}{pad}\" == \"\""))
            .collect();
        assert!(exprs.iter().all(|e| e.len() <= 10 * 1024));
        // each compiled and evaluated for real once
        let d = device(1);
        for e in &exprs {
            assert_eq!(s.matches(e, &d), Ok(true));
        }
        let ids: Vec<u32> = exprs.iter().map(|e| s.intern(e)).collect();
        assert_eq!(s.stats().expressions, SELECTORS);
        // then every (selector, device) result, as a cycle's passes keep them
        let (mut peak_results, mut peak_programs) = (0, 0);
        for serial in 2..DEVICES + 2 {
            for id in &ids {
                s.remember(*id, serial, Ok(true));
            }
            let st = s.stats();
            peak_results = peak_results.max(st.result_bytes);
            peak_programs = peak_programs.max(st.program_bytes);
        }
        let st = s.stats();
        eprintln!(
            "{SELECTORS} selectors of 10 KiB × {DEVICES} devices: peak {} MiB of results, {} MiB of programs; now {} results; {} clears (the text-keyed cache: ~{} MiB)",
            peak_results >> 20,
            peak_programs >> 20,
            st.results,
            st.clears,
            10 * 1024usize
        );
        assert!(peak_results <= limits.results, "{peak_results}");
        assert!(peak_programs <= limits.programs, "{peak_programs}");
        assert!(
            st.clears > 0,
            "more results than the bound: it started over"
        );
        // still right after starting over
        assert_eq!(s.matches(&exprs[0], &d), Ok(true));
        assert_eq!(s.stats().expressions, SELECTORS, "programs kept");
    }

    #[test]
    fn a_full_cache_starts_over_and_answers_the_same() {
        let mut s = Selectors::with_limits(Limits {
            results: 3 * RESULT_ENTRY_BYTES,
            programs: 2 * (EXPRESSION_ENTRY_BYTES + PROGRAM_BYTES_BASE + 8 * 64),
        });
        let e = |i: i64| format!("device.attributes[\"gpu.gpusched.io\"].index == {i}");
        for round in 0..3 {
            for i in 0..5 {
                assert_eq!(s.matches(&e(i), &device(1)), Ok(i == 3), "round {round}");
                let st = s.stats();
                assert!(st.result_bytes <= 3 * RESULT_ENTRY_BYTES, "{st:?}");
                assert!(st.expressions <= 2, "{st:?}");
            }
        }
        assert!(s.stats().clears > 0);
        // a long expression's error names it shortened
        let long = format!("device.nope{}", " ".repeat(5000));
        let m = s.matches(&long, &device(1)).unwrap_err();
        assert!(m.len() <= 1024 && m.contains("bytes)"), "{m}");
    }

    #[test]
    fn results_are_kept_per_device_version() {
        let mut s = Selectors::default();
        let e = r#"device.attributes["gpu.gpusched.io"].index == 3"#;
        assert_eq!(s.matches(e, &device(1)), Ok(true));
        let mut other = device(2);
        other
            .attributes
            .insert("gpu.gpusched.io/index".into(), AttrValue::Int(4));
        other.cel = device_value("gpu.gpusched.io", &other.attributes, &other.capacity);
        assert_eq!(s.matches(e, &other), Ok(false));
        assert_eq!(s.stats().expressions, 1, "compiled once");
        assert_eq!(s.stats().results, 2);
    }
}

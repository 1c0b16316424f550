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
//! Each expression is compiled once and kept; each (expression, device)
//! result is kept while that version of the device exists.

use super::{AttrValue, Device};
use ::cel::extractors::This;
use ::cel::objects::Key;
use ::cel::{Context, Env, ExecutionError, Program, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// Compiled selectors and their results per device.
#[derive(Default)]
pub struct Selectors {
    env: Option<Arc<Env>>,
    programs: BTreeMap<String, Result<Arc<Program>, String>>,
    /// (expression, device serial) → matches, or the evaluation error.
    results: HashMap<(String, u64), Result<bool, String>>,
}

impl std::fmt::Debug for Selectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selectors")
            .field("programs", &self.programs.len())
            .field("results", &self.results.len())
            .finish()
    }
}

/// Most results kept; beyond, the cache starts over.
const MAX_RESULTS: usize = 1 << 20;

impl Selectors {
    fn env(&mut self) -> Arc<Env> {
        self.env
            .get_or_insert_with(|| Arc::new(Env::stdlib()))
            .clone()
    }

    /// Compiles `expr` (once).
    pub fn program(&mut self, expr: &str) -> Result<Arc<Program>, String> {
        if let Some(p) = self.programs.get(expr) {
            return p.clone();
        }
        let env = self.env();
        let p = env
            .compile(expr)
            .map(Arc::new)
            .map_err(|e| format!("CEL selector {expr:?} does not compile: {e}"));
        self.programs.insert(expr.to_string(), p.clone());
        p
    }

    /// Whether `device` matches `expr` (an error: the expression does not
    /// compile, fails on this device, or is not a bool).
    pub fn matches(&mut self, expr: &str, device: &Device) -> Result<bool, String> {
        let k = (expr.to_string(), device.serial);
        if let Some(r) = self.results.get(&k) {
            return r.clone();
        }
        let r = self.evaluate(expr, device);
        if self.results.len() >= MAX_RESULTS {
            self.results.clear();
        }
        self.results.insert(k, r.clone());
        r
    }

    fn evaluate(&mut self, expr: &str, device: &Device) -> Result<bool, String> {
        let program = self.program(expr)?;
        let mut ctx = Context::with_env(self.env());
        add_functions(&mut ctx);
        ctx.add_variable_from_value("device", device.cel.clone());
        match program.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(v) => Err(format!(
                "CEL selector {expr:?} gave {v:?} for device {}, not a bool",
                device.id
            )),
            Err(e) => Err(format!(
                "CEL selector {expr:?} failed on device {}: {e}",
                device.id
            )),
        }
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
        assert_eq!(s.programs.len(), 1, "compiled once");
        assert_eq!(s.results.len(), 2);
    }
}

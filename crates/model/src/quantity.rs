//! Kubernetes resource quantities (`100m`, `1.5`, `2Gi`, `1e3`, `500M`, …).
//!
//! A [`Quantity`] is kept exactly in nano-units (10⁻⁹), which covers every
//! suffix Kubernetes accepts. Values finer than a nano-unit are rounded up,
//! as the apiserver does. Conversions to milli-units and whole units round
//! up too (`MilliValue()`/`Value()` semantics), and [`Quantity::to_integer`]
//! refuses fractional values instead of rounding, which is what extended
//! resources such as `nvidia.com/gpu` require.

use std::fmt;

/// An exact Kubernetes quantity.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Quantity {
    nanos: i128,
}

/// Why a quantity string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The string is empty.
    #[error("empty quantity")]
    Empty,
    /// Not a Kubernetes quantity.
    #[error("invalid quantity {input:?}: {why}")]
    Invalid {
        /// The refused text.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// Too large for the unit it is counted in.
    #[error("quantity {input:?} is out of range")]
    Overflow {
        /// The refused text.
        input: String,
    },
    /// A fraction where only whole numbers are allowed.
    #[error("quantity {input:?} must be a whole number")]
    NotInteger {
        /// The refused text.
        input: String,
    },
    /// A negative amount.
    #[error("quantity {input:?} must not be negative")]
    Negative {
        /// The refused text.
        input: String,
    },
}

const NANO: i128 = 1_000_000_000;
const LIMIT: i128 = 1_i128 << 100;

impl Quantity {
    /// A quantity of `n` whole units.
    pub fn from_units(n: i64) -> Self {
        Quantity {
            nanos: n as i128 * NANO,
        }
    }

    /// A quantity of `n` milli-units.
    pub fn from_milli(n: i64) -> Self {
        Quantity {
            nanos: n as i128 * 1_000_000,
        }
    }

    /// Parses the Kubernetes quantity grammar:
    /// `[+-]digits[.digits][suffix]` where suffix is a binary SI suffix
    /// (`Ki Mi Gi Ti Pi Ei`), a decimal SI suffix (`n u m k M G T P E`) or a
    /// decimal exponent (`e3`, `E-2`).
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let s = input.trim();
        if s.is_empty() {
            return Err(QuantityError::Empty);
        }
        let invalid = |why| QuantityError::Invalid {
            input: input.to_string(),
            why,
        };
        let overflow = || QuantityError::Overflow {
            input: input.to_string(),
        };
        let bytes = s.as_bytes();
        let mut i = 0;
        let mut negative = false;
        if bytes[0] == b'+' || bytes[0] == b'-' {
            negative = bytes[0] == b'-';
            i = 1;
        }
        let mut mantissa: i128 = 0;
        let mut scale: i32 = 0; // value = mantissa * 10^scale
        let mut digits = 0;
        let mut seen_dot = false;
        while i < bytes.len() {
            let c = bytes[i];
            if c.is_ascii_digit() {
                digits += 1;
                if mantissa < LIMIT {
                    mantissa = mantissa * 10 + (c - b'0') as i128;
                    if seen_dot {
                        scale -= 1;
                    }
                } else if !seen_dot {
                    return Err(overflow());
                }
                // further fractional digits beyond precision are dropped
                // (rounded up below if non-zero)
                else if c != b'0' {
                    mantissa += 1;
                }
            } else if c == b'.' {
                if seen_dot {
                    return Err(invalid("more than one decimal point"));
                }
                seen_dot = true;
            } else {
                break;
            }
            i += 1;
        }
        if digits == 0 {
            return Err(invalid("no digits"));
        }
        let suffix = &s[i..];
        let (pow10, pow1024): (i32, u32) = match suffix {
            "" => (0, 0),
            "n" => (-9, 0),
            "u" => (-6, 0),
            "m" => (-3, 0),
            "k" => (3, 0),
            "M" => (6, 0),
            "G" => (9, 0),
            "T" => (12, 0),
            "P" => (15, 0),
            "E" => (18, 0),
            "Ki" => (0, 1),
            "Mi" => (0, 2),
            "Gi" => (0, 3),
            "Ti" => (0, 4),
            "Pi" => (0, 5),
            "Ei" => (0, 6),
            other if other.starts_with(['e', 'E']) => {
                let exp: i32 = other[1..]
                    .parse()
                    .map_err(|_| invalid("bad exponent or unknown suffix"))?;
                if !(-40..=40).contains(&exp) {
                    return Err(overflow());
                }
                (exp, 0)
            }
            _ => return Err(invalid("unknown suffix")),
        };
        let mut value = mantissa;
        for _ in 0..pow1024 {
            value = value.checked_mul(1024).ok_or_else(overflow)?;
        }
        // now value * 10^(scale + pow10) units; convert to nanos.
        let exp = scale + pow10 + 9;
        if exp >= 0 {
            for _ in 0..exp {
                value = value.checked_mul(10).ok_or_else(overflow)?;
            }
        } else {
            let mut div: i128 = 1;
            for _ in 0..(-exp) {
                div = div.checked_mul(10).ok_or_else(overflow)?;
            }
            value = (value + div - 1) / div; // round up like the apiserver
        }
        if value > LIMIT {
            return Err(overflow());
        }
        Ok(Quantity {
            nanos: if negative { -value } else { value },
        })
    }

    /// Exact value in nano-units.
    pub fn nanos(&self) -> i128 {
        self.nanos
    }

    /// Value in milli-units, rounded up.
    pub fn milli(&self) -> i128 {
        div_ceil(self.nanos, 1_000_000)
    }

    /// Value in whole units, rounded up.
    pub fn units(&self) -> i128 {
        div_ceil(self.nanos, NANO)
    }

    /// Whether the value is a whole number.
    pub fn is_integer(&self) -> bool {
        self.nanos % NANO == 0
    }

    /// The value as a non-negative whole number; refuses fractions and
    /// negatives instead of rounding.
    pub fn to_integer(&self, input: &str) -> Result<u64, QuantityError> {
        if self.nanos < 0 {
            return Err(QuantityError::Negative {
                input: input.to_string(),
            });
        }
        if !self.is_integer() {
            return Err(QuantityError::NotInteger {
                input: input.to_string(),
            });
        }
        u64::try_from(self.nanos / NANO).map_err(|_| QuantityError::Overflow {
            input: input.to_string(),
        })
    }

    /// The value in milli-units as a non-negative number (rounded up).
    pub fn to_milli_u64(&self, input: &str) -> Result<u64, QuantityError> {
        if self.nanos < 0 {
            return Err(QuantityError::Negative {
                input: input.to_string(),
            });
        }
        u64::try_from(self.milli()).map_err(|_| QuantityError::Overflow {
            input: input.to_string(),
        })
    }
}

fn div_ceil(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b > 0 { q + 1 } else { q }
}

/// Parses a CPU quantity into millicores (`"2"` → 2000, `"250m"` → 250).
pub fn parse_cpu_milli(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.to_milli_u64(s)
}

/// Parses a memory-like quantity into whole units, rounding up
/// (`"2Gi"` → 2147483648).
pub fn parse_bytes(s: &str) -> Result<u64, QuantityError> {
    let q = Quantity::parse(s)?;
    if q.nanos < 0 {
        return Err(QuantityError::Negative {
            input: s.to_string(),
        });
    }
    u64::try_from(q.units()).map_err(|_| QuantityError::Overflow {
        input: s.to_string(),
    })
}

/// Parses a memory quantity into MiB, rounding up (`"80Gi"` → 81920).
pub fn parse_mib(s: &str) -> Result<u64, QuantityError> {
    Ok(parse_bytes(s)?.div_ceil(1 << 20))
}

/// Parses an integer-only quantity (extended resources, counts).
pub fn parse_integer(s: &str) -> Result<u64, QuantityError> {
    Quantity::parse(s)?.to_integer(s)
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos % NANO == 0 {
            write!(f, "{}", self.nanos / NANO)
        } else if self.nanos % 1_000_000 == 0 {
            write!(f, "{}m", self.nanos / 1_000_000)
        } else {
            write!(f, "{}n", self.nanos)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    #[test]
    fn parses_kubernetes_forms() {
        assert_eq!(p("100m").milli(), 100);
        assert_eq!(p("1.5").milli(), 1500);
        assert_eq!(p("2Gi").units(), 2 << 30);
        assert_eq!(p("1e3").units(), 1000);
        assert_eq!(p("1E-3").milli(), 1);
        assert_eq!(p("500M").units(), 500_000_000);
        assert_eq!(p("1k").units(), 1000);
        assert_eq!(p("+4").units(), 4);
        assert_eq!(p("-4").units(), -4);
        assert_eq!(p(".5").milli(), 500);
        assert_eq!(p("0.1Ki").milli(), 102_400);
        assert_eq!(p("1n").nanos(), 1);
    }

    #[test]
    fn rounds_up_sub_nano_and_sub_milli() {
        assert_eq!(p("0.0000000001").nanos(), 1);
        assert_eq!(p("1n").milli(), 1);
        assert_eq!(p("1.0001").units(), 2);
    }

    #[test]
    fn integer_rules() {
        assert_eq!(parse_integer("8").unwrap(), 8);
        assert_eq!(parse_integer("2e0").unwrap(), 2);
        assert!(matches!(
            parse_integer("1.5"),
            Err(QuantityError::NotInteger { .. })
        ));
        assert!(matches!(
            parse_integer("500m"),
            Err(QuantityError::NotInteger { .. })
        ));
        assert!(matches!(
            parse_integer("-1"),
            Err(QuantityError::Negative { .. })
        ));
    }

    #[test]
    fn refuses_garbage() {
        for bad in [
            "", "abc", "1.2.3", "1Xi", "1e", "1ee3", "1 Gi", "m", "1e999", "Gi",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(matches!(
            Quantity::parse("99999999999999999999999999999999999999Ei"),
            Err(QuantityError::Overflow { .. })
        ));
    }

    #[test]
    fn conversions() {
        assert_eq!(parse_cpu_milli("2").unwrap(), 2000);
        assert_eq!(parse_cpu_milli("250m").unwrap(), 250);
        assert_eq!(parse_bytes("1Mi").unwrap(), 1 << 20);
        assert_eq!(parse_mib("80Gi").unwrap(), 81920);
        assert_eq!(parse_mib("1").unwrap(), 1);
        assert_eq!(p("1500m").to_string(), "1500m");
        assert_eq!(p("3").to_string(), "3");
    }
}

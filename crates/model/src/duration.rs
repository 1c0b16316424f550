//! The one duration grammar of gpusched: `250ms`, `30s`, `5m`, `2h`, `1d`,
//! combinations like `1h30m`, decimals like `1.5h`, and `0`.
//!
//! Used by the simulator's files, the CLI and the node agent's configuration
//! (which also reads a bare whole number as seconds, for older files).

use thiserror::Error;

/// A duration that does not follow the grammar.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DurationError {
    /// Nothing given.
    #[error("empty duration")]
    Empty,
    /// A unit without a number before it.
    #[error("invalid duration {input:?}: expected a number at {at:?}")]
    ExpectedNumber {
        /// The whole input.
        input: String,
        /// The rest of the input where a number was expected.
        at: String,
    },
    /// Digits and dots that are not a number (`1.2.3`).
    #[error("invalid duration {input:?}: bad number {number:?}")]
    BadNumber {
        /// The whole input.
        input: String,
        /// The offending number.
        number: String,
    },
    /// A number without a unit.
    #[error("invalid duration {input:?}: missing unit (ms, s, m, h, d)")]
    MissingUnit {
        /// The whole input.
        input: String,
    },
    /// A unit other than ms, s, m, h, d.
    #[error("invalid duration {input:?}: unknown unit {unit:?}")]
    UnknownUnit {
        /// The whole input.
        input: String,
        /// The unit given.
        unit: String,
    },
    /// More than about 30,000 years.
    #[error("invalid duration {input:?}: out of range")]
    OutOfRange {
        /// The whole input.
        input: String,
    },
}

/// Parses a duration: `250ms`, `30s`, `5m`, `2h`, `1d`, `1h30m`, `0`.
pub fn parse_duration_ms(s: &str) -> Result<u64, DurationError> {
    let t = s.trim();
    if t == "0" {
        return Ok(0);
    }
    if t.is_empty() {
        return Err(DurationError::Empty);
    }
    let b = t.as_bytes();
    let mut i = 0;
    let mut total: u64 = 0;
    while i < b.len() {
        let start = i;
        while i < b.len() && (b[i].is_ascii_digit() || b[i] == b'.') {
            i += 1;
        }
        if start == i {
            return Err(DurationError::ExpectedNumber {
                input: s.to_string(),
                at: t[start..].to_string(),
            });
        }
        let num: f64 = t[start..i].parse().map_err(|_| DurationError::BadNumber {
            input: s.to_string(),
            number: t[start..i].to_string(),
        })?;
        let ustart = i;
        while i < b.len() && b[i].is_ascii_alphabetic() {
            i += 1;
        }
        let mult: u64 = match &t[ustart..i] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => {
                return Err(DurationError::MissingUnit {
                    input: s.to_string(),
                });
            }
            u => {
                return Err(DurationError::UnknownUnit {
                    input: s.to_string(),
                    unit: u.to_string(),
                });
            }
        };
        let v = num * mult as f64;
        if !v.is_finite() || v > 1e15 {
            return Err(DurationError::OutOfRange {
                input: s.to_string(),
            });
        }
        total = total.saturating_add(v.round() as u64);
    }
    Ok(total)
}

/// Formats milliseconds for people: `1h05m`, `42s`, `350ms`.
pub fn fmt_duration(ms: u64) -> String {
    if ms < 1_000 {
        return format!("{ms}ms");
    }
    let s = ms / 1000;
    if s < 60 {
        let tenth = (ms % 1000) / 100;
        return if tenth > 0 && s < 10 {
            format!("{s}.{tenth}s")
        } else {
            format!("{s}s")
        };
    }
    let m = s / 60;
    if m < 60 {
        return format!("{m}m{:02}s", s % 60);
    }
    let h = m / 60;
    if h < 48 {
        return format!("{h}h{:02}m", m % 60);
    }
    format!("{}d{:02}h", h / 24, h % 24)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grammar() {
        assert_eq!(parse_duration_ms("250ms"), Ok(250));
        assert_eq!(parse_duration_ms("1h30m"), Ok(5_400_000));
        assert_eq!(parse_duration_ms("1.5h"), Ok(5_400_000));
        assert_eq!(parse_duration_ms(" 0 "), Ok(0));
        assert_eq!(parse_duration_ms(""), Err(DurationError::Empty));
        assert_eq!(
            parse_duration_ms("5").unwrap_err().to_string(),
            "invalid duration \"5\": missing unit (ms, s, m, h, d)"
        );
        assert!(matches!(
            parse_duration_ms("3w"),
            Err(DurationError::UnknownUnit { unit, .. }) if unit == "w"
        ));
        assert_eq!(fmt_duration(350), "350ms");
        assert_eq!(fmt_duration(3_900_000), "1h05m");
    }
}

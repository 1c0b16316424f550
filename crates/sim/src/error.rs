//! The simulator's file errors: where (file, line, column, field) and why.
//!
//! Its own module so that reading files (`load`) and expanding workloads
//! (`workload`) both use it without depending on each other.

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
    pub(crate) fn at(
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
pub(crate) fn source_line(text: &str, line: u64) -> String {
    if line == 0 {
        return String::new();
    }
    text.lines()
        .nth(line as usize - 1)
        .unwrap_or("")
        .trim_end()
        .to_string()
}

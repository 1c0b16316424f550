//! Quoting untrusted text in errors and logs.

/// Longest piece of an untrusted string quoted whole.
pub const SHOWN_MAX: usize = 64;

/// `s` quoted like `{:?}`, cut to [`SHOWN_MAX`] characters with its length
/// noted when longer: a 1 MB device id must not become a 1 MB gRPC status
/// message (over the metadata limit, so the client sees RESOURCE_EXHAUSTED
/// instead of the real code) or a 1 MB log line.
pub fn shown(s: &str) -> String {
    match s.char_indices().nth(SHOWN_MAX) {
        None => format!("{s:?}"),
        Some((cut, _)) => format!("{:?}… ({} bytes)", &s[..cut], s.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_on_a_char_boundary() {
        assert_eq!(shown("GPU-1"), "\"GPU-1\"");
        let long = "é".repeat(100_000);
        let s = shown(&long);
        assert!(s.len() < 200, "{s}");
        assert!(s.ends_with("… (200000 bytes)"), "{s}");
        assert_eq!(shown(&"a".repeat(64)), format!("{:?}", "a".repeat(64)));
    }
}

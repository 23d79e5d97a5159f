//! The one rule for names an operator gives things (service names, node IDs):
//! 1 to 32 of `A-Z a-z 0-9 _ . -`. Such a name is safe everywhere it goes
//! unescaped: Prometheus label values, log fields, URL path segments, JSON
//! and the status page's HTML.

/// Longest name, in bytes.
pub const NAME_MAX: usize = 32;

/// What the rule allows, for error messages.
pub const NAME_RULE: &str = "1 to 32 characters, each a letter, a digit, `_`, `.` or `-`";

/// Whether `byte` may appear in a name.
pub fn is_name_byte(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'.' | b'-')
}

/// Whether `name` follows the rule (at most `max` bytes, never more than
/// [`NAME_MAX`]).
pub fn is_safe_name(name: &[u8], max: usize) -> bool {
    !name.is_empty() && name.len() <= max.min(NAME_MAX) && name.iter().all(|&b| is_name_byte(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_digits_underscore_dot_and_dash_pass() {
        for ok in ["01", "node-001", "pos.east_1", "A", &"x".repeat(32)] {
            assert!(is_safe_name(ok.as_bytes(), NAME_MAX), "{ok}");
        }
    }

    #[test]
    fn quotes_label_syntax_and_everything_else_are_refused() {
        let bad = [
            "",
            "x\",y=\"z",
            "\"",
            "a b",
            "a\nb",
            "a\\b",
            "<script>",
            "a/b",
            "é",
            &"x".repeat(33),
        ];
        for name in bad {
            assert!(!is_safe_name(name.as_bytes(), NAME_MAX), "{name:?}");
        }
        assert!(!is_safe_name(b"123456789", 8));
    }
}

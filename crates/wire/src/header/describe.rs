//! What `decode` shows of a header ([`Description`]): the header says it
//! once, for both the text dissection and the JSON line, so the CLI has no
//! code per header.

use std::fmt;

/// A header as `decode` shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Description {
    /// The text title (`CUPS header`), beside `summary` (`46 bytes`).
    pub title: &'static str,
    pub summary: String,
    /// Text rows, label then value, in order; a finding (`! check`) is one.
    pub rows: Vec<(&'static str, String)>,
    /// JSON keys and values, in order (the CLI adds `kind` first).
    pub keys: Vec<(&'static str, Scalar)>,
}

/// A JSON value of a header key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scalar {
    Text(String),
    Number(u64),
    Bool(bool),
}

impl Description {
    pub fn new(title: &'static str, summary: impl fmt::Display) -> Self {
        Description {
            title,
            summary: summary.to_string(),
            rows: Vec::new(),
            keys: Vec::new(),
        }
    }

    /// Adds a text row.
    pub fn row(&mut self, label: &'static str, value: impl fmt::Display) -> &mut Self {
        self.rows.push((label, value.to_string()));
        self
    }

    /// Adds a JSON key.
    pub fn key(&mut self, key: &'static str, value: impl Into<Scalar>) -> &mut Self {
        self.keys.push((key, value.into()));
        self
    }
}

impl From<String> for Scalar {
    fn from(s: String) -> Self {
        Scalar::Text(s)
    }
}

impl From<&str> for Scalar {
    fn from(s: &str) -> Self {
        Scalar::Text(s.to_owned())
    }
}

impl From<std::borrow::Cow<'_, str>> for Scalar {
    fn from(s: std::borrow::Cow<'_, str>) -> Self {
        Scalar::Text(s.into_owned())
    }
}

impl From<u8> for Scalar {
    fn from(n: u8) -> Self {
        Scalar::Number(n.into())
    }
}

impl From<u16> for Scalar {
    fn from(n: u16) -> Self {
        Scalar::Number(n.into())
    }
}

impl From<bool> for Scalar {
    fn from(b: bool) -> Self {
        Scalar::Bool(b)
    }
}

/// Bytes as upper-case hex, as `decode` shows binary parts.
pub struct Hex<'a>(pub &'a [u8]);

impl fmt::Display for Hex<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02X}")?;
        }
        Ok(())
    }
}

/// A byte as `decode`'s text shows flags: `0x02`.
pub(crate) fn flag(b: u8) -> String {
    format!("{b:#04x}")
}

/// A byte as `decode`'s JSON shows flags: `02`.
pub(crate) fn hex_byte(b: u8) -> String {
    format!("{b:02X}")
}

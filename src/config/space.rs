//! Disk space limits as people write them: bytes (`1073741824`), a size
//! with its unit (`"512MiB"`, `"50GiB"`, `"2GB"`), or a share of the
//! filesystem the files live on (`"20%"`). `journal.max_size`,
//! `journal.min_free` and `[service.capture] min_free` use them.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A space limit that does not read as one; it carries the text given
/// (the config key is added by the config loader's path).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SpaceError {
    #[error("`{}`: not a percentage", .0.escape_debug())]
    NotAPercentage(String),
    #[error("`{}`: at most two decimals", .0.escape_debug())]
    Decimals(String),
    #[error("`{}`: more than 100%", .0.escape_debug())]
    OverHundred(String),
    #[error("`{}`: write bytes, a size (512MiB, 50GiB, 2GB) or a share (20%)", .0.escape_debug())]
    NotASize(String),
    #[error(
        "`{}`: unknown unit `{}` (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)",
        .text.escape_debug(),
        .unit.escape_debug()
    )]
    UnknownUnit { text: String, unit: String },
    #[error("`{}`: too large", .0.escape_debug())]
    TooLarge(String),
}

/// A size in bytes, or a share of a filesystem's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpaceLimit {
    Bytes(u64),
    /// Hundredths of a percent (`"12.5%"` is 1250): 0..=10000.
    Percent(u32),
}

impl SpaceLimit {
    /// Bytes on a filesystem of `total` bytes.
    pub fn bytes(self, total: u64) -> u64 {
        match self {
            SpaceLimit::Bytes(n) => n,
            SpaceLimit::Percent(p) => {
                u64::try_from(u128::from(total) * u128::from(p) / 10_000).unwrap_or(u64::MAX)
            }
        }
    }

    /// Reads `"20%"`, `"50GiB"`, `"2 GB"`, `"4096"`.
    pub fn parse(text: &str) -> Result<SpaceLimit, SpaceError> {
        let t = text.trim();
        if let Some(p) = t.strip_suffix('%') {
            let p = p.trim();
            let (whole, frac) = p.split_once('.').unwrap_or((p, ""));
            let whole: u32 = whole
                .parse()
                .map_err(|_| SpaceError::NotAPercentage(text.to_string()))?;
            let frac = match frac.len() {
                0 => 0,
                1 | 2 => format!("{frac:0<2}")
                    .parse::<u32>()
                    .map_err(|_| SpaceError::NotAPercentage(text.to_string()))?,
                _ => return Err(SpaceError::Decimals(text.to_string())),
            };
            let hundredths = whole.saturating_mul(100).saturating_add(frac);
            if hundredths > 10_000 {
                return Err(SpaceError::OverHundred(text.to_string()));
            }
            return Ok(SpaceLimit::Percent(hundredths));
        }
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (digits, unit) = t.split_at(split);
        let n: u64 = digits
            .parse()
            .map_err(|_| SpaceError::NotASize(text.to_string()))?;
        let unit_bytes: u64 = match unit.trim() {
            "" | "B" => 1,
            "KB" => 1_000,
            "MB" => 1_000_000,
            "GB" => 1_000_000_000,
            "TB" => 1_000_000_000_000,
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            other => {
                return Err(SpaceError::UnknownUnit {
                    text: text.to_string(),
                    unit: other.to_string(),
                });
            }
        };
        n.checked_mul(unit_bytes)
            .map(SpaceLimit::Bytes)
            .ok_or_else(|| SpaceError::TooLarge(text.to_string()))
    }
}

impl fmt::Display for SpaceLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpaceLimit::Bytes(n) => write!(f, "{n}"),
            SpaceLimit::Percent(p) if p % 100 == 0 => write!(f, "{}%", p / 100),
            SpaceLimit::Percent(p) => write!(f, "{}.{:02}%", p / 100, p % 100),
        }
    }
}

impl Serialize for SpaceLimit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            SpaceLimit::Bytes(n) => s.serialize_u64(*n),
            SpaceLimit::Percent(_) => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for SpaceLimit {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = SpaceLimit;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("bytes, a size (\"512MiB\", \"50GiB\") or a share (\"20%\")")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<SpaceLimit, E> {
                Ok(SpaceLimit::Bytes(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<SpaceLimit, E> {
                u64::try_from(v)
                    .map(SpaceLimit::Bytes)
                    .map_err(|_| E::custom("a size cannot be negative"))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<SpaceLimit, E> {
                SpaceLimit::parse(v).map_err(E::custom)
            }
        }
        d.deserialize_any(Visit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_shares_are_read() {
        assert_eq!(SpaceLimit::parse("20%"), Ok(SpaceLimit::Percent(2000)));
        assert_eq!(SpaceLimit::parse("12.5%"), Ok(SpaceLimit::Percent(1250)));
        assert_eq!(SpaceLimit::parse("50GiB"), Ok(SpaceLimit::Bytes(50 << 30)));
        assert_eq!(SpaceLimit::parse("2 MB"), Ok(SpaceLimit::Bytes(2_000_000)));
        assert_eq!(SpaceLimit::parse("4096"), Ok(SpaceLimit::Bytes(4096)));
        assert!(SpaceLimit::parse("101%").is_err());
        assert!(SpaceLimit::parse("5 parsecs").is_err());
        assert!(SpaceLimit::parse("-1").is_err());
        assert!(SpaceLimit::parse("99999999999999TiB").is_err());
        assert_eq!(SpaceLimit::Percent(1000).bytes(8 << 20), 838_860);
        assert_eq!(SpaceLimit::Percent(1250).to_string(), "12.50%");
        assert_eq!(SpaceLimit::Percent(2000).to_string(), "20%");
    }
}

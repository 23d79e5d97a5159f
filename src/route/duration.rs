//! Serde for `Duration` config values written with a unit: `"250ms"`, `"5s"`,
//! `"5m"`, `"1h"`. A bare number is refused: a unit-less timeout is a bug
//! waiting to happen.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// Parses `<digits><unit>` with unit `ms`, `s`, `m` or `h`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("duration `{text}` has no unit (ms, s, m, h)"))?;
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("duration `{text}` does not start with a number"))?;
    let d = match unit.trim() {
        "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => n.checked_mul(60).map(Duration::from_secs),
        "h" => n.checked_mul(3600).map(Duration::from_secs),
        other => return Err(format!("duration `{text}` has unknown unit `{other}`")),
    };
    d.ok_or_else(|| format!("duration `{text}` is too large"))
}

/// The shortest exact text for `d` that [`parse`] reads back.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if !ms.is_multiple_of(1000) {
        format!("{ms}ms")
    } else if ms.is_multiple_of(3_600_000) && ms != 0 {
        format!("{}h", ms / 3_600_000)
    } else if ms.is_multiple_of(60_000) && ms != 0 {
        format!("{}m", ms / 60_000)
    } else {
        format!("{}s", ms / 1000)
    }
}

pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&format(*d))
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse("5").is_err());
        assert!(parse("s").is_err());
        assert!(parse("5d").is_err());
        assert!(parse("99999999999999999999h").is_err());
        assert!(parse("18446744073709551615h").is_err());
    }

    #[test]
    fn format_round_trips() {
        for ms in [
            0u64, 1, 999, 1000, 5000, 60_000, 90_000, 3_600_000, 7_200_500,
        ] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
        }
        assert_eq!(format(Duration::from_secs(300)), "5m");
    }
}

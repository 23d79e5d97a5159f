//! The one duration grammar of isoswitch: config values, command-line flags
//! and simulator options all read durations here, so `"1.5s"` means the same
//! wherever an operator writes it.
//!
//! The grammar is [humantime]'s: a sum of `<number><unit>` terms, e.g.
//! `"150ms"`, `"3s"`, `"1.5s"`, `"5m"`, `"1h 30m"`; units `ns`, `us`, `ms`,
//! `s` (`sec`), `m` (`min`), `h` (`hr`), `d`, `w`, `M` (months), `y`, long
//! forms (`seconds`, `minutes`, ...) too. A bare number is refused: a unit-less
//! timeout is a bug waiting to happen. Errors quote the whole input.
//! Command-line flags take `value_parser = crate::duration::parse`.
//!
//! [`format()`] writes the shortest exact text in that grammar; config dumps
//! (`isoswitch check`) use it, so what they print loads back unchanged.

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serializer};

/// A duration that could not be read, with the text as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("duration `{input}`: {reason} (write a number and a unit: 150ms, 3s, 5m, 1h)")]
pub struct DurationError {
    pub input: String,
    pub reason: String,
}

/// Reads a duration; surrounding whitespace is ignored.
pub fn parse(text: &str) -> Result<Duration, DurationError> {
    humantime::parse_duration(text.trim()).map_err(|e| DurationError {
        input: text.to_string(),
        reason: e.to_string(),
    })
}

/// The shortest exact text for `d` that [`parse`] reads back: one unit, the
/// largest that divides it (`"5m"`, `"90s"`, `"250ms"`, `"1500us"`).
pub fn format(d: Duration) -> String {
    const UNITS: [(u128, &str); 6] = [
        (3_600_000_000_000, "h"),
        (60_000_000_000, "m"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let ns = d.as_nanos();
    if ns == 0 {
        return "0s".to_string();
    }
    // The last unit (1 ns) divides everything, so the search always ends.
    let (size, unit) = UNITS
        .iter()
        .find(|(size, _)| ns.is_multiple_of(*size))
        .unwrap_or(&(1, "ns"));
    format!("{}{unit}", ns / size)
}

/// Serde `with` adapter: `#[serde(with = "crate::duration")]`.
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

    fn ok(text: &str) -> Duration {
        parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn every_unit() {
        let s = Duration::from_secs;
        for (text, want) in [
            ("7ns", Duration::from_nanos(7)),
            ("7us", Duration::from_micros(7)),
            ("250ms", Duration::from_millis(250)),
            ("5s", s(5)),
            ("5sec", s(5)),
            ("5seconds", s(5)),
            ("5m", s(300)),
            ("5min", s(300)),
            ("1h", s(3600)),
            ("1hr", s(3600)),
            ("2d", s(2 * 86_400)),
            ("1w", s(7 * 86_400)),
            ("1M", s(2_630_016)),
            ("1y", s(31_557_600)),
        ] {
            assert_eq!(ok(text), want, "{text}");
        }
    }

    #[test]
    fn sums_fractions_and_whitespace() {
        assert_eq!(ok("1h 30m"), Duration::from_secs(5400));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok("  3s "), Duration::from_secs(3));
        assert_eq!(ok("0s"), Duration::ZERO);
    }

    #[test]
    fn errors_quote_the_input() {
        for bad in [
            "5",
            "s",
            "5d x",
            "5parsecs",
            "",
            "-1s",
            "99999999999999999999h",
        ] {
            let e = parse(bad).expect_err(bad);
            assert_eq!(e.input, bad);
            assert!(
                e.to_string().starts_with(&format!("duration `{bad}`: ")),
                "{e}"
            );
        }
        assert!(parse("5").unwrap_err().to_string().contains("unit"));
    }

    #[test]
    fn format_round_trips() {
        for ns in [
            0u64,
            1,
            999,
            1_500_000,
            1_000_000_000,
            90_000_000_000,
            300_000_000_000,
            3_600_000_000_000,
            7_200_500_000_000,
            1_234_567,
        ] {
            let d = Duration::from_nanos(ns);
            assert_eq!(parse(&format(d)), Ok(d), "{}", format(d));
        }
        assert_eq!(format(Duration::from_secs(300)), "5m");
        assert_eq!(format(Duration::from_secs(90)), "90s");
        assert_eq!(format(Duration::from_micros(1500)), "1500us");
        assert_eq!(format(Duration::ZERO), "0s");
    }

    #[test]
    fn serde_reads_and_writes_the_grammar() {
        #[derive(serde::Deserialize, serde::Serialize, Debug, PartialEq)]
        struct C {
            #[serde(with = "super")]
            t: Duration,
        }
        let c: C = toml::from_str("t = \"1.5s\"").unwrap();
        assert_eq!(c.t, Duration::from_millis(1500));
        assert_eq!(toml::to_string(&c).unwrap().trim(), "t = \"1500ms\"");
        let e = toml::from_str::<C>("t = \"5\"").unwrap_err().to_string();
        assert!(e.contains("duration `5`"), "{e}");
    }
}

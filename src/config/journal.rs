//! `[journal]`: the transaction journal's switch, retention and writer
//! (docs/journal.md). The config file embeds [`JournalConfig`] as its
//! `[journal]` table; absent, the journal is on with these defaults whenever
//! the switch has a store.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{ConfigError, duration, invalid};

/// `[journal]`.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct JournalConfig {
    /// Whether exchanges and admin actions are journaled (needs a store).
    #[serde(default = "defaults::enabled")]
    pub enabled: bool,
    /// Rows older than this are deleted, a bounded batch at a time.
    #[serde(default = "defaults::retain", with = "duration")]
    pub retain: Duration,
    /// Rows waiting for the journal writer; one that finds it full is
    /// dropped and counted (`isoswitch_journal_dropped_total`), never waited
    /// for.
    #[serde(default = "defaults::queue")]
    pub queue: usize,
    /// How long the writer gathers rows before one transaction inserts them.
    #[serde(default = "defaults::batch_interval", with = "duration")]
    pub batch_interval: Duration,
}

mod defaults {
    use std::time::Duration;
    /// On: a switch that answers for its nodes must be able to say
    /// afterwards what it answered, to whom and why. Its cost (about 4 µs
    /// of one thread per row, BENCHMARKS.md "Journal cost") is accepted
    /// with a budget; `enabled = false` turns it off.
    pub fn enabled() -> bool {
        true
    }
    pub fn retain() -> Duration {
        Duration::from_secs(90 * 24 * 3600)
    }
    pub fn queue() -> usize {
        65_536
    }
    /// 20 ms: at 10k req/s a batch of about 200 rows, which costs SQLite
    /// about half a 5 ms batch's CPU per row (BENCHMARKS.md, "Journal
    /// cost"); a kill -9 loses at most about that long of rows.
    pub fn batch_interval() -> Duration {
        Duration::from_millis(20)
    }
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            enabled: defaults::enabled(),
            retain: defaults::retain(),
            queue: defaults::queue(),
            batch_interval: defaults::batch_interval(),
        }
    }
}

impl JournalConfig {
    /// Ranges serde cannot check; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue == 0 {
            return Err(invalid("journal.queue", "must be at least 1"));
        }
        if self.retain < Duration::from_secs(3600) {
            return Err(invalid("journal.retain", "must be at least 1h"));
        }
        if self.batch_interval.is_zero() || self.batch_interval > Duration::from_secs(1) {
            return Err(invalid(
                "journal.batch_interval",
                "must be more than 0 and at most 1s (the batch a kill -9 may lose)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_ranges() {
        let cfg: JournalConfig = toml::from_str("").expect("empty table");
        assert_eq!(cfg, JournalConfig::default());
        assert!(cfg.validate().is_ok());
        let cfg: JournalConfig =
            toml::from_str("retain = \"30d\"\nbatch_interval = \"10ms\"").expect("set");
        assert_eq!(cfg.retain, Duration::from_secs(30 * 86_400));
        let bad = JournalConfig {
            retain: Duration::from_secs(60),
            ..JournalConfig::default()
        };
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("journal.retain")
        );
        assert!(toml::from_str::<JournalConfig>("retention = \"1d\"").is_err());
    }
}

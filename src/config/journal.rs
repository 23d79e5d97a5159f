//! `[journal]`: the transaction journal's switch, retention and writer
//! (docs/journal.md). The config file embeds [`JournalConfig`] as its
//! `[journal]` table; absent, the journal is on with these defaults whenever
//! the switch has a store.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::space::SpaceLimit;
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
    /// The most the journal may take of the store (bytes, `"50GiB"` or
    /// `"20%"` of the filesystem); none: the smaller of 20% of the
    /// filesystem and 50 GiB. Past it the oldest days go, then the journal
    /// pauses (docs/journal.md, "The disk").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_size: Option<SpaceLimit>,
    /// The free space the journal leaves on the store's filesystem for what
    /// the switch owes (SAF); none: 10% of the filesystem.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_free: Option<SpaceLimit>,
}

/// Past either, 50 GiB or 20% of the filesystem, the journal gives way.
pub const DEFAULT_MAX_SIZE_BYTES: u64 = 50 << 30;
pub const DEFAULT_MAX_SIZE_SHARE: SpaceLimit = SpaceLimit::Percent(2000);
pub const DEFAULT_MIN_FREE: SpaceLimit = SpaceLimit::Percent(1000);

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
            max_size: None,
            min_free: None,
        }
    }
}

impl JournalConfig {
    /// `max_size` in bytes on a filesystem of `total` bytes.
    pub fn max_size_bytes(&self, total: u64) -> u64 {
        match self.max_size {
            Some(limit) => limit.bytes(total),
            None => DEFAULT_MAX_SIZE_SHARE
                .bytes(total)
                .min(DEFAULT_MAX_SIZE_BYTES),
        }
    }

    /// `max_size` in bytes for a store on a PostgreSQL server, whose
    /// filesystem the switch cannot read: the bytes given, else the
    /// default's 50 GiB (a share of the filesystem is refused at `check`).
    pub fn max_size_remote_bytes(&self) -> u64 {
        match self.max_size {
            Some(SpaceLimit::Bytes(b)) => b,
            _ => DEFAULT_MAX_SIZE_BYTES,
        }
    }

    /// What a store on a PostgreSQL server allows of these keys: a client
    /// cannot read the server's filesystem, so `min_free` and a `max_size`
    /// given as a share of the filesystem mean nothing there. Refused
    /// rather than silently not held.
    pub fn validate_remote(&self) -> Result<(), ConfigError> {
        if self.min_free.is_some() {
            return Err(invalid(
                "journal.min_free",
                "applies to SQLite's filesystem only: a PostgreSQL server's disk is its own (journal.max_size in bytes holds there)",
            ));
        }
        if matches!(self.max_size, Some(SpaceLimit::Percent(_))) {
            return Err(invalid(
                "journal.max_size",
                "give it in bytes with a PostgreSQL store: the server's filesystem cannot be read from the switch",
            ));
        }
        Ok(())
    }

    /// `min_free` in bytes on a filesystem of `total` bytes.
    pub fn min_free_bytes(&self, total: u64) -> u64 {
        self.min_free.unwrap_or(DEFAULT_MIN_FREE).bytes(total)
    }

    /// Ranges serde cannot check; errors name the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.queue == 0 {
            return Err(invalid("journal.queue", "must be at least 1"));
        }
        if self.retain < Duration::from_secs(3600) {
            return Err(invalid("journal.retain", "must be at least 1h"));
        }
        if matches!(
            self.max_size,
            Some(SpaceLimit::Bytes(0) | SpaceLimit::Percent(0))
        ) {
            return Err(invalid(
                "journal.max_size",
                "must be more than 0 (enabled = false turns the journal off)",
            ));
        }
        if matches!(self.min_free, Some(SpaceLimit::Percent(p)) if p >= 10_000) {
            return Err(invalid(
                "journal.min_free",
                "must be less than 100% (the journal would never write)",
            ));
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
        // Space: the defaults, then as written.
        let gib = 1u64 << 30;
        assert_eq!(cfg.max_size_bytes(100 * gib), 20 * gib);
        assert_eq!(cfg.max_size_bytes(1000 * gib), 50 * gib);
        assert_eq!(cfg.min_free_bytes(100 * gib), 10 * gib);
        let cfg: JournalConfig =
            toml::from_str("max_size = \"5%\"\nmin_free = 1048576").expect("space");
        assert_eq!(cfg.max_size_bytes(100 * gib), 5 * gib);
        assert_eq!(cfg.min_free_bytes(100 * gib), 1 << 20);
        for (text, key) in [
            ("max_size = 0", "journal.max_size"),
            ("min_free = \"100%\"", "journal.min_free"),
        ] {
            let bad: JournalConfig = toml::from_str(text).expect(text);
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        assert!(toml::from_str::<JournalConfig>("max_size = \"lots\"").is_err());
        // On PostgreSQL only max_size in bytes holds.
        let remote = |t: &str| {
            toml::from_str::<JournalConfig>(t)
                .expect("journal")
                .validate_remote()
                .map_err(|e| e.to_string())
        };
        assert_eq!(remote(""), Ok(()));
        assert_eq!(remote("max_size = 1048576"), Ok(()));
        let cfg: JournalConfig = toml::from_str("max_size = 1048576").expect("bytes");
        assert_eq!(cfg.max_size_remote_bytes(), 1 << 20);
        assert_eq!(JournalConfig::default().max_size_remote_bytes(), 50 * gib);
        for (text, key) in [
            ("min_free = 1048576", "journal.min_free"),
            ("max_size = \"5%\"", "journal.max_size"),
        ] {
            let e = remote(text).expect_err(text);
            assert!(e.contains(key), "{text}: {e}");
        }
    }
}

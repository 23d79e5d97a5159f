//! `[store]`: where the store lives and how its writer batches. The config
//! file embeds [`StoreConfig`] as its `[store]` table.
//!
//! `url` forms:
//! - absent: SQLite at `<data_dir>/isoswitch.db`;
//! - `sqlite:///abs/path.db` (or `sqlite:/abs/path.db`): SQLite at that path;
//! - `sqlite:relative.db`: SQLite at that path under the data dir;
//! - `postgres://user:pass@host:port/db` (or `postgresql://`): PostgreSQL,
//!   over TLS with `sslmode=verify-full` semantics (src/store/pg_tls.rs)
//!   whenever the host is not loopback or `store.ca_file` is set. The URL's
//!   `sslmode` may only be `verify-full` or `disable`: the others would
//!   accept an unverified server. A remote host in clear (`sslmode=disable`)
//!   needs `store.allow_plaintext = true`.
//!
//! A PostgreSQL password never leaves this module in clear: `Debug`,
//! `Serialize` and every error show the URL through [`redact_url`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize, Serializer};

use super::error::StoreError;
use super::pg_tls::PgTls;
use super::policy::SafPolicy;

/// The SQLite file's name in the data dir when `store.url` is absent.
pub const DEFAULT_FILE: &str = "isoswitch.db";

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Where the store is; absent: SQLite in the data dir.
    #[serde(default)]
    pub url: Option<String>,
    /// Requests waiting for the writer; a put that finds it full fails at
    /// once with [`StoreError::QueueFull`].
    #[serde(default = "defaults::queue")]
    pub queue: usize,
    /// Most requests committed in one transaction (group commit).
    #[serde(default = "defaults::batch")]
    pub batch: usize,
    #[serde(default)]
    pub saf: SafPolicy,
    /// The data keys SAF payloads are sealed with (src/store/seal.rs); a
    /// relative path is under the data dir. Absent: `store.key` in the data
    /// dir, made on first start. Required with PostgreSQL: every instance
    /// of a pair must open what another sealed.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The CA certificates (PEM) PostgreSQL's server certificate must lead
    /// to; a relative path is under the data dir. Required when the store is
    /// reached over TLS (any non-loopback host), and setting it turns TLS on
    /// for a loopback host too.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Lets `sslmode=disable` reach a non-loopback PostgreSQL in clear (SAF
    /// payloads are sealed, but the PAN's masked form, the SQL and the
    /// password exchange are not). For a network the bank has already
    /// encrypted (an IPsec or WireGuard link), never by default.
    #[serde(default)]
    pub allow_plaintext: bool,
}

mod defaults {
    pub fn queue() -> usize {
        8192
    }
    pub fn batch() -> usize {
        512
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            url: None,
            queue: defaults::queue(),
            batch: defaults::batch(),
            saf: SafPolicy::default(),
            key_file: None,
            ca_file: None,
            allow_plaintext: false,
        }
    }
}

/// Where [`StoreConfig::url`] points, resolved against the data dir.
#[derive(Clone)]
pub enum Location {
    Sqlite(PathBuf),
    Postgres(Box<PgTarget>),
}

/// A PostgreSQL server and database, with the URL as it may be shown.
#[derive(Clone)]
pub struct PgTarget {
    pub(crate) config: tokio_postgres::Config,
    pub redacted: String,
    /// The TLS connector (verify-full); `None`: in clear.
    pub tls: Option<PgTls>,
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Sqlite(path) => write!(f, "sqlite {}", path.display()),
            Location::Postgres(pg) => match &pg.tls {
                Some(tls) => write!(f, "postgres {} over TLS, {tls:?}", pg.redacted),
                None => write!(f, "postgres {} in clear", pg.redacted),
            },
        }
    }
}

impl StoreConfig {
    /// Checks every key; `data_dir` resolves a relative SQLite path.
    pub fn validate(&self, data_dir: &Path) -> Result<(), StoreError> {
        if self.queue == 0 {
            return Err(bad_config("store.queue", "must be at least 1"));
        }
        if self.batch == 0 {
            return Err(bad_config("store.batch", "must be at least 1"));
        }
        self.saf.validate()?;
        let location = self.location(data_dir)?;
        if matches!(location, Location::Postgres(_)) && self.key_file.is_none() {
            return Err(bad_config(
                "store.key_file",
                "required with PostgreSQL: every instance sharing the store must seal and open its entries with the same keys",
            ));
        }
        Ok(())
    }

    /// The key file, resolved against the data dir; `None`: the data dir's own.
    pub fn key_path(&self, data_dir: &Path) -> Option<PathBuf> {
        self.key_file.as_ref().map(|p| data_dir.join(p))
    }

    /// Where the store lives, for this data dir.
    pub fn location(&self, data_dir: &Path) -> Result<Location, StoreError> {
        let Some(url) = &self.url else {
            return Ok(Location::Sqlite(data_dir.join(DEFAULT_FILE)));
        };
        if let Some(rest) = url.strip_prefix("sqlite:") {
            return sqlite_path(url, rest, data_dir).map(Location::Sqlite);
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let ca_file = self.ca_file.as_ref().map(|p| data_dir.join(p));
            return postgres_target(url, ca_file.as_deref(), self.allow_plaintext)
                .map(|t| Location::Postgres(Box::new(t)));
        }
        Err(bad_url(
            url,
            "unknown scheme: write sqlite:PATH or postgres://...",
        ))
    }
}

fn bad_config(key: &'static str, reason: &str) -> StoreError {
    StoreError::BadConfig {
        key,
        reason: reason.to_string(),
    }
}

fn bad_url(url: &str, reason: &str) -> StoreError {
    StoreError::BadUrl {
        url: redact_url(url),
        reason: reason.to_string(),
    }
}

fn sqlite_path(url: &str, rest: &str, data_dir: &Path) -> Result<PathBuf, StoreError> {
    let path = match rest.strip_prefix("//") {
        Some(abs) if abs.starts_with('/') => abs,
        Some(_) => {
            return Err(bad_url(
                url,
                "sqlite:// takes no host: write sqlite:///absolute/path or sqlite:relative/path",
            ));
        }
        None => rest,
    };
    if path.is_empty() || path.ends_with('/') {
        return Err(bad_url(url, "no file name"));
    }
    let path = Path::new(path);
    Ok(if path.is_absolute() {
        path.to_path_buf()
    } else {
        data_dir.join(path)
    })
}

/// Which TLS the URL's `sslmode` asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SslMode {
    /// Absent: TLS for a remote host or with `store.ca_file`, else clear.
    Default,
    VerifyFull,
    Disable,
}

/// Takes `sslmode` out of the URL's query (tokio-postgres knows neither
/// `verify-full` nor how to verify): the URL without it, and the mode.
fn take_sslmode(url: &str) -> Result<(String, SslMode), StoreError> {
    // The query starts at the first `?` after the userinfo (a password may
    // hold one).
    let host_start = url.rfind('@').map_or(0, |at| at + 1);
    let Some(q) = url[host_start..].find('?').map(|i| host_start + i) else {
        return Ok((url.to_string(), SslMode::Default));
    };
    let mut mode = SslMode::Default;
    let mut kept = Vec::new();
    for param in url[q + 1..].split('&') {
        match param.split_once('=') {
            Some(("sslmode", value)) => {
                mode = match value {
                    "verify-full" => SslMode::VerifyFull,
                    "disable" => SslMode::Disable,
                    other => {
                        return Err(bad_url(
                            url,
                            &format!(
                                "sslmode={other} would accept a server it has not verified: \
                                 write sslmode=verify-full (the default) or sslmode=disable"
                            ),
                        ));
                    }
                }
            }
            _ => kept.push(param),
        }
    }
    let base = &url[..q];
    Ok(if kept.is_empty() {
        (base.to_string(), mode)
    } else {
        (format!("{base}?{}", kept.join("&")), mode)
    })
}

/// Whether every host of the URL is this machine (loopback or a Unix socket).
fn all_local(config: &tokio_postgres::Config) -> bool {
    use tokio_postgres::config::Host;
    config.get_hosts().iter().all(|h| match h {
        Host::Unix(_) => true,
        Host::Tcp(name) => {
            name.eq_ignore_ascii_case("localhost")
                || name
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback())
        }
    })
}

fn postgres_target(
    url: &str,
    ca_file: Option<&Path>,
    allow_plaintext: bool,
) -> Result<PgTarget, StoreError> {
    let (stripped, mode) = take_sslmode(url)?;
    let mut config = tokio_postgres::Config::from_str(&stripped).map_err(|e| {
        // The parser's messages name options, not values; scrub anyway.
        let reason = e.to_string();
        let reason = match password_of(url) {
            Some(p) if !p.is_empty() && reason.contains(p) => "cannot be read".to_string(),
            _ => reason,
        };
        bad_url(url, &reason)
    })?;
    if config.get_hosts().is_empty() {
        return Err(bad_url(url, "no host"));
    }
    if config.get_application_name().is_none() {
        config.application_name("isoswitch");
    }
    if config.get_connect_timeout().is_none() {
        config.connect_timeout(Duration::from_secs(5));
    }
    fail_over_defaults(&mut config, stripped.contains("target_session_attrs="));
    let local = all_local(&config);
    let use_tls = match mode {
        SslMode::Disable => false,
        SslMode::VerifyFull => true,
        SslMode::Default => !local || ca_file.is_some(),
    };
    if !use_tls && !local && !allow_plaintext {
        return Err(bad_config(
            "store.allow_plaintext",
            &format!(
                "store.url `{}` reaches a remote PostgreSQL in clear (sslmode=disable): \
                 drop sslmode=disable and set store.ca_file, or set store.allow_plaintext = true \
                 for a link that is encrypted below the switch",
                redact_url(url)
            ),
        ));
    }
    let tls = if use_tls {
        let Some(ca) = ca_file else {
            return Err(bad_config(
                "store.ca_file",
                &format!(
                    "store.url `{}` is reached over TLS (verify-full): name the CA \
                     certificate(s) that signed the server's certificate",
                    redact_url(url)
                ),
            ));
        };
        config.ssl_mode(tokio_postgres::config::SslMode::Require);
        Some(PgTls::from_ca_file(ca)?)
    } else {
        config.ssl_mode(tokio_postgres::config::SslMode::Disable);
        None
    };
    Ok(PgTarget {
        config,
        redacted: redact_url(url),
        tls,
    })
}

/// A silent server (its box or its rack gone, no RST) holds a
/// connection's requests until TCP gives up: 15 minutes by the kernel's
/// defaults. Unless the URL says otherwise, written data unacknowledged for
/// [`TCP_USER_TIMEOUT`] and an idle connection unanswered for about 11 s of
/// keepalives end the connection, so the store reconnects (to the new
/// primary, with several hosts).
pub(crate) const TCP_USER_TIMEOUT: Duration = Duration::from_secs(10);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(5);
const KEEPALIVES_INTERVAL: Duration = Duration::from_secs(2);
const KEEPALIVES_RETRIES: u32 = 3;
/// tokio-postgres's own default idle time (2 h): taken as "not set".
const DRIVER_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);

/// What a store on a primary and standbys needs, unless the URL set it:
/// with more than one host, only a server that takes writes will do
/// (`target_session_attrs=read-write`: a hot standby is skipped, and after
/// a promotion the reconnect finds the new primary); and a dead server is
/// noticed in seconds, not minutes.
fn fail_over_defaults(config: &mut tokio_postgres::Config, attrs_given: bool) {
    use tokio_postgres::config::TargetSessionAttrs;
    if config.get_hosts().len() > 1 && !attrs_given {
        config.target_session_attrs(TargetSessionAttrs::ReadWrite);
    }
    if config.get_tcp_user_timeout().is_none() {
        config.tcp_user_timeout(TCP_USER_TIMEOUT);
    }
    if config.get_keepalives() && config.get_keepalives_idle() == DRIVER_KEEPALIVES_IDLE {
        config.keepalives_idle(KEEPALIVES_IDLE);
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(KEEPALIVES_INTERVAL);
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(KEEPALIVES_RETRIES);
        }
    }
}

/// The `user:password@` part's password, as written.
fn password_of(url: &str) -> Option<&str> {
    let rest = &url[url.find("://")? + 3..];
    let userinfo = &rest[..rest.rfind('@')?];
    userinfo.split_once(':').map(|(_, p)| p)
}

/// The URL with any password replaced by `***`: the one in `user:pass@` (up
/// to the last `@`, so a password holding `/` or `@` is hidden whole) and
/// any `password=` query parameter.
pub fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://").map(|i| i + 3) else {
        return redact_query(url);
    };
    let (head, rest) = url.split_at(scheme_end);
    let (userinfo, host_and_tail) = match rest.rfind('@') {
        Some(at) => (Some(&rest[..at]), &rest[at + 1..]),
        None => (None, rest),
    };
    let user = match userinfo {
        Some(info) => match info.split_once(':') {
            Some((user, _)) => format!("{user}:***@"),
            None => format!("{info}@"),
        },
        None => String::new(),
    };
    format!("{head}{user}{}", redact_query(host_and_tail))
}

fn redact_query(text: &str) -> String {
    let Some((before, query)) = text.split_once('?') else {
        return text.to_string();
    };
    let params: Vec<String> = query
        .split('&')
        .map(|p| match p.split_once('=') {
            Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
            _ => p.to_string(),
        })
        .collect();
    format!("{before}?{}", params.join("&"))
}

impl fmt::Debug for StoreConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StoreConfig")
            .field("url", &self.url.as_deref().map(redact_url))
            .field("queue", &self.queue)
            .field("batch", &self.batch)
            .field("saf", &self.saf)
            .field("ca_file", &self.ca_file)
            .field("allow_plaintext", &self.allow_plaintext)
            .finish()
    }
}

/// Config dumps show the URL redacted (they do not load back with the
/// password: it is not theirs to print).
impl Serialize for StoreConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("StoreConfig", 7)?;
        if let Some(url) = &self.url {
            st.serialize_field("url", &redact_url(url))?;
        }
        st.serialize_field("queue", &self.queue)?;
        st.serialize_field("batch", &self.batch)?;
        st.serialize_field("saf", &self.saf)?;
        if let Some(k) = &self.key_file {
            st.serialize_field("key_file", k)?;
        }
        if let Some(ca) = &self.ca_file {
            st.serialize_field("ca_file", ca)?;
        }
        st.serialize_field("allow_plaintext", &self.allow_plaintext)?;
        st.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(url: &str) -> StoreConfig {
        StoreConfig {
            url: Some(url.to_string()),
            ..StoreConfig::default()
        }
    }

    fn sqlite_at(url: Option<&str>) -> PathBuf {
        let c = StoreConfig {
            url: url.map(str::to_string),
            ..StoreConfig::default()
        };
        match c.location(Path::new("/var/lib/isoswitch")) {
            Ok(Location::Sqlite(p)) => p,
            other => panic!("{url:?}: {other:?}"),
        }
    }

    #[test]
    fn sqlite_urls_resolve_against_the_data_dir() {
        assert_eq!(
            sqlite_at(None),
            Path::new("/var/lib/isoswitch/isoswitch.db")
        );
        assert_eq!(
            sqlite_at(Some("sqlite:///srv/saf.db")),
            Path::new("/srv/saf.db")
        );
        assert_eq!(
            sqlite_at(Some("sqlite:/srv/saf.db")),
            Path::new("/srv/saf.db")
        );
        assert_eq!(
            sqlite_at(Some("sqlite:saf.db")),
            Path::new("/var/lib/isoswitch/saf.db")
        );
        assert_eq!(
            sqlite_at(Some("sqlite:sub/saf.db")),
            Path::new("/var/lib/isoswitch/sub/saf.db")
        );
    }

    #[test]
    fn bad_urls_are_refused_by_name() {
        for url in [
            "sqlite://host/saf.db",
            "sqlite:",
            "sqlite:dir/",
            "mysql://x/y",
            "postgres://u:pw@/db",
        ] {
            match cfg(url).location(Path::new("/d")) {
                Err(StoreError::BadUrl { .. }) => {}
                other => panic!("{url}: {other:?}"),
            }
        }
    }

    #[test]
    fn postgres_urls_parse_and_show_no_password() {
        let url = "postgres://switch:s3cret@127.0.0.1:5433/isoswitch";
        let Ok(Location::Postgres(pg)) = cfg(url).location(Path::new("/d")) else {
            panic!("{url} did not parse");
        };
        assert_eq!(
            pg.redacted,
            "postgres://switch:***@127.0.0.1:5433/isoswitch"
        );
        assert_eq!(pg.config.get_password(), Some(&b"s3cret"[..]));
        assert_eq!(pg.config.get_dbname(), Some("isoswitch"));
        assert_eq!(pg.config.get_application_name(), Some("isoswitch"));
        let shown = format!("{:?} {:?}", cfg(url), Location::Postgres(pg));
        assert!(!shown.contains("s3cret"), "{shown}");
        let dumped = toml::to_string(&cfg(url)).unwrap_or_default();
        assert!(
            dumped.contains("switch:***@") && !dumped.contains("s3cret"),
            "{dumped}"
        );
    }

    #[test]
    fn a_primary_and_standby_url_takes_the_writable_one_and_notices_a_dead_server() {
        use tokio_postgres::config::{Host, TargetSessionAttrs};
        let ca = Path::new("/nonexistent/ca.crt");
        let two = "postgres://switch:pw@10.0.0.1:5432,10.0.0.2:5433/isw";
        // The CA file is read when the target is made: a missing one is
        // refused by name, which shows the URL itself parsed.
        assert_eq!(key_of(target(two, Some(ca), false)), Some("store.ca_file"));
        let clear = format!("{two}?sslmode=disable");
        let Ok(pg) = target(&clear, None, true) else {
            panic!("{two} did not parse");
        };
        assert_eq!(
            pg.config.get_hosts(),
            [Host::Tcp("10.0.0.1".into()), Host::Tcp("10.0.0.2".into())]
        );
        assert_eq!(pg.config.get_ports(), [5432, 5433]);
        assert_eq!(
            pg.config.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            pg.redacted,
            "postgres://switch:***@10.0.0.1:5432,10.0.0.2:5433/isw?sslmode=disable"
        );
        assert_eq!(pg.config.get_tcp_user_timeout(), Some(&TCP_USER_TIMEOUT));
        assert_eq!(pg.config.get_keepalives_idle(), KEEPALIVES_IDLE);
        // What the URL says stands.
        let Ok(pg) = target(
            "postgres://switch:pw@10.0.0.1,10.0.0.2/isw?sslmode=disable&target_session_attrs=any&tcp_user_timeout=30&keepalives_idle=60",
            None,
            true,
        ) else {
            panic!("explicit settings did not parse");
        };
        assert_eq!(
            pg.config.get_target_session_attrs(),
            TargetSessionAttrs::Any
        );
        assert_eq!(
            pg.config.get_tcp_user_timeout(),
            Some(&Duration::from_secs(30))
        );
        assert_eq!(pg.config.get_keepalives_idle(), Duration::from_secs(60));
        // One host: any session will do (the server is what it is).
        let Ok(one) = target(
            "postgres://switch:pw@10.0.0.1/isw?sslmode=disable",
            None,
            true,
        ) else {
            panic!("one host did not parse");
        };
        assert_eq!(
            one.config.get_target_session_attrs(),
            TargetSessionAttrs::Any
        );
    }

    fn target(url: &str, ca: Option<&Path>, allow_plaintext: bool) -> Result<PgTarget, StoreError> {
        let c = StoreConfig {
            url: Some(url.to_string()),
            ca_file: ca.map(Path::to_path_buf),
            allow_plaintext,
            ..StoreConfig::default()
        };
        match c.location(Path::new("/d"))? {
            Location::Postgres(pg) => Ok(*pg),
            Location::Sqlite(p) => panic!("{url}: sqlite {}", p.display()),
        }
    }

    fn key_of(r: Result<PgTarget, StoreError>) -> Option<&'static str> {
        match r {
            Err(StoreError::BadConfig { key, .. }) => Some(key),
            _ => None,
        }
    }

    #[test]
    fn a_remote_store_needs_tls_or_allow_plaintext_by_name() {
        // Remote, no sslmode: verify-full, so the CA is required.
        assert_eq!(
            key_of(target("postgres://u:pw@db.bank.example/isw", None, false)),
            Some("store.ca_file")
        );
        // Remote in clear: refused naming the key that would allow it.
        let e = target("postgres://u:pw@10.1.2.3/isw?sslmode=disable", None, false)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("store.allow_plaintext:"), "{e}");
        assert!(!e.contains("pw@"), "{e}");
        let plain = target("postgres://u:pw@10.1.2.3/isw?sslmode=disable", None, true);
        assert!(plain.is_ok_and(|t| t.tls.is_none()));
        // Loopback stays in clear unless a CA is named.
        let local = target("postgres://u:pw@127.0.0.1:5432/isw", None, false);
        assert!(local.is_ok_and(|t| t.tls.is_none()));
        let local = target("postgres://u:pw@localhost/isw", None, false);
        assert!(local.is_ok_and(|t| t.tls.is_none()));
        assert_eq!(
            key_of(target(
                "postgres://u:pw@127.0.0.1/isw?sslmode=verify-full",
                None,
                false
            )),
            Some("store.ca_file")
        );
        // A CA that cannot be read is named too.
        assert_eq!(
            key_of(target(
                "postgres://u:pw@127.0.0.1/isw",
                Some(Path::new("/nonexistent/ca.pem")),
                false
            )),
            Some("store.ca_file")
        );
    }

    #[test]
    fn only_verified_sslmodes_are_taken() {
        for mode in ["require", "prefer", "allow", "verify-ca"] {
            let url = format!("postgres://u:pw@127.0.0.1/isw?sslmode={mode}");
            match target(&url, None, false) {
                Err(StoreError::BadUrl { reason, .. }) => {
                    assert!(reason.contains("verify-full"), "{reason}")
                }
                other => panic!("{mode}: {:?}", other.map(|t| t.redacted)),
            }
        }
        assert_eq!(
            take_sslmode("postgres://u:p?w@h/db?a=1&sslmode=disable&b=2").ok(),
            Some((
                "postgres://u:p?w@h/db?a=1&b=2".to_string(),
                SslMode::Disable
            ))
        );
        assert_eq!(
            take_sslmode("postgres://h/db?sslmode=verify-full").ok(),
            Some(("postgres://h/db".to_string(), SslMode::VerifyFull))
        );
    }

    #[test]
    fn redaction_hides_awkward_passwords_whole() {
        assert_eq!(
            redact_url("postgres://u:p/s@s@h:1/db"),
            "postgres://u:***@h:1/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(
            redact_url("postgres://h/db?user=u&password=x&sslmode=disable"),
            "postgres://h/db?user=u&password=***&sslmode=disable"
        );
        let e = cfg("postgres://u:topsecret@h:notaport/db")
            .location(Path::new("/d"))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.starts_with("store.url `postgres://u:***@h:notaport/db`"),
            "{e}"
        );
        assert!(!e.contains("topsecret"), "{e}");
    }

    #[test]
    fn the_table_refuses_unknown_keys_and_fills_defaults() {
        let c: StoreConfig = toml::from_str("url = \"sqlite:x.db\"\n[saf]\nretry = \"5s\"\n")
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.saf.retry, Duration::from_secs(5));
        assert_eq!(c.queue, 8192);
        assert!(c.validate(Path::new("/d")).is_ok());
        assert!(toml::from_str::<StoreConfig>("uri = \"x\"").is_err());
        assert!(toml::from_str::<StoreConfig>("[saf]\nretries = \"5s\"").is_err());
        let zero = StoreConfig {
            batch: 0,
            ..StoreConfig::default()
        };
        assert!(matches!(
            zero.validate(Path::new("/d")),
            Err(StoreError::BadConfig {
                key: "store.batch",
                ..
            })
        ));
    }
}

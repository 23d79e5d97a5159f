//! The admin API's credentials: two roles, `read` (GET and HEAD) and
//! `operate` (everything, changes included), each a bearer token read from a
//! file the switch's user alone may read (or a systemd credential, or an
//! environment variable).
//!
//! Only SHA-256 digests of the tokens are kept, and a presented token is
//! compared by its digest, every candidate in full: the time a compare
//! takes tells neither where a guess differs nor how long the token is.
//!
//! **Rotation.** A reload (SIGHUP, `POST /api/v1/reload`) reads the tokens
//! again; a token that changed is replaced, and the one it replaces still
//! works for `admin.token_rotation_window`, so clients can be handed the new
//! one without a gap. A token file that no longer loads refuses the reload.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::config::AdminConfig;

/// The environment variable that holds the operate token when no
/// `token_file` is set and no systemd credential is there.
pub const TOKEN_ENV: &str = "ISOSWITCH_ADMIN_TOKEN";
/// The same for the read token.
pub const READ_TOKEN_ENV: &str = "ISOSWITCH_ADMIN_READ_TOKEN";
/// The systemd credential (`LoadCredential=admin-token:...`) read when no
/// `token_file` is set: `$CREDENTIALS_DIRECTORY/admin-token`.
pub const TOKEN_CREDENTIAL: &str = "admin-token";
/// The read token's credential.
pub const READ_TOKEN_CREDENTIAL: &str = "admin-read-token";
/// The shortest token accepted.
pub const MIN_TOKEN_LEN: usize = 16;

/// What a token lets its holder do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    /// GET and HEAD: status, metrics, connections, the journal, the queue.
    Read,
    /// Everything: drain, disable, enable, add, remove, reload, SAF steering.
    Operate,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Operate => "operate",
        }
    }
}

/// Why the tokens cannot be read, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{key}: {}: {source}", path.display())]
    File {
        key: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{key}: {}: mode {mode:04o}: group or others may read it (chmod 600)", path.display())]
    Readable {
        key: &'static str,
        path: PathBuf,
        mode: u32,
    },
    #[error(
        "admin.token_file: set a token of at least {MIN_TOKEN_LEN} characters there, in the systemd credential {TOKEN_CREDENTIAL} or in {TOKEN_ENV}"
    )]
    NoToken,
    #[error(
        "admin.read_token_file: the read token must be at least {MIN_TOKEN_LEN} characters ({READ_TOKEN_CREDENTIAL}, {READ_TOKEN_ENV})"
    )]
    ShortReadToken,
    #[error("admin.read_token_file: the read token is the operate token; they must differ")]
    SameTokens,
}

/// A token's SHA-256 digest.
type Digest = [u8; 32];

fn digest(token: &[u8]) -> Digest {
    let d = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(d.as_ref());
    out
}

/// Equal digests, in time independent of where they differ.
fn same(a: &Digest, b: &Digest) -> bool {
    std::hint::black_box(a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y))) == 0
}

/// The digests of one generation of tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tokens {
    operate: Digest,
    read: Option<Digest>,
}

impl Tokens {
    fn role_of(&self, presented: &Digest) -> Option<Role> {
        // Both compared, always: which one matched shows in no timing.
        let operate = same(&self.operate, presented);
        let read = self.read.as_ref().is_some_and(|r| same(r, presented));
        if operate {
            Some(Role::Operate)
        } else if read {
            Some(Role::Read)
        } else {
            None
        }
    }
}

/// The tokens in force, and those a rotation replaced until their window
/// ends.
#[derive(Debug)]
struct Generation {
    current: Tokens,
    previous: Option<(Tokens, Instant)>,
}

/// The admin listener's credentials; the reload replaces them.
#[derive(Debug)]
pub struct Credentials {
    now: ArcSwap<Generation>,
}

impl Credentials {
    /// Reads the tokens `cfg` names.
    pub fn load(cfg: &AdminConfig) -> Result<Credentials, CredentialError> {
        let current = read_tokens(cfg)?;
        Ok(Credentials {
            now: ArcSwap::from_pointee(Generation {
                current,
                previous: None,
            }),
        })
    }

    /// The role `presented` grants at `now`, if any.
    pub fn role_of(&self, presented: &str, now: Instant) -> Option<Role> {
        let d = digest(presented.as_bytes());
        let generation = self.now.load();
        let current = generation.current.role_of(&d);
        let previous = generation
            .previous
            .as_ref()
            .filter(|(_, until)| now < *until)
            .and_then(|(tokens, _)| tokens.role_of(&d));
        current.max(previous)
    }

    /// Reads the tokens again (a reload), without using them yet: a file
    /// that does not load refuses the reload before anything changed.
    pub fn reread(cfg: &AdminConfig) -> Result<Tokens, CredentialError> {
        read_tokens(cfg)
    }

    /// Puts tokens [`Credentials::reread`] read in force. A token that
    /// changed replaces the old one, which still works for `window`.
    /// Returns whether any changed.
    pub fn install(&self, fresh: Tokens, window: Duration, now: Instant) -> bool {
        let old = self.now.load();
        if fresh == old.current {
            return false;
        }
        self.now.store(std::sync::Arc::new(Generation {
            current: fresh,
            previous: Some((old.current.clone(), now + window)),
        }));
        true
    }

    /// When the tokens a rotation replaced stop working, if they still do.
    pub fn rotation_ends(&self, now: Instant) -> Option<Duration> {
        let g = self.now.load();
        g.previous
            .as_ref()
            .map(|(_, until)| until.saturating_duration_since(now))
            .filter(|left| !left.is_zero())
    }
}

/// Both tokens, as `cfg` names them.
fn read_tokens(cfg: &AdminConfig) -> Result<Tokens, CredentialError> {
    let operate = read_token(
        "admin.token_file",
        cfg.token_file.as_deref(),
        TOKEN_CREDENTIAL,
        TOKEN_ENV,
    )?
    .filter(|t| t.len() >= MIN_TOKEN_LEN)
    .ok_or(CredentialError::NoToken)?;
    let read = read_token(
        "admin.read_token_file",
        cfg.read_token_file.as_deref(),
        READ_TOKEN_CREDENTIAL,
        READ_TOKEN_ENV,
    )?;
    let read = match read {
        Some(t) if t.len() < MIN_TOKEN_LEN => return Err(CredentialError::ShortReadToken),
        Some(t) if t == operate => return Err(CredentialError::SameTokens),
        other => other,
    };
    Ok(Tokens {
        operate: digest(operate.as_bytes()),
        read: read.map(|t| digest(t.as_bytes())),
    })
}

/// One token: the file's first line, else the systemd credential's (when it
/// exists), else the environment variable's; `None` when none has one.
fn read_token(
    key: &'static str,
    file: Option<&Path>,
    credential: &str,
    env: &str,
) -> Result<Option<String>, CredentialError> {
    let from_credentials = std::env::var_os("CREDENTIALS_DIRECTORY")
        .map(|dir| Path::new(&dir).join(credential))
        .filter(|path| path.is_file());
    let text = match file.map(Path::to_path_buf).or(from_credentials) {
        Some(path) => {
            check_private(key, &path)?;
            let text = std::fs::read_to_string(&path).map_err(|source| CredentialError::File {
                key,
                path: path.clone(),
                source,
            })?;
            text.lines().next().unwrap_or_default().trim().to_string()
        }
        None => std::env::var(env).unwrap_or_default().trim().to_string(),
    };
    Ok(Some(text).filter(|t| !t.is_empty()))
}

/// A secret file (a token, a private key) must be its owner's alone.
pub fn check_private(key: &'static str, path: &Path) -> Result<(), CredentialError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|source| CredentialError::File {
        key,
        path: path.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CredentialError::Readable {
            key,
            path: path.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn secret(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "isoswitch-admin-auth-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn each_token_grants_its_role_and_nothing_else() {
        let dir = scratch("roles");
        let cfg = AdminConfig {
            token_file: Some(secret(&dir, "op", "operate-token-0123456789\n", 0o600)),
            read_token_file: Some(secret(&dir, "rd", "read-token-0123456789ab\n", 0o400)),
            ..AdminConfig::default()
        };
        let creds = Credentials::load(&cfg).unwrap();
        let now = Instant::now();
        assert_eq!(
            creds.role_of("operate-token-0123456789", now),
            Some(Role::Operate)
        );
        assert_eq!(
            creds.role_of("read-token-0123456789ab", now),
            Some(Role::Read)
        );
        for wrong in [
            "",
            "operate-token-012345678",
            "operate-token-01234567890",
            "x",
        ] {
            assert_eq!(creds.role_of(wrong, now), None, "{wrong}");
        }
    }

    #[test]
    fn a_token_file_others_may_read_is_refused_naming_its_key() {
        let dir = scratch("modes");
        for (mode, field) in [(0o644, "token_file"), (0o640, "read_token_file")] {
            let mut cfg = AdminConfig {
                token_file: Some(secret(&dir, "op", "operate-token-0123456789", 0o600)),
                ..AdminConfig::default()
            };
            let loose = secret(&dir, "loose", "another-token-0123456789", mode);
            if field == "token_file" {
                cfg.token_file = Some(loose);
            } else {
                cfg.read_token_file = Some(loose);
            }
            let e = Credentials::load(&cfg).unwrap_err().to_string();
            assert!(
                e.starts_with(&format!("admin.{field}: ")) && e.contains(&format!("{mode:04o}")),
                "{e}"
            );
        }
    }

    #[test]
    fn the_same_token_for_both_roles_is_refused() {
        let dir = scratch("same");
        let cfg = AdminConfig {
            token_file: Some(secret(&dir, "op", "operate-token-0123456789", 0o600)),
            read_token_file: Some(secret(&dir, "rd", "operate-token-0123456789\n", 0o600)),
            ..AdminConfig::default()
        };
        assert!(matches!(
            Credentials::load(&cfg),
            Err(CredentialError::SameTokens)
        ));
    }

    #[test]
    fn a_rotated_token_works_at_once_and_the_old_one_until_the_window_ends() {
        let dir = scratch("rotate");
        let file = secret(&dir, "op", "first-token-0123456789", 0o600);
        let cfg = AdminConfig {
            token_file: Some(file.clone()),
            token_rotation_window: Duration::from_secs(60),
            ..AdminConfig::default()
        };
        let creds = Credentials::load(&cfg).unwrap();
        let t0 = Instant::now();
        let window = cfg.token_rotation_window;
        let reread = || Credentials::reread(&cfg);
        assert!(
            !creds.install(reread().unwrap(), window, t0),
            "nothing changed"
        );
        std::fs::write(&file, "second-token-0123456789\n").unwrap();
        assert!(creds.install(reread().unwrap(), window, t0));
        assert_eq!(
            creds.role_of("second-token-0123456789", t0),
            Some(Role::Operate)
        );
        assert_eq!(
            creds.role_of("first-token-0123456789", t0 + Duration::from_secs(59)),
            Some(Role::Operate)
        );
        assert_eq!(
            creds.role_of("first-token-0123456789", t0 + Duration::from_secs(60)),
            None
        );
        assert!(creds.rotation_ends(t0).is_some());
        // A file that no longer loads leaves the tokens as they were.
        std::fs::write(&file, "short\n").unwrap();
        assert!(reread().is_err());
        assert_eq!(
            creds.role_of("second-token-0123456789", t0),
            Some(Role::Operate)
        );
    }
}

//! The payload of what the switch owes, sealed at rest (PCI DSS 3.5.1: a
//! stored PAN is unreadable). Every SAF payload is encrypted and
//! authenticated with AES-256-GCM (ring, already in the tree through
//! rustls) before it reaches SQLite or PostgreSQL, and opened only when it
//! is leased for delivery.
//!
//! A sealed payload is `ISW` `01` (format), the key id (u32, big-endian),
//! a random 96-bit nonce, then the ciphertext and its 16-byte tag. The
//! associated data binds it to its row's service, kind, MTI and creation
//! time, so a payload moved to another row does not open.
//!
//! Keys come from a key file (`store.key_file`, or `store.key` in the data
//! directory, made on first start): one key a line, `ID HEX` (64 hex
//! digits), `#` comments. The first line seals; every line opens, so a new
//! key goes on top and the old ones stay until `isoswitch store rekey` has
//! re-sealed their rows. A key file readable by group or others is refused.

use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

use super::error::StoreError;
use super::saf::SafKind;

/// What starts a sealed payload, with its format version.
const MAGIC: [u8; 4] = *b"ISW\x01";
/// Magic, key id, nonce.
const HEADER: usize = MAGIC.len() + 4 + NONCE_LEN;
/// Bytes of an AES-256 key.
const KEY_LEN: usize = 32;
/// The key file made in the data directory when none is configured.
pub const DEFAULT_KEY_FILE: &str = "store.key";

/// The keys the store seals and opens with.
pub struct Keyring {
    /// `keys[0]` seals.
    keys: Vec<(u32, LessSafeKey)>,
    rng: SystemRandom,
    path: PathBuf,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ids: Vec<u32> = self.keys.iter().map(|(id, _)| *id).collect();
        f.debug_struct("Keyring")
            .field("path", &self.path)
            .field("key_ids", &ids)
            .finish()
    }
}

/// The row a payload belongs to: what its associated data is made of.
#[derive(Clone, Copy, Debug)]
pub struct RowBinding<'a> {
    pub service: &'a str,
    pub kind: SafKind,
    pub mti: &'a str,
    pub created_at: i64,
}

impl RowBinding<'_> {
    fn aad(&self) -> Vec<u8> {
        let kind = match self.kind {
            SafKind::Reversal => "reversal",
            SafKind::Advice => "advice",
        };
        format!(
            "isoswitch-saf\0{}\0{kind}\0{}\0{}",
            self.service, self.mti, self.created_at
        )
        .into_bytes()
    }
}

/// How a stored payload is kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sealing {
    /// Sealed under this key id.
    Key(u32),
    /// Written by an isoswitch from before sealing: in clear, until
    /// `isoswitch store rekey` seals it.
    Clear,
}

impl Keyring {
    /// The key file `configured`, or the data directory's own, made (0600,
    /// with a WARN) when it does not exist yet.
    pub fn for_store(configured: Option<&Path>, data_dir: &Path) -> Result<Keyring, StoreError> {
        if let Some(path) = configured {
            return Keyring::load(path);
        }
        let path = data_dir.join(DEFAULT_KEY_FILE);
        if path.exists() {
            return Keyring::load(&path);
        }
        let ring = Keyring::create(&path)?;
        tracing::warn!(path = %path.display(), "store: made a data key beside the data it seals; in production keep it apart, as a credential (store.key_file, systemd LoadCredential)");
        Ok(ring)
    }

    /// Reads a key file: refused when group or others may read it.
    pub fn load(path: &Path) -> Result<Keyring, StoreError> {
        check_private(path)?;
        let text = std::fs::read_to_string(path).map_err(|e| StoreError::io(path, e))?;
        let bad = |line: usize, reason: String| StoreError::BadKeyFile {
            path: path.to_path_buf(),
            line,
            reason,
        };
        let mut keys: Vec<(u32, LessSafeKey)> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut parts = line.split_whitespace();
            let (Some(id), Some(hex), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(bad(i + 1, "not `ID HEX`".into()));
            };
            let id: u32 = id
                .parse()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| bad(i + 1, format!("key id `{id}` is not a number 1..")))?;
            if keys.iter().any(|(k, _)| *k == id) {
                return Err(bad(i + 1, format!("key id {id} twice")));
            }
            let bytes = from_hex(hex)
                .filter(|b| b.len() == KEY_LEN)
                .ok_or_else(|| bad(i + 1, "the key is not 64 hex digits (AES-256)".into()))?;
            let key = UnboundKey::new(&AES_256_GCM, &bytes)
                .map_err(|_| bad(i + 1, "not an AES-256 key".into()))?;
            keys.push((id, LessSafeKey::new(key)));
        }
        if keys.is_empty() {
            return Err(bad(0, "no key".into()));
        }
        Ok(Keyring {
            keys,
            rng: SystemRandom::new(),
            path: path.to_path_buf(),
        })
    }

    /// Makes a key file with one new random key (id 1), mode 0600; never
    /// overwrites one.
    pub fn create(path: &Path) -> Result<Keyring, StoreError> {
        let rng = SystemRandom::new();
        let mut key = [0u8; KEY_LEN];
        rng.fill(&mut key).map_err(|_| StoreError::BadKeyFile {
            path: path.to_path_buf(),
            line: 0,
            reason: "no randomness for a new key".into(),
        })?;
        write_new_key_file(path, &format!("1 {}\n", to_hex(&key)))?;
        Keyring::load(path)
    }

    /// Where the keys were read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The id new payloads are sealed under.
    pub fn sealing_key(&self) -> u32 {
        self.keys[0].0
    }

    /// `plain` sealed under the first key, bound to `row`.
    pub fn seal(&self, row: RowBinding<'_>, plain: &[u8]) -> Result<Vec<u8>, StoreError> {
        let (id, key) = &self.keys[0];
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).map_err(|_| StoreError::Seal {
            reason: "no randomness for a nonce".into(),
        })?;
        let mut out = Vec::with_capacity(HEADER + plain.len() + AES_256_GCM.tag_len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&id.to_be_bytes());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(plain);
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(row.aad()),
                &mut out[HEADER..],
            )
            .map_err(|_| StoreError::Seal {
                reason: "AES-GCM refused to seal".into(),
            })?;
        out.extend_from_slice(tag.as_ref());
        Ok(out)
    }

    /// The payload `stored` holds, opened with the key it names (a payload
    /// from before sealing is returned as it is).
    pub fn open(&self, row: RowBinding<'_>, stored: &[u8]) -> Result<Vec<u8>, StoreError> {
        let id = match sealing(stored) {
            Sealing::Clear => return Ok(stored.to_vec()),
            Sealing::Key(id) => id,
        };
        let key = self
            .keys
            .iter()
            .find(|(k, _)| *k == id)
            .map(|(_, key)| key)
            .ok_or_else(|| StoreError::Seal {
                reason: format!(
                    "sealed under key {id}, which {} does not hold",
                    self.path.display()
                ),
            })?;
        let nonce: [u8; NONCE_LEN] =
            stored[MAGIC.len() + 4..HEADER]
                .try_into()
                .map_err(|_| StoreError::Seal {
                    reason: "short header".into(),
                })?;
        let mut buf = stored[HEADER..].to_vec();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(row.aad()),
                &mut buf,
            )
            .map_err(|_| StoreError::Seal {
                reason: format!("does not open under key {id}: altered, or moved from another row"),
            })?;
        let n = plain.len();
        buf.truncate(n);
        Ok(buf)
    }
}

/// How `stored` is kept: sealed (under which key) or in clear.
pub fn sealing(stored: &[u8]) -> Sealing {
    match stored.get(..MAGIC.len() + 4) {
        Some(head) if stored.len() >= HEADER && head[..MAGIC.len()] == MAGIC => {
            let id = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
            Sealing::Key(id)
        }
        _ => Sealing::Clear,
    }
}

/// A key file must be the owner's alone.
fn check_private(path: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| StoreError::io(path, e))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(StoreError::BadKeyFile {
            path: path.to_path_buf(),
            line: 0,
            reason: format!("mode {mode:04o}: group or others may read it (chmod 600)"),
        });
    }
    Ok(())
}

fn write_new_key_file(path: &Path, keys: &str) -> Result<(), StoreError> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // The data dir, when this makes it: private, as the store makes it.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::io(dir, e))?;
    }
    // O_CREAT|O_EXCL never follows a symbolic link, nor overwrites a key.
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(|e| StoreError::io(path, e))?;
    let text = format!(
        "# isoswitch store keys (AES-256-GCM): `ID HEX` a line. The first seals;\n\
         # every one opens. Rotate: add a new first line, run `isoswitch store rekey`,\n\
         # then remove the old key.\n{keys}"
    );
    f.write_all(text.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| StoreError::io(path, e))
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("isoswitch-seal-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn row(created_at: i64) -> RowBinding<'static> {
        RowBinding {
            service: "pos",
            kind: SafKind::Advice,
            mti: "0220",
            created_at,
        }
    }

    const PAN: &[u8] = b"6212345678901234";

    #[test]
    fn a_sealed_payload_hides_the_pan_and_opens_only_in_its_row() {
        let d = dir("roundtrip");
        let ring = Keyring::for_store(None, &d).unwrap();
        let key_file = std::fs::read_to_string(d.join(DEFAULT_KEY_FILE)).unwrap();
        assert!(key_file.lines().any(|l| l.starts_with("1 ")), "{key_file}");
        let sealed = ring.seal(row(1), PAN).unwrap();
        assert!(!sealed.windows(PAN.len()).any(|w| w == PAN));
        assert_eq!(sealing(&sealed), Sealing::Key(1));
        assert_eq!(ring.open(row(1), &sealed).unwrap(), PAN);
        assert!(ring.open(row(2), &sealed).is_err(), "another row's");
        let mut altered = sealed.clone();
        *altered.last_mut().unwrap() ^= 1;
        assert!(ring.open(row(1), &altered).is_err(), "altered");
        // Two seals of one payload differ (a nonce each).
        assert_ne!(ring.seal(row(1), PAN).unwrap(), sealed);
        // A payload from before sealing opens as it is.
        assert_eq!(sealing(b"0200xyz"), Sealing::Clear);
        assert_eq!(ring.open(row(1), b"0200xyz").unwrap(), b"0200xyz");
    }

    #[test]
    fn a_new_first_key_seals_and_the_old_one_still_opens() {
        let d = dir("rotate");
        let path = d.join("keys");
        let old = Keyring::create(&path).unwrap();
        let sealed_old = old.seal(row(1), PAN).unwrap();
        let old_line = std::fs::read_to_string(&path)
            .unwrap()
            .lines()
            .find(|l| l.starts_with("1 "))
            .unwrap()
            .to_string();
        std::fs::remove_file(&path).unwrap();
        let new_key = to_hex(&[7u8; KEY_LEN]);
        write_new_key_file(&path, &format!("2 {new_key}\n{old_line}\n")).unwrap();
        let ring = Keyring::load(&path).unwrap();
        assert_eq!(ring.sealing_key(), 2);
        assert_eq!(ring.open(row(1), &sealed_old).unwrap(), PAN);
        assert_eq!(sealing(&ring.seal(row(1), PAN).unwrap()), Sealing::Key(2));
        // Without the old key, its rows do not open (and say which key).
        std::fs::remove_file(&path).unwrap();
        write_new_key_file(&path, &format!("2 {new_key}\n")).unwrap();
        let e = Keyring::load(&path)
            .unwrap()
            .open(row(1), &sealed_old)
            .unwrap_err();
        assert!(e.to_string().contains("key 1"), "{e}");
    }

    #[test]
    fn a_key_file_others_may_read_or_that_is_not_keys_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let d = dir("refused");
        let path = d.join("keys");
        Keyring::create(&path).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Keyring::load(&path).unwrap_err().to_string();
        assert!(e.contains("0644"), "{e}");
        for (i, (text, why)) in [
            ("", "no key"),
            ("1 abcd\n", "64 hex"),
            ("x 00\n", "key id"),
            (
                &format!("1 {}\n1 {}\n", to_hex(&[1; 32]), to_hex(&[2; 32])),
                "twice",
            ),
        ]
        .into_iter()
        .enumerate()
        {
            let p = d.join(format!("k{i}"));
            write_new_key_file(&p, text).unwrap();
            let e = Keyring::load(&p).unwrap_err().to_string();
            assert!(e.contains(why), "{text:?}: {e}");
        }
    }
}

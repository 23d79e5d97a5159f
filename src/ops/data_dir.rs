//! The data directory: what the switch keeps between runs (the operators'
//! runtime node changes now; the embedded store and captures later).
//!
//! Where it is: `isoswitch run --data-dir DIR`, else the config's `data_dir`,
//! else `$STATE_DIRECTORY` (set by systemd's `StateDirectory=`), else
//! `./isoswitch-data`. It is created with mode 0700 when missing; an existing
//! one must be a real directory (not a symlink) that neither group nor others
//! can enter, or the switch refuses to start and names it.

use std::path::{Path, PathBuf};

/// The environment variable systemd sets for `StateDirectory=` (a
/// colon-separated list when the unit names several).
pub const STATE_DIRECTORY_ENV: &str = "STATE_DIRECTORY";

/// The data directory when nothing names one, relative to the working
/// directory (like Prometheus's `data/`).
pub const DEFAULT: &str = "isoswitch-data";

/// Where the data directory came from, for the start-up log line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    Flag,
    Config,
    StateDirectory,
    Default,
}

impl Origin {
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Flag => "--data-dir",
            Origin::Config => "data_dir",
            Origin::StateDirectory => STATE_DIRECTORY_ENV,
            Origin::Default => "default",
        }
    }
}

/// Why the data directory cannot be used; each names the path.
#[derive(Debug, thiserror::Error)]
pub enum DataDirError {
    #[error("data_dir: {path}: cannot create it: {source}")]
    Create {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("data_dir: {path}: {source}")]
    Inspect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "data_dir: {path} is a symbolic link; name the directory it points to (data_dir or --data-dir)"
    )]
    Symlink { path: PathBuf },
    #[error("data_dir: {path} is not a directory")]
    NotDirectory { path: PathBuf },
    #[error(
        "data_dir: {path} has mode {mode:04o}: group or others can enter it; `chmod 700 {path}` (it holds the operators' runtime changes)"
    )]
    TooOpen { path: PathBuf, mode: u32 },
    #[error(
        "data_dir: {path} is in use by another isoswitch; give each switch its own (--data-dir)"
    )]
    InUse { path: PathBuf },
    #[error(
        "data_dir: {path}: the instance name: empty, longer than 200 or not one line; remove the file for a new name"
    )]
    InstanceName { path: PathBuf },
    #[error("data_dir: {path}: the instance name: {source}")]
    InstanceNameIo {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The file that keeps this switch's instance name.
const INSTANCE_FILE: &str = "instance-name";

/// Picks the data directory: the flag, the config key, the first entry of
/// `$STATE_DIRECTORY`, the default; the first that is set.
pub fn resolve(
    flag: Option<&Path>,
    config: Option<&Path>,
    state_directory: Option<&str>,
) -> (PathBuf, Origin) {
    if let Some(p) = flag {
        return (p.to_path_buf(), Origin::Flag);
    }
    if let Some(p) = config {
        return (p.to_path_buf(), Origin::Config);
    }
    if let Some(first) = state_directory
        .and_then(|v| v.split(':').next())
        .filter(|s| !s.is_empty())
    {
        return (PathBuf::from(first), Origin::StateDirectory);
    }
    (PathBuf::from(DEFAULT), Origin::Default)
}

/// The file in the data directory a running switch holds locked.
pub const LOCK_FILE: &str = "lock";

/// A data directory that exists, is a directory, is private to the switch's
/// user and is locked by this switch (two switches on one directory would
/// overwrite each other's runtime state) until dropped.
#[derive(Debug)]
pub struct DataDir {
    path: PathBuf,
    _lock: std::fs::File,
}

impl DataDir {
    /// Creates `path` (and missing parents) with mode 0700 if it is missing,
    /// checks it and locks it.
    pub fn open(path: &Path) -> Result<DataDir, DataDirError> {
        match std::fs::symlink_metadata(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => create(path)?,
            Err(source) => {
                return Err(DataDirError::Inspect {
                    path: path.to_path_buf(),
                    source,
                });
            }
            Ok(_) => {}
        }
        check(path)?;
        Ok(DataDir {
            path: path.to_path_buf(),
            _lock: lock(path)?,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This switch's name in a shared store's leases: made once (from
    /// `fresh`, e.g. host, process and time) and kept in the directory, so a
    /// restart is the same instance. The directory's lock makes it one
    /// process's at a time: leases under it found at start are a dead
    /// predecessor's, and can be released at once.
    pub fn instance_name(&self, fresh: impl FnOnce() -> String) -> Result<String, DataDirError> {
        let path = self.path.join(INSTANCE_FILE);
        let io = |source| DataDirError::InstanceNameIo {
            path: path.clone(),
            source,
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let name = text.trim();
                if name.is_empty() || name.len() > 200 || name.chars().any(char::is_control) {
                    return Err(DataDirError::InstanceName { path });
                }
                Ok(name.to_string())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let name = fresh();
                write_private(&path, &name).map_err(io)?;
                Ok(name)
            }
            Err(e) => Err(io(e)),
        }
    }
}

/// Writes `text` to a new file at `path`, mode 0600, and syncs it.
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(format!("{text}\n").as_bytes())?;
    file.sync_all()
}

fn create(path: &Path) -> Result<(), DataDirError> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(path).map_err(|source| DataDirError::Create {
        path: path.to_path_buf(),
        source,
    })
}

/// Takes the directory's lock file, exclusively; the lock goes with the
/// process (kill -9 included).
fn lock(dir: &Path) -> Result<std::fs::File, DataDirError> {
    let path = dir.join(LOCK_FILE);
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.mode(0o600);
    }
    let file = options
        .open(&path)
        .map_err(|source| DataDirError::Inspect {
            path: path.clone(),
            source,
        })?;
    #[cfg(unix)]
    {
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a descriptor this function owns; no memory is shared.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            return Err(if err.kind() == std::io::ErrorKind::WouldBlock {
                DataDirError::InUse {
                    path: dir.to_path_buf(),
                }
            } else {
                DataDirError::Inspect { path, source: err }
            });
        }
    }
    Ok(file)
}

fn check(path: &Path) -> Result<(), DataDirError> {
    let meta = std::fs::symlink_metadata(path).map_err(|source| DataDirError::Inspect {
        path: path.to_path_buf(),
        source,
    })?;
    if meta.file_type().is_symlink() {
        return Err(DataDirError::Symlink {
            path: path.to_path_buf(),
        });
    }
    if !meta.is_dir() {
        return Err(DataDirError::NotDirectory {
            path: path.to_path_buf(),
        });
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(DataDirError::TooOpen {
                path: path.to_path_buf(),
                mode,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_instance_name_is_made_once_and_kept() {
        let dir = scratch("instance-name");
        let data = DataDir::open(&dir.join("d")).unwrap();
        let first = data.instance_name(|| "host-a/1/2".into()).unwrap();
        assert_eq!(first, "host-a/1/2");
        let again = data.instance_name(|| "host-a/9/9".into()).unwrap();
        assert_eq!(again, first, "a restart is the same instance");
        std::fs::write(dir.join("d").join(INSTANCE_FILE), "two\nlines\n").unwrap();
        assert!(matches!(
            data.instance_name(|| "x".into()),
            Err(DataDirError::InstanceName { .. })
        ));
    }

    /// A fresh scratch directory for one test.
    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("isoswitch-data-dir-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch dir");
        dir
    }

    #[test]
    fn the_flag_wins_then_the_config_then_systemd_then_the_default() {
        let (flag, config) = (Path::new("/flag"), Path::new("/config"));
        assert_eq!(
            resolve(Some(flag), Some(config), Some("/state")),
            (flag.to_path_buf(), Origin::Flag)
        );
        assert_eq!(
            resolve(None, Some(config), Some("/state")),
            (config.to_path_buf(), Origin::Config)
        );
        assert_eq!(
            resolve(None, None, Some("/var/lib/isoswitch:/var/lib/other")),
            (PathBuf::from("/var/lib/isoswitch"), Origin::StateDirectory)
        );
        assert_eq!(
            resolve(None, None, Some("")),
            (PathBuf::from(DEFAULT), Origin::Default)
        );
        assert_eq!(
            resolve(None, None, None),
            (PathBuf::from(DEFAULT), Origin::Default)
        );
    }

    #[cfg(unix)]
    #[test]
    fn a_missing_directory_is_created_private() {
        use std::os::unix::fs::PermissionsExt;
        let path = scratch("create").join("a/b");
        let dir = DataDir::open(&path).expect("created");
        let mode = std::fs::metadata(dir.path()).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // A second switch on it is refused while the first holds it...
        let err = DataDir::open(&path).unwrap_err();
        assert!(matches!(err, DataDirError::InUse { .. }), "{err}");
        // ...and takes it once the first is gone.
        drop(dir);
        assert_eq!(DataDir::open(&path).unwrap().path(), path);
    }

    #[cfg(unix)]
    #[test]
    fn an_open_file_or_link_is_refused_with_the_path() {
        use std::os::unix::fs::PermissionsExt;
        let root = scratch("refuse");
        let open = root.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o750)).unwrap();
        let err = DataDir::open(&open).unwrap_err();
        assert!(
            matches!(err, DataDirError::TooOpen { mode: 0o750, .. }),
            "{err}"
        );
        assert!(err.to_string().contains(&*open.to_string_lossy()), "{err}");

        let file = root.join("file");
        std::fs::write(&file, "x").unwrap();
        assert!(matches!(
            DataDir::open(&file),
            Err(DataDirError::NotDirectory { .. })
        ));

        let private = root.join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).unwrap();
        let link = root.join("link");
        std::os::unix::fs::symlink(&private, &link).unwrap();
        assert!(matches!(
            DataDir::open(&link),
            Err(DataDirError::Symlink { .. })
        ));
        std::fs::remove_dir_all(&root).unwrap();
    }
}

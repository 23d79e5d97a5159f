//! The SQLite database file's safety, before SQLite opens it: created 0600
//! here, and refused if it (or a leftover -wal / -shm / -journal) is a
//! symbolic link, not a regular file, not ours, or readable by group or
//! others: SQLite gives the -wal and -shm it creates the database file's
//! mode.

use std::fs::{DirBuilder, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use crate::store::error::StoreError;

/// Makes sure the database file exists, 0600 and ours, before SQLite sees it.
pub(super) fn prepare_file(path: &Path) -> Result<(), StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| StoreError::io(dir, e))?;
    }
    // O_CREAT|O_EXCL never follows a symbolic link; O_NOFOLLOW covers the
    // rest. An existing file is checked below.
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(StoreError::io(path, e)),
    }
    check_private(path, true)?;
    for suffix in ["-wal", "-shm", "-journal"] {
        let mut side = path.as_os_str().to_owned();
        side.push(suffix);
        check_private(Path::new(&side), false)?;
    }
    Ok(())
}

/// Refuses a file that is a link, not a regular file, not ours, or open to
/// group or others.
fn check_private(path: &Path, must_exist: bool) -> Result<(), StoreError> {
    let meta = match std::fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == ErrorKind::NotFound && !must_exist => return Ok(()),
        Err(e) => return Err(StoreError::io(path, e)),
    };
    if meta.file_type().is_symlink() {
        return Err(StoreError::unsafe_file(path, "is a symbolic link"));
    }
    if !meta.is_file() {
        return Err(StoreError::unsafe_file(path, "is not a regular file"));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(StoreError::unsafe_file(
            path,
            format!(
                "is owned by uid {}, not this process's uid {me}",
                meta.uid()
            ),
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(StoreError::unsafe_file(
            path,
            format!("has mode {mode:04o}: group or others may read it (chmod 600)"),
        ));
    }
    Ok(())
}

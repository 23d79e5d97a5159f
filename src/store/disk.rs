//! How full a filesystem is, for the guards that keep the journal and the
//! captures from taking the space what the switch owes (SAF) needs
//! (docs/journal.md, "The disk"). Read through a [`DiskProbe`] so that the
//! guards' decisions are unit-tested on made-up disks; the switch's is
//! [`Statvfs`].

use std::path::Path;

/// A filesystem's size and the bytes an unprivileged writer may still take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DiskStats {
    pub total: u64,
    pub avail: u64,
}

/// Reads the filesystem `path` lives on. Blocking (a system call): call it
/// from a blocking thread, never per message.
pub trait DiskProbe: Send + Sync + 'static {
    fn stat(&self, path: &Path) -> std::io::Result<DiskStats>;
}

/// What the journal takes of its store, as the store's writer measures it
/// (a few pragmas and a walk of the b-trees that are not the journal's,
/// SAF's: small while it is healthy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JournalSpace {
    /// Bytes of the journal, its parts, the admin log and their indexes.
    pub used: u64,
    /// Bytes free inside the store's file (SQLite's free pages): rows and
    /// SAF entries take them before the file grows.
    pub reusable: u64,
    /// The oldest journal row's `t_in`, Unix ms; none: no row.
    pub oldest: Option<i64>,
}

/// `statvfs(2)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Statvfs;

impl DiskProbe for Statvfs {
    fn stat(&self, path: &Path) -> std::io::Result<DiskStats> {
        let s = rustix::fs::statvfs(path).map_err(std::io::Error::from)?;
        let unit = if s.f_frsize > 0 {
            s.f_frsize
        } else {
            s.f_bsize
        };
        Ok(DiskStats {
            total: s.f_blocks.saturating_mul(unit),
            avail: s.f_bavail.saturating_mul(unit),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_reads_this_filesystem() {
        let d = Statvfs.stat(Path::new(".")).expect("statvfs .");
        assert!(d.total > 0 && d.avail <= d.total, "{d:?}");
        assert!(Statvfs.stat(Path::new("/no/such/dir")).is_err());
    }
}

//! One capture file as bytes on disk: opened private to the owner (never
//! through a symlink), then written past the page cache (O_DIRECT) in
//! aligned chunks, with a buffered handle for the unaligned tail. What goes
//! in it (pcapng blocks) and when a file gives way to the next (rotation,
//! retention) is the rotating set's, in [`super`].

use std::fs::File;
use std::io::Write;
use std::path::Path;

use super::FILE_MODE;

/// Bytes written per direct write: whole blocks, so every direct write is
/// aligned. On a virtual disk each write costs a notification of the host
/// that took more of the writer's time than the bytes did: 4 MiB rather than
/// 1 MiB makes them a quarter as many (a capture at 10k requests/s writes
/// about 15 MB/s).
const DIRECT_CHUNK: usize = 4 << 20;
/// Alignment O_DIRECT asks of buffers, file offsets and lengths.
const DIRECT_ALIGN: usize = 4096;

/// A capture file written past the page cache (O_DIRECT) in aligned 4 MiB
/// chunks. Buffered writes of a capture's 10+ MB/s cost the switch more CPU
/// than everything else capture does (the kernel copies every byte into
/// newly allocated page-cache pages); a direct write has the device read the
/// buffer. The unaligned tail goes through a second, buffered handle on each
/// flush so that the file on disk always ends at the last whole packet; the
/// next direct write covers it again. Where O_DIRECT is refused (tmpfs,
/// some file systems) both handles are the same buffered file.
pub struct CaptureFile {
    direct: File,
    /// The same file opened without O_DIRECT: the tails.
    tail: File,
    is_direct: bool,
    /// Aligned storage: `buf[start..start + DIRECT_CHUNK]` is the chunk.
    pub(super) buf: Vec<u8>,
    start: usize,
    len: usize,
    /// File offset of the chunk's first byte (a multiple of DIRECT_ALIGN).
    base: u64,
}

/// How a capture file's name is claimed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Claim {
    /// A name nothing holds yet: a file, a symlink or anything else there is
    /// an error (`create_new`), never followed or overwritten.
    New,
    /// The one file the operator named (`replay --record OUT`): replaced if
    /// it is a regular file, refused if it is a symlink.
    Replace,
}

/// Opens `path` for writing as the owner's alone, never through a symlink
/// (O_NOFOLLOW), claimed as `claim` says.
pub(super) fn open_private(path: &Path, claim: Claim) -> std::io::Result<File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut options = std::fs::OpenOptions::new();
    options
        .write(true)
        .mode(FILE_MODE)
        .custom_flags(libc::O_NOFOLLOW);
    match claim {
        Claim::New => options.create_new(true),
        Claim::Replace => options.create(true).truncate(true),
    };
    let file = options.open(path)?;
    if claim == Claim::Replace {
        // `mode` applies only to a file the open creates.
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(file)
}

/// `path` opened again with O_DIRECT, if the file system takes it and the
/// name still is `file` (not swapped for another file or a link since).
fn reopen_direct(path: &Path, file: &File) -> Option<File> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let (a, b) = (file.metadata().ok()?, direct.metadata().ok()?);
    (a.dev() == b.dev() && a.ino() == b.ino()).then_some(direct)
}

impl CaptureFile {
    /// Opens `path` (see [`open_private`]), writing through `buf` when one
    /// is handed over (the previous file's: see [`RotatingFiles`]) instead
    /// of a new one.
    pub(super) fn create(
        path: &Path,
        claim: Claim,
        buf: Option<Vec<u8>>,
    ) -> std::io::Result<CaptureFile> {
        let tail = open_private(path, claim)?;
        let (direct, is_direct) = match reopen_direct(path, &tail) {
            Some(f) => (f, true),
            None => (tail.try_clone()?, false),
        };
        let buf = buf
            .filter(|b| b.len() == DIRECT_CHUNK + DIRECT_ALIGN)
            .unwrap_or_else(|| vec![0u8; DIRECT_CHUNK + DIRECT_ALIGN]);
        let start = buf.as_ptr().align_offset(DIRECT_ALIGN).min(DIRECT_ALIGN);
        Ok(CaptureFile {
            direct,
            tail,
            is_direct,
            buf,
            start,
            len: 0,
            base: 0,
        })
    }

    /// The buffer, for the next file (everything written must be flushed).
    pub(super) fn into_buffer(self) -> Vec<u8> {
        self.buf
    }

    /// Writes the whole blocks of the chunk directly and keeps the rest.
    fn write_blocks(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let whole = if self.is_direct {
            self.len / DIRECT_ALIGN * DIRECT_ALIGN
        } else {
            self.len
        };
        if whole == 0 {
            return Ok(());
        }
        let chunk = &self.buf[self.start..self.start + whole];
        self.direct.write_all_at(chunk, self.base)?;
        self.buf
            .copy_within(self.start + whole..self.start + self.len, self.start);
        self.len -= whole;
        self.base += whole as u64;
        Ok(())
    }
}

impl Write for CaptureFile {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(DIRECT_CHUNK - self.len);
        let at = self.start + self.len;
        self.buf[at..at + n].copy_from_slice(&data[..n]);
        self.len += n;
        if self.len == DIRECT_CHUNK {
            self.write_blocks()?;
        }
        Ok(n)
    }

    /// Everything written so far reaches the file: the whole blocks directly,
    /// the tail through the buffered handle.
    fn flush(&mut self) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        self.write_blocks()?;
        if self.len > 0 {
            self.tail
                .write_all_at(&self.buf[self.start..self.start + self.len], self.base)?;
        }
        Ok(())
    }
}

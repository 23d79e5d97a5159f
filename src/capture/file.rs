//! pcapng files on disk, written with pcap-file: one section and one Ethernet
//! interface (nanosecond timestamps) per file, rotated at a size, the oldest
//! deleted when there are too many or they take too much room. The bytes of
//! one file on disk (private, direct I/O) are `file/direct.rs`.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use std::borrow::Cow;

use byteorder::{BigEndian, LittleEndian};
use pcap_file::pcapng::PcapNgWriter;
use pcap_file::pcapng::blocks::enhanced_packet::EnhancedPacketBlock;
use pcap_file::pcapng::blocks::interface_description::{
    InterfaceDescriptionBlock, InterfaceDescriptionOption,
};
use pcap_file::pcapng::blocks::{ENHANCED_PACKET_BLOCK, PcapNgBlock, RawBlock};
use pcap_file::{DataLink, Endianness};

mod direct;

pub use direct::CaptureFile;
use direct::Claim;

/// Where and how much to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rotation {
    pub directory: PathBuf,
    /// File names start with this (`isoswitch-<service>`).
    pub prefix: String,
    pub max_file_bytes: u64,
    pub max_files: usize,
    pub max_total_bytes: u64,
}

/// Why a capture file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("capture file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("capture file {path}: {source}")]
    Pcap {
        path: PathBuf,
        source: pcap_file::PcapError,
    },
}

struct Open {
    path: PathBuf,
    writer: PcapNgWriter<CaptureFile>,
    bytes: u64,
}

/// Capture files hold client addresses and the fields no spec masks (all of
/// the card data with `clear = true`): the owner's alone, whatever the umask.
const FILE_MODE: u32 = 0o600;
/// A capture directory the switch creates.
const DIR_MODE: u32 = 0o700;

/// The rotating set of capture files of one service.
pub struct RotatingFiles {
    rotation: Rotation,
    current: Option<Open>,
    /// Finished files, oldest first, with their sizes.
    done: VecDeque<(PathBuf, u64)>,
    sequence: u64,
    /// One file of this name, never rotated (`replay --record`).
    exact: Option<PathBuf>,
    /// The body of the packet block being written (reused).
    body: Vec<u8>,
    /// The whole packet block, framed (reused).
    block: Vec<u8>,
    /// The finished file's direct-write buffer, for the next file: a new
    /// 4 MiB buffer per file had the kernel fault in and zero fresh huge
    /// pages, ~2.5% of the switch's samples over a rotation on a VM.
    spare: Option<Vec<u8>>,
    /// The disk guard paused the capture (`min_free`): packets are skipped.
    paused: bool,
    /// Packets skipped while paused, not yet counted by the writer.
    skipped: u64,
}

impl RotatingFiles {
    /// Takes over the files a previous run left in the directory (same
    /// prefix), so the limits hold across restarts.
    /// Files left readable by others are tightened to the owner's alone; a
    /// directory it creates is the owner's alone (0700), and one that exists
    /// open to others is reported.
    pub fn new(rotation: Rotation) -> Result<RotatingFiles, FileError> {
        let dir = &rotation.directory;
        private_directory(dir).map_err(|source| FileError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut done: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
            .map_err(|source| FileError::Io {
                path: dir.clone(),
                source,
            })?
            .filter_map(Result::ok)
            .filter(|e| is_ours(&rotation.prefix, &e.file_name().to_string_lossy()))
            .filter_map(|e| Some((e.path(), e.metadata().ok()?.len())))
            .collect();
        for (path, _) in &done {
            if let Err(e) = tighten(path) {
                tracing::warn!(file = %path.display(), error = %e, "cannot make a capture file private (0600)");
            }
        }
        // Names carry a UTC timestamp and a sequence number: name order is age order.
        done.sort();
        Ok(RotatingFiles {
            rotation,
            current: None,
            done: done.into(),
            sequence: 0,
            exact: None,
            body: Vec::new(),
            spare: None,
            block: Vec::new(),
            paused: false,
            skipped: 0,
        })
    }

    /// Exactly one file at `path`, never rotated or deleted.
    pub fn single(path: &Path) -> RotatingFiles {
        RotatingFiles {
            rotation: Rotation {
                directory: path.parent().map(Path::to_path_buf).unwrap_or_default(),
                prefix: String::new(),
                max_file_bytes: u64::MAX,
                max_files: usize::MAX,
                max_total_bytes: u64::MAX,
            },
            current: None,
            done: VecDeque::new(),
            sequence: 0,
            exact: Some(path.to_path_buf()),
            body: Vec::new(),
            spare: None,
            block: Vec::new(),
            paused: false,
            skipped: 0,
        }
    }

    /// The directory the files go to (its filesystem is the one guarded).
    pub fn directory(&self) -> &Path {
        &self.rotation.directory
    }

    /// Deletes the oldest finished file (never the one being written);
    /// false when there is none.
    pub fn drop_oldest(&mut self) -> bool {
        let Some((oldest, _)) = self.done.pop_front() else {
            return false;
        };
        if let Err(e) = std::fs::remove_file(&oldest) {
            tracing::warn!(file = %oldest.display(), error = %e, "cannot delete an old capture file");
        }
        true
    }

    /// Pauses (skips every packet, counted) or resumes writing.
    pub fn set_paused(&mut self, paused: bool) {
        self.paused = paused;
    }

    pub fn is_paused(&self) -> bool {
        self.paused
    }

    /// Packets skipped while paused since the last call.
    pub fn take_skipped(&mut self) -> u64 {
        std::mem::take(&mut self.skipped)
    }

    /// Whether the next packet goes into a new file (the caller then writes
    /// the handshakes of the connections still open first).
    pub fn needs_new_file(&self) -> bool {
        self.current
            .as_ref()
            .is_none_or(|f| f.bytes >= self.rotation.max_file_bytes)
    }

    /// Closes the current file (if any) and opens the next one, deleting the
    /// oldest files beyond the limits.
    pub fn rotate(&mut self, now: SystemTime) -> Result<(), FileError> {
        self.finish_current()?;
        let (path, file) = self.next_file(now)?;
        let pcap = |source| FileError::Pcap {
            path: path.clone(),
            source,
        };
        let mut writer = PcapNgWriter::new(file).map_err(pcap)?;
        let idb = InterfaceDescriptionBlock {
            linktype: DataLink::ETHERNET,
            snaplen: 0,
            // pcap-file writes timestamps as nanoseconds: say so.
            options: vec![
                InterfaceDescriptionOption::IfTsResol(9),
                InterfaceDescriptionOption::IfName("isoswitch".into()),
            ],
        };
        let bytes = writer.write_pcapng_block(idb).map_err(pcap)? as u64 + 28;
        self.current = Some(Open {
            path,
            writer,
            bytes,
        });
        self.enforce_limits();
        Ok(())
    }

    /// Claims the next file name. A name already taken (a file of a
    /// previous run in the same second, or anything planted there) is left
    /// alone and the next sequence number tried.
    fn next_file(&mut self, now: SystemTime) -> Result<(PathBuf, CaptureFile), FileError> {
        if let Some(path) = self.exact.clone() {
            let file = CaptureFile::create(&path, Claim::Replace, self.spare.take());
            return file
                .map(|f| (path.clone(), f))
                .map_err(|source| FileError::Io { path, source });
        }
        let mut skipped = 0;
        loop {
            self.sequence += 1;
            let path = self.rotation.directory.join(format!(
                "{}-{}-{:04}.pcapng",
                self.rotation.prefix,
                utc_stamp(now),
                self.sequence
            ));
            match CaptureFile::create(&path, Claim::New, self.spare.take()) {
                Ok(file) => return Ok((path, file)),
                Err(e)
                    if e.kind() == std::io::ErrorKind::AlreadyExists && skipped < NAMES_TRIED =>
                {
                    tracing::warn!(file = %path.display(), "capture file name taken: not touched, the next one used");
                    skipped += 1;
                }
                Err(source) => return Err(FileError::Io { path, source }),
            }
        }
    }

    /// Whether a file is open.
    pub fn has_file(&self) -> bool {
        self.current.is_some()
    }

    /// Appends one packet to the current file.
    pub fn write(&mut self, at: SystemTime, packet: &[u8]) -> Result<(), FileError> {
        if self.paused {
            self.skipped += 1;
            return Ok(());
        }
        let Some(open) = self.current.as_mut() else {
            return Ok(());
        };
        let block = EnhancedPacketBlock {
            interface_id: 0,
            timestamp: at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or(Duration::ZERO),
            original_len: packet.len() as u32,
            data: packet.into(),
            options: vec![],
        };
        // pcap-file's `write_pcapng_block` serialises a block twice (once
        // into `io::sink()` to learn its length) in a dozen small writes to
        // the file: a visible share of the writer's time, once per packet.
        // Its own packet block serialisation, done once into a reused
        // buffer, then goes out as one raw block.
        self.body.clear();
        let endianness = open.writer.section().endianness;
        let serialised = match endianness {
            Endianness::Little => block.write_to::<LittleEndian, _>(&mut self.body),
            Endianness::Big => block.write_to::<BigEndian, _>(&mut self.body),
        };
        let pcap = |source| FileError::Pcap {
            path: open.path.clone(),
            source,
        };
        serialised.map_err(|e| pcap(pcap_file::PcapError::IoError(e)))?;
        // Type, length, body (already padded to 4 bytes), length again.
        let len = (self.body.len() + 12) as u32;
        let raw = RawBlock {
            type_: ENHANCED_PACKET_BLOCK,
            initial_len: len,
            body: Cow::Borrowed(&self.body),
            trailer_len: len,
        };
        // The raw block framed into a second reused buffer, then one write
        // to the file: `write_raw_block` would make four small writes
        // through the direct-write buffer per packet, which cost more than
        // this copy of a block still in cache (benches/capture.rs). (Its
        // only other work is for section header blocks.)
        self.block.clear();
        let framed = match endianness {
            Endianness::Little => raw.write_to::<LittleEndian, _>(&mut self.block),
            Endianness::Big => raw.write_to::<BigEndian, _>(&mut self.block),
        };
        framed.map_err(|e| pcap(pcap_file::PcapError::IoError(e)))?;
        let io = |source| FileError::Io {
            path: open.path.clone(),
            source,
        };
        open.writer.get_mut().write_all(&self.block).map_err(io)?;
        // (Counted here: `RawBlock::write_to` reports 6 bytes short.)
        open.bytes += u64::from(len);
        Ok(())
    }

    /// Pushes what is buffered to the file, so readers see it.
    pub fn flush(&mut self) -> Result<(), FileError> {
        if let Some(open) = self.current.as_mut() {
            open.writer
                .get_mut()
                .flush()
                .map_err(|source| FileError::Io {
                    path: open.path.clone(),
                    source,
                })?;
        }
        Ok(())
    }

    /// Flushes and closes the current file.
    pub fn finish_current(&mut self) -> Result<(), FileError> {
        self.flush()?;
        if let Some(open) = self.current.take() {
            self.done.push_back((open.path, open.bytes));
            self.spare = Some(open.writer.into_inner().into_buffer());
        }
        Ok(())
    }

    /// Every file of this capture now on disk, oldest first (the current last).
    pub fn files(&self) -> Vec<PathBuf> {
        self.done
            .iter()
            .map(|(p, _)| p.clone())
            .chain(self.current.as_ref().map(|o| o.path.clone()))
            .collect()
    }

    fn enforce_limits(&mut self) {
        let current = self.current.as_ref().map_or(0, |o| o.bytes);
        loop {
            let files = self.done.len() + usize::from(self.current.is_some());
            let total: u64 = self.done.iter().map(|(_, n)| n).sum::<u64>() + current;
            if files <= self.rotation.max_files.max(1) && total <= self.rotation.max_total_bytes {
                break;
            }
            let Some((oldest, _)) = self.done.pop_front() else {
                break;
            };
            if let Err(e) = std::fs::remove_file(&oldest) {
                tracing::warn!(file = %oldest.display(), error = %e, "cannot delete an old capture file");
            }
        }
    }
}

/// Names taken in a row before a rotation gives up (the capture then stops
/// with the error, as for any file it cannot create).
const NAMES_TRIED: usize = 16;

/// Creates `dir` (and its parents) as the owner's alone; warns when it
/// exists and others may enter it (the files stay 0600; their names, which
/// carry the service and the time, show).
fn private_directory(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    match std::fs::metadata(dir) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                tracing::warn!(directory = %dir.display(), mode = %format!("{mode:o}"), "capture directory open to group or others: files are 0600, but their names show (chmod 700 it)");
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(DIR_MODE)
            .create(dir),
        Err(e) => Err(e),
    }
}

/// Makes a capture file of a previous run the owner's alone, through the
/// file itself (a symlink under its name is left alone).
fn tighten(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    // Non-blocking: a FIFO under a capture file's name must not hang the start.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)?;
    let meta = file.metadata()?;
    if meta.is_file() && meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(FILE_MODE))?;
    }
    Ok(())
}

fn is_ours(prefix: &str, name: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with('-') && rest.ends_with(".pcapng"))
}

/// `20261203T031500Z` for a file name.
fn utc_stamp(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (y, m, d) = crate::iso8583::civil_from_days(secs / 86_400);
    let s = secs % 86_400;
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z",
        s / 3600,
        s / 60 % 60,
        s % 60
    )
}

/// Capture files of `prefix` in `dir`, oldest first (for tests and tools).
pub fn list(dir: &Path, prefix: &str) -> std::io::Result<Vec<PathBuf>> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(Result::ok)
        .filter(|e| is_ours(prefix, &e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    v.sort();
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes a pseudo-random but reproducible pattern.
    fn pattern(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    }

    #[test]
    fn packet_blocks_are_byte_for_byte_what_pcap_file_writes_and_counted_whole() {
        let dir = std::env::temp_dir().join(format!("isoswitch-epb-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcapng");
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_764_700_000, 123_456_789);
        let packets: [&[u8]; 4] = [b"a", b"bc", b"def", b"ghij"];
        let mut files = RotatingFiles::single(&path);
        files.rotate(at).unwrap();
        for p in packets {
            files.write(at, p).unwrap();
        }
        files.finish_current().unwrap();
        let written = std::fs::read(&path).unwrap();

        // The same file through pcap-file's own block writer.
        let mut expected = PcapNgWriter::new(Vec::new()).unwrap();
        expected
            .write_pcapng_block(InterfaceDescriptionBlock {
                linktype: DataLink::ETHERNET,
                snaplen: 0,
                options: vec![
                    InterfaceDescriptionOption::IfTsResol(9),
                    InterfaceDescriptionOption::IfName("isoswitch".into()),
                ],
            })
            .unwrap();
        for p in packets {
            expected
                .write_pcapng_block(EnhancedPacketBlock {
                    interface_id: 0,
                    timestamp: at.duration_since(SystemTime::UNIX_EPOCH).unwrap(),
                    original_len: p.len() as u32,
                    data: p.into(),
                    options: vec![],
                })
                .unwrap();
        }
        assert_eq!(written, expected.into_inner());
        assert_eq!(
            files.done.back().map(|(_, n)| *n),
            Some(written.len() as u64),
            "the size kept for rotation is the file's"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A rotation hands the finished file's direct-write buffer to the next
    /// file (no fresh 4 MiB per file), and nothing of the old file shows in
    /// the new one: each holds its own header and packets only.
    #[test]
    fn rotation_reuses_the_buffer_and_each_file_holds_its_own_packets() {
        let dir = std::env::temp_dir().join(format!("isoswitch-reuse-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut files = RotatingFiles::new(Rotation {
            directory: dir.clone(),
            prefix: "isoswitch-t".into(),
            max_file_bytes: 1 << 30,
            max_files: 10,
            max_total_bytes: 1 << 40,
        })
        .unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_700_000);
        let buffer =
            |f: &mut RotatingFiles| f.current.as_mut().map(|o| o.writer.get_mut().buf.as_ptr());
        files.rotate(at).unwrap();
        let first = buffer(&mut files);
        for n in 0..5 {
            files.write(at, &pattern(300, n)).unwrap();
        }
        files.finish_current().unwrap();
        let kept = files.spare.as_ref().map(|b| b.as_ptr());
        assert_eq!(kept, first, "the finished file's buffer is kept");
        files.rotate(at).unwrap();
        assert!(files.spare.is_none(), "and handed to the next file");
        assert_eq!(buffer(&mut files), first, "which writes through it");
        for n in 0..3 {
            files.write(at, &pattern(200, 10 + n)).unwrap();
        }
        files.finish_current().unwrap();
        let paths = files.files();
        assert_eq!(paths.len(), 2);
        for (path, want) in paths.iter().zip([5usize, 3]) {
            let bytes = std::fs::read(path).unwrap();
            let mut reader = pcap_file::pcapng::PcapNgReader::new(&bytes[..]).unwrap();
            let mut packets = 0;
            while let Some(block) = reader.next_block() {
                if let pcap_file::pcapng::Block::EnhancedPacket(_) = block.unwrap() {
                    packets += 1;
                }
            }
            assert_eq!(packets, want, "{}", path.display());
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn direct_file_holds_every_byte_at_every_flush_and_at_the_end() {
        let dir = std::env::temp_dir().join(format!("isoswitch-direct-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.pcapng");
        let mut f = CaptureFile::create(&path, Claim::New, None).unwrap();
        let mut expected = Vec::new();
        // Odd sizes across more than one chunk, with flushes in between
        // (a flush leaves an unaligned tail that a later direct write covers).
        for (i, n) in [
            1,
            4095,
            4097,
            700_000,
            3,
            1 << 20,
            123_457,
            9,
            2_000_000,
            4 << 20,
        ]
        .into_iter()
        .enumerate()
        {
            let data = pattern(n, i as u64 + 7);
            f.write_all(&data).unwrap();
            expected.extend_from_slice(&data);
            if i % 2 == 0 {
                f.flush().unwrap();
                assert_eq!(std::fs::read(&path).unwrap(), expected, "after flush {i}");
            }
        }
        f.flush().unwrap();
        drop(f);
        assert_eq!(std::fs::read(&path).unwrap(), expected);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn rotation_in(dir: &Path) -> Rotation {
        Rotation {
            directory: dir.to_path_buf(),
            prefix: "isoswitch-t".into(),
            max_file_bytes: 1 << 30,
            max_files: 10,
            max_total_bytes: 1 << 40,
        }
    }

    fn mode(path: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(path)
            .unwrap()
            .permissions()
            .mode()
            & 0o777
    }

    /// A symlink planted where the next capture file goes is not followed:
    /// its target keeps its bytes, the link stays a link, and the capture
    /// goes on in a file of its own under the next name.
    #[test]
    fn a_symlink_at_the_next_file_name_is_not_followed() {
        let dir = std::env::temp_dir().join(format!("isoswitch-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let target = dir.join("precious");
        std::fs::write(&target, b"not a capture").unwrap();
        let captures = dir.join("captures");
        let mut files = RotatingFiles::new(rotation_in(&captures)).unwrap();
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_700_000);
        let planted = captures.join("isoswitch-t-20251202T182640Z-0001.pcapng");
        std::os::unix::fs::symlink(&target, &planted).unwrap();
        files.rotate(at).unwrap();
        files.write(at, b"packet").unwrap();
        files.finish_current().unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"not a capture");
        assert!(
            std::fs::symlink_metadata(&planted)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        let written = files.files();
        assert_eq!(written.len(), 1);
        assert_ne!(written[0], planted);
        assert_eq!(mode(&written[0]), 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Files a previous run left readable by others are tightened to the
    /// owner's alone when a capture takes them over; a new directory is 0700.
    #[test]
    fn files_taken_over_are_tightened_and_new_directories_are_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("isoswitch-tight-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let captures = dir.join("a").join("b");
        let files = RotatingFiles::new(rotation_in(&captures)).unwrap();
        drop(files);
        assert_eq!(mode(&captures), 0o700);
        let old = captures.join("isoswitch-t-20251202T182640Z-0001.pcapng");
        std::fs::write(&old, b"old").unwrap();
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).unwrap();
        let files = RotatingFiles::new(rotation_in(&captures)).unwrap();
        assert_eq!(files.files(), std::slice::from_ref(&old));
        assert_eq!(mode(&old), 0o600);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

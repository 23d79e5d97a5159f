//! The captures' disk guard (`[service.capture] min_free`): a capture never
//! takes the free space the switch's store (SAF, the journal) and the host
//! need. The capture writer's thread reads its directory's filesystem every
//! [`DISK_EVERY`] (`statvfs`: never the message path); under `min_free` it
//! deletes the service's oldest finished files, then pauses the capture
//! (packets skipped, counted as dropped copies) until the space is back,
//! with a margin of 5% so that it does not flap at the edge.

use std::time::Duration;

use super::file::RotatingFiles;
use crate::config::space::SpaceLimit;
use crate::store::disk::DiskProbe;

/// How often the writer reads its directory's filesystem.
pub const DISK_EVERY: Duration = Duration::from_secs(1);

/// The default `min_free`: 10% of the filesystem.
pub const DEFAULT_MIN_FREE: SpaceLimit = SpaceLimit::Percent(1000);

/// What one reading changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// Old files deleted to make room.
    pub deleted: usize,
    /// Paused now (`Some(true)`), resumed (`Some(false)`), or unchanged.
    pub paused: Option<bool>,
    /// The free bytes and `min_free` of the last reading.
    pub avail: u64,
    pub min_free: u64,
}

/// Keeps `min_free` free on the filesystem of `files`' directory.
pub fn keep_free(
    files: &mut RotatingFiles,
    probe: &dyn DiskProbe,
    min_free: SpaceLimit,
) -> std::io::Result<Step> {
    let mut step = Step::default();
    loop {
        let disk = probe.stat(files.directory())?;
        step.avail = disk.avail;
        step.min_free = min_free.bytes(disk.total);
        if disk.avail < step.min_free {
            if files.drop_oldest() {
                step.deleted += 1;
                continue;
            }
            if !files.is_paused() {
                files.set_paused(true);
                step.paused = Some(true);
            }
        } else if files.is_paused() && disk.avail >= step.min_free + step.min_free / 20 {
            files.set_paused(false);
            step.paused = Some(false);
        }
        return Ok(step);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Mutex;
    use std::time::{Duration, SystemTime};

    use super::*;
    use crate::capture::file::Rotation;
    use crate::store::disk::DiskStats;

    /// A disk whose free space is set by the test; deleting a file frees
    /// `per_file` bytes.
    struct FakeDisk(Mutex<u64>);

    impl DiskProbe for FakeDisk {
        fn stat(&self, _: &Path) -> std::io::Result<DiskStats> {
            Ok(DiskStats {
                total: 1000,
                avail: *self.0.lock().unwrap_or_else(|p| p.into_inner()),
            })
        }
    }

    #[test]
    fn under_min_free_old_files_go_then_the_capture_pauses_then_resumes() {
        let dir = std::env::temp_dir().join(format!("isoswitch-capdisk-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut files = RotatingFiles::new(Rotation {
            directory: dir.clone(),
            prefix: "isoswitch-t".into(),
            max_file_bytes: 4096,
            max_files: 100,
            max_total_bytes: 1 << 40,
        })
        .expect("files");
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_764_700_000);
        for _ in 0..3 {
            files.rotate(at).expect("rotate");
            files.write(at, &[7u8; 100]).expect("write");
        }
        assert_eq!(files.files().len(), 3);
        let disk = FakeDisk(Mutex::new(500));
        let limit = SpaceLimit::Percent(1000); // 100 of 1000 bytes
        assert_eq!(
            keep_free(&mut files, &disk, limit).expect("stat"),
            Step {
                deleted: 0,
                paused: None,
                avail: 500,
                min_free: 100
            }
        );
        *disk.0.lock().unwrap_or_else(|p| p.into_inner()) = 50;
        let step = keep_free(&mut files, &disk, limit).expect("stat");
        assert_eq!((step.deleted, step.paused), (2, Some(true)));
        assert_eq!(files.files().len(), 1, "the file being written stays");
        files.write(at, &[7u8; 100]).expect("skipped");
        files.write(at, &[7u8; 100]).expect("skipped");
        assert_eq!(files.take_skipped(), 2);
        // Back at min_free: not yet (the margin); 5% over: resumes.
        *disk.0.lock().unwrap_or_else(|p| p.into_inner()) = 100;
        assert_eq!(
            keep_free(&mut files, &disk, limit).expect("stat").paused,
            None
        );
        *disk.0.lock().unwrap_or_else(|p| p.into_inner()) = 105;
        assert_eq!(
            keep_free(&mut files, &disk, limit).expect("stat").paused,
            Some(false)
        );
        files.write(at, &[7u8; 100]).expect("write");
        assert_eq!(files.take_skipped(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

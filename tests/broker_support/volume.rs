//! Volumes a test can fill or fail: a size-limited tmpfs, or an ext4
//! image loop-mounted with `errors=remount-ro`. Mounting needs root (CI
//! runs as root); where it cannot be done, the test says it skipped,
//! loudly.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{say_cannot, say_skipped};

/// A fresh directory on `/dev/shm` where that is a tmpfs (most Linux
/// systems have one, and no mount is needed), or `None` (said loudly)
/// where it is not. Removed on drop, with whatever a test left in it.
pub fn memory_backed_dir(test: &str) -> Option<tempfile::TempDir> {
    use saguin::storage::file_system::{unkept, Unkept};
    let shm = Path::new("/dev/shm");
    if unkept(shm) != Some(Unkept::InMemory("tmpfs")) {
        say_cannot(test, "/dev/shm is not a tmpfs here");
        return None;
    }
    Some(tempfile::tempdir_in(shm).expect("temp dir in /dev/shm"))
}

/// A mounted volume, unmounted (and its loop image detached) on drop.
pub struct Volume {
    /// Where it is mounted.
    pub path: PathBuf,
    /// The ext4 image behind it, if it is one.
    image: Option<PathBuf>,
    /// Holds the mount point (and an ext4 image) until after the unmount.
    _dir: tempfile::TempDir,
}

impl Volume {
    /// A tmpfs of `size` (mount's syntax, e.g. `8m`), or `None` (said
    /// loudly) where this process cannot mount.
    pub fn tmpfs(test: &str, size: &str) -> Option<Volume> {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("vol");
        std::fs::create_dir(&path).unwrap();
        let mounted = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Volume {
                path,
                image: None,
                _dir: dir,
            }),
            Ok(out) => {
                say_cannot(
                    test,
                    &format!(
                        "cannot mount a tmpfs (needs root and the privilege to mount): {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                );
                None
            }
            Err(e) => {
                say_cannot(test, &format!("cannot run mount: {e}"));
                None
            }
        }
    }

    /// An ext4 file system of `mib` MiB in an image file, loop-mounted with
    /// `errors=remount-ro`, or `None` (said loudly) where that cannot be
    /// done (not root, no mkfs.ext4, no loop devices).
    pub fn ext4(test: &str, mib: u64) -> Option<Volume> {
        let dir = tempfile::tempdir().expect("temp dir");
        let image = dir.path().join("ext4.img");
        let path = dir.path().join("vol");
        std::fs::create_dir(&path).unwrap();
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .unwrap();
        let mkfs = Command::new("mkfs.ext4")
            .args(["-q", "-F", "-O", "^has_journal"])
            .arg(&image)
            .output();
        match mkfs {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                say_skipped(
                    test,
                    &format!(
                        "mkfs.ext4 failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                );
                return None;
            }
            Err(e) => {
                say_skipped(
                    test,
                    &format!("no mkfs.ext4 (apt-get install e2fsprogs): {e}"),
                );
                return None;
            }
        }
        let mounted = Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(&image)
            .arg(&path)
            .output();
        match mounted {
            Ok(out) if out.status.success() => Some(Volume {
                path,
                image: Some(image),
                _dir: dir,
            }),
            Ok(out) => {
                say_cannot(
                    test,
                    &format!(
                        "cannot loop-mount an ext4 image (needs root and loop devices): {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    ),
                );
                None
            }
            Err(e) => {
                say_cannot(test, &format!("cannot run mount: {e}"));
                None
            }
        }
    }

    /// Mounts the ext4 image again, read-write, after the kernel made it
    /// read-only (an emergency read-only mount is not remounted: it is
    /// unmounted, checked and mounted anew, as an operator would).
    pub fn mount_again(&self) {
        let image = self.image.as_ref().expect("an ext4 volume");
        let run = |command: &mut Command| {
            let out = command.output().unwrap();
            assert!(
                out.status.success(),
                "{command:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        run(Command::new("umount").arg(&self.path));
        // e2fsck exits 1 when it corrected something: the error the test
        // raised is recorded in the superblock.
        let fsck = Command::new("e2fsck")
            .arg("-fy")
            .arg(image)
            .output()
            .unwrap();
        assert!(
            fsck.status.code().is_some_and(|c| c <= 1),
            "e2fsck: {}",
            String::from_utf8_lossy(&fsck.stdout)
        );
        run(Command::new("mount")
            .args(["-o", "loop,errors=remount-ro"])
            .arg(image)
            .arg(&self.path));
    }

    /// Makes the kernel meet an ext4 error on this volume, which
    /// `errors=remount-ro` answers by making it read-only while files are
    /// open for writing on it (what `mount -o remount,ro` refuses to do).
    pub fn fail_into_read_only(&self) {
        let out = Command::new("findmnt")
            .args(["-n", "-o", "SOURCE"])
            .arg(&self.path)
            .output()
            .unwrap();
        let source = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let device = Path::new(&source).file_name().unwrap().to_owned();
        let trigger = Path::new("/sys/fs/ext4")
            .join(device)
            .join("trigger_fs_error");
        std::fs::write(&trigger, "saguin disk fault test\n")
            .unwrap_or_else(|e| panic!("{}: {e}", trigger.display()));
        assert!(
            std::fs::write(self.path.join("probe"), b"x").is_err(),
            "the volume is still writable"
        );
    }

    /// Writes everything the volume's file system holds in memory to it.
    pub fn sync(&self) {
        let status = Command::new("sync")
            .arg("-f")
            .arg(&self.path)
            .status()
            .unwrap();
        assert!(status.success(), "sync -f {}", self.path.display());
    }

    /// Fills what is left of the volume with a file of its own, until the
    /// file system says no (ENOSPC).
    pub fn fill(&self, name: &str) -> PathBuf {
        use std::io::Write;
        let path = self.path.join(name);
        let mut f = std::fs::File::create(&path).unwrap();
        let chunk = vec![0xa5u8; 4096];
        loop {
            match f.write_all(&chunk) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
        let _ = f.sync_all();
        path
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        // Lazily: a broker killed a moment ago may still be closing files.
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}

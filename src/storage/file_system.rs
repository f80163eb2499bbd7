//! Where a provider's files are, as far as its promise goes: a file
//! system that lives in memory (tmpfs, ramfs) or over a network (NFS,
//! SMB), where what the provider commits is not kept as it says. Asked of
//! the kernel (`statfs`), once at startup and by the commands that report
//! a provider's durability.

use std::path::Path;

/// A file system a provider's promise does not hold on, by what it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unkept {
    /// tmpfs or ramfs: its files live in memory, and a reboot or a power
    /// cut takes them whatever a provider commits.
    InMemory(&'static str),
    /// NFS, SMB or CIFS: sqlite's write-ahead log needs memory its
    /// connections share (its `-shm` file, mapped) and locks the host
    /// honours, which a network file system does not promise.
    OverNetwork(&'static str),
}

impl Unkept {
    /// The name of a memory-backed file system (`tmpfs`, `ramfs`).
    pub fn in_memory(self) -> Option<&'static str> {
        match self {
            Unkept::InMemory(name) => Some(name),
            Unkept::OverNetwork(_) => None,
        }
    }

    /// The name of a network file system (`nfs`, `smb`).
    pub fn over_network(self) -> Option<&'static str> {
        match self {
            Unkept::OverNetwork(name) => Some(name),
            Unkept::InMemory(_) => None,
        }
    }

    /// What it means for provider `provider` (a sqlite one when `sqlite`)
    /// whose files are in `dir` on this file system, worded once for
    /// `serve`, `check-config` and `saguin bench`. `None` for a memory
    /// provider's snapshots over a network: they are as safe as the server
    /// keeps their fsyncs, which no warning here can judge.
    pub fn warning(self, dir: &Path, provider: &str, sqlite: bool) -> Option<String> {
        let dir = dir.display();
        match self {
            Unkept::InMemory(kind) => Some(format!(
                "{dir} is on {kind}, which lives in memory: what provider {provider} keeps is lost at a reboot or a power cut, whatever its durability says"
            )),
            Unkept::OverNetwork(kind) if sqlite => Some(format!(
                "{dir} is on {kind}, a network file system: sqlite's write-ahead log needs memory its connections share and locks the host honours, which it does not promise; provider {provider} may lose or damage what it commits: keep the database on a local disk"
            )),
            Unkept::OverNetwork(_) => None,
        }
    }

    /// What a `statfs` type (32 bits of `f_type`) is, where it is one of
    /// these (linux/magic.h; ramfs's and the network ones are not in
    /// libc).
    fn of_type(f_type: u32) -> Option<Unkept> {
        const RAMFS_MAGIC: u32 = 0x8584_58f6;
        const NFS_SUPER_MAGIC: u32 = 0x6969;
        const SMB_SUPER_MAGIC: u32 = 0x517b;
        const CIFS_MAGIC_NUMBER: u32 = 0xff53_4d42;
        const SMB2_MAGIC_NUMBER: u32 = 0xfe53_4d42;
        match f_type {
            t if t == libc::TMPFS_MAGIC as u32 => Some(Unkept::InMemory("tmpfs")),
            RAMFS_MAGIC => Some(Unkept::InMemory("ramfs")),
            NFS_SUPER_MAGIC => Some(Unkept::OverNetwork("nfs")),
            SMB_SUPER_MAGIC | CIFS_MAGIC_NUMBER | SMB2_MAGIC_NUMBER => {
                Some(Unkept::OverNetwork("smb"))
            }
            _ => None,
        }
    }
}

/// Whether the file system holding `dir` (or the nearest directory above
/// it that exists: one a first start makes is on its parent's) is one a
/// provider's promise does not hold on. `None` for any other, or when it
/// cannot be asked.
pub fn unkept(dir: &Path) -> Option<Unkept> {
    let mut at = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    while !at.exists() {
        at = match at.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            // A relative path's first component, or `.` itself (a working
            // directory removed under the process): asked of `.` once.
            _ if at != Path::new(".") => Path::new("."),
            _ => return None,
        };
    }
    Unkept::of_type(type_of(at)?)
}

/// The type of the file system holding `at`, as `statfs` gives it (the
/// magic numbers of linux/magic.h); `None` when it cannot be asked.
pub fn type_of(at: &Path) -> Option<u32> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(at.as_os_str().as_bytes()).ok()?;
    let mut stat = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `c` is a NUL-terminated path that outlives the call, and
    // `stat` is written in full by a call that returns 0.
    if unsafe { libc::statfs(c.as_ptr(), stat.as_mut_ptr()) } != 0 {
        return None;
    }
    // SAFETY: statfs returned 0, so it filled `stat`.
    let stat = unsafe { stat.assume_init() };
    // The magic numbers are 32 bits; `f_type` is as wide as the target's
    // word, and signed on some (an ARM board's).
    Some(stat.f_type as u32)
}

/// Whether `dir` is on ext2, ext3 or ext4 mounted without a journal:
/// there, making a file passes over every inode removed in the last
/// minute, so a snapshot generation keeps the files it replaces as spares
/// (`super::spares`) and `saguin bench` says so. Told by the journals the
/// kernel lists (`/proc/fs/jbd2`, an entry `<device>-<inode>` for each; a
/// journal kept on another device is listed under that device, and is
/// taken for none); `None` when it cannot be told.
pub fn without_journal(dir: &Path) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    if type_of(dir)? != libc::EXT4_SUPER_MAGIC as u32 {
        return Some(false);
    }
    let dev = std::fs::metadata(dir).ok()?.dev();
    let device = std::fs::read_link(format!(
        "/sys/dev/block/{}:{}",
        libc::major(dev),
        libc::minor(dev)
    ))
    .ok()?;
    let device = device.file_name()?.to_str()?;
    // No journal mounted anywhere, no directory for them; no /proc/fs,
    // nothing to tell by.
    std::fs::metadata("/proc/fs").ok()?;
    let journals: Vec<String> = match std::fs::read_dir("/proc/fs/jbd2") {
        Ok(entries) => entries
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(_) => return None,
    };
    Some(!has_journal(device, &journals))
}

/// Whether `journals` (the names under `/proc/fs/jbd2`) hold one of block
/// device `device`: `<device>-<its inode>`, as `vda1-8` or `dm-0-8`.
fn has_journal(device: &str, journals: &[String]) -> bool {
    journals.iter().any(|journal| {
        journal
            .strip_prefix(device)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|inode| !inode.is_empty() && inode.bytes().all(|b| b.is_ascii_digit()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_is_told_by_its_device_and_inode() {
        let names = |list: &[&str]| list.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(has_journal("vda1", &names(&["vda1-8"])));
        assert!(has_journal("dm-0", &names(&["sda2-8", "dm-0-8"])));
        // Another device's, or one whose name only begins the same.
        assert!(!has_journal("vda1", &names(&["vda10-8", "vdb1-8"])));
        assert!(!has_journal("dm-0", &names(&["dm-0", "dm-0-"])));
        assert!(!has_journal("loop0", &[]));
    }

    #[test]
    fn a_file_system_that_is_not_ext4_is_not_one_without_a_journal() {
        // /dev/shm is tmpfs wherever this runs; /proc is procfs.
        for dir in ["/dev/shm", "/proc"] {
            if Path::new(dir).exists() {
                assert_eq!(without_journal(Path::new(dir)), Some(false), "{dir}");
            }
        }
    }

    /// The file system type /proc/mounts gives the mount `path` is under:
    /// the longest mount point that is a prefix of it.
    fn mounted_type(path: &Path) -> Option<String> {
        let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
        mounts
            .lines()
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
                path.starts_with(point)
                    .then(|| (point.len(), kind.to_owned()))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, kind)| kind)
    }

    #[test]
    fn the_file_systems_a_promise_does_not_hold_on_are_known_by_type() {
        let known = [
            (0x0102_1994, Some(Unkept::InMemory("tmpfs"))),
            (0x8584_58f6, Some(Unkept::InMemory("ramfs"))),
            (0x6969, Some(Unkept::OverNetwork("nfs"))),
            (0xff53_4d42, Some(Unkept::OverNetwork("smb"))),
            (0xfe53_4d42, Some(Unkept::OverNetwork("smb"))),
            // ext4, xfs, btrfs.
            (0xef53, None),
            (0x5846_5342, None),
            (0x9123_683e, None),
        ];
        for (f_type, expected) in known {
            assert_eq!(Unkept::of_type(f_type), expected, "{f_type:x}");
        }
    }

    /// `statfs` agrees with /proc/mounts on where a directory is, and a
    /// directory not made yet is on the file system of the one above it.
    #[test]
    fn a_memory_backed_file_system_is_found_above_a_directory_not_made_yet() {
        let checkout = std::fs::canonicalize(env!("CARGO_MANIFEST_DIR")).unwrap();
        let shm = Path::new("/dev/shm");
        let mut places = vec![checkout.clone(), checkout.join("not/made/yet")];
        if mounted_type(shm).as_deref() == Some("tmpfs") {
            places.extend([shm.to_path_buf(), shm.join("not/made/yet")]);
        } else {
            eprintln!("SKIP the tmpfs half: /dev/shm is not a tmpfs here");
        }
        for place in places {
            let expected = match mounted_type(&place).as_deref() {
                Some("tmpfs") => Some("tmpfs"),
                Some("ramfs") => Some("ramfs"),
                _ => None,
            };
            assert_eq!(
                unkept(&place).and_then(Unkept::in_memory),
                expected,
                "{}",
                place.display()
            );
        }
    }
}

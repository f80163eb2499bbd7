//! Bounded reading of a file from disk: file type checked with lstat first, size limit before reading.
//!
//! Every snapshot the broker loads and every file `saguin snapshot` looks at
//! comes through [`read_bounded`]. The order of checks is the point:
//!
//! 1. `lstat` (no open yet): a symlink, FIFO, socket, device or directory is
//!    refused by name. Opening a FIFO would block until a writer appears, and
//!    reading a device could never end, so neither is ever opened.
//! 2. The size against the limit, before a byte is read or allocated.
//! 3. `open` with `O_NOFOLLOW | O_NONBLOCK`, then `fstat` on the open file: the
//!    path may have been swapped between 1 and 3, and what was opened is what
//!    is checked again (regular file, same size limit).
//! 4. Read exactly the size `fstat` reported, whole or as a stream
//!    ([`Opened::source`]); a file that grew or shrank meanwhile is refused
//!    rather than half read.

use std::fmt;
use std::fs::{File, Metadata};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Default ceiling for an MBMQTT01 `broker.snapshot` (64 MiB, the legacy
/// broker's own default).
pub const MBMQTT_DEFAULT_MAX_BYTES: u64 = saguin_format::mbmqtt::DEFAULT_MAX_BYTES;

/// Default ceiling for one format 21 file (4 GiB). A memory channel's file is
/// bounded by the memory the channel held, so this only keeps a stray huge
/// file from being read whole; `--max-bytes` overrides it.
pub const F21_DEFAULT_MAX_BYTES: u64 = 4 * 1024 * 1024 * 1024;

/// What a path is when it is not a regular file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpecialKind {
    Symlink,
    Fifo,
    Socket,
    BlockDevice,
    CharDevice,
    Directory,
    Other,
}

impl SpecialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            SpecialKind::Symlink => "a symbolic link",
            SpecialKind::Fifo => "a FIFO",
            SpecialKind::Socket => "a socket",
            SpecialKind::BlockDevice => "a block device",
            SpecialKind::CharDevice => "a character device",
            SpecialKind::Directory => "a directory",
            SpecialKind::Other => "not a regular file",
        }
    }

    /// `None` for a regular file.
    pub fn of(meta: &Metadata) -> Option<SpecialKind> {
        let t = meta.file_type();
        if t.is_file() {
            None
        } else if t.is_symlink() {
            Some(SpecialKind::Symlink)
        } else if t.is_dir() {
            Some(SpecialKind::Directory)
        } else if t.is_fifo() {
            Some(SpecialKind::Fifo)
        } else if t.is_socket() {
            Some(SpecialKind::Socket)
        } else if t.is_block_device() {
            Some(SpecialKind::BlockDevice)
        } else if t.is_char_device() {
            Some(SpecialKind::CharDevice)
        } else {
            Some(SpecialKind::Other)
        }
    }
}

impl fmt::Display for SpecialKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a file could not be read. Each names the path; [`ReadError::reason`]
/// is the same sentence without it.
#[derive(Debug)]
pub enum ReadError {
    NotFound {
        path: PathBuf,
    },
    PermissionDenied {
        path: PathBuf,
    },
    NotRegularFile {
        path: PathBuf,
        kind: SpecialKind,
    },
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    Changed {
        path: PathBuf,
        what: String,
    },
    Io {
        path: PathBuf,
        source: io::Error,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path().display(), self.reason())
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

impl ReadError {
    pub fn path(&self) -> &Path {
        match self {
            ReadError::NotFound { path }
            | ReadError::PermissionDenied { path }
            | ReadError::NotRegularFile { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::Changed { path, .. }
            | ReadError::Io { path, .. } => path,
        }
    }

    /// What went wrong, without the path.
    pub fn reason(&self) -> String {
        match self {
            ReadError::NotFound { .. } => "no such file".into(),
            ReadError::PermissionDenied { .. } => "permission denied".into(),
            ReadError::NotRegularFile { kind, .. } => {
                format!("is {kind}, not a regular file; it was not opened")
            }
            ReadError::TooLarge { size, limit, .. } => {
                format!("{size} bytes is over the {limit}-byte limit (raise it with --max-bytes)")
            }
            ReadError::Changed { what, .. } => format!("changed while it was being read ({what})"),
            ReadError::Io { source, .. } => source.to_string(),
        }
    }

    /// True when the file could not be read at all (missing, permission, an
    /// I/O error): the work could not be done (exit 3). The others are
    /// answers about the file: it is not a snapshot that can be loaded
    /// (exit 1).
    pub fn is_unreadable(&self) -> bool {
        matches!(
            self,
            ReadError::NotFound { .. } | ReadError::PermissionDenied { .. } | ReadError::Io { .. }
        )
    }

    /// A short stable name for JSON output.
    pub fn code(&self) -> &'static str {
        match self {
            ReadError::NotFound { .. } => "not-found",
            ReadError::PermissionDenied { .. } => "permission-denied",
            ReadError::NotRegularFile { .. } => "not-a-regular-file",
            ReadError::TooLarge { .. } => "too-large",
            ReadError::Changed { .. } => "changed-while-read",
            ReadError::Io { .. } => "io",
        }
    }

    pub(crate) fn from_io(path: &Path, err: io::Error) -> ReadError {
        let path = path.to_path_buf();
        match err.kind() {
            io::ErrorKind::NotFound => ReadError::NotFound { path },
            io::ErrorKind::PermissionDenied => ReadError::PermissionDenied { path },
            _ if err.raw_os_error() == Some(libc::ELOOP) => ReadError::NotRegularFile {
                path,
                kind: SpecialKind::Symlink,
            },
            _ => ReadError::Io { path, source: err },
        }
    }
}

/// `lstat` of `path`, mapped to [`ReadError`]. Never follows a symlink.
pub fn lstat(path: &Path) -> Result<Metadata, ReadError> {
    std::fs::symlink_metadata(path).map_err(|e| ReadError::from_io(path, e))
}

/// Read the whole of the regular file at `path`, at most `max_bytes` long.
/// See the module documentation for the order of checks.
pub fn read_bounded(path: &Path, max_bytes: u64) -> Result<Vec<u8>, ReadError> {
    read_bounded_by_magic(path, max_bytes, |_| max_bytes)
}

/// How many leading bytes [`read_bounded_by_magic`] shows its limit
/// function: enough for every magic saguin knows.
pub const MAGIC_PROBE_LEN: usize = 8;

/// [`read_bounded`] where the limit depends on what the file is: `ceiling`
/// bounds every file before it is opened, then `limit_for` is shown the
/// first [`MAGIC_PROBE_LEN`] bytes (fewer for a shorter file) and returns
/// the limit for that kind, checked before the rest is read. So a legacy
/// MBMQTT01 file is held to its own 64 MiB default without a 4 GiB read.
pub fn read_bounded_by_magic(
    path: &Path,
    ceiling: u64,
    limit_for: impl FnOnce(&[u8]) -> u64,
) -> Result<Vec<u8>, ReadError> {
    open_bounded_by_magic(path, ceiling, limit_for)?.read_whole()
}

/// A regular file opened and held to its limit, its first bytes read:
/// what [`read_bounded_by_magic`] reads whole, or a caller reads as a
/// stream ([`Opened::source`]).
pub struct Opened {
    file: File,
    path: PathBuf,
    size: u64,
    probe: [u8; MAGIC_PROBE_LEN],
    probe_len: usize,
}

/// [`read_bounded_by_magic`] up to the read of the rest: every check on the
/// path, the opened file and its size is made.
pub fn open_bounded_by_magic(
    path: &Path,
    ceiling: u64,
    limit_for: impl FnOnce(&[u8]) -> u64,
) -> Result<Opened, ReadError> {
    let meta = lstat(path)?;
    if let Some(kind) = SpecialKind::of(&meta) {
        return Err(ReadError::NotRegularFile {
            path: path.to_path_buf(),
            kind,
        });
    }
    check_size(path, meta.len(), ceiling)?;

    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| ReadError::from_io(path, e))?;
    let opened = file.metadata().map_err(|e| ReadError::from_io(path, e))?;
    if let Some(kind) = SpecialKind::of(&opened) {
        return Err(ReadError::NotRegularFile {
            path: path.to_path_buf(),
            kind,
        });
    }
    let size = opened.len();
    check_size(path, size, ceiling)?;
    let mut probe = [0u8; MAGIC_PROBE_LEN];
    let probe_len = read_probe(&mut file, &mut probe).map_err(|e| ReadError::from_io(path, e))?;
    check_size(
        path,
        size,
        limit_for(probe.get(..probe_len).unwrap_or_default()).min(ceiling),
    )?;
    if probe_len as u64 != size.min(MAGIC_PROBE_LEN as u64) {
        return Err(ReadError::Changed {
            path: path.to_path_buf(),
            what: format!("{size} bytes when opened, {probe_len} read"),
        });
    }
    Ok(Opened {
        file,
        path: path.to_path_buf(),
        size,
        probe,
        probe_len,
    })
}

impl Opened {
    /// The file's first bytes: [`MAGIC_PROBE_LEN`] of them, fewer only for
    /// a shorter file.
    pub fn probe(&self) -> &[u8] {
        self.probe.get(..self.probe_len).unwrap_or_default()
    }

    /// The file's size when it was opened.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// [`Opened::size`] as a length in memory: a file larger than this
    /// process can address is refused as too large.
    pub fn length(&self) -> Result<usize, ReadError> {
        usize::try_from(self.size).map_err(|_| ReadError::TooLarge {
            path: self.path.clone(),
            size: self.size,
            limit: usize::MAX as u64,
        })
    }

    /// The whole file, refused if it grew or shrank since it was opened.
    pub fn read_whole(mut self) -> Result<Vec<u8>, ReadError> {
        // The whole file lands in one buffer sized once: no second copy and
        // no growth, so reading a file costs its size in memory and nothing
        // more.
        let capacity = self.length()?;
        let mut buf = Vec::with_capacity(capacity);
        buf.extend_from_slice(self.probe());
        let size = self.size;
        read_rest(&mut self.file, &self.path, size, &mut buf).map_err(|e| match e {
            ReadError::Changed { path, .. } => ReadError::Changed {
                path,
                what: format!("{size} bytes when opened, a different amount read"),
            },
            other => other,
        })?;
        Ok(buf)
    }

    /// The file from its first byte, to be read as a stream of its
    /// [`Opened::size`] bytes and then handed to [`Opened::finish`] (or,
    /// when the read fails, to [`Opened::failed`]).
    /// The first bytes, read already, are handed on once: a second source
    /// goes on where the first stopped.
    pub fn source(&mut self) -> impl Read + '_ {
        let probe = self
            .probe
            .get(..std::mem::take(&mut self.probe_len))
            .unwrap_or_default();
        probe.chain(&mut self.file)
    }

    /// Ends a read of all [`Opened::size`] bytes of [`Opened::source`]: a
    /// file that has more now grew since it was opened, and is refused as
    /// changed.
    pub fn finish(mut self) -> Result<(), ReadError> {
        loop {
            match self.file.read(&mut [0u8; 1]) {
                Ok(0) => return Ok(()),
                Ok(_) => return Err(self.changed("more read")),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ReadError::from_io(&self.path, e)),
            }
        }
    }

    /// What a read of [`Opened::source`] that failed with `error` says: a
    /// file that ended early shrank since it was opened, and is refused as
    /// changed; any other failure is the read's.
    pub fn failed(self, error: io::Error) -> ReadError {
        match error.kind() {
            io::ErrorKind::UnexpectedEof => self.changed("fewer read"),
            _ => ReadError::from_io(&self.path, error),
        }
    }

    fn changed(&self, what: &str) -> ReadError {
        ReadError::Changed {
            path: self.path.clone(),
            what: format!("{} bytes when opened, {what}", self.size),
        }
    }
}

/// Up to `probe.len()` leading bytes; fewer only at the end of the file.
fn read_probe(file: &mut File, probe: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while let Some(rest) = probe.get_mut(filled..).filter(|r| !r.is_empty()) {
        match file.read(rest) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

fn check_size(path: &Path, size: u64, limit: u64) -> Result<(), ReadError> {
    if size > limit {
        return Err(ReadError::TooLarge {
            path: path.to_path_buf(),
            size,
            limit,
        });
    }
    Ok(())
}

/// Reads the rest of a `size`-byte file onto `buf` (which holds what was
/// read so far), refusing a file that grew or shrank since `fstat`.
fn read_rest(file: &mut File, path: &Path, size: u64, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let left = size.saturating_sub(buf.len() as u64);
    // One byte past the size tells "grew since fstat" from "exactly right";
    // with the buffer already at its capacity, std probes that byte on the
    // stack rather than growing the buffer.
    file.take(left.saturating_add(1))
        .read_to_end(buf)
        .map_err(|e| ReadError::from_io(path, e))?;
    if buf.len() as u64 != size {
        return Err(ReadError::Changed {
            path: path.to_path_buf(),
            what: format!("{size} bytes when opened, {} read", buf.len()),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn reads_a_regular_file_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"hello").unwrap();
        assert_eq!(read_bounded(&p, 5).unwrap(), b"hello");
        assert!(matches!(
            read_bounded(&p, 4),
            Err(ReadError::TooLarge {
                size: 5,
                limit: 4,
                ..
            })
        ));
    }

    #[test]
    fn a_file_is_read_into_one_buffer_of_its_size() {
        // No growth and no second copy: the buffer's capacity is the file's
        // size, so a large snapshot costs its size in memory once (and
        // `Bytes::from` takes the buffer over without reallocating).
        let dir = tempfile::tempdir().unwrap();
        for len in [0usize, 3, 8, 9, 4096, 100_003] {
            let p = dir.path().join(format!("f{len}"));
            let data: Vec<u8> = (0..len).map(|i| i as u8).collect();
            std::fs::write(&p, &data).unwrap();
            let read = read_bounded(&p, 1 << 20).unwrap();
            assert_eq!(read, data);
            assert_eq!(read.capacity(), len, "a {len}-byte file");
        }
    }

    #[test]
    fn the_limit_can_depend_on_the_magic() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"MBMQTT01 and more").unwrap();
        let limit = |probe: &[u8]| if probe.starts_with(b"MBMQ") { 10 } else { 100 };
        assert!(matches!(
            read_bounded_by_magic(&p, 100, limit),
            Err(ReadError::TooLarge {
                size: 17,
                limit: 10,
                ..
            })
        ));
        std::fs::write(&p, b"other bytes, 17..").unwrap();
        assert_eq!(
            read_bounded_by_magic(&p, 100, limit).unwrap(),
            b"other bytes, 17.."
        );
        // Shorter than the probe.
        std::fs::write(&p, b"abc").unwrap();
        assert_eq!(read_bounded_by_magic(&p, 100, limit).unwrap(), b"abc");
        std::fs::write(&p, b"").unwrap();
        assert_eq!(read_bounded_by_magic(&p, 100, limit).unwrap(), b"");
    }

    #[test]
    fn refuses_special_files_without_opening_them() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // Would hang forever if it were opened for reading without a writer.
        let err = read_bounded(&fifo, 100).unwrap_err();
        assert!(
            matches!(
                err,
                ReadError::NotRegularFile {
                    kind: SpecialKind::Fifo,
                    ..
                }
            ),
            "{err}"
        );
        assert!(!err.is_unreadable());

        let target = dir.path().join("t");
        std::fs::write(&target, b"x").unwrap();
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            read_bounded(&link, 100),
            Err(ReadError::NotRegularFile {
                kind: SpecialKind::Symlink,
                ..
            })
        ));
        assert!(matches!(
            read_bounded(dir.path(), 100),
            Err(ReadError::NotRegularFile {
                kind: SpecialKind::Directory,
                ..
            })
        ));
        assert!(matches!(
            read_bounded(Path::new("/dev/null"), 100),
            Err(ReadError::NotRegularFile {
                kind: SpecialKind::CharDevice,
                ..
            })
        ));
        let missing = read_bounded(&dir.path().join("missing"), 100).unwrap_err();
        assert!(matches!(missing, ReadError::NotFound { .. }));
        assert!(missing.is_unreadable());
        assert!(missing.to_string().contains("missing: no such file"));
    }

    /// A file read as a stream that grew or shrank after it was opened is
    /// refused as changed, as a file read whole is.
    #[test]
    fn a_streamed_file_that_grew_or_shrank_since_it_was_opened_is_changed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, b"0123456789abcdef").unwrap();
        let read_all = |opened: &mut Opened| {
            let mut got = vec![0u8; opened.size() as usize];
            opened.source().read_exact(&mut got).map(|()| got)
        };

        let mut opened = open_bounded_by_magic(&p, 100, |_| 100).unwrap();
        assert_eq!(opened.probe(), b"01234567");
        assert_eq!(read_all(&mut opened).unwrap(), b"0123456789abcdef");
        opened.finish().expect("a file read as it was opened");

        let mut opened = open_bounded_by_magic(&p, 100, |_| 100).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&p)
            .unwrap()
            .write_all(b"+")
            .unwrap();
        read_all(&mut opened).unwrap();
        let grew = opened.finish().unwrap_err();
        assert!(
            grew.to_string().contains("16 bytes when opened, more read"),
            "{grew}"
        );

        let mut opened = open_bounded_by_magic(&p, 100, |_| 100).unwrap();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(10)
            .unwrap();
        let early = read_all(&mut opened).unwrap_err();
        let shrank = opened.failed(early);
        assert!(
            shrank
                .to_string()
                .contains("17 bytes when opened, fewer read"),
            "{shrank}"
        );
    }
}

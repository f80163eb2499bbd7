//! `saguin passwd`: manage a mosquitto_passwd-format password file, the one
//! `auth.password_file` names.
//!
//! Every change is proved before it is kept: the new text is parsed by the
//! very reader the broker and `check-config` use ([`PasswordFile::parse`]),
//! and a set password is checked against it, before the file is replaced
//! (temporary file beside it, mode 0600, fsync, rename, directory fsync).

use std::fs::OpenOptions;
use std::io::{BufRead, IsTerminal, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use saguin::config::auth::{self, PasswordFile, DEFAULT_PBKDF2_ITERATIONS};

use crate::exit;

/// Largest password file read: the broker's own limit.
const MAX_FILE_BYTES: u64 = 16 * 1024 * 1024;

/// Add, change or delete a user in a password file, or hash a plain-text one.
#[derive(clap::Args, Debug)]
#[command(after_help = EXAMPLES)]
pub struct Args {
    /// Batch: take PASSWORD from the command line instead of asking. The
    /// password is then visible to other users in the process list; piping
    /// it on stdin avoids that.
    #[arg(short = 'b', conflicts_with_all = ["delete", "upgrade"])]
    pub batch: bool,
    /// Delete USER from FILE.
    #[arg(short = 'D', conflicts_with = "upgrade")]
    pub delete: bool,
    /// Upgrade FILE in place: hash every plain-text `user:password` line,
    /// keeping lines that are hashed already.
    #[arg(short = 'U')]
    pub upgrade: bool,
    /// PBKDF2 iterations for the hashes written (mosquitto_passwd's default
    /// is 101; every CONNECT with a password pays them once).
    #[arg(short = 'I', long, value_name = "N", default_value_t = DEFAULT_PBKDF2_ITERATIONS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(auth::MAX_PBKDF2_ITERATIONS)))]
    pub iterations: u32,
    /// The password file. Created (mode 0600) when a user is added to a file
    /// that does not exist.
    pub file: PathBuf,
    /// The user to add, change or delete.
    pub user: Option<String>,
    /// The password, with -b only.
    pub password: Option<String>,
}

/// What `saguin passwd --help` and its man page say of it.
pub const LONG_ABOUT: &str = "\
Add, change or delete a user in a password file, or hash a plain-text one, \
writing mosquitto_passwd's format: one `user:$7$iterations$salt$hash` line \
per user (PBKDF2-HMAC-SHA512, a 12-byte random salt, base64), which \
auth.password_file reads. Other lines, comments included, are kept as they \
are, in their order.

saguin passwd FILE USER asks for the password twice on the terminal, \
without echoing it; when stdin is not a terminal it reads one line from \
stdin instead (printf '%s\\n' \"$PW\" | saguin passwd FILE USER). -b takes it \
from the command line. The password is never printed or logged.

Before FILE is replaced, the new contents are read back by the broker's own \
password file reader and the password just set is checked against them. The \
file is then written to a temporary name beside it with mode 0600, fsynced, \
renamed over FILE and the directory fsynced: a crash leaves the old file or \
the new one, never half of one. A running broker reads the file at startup.

Exit status: 0 done; 1 FILE is not a valid password file (each bad line is \
named, never its text; plain-text lines want -U); 2 usage (a user name \
with ':' or a control character, an empty password, two typed passwords \
that differ, a missing or extra argument); 3 could not do the work \
(FILE missing for -D or -U, USER not in FILE for -D, I/O).";

const EXAMPLES: &str = "\
Examples:
  saguin passwd /etc/saguin/passwords alice
  saguin passwd -b /etc/saguin/passwords sensor-17 \"$SENSOR_PASSWORD\"
  saguin passwd -D /etc/saguin/passwords alice
  saguin passwd -U /etc/saguin/passwords";

/// What to do to the file, with its validated arguments.
enum Edit {
    Set { user: String, password: String },
    Delete { user: String },
    Upgrade,
}

pub fn run(args: Args) -> anyhow::Result<u8> {
    let file = &args.file;
    // Before a password is asked for (`edit_of`): whoever types it twice
    // for a path that cannot hold it has wasted it, and a script's empty
    // stdin would be refused as an empty password, hiding what is wrong.
    if let Err(message) = check_target(file) {
        writeln!(
            std::io::stderr(),
            "saguin: passwd {}: {message}",
            file.display()
        )?;
        return Ok(exit::CANNOT);
    }
    let edit = match edit_of(&args) {
        Ok(edit) => edit,
        Err(message) => {
            writeln!(std::io::stderr(), "saguin passwd: {message}")?;
            return Ok(exit::USAGE);
        }
    };
    let existing = match read_existing(file) {
        Ok(text) => text,
        Err(message) => {
            writeln!(
                std::io::stderr(),
                "saguin: passwd {}: {message}",
                file.display()
            )?;
            return Ok(exit::CANNOT);
        }
    };
    let Some(existing) = existing.or_else(|| matches!(edit, Edit::Set { .. }).then(String::new))
    else {
        writeln!(
            std::io::stderr(),
            "saguin: passwd {}: no such file",
            file.display()
        )?;
        return Ok(exit::CANNOT);
    };
    if !matches!(edit, Edit::Upgrade) {
        if let Err(problems) = PasswordFile::parse(&existing) {
            let mut err = std::io::stderr().lock();
            for p in &problems {
                writeln!(err, "{} line {}: {}", file.display(), p.line, p.message)?;
            }
            writeln!(
                err,
                "saguin: passwd {}: not a valid password file; nothing was changed",
                file.display()
            )?;
            return Ok(exit::NO);
        }
    }
    let (text, report, check) = match &edit {
        Edit::Set { user, password } => {
            let field = saguin::broker::auth::hash_password(password.as_bytes(), args.iterations)
                .map_err(anyhow::Error::msg)?;
            let (text, replaced) = set_user(&existing, user, &field);
            let verb = if replaced { "changed" } else { "added" };
            (
                text,
                format!("{verb} the password of {user:?}"),
                Some((user, password)),
            )
        }
        Edit::Delete { user } => match delete_user(&existing, user) {
            Some(text) => (text, format!("deleted {user:?}"), None),
            None => {
                writeln!(
                    std::io::stderr(),
                    "saguin: passwd {}: no user named {user:?}; nothing was changed",
                    file.display()
                )?;
                return Ok(exit::CANNOT);
            }
        },
        Edit::Upgrade => match upgrade(&existing, args.iterations) {
            Ok((text, hashed)) => (
                text,
                format!(
                    "hashed {hashed} plain-text password{}",
                    if hashed == 1 { "" } else { "s" }
                ),
                None,
            ),
            Err((line, message)) => {
                writeln!(
                    std::io::stderr(),
                    "{} line {line}: {message}",
                    file.display()
                )?;
                writeln!(
                    std::io::stderr(),
                    "saguin: passwd {}: not a password file; nothing was changed",
                    file.display()
                )?;
                return Ok(exit::NO);
            }
        },
    };
    // The checker is the loader: what is written is what the broker reads.
    let proved = PasswordFile::parse(&text)
        .map_err(|p| anyhow::anyhow!("the new file does not read back ({} problems)", p.len()))
        .and_then(|parsed| match check {
            Some((user, password))
                if !saguin::broker::auth::check_password(&parsed, user, password.as_bytes()) =>
            {
                Err(anyhow::anyhow!(
                    "the new file does not accept the password just set"
                ))
            }
            _ => Ok(()),
        });
    proved.with_context(|| format!("passwd {}", file.display()))?;
    replace(file, text.as_bytes()).with_context(|| format!("passwd {}", file.display()))?;
    writeln!(std::io::stdout(), "{}: {report}", file.display())?;
    Ok(exit::OK)
}

fn edit_of(args: &Args) -> Result<Edit, String> {
    if args.upgrade {
        if args.user.is_some() {
            return Err("-U takes only FILE".into());
        }
        return Ok(Edit::Upgrade);
    }
    let Some(user) = args.user.clone() else {
        return Err("USER is required (or -U to upgrade the whole file)".into());
    };
    check_user(&user)?;
    if args.delete {
        if args.password.is_some() {
            return Err("-D takes FILE and USER, no password".into());
        }
        return Ok(Edit::Delete { user });
    }
    let password = match (&args.password, args.batch) {
        (Some(p), true) => p.clone(),
        (None, true) => return Err("-b needs the PASSWORD argument".into()),
        (Some(_), false) => {
            return Err("a PASSWORD argument needs -b (or leave it out to be asked for it)".into())
        }
        (None, false) => read_password()?,
    };
    if password.is_empty() {
        return Err("the password is empty".into());
    }
    Ok(Edit::Set { user, password })
}

/// Whether `path` can be the password file: a regular file, or nothing yet
/// (a user added to it creates it). [`read_existing`] checks the file it
/// opens again.
fn check_target(path: &Path) -> Result<(), String> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_file() => Ok(()),
        Ok(_) => Err("not a regular file".into()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("cannot open: {e}")),
    }
}

/// A user name the file format can hold: not empty, no `:` (the separator),
/// no control characters (a line break would split the line).
fn check_user(user: &str) -> Result<(), String> {
    if user.is_empty() {
        return Err("the user name is empty".into());
    }
    if user.contains(':') {
        return Err(format!(
            "the user name {:?} contains ':', which separates the name from the hash",
            user
        ));
    }
    if user.chars().any(char::is_control) {
        return Err(format!(
            "the user name {:?} contains a control character",
            user
        ));
    }
    if user.starts_with('#') {
        return Err(format!(
            "the user name {user:?} starts with '#', which makes its line a comment"
        ));
    }
    Ok(())
}

/// The file's text, `None` when it does not exist.
fn read_existing(path: &Path) -> Result<Option<String>, String> {
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open: {e}")),
    };
    let meta = file.metadata().map_err(|e| format!("cannot read: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(format!(
            "more than the {MAX_FILE_BYTES} bytes a password file may be"
        ));
    }
    String::from_utf8(bytes).map(Some).map_err(|e| {
        format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        )
    })
}

/// The user a line is about, when it is a `user:...` line (not blank, not
/// a comment).
fn line_user(line: &str) -> Option<&str> {
    let line = line.trim_end_matches('\r');
    if line.trim().is_empty() || line.starts_with('#') {
        return None;
    }
    line.split_once(':').map(|(user, _)| user)
}

/// `text` with `user`'s line set to `field`, in place when it is there,
/// appended otherwise; and whether it was there.
fn set_user(text: &str, user: &str, field: &str) -> (String, bool) {
    let mut out = String::with_capacity(text.len() + user.len() + field.len() + 2);
    let mut replaced = false;
    for line in text.lines() {
        if line_user(line) == Some(user) {
            replaced = true;
            out.push_str(&format!("{user}:{field}\n"));
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push_str(&format!("{user}:{field}\n"));
    }
    (out, replaced)
}

/// `text` without `user`'s line, `None` when it has none.
fn delete_user(text: &str, user: &str) -> Option<String> {
    let mut out = String::with_capacity(text.len());
    let mut found = false;
    for line in text.lines() {
        if line_user(line) == Some(user) {
            found = true;
        } else {
            out.push_str(line);
            out.push('\n');
        }
    }
    found.then_some(out)
}

/// `text` with every plain-text password hashed, and how many were; or the
/// first line that is not `user:password` at all.
fn upgrade(text: &str, iterations: u32) -> Result<(String, usize), (usize, String)> {
    let mut out = String::with_capacity(text.len() * 2);
    let mut hashed = 0;
    for (i, line) in text.lines().enumerate() {
        let bare = line.trim_end_matches('\r');
        if bare.trim().is_empty() || bare.starts_with('#') {
            out.push_str(line);
            out.push('\n');
            continue;
        }
        let Some((user, rest)) = bare.split_once(':') else {
            return Err((
                i + 1,
                "no ':' between the user name and the password".into(),
            ));
        };
        if let Err(message) = check_user(user) {
            return Err((i + 1, message));
        }
        if auth::is_hashed(rest) {
            out.push_str(line);
        } else if rest.is_empty() {
            return Err((i + 1, format!("user {user:?} has an empty password")));
        } else {
            let field = saguin::broker::auth::hash_password(rest.as_bytes(), iterations)
                .map_err(|m| (i + 1, m))?;
            out.push_str(&format!("{user}:{field}"));
            hashed += 1;
        }
        out.push('\n');
    }
    Ok((out, hashed))
}

/// The password, asked for twice on the terminal without echo, or one line
/// of stdin when stdin is not a terminal.
fn read_password() -> Result<String, String> {
    if !std::io::stdin().is_terminal() {
        let mut line = String::new();
        std::io::stdin()
            .lock()
            .read_line(&mut line)
            .map_err(|e| format!("cannot read the password from stdin: {e}"))?;
        return Ok(line.trim_end_matches(['\n', '\r']).to_string());
    }
    let first = prompt("Password: ")?;
    let second = prompt("Reenter password: ")?;
    if first != second {
        return Err("the two passwords differ".into());
    }
    Ok(first)
}

/// One line from the terminal with echo turned off, restored on return.
fn prompt(text: &str) -> Result<String, String> {
    let mut tty = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
        .map_err(|e| format!("cannot open the terminal to ask for the password: {e}"))?;
    let _echo_off = EchoOff::new(&tty)?;
    tty.write_all(text.as_bytes())
        .and_then(|()| tty.flush())
        .map_err(|e| format!("cannot write to the terminal: {e}"))?;
    let mut line = String::new();
    std::io::BufReader::new(&tty)
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the password: {e}"))?;
    let _ = tty.write_all(b"\n");
    Ok(line.trim_end_matches(['\n', '\r']).to_string())
}

/// The terminal's echo turned off for as long as this lives.
struct EchoOff {
    fd: std::os::unix::io::RawFd,
    saved: libc::termios,
}

impl EchoOff {
    fn new(tty: &std::fs::File) -> Result<EchoOff, String> {
        use std::os::unix::io::AsRawFd;
        let fd = tty.as_raw_fd();
        // SAFETY: an all-zero termios is a valid value to be filled in.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is open for the call; `saved` is a valid termios.
        if unsafe { libc::tcgetattr(fd, &mut saved) } != 0 {
            return Err("cannot read the terminal's settings".into());
        }
        let mut quiet = saved;
        quiet.c_lflag &= !libc::ECHO;
        quiet.c_lflag |= libc::ECHONL;
        // SAFETY: as above.
        if unsafe { libc::tcsetattr(fd, libc::TCSAFLUSH, &quiet) } != 0 {
            return Err("cannot turn the terminal's echo off".into());
        }
        Ok(EchoOff { fd, saved })
    }
}

impl Drop for EchoOff {
    fn drop(&mut self) {
        // SAFETY: `fd` outlives this guard (it is borrowed from the tty
        // file the caller holds); `saved` is the settings read before.
        unsafe { libc::tcsetattr(self.fd, libc::TCSAFLUSH, &self.saved) };
    }
}

/// Replace `path` with `bytes` crash-safely: a temporary file beside it
/// (mode 0600), fsync, rename, fsync of the directory.
fn replace(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "passwords".into());
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&temp, path)?;
        std::fs::File::open(&dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_replaces_in_place_and_keeps_everything_else() {
        let text = "# users\nalice:$7$old\nbob:$7$b\n";
        let (out, replaced) = set_user(text, "alice", "$7$new");
        assert!(replaced);
        assert_eq!(out, "# users\nalice:$7$new\nbob:$7$b\n");
        let (out, replaced) = set_user(text, "carol", "$7$c");
        assert!(!replaced);
        assert_eq!(out, "# users\nalice:$7$old\nbob:$7$b\ncarol:$7$c\n");
    }

    #[test]
    fn delete_names_a_missing_user() {
        assert_eq!(delete_user("a:1\nb:2\n", "a").as_deref(), Some("b:2\n"));
        assert_eq!(delete_user("a:1\n", "c"), None);
    }

    #[test]
    fn user_names_the_format_cannot_hold_are_refused() {
        for bad in ["", "a:b", "a\nb", "#a"] {
            assert!(check_user(bad).is_err(), "{bad:?}");
        }
        assert!(check_user("sensor 17").is_ok());
    }
}

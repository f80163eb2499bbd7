//! The password and ACL files as the broker serves them, and their reload
//! (`saguin serve` does it at SIGHUP, as Mosquitto does).
//!
//! A reload re-reads the files `auth.password_file` and `auth.acl_file`
//! named at startup, with the parsers the configuration uses, and nothing
//! else: a key of the configuration (another file, `allow_anonymous`, a
//! listener) changes only with a restart. Both files are read and checked
//! before either is replaced, so a reload is all or nothing: a file that
//! cannot be read or parsed keeps both files in force as they were, and the
//! problems are returned for the caller to log. What a reload changes
//! applies from then on: the next CONNECT is checked against the new
//! password file, and every publish, subscription and delivery after it
//! against the new ACL; connected clients stay connected.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use crate::config::auth::{AclFile, PasswordFile, EMPTY_PASSWORD_FILE};
use crate::config::Auth;

/// A value read on every use that a reload may replace whole.
#[derive(Debug)]
pub struct Reloadable<T>(RwLock<Arc<T>>);

impl<T> Reloadable<T> {
    pub fn new(value: Arc<T>) -> Reloadable<T> {
        Reloadable(RwLock::new(value))
    }

    /// The value in force now.
    pub fn current(&self) -> Arc<T> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn replace(&self, value: Arc<T>) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = value;
    }
}

/// One file the configuration names: where, and what is in force.
#[derive(Debug, Clone)]
pub struct ServedFile<T> {
    pub path: PathBuf,
    pub served: Arc<Reloadable<T>>,
}

/// The password and ACL files in force, shared by the connections (the
/// password file) and the broker state (the ACL).
#[derive(Debug, Clone)]
pub struct AuthFiles {
    allow_anonymous: bool,
    pub passwords: Option<ServedFile<PasswordFile>>,
    pub acl: Option<ServedFile<AclFile>>,
}

/// What a reload put in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The password file, its user count and SHA-256, and whether its bytes
    /// differ from the file it replaced.
    pub passwords: Option<FileSummary>,
    /// The ACL file, its rule count and SHA-256, and whether it changed.
    pub acl: Option<FileSummary>,
}

/// One reloaded file, as a log line shows it (never its contents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSummary {
    pub path: PathBuf,
    /// Users of a password file, rules of an ACL file.
    pub entries: usize,
    pub sha256: String,
    pub changed: bool,
}

impl AuthFiles {
    /// The files as the configuration loaded them.
    pub fn from_config(auth: &Auth) -> AuthFiles {
        fn served<T>(path: &Option<PathBuf>, file: &Option<Arc<T>>) -> Option<ServedFile<T>> {
            match (path, file) {
                (Some(path), Some(file)) => Some(ServedFile {
                    path: path.clone(),
                    served: Arc::new(Reloadable::new(file.clone())),
                }),
                _ => None,
            }
        }
        AuthFiles {
            allow_anonymous: auth.allow_anonymous,
            passwords: served(&auth.password_file, &auth.passwords),
            acl: served(&auth.acl_file, &auth.acl),
        }
    }

    /// Whether the configuration names any file a reload would read.
    pub fn is_empty(&self) -> bool {
        self.passwords.is_none() && self.acl.is_none()
    }

    /// Re-read both files and put them in force together; on any problem
    /// (each naming the file and line) nothing changes. Blocking: it reads
    /// files.
    pub fn reload(&self) -> Result<Reloaded, Vec<String>> {
        let mut problems = Vec::new();
        let passwords = self.passwords.as_ref().and_then(|f| {
            match PasswordFile::load(&f.path) {
                // The rule the configuration's validation applies at startup.
                Ok(file) if file.is_empty() && !self.allow_anonymous => {
                    problems.push(format!("{}: {EMPTY_PASSWORD_FILE}", f.path.display()));
                    None
                }
                Ok(file) => Some((f, Arc::new(file))),
                Err(found) => {
                    problems.extend(found);
                    None
                }
            }
        });
        let acl = self
            .acl
            .as_ref()
            .and_then(|f| match AclFile::load(&f.path) {
                Ok(file) => Some((f, Arc::new(file))),
                Err(found) => {
                    problems.extend(found);
                    None
                }
            });
        if !problems.is_empty() {
            return Err(problems);
        }
        let passwords = passwords.map(|(f, file)| {
            let summary = summary(
                &f.path,
                file.len(),
                file.sha256(),
                f.served.current().sha256(),
            );
            f.served.replace(file);
            summary
        });
        let acl = acl.map(|(f, file)| {
            let summary = summary(
                &f.path,
                file.rule_count(),
                file.sha256(),
                f.served.current().sha256(),
            );
            f.served.replace(file);
            summary
        });
        Ok(Reloaded { passwords, acl })
    }
}

fn summary(path: &Path, entries: usize, sha256: &str, before: &str) -> FileSummary {
    FileSummary {
        path: path.to_owned(),
        entries,
        sha256: sha256.to_owned(),
        changed: sha256 != before,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice() -> String {
        let hash = crate::broker::auth::hash_password(b"wonderland", 101).unwrap();
        format!("alice:{hash}\n")
    }

    fn auth(dir: &Path, allow_anonymous: bool, passwords: &str, acl: &str) -> Auth {
        let password_file = dir.join("passwords");
        let acl_file = dir.join("acl");
        std::fs::write(&password_file, passwords).unwrap();
        std::fs::write(&acl_file, acl).unwrap();
        Auth {
            allow_anonymous,
            passwords: Some(Arc::new(PasswordFile::load(&password_file).unwrap())),
            acl: Some(Arc::new(AclFile::load(&acl_file).unwrap())),
            password_file: Some(password_file),
            acl_file: Some(acl_file),
        }
    }

    fn in_force(files: &AuthFiles) -> (Arc<PasswordFile>, Arc<AclFile>) {
        (
            files.passwords.as_ref().unwrap().served.current(),
            files.acl.as_ref().unwrap().served.current(),
        )
    }

    #[test]
    fn a_reload_puts_both_files_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let files = AuthFiles::from_config(&auth(dir.path(), false, &alice(), "topic read a/#\n"));
        let before = in_force(&files);
        std::fs::write(dir.path().join("acl"), "topic read a/#\ntopic write b/#\n").unwrap();
        let reloaded = files.reload().expect("reloaded");
        let acl = reloaded.acl.expect("an ACL summary");
        assert!(acl.changed && acl.entries == 2, "{acl:?}");
        let passwords = reloaded.passwords.expect("a password summary");
        assert!(
            !passwords.changed && passwords.entries == 1,
            "{passwords:?}"
        );
        let after = in_force(&files);
        assert!(!Arc::ptr_eq(&before.1, &after.1));
        assert!(crate::broker::auth::acl::allows(
            &after.1,
            None,
            "c",
            "b/x",
            crate::broker::auth::Access::Write
        ));
    }

    #[test]
    fn a_broken_file_keeps_both_old_files_and_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = AuthFiles::from_config(&auth(dir.path(), false, &alice(), "topic read a/#\n"));
        let before = in_force(&files);
        // The ACL is fine; the password file is not: neither changes.
        std::fs::write(dir.path().join("acl"), "topic write b/#\n").unwrap();
        std::fs::write(dir.path().join("passwords"), "alice\n").unwrap();
        let problems = files.reload().expect_err("refused");
        assert!(
            problems.iter().any(|p| p.contains("passwords line 1")),
            "{problems:?}"
        );
        let after = in_force(&files);
        assert!(Arc::ptr_eq(&before.0, &after.0) && Arc::ptr_eq(&before.1, &after.1));
    }

    #[test]
    fn an_empty_password_file_is_refused_when_anonymous_clients_are_not_welcome() {
        let dir = tempfile::tempdir().unwrap();
        let files = AuthFiles::from_config(&auth(dir.path(), false, &alice(), ""));
        std::fs::write(dir.path().join("passwords"), "").unwrap();
        let problems = files.reload().expect_err("refused");
        assert!(problems[0].contains(EMPTY_PASSWORD_FILE), "{problems:?}");
        assert_eq!(in_force(&files).0.len(), 1);

        let files = AuthFiles::from_config(&auth(dir.path(), true, &alice(), ""));
        std::fs::write(dir.path().join("passwords"), "").unwrap();
        assert_eq!(
            files.reload().expect("reloaded").passwords.unwrap().entries,
            0
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let files = AuthFiles::from_config(&auth(dir.path(), true, &alice(), ""));
        std::fs::remove_file(dir.path().join("acl")).unwrap();
        let problems = files.reload().expect_err("refused");
        assert!(problems.iter().any(|p| p.contains("acl")), "{problems:?}");
    }
}

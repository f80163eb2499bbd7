//! Where CONNECTs' passwords are checked: on threads of their own, one for
//! each CPU, taken in the order the CONNECTs came.
//!
//! A check costs what the password file's PBKDF2 iteration count says, so
//! it stays off the runtime's workers. On the runtime's pool of blocking
//! threads each check waiting took a thread of its own (the pool grows to
//! 512): 8,000 devices connecting at once with passwords grew the broker by
//! 173 threads and 12 MB it kept, and bounding the checks running at once
//! still left 10 threads more, as a thread finishing one check is not yet
//! free for the next. The checks can go no faster than the CPUs run them.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::config::auth::PasswordFile;

/// One password to check, and where its answer goes.
struct Check {
    passwords: Arc<PasswordFile>,
    user: String,
    password: Bytes,
    answer: oneshot::Sender<bool>,
}

/// The threads checking passwords, started with the first check.
pub struct PasswordChecks {
    /// How many; `None`: one for each CPU, counted as they start.
    threads: Option<usize>,
    queue: OnceLock<Result<mpsc::Sender<Check>, String>>,
}

impl std::fmt::Debug for PasswordChecks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PasswordChecks")
            .field("threads", &self.threads)
            .field("started", &self.queue.get().is_some())
            .finish()
    }
}

impl PasswordChecks {
    /// Checks on `threads` threads (at least one).
    pub fn new(threads: usize) -> PasswordChecks {
        PasswordChecks {
            threads: Some(threads.max(1)),
            queue: OnceLock::new(),
        }
    }

    /// Checks on as many threads as the machine has CPUs.
    pub fn one_a_cpu() -> PasswordChecks {
        PasswordChecks {
            threads: None,
            queue: OnceLock::new(),
        }
    }

    /// Whether `password` is `user`'s in `passwords`; `Err` when no thread
    /// could check it (none could be started, or every one is gone).
    pub async fn check(
        &self,
        passwords: Arc<PasswordFile>,
        user: String,
        password: Bytes,
    ) -> Result<bool, String> {
        let queue = self.queue.get_or_init(|| self.start()).as_ref()?;
        let (answer, answered) = oneshot::channel();
        queue
            .send(Check {
                passwords,
                user,
                password,
                answer,
            })
            .map_err(|_| "no password check thread is running".to_owned())?;
        answered
            .await
            .map_err(|_| "the password check stopped before it answered".to_owned())
    }

    fn start(&self) -> Result<mpsc::Sender<Check>, String> {
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let (queue, checks) = mpsc::channel::<Check>();
        let checks = Arc::new(Mutex::new(checks));
        let mut started = 0;
        let mut failed = None;
        for i in 0..threads {
            let checks = Arc::clone(&checks);
            match std::thread::Builder::new()
                .name(format!("saguin-passwords-{i}"))
                .spawn(move || check_until_closed(&checks))
            {
                Ok(_) => started += 1,
                Err(e) => failed = Some(e.to_string()),
            }
        }
        match (started, failed) {
            (0, Some(e)) => Err(format!("no password check thread could start: {e}")),
            (_, Some(e)) => {
                tracing::warn!(started, wanted = threads, error = %e,
                    "password checks run on fewer threads than CPUs");
                Ok(queue)
            }
            (_, None) => Ok(queue),
        }
    }
}

/// A check thread: takes the next check while the queue is open.
fn check_until_closed(checks: &Mutex<mpsc::Receiver<Check>>) {
    loop {
        // The lock is held only to take a check, never while it runs.
        let next = match checks.lock() {
            Ok(receiver) => receiver.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(check) = next else { return };
        let ok = super::check_password(&check.passwords, &check.user, &check.password);
        // A client that went meanwhile has no one to answer.
        let _ = check.answer.send(ok);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(lines: &str) -> Arc<PasswordFile> {
        Arc::new(PasswordFile::parse(lines).expect("a password file"))
    }

    #[tokio::test]
    async fn checks_answer_each_password_on_their_threads() {
        let line = super::super::hash_password(b"wonderland", 101).expect("hash");
        let passwords = file(&format!("alice:{line}\n"));
        let checks = Arc::new(PasswordChecks::new(2));
        let asked: Vec<_> = (0..8)
            .map(|i| {
                let (checks, passwords) = (checks.clone(), passwords.clone());
                let password = if i % 2 == 0 { "wonderland" } else { "guess" };
                tokio::spawn(async move {
                    checks
                        .check(passwords, "alice".into(), Bytes::from(password))
                        .await
                })
            })
            .collect();
        let mut answers = Vec::new();
        for asked in asked {
            answers.push(asked.await.expect("joined").expect("checked"));
        }
        assert_eq!(
            answers,
            [true, false, true, false, true, false, true, false]
        );
        assert!(!checks
            .check(passwords, "bob".into(), Bytes::from_static(b"wonderland"))
            .await
            .expect("checked"));
    }
}

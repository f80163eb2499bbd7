//! Where CONNECTs' passwords are checked: on threads of their own, one for
//! each CPU, taken in the order the CONNECTs came.
//!
//! A check costs what the password file's PBKDF2 iteration count says, so
//! it stays off the runtime's workers, and goes no faster than the CPUs
//! run it ([`Workers`] says what the runtime's pool of blocking threads
//! did instead). Bounding the checks running at once on that pool still
//! left ten threads more in a storm of 8,000: a thread finishing one check
//! is not yet free for the next.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::oneshot;

use crate::broker::workers::Workers;
use crate::config::auth::PasswordFile;

/// The threads checking passwords, started with the first check.
#[derive(Debug)]
pub struct PasswordChecks {
    workers: Workers,
}

impl PasswordChecks {
    /// Checks on `threads` threads (at least one).
    pub fn new(threads: usize) -> PasswordChecks {
        PasswordChecks {
            workers: Workers::new(THREAD_NAME, threads),
        }
    }

    /// Checks on as many threads as the machine has CPUs.
    pub fn one_a_cpu() -> PasswordChecks {
        PasswordChecks {
            workers: Workers::one_a_cpu(THREAD_NAME),
        }
    }

    /// Whether `password` is `user`'s in `passwords`; `Err` when no thread
    /// could check it.
    pub async fn check(
        &self,
        passwords: Arc<PasswordFile>,
        user: String,
        password: Bytes,
    ) -> Result<bool, String> {
        let (answer, answered) = oneshot::channel();
        self.workers.run(move || {
            let ok = super::check_password(&passwords, &user, &password);
            // A client that went meanwhile has no one to answer.
            let _ = answer.send(ok);
        })?;
        answered
            .await
            .map_err(|_| "the password check stopped before it answered".to_owned())
    }
}

const THREAD_NAME: &str = "saguin-passwords";

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

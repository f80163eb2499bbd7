//! A fixed number of threads of the broker's own for work that blocks,
//! each job run in the order it was handed over.
//!
//! The runtime's pool of blocking threads starts a thread for each task
//! that finds none idle (up to 512) and keeps it ten seconds. Work that
//! can go no faster than a few threads run it, such as CPU-bound password
//! checks, grew the broker by a thread for each job waiting there: 113-184
//! threads in a reconnect storm of 10,000 devices with passwords. Such
//! work runs here, on as many threads as can make progress, and waits its
//! turn in a queue instead.

use std::sync::mpsc;
use std::sync::{Arc, Mutex, OnceLock};

/// One job: run once, on one of the threads.
type Job = Box<dyn FnOnce() + Send>;

/// The threads and their queue, started with the first job.
pub struct Workers {
    /// The threads' name, numbered.
    name: String,
    /// How many; `None`: one for each CPU, counted as they start.
    threads: Option<usize>,
    queue: OnceLock<Result<mpsc::Sender<Job>, String>>,
}

impl std::fmt::Debug for Workers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Workers")
            .field("name", &self.name)
            .field("threads", &self.threads)
            .field("started", &self.queue.get().is_some())
            .finish()
    }
}

impl Workers {
    /// `threads` threads (at least one) named `name-<i>`.
    pub fn new(name: &str, threads: usize) -> Workers {
        Workers {
            name: name.to_owned(),
            threads: Some(threads.max(1)),
            queue: OnceLock::new(),
        }
    }

    /// A thread for each CPU.
    pub fn one_a_cpu(name: &str) -> Workers {
        Workers {
            name: name.to_owned(),
            threads: None,
            queue: OnceLock::new(),
        }
    }

    /// Hands `job` to the threads; `Err` when none runs (none could be
    /// started), and the job is dropped unrun.
    pub fn run(&self, job: impl FnOnce() + Send + 'static) -> Result<(), String> {
        let queue = self.queue.get_or_init(|| self.start()).as_ref()?;
        queue
            .send(Box::new(job))
            .map_err(|_| format!("no {} thread is running", self.name))
    }

    fn start(&self) -> Result<mpsc::Sender<Job>, String> {
        let threads = self
            .threads
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        let (queue, jobs) = mpsc::channel::<Job>();
        let jobs = Arc::new(Mutex::new(jobs));
        let mut started = 0;
        let mut failed = None;
        for i in 0..threads {
            let jobs = Arc::clone(&jobs);
            match std::thread::Builder::new()
                .name(format!("{}-{i}", self.name))
                .spawn(move || run_until_closed(&jobs))
            {
                Ok(_) => started += 1,
                Err(e) => failed = Some(e.to_string()),
            }
        }
        match (started, failed) {
            (0, Some(e)) => Err(format!("no {} thread could start: {e}", self.name)),
            (_, Some(e)) => {
                tracing::warn!(workers = %self.name, started, wanted = threads, error = %e,
                    "fewer threads than wanted started");
                Ok(queue)
            }
            (_, None) => Ok(queue),
        }
    }
}

/// A worker thread: runs the next job while the queue is open. A job that
/// panics is logged and the thread goes on: its caller hears nothing, as
/// from a task of the runtime's that panicked.
fn run_until_closed(jobs: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        // The lock is held only to take a job, never while it runs.
        let next = match jobs.lock() {
            Ok(receiver) => receiver.recv(),
            Err(poisoned) => poisoned.into_inner().recv(),
        };
        let Ok(job) = next else { return };
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(job)).is_err() {
            tracing::error!(
                thread = std::thread::current().name().unwrap_or("?"),
                "a job panicked; the thread goes on with the next"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn jobs_run_in_order_on_the_threads_given() {
        let workers = Workers::new("saguin-test-workers", 1);
        let (done, finished) = std::sync::mpsc::channel();
        for i in 0..100 {
            let done = done.clone();
            workers
                .run(move || {
                    let thread = std::thread::current().name().map(str::to_owned);
                    done.send((i, thread)).expect("sent")
                })
                .expect("run");
        }
        let ran: Vec<(i32, Option<String>)> =
            (0..100).map(|_| finished.recv().expect("done")).collect();
        let order: Vec<i32> = ran.iter().map(|(i, _)| *i).collect();
        assert_eq!(order, (0..100).collect::<Vec<_>>());
        // However many waited, one thread ran them all.
        assert!(ran
            .iter()
            .all(|(_, thread)| thread.as_deref() == Some("saguin-test-workers-0")));
    }

    #[test]
    fn a_job_that_panics_leaves_its_thread_to_run_the_next() {
        let workers = Workers::new("saguin-test-panics", 1);
        let (done, finished) = std::sync::mpsc::channel();
        workers.run(|| panic!("a job's panic")).expect("run");
        workers
            .run(move || done.send("ran").expect("sent"))
            .expect("run");
        assert_eq!(finished.recv().expect("the next job ran"), "ran");
    }
}

//! The one writer of a running node's durable state: the store and the config file.
//!
//! Every write commits and syncs the disk, which can take tens of milliseconds on a busy
//! machine. The node runs on one runtime thread that also carries every session's bytes, so
//! no write happens there: each goes to the writer thread as a job, and the caller awaits its
//! answer. One thread also puts the writes in one order. Jobs run in the runtime's context, so
//! a job may spawn the tasks its change calls for (an announcement, a notice).
//!
//! The store and the config file check [`may_write_here`] in debug builds: a write from an
//! async runtime's thread that is not the writer fails the suites instead of stalling sessions
//! in production. Tools without a runtime (the CLI beside a stopped node, unit tests) write
//! where they are.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::mpsc;

type Job = Box<dyn FnOnce() + Send>;

thread_local! {
    static ON_WRITER: Cell<bool> = const { Cell::new(false) };
}

/// Whether durable state may be written from this thread: the writer's own, or any thread
/// with no async runtime.
pub fn may_write_here() -> bool {
    ON_WRITER.with(Cell::get) || tokio::runtime::Handle::try_current().is_err()
}

/// A handle to the writer thread; clones share it. The thread ends when the last handle goes.
#[derive(Debug, Clone)]
pub struct Disk {
    jobs: mpsc::Sender<Job>,
}

impl Disk {
    /// Starts the writer thread; its jobs run in `runtime`'s context.
    pub fn start(runtime: tokio::runtime::Handle) -> std::io::Result<Disk> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("mcpmesh-disk".into())
            .spawn(move || {
                let _context = runtime.enter();
                ON_WRITER.with(|on| on.set(true));
                for job in queue {
                    // A job that panics loses only its own answer; the writer goes on.
                    let _ = std::panic::catch_unwind(AssertUnwindSafe(job));
                }
            })?;
        Ok(Disk { jobs })
    }

    /// Runs `job` on the writer and waits for its result without holding up the runtime.
    /// `None` when the job panicked. Dropping the future does not cancel a job already queued:
    /// a write is done whole or not at all.
    pub async fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (answer, answered) = tokio::sync::oneshot::channel();
        self.queue(Box::new(move || {
            let _ = answer.send(job());
        }))?;
        answered.await.ok()
    }

    /// Runs `job` on the writer and blocks this thread until it is done: for threads of
    /// their own (the audit log's writer), never for a runtime's.
    pub fn run_blocking<T: Send + 'static>(
        &self,
        job: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        if ON_WRITER.with(Cell::get) {
            return Some(job());
        }
        let (answer, answered) = mpsc::sync_channel(1);
        self.queue(Box::new(move || {
            let _ = answer.send(job());
        }))?;
        answered.recv().ok()
    }

    fn queue(&self, job: Job) -> Option<()> {
        self.jobs.send(job).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn jobs_run_on_the_writer_in_order_and_may_spawn_tasks() {
        let disk = Disk::start(tokio::runtime::Handle::current()).unwrap();
        assert!(!may_write_here(), "a runtime thread is no place to write");
        let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        for i in 0..5 {
            let order = order.clone();
            assert_eq!(
                disk.run(move || {
                    order.lock().unwrap().push(i);
                    may_write_here()
                })
                .await,
                Some(true)
            );
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        let spawned = disk
            .run(|| tokio::spawn(async { 7 }))
            .await
            .expect("the job ran");
        assert_eq!(spawned.await.unwrap(), 7);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_job_that_panics_loses_its_answer_and_the_writer_goes_on() {
        let disk = Disk::start(tokio::runtime::Handle::current()).unwrap();
        assert_eq!(disk.run(|| -> u8 { panic!("a bad job") }).await, None);
        assert_eq!(disk.run(|| 2).await, Some(2));
        let from_a_thread = disk.clone();
        let blocking = std::thread::spawn(move || from_a_thread.run_blocking(|| 3));
        assert_eq!(blocking.join().unwrap(), Some(3));
    }

    #[test]
    fn a_thread_without_a_runtime_may_write() {
        assert!(may_write_here());
    }
}

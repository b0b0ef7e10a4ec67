//! Starting threads when the process or user may be out of them.
//!
//! `std::thread::spawn` panics when the OS refuses a thread (EAGAIN: `ulimit -u` reached, or the
//! kernel's thread limit; ENOMEM). A panic in one of tern's threads leaves the others waiting on
//! channels that never close: found as a hang under `prlimit --nproc=12`. Every thread the engine
//! starts goes through [`spawn`]: a refusal is waited out for a while (another process may be
//! ending: the limit counts every thread of the user) and then returned as an error the caller
//! turns into a clear one-line failure (kind `ResourceLimit`), never a panic.

use std::io;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{ErrorKind, Side, TransferError};

/// How many times a refused thread is asked for again, waiting 20 ms longer each time: about
/// 5 s in all, long enough for a burst of other work to end, short enough to fail plainly.
const RETRIES: u32 = 22;

/// Starts `f` on a new thread named `name` (shown by `top -H`, gdb and panics); a refusal for
/// lack of threads or memory is retried for about 5 s before the error is returned.
pub fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<JoinHandle<T>> {
    let slot = Arc::new(Mutex::new(Some(f)));
    retrying(|| std::thread::Builder::new().name(name.into()).spawn(taken_from(slot.clone())))
}

/// [`spawn`] for a thread that borrows from the caller (`std::thread::scope`): the same name
/// and the same waiting out of a refusal. Used for the short-lived threads that set up a
/// session's data streams side by side.
pub fn spawn_scoped<'scope, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    f: impl FnOnce() -> T + Send + 'scope,
) -> io::Result<std::thread::ScopedJoinHandle<'scope, T>> {
    let slot = Arc::new(Mutex::new(Some(f)));
    retrying(|| std::thread::Builder::new().name(name.into()).spawn_scoped(scope, taken_from(slot.clone())))
}

/// Asks `start` for a thread again while the system refuses one for lack of threads or memory,
/// waiting 20 ms longer each time, [`RETRIES`] times at most.
fn retrying<H>(mut start: impl FnMut() -> io::Result<H>) -> io::Result<H> {
    let mut tries = 0;
    loop {
        match start() {
            Err(e) if ErrorKind::of_io(&e) == ErrorKind::ResourceLimit && tries < RETRIES => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20 * u64::from(tries)));
            }
            started => return started,
        }
    }
}

/// The work as a thread runs it, taken from `slot`: a refused start consumes the closure it was
/// given, and the work is needed again for the next try.
fn taken_from<T, F: FnOnce() -> T>(slot: Arc<Mutex<Option<F>>>) -> impl FnOnce() -> T {
    move || {
        let f = slot.lock().unwrap().take().expect("a started thread takes its work once");
        f()
    }
}

/// A thread refused for good, as the error a person reads: which side, and what to do.
pub fn refused(side: Side, what: &str, err: &io::Error) -> TransferError {
    TransferError::fatal(
        side,
        format!(
            "cannot start a thread ({what}): {} (the limit on threads, `ulimit -u`, or memory is reached; raise it or run fewer transfers at once, then re-run: verified data is kept)",
            crate::error::err_text(err)
        ),
    )
    .with_kind(ErrorKind::ResourceLimit)
}

/// [`spawn`], its refusal as [`refused`].
pub fn spawn_or_refuse<T: Send + 'static>(side: Side, name: &str, f: impl FnOnce() -> T + Send + 'static) -> Result<JoinHandle<T>, TransferError> {
    spawn(name, f).map_err(|e| refused(side, name, &e))
}

/// Work run on a job queue: `Pool::map`'s parts.
type Job = Box<dyn FnOnce() + Send>;

/// Up to `size` threads, started on first use and kept until the pool is dropped, that run the
/// parts of [`Pool::map`] side by side. For work that comes in many small batches: the
/// receiver's finalizer met a batch every few milliseconds on a fast link, and starting threads
/// for each one (thousands per tree of 50,000 files) cost more CPU than the work itself.
pub struct Pool {
    name: &'static str,
    size: usize,
    jobs: Option<crossbeam_channel::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl Pool {
    pub fn new(name: &'static str, size: usize) -> Self {
        Self { name, size: size.max(1), jobs: None, threads: Vec::new() }
    }

    /// `f` on every item, in order. `inline_up_to` items or fewer run on the calling thread (no
    /// hand-over); more are split into one part per thread. Threads the system refuses are
    /// done without (none at all: everything runs here), never an error.
    pub fn map<T, R, F>(&mut self, items: Vec<T>, inline_up_to: usize, f: F) -> Vec<R>
    where
        T: Send + 'static,
        R: Send + 'static,
        F: Fn(T) -> R + Send + Sync + 'static,
    {
        if items.len() <= inline_up_to.max(1) || self.start() == 0 {
            return items.into_iter().map(f).collect();
        }
        let jobs = self.jobs.as_ref().expect("started");
        let f = Arc::new(f);
        let per = items.len().div_ceil(self.threads.len());
        let (done_tx, done_rx) = crossbeam_channel::unbounded::<(usize, Vec<R>)>();
        let mut items = items.into_iter();
        let mut parts = 0;
        loop {
            let part: Vec<T> = items.by_ref().take(per).collect();
            if part.is_empty() {
                break;
            }
            let (f, done) = (f.clone(), done_tx.clone());
            let k = parts;
            jobs.send(Box::new(move || {
                let out: Vec<R> = part.into_iter().map(|x| f(x)).collect();
                let _ = done.send((k, out));
            }))
            .expect("pool threads live while the pool does");
            parts += 1;
        }
        drop(done_tx);
        let mut out: Vec<Option<Vec<R>>> = (0..parts).map(|_| None).collect();
        for _ in 0..parts {
            // A part that panicked drops its sender unsent: once all are gone, recv fails.
            let (k, part) = done_rx.recv().unwrap_or_else(|_| panic!("a {} thread panicked", self.name));
            out[k] = Some(part);
        }
        out.into_iter().flat_map(|p| p.expect("every part answered")).collect()
    }

    /// Starts the threads on first use; how many run.
    fn start(&mut self) -> usize {
        if self.jobs.is_none() {
            let (tx, rx) = crossbeam_channel::unbounded::<Job>();
            for _ in 0..self.size {
                let rx = rx.clone();
                match spawn(self.name, move || {
                    while let Ok(job) = rx.recv() {
                        job();
                    }
                }) {
                    Ok(h) => self.threads.push(h),
                    Err(_) => break,
                }
            }
            self.jobs = Some(tx);
        }
        self.threads.len()
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.jobs = None; // the threads' queue closes: each ends after its current job
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn a_pool_maps_in_order_on_its_own_threads_and_reuses_them() {
        let mut pool = Pool::new("tern-test-pool", 4);
        let names = |pool: &mut Pool| pool.map((0..100).collect(), 8, |i: u32| (i * 2, std::thread::current().name().map(str::to_owned)));
        let first = names(&mut pool);
        assert_eq!(first.iter().map(|(v, _)| *v).collect::<Vec<_>>(), (0..100).map(|i| i * 2).collect::<Vec<_>>());
        assert!(first.iter().all(|(_, n)| n.as_deref() == Some("tern-test-pool")), "{first:?}");
        let ids = |pool: &mut Pool| pool.map((0..64).collect(), 8, |_: u32| format!("{:?}", std::thread::current().id())).into_iter().collect::<HashSet<_>>();
        let (a, b) = (ids(&mut pool), ids(&mut pool));
        assert!(a.len() <= 4 && b.len() <= 4 && a.union(&b).count() <= 4, "a second batch runs on the same threads: {a:?} {b:?}");
    }

    #[test]
    fn a_small_batch_runs_on_the_caller_s_thread() {
        let mut pool = Pool::new("tern-test-pool", 4);
        let me = std::thread::current().id();
        assert!(pool.map(vec![1, 2, 3], 8, move |_: i32| std::thread::current().id() == me).into_iter().all(|x| x));
        assert!(pool.threads.is_empty(), "no thread started for work done inline");
    }

    #[test]
    fn a_scoped_thread_is_named_borrows_and_returns_its_work_s_value() {
        let borrowed = [40, 2];
        let got = std::thread::scope(|s| spawn_scoped(s, "tern-test", || (std::thread::current().name().map(str::to_owned), borrowed.iter().sum::<i32>())).unwrap().join().unwrap());
        assert_eq!(got, (Some("tern-test".to_owned()), 42));
    }

    #[test]
    fn a_started_thread_is_named_and_returns_its_work_s_value() {
        let h = spawn("tern-test", || (std::thread::current().name().map(str::to_owned), 41 + 1)).unwrap();
        assert_eq!(h.join().unwrap(), (Some("tern-test".to_owned()), 42));
    }

    #[test]
    fn a_refusal_reads_as_a_resource_limit_with_what_to_do() {
        let e = refused(Side::Destination, "a data stream", &io::Error::from_raw_os_error(libc::EAGAIN));
        assert_eq!(e.kind, ErrorKind::ResourceLimit);
        let text = e.to_string();
        assert!(text.starts_with("destination: cannot start a thread (a data stream): "), "{text}");
        assert!(text.contains("ulimit -u") && !text.contains('\n'), "{text}");
    }
}

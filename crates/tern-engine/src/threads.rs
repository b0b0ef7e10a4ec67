//! Starting threads when the process or user may be out of them.
//!
//! `std::thread::spawn` panics when the OS refuses a thread (EAGAIN: `ulimit -u` reached, or the
//! kernel's thread limit; ENOMEM). A panic in one of tern's threads leaves the others waiting on
//! channels that never close: found as a hang under `prlimit --nproc=12`. Every thread the engine
//! starts goes through [`spawn`]: a refusal is waited out for a while (another process may be
//! ending: the limit counts every thread of the user) and then returned as an error the caller
//! turns into a clear one-line failure (kind `ResourceLimit`), never a panic.

use std::io;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::{ErrorKind, Side, TransferError};

/// How many times a refused thread is asked for again, waiting 20 ms longer each time: about
/// 5 s in all, long enough for a burst of other work to end, short enough to fail plainly.
const RETRIES: u32 = 22;

/// Starts `f` on a new thread named `name` (shown by `top -H`, gdb and panics); a refusal for
/// lack of threads or memory is retried for about 5 s before the error is returned.
pub fn spawn<T: Send + 'static>(name: &str, f: impl FnOnce() -> T + Send + 'static) -> io::Result<JoinHandle<T>> {
    // The closure is needed again after a refusal, but `Builder::spawn` consumes it: keep it in
    // a slot the new thread takes it from.
    let slot = std::sync::Arc::new(std::sync::Mutex::new(Some(f)));
    let mut tries = 0;
    loop {
        let taken = slot.clone();
        let run = move || {
            let f = taken.lock().unwrap().take().expect("a started thread takes its work once");
            f()
        };
        match std::thread::Builder::new().name(name.into()).spawn(run) {
            Ok(handle) => return Ok(handle),
            Err(e) if ErrorKind::of_io(&e) == ErrorKind::ResourceLimit && tries < RETRIES => {
                tries += 1;
                std::thread::sleep(Duration::from_millis(20 * u64::from(tries)));
            }
            Err(e) => return Err(e),
        }
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

#[cfg(test)]
mod tests {
    use super::*;

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

//! File events: inotify through `notify` where it can see the writes, its polling backend where
//! it cannot (network and parallel file systems, or inotify limits exhausted).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Duration;

use crossbeam_channel::Sender;
use notify::{Event, RecursiveMode, Watcher};

/// File systems where writes made by other nodes never reach the local inotify.
const REMOTE_FS: &[(i64, &str)] = &[
    (0x6969, "NFS"),
    (0x0BD0_0BD0, "Lustre"),
    (0x4750_4653, "GPFS"),
    (0xFF53_4D42, "CIFS"),
    (0xFE53_4D42, "SMB2"),
    (0x00C3_6400, "CephFS"),
    (0x1983_0326, "BeeGFS"),
    (0xAAD7_AAEA, "Panasas"),
    (0x6573_5546, "FUSE"),
    (0x0102_1997, "9P"),
];

/// The name of the network or parallel file system `dir` is on, if it is one.
pub fn remote_fs(dir: &Path) -> Option<&'static str> {
    let c = CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    REMOTE_FS.iter().find(|(m, _)| *m == st.f_type as i64).map(|(_, n)| *n)
}

pub enum Backend {
    Inotify(notify::RecommendedWatcher),
    Poll(notify::PollWatcher),
}

impl Backend {
    /// Whether close-after-write events will arrive.
    pub fn sees_closes(&self) -> bool {
        matches!(self, Backend::Inotify(_))
    }
}

/// Starts watching `dir` (its top level: a unit's inside is measured, not watched); events go
/// to `tx`. `why_poll` says why polling was chosen, for the user.
pub fn start(dir: &Path, force_poll: bool, tx: Sender<Event>) -> Result<(Backend, Option<String>), String> {
    let handler = {
        let tx = tx.clone();
        move |r: notify::Result<Event>| match r {
            Ok(ev) => {
                let _ = tx.send(ev);
            }
            // An error (queue overflow, watch limit) may have lost events: ask for a rescan.
            Err(e) => {
                tracing::warn!("file events: {e}; rescanning");
                let _ = tx.send(Event::new(notify::EventKind::Other).set_flag(notify::event::Flag::Rescan));
            }
        }
    };
    let why = if force_poll { Some("--poll".to_string()) } else { remote_fs(dir).map(|fs| format!("{} is on {fs}, where inotify cannot see writes from other nodes", dir.display())) };
    if why.is_none() {
        match notify::recommended_watcher(handler.clone()).and_then(|mut w| w.watch(dir, RecursiveMode::NonRecursive).map(|_| w)) {
            Ok(w) => return Ok((Backend::Inotify(w), None)),
            Err(e) => {
                let why = format!("inotify is unavailable ({e}; raise fs.inotify.max_user_watches/max_user_instances)");
                return poll(dir, handler, why);
            }
        }
    }
    poll(dir, handler, why.unwrap())
}

fn poll<F: notify::EventHandler>(dir: &Path, handler: F, why: String) -> Result<(Backend, Option<String>), String> {
    let cfg = notify::Config::default().with_poll_interval(Duration::from_secs(1));
    let mut w = notify::PollWatcher::new(handler, cfg).map_err(|e| format!("{}: cannot watch: {e}", dir.display()))?;
    w.watch(dir, RecursiveMode::NonRecursive).map_err(|e| format!("{}: cannot watch: {e}", dir.display()))?;
    Ok((Backend::Poll(w), Some(why)))
}

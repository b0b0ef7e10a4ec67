//! Admission control for a listening daemon: how many connections and sessions it holds, and
//! how long a connection may take to authenticate.
//!
//! Every accepted connection is *waiting* until it proves it belongs (a control connection:
//! TLS, `Hello`, `Auth`; a data stream: a `DataHello` naming a live session). Waiting
//! connections are few and short-lived: more than `max_waiting` of them and the oldest is
//! dropped for the newcomer (a legitimate client authenticates in a few round trips, a slow or
//! silent one is what sits longest); one still waiting after `auth_timeout` is closed by the
//! reaper, however it trickles bytes. Beyond `max_connections` in all, a connection is
//! refused; an authenticated control connection beyond `max_sessions` is refused too.

use std::collections::BTreeMap;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

/// The operator's caps (`tern serve --max-connections`, `--max-sessions`, `--auth-timeout`).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub max_sessions: usize,
    /// How long a new connection has to authenticate (TLS, `Hello`, `Auth`, or a data
    /// stream's `DataHello`).
    pub auth_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_connections: 256, max_sessions: 64, auth_timeout: Duration::from_secs(10) }
    }
}

impl Limits {
    /// Unauthenticated connections held at once: a quarter of the cap (at least 8), so a flood
    /// of silent sockets never takes the slots of authenticated sessions.
    pub fn max_waiting(&self) -> usize {
        (self.max_connections / 4).max(8).min(self.max_connections.max(1))
    }
}

struct Waiting {
    since: Instant,
    sock: TcpStream,
    peer: SocketAddr,
}

#[derive(Default)]
struct State {
    next: u64,
    /// Oldest first (ids grow).
    waiting: BTreeMap<u64, Waiting>,
    authenticated: usize,
    sessions: usize,
}

/// One daemon's admission state, shared by its accept loop and its connection threads.
pub struct Gate {
    limits: Limits,
    state: Mutex<State>,
    /// Threads answering "busy" right now (each does a TLS handshake to say it).
    refusing: AtomicUsize,
    log: Mutex<Throttle>,
}

/// What became of a new connection.
pub enum Admit {
    Yes(Conn),
    /// Over `max_connections`: the one-line reason to give the client.
    Busy(String),
}

impl Gate {
    /// A gate and its reaper thread (which ends when the gate is dropped).
    pub fn new(limits: Limits) -> Arc<Gate> {
        let gate = Arc::new(Gate { limits, state: Mutex::default(), refusing: AtomicUsize::new(0), log: Mutex::default() });
        let weak = Arc::downgrade(&gate);
        let tick = (limits.auth_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        // Without its reaper, connections that never authenticate are still bounded by the
        // cap on waiting ones (the oldest is dropped for a newcomer), only not timed out.
        if let Err(e) = crate::threads::spawn("tern-reaper", move || reap(weak, tick)) {
            tracing::warn!("connections that do not authenticate will not be timed out: {e}");
        }
        gate
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Admits a freshly accepted connection as waiting, dropping the oldest waiting one if
    /// there are too many.
    pub fn admit(self: &Arc<Self>, sock: &TcpStream, peer: SocketAddr) -> Admit {
        let clone = match sock.try_clone() {
            Ok(c) => c,
            Err(e) => return Admit::Busy(format!("daemon busy: cannot take another connection ({e}); try again later")),
        };
        // Each read is bounded here; the whole wait by the reaper (which also ends a write
        // stuck on a client that does not read).
        let _ = sock.set_read_timeout(Some(self.limits.auth_timeout));
        let mut st = self.state.lock().unwrap();
        if st.waiting.len() >= self.limits.max_waiting()
            && let Some((_, old)) = st.waiting.pop_first()
        {
            let _ = old.sock.shutdown(Shutdown::Both);
            self.note(|| format!("dropped the oldest unauthenticated connection ({}): more than {} connections waiting to authenticate", old.peer, self.limits.max_waiting()));
        }
        let total = st.waiting.len() + st.authenticated;
        if total >= self.limits.max_connections {
            drop(st);
            let n = self.limits.max_connections;
            self.note(|| format!("refused a connection from {peer}: {n} connections open (tern serve --max-connections {n})"));
            return Admit::Busy(format!("daemon busy: {n} connections open; try again later"));
        }
        let id = st.next;
        st.next += 1;
        st.waiting.insert(id, Waiting { since: Instant::now(), sock: clone, peer });
        Admit::Yes(Conn { gate: self.clone(), id, stage: Stage::Waiting })
    }

    /// Takes a slot for a thread that answers "busy" (TLS and a `Fatal`); `None` when enough
    /// of them are already at it (the connection is then just closed).
    pub fn refusal_slot(self: &Arc<Self>) -> Option<RefusalSlot> {
        const MAX_REFUSING: usize = 8;
        if self.refusing.fetch_add(1, Ordering::SeqCst) >= MAX_REFUSING {
            self.refusing.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(RefusalSlot(self.clone()))
    }

    /// Connections open now: (waiting, authenticated, sessions).
    pub fn counts(&self) -> (usize, usize, usize) {
        let st = self.state.lock().unwrap();
        (st.waiting.len(), st.authenticated, st.sessions)
    }

    /// A warning for the operator, at most one a second (a flood must not flood the log).
    fn note(&self, line: impl FnOnce() -> String) {
        let mut t = self.log.lock().unwrap();
        let now = Instant::now();
        if t.last.is_some_and(|l| now.duration_since(l) < Duration::from_secs(1)) {
            t.suppressed += 1;
            return;
        }
        let more = std::mem::take(&mut t.suppressed);
        t.last = Some(now);
        drop(t);
        if more > 0 {
            tracing::warn!("{} ({more} more such events in the last second not shown)", line());
        } else {
            tracing::warn!("{}", line());
        }
    }
}

#[derive(Default)]
struct Throttle {
    last: Option<Instant>,
    suppressed: u64,
}

/// Closes connections still waiting after the deadline.
fn reap(gate: Weak<Gate>, tick: Duration) {
    loop {
        thread::sleep(tick);
        let Some(gate) = gate.upgrade() else { return };
        let deadline = gate.limits.auth_timeout;
        let mut expired = Vec::new();
        {
            let mut st = gate.state.lock().unwrap();
            while let Some(e) = st.waiting.first_entry() {
                if e.get().since.elapsed() < deadline {
                    break;
                }
                expired.push(e.remove());
            }
        }
        for w in &expired {
            let _ = w.sock.shutdown(Shutdown::Both);
        }
        if let Some(w) = expired.first() {
            let n = expired.len();
            gate.note(|| format!("closed {n} connection(s) that did not authenticate within {:?} (the first from {})", deadline, w.peer));
        }
    }
}

enum Stage {
    Waiting,
    Authenticated { session: bool },
    Gone,
}

/// One admitted connection's place; gives it back when dropped.
pub struct Conn {
    gate: Arc<Gate>,
    id: u64,
    stage: Stage,
}

impl Conn {
    /// The connection proved itself: it stops counting as waiting (and is no longer subject to
    /// the deadline). `session`: an authenticated control connection, counted against
    /// `max_sessions`. Fails when the connection was already dropped as the oldest waiting or
    /// for its deadline, or when the session cap is reached.
    pub fn authenticated(&mut self, session: bool) -> Result<(), String> {
        let mut st = self.gate.state.lock().unwrap();
        let Some(w) = st.waiting.remove(&self.id) else {
            self.stage = Stage::Gone;
            return Err(format!("the daemon closed this connection: not authenticated within {:?}", self.gate.limits.auth_timeout));
        };
        if session && st.sessions >= self.gate.limits.max_sessions {
            self.stage = Stage::Gone;
            drop(st);
            let n = self.gate.limits.max_sessions;
            self.gate.note(|| format!("refused a session from {}: {n} sessions running (tern serve --max-sessions {n})", w.peer));
            return Err(format!("daemon busy: {n} sessions running; try again later"));
        }
        st.authenticated += 1;
        st.sessions += session as usize;
        self.stage = Stage::Authenticated { session };
        drop(st);
        // A session may idle (the client hashing for --checksum); a data stream keeps its own
        // timeouts until its go-ahead (`PendingStream::finish`).
        if session {
            let _ = w.sock.set_read_timeout(None);
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let mut st = self.gate.state.lock().unwrap();
        match self.stage {
            Stage::Waiting => {
                st.waiting.remove(&self.id);
            }
            Stage::Authenticated { session } => {
                st.authenticated -= 1;
                st.sessions -= session as usize;
            }
            Stage::Gone => {}
        }
    }
}

/// A thread's permission to answer "busy"; given back when dropped.
pub struct RefusalSlot(Arc<Gate>);

impl Drop for RefusalSlot {
    fn drop(&mut self) {
        self.0.refusing.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::TcpListener;

    use super::*;

    fn pair(l: &TcpListener) -> (TcpStream, TcpStream, SocketAddr) {
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        (c, s, peer)
    }

    #[test]
    fn the_oldest_waiting_connection_makes_room_and_the_cap_holds() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new(Limits { max_connections: 10, max_sessions: 1, auth_timeout: Duration::from_secs(60) });
        assert_eq!(gate.limits().max_waiting(), 8);
        let mut held = Vec::new();
        for _ in 0..8 {
            let (c, s, peer) = pair(&l);
            let Admit::Yes(conn) = gate.admit(&s, peer) else { panic!("refused under the cap") };
            held.push((c, s, conn));
        }
        // A ninth: the first is shut down (its client reads EOF) and loses its place.
        let (c9, s9, p9) = pair(&l);
        let Admit::Yes(mut ninth) = gate.admit(&s9, p9) else { panic!("refused") };
        let mut b = [0u8; 1];
        assert_eq!((&held[0].0).read(&mut b).unwrap(), 0);
        assert!(held[0].2.authenticated(true).is_err(), "a dropped connection cannot authenticate");
        // Sessions: one allowed.
        ninth.authenticated(true).unwrap();
        assert!(held[1].2.authenticated(true).unwrap_err().contains("1 sessions running"));
        held[2].2.authenticated(false).unwrap();
        assert_eq!(gate.counts(), (5, 2, 1));
        // The total cap: 5 waiting + 2 authenticated + 3 more = 10.
        let mut more = Vec::new();
        for _ in 0..3 {
            let (c, s, peer) = pair(&l);
            let Admit::Yes(conn) = gate.admit(&s, peer) else { panic!("refused under the cap") };
            more.push((c, s, conn));
        }
        let (_c, s, peer) = pair(&l);
        // Waiting is at 8 again, so the oldest goes and the newcomer fits.
        assert!(matches!(gate.admit(&s, peer), Admit::Yes(_)));
        drop((c9, s9));
        drop(ninth);
        assert_eq!(gate.counts().2, 0, "the session's place is given back");
    }

    #[test]
    fn over_the_cap_is_busy_and_silent_connections_expire() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let gate = Gate::new(Limits { max_connections: 2, max_sessions: 2, auth_timeout: Duration::from_millis(200) });
        let (c1, s1, p1) = pair(&l);
        let Admit::Yes(mut a) = gate.admit(&s1, p1) else { panic!() };
        a.authenticated(true).unwrap();
        let (c2, s2, p2) = pair(&l);
        let Admit::Yes(_b) = gate.admit(&s2, p2) else { panic!() };
        let (_c3, s3, p3) = pair(&l);
        match gate.admit(&s3, p3) {
            Admit::Busy(m) => assert!(m.contains("daemon busy: 2 connections"), "{m}"),
            Admit::Yes(_) => panic!("over the cap"),
        }
        // The waiting one is closed by the reaper; the authenticated one is not.
        c2.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 1];
        assert_eq!((&c2).read(&mut b).unwrap(), 0);
        assert_eq!(gate.counts(), (0, 1, 1));
        c1.set_read_timeout(Some(Duration::from_millis(300))).unwrap();
        assert!((&c1).read(&mut b).is_err(), "an authenticated connection has no deadline");
    }
}

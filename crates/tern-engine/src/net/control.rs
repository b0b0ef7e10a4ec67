//! Sending and receiving control messages over a byte stream, with the protocol's bounds.

use std::io::{self, BufReader, Read, Write};
use std::sync::Mutex;

use tern_proto::frame::{FrameHeader, HEADER_LEN};
use tern_proto::{Control, limits};

use crate::error::TransferError;

pub struct CtrlReader {
    r: BufReader<Box<dyn Read + Send>>,
    /// Set by [`CtrlReader::hand_ready_to`]: the next message is the server's answer to `Open`.
    ready_to: Option<ReadyTx>,
}

/// `Ready`'s session id and data address.
pub type ReadyAnswer = ([u8; 16], Vec<u8>, Option<[u8; 32]>);

/// Where the server's answer to `Open` goes when the client did not wait for it: `Ready`'s
/// session id and data address, or the refusal.
pub type ReadyTx = crossbeam_channel::Sender<Result<ReadyAnswer, TransferError>>;

impl CtrlReader {
    pub fn new(r: Box<dyn Read + Send>) -> Self {
        Self { r: BufReader::with_capacity(256 << 10, r), ready_to: None }
    }

    /// The next message answers an `Open` the client sent without waiting (it went on with its
    /// manifest): whoever reads next takes a `Ready` off the channel and gives it to `tx`, so
    /// the session's own loop never sees it. A refusal (`Fatal`) goes to `tx` and is returned
    /// as well, so the loop reports it as it reports any `Fatal`; anything else is an error.
    pub fn hand_ready_to(&mut self, tx: ReadyTx) {
        self.ready_to = Some(tx);
    }

    /// Next message. I/O failures are network errors; malformed input is a fatal protocol error.
    pub fn recv(&mut self) -> Result<Control, TransferError> {
        let Some(tx) = self.ready_to.take() else { return self.next() };
        match self.next() {
            Ok(Control::Ready { session_id, data_addr, cert_pin, .. }) => {
                let _ = tx.send(Ok((session_id, data_addr, cert_pin)));
                self.next()
            }
            Ok(Control::Fatal { side, message }) => {
                let _ = tx.send(Err(TransferError::fatal(side, message.clone())));
                Ok(Control::Fatal { side, message })
            }
            Ok(_) => {
                let e = TransferError::fatal(tern_proto::Side::Network, "expected the server to be ready");
                let _ = tx.send(Err(e.clone()));
                Err(e)
            }
            Err(e) => {
                let _ = tx.send(Err(e.clone()));
                Err(e)
            }
        }
    }

    fn next(&mut self) -> Result<Control, TransferError> {
        let mut head = [0u8; HEADER_LEN];
        self.r.read_exact(&mut head).map_err(net_err)?;
        let header = FrameHeader::parse(head, limits::MAX_CONTROL_FRAME).map_err(proto_err)?;
        let mut body = vec![0u8; header.body_len as usize];
        self.r.read_exact(&mut body).map_err(net_err)?;
        // `TERN_LOG=tern::control=trace` shows each session's exchange with timestamps: where
        // the round trips of a slow start go.
        tracing::trace!(target: "tern::control", "recv type {} ({} bytes)", header.frame_type, body.len());
        Control::decode(header.frame_type, &body).map_err(proto_err)
    }
}

pub fn net_err(e: io::Error) -> TransferError {
    let what = match e.kind() {
        io::ErrorKind::UnexpectedEof => "the peer closed the connection".to_string(),
        _ => crate::error::err_text(&e),
    };
    TransferError::network(format!("control channel: {what}")).with_kind(crate::error::ErrorKind::ControlClosed)
}

pub fn proto_err(e: tern_proto::ProtoError) -> TransferError {
    TransferError::fatal(tern_proto::Side::Network, format!("protocol error from the peer: {e} (is the other end a tern of a compatible version?)"))
}

/// Shared by the threads of one side; each message is one `write_all` under the lock.
pub struct CtrlWriter {
    w: Mutex<Box<dyn Write + Send>>,
    /// (real path, the client's name for it): a daemon's errors name paths as its clients see
    /// them, never where its roots really are.
    public_names: Vec<(String, String)>,
}

impl CtrlWriter {
    pub fn new(w: Box<dyn Write + Send>) -> Self {
        Self { w: Mutex::new(w), public_names: Vec::new() }
    }

    /// Errors sent through this writer show each real root as the client's name for it.
    pub fn with_public_names(mut self, mut names: Vec<(String, String)>) -> Self {
        // Longest first, so a root inside another is replaced as itself.
        names.sort_by_key(|(real, _)| std::cmp::Reverse(real.len()));
        self.public_names = names;
        self
    }

    fn public(&self, message: &str) -> String {
        let mut m = message.to_string();
        for (real, shown) in &self.public_names {
            m = m.replace(&format!("{real}/"), &format!("{shown}/")).replace(real.as_str(), if shown.is_empty() { "/" } else { shown });
        }
        m
    }

    pub fn send(&self, msg: &Control) -> Result<(), TransferError> {
        let renamed;
        let msg = match msg {
            Control::Fatal { side, message } if !self.public_names.is_empty() => {
                renamed = Control::Fatal { side: *side, message: self.public(message) };
                &renamed
            }
            Control::FileError { id, side, message } if !self.public_names.is_empty() => {
                renamed = Control::FileError { id: *id, side: *side, message: self.public(message) };
                &renamed
            }
            m => m,
        };
        let bytes = msg.encode();
        tracing::trace!(target: "tern::control", "send type {} ({} bytes)", msg.type_byte(), bytes.len() - HEADER_LEN);
        let mut w = self.w.lock().unwrap();
        w.write_all(&bytes).and_then(|_| w.flush()).map_err(net_err)
    }
}

/// Forwards every control message into an event channel from its own thread, so a side's main
/// loop waits on one channel for both control messages and data-stream events. Stops after
/// `Bye`, at the first error (reported once), or when the main loop is gone. Err: no thread
/// could be started for it (`crate::threads`).
pub fn spawn_reader<E: Send + 'static>(mut reader: CtrlReader, events: crossbeam_channel::Sender<E>, msg: fn(Control) -> E, fail: fn(TransferError) -> E) -> std::io::Result<()> {
    crate::threads::spawn("tern-control", move || {
        loop {
            match reader.recv() {
                Ok(m) => {
                    let bye = matches!(m, Control::Bye);
                    if events.send(msg(m)).is_err() || bye {
                        return;
                    }
                }
                Err(e) => {
                    let _ = events.send(fail(e));
                    return;
                }
            }
        }
    })?;
    Ok(())
}

/// What the peer's message stream says next, for `prefer_peer_fatal`.
pub enum Said {
    /// Its `Fatal`, as an error.
    Fatal(TransferError),
    /// The control channel ended: nothing more is coming.
    Gone,
    Other,
}

/// A network error on our side (a write to a peer that just closed) may cross the peer's
/// `Fatal`, which says why: wait briefly for it in the event channel and prefer it, so the user
/// gets the reason instead of "broken pipe" and the client does not reconnect into the same
/// refusal.
pub fn prefer_peer_fatal<E>(e: TransferError, rx: &crossbeam_channel::Receiver<E>, said: impl Fn(E) -> Said) -> TransferError {
    if e.scope != crate::error::Scope::Network {
        return e;
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match rx.recv_timeout(left).map(&said) {
            Ok(Said::Fatal(f)) => return f,
            Ok(Said::Other) => {}
            Ok(Said::Gone) | Err(_) => break,
        }
    }
    e
}

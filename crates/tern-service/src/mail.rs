//! Email notifications over SMTP (`notify: "mailto:ADDR"`, `tern serve --smtp HOST:PORT`): one
//! plain-text message per finished job, naming the job id and its outcome in the subject.
//! One try per call; `notify.rs` retries and records delivery.
//!
//! STARTTLS is used when the relay offers it (opportunistic): the usual relay is the site's
//! MTA on the same host or network. The sync transport sets socket timeouts, so a stalled
//! server cannot hang a delivery (lettre's async timeout covers only the connect).

use std::time::Duration;

use lettre::message::{Mailbox, header::ContentType};
use lettre::transport::smtp::client::{Tls, TlsParameters};
use lettre::{Message, SmtpTransport, Transport};

use crate::model::Job;

const TIMEOUT: Duration = Duration::from_secs(10);

pub struct Mailer {
    transport: SmtpTransport,
    from: Mailbox,
    relay: String,
}

/// `tern@HOSTNAME`, the sender when `--smtp-from` is not given.
fn default_from() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_default();
    format!("tern@{}", if host.is_empty() { "localhost" } else { &host })
}

/// Whether `addr` is a mailbox lettre can send to (checked at submit).
pub fn valid_address(addr: &str) -> bool {
    addr.parse::<lettre::Address>().is_ok()
}

impl Mailer {
    /// `relay` is `HOST:PORT` (or `HOST`, port 25).
    pub fn new(relay: &str, from: Option<&str>) -> Result<Self, String> {
        let (host, port) = match relay.rsplit_once(':') {
            Some((h, p)) => (h.trim_matches(['[', ']']), p.parse::<u16>().map_err(|_| format!("--smtp '{relay}': the port must be a number (HOST:PORT)"))?),
            None => (relay, 25),
        };
        if host.is_empty() {
            return Err(format!("--smtp '{relay}': give the mail relay as HOST:PORT, e.g. localhost:25"));
        }
        let from = from.map(str::to_string).unwrap_or_else(default_from);
        let from: Mailbox = from.parse().map_err(|e| format!("--smtp-from '{from}': {e}; give an address like tern@dtn1.example.org"))?;
        let tls = TlsParameters::new(host.to_string()).map_err(|e| format!("--smtp '{relay}': {e}"))?;
        let transport = SmtpTransport::builder_dangerous(host).port(port).tls(Tls::Opportunistic(tls)).timeout(Some(TIMEOUT)).build();
        Ok(Self { transport, from, relay: relay.to_string() })
    }

    /// Sends the job's outcome to `to` (blocking; one try).
    pub fn send(&self, to: &str, job: &Job) -> Result<(), String> {
        let label = job.spec.label.as_deref().map(|l| format!(" ({l})")).unwrap_or_default();
        self.send_text(to, &format!("tern job {} {}{label}", job.id, job.state.as_str()), body(job))
    }

    /// One plain-text message (blocking; one try).
    pub fn send_text(&self, to: &str, subject: &str, text: String) -> Result<(), String> {
        let to: Mailbox = to.parse().map_err(|e| format!("mailto:{to}: {e}"))?;
        let msg = Message::builder().from(self.from.clone()).to(to).subject(subject).header(ContentType::TEXT_PLAIN).body(text).map_err(|e| format!("building the mail: {e}"))?;
        self.transport.send(&msg).map(drop).map_err(|e| format!("SMTP relay {}: {e}", self.relay))
    }
}

/// The message text: what a person reading it on a phone needs to decide what to do.
fn body(job: &Job) -> String {
    let mut b = format!("Job {} {}.\n\n  from: {}\n  to:   {}\n", job.id, job.state.as_str(), job.spec.src, job.spec.dst);
    if let Some(l) = &job.spec.label {
        b += &format!("  label: {l}\n");
    }
    if let Some(s) = &job.summary {
        let n = |k: &str| s.get(k).and_then(serde_json::Value::as_u64).unwrap_or(0);
        b += &format!("  files: {} transferred, {} failed; {} bytes\n", n("files"), n("files_failed"), n("bytes"));
    }
    b += &format!("  attempts: {}\n", job.attempts);
    if let Some(e) = &job.error {
        b += &format!("\nWhat went wrong: {e}\n");
    }
    b += &format!("\nDetails: tern status {}\n", job.id);
    b
}

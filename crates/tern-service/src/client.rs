//! The blocking HTTPS client behind `tern submit/jobs/status/wait/cancel/retry/token`.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;

pub struct Client {
    base: String,
    token: String,
    agent: ureq::Agent,
}

/// A failed call: the HTTP status (0 when no answer came) and the server's one-line message.
#[derive(Debug)]
pub struct CallError {
    pub status: u16,
    pub message: String,
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.status == 0 { write!(f, "{}", self.message) } else { write!(f, "{} (HTTP {})", self.message, self.status) }
    }
}

/// The system's CA bundle, as OpenSSL finds it: `SSL_CERT_FILE`, else the usual paths of
/// Debian/Ubuntu, RHEL/Fedora, SUSE and Alpine. A site CA installed there is trusted.
fn system_roots() -> Option<ureq::tls::RootCerts> {
    let env = std::env::var_os("SSL_CERT_FILE").map(std::path::PathBuf::from);
    let known = ["/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt", "/etc/ssl/ca-bundle.pem", "/etc/ssl/cert.pem"].map(std::path::PathBuf::from);
    env.into_iter().chain(known).find_map(|p| {
        let pem = std::fs::read(&p).ok()?;
        let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                _ => None,
            })
            .collect();
        (!certs.is_empty()).then(|| ureq::tls::RootCerts::Specific(Arc::new(certs)))
    })
}

impl Client {
    /// `ca_file`: PEM certificates to trust (the service's `tls/cert.pem`); else the system's
    /// store (`SSL_CERT_FILE`, or the distribution's bundle), else Mozilla's roots.
    pub fn new(server: &str, token: &str, ca_file: Option<&Path>) -> Result<Self, String> {
        let base = server.trim_end_matches('/').to_string();
        if !base.starts_with("https://") {
            return Err(format!("server '{server}' must be an https:// URL (e.g. https://dtn1:7443); the API is only served over TLS"));
        }
        let roots = match ca_file {
            Some(p) => {
                let pem = std::fs::read(p).map_err(|e| format!("cannot read CA file {}: {e}", p.display()))?;
                let certs: Vec<ureq::tls::Certificate<'static>> = ureq::tls::parse_pem(&pem)
                    .filter_map(|item| match item {
                        Ok(ureq::tls::PemItem::Certificate(c)) => Some(c),
                        _ => None,
                    })
                    .collect();
                if certs.is_empty() {
                    return Err(format!("CA file {} holds no PEM certificate", p.display()));
                }
                ureq::tls::RootCerts::Specific(Arc::new(certs))
            }
            None => system_roots().unwrap_or(ureq::tls::RootCerts::WebPki),
        };
        let tls = ureq::tls::TlsConfig::builder().provider(ureq::tls::TlsProvider::Rustls).unversioned_rustls_crypto_provider(crate::tls::provider()).root_certs(roots).build();
        // 75 s covers the longest long poll (60 s) plus a slow network.
        let agent = ureq::Agent::config_builder().tls_config(tls).http_status_as_error(false).timeout_global(Some(Duration::from_secs(75))).build().new_agent();
        Ok(Self { base, token: token.trim().to_string(), agent })
    }

    /// One request; a non-2xx answer becomes a `CallError` with the server's message.
    pub fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        let auth = format!("Bearer {}", self.token);
        let sent = match (method, body) {
            ("GET", _) => self.agent.get(&url).header("Authorization", &auth).call(),
            ("DELETE", _) => self.agent.delete(&url).header("Authorization", &auth).call(),
            (_, Some(b)) => self.agent.post(&url).header("Authorization", &auth).send_json(b),
            (_, None) => self.agent.post(&url).header("Authorization", &auth).send_empty(),
        };
        let mut resp = sent.map_err(|e| CallError { status: 0, message: format!("cannot reach {}: {e} (check --server / TERN_SERVER and --ca-file / TERN_CA_FILE)", self.base) })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().map_err(|e| CallError { status, message: format!("reading the answer: {e}") })?;
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) {
            Ok(v)
        } else {
            let message = v.get("error").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| v.to_string());
            Err(CallError { status, message })
        }
    }

    /// A raw body with its content type (tests of malformed requests use this).
    pub fn send_raw(&self, path: &str, content_type: &str, body: &[u8]) -> Result<Value, CallError> {
        let url = format!("{}{path}", self.base);
        let mut resp = self
            .agent
            .post(&url)
            .header("Authorization", &format!("Bearer {}", self.token))
            .header("Content-Type", content_type)
            .send(body)
            .map_err(|e| CallError { status: 0, message: format!("cannot reach {}: {e}", self.base) })?;
        let status = resp.status().as_u16();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        if (200..300).contains(&status) { Ok(v) } else { Err(CallError { status, message: v.get("error").and_then(Value::as_str).map(str::to_string).unwrap_or_else(|| v.to_string()) }) }
    }

    /// A non-JSON body (metrics).
    pub fn get_text(&self, path: &str) -> Result<String, CallError> {
        match self.call("GET", path, None)? {
            Value::String(s) => Ok(s),
            v => Ok(v.to_string()),
        }
    }
}

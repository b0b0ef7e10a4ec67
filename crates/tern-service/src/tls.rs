//! HTTPS for the API: a self-signed certificate made at first start (replaceable by a real one)
//! and the accept loop (rustls with aws-lc-rs, HTTP/1.1 via hyper).

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// More simultaneous connections than this wait in the kernel's backlog.
const MAX_CONNECTIONS: usize = 1024;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_TIMEOUT: Duration = Duration::from_secs(30);

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    // Explicit provider: never depend on a process default that another crate might set.
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len() - 1) };
    if rc != 0 {
        return None;
    }
    let end = buf.iter().position(|&b| b == 0)?;
    std::str::from_utf8(&buf[..end]).ok().filter(|s| !s.is_empty()).map(str::to_string)
}

/// `DIR/tls/cert.pem` and `key.pem`: loaded, or made now (key 0600) if neither exists.
pub fn load_or_create(state_dir: &Path) -> Result<Arc<ServerConfig>, String> {
    let dir = state_dir.join("tls");
    let (cert_path, key_path) = (dir.join("cert.pem"), dir.join("key.pem"));
    if !cert_path.exists() && !key_path.exists() {
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut names = vec!["localhost".to_string(), "127.0.0.1".to_string(), "::1".to_string()];
        names.extend(hostname());
        let ck = rcgen::generate_simple_self_signed(names).map_err(|e| format!("cannot make a TLS certificate: {e}"))?;
        let mut key = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&key_path).map_err(|e| format!("cannot create {}: {e}", key_path.display()))?;
        key.write_all(ck.signing_key.serialize_pem().as_bytes()).map_err(|e| format!("cannot write {}: {e}", key_path.display()))?;
        std::fs::write(&cert_path, ck.cert.pem()).map_err(|e| format!("cannot write {}: {e}", cert_path.display()))?;
        tracing::warn!("made a self-signed certificate {}; clients trust it with --ca-file {}", cert_path.display(), cert_path.display());
    }
    load(&cert_path, &key_path)
}

/// A certificate chain and its key, PEM (`--tls-cert`, `--tls-key`, or the made ones).
pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<ServerConfig>, String> {
    let cert_pem = std::fs::read(cert_path).map_err(|e| format!("cannot read {}: {e} (remove tls/ to make a new certificate)", cert_path.display()))?;
    let key_pem = std::fs::read(key_path).map_err(|e| format!("cannot read {}: {e} (remove tls/ to make a new certificate)", key_path.display()))?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&cert_pem).collect::<Result<_, _>>().map_err(|e| format!("{}: {e}", cert_path.display()))?;
    if certs.is_empty() {
        return Err(format!("{} holds no certificate", cert_path.display()));
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| format!("{}: {e}", key_path.display()))?;
    let mut cfg = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("{} and {} do not form a usable pair: {e}", cert_path.display(), key_path.display()))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Serves `router` over TLS on `listener` until the process ends.
pub async fn serve(listener: TcpListener, cfg: Arc<ServerConfig>, router: axum::Router) {
    let acceptor = tokio_rustls::TlsAcceptor::from(cfg);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let (sock, peer) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off instead of spinning.
                tracing::warn!("https accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = sock.set_nodelay(true);
        let (acceptor, router) = (acceptor.clone(), router.clone());
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(sock)).await {
                Ok(Ok(t)) => t,
                Ok(Err(e)) => return tracing::debug!("https {peer}: handshake: {e}"),
                Err(_) => return tracing::debug!("https {peer}: handshake timed out"),
            };
            let svc = TowerToHyperService::new(router);
            let conn = hyper::server::conn::http1::Builder::new().timer(TokioTimer::new()).header_read_timeout(HEADER_TIMEOUT).serve_connection(TokioIo::new(tls), svc);
            if let Err(e) = conn.await {
                tracing::debug!("https {peer}: {e}");
            }
        });
    }
}

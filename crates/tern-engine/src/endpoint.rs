//! Transfer endpoints as users write them: `path`, `[user@]host:path` (also `[user@][v6]:path`),
//! `scp://[user@]host[:port][/path]` or `ssh://...` (as scp reads them), `tern://host[:port]/path`.

use std::path::PathBuf;

pub const DEFAULT_PORT: u16 = 7700;

/// The forms `parse` accepts, for error messages.
pub const FORMS: &str = "give a local path, [user@]host:path, [user@][IPv6]:path, scp://[user@]host[:port]/path (ssh:// alike) or tern://host[:port]/path";

/// Schemes that are refused even with one slash (`tern:/x`), rather than read as a host named
/// like them.
const SCHEMES: &[&str] = &["tern", "ssh", "scp", "sftp", "http", "https", "ftp", "ftps", "s3", "gs", "gcs", "az", "abfs", "file", "rsync", "webdav", "davs", "dav", "gsiftp", "root", "hdfs", "smb"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Local(PathBuf),
    /// `host` may hold `user@`; an IPv6 address is kept without brackets; `port` is ssh's `-p`.
    Ssh {
        host: String,
        port: Option<u16>,
        path: String,
    },
    Daemon {
        host: String,
        port: u16,
        path: String,
    },
}

impl Endpoint {
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("tern://") {
            let (hostport, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/"),
            };
            let (host, port) = split_host_port(hostport).ok_or_else(|| format!("{s}: bad host:port in tern:// URL"))?;
            if host.is_empty() {
                return Err(format!("{s}: tern:// URL needs a host"));
            }
            return Ok(Endpoint::Daemon { host, port: port.unwrap_or(DEFAULT_PORT), path: path.to_string() });
        }
        if let Some(rest) = s.strip_prefix("scp://").or_else(|| s.strip_prefix("ssh://")) {
            return parse_ssh_url(s, rest);
        }
        if let Some(scheme) = url_scheme(s) {
            return Err(format!("{s}: tern does not speak {scheme}:// (it never tries that as an ssh host); {FORMS}"));
        }
        // scp rules: a colon before any slash means host:path; `./a:b` or `/a:b` are local.
        if !s.starts_with('/') && !s.starts_with('.') {
            // `[v6]:path` and `user@[v6]:path`.
            let (user, unbracketed) = match s.split_once("@[") {
                Some((u, r)) if !u.contains('/') && !u.contains(':') => (Some(u), Some(r)),
                _ => (None, s.strip_prefix('[')),
            };
            if let Some(rest) = unbracketed
                && let Some(end) = rest.find("]:")
                && !rest[..end].contains('/')
            {
                let host = match user {
                    Some(u) => format!("{u}@{}", &rest[..end]),
                    None => rest[..end].to_string(),
                };
                return Ok(Endpoint::Ssh { host, port: None, path: rest[end + 2..].to_string() });
            }
            if let Some(i) = s.find(':')
                && !s[..i].contains(['/', '['])
                && i > 0
            {
                return Ok(Endpoint::Ssh { host: s[..i].to_string(), port: None, path: s[i + 1..].to_string() });
            }
        }
        Ok(Endpoint::Local(PathBuf::from(s)))
    }

    /// The endpoint as a user would write it (an ssh port as an `ssh://` URL).
    pub fn display(&self) -> String {
        match self {
            Endpoint::Local(p) => p.display().to_string(),
            Endpoint::Ssh { host, port: None, path } => match host.rsplit_once('@') {
                Some((u, h)) if h.contains(':') => format!("{u}@[{h}]:{path}"),
                None if host.contains(':') => format!("[{host}]:{path}"),
                _ => format!("{host}:{path}"),
            },
            Endpoint::Ssh { host, port: Some(port), path } => {
                let (user, h) = host.rsplit_once('@').map_or(("", host.as_str()), |(u, h)| (u, h));
                let at = if user.is_empty() { String::new() } else { format!("{user}@") };
                format!("ssh://{at}{}:{port}/{}", if h.contains(':') { format!("[{h}]") } else { h.to_string() }, path.replace('%', "%25"))
            }
            Endpoint::Daemon { host, port, path } => format!("tern://{}:{port}{path}", if host.contains(':') { format!("[{host}]") } else { host.clone() }),
        }
    }

    pub fn is_local(&self) -> bool {
        matches!(self, Endpoint::Local(_))
    }

    /// The path part as written.
    pub fn path_str(&self) -> String {
        match self {
            Endpoint::Local(p) => p.display().to_string(),
            Endpoint::Ssh { path, .. } | Endpoint::Daemon { path, .. } => path.clone(),
        }
    }

    /// Where the process serving this endpoint runs, for grouping sources.
    pub fn host_key(&self) -> String {
        match self {
            Endpoint::Local(_) => String::new(),
            Endpoint::Ssh { host, port, .. } => format!("ssh:{host}:{}", port.unwrap_or(0)),
            Endpoint::Daemon { host, port, .. } => format!("tern:{host}:{port}"),
        }
    }
}

/// `scp://[user@]host[:port][/path]` as OpenSSH's scp reads it: the path after the host's `/`
/// is relative to the login directory (`//abs` for an absolute one), `%XX` escapes decoded.
fn parse_ssh_url(s: &str, rest: &str) -> Result<Endpoint, String> {
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, ""),
    };
    let (user, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u.split(';').next().unwrap_or(u)), h),
        None => (None, authority),
    };
    let bad = || format!("{s}: bad [user@]host[:port] in the URL; {FORMS}");
    let (host, port) = split_host_port(hostport).ok_or_else(bad)?;
    if host.is_empty() || user == Some("") || port == Some(0) {
        return Err(bad());
    }
    let path = percent_decode(path).ok_or_else(|| format!("{s}: bad %-escape in the path"))?;
    let host = match user {
        Some(u) => format!("{}@{host}", percent_decode(u).ok_or_else(bad)?),
        None => host,
    };
    Ok(Endpoint::Ssh { host, port, path })
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// `NAME://...` for any NAME, or `NAME:/...` for a known scheme: a URL tern does not speak.
fn url_scheme(s: &str) -> Option<&str> {
    let (scheme, rest) = s.split_once(':')?;
    let schemeish = scheme.len() > 1 && scheme.starts_with(|c: char| c.is_ascii_alphabetic()) && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c));
    let known = SCHEMES.contains(&scheme.to_ascii_lowercase().as_str());
    (schemeish && (rest.starts_with("//") || (known && rest.starts_with('/')))).then_some(scheme)
}

fn split_host_port(s: &str) -> Option<(String, Option<u16>)> {
    if let Some(rest) = s.strip_prefix('[') {
        let end = rest.find(']')?;
        let host = rest[..end].to_string();
        let after = &rest[end + 1..];
        return match after.strip_prefix(':') {
            Some(p) => Some((host, Some(p.parse().ok()?))),
            None if after.is_empty() => Some((host, None)),
            None => None,
        };
    }
    match s.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), Some(p.parse().ok()?))),
        None => Some((s.to_string(), None)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_like_scp() {
        let ssh = |host: &str, port: Option<u16>, path: &str| Endpoint::Ssh { host: host.into(), port, path: path.into() };
        assert_eq!(Endpoint::parse("data/x").unwrap(), Endpoint::Local("data/x".into()));
        assert_eq!(Endpoint::parse("./a:b").unwrap(), Endpoint::Local("./a:b".into()));
        assert_eq!(Endpoint::parse("/a:b").unwrap(), Endpoint::Local("/a:b".into()));
        assert_eq!(Endpoint::parse("dir/a:b").unwrap(), Endpoint::Local("dir/a:b".into()));
        assert_eq!(Endpoint::parse("u@h:/p").unwrap(), ssh("u@h", None, "/p"));
        assert_eq!(Endpoint::parse("h:").unwrap(), ssh("h", None, ""));
        assert_eq!(Endpoint::parse("[::1]:x").unwrap(), ssh("::1", None, "x"));
        assert_eq!(Endpoint::parse("u@[::1]:x/y").unwrap(), ssh("u@::1", None, "x/y"));
        assert_eq!(Endpoint::parse("u@[fe80::1%eth0]:/abs").unwrap(), ssh("u@fe80::1%eth0", None, "/abs"));
        assert_eq!(Endpoint::parse("tern://h:99/a/b").unwrap(), Endpoint::Daemon { host: "h".into(), port: 99, path: "/a/b".into() });
        assert_eq!(Endpoint::parse("tern://[::1]/").unwrap(), Endpoint::Daemon { host: "::1".into(), port: DEFAULT_PORT, path: "/".into() });
        assert!(Endpoint::parse("tern://h:notaport/").is_err());
    }

    #[test]
    fn scp_and_ssh_urls_as_scp_reads_them() {
        let ssh = |host: &str, port: Option<u16>, path: &str| Endpoint::Ssh { host: host.into(), port, path: path.into() };
        assert_eq!(Endpoint::parse("scp://h/dir/f").unwrap(), ssh("h", None, "dir/f"), "relative to the login directory, as scp");
        assert_eq!(Endpoint::parse("scp://u@h:2222//abs/f").unwrap(), ssh("u@h", Some(2222), "/abs/f"));
        assert_eq!(Endpoint::parse("ssh://u@h:22/some%20path").unwrap(), ssh("u@h", Some(22), "some path"));
        assert_eq!(Endpoint::parse("ssh://u;fp=x@h/p").unwrap(), ssh("u@h", None, "p"), "connection parameters are dropped");
        assert_eq!(Endpoint::parse("ssh://h").unwrap(), ssh("h", None, ""));
        assert_eq!(Endpoint::parse("scp://[::1]:2200/x").unwrap(), ssh("::1", Some(2200), "x"));
        assert_eq!(Endpoint::parse("scp://u@[::1]/x").unwrap(), ssh("u@::1", None, "x"));
        for bad in ["scp://", "scp://h:0/x", "scp://h:port/x", "ssh://@h/x", "scp://[::1/x", "ssh://h/%zz"] {
            assert!(Endpoint::parse(bad).is_err(), "{bad}");
        }
        assert_ne!(Endpoint::parse("scp://u@h:2222/x").unwrap().host_key(), Endpoint::parse("u@h:x").unwrap().host_key());
    }

    #[test]
    fn other_schemes_are_refused_never_tried_as_hosts() {
        for url in ["http://h/x", "https://h/x", "sftp://h/x", "s3://bucket/key", "gs://b/k", "rsync://h/m", "file:///tmp/x", "tern:/x", "ssh:/x", "HTTPS://h", "git+ssh://h/x"] {
            let e = Endpoint::parse(url).unwrap_err();
            let scheme = url.split(':').next().unwrap();
            assert!(e.contains(&format!("does not speak {scheme}://")) && e.contains("tern://host[:port]/path") && !e.contains('\n'), "{url}: {e}");
        }
        // A host merely named like a word is still a host, as in scp.
        assert_eq!(Endpoint::parse("dtn1:/data").unwrap(), Endpoint::Ssh { host: "dtn1".into(), port: None, path: "/data".into() });
    }

    #[test]
    fn display_round_trips() {
        for s in ["u@h:/p", "h:rel", "[::1]:x", "u@[::1]:x", "ssh://u@h:2222/x", "ssh://[::1]:2222//abs", "ssh://h:22/100%25", "tern://h:99/a", "tern://[::1]:7700/", "dir/f"] {
            let e = Endpoint::parse(s).unwrap();
            assert_eq!(Endpoint::parse(&e.display()).unwrap(), e, "{s} -> {}", e.display());
        }
    }
}

//! Transfer endpoints as users write them: `path`, `[user@]host:path`, `tern://host[:port]/path`.

use std::path::PathBuf;

pub const DEFAULT_PORT: u16 = 7700;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    Local(PathBuf),
    Ssh { host: String, path: String },
    Daemon { host: String, port: u16, path: String },
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
        // scp rules: a colon before any slash means host:path; `./a:b` or `/a:b` are local.
        if !s.starts_with('/') && !s.starts_with('.') {
            if let Some(rest) = s.strip_prefix('[')
                && let Some(end) = rest.find("]:")
            {
                return Ok(Endpoint::Ssh { host: rest[..end].to_string(), path: rest[end + 2..].to_string() });
            }
            if let Some(i) = s.find(':')
                && !s[..i].contains('/')
                && i > 0
            {
                return Ok(Endpoint::Ssh { host: s[..i].to_string(), path: s[i + 1..].to_string() });
            }
        }
        Ok(Endpoint::Local(PathBuf::from(s)))
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
            Endpoint::Ssh { host, .. } => format!("ssh:{host}"),
            Endpoint::Daemon { host, port, .. } => format!("tern:{host}:{port}"),
        }
    }
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
        assert_eq!(Endpoint::parse("data/x").unwrap(), Endpoint::Local("data/x".into()));
        assert_eq!(Endpoint::parse("./a:b").unwrap(), Endpoint::Local("./a:b".into()));
        assert_eq!(Endpoint::parse("u@h:/p").unwrap(), Endpoint::Ssh { host: "u@h".into(), path: "/p".into() });
        assert_eq!(Endpoint::parse("h:").unwrap(), Endpoint::Ssh { host: "h".into(), path: "".into() });
        assert_eq!(Endpoint::parse("[::1]:x").unwrap(), Endpoint::Ssh { host: "::1".into(), path: "x".into() });
        assert_eq!(Endpoint::parse("tern://h:99/a/b").unwrap(), Endpoint::Daemon { host: "h".into(), port: 99, path: "/a/b".into() });
        assert_eq!(Endpoint::parse("tern://[::1]/").unwrap(), Endpoint::Daemon { host: "::1".into(), port: DEFAULT_PORT, path: "/".into() });
        assert!(Endpoint::parse("tern://h:notaport/").is_err());
    }
}

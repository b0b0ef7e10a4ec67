//! Which peers a daemon may open connections to for a client (third-party transfers).
//!
//! The operator lists them (`tern serve --dial-allow HOST[:PORT]|CIDR`); with none listed the
//! daemon dials nobody. A client's address is judged before anything is connected, and a host
//! *name* is looked up only when the operator allowed that very name, so a token holder can
//! neither make the daemon connect where the operator did not allow nor use its resolver to
//! learn internal names. See docs/security.md.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// One `--dial-allow` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allow {
    /// An address range (a single address is a /32 or /128), any port or one.
    Net { ip: IpAddr, prefix: u8, port: Option<u16> },
    /// A host name as the operator wrote it, any port or one.
    Host { name: String, port: Option<u16> },
}

/// Parses `HOST`, `HOST:PORT`, `IP`, `IP:PORT`, `[IPv6]:PORT` or `IP/PREFIX`.
pub fn parse_allow(s: &str) -> Result<Allow, String> {
    let bad = || format!("--dial-allow {s}: expected HOST, HOST:PORT, an address, [IPv6]:PORT or a CIDR like 10.0.0.0/8");
    let s = s.trim();
    if let Some((ip, len)) = s.split_once('/') {
        let ip: IpAddr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(bad());
        }
        return Ok(Allow::Net { ip: ip.to_canonical(), prefix, port: None });
    }
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Ok(single(ip, None));
    }
    if let Ok(sa) = s.parse::<SocketAddr>() {
        return Ok(single(sa.ip(), Some(sa.port())));
    }
    let (name, port) = match s.rsplit_once(':') {
        Some((n, p)) => (n, Some(p.parse::<u16>().map_err(|_| bad())?)),
        None => (s, None),
    };
    let ok = !name.is_empty() && name.len() <= 253 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if !ok {
        return Err(bad());
    }
    Ok(Allow::Host { name: name.to_ascii_lowercase(), port })
}

fn single(ip: IpAddr, port: Option<u16>) -> Allow {
    let ip = ip.to_canonical();
    Allow::Net { ip, prefix: if ip.is_ipv4() { 32 } else { 128 }, port }
}

fn in_net(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => prefix == 0 || (u32::from(a) ^ u32::from(n)) >> (32 - prefix as u32) == 0,
        (IpAddr::V6(a), IpAddr::V6(n)) => prefix == 0 || (u128::from(a) ^ u128::from(n)) >> (128 - prefix as u32) == 0,
        _ => false,
    }
}

/// The operator's list; empty: dial nobody.
#[derive(Clone, Debug, Default)]
pub struct DialPolicy {
    pub allow: Vec<Allow>,
}

impl DialPolicy {
    /// The addresses to connect to for a client's `host:port`, or the one-line refusal.
    pub fn resolve(&self, addr: &str) -> Result<Vec<SocketAddr>, String> {
        if self.allow.is_empty() {
            return Err("the source daemon dials no third-party peers: its operator allowed none (tern serve --dial-allow HOST[:PORT]|CIDR on the source host); copy through a host that runs tern, or ask its operator".into());
        }
        let refused = || format!("the source daemon may dial only the peers its operator allowed, and {addr} is not one of them (tern serve --dial-allow on the source host)");
        let (host, port) = split_host_port(addr).ok_or_else(refused)?;
        let port_ok = |p: &Option<u16>| p.is_none_or(|p| p == port);
        if let Ok(ip) = host.parse::<IpAddr>() {
            let ip = ip.to_canonical();
            // Never the wildcard (it reaches this host) nor a group address.
            if ip.is_unspecified() || ip.is_multicast() || ip == IpAddr::from([255, 255, 255, 255]) {
                return Err(refused());
            }
            let allowed = self.allow.iter().any(|a| match a {
                Allow::Net { ip: n, prefix, port: p } => port_ok(p) && in_net(ip, *n, *prefix),
                // The operator's own names, looked up now (they may have moved).
                Allow::Host { name, port: p } => port_ok(p) && (name.as_str(), port).to_socket_addrs().is_ok_and(|mut it| it.any(|sa| sa.ip().to_canonical() == ip)),
            });
            return if allowed { Ok(vec![SocketAddr::new(ip, port)]) } else { Err(refused()) };
        }
        let lower = host.to_ascii_lowercase();
        if !self.allow.iter().any(|a| matches!(a, Allow::Host { name, port: p } if *name == lower && port_ok(p))) {
            return Err(refused());
        }
        let addrs: Vec<SocketAddr> = (lower.as_str(), port).to_socket_addrs().map_err(|_| refused())?.filter(|sa| !sa.ip().is_unspecified() && !sa.ip().is_multicast()).collect();
        if addrs.is_empty() { Err(refused()) } else { Ok(addrs) }
    }
}

/// `host:port` or `[v6]:port`.
fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = if let Some(rest) = addr.strip_prefix('[') {
        let (h, p) = rest.split_once("]:")?;
        (h, p)
    } else {
        let (h, p) = addr.rsplit_once(':')?;
        if h.contains(':') {
            return None;
        }
        (h, p)
    };
    Some((host, port.parse().ok().filter(|p| *p != 0)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(entries: &[&str]) -> DialPolicy {
        DialPolicy { allow: entries.iter().map(|e| parse_allow(e).unwrap()).collect() }
    }

    #[test]
    fn nothing_is_dialled_without_an_allow_list() {
        let e = DialPolicy::default().resolve("127.0.0.1:7700").unwrap_err();
        assert!(e.contains("--dial-allow"), "{e}");
    }

    #[test]
    fn networks_addresses_and_ports() {
        let p = policy(&["10.1.0.0/16", "192.0.2.7:7700", "[2001:db8::1]:7700", "fd00::/8"]);
        assert_eq!(p.resolve("10.1.200.3:7700").unwrap(), vec!["10.1.200.3:7700".parse().unwrap()]);
        assert!(p.resolve("10.2.0.1:7700").is_err());
        assert!(p.resolve("192.0.2.7:7700").is_ok());
        assert!(p.resolve("192.0.2.7:22").is_err(), "the port is part of the entry");
        assert!(p.resolve("[2001:db8::1]:7700").is_ok());
        assert!(p.resolve("[fd12::5]:1").is_ok());
        assert!(p.resolve("[2001:db8::2]:7700").is_err());
    }

    #[test]
    fn attackers_spellings_are_refused() {
        let p = policy(&["10.0.0.0/8", "dtn.example.org:7700"]);
        for a in [
            "127.0.0.1:7700",
            "[::ffff:127.0.0.1]:7700",
            "0.0.0.0:7700",
            "[::]:7700",
            "224.0.0.1:7700",
            "localhost:7700",
            "internal.example.org:7700",
            "dtn.example.org:22",
            "10.0.0.1",
            "10.0.0.1:0",
            "10.0.0.1:99999",
            "::1:7700",
            "",
        ] {
            assert!(p.resolve(a).is_err(), "{a} must be refused");
        }
        // A v4-mapped spelling of an allowed address is that address.
        assert_eq!(p.resolve("[::ffff:10.0.0.1]:7700").unwrap(), vec!["10.0.0.1:7700".parse().unwrap()]);
        // Everything allows all but the wildcard.
        let all = policy(&["0.0.0.0/0"]);
        assert!(all.resolve("198.18.0.1:1").is_ok() && all.resolve("0.0.0.0:1").is_err());
    }

    #[test]
    fn entries_parse_or_say_what_is_expected() {
        assert_eq!(parse_allow("Example.ORG").unwrap(), Allow::Host { name: "example.org".into(), port: None });
        assert_eq!(parse_allow("10.0.0.1:7700").unwrap(), Allow::Net { ip: "10.0.0.1".parse().unwrap(), prefix: 32, port: Some(7700) });
        for bad in ["10.0.0.0/33", "a b", "host:port", "", "[::1]"] {
            assert!(parse_allow(bad).is_err(), "{bad}");
        }
        // Allowing a name allows its addresses only by that name or by its current addresses.
        let p = policy(&["localhost:7700"]);
        assert!(p.resolve("localhost:7700").is_ok());
        assert!(p.resolve("127.0.0.1:7700").is_ok());
        assert!(p.resolve("127.0.0.1:7701").is_err());
    }
}

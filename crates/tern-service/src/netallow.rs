//! Where the service may POST a job's webhook. A submitter chooses the URL, so by default it
//! must resolve to public addresses only: not loopback, link-local, private, shared (CGNAT),
//! benchmark, multicast or unspecified ranges, nor an address of the service's own host —
//! otherwise a token holder could make the service call its own API, a cloud metadata
//! endpoint or anything on the internal network. The operator opens more with
//! `--webhook-allow HOST|IP|CIDR`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};

/// One `--webhook-allow` entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Allow {
    Host(String),
    Net(IpAddr, u8),
}

impl Allow {
    pub fn parse(s: &str) -> Result<Self, String> {
        let s = s.trim();
        let bad = || format!("--webhook-allow '{s}' is not a host name, an IP address or a CIDR like 10.0.0.0/8");
        if let Some((ip, len)) = s.split_once('/') {
            let ip: IpAddr = ip.parse().map_err(|_| bad())?;
            let len: u8 = len.parse().map_err(|_| bad())?;
            if len > if ip.is_ipv4() { 32 } else { 128 } {
                return Err(bad());
            }
            return Ok(Self::Net(ip, len));
        }
        if let Ok(ip) = s.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return Ok(Self::Net(ip, if ip.is_ipv4() { 32 } else { 128 }));
        }
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-') {
            return Err(bad());
        }
        Ok(Self::Host(s.to_ascii_lowercase()))
    }

    fn contains(&self, ip: IpAddr) -> bool {
        let Self::Net(net, len) = self else { return false };
        match (canonical(*net), canonical(ip)) {
            (IpAddr::V4(n), IpAddr::V4(a)) => prefix_eq(&n.octets(), &a.octets(), *len),
            (IpAddr::V6(n), IpAddr::V6(a)) => prefix_eq(&n.octets(), &a.octets(), *len),
            _ => false,
        }
    }
}

fn prefix_eq(a: &[u8], b: &[u8], len: u8) -> bool {
    let (whole, rest) = ((len / 8) as usize, len % 8);
    a[..whole] == b[..whole] && (rest == 0 || (a[whole] ^ b[whole]) >> (8 - rest) == 0)
}

/// `::ffff:10.0.0.1` is 10.0.0.1.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(ip),
        v4 => v4,
    }
}

/// Not reachable from the public internet, or this host itself.
pub fn internal(ip: IpAddr) -> bool {
    match canonical(ip) {
        IpAddr::V4(a) => {
            let o = a.octets();
            a.is_loopback() || a.is_private() || a.is_link_local() || a.is_unspecified() || a.is_broadcast() || a.is_multicast() || o[0] == 0
                || (o[0] == 100 && (o[1] & 0xc0) == 64) // 100.64.0.0/10 shared (CGNAT)
                || (o[0] == 198 && (o[1] & 0xfe) == 18) // 198.18.0.0/15 benchmark
                || o[0] >= 240
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            a.is_loopback() || a.is_unspecified() || a.is_multicast() || (s[0] & 0xfe00) == 0xfc00 || (s[0] & 0xffc0) == 0xfe80 || (s[0] & 0xffc0) == 0xfec0
        }
    }
}

/// The addresses of this host's interfaces.
fn own_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut ifa: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut ifa) != 0 {
            return out;
        }
        let mut cur = ifa;
        while !cur.is_null() {
            let a = (*cur).ifa_addr;
            if !a.is_null() {
                match i32::from((*a).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(a as *const libc::sockaddr_in);
                        out.push(IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(a as *const libc::sockaddr_in6);
                        out.push(IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(ifa);
    }
    out
}

/// Host and port of an http(s) URL (userinfo dropped, IPv6 brackets removed).
pub fn host_port(url: &str) -> Result<(String, u16), String> {
    let (rest, default) = if let Some(r) = url.strip_prefix("https://") {
        (r, 443)
    } else if let Some(r) = url.strip_prefix("http://") {
        (r, 80)
    } else {
        return Err(format!("notify '{url}' must be an http:// or https:// URL"));
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let (host, port) = if let Some(r) = hostport.strip_prefix('[') {
        let (h, after) = r.split_once(']').ok_or_else(|| format!("notify '{url}': bad IPv6 address"))?;
        (h, after.strip_prefix(':'))
    } else {
        match hostport.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (hostport, None),
        }
    };
    let port = match port {
        Some(p) => p.parse().map_err(|_| format!("notify '{url}': bad port"))?,
        None => default,
    };
    if host.is_empty() {
        return Err(format!("notify '{url}' has no host"));
    }
    Ok((host.to_ascii_lowercase(), port))
}

/// Whether the service may POST to `url`: the addresses it may connect to for it (resolved
/// now, blocking). The caller connects to exactly these, so a name cannot resolve to something
/// else between the check and the connection (DNS rebinding).
pub fn check_webhook(url: &str, allow: &[Allow]) -> Result<Vec<SocketAddr>, String> {
    let (host, port) = host_port(url)?;
    let addrs: Vec<SocketAddr> = (host.as_str(), port).to_socket_addrs().map_err(|e| format!("notify '{url}': cannot resolve {host}: {e}"))?.collect();
    if addrs.is_empty() {
        return Err(format!("notify '{url}': {host} has no address"));
    }
    if allow.iter().any(|a| *a == Allow::Host(host.clone())) {
        return Ok(addrs);
    }
    let own = own_addresses();
    for ip in addrs.iter().map(SocketAddr::ip) {
        if allow.iter().any(|a| a.contains(ip)) {
            continue;
        }
        if internal(ip) || own.iter().any(|o| canonical(*o) == canonical(ip)) {
            return Err(format!(
                "notify '{url}' reaches {ip}, an internal address or this service's own host; webhooks go to public addresses unless the operator allows more (tern serve --webhook-allow {host})"
            ));
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_and_allowed_addresses() {
        for bad in
            ["http://127.0.0.1:9/x", "http://[::1]/", "https://169.254.169.254/latest/meta-data", "http://10.1.2.3/", "http://[::ffff:192.168.1.1]/", "http://user@127.0.0.2:80/", "http://0.0.0.0/"]
        {
            assert!(check_webhook(bad, &[]).unwrap_err().contains("internal"), "{bad}");
        }
        assert!(check_webhook("http://8.8.8.8/hook", &[]).is_ok());
        let allow = [Allow::parse("127.0.0.0/8").unwrap(), Allow::parse("LocalHost").unwrap()];
        assert_eq!(Allow::parse("LocalHost").unwrap(), Allow::Host("localhost".into()));
        assert!(check_webhook("http://127.0.0.1:9/x", &allow).is_ok());
        assert!(check_webhook("http://[::1]/", &allow).is_err());
        assert!(check_webhook("http://localhost:9/", &allow).is_ok(), "an allowed name");
        assert!(Allow::parse("10.0.0.0/33").is_err() && Allow::parse("a b").is_err());
        assert_eq!(host_port("https://u:p@Example.org:8443/a?b").unwrap(), ("example.org".into(), 8443));
        assert!(check_webhook("ftp://x/", &[]).is_err());
    }
}

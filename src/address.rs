//! Addresses as operators write them: `host:port`, where the host is an
//! IPv4 address, a bracketed IPv6 address (`[::1]:7700`) or a DNS name
//! (`ringlock-0.ringlock:7700`, as Kubernetes and Compose give them).
//!
//! An [`Endpoint`] keeps the text as written, which is what `P` and `M`
//! replies name and what the `--peers` fingerprint covers, and is resolved
//! where it is used: a listening address once at start, a peer's address
//! at every connection, so that a peer that came back with a new IP is
//! found.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// A `host:port` as written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    written: String,
    host: String,
    port: u16,
}

impl Endpoint {
    /// Parses `host:port`, `[v6]:port` or `ip:port`; never resolves.
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let text = text.trim();
        let example = "such as 127.0.0.1:7700, [::1]:7700 or ringlock-0.ringlock:7700";
        let invalid = || format!("expected an address (host:port) {example}, not {text:?}");
        let (host, port) = text.rsplit_once(':').ok_or_else(invalid)?;
        let port: u16 = port.parse().map_err(|_| invalid())?;
        let host = match host.strip_prefix('[').and_then(|inner| inner.strip_suffix(']')) {
            Some(inner) => {
                inner.parse::<std::net::Ipv6Addr>().map_err(|_| invalid())?;
                inner
            }
            // A bare IPv6 address is ambiguous next to its port.
            None if host.contains(':') => {
                return Err(format!("write an IPv6 address in brackets ({example}), not {text:?}"));
            }
            None => host,
        };
        let name_byte = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b':');
        if host.is_empty() || host.len() > 253 || !host.bytes().all(name_byte) {
            return Err(invalid());
        }
        // An IP address is kept in its standard form, as replies and the
        // `--peers` fingerprint name it ([0:0::1] is [::1]).
        if let Ok(ip) = host.parse::<IpAddr>() {
            let address = SocketAddr::new(ip, port);
            return Ok(Endpoint { written: address.to_string(), host: ip.to_string(), port });
        }
        Ok(Endpoint { written: text.to_string(), host: host.to_string(), port })
    }

    /// The same host on another port, as `host:port` text.
    pub fn with_port(&self, port: u16) -> Endpoint {
        let written =
            if self.host.contains(':') { format!("[{}]:{port}", self.host) } else { format!("{}:{port}", self.host) };
        Endpoint { written, host: self.host.clone(), port }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The host as written (an IP address in its standard form, without brackets).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The socket address when the host is an IP address (no lookup).
    pub fn ip_address(&self) -> Option<SocketAddr> {
        self.host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, self.port))
    }

    /// Whether two endpoints name the same host and port as written (names
    /// compared without case, IP addresses by value).
    pub fn same_as(&self, other: &Endpoint) -> bool {
        match (self.ip_address(), other.ip_address()) {
            (Some(mine), Some(theirs)) => mine == theirs,
            _ => self.port == other.port && self.host.eq_ignore_ascii_case(&other.host),
        }
    }

    /// Every address the host resolves to now (an IP address: itself).
    /// Blocks for the lookup: call it off the shard and replication cores'
    /// event loops (at start, or on a blocking thread).
    pub fn resolve(&self) -> io::Result<Vec<SocketAddr>> {
        if let Some(address) = self.ip_address() {
            return Ok(vec![address]);
        }
        let addresses: Vec<SocketAddr> = (self.host.as_str(), self.port).to_socket_addrs()?.collect();
        if addresses.is_empty() {
            return Err(io::Error::new(io::ErrorKind::NotFound, "the name resolves to no address"));
        }
        Ok(addresses)
    }

    /// The address to listen on for `flag`: the first the host resolves to.
    /// A name that does not resolve stops the start, with why.
    pub fn listen_address(&self, flag: &str) -> Result<SocketAddr, String> {
        let addresses = self.resolve().map_err(|error| format!("{flag} {self}: cannot resolve the name: {error}"))?;
        Ok(addresses[0])
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.written)
    }
}

impl From<SocketAddr> for Endpoint {
    fn from(address: SocketAddr) -> Endpoint {
        Endpoint { written: address.to_string(), host: address.ip().to_string(), port: address.port() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_addresses_of_both_families_parse_and_keep_their_text() {
        for (text, host, port) in [
            ("127.0.0.1:7700", "127.0.0.1", 7700),
            ("[::1]:7700", "::1", 7700),
            ("ringlock-0.ringlock.default.svc:7700", "ringlock-0.ringlock.default.svc", 7700),
            ("localhost:1", "localhost", 1),
        ] {
            let endpoint = Endpoint::parse(text).unwrap();
            assert_eq!(endpoint.to_string(), text);
            assert_eq!((endpoint.host.as_str(), endpoint.port), (host, port));
        }
        assert_eq!(Endpoint::parse("[::1]:7700").unwrap().with_port(17700).to_string(), "[::1]:17700");
        assert_eq!(Endpoint::parse("db-1:7700").unwrap().with_port(17700).to_string(), "db-1:17700");
        assert_eq!(Endpoint::parse("[0:0::1]:7700").unwrap().to_string(), "[::1]:7700", "IPs in standard form");
    }

    #[test]
    fn malformed_addresses_are_refused_with_an_example() {
        for text in
            ["", "7700", "host", "host:", ":7700", "host:70000", "::1:7700", "[::1:7700", "[x]:1", "a b:1", "h/x:1"]
        {
            let error = Endpoint::parse(text).unwrap_err();
            assert!(error.contains("127.0.0.1:7700"), "{text:?}: {error}");
        }
    }

    #[test]
    fn same_as_compares_ip_addresses_by_value_and_names_without_case() {
        let parse = |text| Endpoint::parse(text).unwrap();
        assert!(parse("Ringlock-0:7700").same_as(&parse("ringlock-0:7700")));
        assert!(parse("[::1]:7700").same_as(&parse("[0:0::1]:7700")));
        assert!(!parse("ringlock-0:7700").same_as(&parse("ringlock-0:7701")));
        assert!(!parse("127.0.0.1:7700").same_as(&parse("localhost:7700")));
    }

    #[test]
    fn an_ip_address_resolves_without_a_lookup_and_localhost_resolves() {
        assert_eq!(Endpoint::parse("10.1.2.3:5").unwrap().resolve().unwrap(), vec!["10.1.2.3:5".parse().unwrap()]);
        let local = Endpoint::parse("localhost:7700").unwrap().resolve().unwrap();
        assert!(local.iter().all(|address| address.ip().is_loopback() && address.port() == 7700), "{local:?}");
    }
}

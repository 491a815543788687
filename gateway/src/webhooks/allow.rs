//! Where webhooks may be posted (docs/security.md "Outbound requests"). By default nowhere inside:
//! no loopback, private (RFC 1918), shared (CGNAT, 100.64/10), link-local (169.254/16, with the
//! clouds' metadata address), unique-local (fc00::/7), multicast, unspecified, documentation or
//! reserved address, nor an IPv4 address mapped or embedded in IPv6 that is one of those.
//! `DELTA_WEBHOOK_ALLOW` lists what is allowed anyway: networks (`10.1.0.0/16`, an address) and
//! host names (`hooks.internal`).
//!
//! Checked when a subscription is made (a clear refusal) and on every connection: the HTTP
//! client resolves names through [`Resolver`], which hands it only allowed addresses, so a name
//! that resolves elsewhere later (DNS rebinding) reaches nothing it should not; a URL with an
//! address in it is checked before each request (it does not go through a resolver).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use ipnet::IpNet;

/// `DELTA_WEBHOOK_ALLOW` (or `DELTA_A2A_PUSH_ALLOW`), parsed.
#[derive(Clone, Debug)]
pub struct Allow {
    nets: Vec<IpNet>,
    /// Lowercase, without a trailing dot.
    hosts: Vec<String>,
    /// The setting(s) it comes from, for refusals to name.
    setting: String,
}

impl Default for Allow {
    fn default() -> Self {
        Allow::none("DELTA_WEBHOOK_ALLOW")
    }
}

impl Allow {
    /// Public addresses only, as `setting` empty says.
    pub fn none(setting: &str) -> Allow {
        Allow {
            nets: Vec::new(),
            hosts: Vec::new(),
            setting: setting.to_owned(),
        }
    }

    /// Parses a comma- or space-separated list of networks, addresses and host names
    /// (`DELTA_WEBHOOK_ALLOW`'s).
    pub fn parse(text: &str) -> Result<Allow, String> {
        Allow::parse_for(text, "DELTA_WEBHOOK_ALLOW")
    }

    /// Parses setting `setting`'s list, as [`Allow::parse`] does.
    pub fn parse_for(text: &str, setting: &str) -> Result<Allow, String> {
        let mut allow = Allow::none(setting);
        for item in text
            .split([',', ' '])
            .map(str::trim)
            .filter(|s| !s.is_empty())
        {
            if let Ok(net) = item.parse::<IpNet>() {
                allow.nets.push(net);
            } else if let Ok(ip) = item.parse::<IpAddr>() {
                allow.nets.push(IpNet::from(ip));
            } else if item.contains('/') || !valid_host(item.trim_end_matches('.')) {
                return Err(format!(
                    "`{item}` is neither a network (10.0.0.0/8, ::1/128), an address nor a host name"
                ));
            } else {
                allow.hosts.push(normal_host(item));
            }
        }
        Ok(allow)
    }

    /// What either allows (each setting named in refusals).
    pub fn and(&self, other: &Allow) -> Allow {
        let mut both = self.clone();
        both.nets.extend(other.nets.iter().copied());
        both.hosts.extend(other.hosts.iter().cloned());
        both.setting = format!("{} or {}", self.setting, other.setting);
        both
    }

    /// Whether `host` (a name) is allowed whatever it resolves to.
    pub fn host(&self, host: &str) -> bool {
        let h = normal_host(host);
        self.hosts.contains(&h)
    }

    /// Whether `ip` is in an allowed network.
    pub fn ip(&self, ip: IpAddr) -> bool {
        self.nets.iter().any(|n| n.contains(&ip))
    }

    /// Whether connecting to `ip` for `host` is allowed: an allowed name, an allowed network, or
    /// a public address.
    pub fn permits(&self, host: &str, ip: IpAddr) -> Result<(), Refused> {
        if self.host(host) || self.ip(ip) {
            return Ok(());
        }
        match class(ip) {
            None => Ok(()),
            Some(class) => Err(Refused {
                ip,
                class,
                setting: self.setting.clone(),
            }),
        }
    }

    /// Whether `host` itself is allowed in so many words (a name, or an address in an allowed
    /// network): such targets may be reached over plain `http`.
    pub fn explicitly(&self, host: &str) -> bool {
        match host.parse::<IpAddr>() {
            Ok(ip) => self.ip(ip),
            Err(_) => self.host(host),
        }
    }
}

fn normal_host(h: &str) -> String {
    h.trim_end_matches('.').to_ascii_lowercase()
}

fn valid_host(h: &str) -> bool {
    !h.is_empty()
        && h.len() <= 253
        && h.split('.').all(|l| {
            !l.is_empty()
                && l.len() <= 63
                && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        })
}

/// An address that is not allowed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refused {
    pub ip: IpAddr,
    pub class: &'static str,
    /// The setting that would allow it.
    pub setting: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is a {} address, which is not reached unless {} allows it",
            self.ip, self.class, self.setting
        )
    }
}

/// What kind of non-public address `ip` is; `None`: a public one.
pub fn class(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => class_v4(v4),
        IpAddr::V6(v6) => class_v6(v6),
    }
}

fn class_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(if ip.is_unspecified() || a == 0 {
        "unspecified (0.0.0.0/8)"
    } else if ip.is_loopback() {
        "loopback"
    } else if ip.is_private() {
        "private (RFC 1918)"
    } else if a == 100 && (64..128).contains(&b) {
        "shared (CGNAT, 100.64.0.0/10)"
    } else if ip.is_link_local() {
        "link-local (169.254.0.0/16, cloud metadata)"
    } else if ip.is_multicast() {
        "multicast"
    } else if ip.is_broadcast() || a >= 240 {
        "reserved (240.0.0.0/4)"
    } else if (a == 192 && b == 0 && c == 0) || (a == 198 && (b == 18 || b == 19)) {
        "special-purpose (IETF, benchmarking)"
    } else if ip.is_documentation() {
        "documentation"
    } else {
        return None;
    })
}

fn class_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // An IPv4 address inside IPv6 (mapped ::ffff:a.b.c.d, compatible ::a.b.c.d, NAT64
    // 64:ff9b::/96) reaches that IPv4 address: judge it as one.
    let seg = ip.segments();
    if let Some(v4) = ip.to_ipv4_mapped() {
        return class_v4(v4);
    }
    if seg[0] == 0x64 && seg[1] == 0xff9b && seg[2..6] == [0, 0, 0, 0] {
        let [a, b, c, d] = [seg[6] >> 8, seg[6] & 0xff, seg[7] >> 8, seg[7] & 0xff];
        #[allow(clippy::cast_possible_truncation)]
        return class_v4(Ipv4Addr::new(a as u8, b as u8, c as u8, d as u8));
    }
    Some(if ip.is_unspecified() {
        "unspecified (::)"
    } else if ip.is_loopback() {
        "loopback"
    } else if seg[0..6] == [0, 0, 0, 0, 0, 0] {
        "IPv4-compatible (::/96)"
    } else if seg[0] & 0xfe00 == 0xfc00 {
        "unique-local (fc00::/7)"
    } else if seg[0] & 0xffc0 == 0xfe80 {
        "link-local (fe80::/10)"
    } else if seg[0] & 0xff00 == 0xff00 {
        "multicast"
    } else if seg[0] == 0x2001 && seg[1] == 0x0db8 {
        "documentation"
    } else if seg[0] & 0xe000 != 0x2000 {
        "reserved (outside 2000::/3)"
    } else {
        return None;
    })
}

/// A webhook URL that may be used: its scheme, host and port, checked.
#[derive(Clone, Debug)]
pub struct Target {
    pub url: reqwest::Url,
    pub host: String,
}

/// Checks a URL as given: `https` (or `http` to an allowed target), no credentials, a host;
/// an address in it must be allowed. Names are checked when resolved ([`check_resolved`] at
/// creation, [`Resolver`] on every connection).
pub fn check_url(text: &str, allow: &Allow) -> Result<Target, String> {
    let url = reqwest::Url::parse(text.trim())
        .map_err(|e| format!("`url` is not a URL ({e}); give an absolute https:// URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "`url` carries a user or password: credentials do not belong in a webhook URL (the receiver checks the signature instead)"
                .to_owned(),
        );
    }
    let host = match url.host_str() {
        Some(h) if !h.is_empty() => h.trim_start_matches('[').trim_end_matches(']').to_owned(),
        _ => return Err("`url` has no host".to_owned()),
    };
    match url.scheme() {
        "https" => {}
        "http" if allow.explicitly(&host) => {}
        "http" => {
            return Err(format!(
                "`url` is plain http to `{host}`: posts go over https, or over http only to a target {} names (a network or host)",
                allow.setting
            ));
        }
        other => {
            return Err(format!(
                "`url` has the scheme `{other}`: posts go over https (or http to an allowed target)"
            ));
        }
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        allow
            .permits(&host, ip)
            .map_err(|r| format!("`url`: {r}"))?;
    }
    Ok(Target { url, host })
}

/// Resolves a target's host now and checks every address (at creation: a name that resolves to
/// a private address is refused with that address).
pub async fn check_resolved(t: &Target, allow: &Allow) -> Result<(), String> {
    if t.host.parse::<IpAddr>().is_ok() || allow.host(&t.host) {
        return Ok(());
    }
    let port = t.url.port_or_known_default().unwrap_or(443);
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((t.host.as_str(), port))
        .await
        .map_err(|e| format!("`url`: cannot resolve `{}`: {e}", t.host))?
        .collect();
    for a in &addrs {
        allow
            .permits(&t.host, a.ip())
            .map_err(|r| {
                format!(
                    "`url`: `{}` resolves to {}, a {} address, which is not reached unless {} allows it",
                    t.host, r.ip, r.class, r.setting
                )
            })?;
    }
    Ok(())
}

/// The HTTP client's resolver: only allowed addresses come out of it.
#[derive(Clone, Debug)]
pub struct Resolver {
    pub allow: Arc<Allow>,
}

impl reqwest::dns::Resolve for Resolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let allow = self.allow.clone();
        let host = name.as_str().to_owned();
        Box::pin(async move {
            let all: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let mut refused = None;
            let ok: Vec<SocketAddr> = all
                .into_iter()
                .filter(|a| match allow.permits(&host, a.ip()) {
                    Ok(()) => true,
                    Err(r) => {
                        refused = Some(r);
                        false
                    }
                })
                .collect();
            if ok.is_empty() {
                let why = refused.map_or_else(|| "no address".to_owned(), |r| r.to_string());
                return Err(format!("`{host}`: {why}").into());
            }
            Ok(Box::new(ok.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::str::FromStr;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn inside_addresses_are_classified_and_public_ones_are_not() {
        for inside in [
            "127.0.0.1",
            "127.5.5.5",
            "10.1.2.3",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "100.127.255.254",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fc00::1",
            "fd12:3456::1",
            "fe80::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "::127.0.0.1",
        ] {
            assert!(class(ip(inside)).is_some(), "{inside}");
        }
        for public in [
            "8.8.8.8",
            "1.1.1.1",
            "100.63.255.255",
            "100.128.0.1",
            "172.32.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
        ] {
            assert_eq!(class(ip(public)), None, "{public}");
        }
    }

    #[test]
    fn the_allowlist_lets_named_networks_and_hosts_through() {
        let allow = Allow::parse("127.0.0.1/32, 10.0.0.0/8 hooks.internal. ::1").unwrap();
        assert!(allow.permits("x", ip("127.0.0.1")).is_ok());
        assert!(allow.permits("x", ip("127.0.0.2")).is_err());
        assert!(allow.permits("x", ip("10.9.9.9")).is_ok());
        assert!(allow.permits("x", ip("::1")).is_ok());
        assert!(allow.permits("Hooks.Internal", ip("192.168.0.1")).is_ok());
        let r = allow.permits("x", ip("169.254.169.254")).unwrap_err();
        assert!(
            r.to_string().contains("169.254.169.254")
                && r.to_string().contains("DELTA_WEBHOOK_ALLOW")
        );
        assert!(Allow::parse("10.0.0.0/33").is_err());
        assert!(Allow::parse("bad_host!").is_err());
    }

    /// What the HTTP client connects to goes through the resolver: a name that resolves to
    /// loopback (`localhost`, as a rebinding name would) yields no address unless allowed.
    #[tokio::test]
    async fn the_resolver_hands_out_only_allowed_addresses() {
        use reqwest::dns::Resolve;
        let name = |n: &str| reqwest::dns::Name::from_str(n).unwrap();
        let none = Resolver {
            allow: Arc::new(Allow::default()),
        };
        let err = none.resolve(name("localhost")).await.err().unwrap();
        assert!(err.to_string().contains("loopback"), "{err}");
        let v4 = Resolver {
            allow: Arc::new(Allow::parse("127.0.0.1/32").unwrap()),
        };
        let addrs: Vec<SocketAddr> = v4.resolve(name("localhost")).await.unwrap().collect();
        assert!(!addrs.is_empty());
        assert!(addrs.iter().all(|a| a.ip() == ip("127.0.0.1")), "{addrs:?}");
        let by_name = Resolver {
            allow: Arc::new(Allow::parse("localhost").unwrap()),
        };
        assert!(by_name.resolve(name("localhost")).await.is_ok());
    }

    #[tokio::test]
    async fn a_name_resolving_inside_is_refused_at_creation_naming_the_address() {
        let none = Allow::default();
        let t = check_url("https://localhost:9/x", &none).unwrap();
        let e = check_resolved(&t, &none).await.unwrap_err();
        assert!(
            e.contains("`localhost` resolves to")
                && e.contains("loopback")
                && e.contains("DELTA_WEBHOOK_ALLOW"),
            "{e}"
        );
        let named = Allow::parse("localhost").unwrap();
        assert!(check_resolved(&t, &named).await.is_ok());
    }

    #[test]
    fn urls_are_checked_for_scheme_credentials_and_addresses() {
        let none = Allow::default();
        assert!(check_url("https://hooks.example.com/x?t=1", &none).is_ok());
        for (url, needle) in [
            ("http://hooks.example.com/x", "plain http"),
            ("ftp://hooks.example.com/x", "scheme"),
            ("https://u:p@hooks.example.com/x", "user or password"),
            ("https://127.0.0.1:9/x", "127.0.0.1 is a loopback"),
            ("https://[::ffff:10.0.0.1]/x", "private"),
            ("https://169.254.169.254/latest", "link-local"),
            ("not a url", "not a URL"),
        ] {
            let e = check_url(url, &none).unwrap_err();
            assert!(e.contains(needle), "{url}: {e}");
        }
        let local = Allow::parse("127.0.0.1").unwrap();
        assert!(check_url("http://127.0.0.1:9/x", &local).is_ok());
        assert!(check_url("http://localhost:9/x", &local).is_err());
    }
}

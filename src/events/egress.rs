//! Egress rules: where a webhook may send. A webhook URL is chosen by
//! whoever holds an operator token, and the server sends to it from inside
//! the network, so an unchecked URL would let that caller reach what only
//! the server can reach (a cloud's metadata service at 169.254.169.254, a
//! database's admin port on 10.0.0.5, the server's own loopback).
//!
//! The rules run twice: on the URL as written, when an endpoint is created
//! or changed ([`check_url`]: syntax and literal addresses), and on every
//! address its host resolves to, at each delivery ([`resolve`]), since a
//! name that pointed outside at creation may point inside later. The
//! sender connects only to the addresses [`resolve`] returned, so a second
//! lookup cannot swap them (DNS rebinding).
//!
//! Allowed: `https` to a public address; with `allow_loopback`
//! (`STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK`, for development and tests) also
//! `http` or `https` to a loopback address. Refused: any other scheme,
//! `http` to anything but loopback, user info in the URL, and every address
//! that is private, unique local, link-local, loopback, unspecified, "this
//! network", multicast, broadcast or reserved, or shared (CGNAT), including
//! these written inside an IPv6 address (IPv4-mapped, IPv4-compatible,
//! NAT64, 6to4). The URL parser is the WHATWG one (`url`), which reads the
//! odd IPv4 forms browsers and resolvers accept (`2130706433`, `0x7f.1`,
//! `0177.0.0.1`) as the addresses they are, so those cannot slip past.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use url::{Host, Url};

/// The longest webhook URL accepted, in bytes.
pub const MAX_URL_LEN: usize = 2048;

/// Why a URL or one of its addresses is refused. The messages are for the
/// operator who gave the URL (and the delivery's `lastError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EgressError {
    /// Longer than [`MAX_URL_LEN`].
    #[error("the URL is longer than {MAX_URL_LEN} bytes")]
    TooLong,
    /// Not an absolute URL with a host.
    #[error("not a URL: {0}")]
    Malformed(String),
    /// A scheme other than `https` (or `http` to loopback when allowed).
    #[error(
        "the URL must be https (http only to a loopback address with STOCKGUARD_WEBHOOK_ALLOW_LOOPBACK=true), not {0}"
    )]
    Scheme(String),
    /// A user name or password in the URL.
    #[error("the URL must not contain a user name or password")]
    UserInfo,
    /// The host is, or resolved to, an address the server must not send to.
    #[error("{host} is a {range} address, which webhooks may not reach")]
    Forbidden {
        /// The host as written, or the address it resolved to.
        host: String,
        /// Which range it is in, in words.
        range: &'static str,
    },
    /// The host's name could not be resolved, or to no address.
    #[error("{host} did not resolve: {reason}")]
    Unresolved {
        /// The name.
        host: String,
        /// What the resolver said.
        reason: String,
    },
}

/// A URL that passed [`check_url`]: absolute, `http(s)`, with a host and no
/// user info, whose host is not a forbidden address as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CheckedUrl(Url);

impl CheckedUrl {
    /// The URL as the parser normalised it (lower-case host, dotted IPv4,
    /// a path of at least `/`): what is stored and what is requested.
    pub(crate) fn as_str(&self) -> &str {
        self.0.as_str()
    }

    /// The parsed URL.
    pub(crate) fn url(&self) -> &Url {
        &self.0
    }

    /// Whether it is plain `http`, which may only ever reach loopback.
    fn is_http(&self) -> bool {
        self.0.scheme() == "http"
    }
}

/// Checks a webhook URL as written: its length, syntax, scheme, user info,
/// and its host when that is a literal address or a loopback name.
pub(crate) fn check_url(url: &str, allow_loopback: bool) -> Result<CheckedUrl, EgressError> {
    if url.len() > MAX_URL_LEN {
        return Err(EgressError::TooLong);
    }
    let parsed = Url::parse(url).map_err(|err| EgressError::Malformed(err.to_string()))?;
    let scheme = parsed.scheme();
    if scheme != "https" && scheme != "http" {
        return Err(EgressError::Scheme(scheme.to_owned()));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(EgressError::UserInfo);
    }
    let loopback = match parsed.host() {
        Some(Host::Ipv4(ip)) => vet(IpAddr::V4(ip), allow_loopback)?,
        Some(Host::Ipv6(ip)) => vet(IpAddr::V6(ip), allow_loopback)?,
        Some(Host::Domain(name)) if is_loopback_name(name) => {
            if !allow_loopback {
                return Err(EgressError::Forbidden { host: name.to_owned(), range: "loopback" });
            }
            true
        }
        Some(Host::Domain(_)) => false,
        None => return Err(EgressError::Malformed("the URL has no host".to_owned())),
    };
    // Plain http is for a receiver on this machine only: anything sent
    // further would travel unencrypted, signed bodies or not.
    if scheme == "http" && !(allow_loopback && loopback) {
        return Err(EgressError::Scheme(scheme.to_owned()));
    }
    Ok(CheckedUrl(parsed))
}

/// The addresses to send `url`'s requests to: its literal address, or every
/// address its name resolves to now (`tokio::net::lookup_host`). Refused
/// when any of them is forbidden, not only the first, since the connection
/// may be made to any of them; for `http`, when any is not loopback.
pub(crate) async fn resolve(url: &CheckedUrl, allow_loopback: bool) -> Result<Vec<SocketAddr>, EgressError> {
    let parsed = url.url();
    let port = parsed.port_or_known_default().unwrap_or(443);
    let addrs: Vec<SocketAddr> = match parsed.host() {
        Some(Host::Ipv4(ip)) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
        Some(Host::Ipv6(ip)) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
        Some(Host::Domain(name)) => {
            let unresolved = |reason: String| EgressError::Unresolved { host: name.to_owned(), reason };
            let found = tokio::net::lookup_host((name, port)).await.map_err(|err| unresolved(err.to_string()))?;
            let found: Vec<SocketAddr> = found.collect();
            if found.is_empty() {
                return Err(unresolved("no address".to_owned()));
            }
            found
        }
        None => return Err(EgressError::Malformed("the URL has no host".to_owned())),
    };
    vet_all(&addrs, url.is_http(), allow_loopback)?;
    Ok(addrs)
}

/// Refuses the lot when any address is forbidden, or, for `http`, not loopback.
fn vet_all(addrs: &[SocketAddr], http: bool, allow_loopback: bool) -> Result<(), EgressError> {
    for addr in addrs {
        let loopback = vet(addr.ip(), allow_loopback)?;
        if http && !loopback {
            return Err(EgressError::Scheme("http".to_owned()));
        }
    }
    Ok(())
}

/// `localhost` and the names under it, which resolvers answer with
/// loopback without asking DNS (RFC 6761); a trailing dot is the same name.
fn is_loopback_name(name: &str) -> bool {
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    name == "localhost" || name.ends_with(".localhost")
}

/// Whether `ip` may be sent to: `Ok(true)` for an allowed loopback address,
/// `Ok(false)` for a public one, the refusal otherwise.
fn vet(ip: IpAddr, allow_loopback: bool) -> Result<bool, EgressError> {
    match range(ip) {
        None => Ok(false),
        Some("loopback") if allow_loopback => Ok(true),
        Some(range) => Err(EgressError::Forbidden { host: ip.to_string(), range }),
    }
}

/// The forbidden range `ip` is in, in words, or `None` for a public address.
fn range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => range_v4(ip),
        IpAddr::V6(ip) => range_v6(ip),
    }
}

/// [`range`] of an IPv4 address.
fn range_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, ..] = ip.octets();
    if ip.is_loopback() {
        Some("loopback")
    } else if a == 0 {
        // 0.0.0.0 connects to the local host on Linux; the rest of 0/8 is
        // "this network", never a remote receiver.
        Some("unspecified")
    } else if ip.is_private() {
        Some("private")
    } else if ip.is_link_local() {
        Some("link-local")
    } else if a == 100 && (b & 0xc0) == 64 {
        Some("shared (CGNAT)")
    } else if ip.is_broadcast() {
        Some("broadcast")
    } else if ip.is_multicast() {
        Some("multicast")
    } else if a >= 240 {
        Some("reserved")
    } else {
        None
    }
}

/// [`range`] of an IPv6 address, and of the IPv4 address written inside one.
fn range_v6(ip: Ipv6Addr) -> Option<&'static str> {
    let segments = ip.segments();
    // IPv4 written inside IPv6 reaches that IPv4 address: mapped
    // (::ffff:a.b.c.d, which a dual-stack socket connects to as IPv4),
    // compatible (::a.b.c.d, deprecated), NAT64 (64:ff9b::/96) and 6to4
    // (2002:AABB:CCDD::/48, whose relay forwards to AA.BB.CC.DD).
    if let Some(v4) = ip.to_ipv4_mapped() {
        return range_v4(v4);
    }
    if ip.is_loopback() {
        return Some("loopback");
    }
    if ip.is_unspecified() {
        return Some("unspecified");
    }
    let embedded = |high: u16, low: u16| Ipv4Addr::new((high >> 8) as u8, high as u8, (low >> 8) as u8, low as u8);
    if segments[..6] == [0; 6] {
        return range_v4(embedded(segments[6], segments[7])).or(Some("IPv4-compatible"));
    }
    if segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return range_v4(embedded(segments[6], segments[7]));
    }
    if segments[0] == 0x2002 {
        return range_v4(embedded(segments[1], segments[2]));
    }
    match segments[0] {
        s if s & 0xfe00 == 0xfc00 => Some("unique local (private)"),
        s if s & 0xffc0 == 0xfe80 => Some("link-local"),
        // Site-local, deprecated but still routed by some networks as private.
        s if s & 0xffc0 == 0xfec0 => Some("site-local (private)"),
        s if s & 0xff00 == 0xff00 => Some("multicast"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(url: &str) -> EgressError {
        check_url(url, false).expect_err(url)
    }

    fn range_of(url: &str, allow_loopback: bool) -> &'static str {
        match check_url(url, allow_loopback) {
            Err(EgressError::Forbidden { range, .. }) => range,
            other => panic!("{url}: {other:?}"),
        }
    }

    #[test]
    fn https_to_a_public_host_or_address_is_allowed_and_normalised() {
        for (url, stored) in [
            ("https://hooks.example.com/stockguard?x=1", "https://hooks.example.com/stockguard?x=1"),
            ("https://HOOKS.Example.com", "https://hooks.example.com/"),
            ("https://93.184.215.14:8443/in", "https://93.184.215.14:8443/in"),
            ("https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/", "https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/"),
        ] {
            assert_eq!(check_url(url, false).map(|checked| checked.as_str().to_owned()), Ok(stored.to_owned()));
        }
    }

    #[test]
    fn only_https_and_http_to_an_allowed_loopback_are_schemes_webhooks_use() {
        assert_eq!(refused("http://hooks.example.com/"), EgressError::Scheme("http".into()));
        assert_eq!(refused("ftp://hooks.example.com/"), EgressError::Scheme("ftp".into()));
        assert_eq!(refused("file:///etc/passwd"), EgressError::Scheme("file".into()));
        assert_eq!(refused("gopher://127.0.0.1:6379/_FLUSHALL"), EgressError::Scheme("gopher".into()));
        // Even with loopback allowed, plain http never leaves the machine.
        assert_eq!(check_url("http://hooks.example.com/", true), Err(EgressError::Scheme("http".into())));
        assert_eq!(check_url("http://93.184.215.14/", true), Err(EgressError::Scheme("http".into())));
        for url in ["http://127.0.0.1:9000/hook", "http://[::1]:9000/", "http://localhost:9000/", "https://127.0.0.1/"]
        {
            assert!(check_url(url, true).is_ok(), "{url} with loopback allowed");
        }
    }

    #[test]
    fn loopback_is_refused_without_the_setting_however_it_is_written() {
        for url in [
            "https://127.0.0.1/",
            "https://127.8.9.10/",
            "https://[::1]/",
            "https://[::ffff:127.0.0.1]/",
            "https://2130706433/",
            "https://0x7f.1/",
            "https://0177.0.0.1/",
            "https://127.1/",
            "http://127.0.0.1/",
        ] {
            assert_eq!(range_of(url, false), "loopback", "{url}");
        }
        for url in ["https://localhost/", "https://LOCALHOST./", "https://api.localhost/", "http://localhost:8080/"] {
            assert_eq!(range_of(url, false), "loopback", "{url}");
        }
    }

    #[test]
    fn private_link_local_and_other_inner_ranges_are_refused() {
        for (url, range) in [
            ("https://10.0.0.5/", "private"),
            ("https://172.16.0.1/", "private"),
            ("https://172.31.255.255/", "private"),
            ("https://192.168.1.1/", "private"),
            ("https://169.254.169.254/latest/meta-data/", "link-local"),
            ("https://100.64.0.1/", "shared (CGNAT)"),
            ("https://100.127.255.254/", "shared (CGNAT)"),
            ("https://0.0.0.0/", "unspecified"),
            ("https://0/", "unspecified"),
            ("https://0.1.2.3/", "unspecified"),
            ("https://224.0.0.1/", "multicast"),
            ("https://239.255.255.250/", "multicast"),
            ("https://255.255.255.255/", "broadcast"),
            ("https://240.0.0.1/", "reserved"),
            ("https://[::]/", "unspecified"),
            ("https://[fc00::1]/", "unique local (private)"),
            ("https://[fd12:3456::1]/", "unique local (private)"),
            ("https://[fe80::1]/", "link-local"),
            ("https://[febf::1]/", "link-local"),
            ("https://[fec0::1]/", "site-local (private)"),
            ("https://[ff02::1]/", "multicast"),
            // A loopback setting opens loopback only.
            ("https://10.0.0.5/", "private"),
        ] {
            assert_eq!(range_of(url, false), range, "{url}");
            assert_eq!(range_of(url, true), range, "{url} with loopback allowed");
        }
    }

    #[test]
    fn addresses_outside_the_ranges_are_public() {
        for url in [
            "https://100.63.255.255/",
            "https://100.128.0.1/",
            "https://172.15.255.255/",
            "https://172.32.0.1/",
            "https://169.253.0.1/",
            "https://192.169.0.1/",
            "https://223.255.255.255/",
            "https://[2001:db8::1]/",
            "https://[fbff::1]/",
        ] {
            assert!(check_url(url, false).is_ok(), "{url}");
        }
    }

    #[test]
    fn inner_ipv4_addresses_written_inside_ipv6_are_refused() {
        for (url, range) in [
            ("https://[::ffff:10.0.0.5]/", "private"),
            ("https://[::ffff:a9fe:a9fe]/", "link-local"),
            ("https://[::ffff:169.254.169.254]/", "link-local"),
            ("https://[::ffff:192.168.0.1]/", "private"),
            ("https://[::ffff:100.64.0.1]/", "shared (CGNAT)"),
            ("https://[::ffff:0.0.0.0]/", "unspecified"),
            ("https://[::10.0.0.5]/", "private"),
            ("https://[::127.0.0.1]/", "loopback"),
            ("https://[::8.8.8.8]/", "IPv4-compatible"),
            ("https://[64:ff9b::a9fe:a9fe]/", "link-local"),
            ("https://[64:ff9b::7f00:1]/", "loopback"),
            ("https://[2002:c0a8:0101::1]/", "private"),
            ("https://[2002:7f00:0001::1]/", "loopback"),
        ] {
            assert_eq!(range_of(url, false), range, "{url}");
        }
        // A public address behind those prefixes is public.
        assert!(check_url("https://[::ffff:93.184.215.14]/", false).is_ok());
        assert!(check_url("https://[64:ff9b::5db8:d70e]/", false).is_ok());
    }

    #[test]
    fn user_info_overlong_and_malformed_urls_are_refused() {
        assert_eq!(refused("https://user:pass@hooks.example.com/"), EgressError::UserInfo);
        assert_eq!(refused("https://user@hooks.example.com/"), EgressError::UserInfo);
        assert_eq!(refused("https://:pass@hooks.example.com/"), EgressError::UserInfo);
        // The classic confusion: the host is 169.254.169.254, not example.com.
        assert_eq!(refused("https://hooks.example.com@169.254.169.254/"), EgressError::UserInfo);
        let long = format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_LEN));
        assert_eq!(refused(&long), EgressError::TooLong);
        let fits =
            format!("https://hooks.example.com/{}", "a".repeat(MAX_URL_LEN - "https://hooks.example.com/".len()));
        assert!(check_url(&fits, false).is_ok());
        for url in ["", "hooks.example.com/in", "/in", "https://", "https://exa mple.com/", "https://[::1/"] {
            assert!(matches!(refused(url), EgressError::Malformed(_)), "{url:?}");
        }
    }

    proptest::proptest! {
        /// Every spelling of one IPv4 address gets the same answer: dotted,
        /// one decimal number, hexadecimal, and IPv4-mapped IPv6.
        #[test]
        fn every_spelling_of_an_ipv4_address_is_judged_as_the_address(n: u32) {
            let ip = Ipv4Addr::from(n);
            let expected = range_v4(ip);
            for url in [format!("https://{ip}/"), format!("https://{n}/"), format!("https://{n:#x}/"), format!("https://[::ffff:{ip}]/")] {
                let judged = match check_url(&url, false) {
                    Ok(_) => None,
                    Err(EgressError::Forbidden { range, .. }) => Some(range),
                    Err(other) => panic!("{url}: {other:?}"),
                };
                proptest::prop_assert_eq!(judged, expected, "{}", url);
            }
        }

        /// Whatever the text, the check answers without panicking, and a URL
        /// it accepts is accepted again as stored (what the dispatcher re-checks).
        #[test]
        fn an_accepted_url_is_accepted_again_as_stored(text in "(https?://)?[a-zA-Z0-9.:@\\[\\]%/?#-]{0,40}") {
            if let Ok(checked) = check_url(&text, true) {
                proptest::prop_assert_eq!(check_url(checked.as_str(), true), Ok(checked.clone()));
            }
        }
    }

    #[tokio::test]
    async fn resolution_refuses_a_name_whose_addresses_are_inner() {
        // `localhost` resolves (from the hosts file, no DNS needed) to
        // loopback only: refused without the setting at creation, and
        // again at delivery, where the check is on the addresses.
        let allowed = check_url("http://localhost:9000/hook", true).expect("allowed with the setting");
        let addrs = resolve(&allowed, true).await.expect("resolves to loopback");
        assert!(!addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback() && a.port() == 9000), "{addrs:?}");
        assert_eq!(
            resolve(&allowed, false)
                .await
                .map_err(|err| matches!(err, EgressError::Forbidden { range: "loopback", .. })),
            Err(true)
        );
    }

    #[tokio::test]
    async fn a_literal_address_resolves_to_itself_and_is_checked_again() {
        let checked = check_url("https://93.184.215.14/", false).expect("public");
        assert_eq!(resolve(&checked, false).await, Ok(vec!["93.184.215.14:443".parse().expect("addr")]));
        let loopback = check_url("https://[::1]:8443/", true).expect("allowed");
        assert!(matches!(resolve(&loopback, false).await, Err(EgressError::Forbidden { range: "loopback", .. })));
    }

    #[tokio::test]
    async fn an_unknown_name_does_not_resolve() {
        let checked = check_url("https://no-such-host.invalid/", false).expect("syntax is fine");
        assert!(matches!(resolve(&checked, false).await, Err(EgressError::Unresolved { .. })));
    }

    #[test]
    fn every_resolved_address_is_checked_and_http_reaches_only_loopback() {
        let addr = |s: &str| -> SocketAddr { s.parse().expect("socket address") };
        let (public, loopback, private) = (addr("93.184.215.14:443"), addr("127.0.0.1:443"), addr("10.0.0.5:443"));
        assert_eq!(vet_all(&[public], false, false), Ok(()));
        assert_eq!(vet_all(&[loopback, addr("[::1]:443")], true, true), Ok(()));
        // One inner address among public ones refuses the name: the
        // connection might be made to it.
        assert!(matches!(
            vet_all(&[public, private], false, true),
            Err(EgressError::Forbidden { range: "private", .. })
        ));
        assert!(matches!(vet_all(&[public, loopback], false, false), Err(EgressError::Forbidden { .. })));
        assert_eq!(vet_all(&[public, loopback], false, true), Ok(()));
        // http to a name that also resolves outside the machine is refused.
        assert_eq!(vet_all(&[loopback, public], true, true), Err(EgressError::Scheme("http".into())));
        assert!(vet_all(&[addr("[::ffff:169.254.169.254]:80")], false, true).is_err());
    }
}

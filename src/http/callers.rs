//! Who is calling, as the gateway's fair share needs it: the token's
//! verdict and the client's address. The address is the peer's, unless the
//! peer is a trusted proxy (`STOCKGUARD_TRUSTED_PROXIES`): then it is the
//! last address in `X-Forwarded-For` that is not a trusted proxy, the one
//! the first proxy of ours saw. Addresses left of it are whatever the client
//! wrote, so they are never believed.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use axum::{
    Extension,
    extract::ConnectInfo,
    http::{HeaderMap, header},
};
use ipnet::IpNet;

use super::Http;
use crate::gateway::Caller;

/// The peer of a request, as the server loop records it (`server.rs`).
pub(super) type Peer = Option<Extension<ConnectInfo<SocketAddr>>>;

/// The caller of a request with `headers` from `peer`, its token read from
/// `authorization` (a websocket may carry it in `connection_init` instead).
pub(super) fn caller(http: &Http, headers: &HeaderMap, peer: &Peer, authorization: Option<&str>) -> Caller {
    Caller { viewer: http.app.keys.viewer(authorization), address: address(http, headers, peer) }
}

/// The client address of a request with `headers` from `peer`.
pub(super) fn address(http: &Http, headers: &HeaderMap, peer: &Peer) -> IpAddr {
    // Without a recorded peer (a router driven by hand), every such request
    // is one caller: the unspecified address.
    let peer = peer.as_ref().map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |Extension(ConnectInfo(peer))| peer.ip());
    let forwarded = headers.get_all("x-forwarded-for").iter().filter_map(|value| value.to_str().ok());
    client_address(peer, forwarded, &http.app.limits.trusted_proxies)
}

/// The authorization header's value, if it is text.
pub(super) fn authorization(headers: &HeaderMap) -> Option<&str> {
    headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok())
}

/// The client behind `peer`: walking `X-Forwarded-For` (every header line,
/// in order) from the right while the hop is trusted, the first untrusted
/// address. A trusted peer with no usable header is the client itself.
fn client_address<'a>(peer: IpAddr, forwarded: impl Iterator<Item = &'a str>, trusted: &[IpNet]) -> IpAddr {
    let is_trusted = |address: &IpAddr| trusted.iter().any(|net| net.contains(address));
    if !is_trusted(&peer) {
        return peer;
    }
    let hops: Vec<&str> = forwarded.flat_map(|line| line.split(',')).collect();
    let mut client = peer;
    for hop in hops.iter().rev() {
        let Ok(address) = hop.trim().parse::<IpAddr>() else {
            // Not an address (a port, `unknown`, garbage): stop believing here.
            break;
        };
        client = address;
        if !is_trusted(&address) {
            break;
        }
    }
    client
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().expect("an address")
    }

    fn net(text: &str) -> IpNet {
        text.parse().expect("a network")
    }

    #[test]
    fn forwarded_for_counts_only_from_a_trusted_proxy() {
        let peer = ip("10.0.0.2");
        let header = ["203.0.113.9"];
        assert_eq!(client_address(peer, header.into_iter(), &[]), peer, "nothing trusted by default");
        assert_eq!(client_address(peer, header.into_iter(), &[net("192.168.0.0/16")]), peer);
        assert_eq!(client_address(peer, header.into_iter(), &[net("10.0.0.0/8")]), ip("203.0.113.9"));
    }

    #[test]
    fn a_client_cannot_pick_its_address_by_writing_the_header_itself() {
        let trusted = [net("10.0.0.0/8")];
        // The client wrote `1.2.3.4`; our proxy appended the address it saw.
        let lines = ["1.2.3.4, 198.51.100.7", "10.0.0.3"];
        assert_eq!(client_address(ip("10.0.0.2"), lines.into_iter(), &trusted), ip("198.51.100.7"));
        assert_eq!(client_address(ip("10.0.0.2"), ["garbage"].into_iter(), &trusted), ip("10.0.0.2"));
        assert_eq!(client_address(ip("10.0.0.2"), std::iter::empty(), &trusted), ip("10.0.0.2"));
    }
}

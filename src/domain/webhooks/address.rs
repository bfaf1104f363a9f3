//! Where a webhook may post: the outside only. A URL whose host is, or resolves to, an address of this
//! host or of a network it sits in (loopback, private, shared/CGNAT, link-local, unique-local, multicast,
//! unspecified, broadcast and reserved, and those written as IPv4-mapped, IPv4-compatible, NAT64 or 6to4
//! IPv6 addresses) is refused, unless the operator lists that network in
//! `BERTH_WEBHOOK_ALLOWED_NETWORKS`. The check runs when a subscription is made or changed, and again on
//! every connection: the client resolves names with [`CheckedResolver`], which checks every address of
//! the answer and hands the connector only those it checked, so a name that answers differently later
//! (DNS rebinding) is caught at that connection. Literal addresses are checked before each post.
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;

use ipnet::IpNet;

/// Why an address is not one berth posts to by default; `None`: a public address.
pub fn inside(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => inside_v4(v4),
        IpAddr::V6(v6) => inside_v6(v6),
    }
}

fn inside_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "the unspecified address or \"this network\" (0.0.0.0/8)",
        (127, _, _) => "loopback",
        (10, _, _) => "private (10.0.0.0/8)",
        (172, 16..=31, _) => "private (172.16.0.0/12)",
        (192, 168, _) => "private (192.168.0.0/16)",
        (100, 64..=127, _) => "shared address space (100.64.0.0/10, CGNAT)",
        (169, 254, _) => "link-local (169.254.0.0/16, cloud metadata)",
        (192, 0, 0) => "IETF protocol assignments (192.0.0.0/24)",
        (198, 18..=19, _) => "benchmarking (198.18.0.0/15)",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved or broadcast (240.0.0.0/4)",
        _ => return None,
    })
}

fn inside_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = embedded_v4(ip) {
        return inside_v4(v4);
    }
    let s = ip.segments();
    Some(if ip.is_unspecified() {
        "the unspecified address (::)"
    } else if ip.is_loopback() {
        "loopback"
    } else if s[0] & 0xfe00 == 0xfc00 {
        "unique-local (fc00::/7)"
    } else if s[0] & 0xffc0 == 0xfe80 {
        "link-local (fe80::/10)"
    } else if s[0] & 0xffc0 == 0xfec0 {
        "site-local (fec0::/10)"
    } else if s[0] & 0xff00 == 0xff00 {
        "multicast"
    } else {
        return None;
    })
}

/// The IPv4 address an IPv6 one stands for: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`), NAT64 (`64:ff9b::a.b.c.d`) and 6to4 (`2002:AABB:CCDD::`).
fn embedded_v4(ip: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = ip.segments();
    let low = Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    match s {
        [0, 0, 0, 0, 0, 0xffff, _, _] => Some(low),
        // `::` and `::1` are IPv6's own; other `::a.b.c.d` are IPv4-compatible.
        [0, 0, 0, 0, 0, 0, hi, lo] if hi != 0 || lo > 1 => Some(low),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(low),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new((hi >> 8) as u8, hi as u8, (lo >> 8) as u8, lo as u8)),
        _ => None,
    }
}

/// Whether berth posts to `ip`: a public address, or one in a network the operator allows (an
/// IPv4-mapped address also when its IPv4 address is in one).
pub fn refusal(ip: IpAddr, allowed: &[IpNet]) -> Option<String> {
    let why = inside(ip)?;
    let v4 = match ip {
        IpAddr::V6(v6) => embedded_v4(v6).map(IpAddr::V4),
        IpAddr::V4(_) => None,
    };
    if allowed
        .iter()
        .any(|net| net.contains(&ip) || v4.is_some_and(|v4| net.contains(&v4)))
    {
        return None;
    }
    Some(format!(
        "{ip} is {why}: webhooks post to public addresses only (BERTH_WEBHOOK_ALLOWED_NETWORKS lists networks allowed besides)"
    ))
}

/// Every address of an answer, checked: all of them when each is allowed, else why not (one refused
/// address refuses the name, so that a connector never falls back to it).
pub fn checked(addrs: Vec<SocketAddr>, allowed: &[IpNet]) -> Result<Vec<SocketAddr>, String> {
    if addrs.is_empty() {
        return Err("the name has no address".into());
    }
    for a in &addrs {
        if let Some(why) = refusal(a.ip(), allowed) {
            return Err(why);
        }
    }
    Ok(addrs)
}

/// The host of a URL as an address, when it is written as one.
pub fn literal(url: &reqwest::Url) -> Option<IpAddr> {
    match url.host()? {
        url::Host::Ipv4(ip) => Some(IpAddr::V4(ip)),
        url::Host::Ipv6(ip) => Some(IpAddr::V6(ip)),
        url::Host::Domain(_) => None,
    }
}

type Lookup =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = std::io::Result<Vec<SocketAddr>>> + Send>> + Send + Sync>;

/// A name's addresses from the system resolver.
fn system_lookup() -> Lookup {
    Arc::new(|name: String| Box::pin(async move { Ok(tokio::net::lookup_host((name.as_str(), 0)).await?.collect()) }))
}

/// The client's resolver: each answer checked, every address of it, and only checked addresses returned
/// to the connector (which connects to nothing else).
#[derive(Clone)]
pub struct CheckedResolver {
    lookup: Lookup,
    allowed: Arc<Vec<IpNet>>,
}

impl CheckedResolver {
    pub fn new(allowed: Vec<IpNet>) -> CheckedResolver {
        CheckedResolver {
            lookup: system_lookup(),
            allowed: Arc::new(allowed),
        }
    }

    /// Resolves one name, checked; what the connector then gets.
    pub async fn resolve_checked(&self, name: &str) -> Result<Vec<SocketAddr>, String> {
        let addrs = (self.lookup)(name.to_string())
            .await
            .map_err(|e| format!("could not resolve {name}: {e}"))?;
        checked(addrs, &self.allowed).map_err(|why| format!("{name}: {why}"))
    }
}

/// A refusal as the error reqwest carries to the attempt (`could not post: ...: <why>`).
#[derive(Debug)]
struct Refused(String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl reqwest::dns::Resolve for CheckedResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let me = self.clone();
        Box::pin(async move {
            let addrs = me.resolve_checked(name.as_str()).await.map_err(Refused)?;
            let addrs: reqwest::dns::Addrs = Box::new(addrs.into_iter());
            Ok(addrs)
        })
    }
}

/// The HTTP client of webhooks: no proxy (berth connects to the address it checked, itself), no
/// redirects (a redirect is the receiver's answer, not a place to post again), names resolved checked.
pub fn client(resolver: CheckedResolver) -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .dns_resolver(Arc::new(resolver))
        .user_agent(concat!("berth/", env!("CARGO_PKG_VERSION"), " (webhooks)"))
        .build()
        .expect("an HTTP client")
}

/// At creation and change: a literal address is checked; a name is resolved now and every address
/// checked (it is checked again at every connection). A name that does not resolve now is taken: its
/// deliveries fail until it does, and are checked then.
pub async fn check_url(url: &reqwest::Url, allowed: &[IpNet]) -> Result<(), String> {
    if let Some(ip) = literal(url) {
        return refusal(ip, allowed).map_or(Ok(()), Err);
    }
    let Some(name) = url.host_str() else {
        return Err("names no host".into());
    };
    let resolver = CheckedResolver {
        lookup: system_lookup(),
        allowed: Arc::new(allowed.to_vec()),
    };
    match (resolver.lookup)(name.to_string()).await {
        Ok(addrs) if !addrs.is_empty() => checked(addrs, allowed)
            .map(|_| ())
            .map_err(|why| format!("{name}: {why}")),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests;

//! The box's network: a network namespace of its own with only loopback, where berth binds one listener per
//! allowed endpoint (a socket stays in the namespace it was made in) and relays each connection it accepts
//! to the real endpoint from berth's own namespace. Nothing else answers in the box; names resolve (through
//! the box's own `/etc/hosts`) only to the listed endpoints. TLS passes through untouched.
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};

use std::sync::Arc;

use crate::ids::SessionId;
use crate::metrics::Metrics;

/// The box's `/etc/hosts` before any endpoint is named in it.
pub const LOOPBACK_HOSTS: &str = "127.0.0.1 localhost\n::1 localhost\n";

/// An endpoint a profile lists: `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    pub fn parse(text: &str) -> Result<Endpoint, String> {
        let (host, port) = text
            .rsplit_once(':')
            .ok_or_else(|| format!("endpoint {text:?} is not host:port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port: u16 = port
            .parse()
            .map_err(|_| format!("endpoint {text:?} has no valid port"))?;
        if host.is_empty() || port == 0 {
            return Err(format!("endpoint {text:?} is not host:port"));
        }
        if let Ok(ip) = host.parse::<IpAddr>()
            && !ip.is_loopback()
        {
            return Err(format!(
                "endpoint {text:?}: an address other than loopback cannot appear in the box; name it by host"
            ));
        }
        Ok(Endpoint {
            host: host.to_string(),
            port,
        })
    }

    /// Where the endpoint appears inside the box: its own loopback address, or one of 127.0.1.x for a name
    /// (the box's `/etc/hosts` maps the name to it).
    fn inside(&self, index: usize) -> IpAddr {
        match self.host.parse::<IpAddr>() {
            Ok(ip) => ip,
            Err(_) if self.host == "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
            Err(_) => IpAddr::V4(Ipv4Addr::new(127, 0, 1, (index % 250 + 1) as u8)),
        }
    }
}

/// A box's network namespace, its listeners and the hosts file that names them.
pub struct BoxNet {
    /// Entered by the box's first process before it execs `bwrap` (`setns`).
    pub namespace: OwnedFd,
    pub hosts: String,
    relays: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for BoxNet {
    fn drop(&mut self) {
        for relay in &self.relays {
            relay.abort();
        }
    }
}

/// Makes the namespace (on a thread of its own, which ends with it made: the namespace lives on in the
/// returned descriptor and the listeners) and starts one relay per endpoint.
/// Told the name an agent asked the box's resolver for (no listed endpoint has it): refused.
pub type OnRefused = Arc<dyn Fn(String) + Send + Sync>;

/// Where the box's `/etc/resolv.conf` points: berth answers every query there with a refusal and reports
/// the name asked for (a listed name never gets here: the hosts file has it).
pub const RESOLVER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 53);

pub fn create(
    endpoints: &[Endpoint],
    session_id: SessionId,
    metrics: Option<Arc<Metrics>>,
    on_refused: Option<OnRefused>,
) -> std::io::Result<BoxNet> {
    let wanted: Vec<SocketAddr> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| SocketAddr::new(e.inside(i), e.port))
        .collect();
    let (namespace, listeners, resolver) = std::thread::spawn(
        move || -> std::io::Result<(OwnedFd, Vec<TcpListener>, std::net::UdpSocket)> {
            // SAFETY: unshare on this thread only (a network namespace is per thread until exec).
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(std::io::Error::last_os_error());
            }
            loopback_up()?;
            let ns = std::fs::File::open("/proc/thread-self/ns/net")?;
            let listeners = wanted
                .iter()
                .map(TcpListener::bind)
                .collect::<std::io::Result<Vec<_>>>()?;
            let resolver = std::net::UdpSocket::bind((RESOLVER, 53))?;
            Ok((ns.into(), listeners, resolver))
        },
    )
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))??;
    let mut hosts = String::from(LOOPBACK_HOSTS);
    let mut relays = Vec::new();
    for (i, (endpoint, listener)) in endpoints.iter().zip(listeners).enumerate() {
        if endpoint.host.parse::<IpAddr>().is_err() && endpoint.host != "localhost" {
            hosts.push_str(&format!("{} {}\n", endpoint.inside(i), endpoint.host));
        }
        listener.set_nonblocking(true)?;
        let listener = tokio::net::TcpListener::from_std(listener)?;
        relays.push(tokio::spawn(relay(
            listener,
            endpoint.clone(),
            session_id,
            metrics.clone(),
        )));
    }
    resolver.set_nonblocking(true)?;
    let resolver = tokio::net::UdpSocket::from_std(resolver)?;
    relays.push(tokio::spawn(refuse_names(resolver, metrics, on_refused)));
    Ok(BoxNet {
        namespace,
        hosts,
        relays,
    })
}

async fn relay(listener: tokio::net::TcpListener, to: Endpoint, session_id: SessionId, metrics: Option<Arc<Metrics>>) {
    let count = move |decision| {
        if let Some(m) = &metrics {
            m.agent_egress(decision);
        }
    };
    loop {
        let Ok((mut inside, _)) = listener.accept().await else {
            // Out of descriptors, most likely: try again a moment later rather than spin.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let to = to.clone();
        let count = count.clone();
        tokio::spawn(async move {
            // Connected from berth's namespace: the real endpoint, as berth resolves it.
            match tokio::net::TcpStream::connect((to.host.as_str(), to.port)).await {
                Ok(mut outside) => {
                    count("allowed");
                    let _ = tokio::io::copy_bidirectional(&mut inside, &mut outside).await;
                }
                Err(e) => {
                    count("unreachable");
                    tracing::warn!(session = %session_id, endpoint = %format!("{}:{}", to.host, to.port), error = %e,
                        "an allowed endpoint did not answer");
                }
            }
        });
    }
}

/// The box's resolver: every query is answered `REFUSED` at once (so the agent fails fast), counted, and
/// each name reported the first time it is asked.
async fn refuse_names(socket: tokio::net::UdpSocket, metrics: Option<Arc<Metrics>>, on_refused: Option<OnRefused>) {
    let mut seen = std::collections::HashSet::new();
    let mut buf = [0u8; 512];
    loop {
        let Ok((n, from)) = socket.recv_from(&mut buf).await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let Some((name, answer)) = refusal(&buf[..n]) else {
            continue;
        };
        let _ = socket.send_to(&answer, from).await;
        if let Some(m) = &metrics {
            m.agent_egress("refused");
        }
        // At most 256 distinct names reported per agent: a loop over random names is counted, not logged.
        if seen.len() < 256
            && seen.insert(name.clone())
            && let Some(report) = &on_refused
        {
            report(name);
        }
    }
}

/// The name a DNS query asks for, and the `REFUSED` answer to it (the query's header and question, with
/// the response bit and rcode 5).
fn refusal(query: &[u8]) -> Option<(String, Vec<u8>)> {
    if query.len() < 12 || query[2] & 0x80 != 0 {
        return None;
    }
    let mut labels = Vec::new();
    let mut at = 12;
    loop {
        let len = *query.get(at)? as usize;
        at += 1;
        if len == 0 {
            break;
        }
        if len > 63 {
            return None;
        }
        labels.push(String::from_utf8_lossy(query.get(at..at + len)?).into_owned());
        at += len;
    }
    let question_end = at + 4;
    query.get(..question_end)?;
    let mut answer = query[..question_end].to_vec();
    answer[2] = 0x80 | (query[2] & 0x79); // QR, the opcode and RD as asked
    answer[3] = 0x05; // REFUSED
    answer[6..12].fill(0); // no answers, authorities or additionals
    answer[4..6].copy_from_slice(&[0, 1]);
    Some((labels.join("."), answer))
}

/// Brings `lo` up in the calling thread's network namespace (SIOCSIFFLAGS, as `ip link set lo up` does).
fn loopback_up() -> std::io::Result<()> {
    // SAFETY: a plain datagram socket for the ioctl, closed by OwnedFd; `ifreq` is zeroed then filled.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let sock = <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd);
        let mut req: libc::ifreq = std::mem::zeroed();
        for (i, b) in b"lo\0".iter().enumerate() {
            req.ifr_name[i] = *b as libc::c_char;
        }
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn a_query_is_refused_and_its_name_read() {
        // id 0x1234, RD, one question: example.com A IN.
        let mut q = vec![0x12, 0x34, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0];
        q.extend(b"\x07example\x03com\x00\x00\x01\x00\x01");
        let (name, answer) = super::refusal(&q).unwrap();
        assert_eq!(name, "example.com");
        assert_eq!(&answer[..4], &[0x12, 0x34, 0x81, 0x05]);
        assert_eq!(answer.len(), q.len());
        assert!(super::refusal(&answer).is_none(), "an answer is not a query");
    }

    #[test]
    fn endpoints_are_host_and_port_and_never_a_remote_address() {
        assert_eq!(
            Endpoint::parse("api.anthropic.com:443").unwrap(),
            Endpoint {
                host: "api.anthropic.com".into(),
                port: 443
            }
        );
        assert!(Endpoint::parse("127.0.0.1:8080").is_ok());
        assert!(Endpoint::parse("[::1]:8080").is_ok());
        assert!(Endpoint::parse("169.254.169.254:80").is_err());
        assert!(Endpoint::parse("example.com").is_err());
        assert!(Endpoint::parse("example.com:0").is_err());
    }
}

//! The box's network: a network namespace of its own with only loopback, where berth binds one listener per
//! allowed endpoint (a socket stays in the namespace it was made in) and relays each connection it accepts
//! to the real endpoint from berth's own namespace. Nothing else answers in the box; names resolve (through
//! the box's own `/etc/hosts`) only to the listed endpoints. TLS passes through untouched.
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, OwnedFd};

use std::sync::Arc;

use crate::ids::SessionId;
use crate::metrics::Metrics;

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
pub fn create(endpoints: &[Endpoint], session_id: SessionId, metrics: Option<Arc<Metrics>>) -> std::io::Result<BoxNet> {
    let wanted: Vec<SocketAddr> = endpoints
        .iter()
        .enumerate()
        .map(|(i, e)| SocketAddr::new(e.inside(i), e.port))
        .collect();
    let (namespace, listeners) = std::thread::spawn(move || -> std::io::Result<(OwnedFd, Vec<TcpListener>)> {
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
        Ok((ns.into(), listeners))
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))??;
    let mut hosts = String::from("127.0.0.1 localhost\n::1 localhost\n");
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

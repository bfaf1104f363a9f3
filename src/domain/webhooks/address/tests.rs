use super::*;
use std::sync::atomic::{AtomicUsize, Ordering};

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn nets(s: &[&str]) -> Vec<IpNet> {
    s.iter().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn every_inside_class_is_refused_and_public_addresses_are_not() {
    for refused in [
        "127.0.0.1",
        "127.255.0.9",
        "0.0.0.0",
        "0.1.2.3",
        "10.1.2.3",
        "172.16.0.1",
        "172.31.255.255",
        "192.168.1.1",
        "100.64.0.1",
        "100.127.255.254",
        "169.254.169.254",
        "224.0.0.1",
        "239.255.255.250",
        "255.255.255.255",
        "240.0.0.1",
        "::",
        "::1",
        "fc00::1",
        "fd12:3456::1",
        "fe80::1",
        "ff02::1",
        "::ffff:127.0.0.1",
        "::ffff:169.254.169.254",
        "::ffff:10.0.0.1",
        "::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "2002:7f00:1::",
    ] {
        assert!(inside(ip(refused)).is_some(), "{refused} is refused");
        assert!(refusal(ip(refused), &[]).is_some(), "{refused} is refused");
    }
    for public in [
        "8.8.8.8",
        "1.1.1.1",
        "172.15.255.255",
        "172.32.0.1",
        "100.63.255.255",
        "100.128.0.1",
        "2606:4700:4700::1111",
        "::ffff:8.8.8.8",
    ] {
        assert_eq!(inside(ip(public)), None, "{public} is public");
    }
}

#[test]
fn a_listed_network_is_allowed_also_in_its_mapped_form() {
    let loopback = nets(&["127.0.0.0/8", "::1/128"]);
    assert_eq!(refusal(ip("127.0.0.1"), &loopback), None);
    assert_eq!(refusal(ip("::1"), &loopback), None);
    assert_eq!(refusal(ip("::ffff:127.0.0.1"), &loopback), None);
    assert!(refusal(ip("10.0.0.1"), &loopback).is_some());
    assert!(refusal(ip("169.254.169.254"), &loopback).is_some());
}

#[test]
fn one_refused_address_refuses_the_whole_answer() {
    let a: SocketAddr = "8.8.8.8:443".parse().unwrap();
    let b: SocketAddr = "127.0.0.1:443".parse().unwrap();
    assert_eq!(checked(vec![a], &[]).unwrap(), vec![a]);
    assert!(checked(vec![a, b], &[]).unwrap_err().contains("loopback"));
    assert!(checked(vec![], &[]).is_err());
}

/// A resolver whose name answers `first` once, then `then` (a rebinding name).
fn rebinding(first: SocketAddr, then: SocketAddr, allowed: Vec<IpNet>) -> (CheckedResolver, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let lookup: Lookup = Arc::new(move |_name: String| {
        let n = counted.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move { Ok(vec![if n == 0 { first } else { then }]) })
    });
    let r = CheckedResolver {
        lookup,
        allowed: Arc::new(allowed),
    };
    (r, calls)
}

#[tokio::test]
async fn every_resolution_is_checked_and_only_checked_addresses_are_connected() {
    // A receiver on loopback that answers 204 to whatever connects, counting the connections.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let local = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            counter.fetch_add(1, Ordering::SeqCst);
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let _ = s
                .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                .await;
        }
    });
    let url = format!("http://rebind.test:{}/hook", local.port());
    let public: SocketAddr = "192.0.2.1:9".parse().unwrap(); // TEST-NET-1: public as far as berth knows

    // The name answers a public address first and loopback next: the second answer is refused at
    // its own connection, and nothing connects to loopback.
    let (r, calls) = rebinding(public, local, vec![]);
    assert!(r.resolve_checked("rebind.test").await.is_ok());
    let err = r.resolve_checked("rebind.test").await.unwrap_err();
    assert!(err.contains("loopback"), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "each resolution looked up anew");
    let (r, _) = rebinding(local, local, vec![]);
    let sent = client(r).post(&url).body("{}").send().await;
    let err = crate::error::with_causes(&sent.expect_err("refused"));
    assert!(err.contains("loopback"), "{err}");
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "nothing connected");

    // With loopback listed, the checked address is the one connected.
    let (r, _) = rebinding(local, local, nets(&["127.0.0.0/8"]));
    let sent = client(r).post(&url).body("{}").send().await.expect("posted");
    assert_eq!(sent.status(), 204);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
}

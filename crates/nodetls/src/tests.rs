use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant, SystemTime};

use super::*;

type Binding = [u8; CHANNEL_BINDING_BYTES];

/// A node serving one TLS connection on 127.0.0.1 with `server`, echoing a message back; the
/// bindings of the node's end and of `client`'s (which checked the echo), or their errors.
fn handshake(server: Arc<ServerConfig>, client: &Arc<ClientConfig>) -> (io::Result<Binding>, io::Result<Binding>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let node = std::thread::spawn(move || {
        let (tcp, _) = listener.accept().unwrap();
        let (mut stream, binding) = Stream::accept(tcp, &server, Instant::now() + Duration::from_secs(10))?;
        // Echo a chunk-sized message: more than one TLS record.
        let mut buf = vec![0u8; 100_000];
        stream.read_exact(&mut buf)?;
        stream.write_all(&buf)?;
        stream.flush()?;
        Ok(binding)
    });
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let client_end = Stream::connect(tcp, client).and_then(|(mut stream, binding)| {
        assert!(stream.is_tls());
        let sent: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
        stream.write_all(&sent)?;
        let mut back = vec![0u8; sent.len()];
        stream.read_exact(&mut back)?;
        assert_eq!(back, sent);
        Ok(binding)
    });
    (node.join().unwrap(), client_end)
}

#[test]
fn a_client_trusting_the_cluster_ca_talks_to_a_node_and_both_ends_share_one_binding() {
    let ca = ClusterCa::generate().unwrap();
    let server = server_config(&ca, SystemTime::now()).unwrap();
    let (node, client) = handshake(server, &client_config(ca.cert_pem()).unwrap());
    assert_eq!(node.unwrap(), client.unwrap());
}

#[test]
fn every_connection_has_its_own_binding() {
    let ca = ClusterCa::generate().unwrap();
    let server = server_config(&ca, SystemTime::now()).unwrap();
    let client = client_config(ca.cert_pem()).unwrap();
    let (_, first) = handshake(Arc::clone(&server), &client);
    let (_, second) = handshake(server, &client);
    assert_ne!(first.unwrap(), second.unwrap());
}

#[test]
fn a_node_of_another_cluster_ca_is_refused() {
    let ours = ClusterCa::generate().unwrap();
    let theirs = ClusterCa::generate().unwrap();
    let (_, client) =
        handshake(server_config(&theirs, SystemTime::now()).unwrap(), &client_config(ours.cert_pem()).unwrap());
    let error = client.unwrap_err().to_string();
    assert!(error.contains("UnknownIssuer") || error.contains("unknown issuer"), "{error}");
}

#[test]
fn a_bootstrapping_client_accepts_any_node_certificate() {
    let ca = ClusterCa::generate().unwrap();
    let (node, client) = handshake(server_config(&ca, SystemTime::now()).unwrap(), &bootstrap_client_config());
    assert_eq!(node.unwrap(), client.unwrap());
}

#[test]
fn the_ca_must_be_valid_now() {
    let ca = ClusterCa::generate().unwrap();
    let year = Duration::from_secs(365 * 24 * 3600);
    assert!(ca.check(SystemTime::now()).unwrap() > SystemTime::now() + 19 * year);
    let later = SystemTime::now() + 21 * year;
    assert!(matches!(ca.check(later), Err(Error::CaExpired(_))));
    assert!(matches!(server_config(&ca, later), Err(Error::CaExpired(_))));
    let earlier = SystemTime::now() - Duration::from_secs(2 * 3600);
    let error = server_config(&ca, earlier).unwrap_err();
    assert!(matches!(error, Error::CaNotYetValid(_)), "{error}");
    assert!(error.to_string().contains("clock"), "{error}");
}

#[test]
fn a_ca_key_that_is_not_the_certificates_is_refused() {
    let one = ClusterCa::generate().unwrap();
    let other = ClusterCa::generate().unwrap();
    let mixed = ClusterCa::from_pem(one.cert_pem().to_owned(), other.key_pem().to_owned());
    assert!(matches!(mixed.check(SystemTime::now()), Err(Error::CaMismatch)));
    let garbage = ClusterCa::from_pem("not a certificate".into(), one.key_pem().to_owned());
    assert!(matches!(garbage.check(SystemTime::now()), Err(Error::BadCaCert(_))));
    let no_key = ClusterCa::from_pem(one.cert_pem().to_owned(), "no key".into());
    assert!(matches!(no_key.check(SystemTime::now()), Err(Error::BadCaKey(_))));
}

#[test]
fn debug_never_shows_the_ca_key() {
    let ca = ClusterCa::generate().unwrap();
    let shown = format!("{ca:?}");
    assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    assert!(shown.contains("BEGIN CERTIFICATE"));
}

#[test]
fn a_plain_node_fails_a_tls_client_at_once() {
    // A plain node speaks first (its Challenge): a TLS client reads that as a broken record.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let node = std::thread::spawn(move || {
        let (mut tcp, _) = listener.accept().unwrap();
        let _ = tcp.write_all(b"TSR1\x01\x00\x00\x00\x10\x00\x00\x00");
        std::thread::sleep(Duration::from_millis(200));
    });
    let tcp = TcpStream::connect(addr).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let error = Stream::connect(tcp, &bootstrap_client_config()).unwrap_err();
    // Refused for what it read, not after the read timeout.
    assert_eq!(error.kind(), io::ErrorKind::InvalidData, "{error}");
    node.join().unwrap();
}

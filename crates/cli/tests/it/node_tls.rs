//! The node protocol over TLS (`init --node-tls`): clients, the CLI and peers work through it,
//! no object byte crosses the wire in the clear, a relay that terminates TLS is refused even by
//! a bootstrapping client (channel binding), an unusable cluster CA stops a node at start with
//! one line, and `init` turns it on by default for nodes on other hosts.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::harness::{Cluster, Shape, TESSERA, block_on, write_file};

/// A TCP relay in front of `target` that records every byte it passes, both ways.
struct Relay {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<u8>>>,
}

impl Relay {
    fn new(target: SocketAddr) -> Self {
        Self::with_pace(target, None)
    }

    /// With `pace`, bytes toward the node pass 4 KiB at a time with that pause after each: a
    /// slow link, whose socket buffers fill while the client writes.
    fn with_pace(target: SocketAddr, pace: Option<Duration>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let recorder = Arc::clone(&seen);
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let Ok(node) = TcpStream::connect(target) else { continue };
                let directions = [(client.try_clone().unwrap(), node.try_clone().unwrap(), pace), (node, client, None)];
                for (mut from, mut to, pause) in directions {
                    let recorder = Arc::clone(&recorder);
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; if pause.is_some() { 4 << 10 } else { 64 << 10 }];
                        while let Ok(read @ 1..) = from.read(&mut buf) {
                            if let Some(pause) = pause {
                                std::thread::sleep(pause);
                            }
                            recorder.lock().unwrap().extend_from_slice(&buf[..read]);
                            if to.write_all(&buf[..read]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(std::net::Shutdown::Both);
                    });
                }
            }
        });
        Self { addr, seen }
    }

    fn seen(&self) -> Vec<u8> {
        self.seen.lock().unwrap().clone()
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

/// An object whose every 64-byte run is readable text: any chunk of it on the wire in the clear
/// shows `MARKER`.
const MARKER: &[u8] = b"tessera-plaintext-marker-";

fn marked_object() -> Vec<u8> {
    let line: Vec<u8> = [MARKER, b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNO\n"].concat();
    line.iter().copied().cycle().take(1_000_000).collect()
}

/// PUTs and GETs the marked object through relays in front of every node of `cluster`; what
/// the relays saw.
fn put_and_get_through_relays(cluster: &Cluster) -> Vec<u8> {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let relays: Vec<Relay> = map.nodes.iter().map(|node| Relay::new(node.addr)).collect();
    for (node, relay) in map.nodes.iter_mut().zip(&relays) {
        node.addr = relay.addr;
    }
    let client = client::Client::new(map, client::ClientOptions::default()).unwrap();
    let object = marked_object();
    block_on(async {
        client.put_bytes("bkt", "marked", &object, &Default::default()).await.unwrap();
        assert!(client.get("bkt", "marked").await.unwrap() == object);
    });
    let seen: Vec<u8> = relays.iter().flat_map(Relay::seen).collect();
    // The object went through the relays (its chunks, parity too, both ways).
    assert!(seen.len() > 2 * object.len(), "the relays passed {} bytes", seen.len());
    seen
}

#[test]
fn over_tls_no_object_byte_crosses_the_wire_in_the_clear() {
    let tls = Cluster::start(Shape { node_tls: true, ..Shape::default() });
    assert!(std::fs::read_to_string(&tls.config).unwrap().contains("[node_tls]"));
    tls.cli_ok(&["mb", "bkt"]);
    let seen = put_and_get_through_relays(&tls);
    assert!(!contains(&seen, MARKER), "object bytes crossed the wire in the clear");
    // The node protocol's own frames are inside TLS too.
    assert!(!contains(&seen, b"TSR1"), "a node-protocol frame header crossed the wire in the clear");
    // The same relays in front of a plain cluster see the object: the check above can fail.
    let plain = Cluster::start(Shape::default());
    plain.cli_ok(&["mb", "bkt"]);
    let seen = put_and_get_through_relays(&plain);
    assert!(contains(&seen, MARKER) && contains(&seen, b"TSR1"));
}

#[test]
fn writes_over_tls_finish_on_a_link_slower_than_the_client() {
    // Every write over TLS goes through rustls' buffers and the client flushes them after each
    // request; here a link slower than the client backs them up. (Loopback's socket buffers
    // are large enough that this passed without the flush too: the flush is for real links.)
    let cluster = Cluster::start(Shape { node_tls: true, chunk_size: "1MiB", ..Shape::default() });
    cluster.cli_ok(&["mb", "bkt"]);
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let relays: Vec<Relay> =
        map.nodes.iter().map(|node| Relay::with_pace(node.addr, Some(Duration::from_millis(1)))).collect();
    for (node, relay) in map.nodes.iter_mut().zip(&relays) {
        node.addr = relay.addr;
    }
    let options = client::ClientOptions { request_timeout: Duration::from_secs(20), ..Default::default() };
    let client = client::Client::new(map, options).unwrap();
    let object = crate::harness::payload(8 << 20, 3);
    block_on(async {
        client.put_bytes("bkt", "slow", &object, &Default::default()).await.unwrap();
        assert!(client.get("bkt", "slow").await.unwrap() == object);
    });
    // Every chunk went through the paced relays.
    let seen: usize = relays.iter().map(|relay| relay.seen().len()).sum();
    assert!(seen > object.len() * 3 / 2, "the relays passed {seen} bytes");
}

#[test]
fn peers_repair_over_tls_and_the_cli_works_through_it() {
    let mut cluster = Cluster::start(Shape { node_tls: true, ..Shape::default() });
    cluster.cli_ok(&["mb", "bkt"]);
    cluster.kill_node(2);
    let objects: Vec<(String, Vec<u8>)> =
        (0..4).map(|i| (format!("obj-{i}"), crate::harness::payload(150_000 + i * 70_001, i as u64))).collect();
    let client = cluster.client();
    block_on(async {
        for (key, data) in &objects {
            let info = client.put_bytes("bkt", key, data, &Default::default()).await.unwrap();
            assert_eq!(info.meta_positions.len(), 5, "written short of n: the fault happened");
        }
    });
    cluster.start_node(2);
    cluster.wait_ready();
    // Repair reads the other chunks from peers and writes n3's over node-to-node TLS.
    let keys: Vec<String> = objects.iter().map(|(key, _)| key.clone()).collect();
    crate::repair::wait_full_redundancy(&cluster, &keys);
    let status = cluster.cli_ok(&["status"]);
    assert!(status.contains("6 of 6 nodes up; node protocol over TLS"), "{status}");
    let path = write_file(cluster.dir.path(), "up.bin", b"through the CLI");
    cluster.cli_ok(&["put", path.to_str().unwrap(), "bkt/cli"]);
    let out = cluster.dir.path().join("down.bin");
    cluster.cli_ok(&["get", "bkt/cli", out.to_str().unwrap()]);
    assert_eq!(std::fs::read(out).unwrap(), b"through the CLI");
    // n3's chunks are real: with two other nodes down, reads need them.
    cluster.kill_node(0);
    cluster.kill_node(5);
    let reader = cluster.client();
    block_on(async {
        for (key, data) in &objects {
            assert!(reader.get("bkt", key).await.unwrap() == *data, "{key} after repair");
        }
    });
}

/// A relay that terminates TLS with a certificate of its own (another CA) and opens its own TLS
/// connection to `node`, passing the node protocol's bytes between the two: an attacker on the
/// path who has no cluster secret. How many bytes it passed from the node.
fn terminating_relay(node: SocketAddr, cluster_ca: &str) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let own = nodetls::ClusterCa::generate().unwrap();
    let server = nodetls::server_config(&own, std::time::SystemTime::now()).unwrap();
    let client = nodetls::client_config(cluster_ca).unwrap();
    let from_node = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&from_node);
    std::thread::spawn(move || {
        for tcp in listener.incoming() {
            let Ok(tcp) = tcp else { return };
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            let Ok((mut victim, _)) = nodetls::Stream::accept(tcp, &server, deadline) else { continue };
            let upstream = TcpStream::connect(node).unwrap();
            upstream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let (mut node, _) = nodetls::Stream::connect(upstream, &client).unwrap();
            // Short reads only once both handshakes are done: the loop below polls.
            node.tcp().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            victim.tcp().set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            // One thread, both directions, polling: the streams cannot be split.
            let mut buf = vec![0u8; 64 << 10];
            for _ in 0..200 {
                match node.read(&mut buf) {
                    Ok(0) => break,
                    Ok(read) => {
                        counter.fetch_add(read, Ordering::SeqCst);
                        if victim.write_all(&buf[..read]).and_then(|()| victim.flush()).is_err() {
                            break;
                        }
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
                match victim.read(&mut buf) {
                    Ok(0) => break,
                    Ok(read) => {
                        if node.write_all(&buf[..read]).and_then(|()| node.flush()).is_err() {
                            break;
                        }
                    }
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => break,
                }
            }
        }
    });
    (addr, from_node)
}

#[test]
fn a_bootstrapping_client_works_over_tls_and_refuses_a_relay_that_terminates_it() {
    let mut cluster = Cluster::start(Shape { node_tls: true, ..Shape::default() });
    cluster.allow_error("authentication failed");
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let ca = map.node_tls.as_ref().unwrap().ca_cert.clone();
    block_on(async {
        let client = client::Client::bootstrap(cluster.addrs[3], &map.secret, Default::default()).await.unwrap();
        assert!(client.map().node_tls.is_some(), "the fetched map has the CA");
        client.make_bucket("boot").await.unwrap();
        client.put_bytes("boot", "k", b"via a TLS bootstrap", &Default::default()).await.unwrap();
        assert_eq!(client.get("boot", "k").await.unwrap(), b"via a TLS bootstrap");
    });
    let (relay, from_node) = terminating_relay(cluster.addrs[1], &ca);
    let result = block_on(client::Client::bootstrap(relay, &map.secret, client::ClientOptions::default()));
    let error = result.expect_err("a bootstrap through a TLS-terminating relay must fail");
    // The relay passed the node's challenge on: the attack was tried, and the binding (two TLS
    // connections, two bindings) failed the handshake.
    assert!(from_node.load(Ordering::SeqCst) > 0, "the relay never reached the node");
    assert!(
        matches!(error, client::Error::AuthRejected { .. } | client::Error::NodeNotAuthenticated { .. }),
        "{error}"
    );
    // The node refused the relayed proof itself (not some other failure of the relay).
    cluster.wait_log(1, "authentication failed");
    // A client with the map checks the certificate itself: the relay's is from another CA.
    let (relay, _) = terminating_relay(cluster.addrs[1], &ca);
    let mut relayed = map.clone();
    relayed.nodes[1].addr = relay;
    let client = client::Client::new(relayed, client::ClientOptions::default()).unwrap();
    let status = block_on(client.cluster_status());
    let error = status.nodes[1].error.clone().expect("the relay's certificate must be refused");
    assert!(error.contains("UnknownIssuer") || error.contains("issuer"), "{error}");
    assert!(status.nodes[0].up, "the other nodes answer: {:?}", status.nodes[0].error);
}

#[test]
fn a_client_whose_map_has_tls_names_a_plain_node_at_once() {
    let cluster = Cluster::start(Shape::default());
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    let ca = nodetls::ClusterCa::generate().unwrap();
    map.node_tls = Some(cluster::NodeTls { ca_cert: ca.cert_pem().into(), ca_key: ca.key_pem().into() });
    let client = client::Client::new(map, client::ClientOptions::default()).unwrap();
    let status = block_on(client.cluster_status());
    let error = status.nodes[0].error.clone().expect("TLS to a plain node must fail");
    assert!(error.contains("answered in plain TCP"), "{error}");
}

/// `tessera node` with `cluster.toml` changed by `edit`: its exit and stderr. Fails the test if
/// the node is still running after 20 s (it should have refused to start).
fn start_node_with(cluster: &Cluster, edit: impl Fn(&mut cluster::ClusterMap)) -> (bool, String) {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let mut map = cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap();
    edit(&mut map);
    let path = write_file(&cluster.data_dir(), "edited.toml", map.to_toml().as_bytes());
    // As `init` writes it: it holds the secret (a node warns of a file others can read).
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let mut child = Command::new(TESSERA)
        .args(["node", "--config"])
        .arg(&path)
        .args(["--id", "n1"])
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("the node started with an unusable CA instead of refusing");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    child.stderr.take().unwrap().read_to_string(&mut stderr).unwrap();
    (status.success(), stderr.trim().to_owned())
}

#[test]
fn an_unusable_cluster_ca_stops_a_node_at_start_with_one_line() {
    let cluster = Cluster::init(Shape { node_tls: true, ..Shape::default() });
    let other = nodetls::ClusterCa::generate().unwrap();
    let (ok, stderr) = start_node_with(&cluster, |map| map.node_tls.as_mut().unwrap().ca_key = other.key_pem().into());
    assert!(!ok);
    assert!(stderr.contains("not its certificate's key"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let (ok, stderr) = start_node_with(&cluster, |map| map.node_tls.as_mut().unwrap().ca_cert = "garbage".into());
    assert!(!ok);
    assert!(stderr.contains("cluster CA certificate") && stderr.contains("unusable"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    // A CA tessera made ten years ago, expired yesterday.
    let day = Duration::from_secs(24 * 3600);
    let now = std::time::SystemTime::now();
    let expired = nodetls::ClusterCa::generate_valid(now - 3650 * day, now - day).unwrap();
    let (ok, stderr) = start_node_with(&cluster, |map| {
        map.node_tls = Some(cluster::NodeTls { ca_cert: expired.cert_pem().into(), ca_key: expired.key_pem().into() });
    });
    assert!(!ok);
    assert!(stderr.contains("cluster CA certificate expired"), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
}

#[test]
fn init_turns_node_tls_on_by_default_for_nodes_on_other_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let init = |data: &str, extra: &[&str]| {
        let output =
            Command::new(TESSERA).args(["init", "--data"]).arg(dir.path().join(data)).args(extra).output().unwrap();
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let text = std::fs::read_to_string(dir.path().join(data).join("cluster.toml")).unwrap();
        (text, String::from_utf8_lossy(&output.stderr).into_owned())
    };
    let hosts: Vec<String> = (1..=6).map(|i| format!("--node=192.0.2.{i}:7001")).collect();
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    let (text, _) = init("across", &hosts);
    assert!(text.contains("[node_tls]") && text.contains("BEGIN CERTIFICATE") && text.contains("PRIVATE KEY"));
    let (text, warning) = init("across-plain", &[&hosts[..], &["--node-tls", "off"]].concat());
    assert!(!text.contains("node_tls"));
    assert!(warning.contains("not encrypted"), "{warning}");
    let (text, _) = init("local", &["--nodes", "6"]);
    assert!(!text.contains("node_tls"), "a cluster on 127.0.0.1 is plain unless asked");
    let (text, _) = init("local-tls", &["--nodes", "6", "--base-port", "17101", "--node-tls", "on"]);
    assert!(text.contains("[node_tls]"));
}

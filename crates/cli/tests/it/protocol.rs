//! The node protocol against hostile peers: forged, replayed and damaged frames, impostor
//! nodes, floods of slow unauthenticated connections, and secrets that authenticate nothing.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use proto::{FRAME_HEADER_BYTES, FRAME_TAG_BYTES, FrameHeader, FrameKind, FrameMac, NONCE_BYTES, Request, Response};

use crate::harness::{Cluster, Shape, block_on, payload};

/// A hand-driven authenticated connection, to send what a real client never would.
pub(crate) struct RawSession {
    stream: TcpStream,
    outbound: FrameMac,
    inbound: FrameMac,
}

impl RawSession {
    pub(crate) fn open(addr: SocketAddr, secret: &str) -> Self {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let (_, body) = read_plain_frame(&mut stream);
        let challenge: proto::Challenge = proto::decode_message(&body, "challenge").unwrap();
        let client_nonce = [42u8; NONCE_BYTES];
        let auth =
            proto::AuthProof::new(secret, &challenge, client_nonce, &challenge.cluster_id, challenge.map_version, &[]);
        stream.write_all(&proto::encode_frame(FrameKind::Auth, &auth).unwrap()).unwrap();
        let (outbound, inbound) = proto::session_macs(secret, &auth.transcript(&challenge, &[]));
        let mut session = Self { stream, outbound, inbound };
        assert_eq!(session.read_response().unwrap(), Response::Ok);
        session
    }

    /// One request followed by raw bytes (a chunk write), one response.
    pub(crate) fn call_with_data(&mut self, request: &Request, data: &[u8]) -> Response {
        let frame = self.sealed(request);
        self.stream.write_all(&frame).unwrap();
        self.stream.write_all(data).unwrap();
        self.read_response().expect("the node answers")
    }

    /// One request, one response.
    pub(crate) fn call(&mut self, request: &Request) -> Response {
        let frame = self.sealed(request);
        self.stream.write_all(&frame).unwrap();
        self.read_response().expect("the node answers")
    }

    fn sealed(&mut self, request: &Request) -> Vec<u8> {
        proto::encode_sealed_frame(FrameKind::Request, request, &mut self.outbound).unwrap()
    }

    /// The next response, or `None` if the node closed the connection.
    fn read_response(&mut self) -> Option<Response> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header).ok()?;
        let decoded = FrameHeader::decode(&header).unwrap();
        let mut body = vec![0u8; decoded.body_len];
        self.stream.read_exact(&mut body).unwrap();
        let mut tag = [0u8; FRAME_TAG_BYTES];
        self.stream.read_exact(&mut tag).unwrap();
        self.inbound.open(&header, &body, &tag).expect("the node tags its frames");
        Some(proto::decode_response(&body).unwrap())
    }

    /// Whether the node closed the connection (EOF or reset) rather than answering.
    fn closed_by_node(&mut self) -> bool {
        let mut byte = [0u8; 1];
        matches!(self.stream.read(&mut byte), Ok(0) | Err(_))
    }
}

pub(crate) fn read_plain_frame(stream: &mut TcpStream) -> (FrameHeader, Vec<u8>) {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    stream.read_exact(&mut header).unwrap();
    let decoded = FrameHeader::decode(&header).unwrap();
    let mut body = vec![0u8; decoded.body_len];
    stream.read_exact(&mut body).unwrap();
    (decoded, body)
}

pub(crate) fn secret_of(cluster: &Cluster) -> String {
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    cluster::ClusterMap::from_toml(&text, &cluster.data_dir()).unwrap().secret
}

#[test]
fn forged_or_replayed_frames_on_an_authenticated_connection_close_it_and_change_nothing() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let secret = secret_of(&cluster);
    let request = Request::BucketCreate { bucket: "injected".into() };

    // A frame whose body was changed after it was tagged (what an injector on the path sends).
    let mut session = RawSession::open(cluster.addrs[0], &secret);
    let mut frame = session.sealed(&request);
    let last_body_byte = frame.len() - FRAME_TAG_BYTES - 1;
    frame[last_body_byte] ^= 0x20;
    session.stream.write_all(&frame).unwrap();
    assert!(session.closed_by_node(), "a forged frame must close the connection");

    // A frame tagged with a key derived from the wrong secret.
    let mut session = RawSession::open(cluster.addrs[0], &secret);
    let guess = proto::Challenge {
        protocol_version: proto::PROTOCOL_VERSION,
        nonce: [0; NONCE_BYTES],
        cluster_id: String::new(),
        map_version: 0,
    };
    let guessed = proto::AuthProof::new("not-the-cluster-secret", &guess, [42; NONCE_BYTES], "", 0, &[]);
    let (mut wrong, _) = proto::session_macs("not-the-cluster-secret", &guessed.transcript(&guess, &[]));
    let forged = proto::encode_sealed_frame(FrameKind::Request, &request, &mut wrong).unwrap();
    session.stream.write_all(&forged).unwrap();
    assert!(session.closed_by_node(), "a frame under another key must close the connection");

    // A genuine frame replayed: the first copy is served, the replay closes the connection.
    let mut session = RawSession::open(cluster.addrs[0], &secret);
    let frame = session.sealed(&Request::BucketList);
    session.stream.write_all(&frame).unwrap();
    assert!(matches!(session.read_response(), Some(Response::Buckets { .. })));
    session.stream.write_all(&frame).unwrap();
    assert!(session.closed_by_node(), "a replayed frame must close the connection");

    // The frame MAC is what was checked, and nothing was created.
    cluster.wait_log(0, "failed authentication");
    assert!(!cluster.cli_ok(&["ls"]).contains("injected"));
    assert!(cluster.cli_ok(&["ls"]).contains("bkt"));
}

#[test]
fn chunk_damaged_in_transit_is_refused_not_committed() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    let secret = secret_of(&cluster);
    let mut session = RawSession::open(cluster.addrs[0], &secret);
    let chunk = payload(100_000, 7);
    let block_bytes = 65_536u32;
    let mut crcs: Vec<u32> = chunk.chunks(block_bytes as usize).map(crc32c_of).collect();
    let version = proto::VersionId { unix_ns: 1, writer: 2 };
    let write = |crcs: Vec<u32>| Request::ChunkWrite {
        drive: 0,
        bucket: "bkt".into(),
        version,
        offset: 0,
        len: chunk.len() as u32,
        block_bytes,
        crcs,
        staging: proto::Staging::Write,
    };
    // The bytes arrive with one bit flipped in their second block.
    let mut damaged = chunk.clone();
    damaged[70_000] ^= 0x04;
    let frame = session.sealed(&write(crcs.clone()));
    session.stream.write_all(&frame).unwrap();
    session.stream.write_all(&damaged).unwrap();
    match session.read_response() {
        Some(Response::Error { kind: proto::ErrorKind::ChecksumMismatch, message }) => {
            assert!(message.contains("block 1"), "{message}")
        }
        other => panic!("a damaged chunk must be refused, got {other:?}"),
    }
    let staging = cluster.drive_dir(0, 0).join("tmp").join(version.to_hex());
    assert!(!staging.exists(), "nothing of the damaged chunk was written");
    // The same chunk intact is accepted on the same connection.
    let frame = session.sealed(&write(crcs.clone()));
    session.stream.write_all(&frame).unwrap();
    session.stream.write_all(&chunk).unwrap();
    assert_eq!(session.read_response(), Some(Response::Ok));
    assert!(staging.exists());
    // Checksums that do not match the length are refused by the decoder.
    crcs.pop();
    let frame = session.sealed(&write(crcs));
    session.stream.write_all(&frame).unwrap();
    assert!(session.closed_by_node(), "a malformed chunk write closes the connection");
}

pub(crate) fn crc32c_of(block: &[u8]) -> u32 {
    // The test cannot name the crc32c crate (not a dev-dependency); CRC-32C bit by bit.
    let mut crc = !0u32;
    for &byte in block {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn client_refuses_a_node_that_cannot_prove_it_knows_the_secret() {
    // An impostor: speaks the handshake, accepts any proof, answers without a valid tag.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let impostor = std::thread::spawn(move || {
        let challenge = proto::Challenge {
            protocol_version: proto::PROTOCOL_VERSION,
            nonce: [1; NONCE_BYTES],
            cluster_id: "impostor".into(),
            map_version: 1,
        };
        // A bootstrapping client tries TLS first (a TLS record, 0x16), then, hearing plain
        // text, asks again in plain TCP.
        let mut stream = loop {
            let (mut stream, _) = listener.accept().unwrap();
            stream.write_all(&proto::encode_frame(FrameKind::Challenge, &challenge).unwrap()).unwrap();
            let mut first = [0u8; 1];
            if stream.peek(&mut first).unwrap() == 1 && first[0] != 0x16 {
                break stream;
            }
        };
        let (_, body) = read_plain_frame(&mut stream);
        let auth: proto::AuthProof = proto::decode_message(&body, "authentication").unwrap();
        let (_, mut guessed) = proto::session_macs("a-guess-at-the-secret", &auth.transcript(&challenge, &[]));
        let ok = proto::encode_sealed_frame(FrameKind::Response, &Response::Ok, &mut guessed).unwrap();
        stream.write_all(&ok).unwrap();
        let mut rest = Vec::new();
        let _ = stream.read_to_end(&mut rest);
    });
    let result = block_on(client::Client::bootstrap(addr, "the-real-cluster-secret", client::ClientOptions::default()));
    let err = result.expect_err("an impostor node must be refused");
    assert!(matches!(err, client::Error::NodeNotAuthenticated { .. }), "{err}");
    assert!(err.to_string().contains("could not prove it knows the cluster secret"), "{err}");
    impostor.join().unwrap();
}

/// Unauthenticated connections that send one byte at a time.
struct Drip {
    streams: Vec<TcpStream>,
}

impl Drip {
    fn open(addr: SocketAddr, count: usize) -> Self {
        let streams = (0..count)
            .filter_map(|_| TcpStream::connect(addr).ok())
            .inspect(|s| s.set_nonblocking(true).unwrap())
            .collect();
        Self { streams }
    }

    /// Sends one more byte of a plausible Auth header on each; returns how many the node has
    /// closed so far (a write fails or a read sees EOF).
    fn step(&mut self, step: usize) -> usize {
        let header = FrameHeader::new(FrameKind::Auth, 100).unwrap().encode();
        let mut closed = 0;
        for stream in &mut self.streams {
            let byte = [header[step % FRAME_HEADER_BYTES]];
            let mut sink = [0u8; 256];
            let eof = loop {
                match stream.read(&mut sink) {
                    Ok(0) => break true,
                    Ok(_) => continue,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
            if eof || stream.write(&byte).is_err() {
                closed += 1;
            }
        }
        closed
    }
}

#[test]
fn slow_unauthenticated_connections_never_lock_clients_out() {
    let cluster = Cluster::start(Shape::default());
    cluster.cli_ok(&["mb", "bkt"]);
    // Far more slow peers than pending handshakes are allowed, on every node.
    let per_node = 2 * node::PENDING_HANDSHAKES_MAX;
    let mut drips: Vec<Drip> = cluster.addrs.iter().map(|addr| Drip::open(*addr, per_node)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let closed = Arc::new(AtomicUsize::new(0));
    let dripper = {
        let (stop, closed) = (stop.clone(), closed.clone());
        std::thread::spawn(move || {
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut step = 0;
            while !stop.load(Ordering::SeqCst) && Instant::now() < deadline {
                let now_closed: usize = drips.iter_mut().map(|d| d.step(step)).sum();
                closed.store(now_closed, Ordering::SeqCst);
                step += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            drips
        })
    };
    // While the drip goes on, a real client writes and reads through every node.
    let client = cluster.client();
    for round in 0..5u64 {
        let data = payload(300_000, round);
        block_on(async {
            client.put_bytes("bkt", &format!("obj-{round}"), &data, &Default::default()).await.unwrap();
            let info = client.head("bkt", &format!("obj-{round}")).await.unwrap();
            assert_eq!(info.meta_positions.len(), 6, "every node answered despite the flood");
            assert!(client.get("bkt", &format!("obj-{round}")).await.unwrap() == data);
        });
        // A fresh client each round opens fresh connections through the flood.
        let fresh = cluster.client();
        block_on(async { assert!(fresh.get("bkt", &format!("obj-{round}")).await.unwrap() == data) });
    }
    // The fault really happened: the node shed the slow peers (evicted beyond the pending
    // limit, or cut off at the handshake deadline, well before they could send a frame).
    let deadline = Instant::now() + node::HANDSHAKE_TIMEOUT * 3;
    while closed.load(Ordering::SeqCst) < 6 * per_node && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::SeqCst);
    let drips = dripper.join().unwrap();
    let total: usize = drips.iter().map(|d| d.streams.len()).sum();
    assert_eq!(total, 6 * per_node, "all slow connections were opened");
    assert_eq!(closed.load(Ordering::SeqCst), total, "every slow connection was closed by its node");
    for idx in 0..6 {
        assert!(cluster.log(idx).contains("node ready"));
    }
}

#[test]
fn nodes_refuse_an_empty_or_short_cluster_secret() {
    let cluster = Cluster::init(Shape::default());
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    let secret = secret_of(&cluster);
    for bad in ["", "short"] {
        std::fs::write(&cluster.config, text.replace(&secret, bad)).unwrap();
        let output = std::process::Command::new(crate::harness::TESSERA)
            .args(["node", "--config", cluster.config.to_str().unwrap(), "--id", "n1"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "a node must not start with secret {bad:?}");
        assert!(stderr.contains("cluster secret") && stderr.contains("at least 16"), "{stderr}");
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    }
}

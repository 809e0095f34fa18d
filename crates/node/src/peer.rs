//! A node's own connection to another node, for repair: the client side of the node protocol
//! (handshake, tagged frames, raw chunk bytes), blocking, every call under a timeout.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use cluster::ClusterMap;
use proto::{
    AuthProof, Challenge, FRAME_HEADER_BYTES, FRAME_TAG_BYTES, FrameHeader, FrameKind, FrameMac, ItemStatus,
    KeyVersions, MetaDetail, MetaKey, NONCE_BYTES, PROTOCOL_VERSION, ReadItem, Request, Response,
};

/// Connect, and each read or write on a peer connection, gives up after this long.
pub(crate) const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Why a call to a peer failed; the repair that made it backs off and tries again later.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PeerError {
    #[error("I/O with {addr}: {source}")]
    Io { addr: SocketAddr, source: std::io::Error },
    #[error("TLS handshake with {addr}: {source}")]
    Tls { addr: SocketAddr, source: std::io::Error },
    #[error("protocol with {addr}: {source}")]
    Proto { addr: SocketAddr, source: proto::Error },
    #[error("{addr} answered {answer}")]
    Unexpected { addr: SocketAddr, answer: String },
    #[error("{addr} belongs to cluster {theirs}, not {ours}")]
    WrongCluster { addr: SocketAddr, ours: String, theirs: String },
    #[error("{addr} holds cluster map version {theirs}, this node {ours}: catching up")]
    StaleMap { addr: SocketAddr, ours: u64, theirs: u64 },
}

/// An authenticated connection to a peer node.
pub(crate) struct Peer {
    addr: SocketAddr,
    /// Plain TCP, or TLS when the map has a cluster CA.
    stream: nodetls::Stream,
    outbound: FrameMac,
    inbound: FrameMac,
}

impl Peer {
    /// Connects, authenticates both ways with the cluster secret, and marks the connection as
    /// background work. Fails with [`PeerError::StaleMap`] if the peer holds a newer map than
    /// `map` (it would refuse every request): the caller tells the node to catch up.
    pub(crate) fn open(
        addr: SocketAddr,
        map: &ClusterMap,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<Self, PeerError> {
        let (mut peer, theirs) = Self::connect(addr, map, tls)?;
        if theirs > map.version {
            return Err(PeerError::StaleMap { addr, ours: map.version, theirs });
        }
        // Everything a node asks of a peer is background work: served after clients.
        match peer.call(&Request::Background)? {
            Response::Ok => Ok(peer),
            other => Err(PeerError::Unexpected { addr, answer: format!("{other:?}") }),
        }
    }

    /// Connects (over TLS with `tls`, the node's client configuration when the map has a
    /// cluster CA) and authenticates both ways with the cluster secret; also the version of
    /// the peer's map. Refuses a peer of another cluster.
    pub(crate) fn connect(
        addr: SocketAddr,
        map: &ClusterMap,
        tls: Option<&Arc<rustls::ClientConfig>>,
    ) -> Result<(Self, u64), PeerError> {
        let secret = map.secret.as_str();
        let io = |source| PeerError::Io { addr, source };
        let tcp = TcpStream::connect_timeout(&addr, PEER_TIMEOUT).map_err(io)?;
        tcp.set_read_timeout(Some(PEER_TIMEOUT)).map_err(io)?;
        tcp.set_write_timeout(Some(PEER_TIMEOUT)).map_err(io)?;
        tcp.set_nodelay(true).map_err(io)?;
        let (mut stream, binding) = match tls {
            Some(config) => {
                let (stream, binding) =
                    nodetls::Stream::connect(tcp, config).map_err(|source| PeerError::Tls { addr, source })?;
                (stream, binding.to_vec())
            }
            None => (nodetls::Stream::Plain(tcp), Vec::new()),
        };
        let mut header = [0u8; FRAME_HEADER_BYTES];
        stream.read_exact(&mut header).map_err(io)?;
        let decoded = FrameHeader::decode(&header).map_err(|source| PeerError::Proto { addr, source })?;
        if decoded.kind != FrameKind::Challenge {
            return Err(PeerError::Unexpected { addr, answer: format!("a {:?} frame first", decoded.kind) });
        }
        // FrameHeader::decode bounded a Challenge by HANDSHAKE_BODY_BYTES_MAX.
        let mut body = vec![0u8; decoded.body_len];
        stream.read_exact(&mut body).map_err(io)?;
        let challenge: Challenge =
            proto::decode_message(&body, "challenge").map_err(|source| PeerError::Proto { addr, source })?;
        if challenge.protocol_version != PROTOCOL_VERSION {
            let source = proto::Error::UnsupportedVersion {
                what: "node protocol",
                found: challenge.protocol_version,
                supported: PROTOCOL_VERSION,
            };
            return Err(PeerError::Proto { addr, source });
        }
        if challenge.cluster_id != map.cluster_id {
            return Err(PeerError::WrongCluster { addr, ours: map.cluster_id.clone(), theirs: challenge.cluster_id });
        }
        let client_nonce: [u8; NONCE_BYTES] = rand::random();
        let auth = AuthProof::new(secret, &challenge, client_nonce, &map.cluster_id, map.version, &binding);
        let frame = proto::encode_frame(FrameKind::Auth, &auth).map_err(|source| PeerError::Proto { addr, source })?;
        stream.write_all(&frame).map_err(io)?;
        let (outbound, inbound) = proto::session_macs(secret, &auth.transcript(&challenge, &binding));
        let mut peer = Self { addr, stream, outbound, inbound };
        match peer.read_response()? {
            Response::Ok => Ok((peer, challenge.map_version)),
            other => Err(PeerError::Unexpected { addr, answer: format!("{other:?}") }),
        }
    }

    /// One request, one response.
    pub(crate) fn call(&mut self, request: &Request) -> Result<Response, PeerError> {
        self.send(request)?;
        self.read_response()
    }

    /// What the peer's drives hold of each item's key, one answer per item in order. A node
    /// answers the first items of a request when all would not fit in one frame; the rest are
    /// asked again. Callers keep `items` within `proto::BATCH_ITEMS_MAX`.
    pub(crate) fn meta_get(&mut self, items: &[MetaKey], detail: MetaDetail) -> Result<Vec<KeyVersions>, PeerError> {
        let mut answers = Vec::with_capacity(items.len());
        // Every round answers at least one item or fails: at most `items.len()` rounds.
        while answers.len() < items.len() {
            let rest = &items[answers.len()..];
            match self.call(&Request::MetaGet { items: rest.to_vec(), detail })? {
                Response::Versions { keys } if !keys.is_empty() && keys.len() <= rest.len() => answers.extend(keys),
                other => return Err(PeerError::Unexpected { addr: self.addr, answer: format!("{other:?}") }),
            }
        }
        Ok(answers)
    }

    /// A request followed by raw bytes (a chunk write), one response.
    pub(crate) fn call_with_data(&mut self, request: &Request, data: &[u8]) -> Result<Response, PeerError> {
        self.send(request)?;
        self.stream.write_all(data).map_err(|source| PeerError::Io { addr: self.addr, source })?;
        self.read_response()
    }

    /// Sends a batched read without waiting for its answer, so that reads from several peers
    /// overlap; [`Peer::finish_read_into`] takes the answer.
    pub(crate) fn start_read(&mut self, items: Vec<ReadItem>) -> Result<(), PeerError> {
        self.send(&Request::Read { items })
    }

    /// The answer to the read [`Peer::start_read`] sent, into one buffer per item (each as
    /// long as its item); whether each item was served. On an error, any buffer may have been
    /// written in part.
    pub(crate) fn finish_read_into(&mut self, bufs: &mut [&mut [u8]]) -> Result<Vec<bool>, PeerError> {
        let answer = self.read_response()?;
        let Response::Read { statuses } = answer else {
            return Err(PeerError::Unexpected { addr: self.addr, answer: format!("{answer:?}") });
        };
        if statuses.len() != bufs.len() {
            return Err(PeerError::Unexpected { addr: self.addr, answer: format!("{} statuses", statuses.len()) });
        }
        let mut served = Vec::with_capacity(bufs.len());
        for (status, buf) in statuses.into_iter().zip(bufs.iter_mut()) {
            let ok = status == ItemStatus::Ok;
            if ok {
                self.stream.read_exact(buf).map_err(|source| PeerError::Io { addr: self.addr, source })?;
            }
            served.push(ok);
        }
        Ok(served)
    }

    fn send(&mut self, request: &Request) -> Result<(), PeerError> {
        let addr = self.addr;
        let frame = proto::encode_sealed_frame(FrameKind::Request, request, &mut self.outbound)
            .map_err(|source| PeerError::Proto { addr, source })?;
        self.stream.write_all(&frame).map_err(|source| PeerError::Io { addr, source })
    }

    fn read_response(&mut self) -> Result<Response, PeerError> {
        let addr = self.addr;
        let io = |source| PeerError::Io { addr, source };
        let proto_err = |source| PeerError::Proto { addr, source };
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header).map_err(io)?;
        let decoded = FrameHeader::decode(&header).map_err(proto_err)?;
        if decoded.kind != FrameKind::Response {
            return Err(PeerError::Unexpected { addr, answer: format!("a {:?} frame", decoded.kind) });
        }
        // FrameHeader::decode bounded body_len by CONTROL_BODY_BYTES_MAX.
        let mut body = vec![0u8; decoded.body_len];
        self.stream.read_exact(&mut body).map_err(io)?;
        let mut tag = [0u8; FRAME_TAG_BYTES];
        self.stream.read_exact(&mut tag).map_err(io)?;
        self.inbound.open(&header, &body, &tag).map_err(proto_err)?;
        proto::decode_response(&body).map_err(proto_err)
    }
}

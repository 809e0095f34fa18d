//! Connections to nodes: handshake, framed requests, and a bounded pool per node.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cluster::ClusterMap;

use proto::{
    AuthProof, Challenge, ErrorKind, FRAME_HEADER_BYTES, FRAME_TAG_BYTES, FrameHeader, FrameKind, FrameMac,
    NONCE_BYTES, PROTOCOL_VERSION, Request, Response,
};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use crate::Error;

/// A connection's bytes: plain TCP, or TLS when the cluster map has a CA (`nodetls`).
#[derive(Debug)]
pub(crate) enum NodeStream {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl NodeStream {
    fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::Tls(tls) => tls.get_ref().0,
        }
    }
}

impl AsyncRead for NodeStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_read(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for NodeStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write(cx, buf),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_flush(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_shutdown(cx),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(tcp) => Pin::new(tcp).poll_write_vectored(cx, bufs),
            Self::Tls(tls) => Pin::new(tls.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(tcp) => tcp.is_write_vectored(),
            Self::Tls(tls) => tls.is_write_vectored(),
        }
    }
}

/// How a client reaches nodes.
#[derive(Clone, Debug)]
pub(crate) enum Transport {
    /// Plain TCP: the map has no cluster CA.
    Plain,
    /// TLS, accepting only certificates from the map's cluster CA.
    Tls(Arc<rustls::ClientConfig>),
    /// A client without a map yet (bootstrapping): TLS accepting any certificate (the node
    /// protocol's handshake, bound to the TLS connection, authenticates the node), or plain TCP
    /// when the node answers in plain text (a cluster without node TLS). No downgrade: a node
    /// with TLS never serves plain TCP, and over plain TCP the binding is missing.
    Probe,
}

/// Why a TLS handshake with a node failed.
enum TlsFailure {
    /// The node sent plain text: it serves the node protocol without TLS.
    PlainPeer(Error),
    Other(Error),
}

impl TlsFailure {
    fn error(self) -> Error {
        match self {
            Self::PlainPeer(e) | Self::Other(e) => e,
        }
    }
}

/// One authenticated connection to a node: the stream and the frame MACs of both directions.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) stream: NodeStream,
    pub(crate) node: String,
    /// Tags frames to the node.
    outbound: FrameMac,
    /// Checks frames from the node.
    inbound: FrameMac,
    /// Set when the node shows a newer map than the one this connection plans with.
    stale: Arc<AtomicBool>,
}

/// Which map a connection plans with: the node refuses its requests once it holds a newer one.
#[derive(Clone, Debug)]
pub(crate) struct MapIdentity {
    pub(crate) secret: String,
    /// Empty while bootstrapping (no map yet): the node then serves only its map.
    pub(crate) cluster_id: String,
    pub(crate) version: u64,
    /// Set when a node shows a newer map (in its handshake or a `StaleMap` answer).
    pub(crate) stale: Arc<AtomicBool>,
    pub(crate) transport: Transport,
}

impl MapIdentity {
    /// `tls`: the client configuration trusting `map`'s cluster CA, when it has one.
    pub(crate) fn of(map: &ClusterMap, tls: Option<Arc<rustls::ClientConfig>>) -> Self {
        Self {
            secret: map.secret.clone(),
            cluster_id: map.cluster_id.clone(),
            version: map.version,
            stale: Arc::new(AtomicBool::new(false)),
            transport: tls.map_or(Transport::Plain, Transport::Tls),
        }
    }

    /// For fetching the map from a node whose cluster is not known yet.
    pub(crate) fn bootstrap(secret: &str) -> Self {
        Self {
            secret: secret.to_owned(),
            cluster_id: String::new(),
            version: 0,
            stale: Arc::default(),
            transport: Transport::Probe,
        }
    }
}

impl Conn {
    /// Connects, and authenticates both ways with the cluster secret: the node checks our proof,
    /// and its first tagged frame proves it knows the secret too. Refuses a node of another
    /// cluster; a node with a newer map marks `map` stale (it will refuse every request but
    /// `GetMap`).
    pub(crate) async fn open(
        node: &str,
        addr: SocketAddr,
        map: &MapIdentity,
        timeout: Duration,
    ) -> Result<Self, Error> {
        let unreachable = |reason: String| Error::NodeUnreachable { node: node.to_owned(), reason };
        let connect = || async {
            let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
                .await
                .map_err(|_| unreachable(format!("connect to {addr} timed out after {timeout:?}")))?
                .map_err(|e| unreachable(format!("connect to {addr}: {e}")))?;
            stream.set_nodelay(true).map_err(|e| unreachable(e.to_string()))?;
            Ok::<_, Error>(stream)
        };
        let tcp = connect().await?;
        let (stream, binding) = match &map.transport {
            Transport::Plain => (NodeStream::Plain(tcp), Vec::new()),
            Transport::Tls(config) => Self::tls(tcp, config, node, addr, timeout).await.map_err(TlsFailure::error)?,
            Transport::Probe => match Self::tls(tcp, &nodetls::bootstrap_client_config(), node, addr, timeout).await {
                Ok(tls) => tls,
                // A node without TLS speaks first (its challenge), which TLS reads as a
                // broken record: ask again in plain TCP.
                Err(TlsFailure::PlainPeer(_)) => (NodeStream::Plain(connect().await?), Vec::new()),
                Err(TlsFailure::Other(e)) => return Err(e),
            },
        };
        let plain = matches!(stream, NodeStream::Plain(_));
        tokio::time::timeout(timeout, Self::handshake(stream, &binding, node, addr, map)).await.map_err(|_| {
            // A node with node TLS waits for a TLS hello; a plain client waits for its challenge.
            let hint = if plain {
                " (if the node runs the node protocol over TLS, this client's map lacks its [node_tls])"
            } else {
                ""
            };
            unreachable(format!("handshake with {addr} timed out{hint}"))
        })?
    }

    /// The TLS handshake on `tcp` within `timeout`; the stream and its channel binding.
    async fn tls(
        tcp: TcpStream,
        config: &Arc<rustls::ClientConfig>,
        node: &str,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<(NodeStream, Vec<u8>), TlsFailure> {
        let failed = |reason: String| Error::NodeUnreachable { node: node.to_owned(), reason };
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(config));
        let stream = tokio::time::timeout(timeout, connector.connect(nodetls::server_name(), tcp))
            .await
            .map_err(|_| TlsFailure::Other(failed(format!("TLS handshake with {addr} timed out after {timeout:?}"))))?
            .map_err(|e| {
                // What rustls says of a peer that sent something other than TLS records.
                let broken_record = e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>())
                    == Some(&rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType));
                if broken_record {
                    TlsFailure::PlainPeer(failed(format!(
                        "TLS handshake with {addr}: the node answered in plain TCP (this client's cluster map has \
                         node TLS, the node's has not: is it started with an older cluster.toml?)"
                    )))
                } else {
                    TlsFailure::Other(failed(format!("TLS handshake with {addr}: {e}")))
                }
            })?;
        let binding = nodetls::channel_binding(stream.get_ref().1)
            .map_err(|e| TlsFailure::Other(failed(format!("TLS with {addr}: {e}"))))?;
        Ok((NodeStream::Tls(Box::new(stream)), binding.to_vec()))
    }

    async fn handshake(
        mut stream: NodeStream,
        binding: &[u8],
        node: &str,
        addr: SocketAddr,
        map: &MapIdentity,
    ) -> Result<Self, Error> {
        let secret = map.secret.as_str();
        let io = |e: std::io::Error| Error::NodeUnreachable { node: node.to_owned(), reason: e.to_string() };
        let protocol = |source| Error::Protocol { node: node.to_owned(), source };
        let mut header = [0u8; FRAME_HEADER_BYTES];
        stream.read_exact(&mut header).await.map_err(io)?;
        let decoded = FrameHeader::decode(&header).map_err(protocol)?;
        if decoded.kind != FrameKind::Challenge {
            return Err(protocol(proto::Error::Invalid {
                what: "frame kind",
                reason: format!("expected Challenge, got {:?}", decoded.kind),
            }));
        }
        // FrameHeader::decode bounded a Challenge by HANDSHAKE_BODY_BYTES_MAX.
        let mut body = vec![0u8; decoded.body_len];
        stream.read_exact(&mut body).await.map_err(io)?;
        let challenge: Challenge = proto::decode_message(&body, "challenge").map_err(protocol)?;
        if challenge.protocol_version != PROTOCOL_VERSION {
            return Err(protocol(proto::Error::UnsupportedVersion {
                what: "node protocol",
                found: challenge.protocol_version,
                supported: PROTOCOL_VERSION,
            }));
        }
        if !map.cluster_id.is_empty() && challenge.cluster_id != map.cluster_id {
            return Err(Error::WrongCluster {
                node: node.to_owned(),
                addr,
                ours: map.cluster_id.clone(),
                theirs: challenge.cluster_id,
            });
        }
        if challenge.map_version > map.version {
            map.stale.store(true, Ordering::SeqCst);
        }
        let client_nonce: [u8; NONCE_BYTES] = rand::random();
        let auth = AuthProof::new(secret, &challenge, client_nonce, &map.cluster_id, map.version, binding);
        let frame = proto::encode_frame(FrameKind::Auth, &auth).map_err(protocol)?;
        stream.write_all(&frame).await.map_err(io)?;
        stream.flush().await.map_err(io)?;
        let (outbound, inbound) = proto::session_macs(secret, &auth.transcript(&challenge, binding));
        let mut conn = Self { stream, node: node.to_owned(), outbound, inbound, stale: Arc::clone(&map.stale) };
        match conn.read_response().await {
            Ok(Response::Ok) => Ok(conn),
            Ok(other) => Err(conn.unexpected(&other)),
            // The node closes the connection on a wrong proof.
            Err(Error::NodeUnreachable { .. }) => Err(Error::AuthRejected { node: node.to_owned() }),
            // A node that cannot tag its answer does not know the secret.
            Err(Error::Protocol { source: proto::Error::BadFrameMac { .. }, .. }) => {
                Err(Error::NodeNotAuthenticated { node: node.to_owned() })
            }
            Err(e) => Err(e),
        }
    }

    /// An idle connection has nothing to read; a closed one (node restarted) reads EOF or an
    /// error, and one with stray bytes (or, over TLS, a closing alert) is out of step. Only
    /// the first may be reused. Peeks at the socket, so TLS records are left where they are.
    fn is_idle_and_open(&self) -> bool {
        let mut probe = [0u8; 1];
        let mut buf = ReadBuf::new(&mut probe);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        self.stream.tcp().poll_peek(&mut cx, &mut buf).is_pending()
    }

    pub(crate) async fn send_request(&mut self, request: &Request) -> Result<(), Error> {
        let frame = proto::encode_sealed_frame(FrameKind::Request, request, &mut self.outbound)
            .map_err(|e| self.protocol(e))?;
        self.write_all(&frame).await
    }

    /// Sends a request followed by raw bytes (a chunk write) in one go where possible.
    pub(crate) async fn send_request_with_data(&mut self, request: &Request, data: &[u8]) -> Result<(), Error> {
        self.send_request(request).await?;
        self.write_all(data).await
    }

    pub(crate) async fn read_response(&mut self) -> Result<Response, Error> {
        let body = self.read_frame().await?;
        let response = proto::decode_response(&body).map_err(|e| self.protocol(e))?;
        if matches!(response, Response::Error { kind: ErrorKind::StaleMap, .. }) {
            self.stale.store(true, Ordering::SeqCst);
        }
        Ok(response)
    }

    /// One request, one response.
    pub(crate) async fn call(&mut self, request: &Request) -> Result<Response, Error> {
        self.send_request(request).await?;
        self.read_response().await
    }

    pub(crate) async fn read_exact(&mut self, buf: &mut [u8]) -> Result<(), Error> {
        self.stream.read_exact(buf).await.map_err(|e| self.io(e))?;
        Ok(())
    }

    /// Reads one tagged response frame and checks its tag.
    async fn read_frame(&mut self) -> Result<Vec<u8>, Error> {
        let mut header = [0u8; FRAME_HEADER_BYTES];
        self.stream.read_exact(&mut header).await.map_err(|e| self.io(e))?;
        let decoded = FrameHeader::decode(&header).map_err(|e| self.protocol(e))?;
        if decoded.kind != FrameKind::Response {
            return Err(self.protocol(proto::Error::Invalid {
                what: "frame kind",
                reason: format!("expected Response, got {:?}", decoded.kind),
            }));
        }
        // FrameHeader::decode bounded body_len by CONTROL_BODY_BYTES_MAX.
        let mut body = vec![0u8; decoded.body_len];
        self.stream.read_exact(&mut body).await.map_err(|e| self.io(e))?;
        let mut tag = [0u8; FRAME_TAG_BYTES];
        self.stream.read_exact(&mut tag).await.map_err(|e| self.io(e))?;
        self.inbound.open(&header, &body, &tag).map_err(|e| self.protocol(e))?;
        Ok(body)
    }

    /// Writes `bytes` and flushes: over TLS, `write_all` leaves encrypted records in rustls when
    /// the socket is full, and nothing else would send them while we wait for the answer.
    async fn write_all(&mut self, bytes: &[u8]) -> Result<(), Error> {
        self.stream.write_all(bytes).await.map_err(|e| self.io(e))?;
        self.stream.flush().await.map_err(|e| self.io(e))
    }

    pub(crate) fn io(&self, e: std::io::Error) -> Error {
        Error::NodeUnreachable { node: self.node.clone(), reason: e.to_string() }
    }

    fn protocol(&self, source: proto::Error) -> Error {
        Error::Protocol { node: self.node.clone(), source }
    }

    pub(crate) fn unexpected(&self, response: &Response) -> Error {
        match response {
            Response::Error { kind, message } => Error::from_node(&self.node, *kind, message),
            other => Error::Protocol {
                node: self.node.clone(),
                source: proto::Error::Invalid { what: "response", reason: format!("unexpected {other:?}") },
            },
        }
    }
}

/// Idle connections to one node, plus when it last failed. At most `idle_max` are kept.
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) node: String,
    pub(crate) addr: SocketAddr,
    map: MapIdentity,
    idle: Mutex<Vec<Conn>>,
    /// When the node last failed, and how.
    down_since: Mutex<Option<(Instant, String)>>,
}

impl Pool {
    pub(crate) fn new(node: String, addr: SocketAddr, map: MapIdentity) -> Self {
        Self { node, addr, map, idle: Mutex::new(Vec::new()), down_since: Mutex::new(None) }
    }

    /// How the node failed, if it did within `backoff`: readers plan around such a node
    /// instead of waiting.
    pub(crate) fn down_reason(&self, backoff: Duration) -> Option<String> {
        let down = self.down_since.lock().expect("pool lock poisoned");
        down.as_ref().filter(|(since, _)| since.elapsed() < backoff).map(|(_, reason)| reason.clone())
    }

    /// Records that the node failed with `error`, and drops its idle connections.
    pub(crate) fn mark_down(&self, error: &Error) {
        *self.down_since.lock().expect("pool lock poisoned") = Some((Instant::now(), error.to_string()));
        self.idle.lock().expect("pool lock poisoned").clear();
    }

    /// Whether a request should skip this node: it failed within `backoff`. When the backoff
    /// has passed, the first caller becomes the probe (and the backoff restarts for the others),
    /// so a hung node costs one timeout per backoff period, not one per request.
    fn skip(&self, backoff: Duration) -> Option<Error> {
        let mut down = self.down_since.lock().expect("pool lock poisoned");
        match &mut *down {
            Some((since, reason)) if since.elapsed() < backoff => {
                Some(Error::NodeDown { node: self.node.clone(), backoff, reason: reason.clone() })
            }
            Some((since, _)) => {
                *since = Instant::now();
                None
            }
            None => None,
        }
    }

    /// A pooled or new connection, unless the node failed recently (see [`Pool::skip`]).
    pub(crate) async fn get(&self, timeout: Duration, backoff: Duration) -> Result<Conn, Error> {
        if let Some(error) = self.skip(backoff) {
            return Err(error);
        }
        self.get_now(timeout).await
    }

    /// A pooled or new connection, trying the node even if it failed recently: for callers that
    /// cannot do without it (a write quorum, a bucket operation).
    pub(crate) async fn get_now(&self, timeout: Duration) -> Result<Conn, Error> {
        loop {
            let Some(conn) = self.idle.lock().expect("pool lock poisoned").pop() else {
                break;
            };
            if conn.is_idle_and_open() {
                return Ok(conn);
            }
        }
        match Conn::open(&self.node, self.addr, &self.map, timeout).await {
            Ok(conn) => {
                *self.down_since.lock().expect("pool lock poisoned") = None;
                Ok(conn)
            }
            Err(e) => {
                self.mark_down(&e);
                Err(e)
            }
        }
    }

    /// Returns a connection that finished its exchange cleanly.
    pub(crate) fn put_back(&self, conn: Conn, idle_max: usize) {
        let mut idle = self.idle.lock().expect("pool lock poisoned");
        if idle.len() < idle_max {
            idle.push(conn);
        }
    }
}

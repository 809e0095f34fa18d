//! TLS for the node protocol: the cluster CA that `tessera init` makes (kept in the cluster map,
//! next to the cluster secret), the certificate a node issues itself from it at every start,
//! the rustls configurations of nodes and of their clients, and the channel binding that ties
//! the node protocol's own handshake to the TLS connection it runs in.
//!
//! Main items: [`ClusterCa`] (made by `init`, checked by nodes at start), [`server_config`]
//! (a node's), [`client_config`] (clients and peers, trusting the cluster CA only),
//! [`bootstrap_client_config`] (a client that knows the cluster secret but not yet the map),
//! [`channel_binding`], and [`Stream`] (a node's blocking stream, plain or TLS).
//!
//! Trust: whoever holds the cluster map holds the secret and the CA key, so any node (and any
//! holder of the map) can issue a node certificate, and every node's certificate names the same
//! server name ([`NODE_SERVER_NAME`]). TLS adds confidentiality and integrity of every byte
//! (chunk bytes included, which the node protocol's frame MACs do not cover) against anyone
//! without the map. The node protocol's handshake still authenticates both ends with the
//! secret, over a transcript that includes [`channel_binding`]: a relay that terminates TLS on
//! both sides has two different bindings and fails it. That is what makes
//! [`bootstrap_client_config`], which cannot check the certificate, safe.
//!
//! Only TLS 1.3 (its exporter is always bound to the full handshake), no session resumption
//! (connections are pooled; a ticket would only be a second way in).
//!
//! ```no_run
//! let ca = nodetls::ClusterCa::generate().unwrap();
//! let server = nodetls::server_config(&ca, std::time::SystemTime::now()).unwrap();
//! let client = nodetls::client_config(ca.cert_pem()).unwrap();
//! # let _ = (server, client);
//! ```

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, ServerConfig, ServerConnection, StreamOwned};

/// The name every node's certificate is for, and that clients ask for (SNI and verification).
pub const NODE_SERVER_NAME: &str = "node.tessera";
/// Bytes of [`channel_binding`].
pub const CHANNEL_BINDING_BYTES: usize = 32;
/// The TLS exporter label of [`channel_binding`] (RFC 8446 section 7.5).
const EXPORTER_LABEL: &[u8] = b"EXPERIMENTAL-tessera-node-protocol-v1";
/// How long a cluster CA made by `init` is valid.
const CA_VALIDITY: std::time::Duration = std::time::Duration::from_secs(20 * 365 * 24 * 3600);
/// Certificates are valid from this long before they are made, for clocks a little behind.
const CLOCK_SKEW: std::time::Duration = std::time::Duration::from_secs(3600);

/// Why TLS for the node protocol cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("the cluster CA certificate (node_tls.ca_cert in cluster.toml) is unusable: {0}")]
    BadCaCert(String),
    #[error("the cluster CA key (node_tls.ca_key in cluster.toml) is not a PEM private key: {0}")]
    BadCaKey(String),
    #[error(
        "the cluster CA key is not its certificate's key, or the certificate is not one tessera made (node_tls in cluster.toml)"
    )]
    CaMismatch,
    #[error("the cluster CA certificate expired on {0}: nodes cannot issue themselves certificates")]
    CaExpired(String),
    #[error("the cluster CA certificate is not valid before {0} (is this host's clock right?)")]
    CaNotYetValid(String),
    #[error("TLS setup: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("issuing a certificate: {0}")]
    Issue(#[from] rcgen::Error),
}

/// The cluster CA: a self-signed certificate and its key, both PEM. `Debug` leaves the key out.
#[derive(Clone, PartialEq, Eq)]
pub struct ClusterCa {
    cert_pem: String,
    key_pem: String,
}

impl std::fmt::Debug for ClusterCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterCa").field("cert_pem", &self.cert_pem).finish_non_exhaustive()
    }
}

impl ClusterCa {
    /// A new CA (ECDSA P-256), valid for 20 years from an hour ago.
    pub fn generate() -> Result<Self, Error> {
        let now = SystemTime::now();
        Self::generate_valid(now - CLOCK_SKEW, now + CA_VALIDITY)
    }

    /// A CA valid from `not_before` to `not_after` (tests: an expired CA, as `init` would have
    /// made it long ago).
    #[doc(hidden)]
    pub fn generate_valid(not_before: SystemTime, not_after: SystemTime) -> Result<Self, Error> {
        let key = KeyPair::generate()?;
        let mut params = ca_params(&key);
        (params.not_before, params.not_after) = (not_before.into(), not_after.into());
        let cert = params.self_signed(&key)?;
        Ok(Self { cert_pem: cert.pem(), key_pem: key.serialize_pem() })
    }

    /// The CA as stored (not checked: [`ClusterCa::check`] and [`server_config`] do).
    pub fn from_pem(cert_pem: String, key_pem: String) -> Self {
        Self { cert_pem, key_pem }
    }

    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// Checks that the certificate parses, is the one tessera made for the key, and is valid
    /// at `now`; its end of validity.
    pub fn check(&self, now: SystemTime) -> Result<SystemTime, Error> {
        self.load(now).map(|loaded| loaded.not_after.into())
    }

    fn load(&self, now: SystemTime) -> Result<LoadedCa, Error> {
        let der = first_cert(&self.cert_pem)?;
        let key = KeyPair::from_pem(&self.key_pem).map_err(|e| Error::BadCaKey(e.to_string()))?;
        let (_, cert) =
            x509_parser::parse_x509_certificate(der.as_ref()).map_err(|e| Error::BadCaCert(e.to_string()))?;
        let name = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default();
        if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() || name != ca_common_name(&key) {
            return Err(Error::CaMismatch);
        }
        let validity = cert.validity();
        let now_secs = now.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
        if now_secs > validity.not_after.timestamp() {
            return Err(Error::CaExpired(validity.not_after.to_string()));
        }
        if now_secs < validity.not_before.timestamp() {
            return Err(Error::CaNotYetValid(validity.not_before.to_string()));
        }
        let (not_before, not_after) = (validity.not_before.to_datetime(), validity.not_after.to_datetime());
        drop(cert);
        Ok(LoadedCa { der, key, not_before, not_after })
    }
}

struct LoadedCa {
    der: CertificateDer<'static>,
    key: KeyPair,
    not_before: time::OffsetDateTime,
    not_after: time::OffsetDateTime,
}

fn first_cert(pem: &str) -> Result<CertificateDer<'static>, Error> {
    use rustls::pki_types::pem::PemObject as _;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .ok_or_else(|| Error::BadCaCert("no PEM certificate in it".into()))?
        .map_err(|e| Error::BadCaCert(e.to_string()))
}

fn ca_common_name(key: &KeyPair) -> String {
    // The key's own bytes (not a hash: no hash crate here) are too long for a name; the first
    // 8 bytes after the SEC1 point's tag tell two clusters' CAs apart.
    let raw = key.public_key_raw();
    let tag: String = raw.iter().skip(1).take(8).map(|b| format!("{b:02x}")).collect();
    format!("Tessera cluster CA {tag}")
}

/// The CA's parameters, the same at every start: its name carries a fingerprint of its key, so
/// a certificate a node issues later names the issuer the stored CA certificate is.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::OrganizationName, "Tessera");
    params.distinguished_name.push(DnType::CommonName, ca_common_name(key));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A node's TLS configuration: a fresh key and a certificate for [`NODE_SERVER_NAME`] issued
/// from `ca`, valid until the CA is. Fails if the CA is unusable at `now` (see
/// [`ClusterCa::check`]).
pub fn server_config(ca: &ClusterCa, now: SystemTime) -> Result<Arc<ServerConfig>, Error> {
    let loaded = ca.load(now)?;
    let issuer = Issuer::new(ca_params(&loaded.key), loaded.key);
    let mut params = CertificateParams::new(vec![NODE_SERVER_NAME.to_owned()])?;
    params.distinguished_name.push(DnType::CommonName, NODE_SERVER_NAME);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    // The CA's validity: a client whose clock is behind the node's accepts it as it does the CA.
    (params.not_before, params.not_after) = (loaded.not_before, loaded.not_after);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_no_client_auth()
        .with_single_cert(vec![cert.der().clone(), loaded.der], key_der)?;
    config.send_tls13_tickets = 0;
    Ok(Arc::new(config))
}

/// The TLS configuration of a client or peer of a cluster whose CA certificate is
/// `ca_cert_pem`: only node certificates issued from it are accepted.
pub fn client_config(ca_cert_pem: &str) -> Result<Arc<ClientConfig>, Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(first_cert(ca_cert_pem)?).map_err(|e| Error::BadCaCert(e.to_string()))?;
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Ok(Arc::new(config))
}

/// The TLS configuration of a client that knows the cluster secret but not yet the map (so not
/// the CA): it accepts any certificate (still checking the handshake's signature), and relies
/// on the node protocol's handshake, bound to this connection by [`channel_binding`], to
/// authenticate the node.
pub fn bootstrap_client_config() -> Arc<ClientConfig> {
    let provider = provider();
    let verifier = Arc::new(AnyCertificate { algorithms: provider.signature_verification_algorithms });
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the ring provider supports TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

/// See [`bootstrap_client_config`].
#[derive(Debug)]
struct AnyCertificate {
    algorithms: rustls::crypto::WebPkiSupportedAlgorithms,
}

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The server name clients ask nodes for.
pub fn server_name() -> ServerName<'static> {
    ServerName::try_from(NODE_SERVER_NAME).expect("a valid DNS name")
}

/// Keying material both ends of one TLS connection (and no one else) compute after its
/// handshake (RFC 8446 exporter): the node protocol's handshake puts it in its transcript.
pub fn channel_binding<D>(conn: &rustls::ConnectionCommon<D>) -> io::Result<[u8; CHANNEL_BINDING_BYTES]> {
    conn.export_keying_material([0u8; CHANNEL_BINDING_BYTES], EXPORTER_LABEL, None).map_err(io::Error::other)
}

/// A node's connection, blocking: plain TCP, or TLS as the server (a node serving) or the
/// client (a node calling a peer).
#[derive(Debug)]
pub enum Stream {
    Plain(TcpStream),
    Server(Box<StreamOwned<ServerConnection, TcpStream>>),
    Client(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    /// Runs the server side of a TLS handshake on `tcp`, all of it before `deadline` (not per
    /// read: a peer dripping bytes is cut off too); the stream and its [`channel_binding`].
    /// Leaves `tcp`'s timeouts set to what was left.
    pub fn accept(
        mut tcp: TcpStream,
        config: &Arc<ServerConfig>,
        deadline: Instant,
    ) -> io::Result<(Self, [u8; CHANNEL_BINDING_BYTES])> {
        let mut conn = ServerConnection::new(Arc::clone(config)).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(io::ErrorKind::TimedOut, "the TLS handshake took too long"));
            }
            tcp.set_read_timeout(Some(left))?;
            tcp.set_write_timeout(Some(left))?;
            conn.complete_io(&mut tcp)?;
        }
        let binding = channel_binding(&conn)?;
        Ok((Self::Server(Box::new(StreamOwned::new(conn, tcp))), binding))
    }

    /// Runs the client side of a TLS handshake on `tcp` (bounded by `tcp`'s timeouts) for
    /// [`NODE_SERVER_NAME`]; the stream and its [`channel_binding`].
    pub fn connect(mut tcp: TcpStream, config: &Arc<ClientConfig>) -> io::Result<(Self, [u8; CHANNEL_BINDING_BYTES])> {
        let mut conn = ClientConnection::new(Arc::clone(config), server_name()).map_err(io::Error::other)?;
        while conn.is_handshaking() {
            conn.complete_io(&mut tcp)?;
        }
        let binding = channel_binding(&conn)?;
        Ok((Self::Client(Box::new(StreamOwned::new(conn, tcp))), binding))
    }

    /// The TCP socket under it (timeouts, socket options).
    pub fn tcp(&self) -> &TcpStream {
        match self {
            Self::Plain(tcp) => tcp,
            Self::Server(tls) => tls.get_ref(),
            Self::Client(tls) => tls.get_ref(),
        }
    }

    /// Whether bytes go through TLS (so not `sendfile`).
    pub fn is_tls(&self) -> bool {
        !matches!(self, Self::Plain(_))
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => tcp.read(buf),
            Self::Server(tls) => tls.read(buf),
            Self::Client(tls) => tls.read(buf),
        }
    }
}

/// Writes through rustls and sends every record before returning, so a socket write that
/// times out fails this call (rustls' own `StreamOwned::write` ignores that error and may then
/// block in a read for the socket's read timeout).
fn write_through<D>(conn: &mut rustls::ConnectionCommon<D>, sock: &mut TcpStream, buf: &[u8]) -> io::Result<usize> {
    send_records(conn, sock)?;
    let written = conn.writer().write(buf)?;
    send_records(conn, sock)?;
    Ok(written)
}

/// Sends the encrypted records rustls holds.
fn send_records<D>(conn: &mut rustls::ConnectionCommon<D>, sock: &mut TcpStream) -> io::Result<()> {
    while conn.wants_write() {
        if conn.write_tls(sock)? == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
    }
    Ok(())
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => tcp.write(buf),
            Self::Server(tls) => write_through(&mut *tls.conn, &mut tls.sock, buf),
            Self::Client(tls) => write_through(&mut *tls.conn, &mut tls.sock, buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(tcp) => tcp.flush(),
            Self::Server(tls) => {
                tls.conn.writer().flush()?;
                send_records(&mut *tls.conn, &mut tls.sock)
            }
            Self::Client(tls) => {
                tls.conn.writer().flush()?;
                send_records(&mut *tls.conn, &mut tls.sock)
            }
        }
    }
}

#[cfg(test)]
mod tests;

//! The local certificate authority of `tessera up --tls` and `tessera tls-cert`: a CA key and
//! certificate kept in a directory (the cluster's `tls/` for `up`; made once, reused by every
//! later start so that clients keep trusting it), and server certificates issued from it for
//! the names clients use (`up` issues a fresh one for its gateway at every start: localhost,
//! 127.0.0.1, ::1 and the gateway's own address).
//!
//! Keys are ECDSA P-256 (rcgen's default), written mode 0600 (through a fresh temporary file,
//! never through a link someone left there); a directory made here is mode 0700, an existing one
//! others can read or write gets a warning. A CA directory this code did not make (another
//! tool's `ca.pem`, or a `ca.pem` that is not `ca-key.pem`'s) is refused, never signed as if it
//! were ours: its certificates would not chain to the `ca.pem` clients trust.

use std::fs;
use std::io::Write as _;
use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use sha2::Digest as _;

/// How long the CA is valid.
const CA_VALIDITY: time::Duration = time::Duration::days(3650);
/// How long a server certificate is valid: the most browsers accept. `up` issues a new one for
/// its gateway at every start.
const SERVER_VALIDITY: time::Duration = time::Duration::days(397);
/// Certificates are valid from this long before they are made, for clocks a little behind.
const CLOCK_SKEW: time::Duration = time::Duration::hours(1);

/// A server certificate and key issued from the CA, and the CA certificate clients should trust.
#[derive(Clone, Debug)]
pub(crate) struct ServerCertificate {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// `tessera tls-cert`: issue a server certificate from a local CA.
#[derive(Debug, clap::Args)]
pub(crate) struct TlsCertArgs {
    /// Directory of the CA (made there if it has none; `tessera up --tls` keeps its CA in
    /// DATA/tls).
    #[arg(long)]
    dir: PathBuf,
    /// A DNS name or IP address the certificate is for (repeat it); default localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long = "name", value_name = "NAME")]
    names: Vec<String>,
    /// File name stem of the certificate and key: DIR/STEM.pem and DIR/STEM-key.pem.
    #[arg(long, default_value = "server", value_parser = file_stem)]
    stem: String,
}

fn file_stem(value: &str) -> Result<String, String> {
    let ok = !value.is_empty()
        && value.len() <= 64
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !value.starts_with("ca")
        && !value.ends_with("-key")
        && value != "gateway";
    if ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?}: letters, digits, - and _ only; not starting with \"ca\" or ending with \"-key\" \
             (the CA's and keys' files), not \"gateway\" (tessera up's)"
        ))
    }
}

pub(crate) fn tls_cert(args: &TlsCertArgs) -> anyhow::Result<()> {
    let names = if args.names.is_empty() { local_names() } else { args.names.clone() };
    let cert = issue(&args.dir, &args.stem, names)?;
    println!("certificate: {}", cert.cert.display());
    println!("key: {}", cert.key.display());
    println!("CA certificate (trust it in clients): {}", cert.ca.display());
    Ok(())
}

fn local_names() -> Vec<String> {
    vec!["localhost".to_owned(), "127.0.0.1".to_owned(), "::1".to_owned()]
}

/// Makes the CA in `dir` if it has none, then issues `up`'s gateway certificate for `s3`.
pub(crate) fn gateway_certificate(dir: &Path, s3: SocketAddr) -> anyhow::Result<ServerCertificate> {
    let mut names = local_names();
    let ip = s3.ip();
    if ip.is_unspecified() {
        eprintln!(
            "warning: the gateway listens on {ip}; its certificate names only localhost, 127.0.0.1 and ::1, \
             so clients on other hosts will refuse it (issue one for their name with `tessera tls-cert`)"
        );
    } else if !ip.is_loopback() {
        names.push(ip.to_string());
    }
    issue(dir, "gateway", names)
}

/// Makes the CA in `dir` if it has none, then issues a server certificate for `names` as
/// `dir/stem.pem` and `dir/stem-key.pem`.
fn issue(dir: &Path, stem: &str, names: Vec<String>) -> anyhow::Result<ServerCertificate> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .with_context(|| format!("create {}", dir.display()))?;
    let mode = fs::metadata(dir).with_context(|| format!("read {}", dir.display()))?.permissions().mode();
    if mode & 0o077 != 0 {
        eprintln!(
            "warning: {} has mode {:o}: other users can list it (the keys in it are 0600; chmod 700 it)",
            dir.display(),
            mode & 0o777
        );
    }
    let (ca_path, ca_key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
    match (ca_path.exists(), ca_key_path.exists()) {
        (true, true) => {}
        (false, false) => {
            let key = KeyPair::generate().context("generate the CA key")?;
            let now = time::OffsetDateTime::now_utc();
            let mut params = ca_params(&key);
            (params.not_before, params.not_after) = (now - CLOCK_SKEW, now + CA_VALIDITY);
            let cert = params.self_signed(&key).context("make the CA certificate")?;
            write_file(&ca_key_path, key.serialize_pem().as_bytes(), 0o600)?;
            write_file(&ca_path, cert.pem().as_bytes(), 0o644)?;
            eprintln!("made a local CA in {} (trust {} in clients)", dir.display(), ca_path.display());
        }
        _ => bail!(
            "{} holds only one of ca.pem and ca-key.pem: restore the other, or remove both to make a new CA \
             (clients must then trust the new ca.pem)",
            dir.display()
        ),
    };
    // Read back even when just made: two first runs at once each write both files, and only a
    // matching pair may sign.
    let ca_key = load_ca(&ca_path, &ca_key_path)?;
    let issuer = Issuer::new(ca_params(&ca_key), ca_key);
    let common_name = names.first().cloned().unwrap_or_default();
    let mut params = CertificateParams::new(names).context("the certificate's names")?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.use_authority_key_identifier_extension = true;
    let now = time::OffsetDateTime::now_utc();
    (params.not_before, params.not_after) = (now - CLOCK_SKEW, now + SERVER_VALIDITY);
    let key = KeyPair::generate().context("generate the server key")?;
    let cert = params.signed_by(&key, &issuer).context("issue the server certificate")?;
    let (cert_path, key_path) = (dir.join(format!("{stem}.pem")), dir.join(format!("{stem}-key.pem")));
    write_file(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&cert_path, cert.pem().as_bytes(), 0o644)?;
    Ok(ServerCertificate { ca: ca_path, cert: cert_path, key: key_path })
}

/// The CA's key, after checking that `ca.pem` is the certificate this code made for it: its
/// public key is the key's and its name is [`ca_params`]'s (so what the key signs names the
/// issuer `ca.pem` is).
fn load_ca(ca_path: &Path, ca_key_path: &Path) -> anyhow::Result<KeyPair> {
    let pem = fs::read_to_string(ca_key_path).with_context(|| format!("read {}", ca_key_path.display()))?;
    let key = KeyPair::from_pem(&pem).with_context(|| format!("{} is not a PEM private key", ca_key_path.display()))?;
    let cert_pem = fs::read(ca_path).with_context(|| format!("read {}", ca_path.display()))?;
    let (_, pem) = x509_parser::pem::parse_x509_pem(&cert_pem)
        .map_err(|e| anyhow::anyhow!("{} is not a PEM certificate: {e}", ca_path.display()))?;
    let cert = pem.parse_x509().map_err(|e| anyhow::anyhow!("{} cannot be parsed: {e}", ca_path.display()))?;
    let expected = ca_common_name(&key);
    let name = cert.subject().iter_common_name().next().and_then(|cn| cn.as_str().ok()).unwrap_or_default();
    if cert.public_key().subject_public_key.data.as_ref() != key.public_key_raw() || name != expected {
        bail!(
            "{} is not the certificate tessera made for {} (a CA of another tool, or files of two CAs): \
             use another directory, or remove both files to make a new CA (clients must then trust the new ca.pem)",
            ca_path.display(),
            ca_key_path.display()
        );
    }
    Ok(key)
}

fn ca_common_name(key: &KeyPair) -> String {
    format!("Tessera local CA {}", hex::encode(&sha2::Sha256::digest(key.public_key_raw())[..8]))
}

/// The CA's parameters, the same for every start: its name carries a fingerprint of its key
/// (two clusters' CAs never share a name), so a certificate issued later chains to the stored
/// CA certificate.
fn ca_params(key: &KeyPair) -> CertificateParams {
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::OrganizationName, "Tessera");
    params.distinguished_name.push(DnType::CommonName, ca_common_name(key));
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    params
}

/// Writes `path` whole (through a temporary file and a rename) with `mode`.
fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    // A leftover from an interrupted write goes; then a new file or nothing (O_EXCL: a link
    // planted meanwhile is not followed), so `mode` applies and no one else holds it open.
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    file.write_all(bytes).and_then(|()| file.sync_all()).with_context(|| format!("write {}", tmp.display()))?;
    fs::rename(&tmp, path).with_context(|| format!("write {}", path.display()))
}

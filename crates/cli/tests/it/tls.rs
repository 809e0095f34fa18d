//! HTTPS on the gateway: what is wrong with a certificate is one line of error at start, and
//! `tessera bench --s3 https://` writes and reads through it when it trusts the issuing CA
//! (and not otherwise); one about to expire starts with a warning.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair, KeyUsagePurpose};

use crate::harness::{Cluster, Shape, TESSERA, free_ports, write_file};

const ACCESS_KEY: &str = "tls-test-access";
const SECRET_KEY: &str = "tls-test-secret-key";

/// A CA, and certificates for 127.0.0.1 issued by it, written into a temp dir.
struct Pki {
    dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(rcgen::DnType::CommonName, "tls test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let ca = params.self_signed(&key).unwrap();
        write_file(dir.path(), "ca.pem", ca.pem().as_bytes());
        Self { dir, issuer: Issuer::new(params, key) }
    }

    fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A certificate for 127.0.0.1 valid from `not_before` to `not_after` days from now, and
    /// its key: `(cert, key)`.
    fn issue(&self, name: &str, not_before: i64, not_after: i64) -> (PathBuf, PathBuf) {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now + time::Duration::days(not_before);
        params.not_after = now + time::Duration::days(not_after);
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let cert_path = write_file(self.dir.path(), &format!("{name}.pem"), cert.pem().as_bytes());
        let key_path = write_file(self.dir.path(), &format!("{name}-key.pem"), key.serialize_pem().as_bytes());
        (cert_path, key_path)
    }
}

fn gateway(cluster: &Cluster, port: u16, cert: &Path, key: &Path) -> Command {
    let mut command = Command::new(TESSERA);
    command
        .args(["gateway", "--config"])
        .arg(&cluster.config)
        .args(["--listen", &format!("127.0.0.1:{port}"), "--tls-cert"])
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .env("TESSERA_ACCESS_KEY", ACCESS_KEY)
        .env("TESSERA_SECRET_KEY", SECRET_KEY)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null());
    command
}

/// Starts a gateway that must refuse its certificate: its one line of error.
fn start_error(cluster: &Cluster, cert: &Path, key: &Path) -> String {
    let output = gateway(cluster, free_ports(1), cert, key).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "the gateway started with {cert:?} and {key:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
    stderr
}

fn bench(op: &str, endpoint: &str, ca: Option<&Path>) -> Output {
    let mut command = Command::new(TESSERA);
    command.args(["bench", op, "--s3", endpoint, "--size", "256KiB", "--objects", "4", "--duration", "1s", "--json"]);
    if let Some(ca) = ca {
        command.arg("--ca-bundle").arg(ca);
    }
    command.env("TESSERA_ACCESS_KEY", ACCESS_KEY).env("TESSERA_SECRET_KEY", SECRET_KEY).stdin(Stdio::null());
    command.output().unwrap()
}

fn ok_ops(output: &Output) -> u64 {
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "bench failed: {stdout}{}", String::from_utf8_lossy(&output.stderr));
    stdout.split("\"ops\":").nth(1).and_then(|rest| rest.split(',').next()).unwrap().parse().unwrap()
}

fn wait_listening(child: &mut Child, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(child.try_wait().unwrap().is_none(), "the gateway exited at start");
        assert!(Instant::now() < deadline, "the gateway did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_gateway_refuses_a_missing_expired_early_or_mismatched_certificate_in_one_line() {
    let cluster = Cluster::start(Shape::default());
    let pki = Pki::new();
    let (good, good_key) = pki.issue("good", -1, 30);
    let missing = pki.dir.path().join("missing.pem");
    let err = start_error(&cluster, &missing, &good_key);
    assert!(err.contains("read the TLS certificate") && err.contains("missing.pem"), "{err}");
    let err = start_error(&cluster, &good, &missing);
    assert!(err.contains("read the TLS key") && err.contains("missing.pem"), "{err}");
    let empty = write_file(pki.dir.path(), "empty.pem", b"not a certificate\n");
    let err = start_error(&cluster, &empty, &good_key);
    assert!(err.contains("holds no PEM certificate"), "{err}");
    let err = start_error(&cluster, &good, &empty);
    assert!(err.contains("holds no PEM private key"), "{err}");
    let (expired, expired_key) = pki.issue("expired", -30, -1);
    let err = start_error(&cluster, &expired, &expired_key);
    assert!(err.contains("expired on"), "{err}");
    let (early, early_key) = pki.issue("early", 2, 30);
    let err = start_error(&cluster, &early, &early_key);
    assert!(err.contains("is not valid before"), "{err}");
    let (_, other_key) = pki.issue("other", -1, 30);
    let err = start_error(&cluster, &good, &other_key);
    assert!(err.contains("does not belong to the certificate"), "{err}");
    // Both or neither.
    for (given, file, missing) in [("--tls-cert", &good, "--tls-key"), ("--tls-key", &good_key, "--tls-cert")] {
        let output = Command::new(TESSERA)
            .args(["gateway", "--config"])
            .arg(&cluster.config)
            .arg(given)
            .arg(file)
            .env("TESSERA_ACCESS_KEY", ACCESS_KEY)
            .env("TESSERA_SECRET_KEY", SECRET_KEY)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(missing), "{given} alone: {stderr}");
    }
}

#[test]
fn s3_over_https_works_with_the_issuing_ca_and_is_refused_without_it() {
    let cluster = Cluster::start(Shape::default());
    let pki = Pki::new();
    // Valid for a week: inside `s3::EXPIRY_WARNING`, so the gateway starts with a warning.
    let (cert, key) = pki.issue("gateway", -1, 7);
    let port = free_ports(1);
    // Debug logs of the s3 crate name how each connection ended.
    let mut child = gateway(&cluster, port, &cert, &key)
        .env("TESSERA_LOG", "info,s3=debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_listening(&mut child, port);
    let https = format!("https://127.0.0.1:{port}");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert!(ok_ops(&bench("put", &https, Some(&pki.ca()))) > 0, "PUTs over HTTPS");
        assert!(ok_ops(&bench("get", &https, Some(&pki.ca()))) > 0, "GETs over HTTPS");
        // Another CA's certificate, or the system's CAs: the client refuses the gateway.
        let stranger = Pki::new();
        for ca in [Some(stranger.ca()), None] {
            let output = bench("put", &https, ca.as_deref());
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(!output.status.success() && stderr.contains("invalid peer certificate"), "{ca:?}: {stderr}");
        }
        // Plain HTTP to the HTTPS port gets no S3 answer (an S3 error would read "answered 4xx").
        let output = bench("put", &format!("http://127.0.0.1:{port}"), None);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "plain HTTP was served on the HTTPS port");
        assert!(stderr.contains("HTTP request to") && !stderr.contains("answered"), "{stderr}");
    }));
    // Asked to stop while a client stalls in its handshake (connected, nothing sent): the
    // gateway stops that connection instead of waiting out SHUTDOWN_TIMEOUT for it.
    let stalled = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    // SAFETY: kill(2) on a child we spawned and have not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    let output = child.wait_with_output().unwrap();
    drop(stalled);
    if let Err(panic) = result {
        eprintln!("gateway log:\n{}", String::from_utf8_lossy(&output.stderr));
        std::panic::resume_unwind(panic);
    }
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(log.contains(&format!("listening on https://127.0.0.1:{port}")), "{log}");
    assert!(log.contains("the TLS certificate expires in 6days"), "{log}");
    assert!(log.contains("shutdown during the TLS handshake"), "the stalled handshake was not stopped: {log}");
    assert!(!log.contains("requests still running"), "shutdown waited for a stalled handshake: {log}");
}

fn tls_cert(args: &[&str]) -> Output {
    Command::new(TESSERA).arg("tls-cert").args(args).stdin(Stdio::null()).output().unwrap()
}

#[test]
fn tls_cert_keeps_its_ca_keeps_keys_private_and_refuses_a_ca_it_did_not_make() {
    use std::os::unix::fs::PermissionsExt as _;
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ca");
    let dir_arg = dir.to_str().unwrap();
    let first = tls_cert(&["--dir", dir_arg, "--name", "127.0.0.1"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let mode = |name: &str| std::fs::metadata(dir.join(name)).unwrap().permissions().mode() & 0o777;
    assert_eq!((mode(""), mode("ca-key.pem"), mode("server-key.pem")), (0o700, 0o600, 0o600));
    let ca = std::fs::read(dir.join("ca.pem")).unwrap();
    let second = tls_cert(&["--dir", dir_arg, "--stem", "other"]);
    assert!(second.status.success(), "{}", String::from_utf8_lossy(&second.stderr));
    assert_eq!(std::fs::read(dir.join("ca.pem")).unwrap(), ca, "the CA is kept");
    assert!(dir.join("other.pem").exists() && dir.join("other-key.pem").exists());
    // Names that would overwrite the CA's files, a key, or `tessera up`'s gateway certificate.
    for stem in ["ca", "cafe", "x-key", "gateway", "../up", ""] {
        let output = tls_cert(&["--dir", dir_arg, "--stem", stem]);
        assert!(!output.status.success(), "stem {stem:?} was taken");
    }
    // Another tool's CA (same file names as cfssl's), or our key beside another CA's
    // certificate: refused, nothing issued in its name.
    let foreign = root.path().join("foreign");
    std::fs::create_dir(&foreign).unwrap();
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::default();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    write_file(&foreign, "ca.pem", params.self_signed(&key).unwrap().pem().as_bytes());
    write_file(&foreign, "ca-key.pem", key.serialize_pem().as_bytes());
    let mixed = root.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    std::fs::copy(foreign.join("ca.pem"), mixed.join("ca.pem")).unwrap();
    std::fs::copy(dir.join("ca-key.pem"), mixed.join("ca-key.pem")).unwrap();
    for bad in [&foreign, &mixed] {
        let output = tls_cert(&["--dir", bad.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains("is not the certificate tessera made"), "{stderr}");
        assert!(!bad.join("server.pem").exists(), "a certificate was issued in a foreign CA's name");
    }
}

#[test]
fn sighup_reloads_the_certificate_for_new_connections_and_keeps_it_when_the_new_one_is_bad() {
    // On 2862b84 the gateway read its certificate once: a renewal needed a restart (and
    // SIGHUP killed it).
    let cluster = Cluster::start(Shape::default());
    let (first_ca, second_ca) = (Pki::new(), Pki::new());
    let (cert, key) = first_ca.issue("gateway", -1, 30);
    let port = free_ports(1);
    let mut child = gateway(&cluster, port, &cert, &key).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().unwrap();
    let log = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let reader = {
        let log = std::sync::Arc::clone(&log);
        let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
        std::thread::spawn(move || {
            let mut line = String::new();
            while std::io::BufRead::read_line(&mut stderr, &mut line).is_ok_and(|n| n > 0) {
                log.lock().unwrap().push_str(&std::mem::take(&mut line));
            }
        })
    };
    let wait_log = |text: &str| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !log.lock().unwrap().contains(text) {
            assert!(Instant::now() < deadline, "no {text:?} in the gateway's log: {}", log.lock().unwrap());
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let hangup = |child: &Child| {
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
    };
    let https = format!("https://127.0.0.1:{port}");
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        wait_log("send SIGHUP to reload");
        assert!(ok_ops(&bench("put", &https, Some(&first_ca.ca()))) > 0, "served with the first CA's certificate");
        // The renewal lands in the same files, from another CA, and a SIGHUP takes it.
        let (renewed, renewed_key) = second_ca.issue("renewed", -1, 60);
        std::fs::copy(&renewed, &cert).unwrap();
        std::fs::copy(&renewed_key, &key).unwrap();
        hangup(&child);
        wait_log("TLS certificate reloaded");
        assert!(ok_ops(&bench("put", &https, Some(&second_ca.ca()))) > 0, "served with the renewed certificate");
        let output = bench("put", &https, Some(&first_ca.ca()));
        assert!(!output.status.success(), "the old certificate is no longer served");
        // A broken file: the gateway says so and keeps serving the renewed certificate.
        std::fs::write(&cert, b"not a certificate\n").unwrap();
        hangup(&child);
        wait_log("TLS certificate not reloaded, the served one stays");
        assert!(ok_ops(&bench("get", &https, Some(&second_ca.ca()))) > 0, "still served after a bad reload");
        assert!(child.try_wait().unwrap().is_none(), "SIGHUP did not stop the gateway");
    }));
    // SAFETY: as above.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    child.wait().unwrap();
    reader.join().unwrap();
    if let Err(panic) = result {
        eprintln!("gateway log:\n{}", log.lock().unwrap());
        std::panic::resume_unwind(panic);
    }
}

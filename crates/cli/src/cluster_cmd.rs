//! `tessera init`, `tessera node`, `tessera gateway` and the `tessera up` supervisor.

use std::fs;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cluster::{CHUNK_BYTES_DEFAULT, ClusterMap, ErasureConfig, InitSpec, NodeSpec};

use crate::size::parse_bytes;

/// How long `up` waits for every node and the gateway to accept connections.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Environment variables of the S3 root credentials.
const ACCESS_KEY_ENV: &str = "TESSERA_ACCESS_KEY";
const SECRET_KEY_ENV: &str = "TESSERA_SECRET_KEY";
/// Lengths and alphabets of the credentials `up` generates (AWS's shapes).
const ACCESS_KEY_CHARS: usize = 20;
const SECRET_KEY_CHARS: usize = 40;
const ACCESS_KEY_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
const SECRET_KEY_ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
/// How long `up` waits for children to exit after SIGTERM before it kills them.
const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("layout").required(true).args(["nodes", "node", "hosts"])))]
pub(crate) struct InitArgs {
    /// Number of storage nodes, all on this machine (127.0.0.1).
    #[arg(long, conflicts_with_all = ["node", "hosts"])]
    nodes: Option<usize>,
    /// With --nodes: drives (directories) per node.
    #[arg(long, default_value_t = 1, requires = "nodes")]
    drives_per_node: usize,
    /// A node of a cluster across hosts, as IP:PORT (one drive), IP:PORT=COUNT (drives
    /// nI/d1.. beside cluster.toml) or IP:PORT=PATH,PATH... (drive directories on that host).
    /// Repeat it once per node; nodes are named n1, n2... in order.
    #[arg(long, value_name = "IP:PORT[=DRIVES]", conflicts_with = "hosts")]
    node: Vec<NodeSpec>,
    /// A file with one IP:PORT[=DRIVES] per line (as --node; blank lines and # comments are
    /// skipped).
    #[arg(long, value_name = "FILE")]
    hosts: Option<PathBuf>,
    /// Erasure config K+M: K data and M parity chunks per stripe.
    #[arg(long, default_value = "4+2")]
    ec: ErasureConfig,
    /// Directory for cluster.toml (and, with --nodes, the drives).
    #[arg(long)]
    data: PathBuf,
    /// With --nodes: node i listens on 127.0.0.1:(base-port + i - 1).
    #[arg(long, default_value_t = 7001)]
    base_port: u16,
    /// Bytes per chunk (a stripe holds K chunks of object data).
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    chunk_size: u64,
    /// Run the node protocol (clients, gateways and nodes to nodes) over TLS, with
    /// certificates from a cluster CA made now and kept in cluster.toml. auto: on unless every
    /// node's address is a loopback one.
    #[arg(long, value_enum, default_value_t = NodeTlsMode::Auto)]
    node_tls: NodeTlsMode,
}

/// Whether a new cluster's node protocol runs over TLS (`init --node-tls`, `up --node-tls`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum NodeTlsMode {
    /// On unless every node's address is a loopback one (a cluster on one machine).
    Auto,
    On,
    Off,
}

/// Makes a cluster CA in `map` when `mode` says the node protocol runs over TLS; whether it did.
fn set_node_tls(map: &mut ClusterMap, mode: NodeTlsMode) -> anyhow::Result<bool> {
    let all_loopback = map.nodes.iter().all(|node| node.addr.ip().is_loopback());
    let on = match mode {
        NodeTlsMode::Auto => !all_loopback,
        NodeTlsMode::On => true,
        NodeTlsMode::Off => false,
    };
    if on {
        let ca = nodetls::ClusterCa::generate().context("make the cluster CA")?;
        map.node_tls = Some(cluster::NodeTls { ca_cert: ca.cert_pem().to_owned(), ca_key: ca.key_pem().to_owned() });
    } else if !all_loopback {
        eprintln!(
            "warning: --node-tls off: the node protocol between hosts is authenticated but not encrypted \
             (object bytes and the cluster map cross the network in the clear)"
        );
    }
    Ok(on)
}

#[derive(Debug, clap::Args)]
pub(crate) struct UpArgs {
    /// Directory of the cluster (created with `init` defaults if it has no cluster.toml).
    #[arg(long, default_value = "tessera-data")]
    data: PathBuf,
    /// Nodes, when the cluster is created.
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// Erasure config, when the cluster is created.
    #[arg(long, default_value = "4+2")]
    ec: ErasureConfig,
    /// Base port, when the cluster is created.
    #[arg(long, default_value_t = 7001)]
    base_port: u16,
    /// Address of the S3 gateway.
    #[arg(long, default_value = "127.0.0.1:9000")]
    s3: SocketAddr,
    /// Serve S3 over HTTPS, with a certificate from a local CA kept in DATA/tls (created on the
    /// first such start; trust DATA/tls/ca.pem in clients). A fresh gateway certificate is
    /// issued at every start.
    #[arg(long)]
    tls: bool,
    /// Serve Prometheus metrics: the gateway's at http://ADDR/metrics, each node's on the ports
    /// after ADDR's (the first node in cluster.toml at port+1, ...). Off unless given.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// Address of the web console (log in with the S3 credentials printed at start).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9001")]
    console: SocketAddr,
    /// Serve no web console.
    #[arg(long)]
    no_console: bool,
    /// Node protocol over TLS, when the cluster is created (as `init --node-tls`; auto is off
    /// for this cluster on 127.0.0.1).
    #[arg(long, value_enum, default_value_t = NodeTlsMode::Auto)]
    node_tls: NodeTlsMode,
}

/// Where `up --metrics-listen ADDR` serves the metrics of the gateway (index `None`) and of node
/// `Some(i)` (in cluster.toml order): ADDR, then the ports after it.
fn up_metrics_addr(base: SocketAddr, node: Option<usize>) -> anyhow::Result<SocketAddr> {
    let offset = node.map_or(0, |i| i + 1);
    let port = u16::try_from(usize::from(base.port()) + offset)
        .ok()
        .filter(|_| base.port() != 0)
        .with_context(|| format!("--metrics-listen {base}: give a port with room for one per node after it"))?;
    Ok(SocketAddr::new(base.ip(), port))
}

#[derive(Debug, clap::Args)]
pub(crate) struct GatewayArgs {
    /// Path of cluster.toml [env: TESSERA_CONFIG]
    #[arg(long, env = "TESSERA_CONFIG", hide_env = true)]
    config: PathBuf,
    /// Address to serve S3 on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Also serve requests signed with Signature Version 2 (legacy clients), with their Date
    /// header checked against replays. Off by default: SigV4 only.
    #[arg(long)]
    allow_sigv2: bool,
    /// A base domain for virtual-hosted-style requests (`BUCKET.DOMAIN`), besides `localhost`
    /// which always works; repeat for several. Point a wildcard DNS record `*.DOMAIN` at the
    /// gateway. Without it, clients must use path-style addressing for other host names.
    #[arg(long, value_name = "DOMAIN")]
    domain: Vec<String>,
    /// Multipart uploads initiated longer ago than this are aborted, pieces included
    /// (checked every `--multipart-check-interval`).
    #[arg(long, default_value = "7d", value_parser = positive_duration)]
    multipart_expiry: Duration,
    #[arg(long, default_value = "1h", value_parser = positive_duration)]
    multipart_check_interval: Duration,
    /// Object bytes per second the gateway rewrites in the background to store uploaded
    /// Parquet objects (`*.parquet`) in the aligned layout, each row group inside one chunk, so
    /// that queries read every row group on one node; 0 turns it off.
    #[arg(long, default_value = "64MiB", value_parser = crate::size::parse_bytes)]
    relayout_rate: u64,
    /// The region the gateway answers as: bucket locations, and CreateBucket of a bucket you
    /// already own (200 in us-east-1, BucketAlreadyOwnedByYou elsewhere, as S3 answers).
    #[arg(long, default_value = s3::DEFAULT_REGION, value_parser = region_name)]
    region: String,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given: then the gateway
    /// counts nothing, unless --console-listen's charts need its counters).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Serve HTTPS with this certificate chain (PEM, leaf first); needs --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The certificate's private key (PEM); needs --tls-cert.
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Serve the web console at http://ADDR/ (log in with S3 credentials). Off unless given.
    /// HTTPS with --tls-cert/--tls-key (the gateway's certificate), else plain HTTP: then keep
    /// it on a loopback or trusted address.
    #[arg(long, value_name = "ADDR")]
    console_listen: Option<SocketAddr>,
    /// How long a console login lasts.
    #[arg(long, default_value = "8h", value_parser = positive_duration)]
    console_session_ttl: Duration,
}

/// An AWS-style region name: lowercase letters, digits and dashes.
fn region_name(value: &str) -> Result<String, String> {
    let ok = (2..=32).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !value.starts_with('-')
        && !value.ends_with('-');
    if ok { Ok(value.to_owned()) } else { Err(format!("{value:?} is not a region name (like us-east-1)")) }
}

#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// Path of cluster.toml.
    #[arg(long)]
    config: PathBuf,
    /// Node id from cluster.toml (n1, n2, ...).
    #[arg(long)]
    id: String,
    /// Address to listen on, when it is not the node's address in cluster.toml (which is what
    /// clients and peers dial): 0.0.0.0:PORT, or a private address behind NAT or in a container.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// How long a replaced version stays readable once a newer one is acknowledged (GETs
    /// that chose it have this long to finish).
    #[arg(long, default_value = "10m", value_parser = humantime::parse_duration)]
    retire_grace: Duration,
    /// How often the node scrubs its drives: compares every key with the other drives of its
    /// set and checks its own data files, queueing what is missing or damaged for repair.
    #[arg(long, default_value = "1h", value_parser = positive_duration)]
    scrub_interval: Duration,
    /// How often a scrub is deep: it also reads every chunk and checks its block checksums
    /// (paced by the repair budget).
    #[arg(long, default_value = "7d", value_parser = positive_duration)]
    deep_scrub_interval: Duration,
    /// How long the scrubber watches a failed write's leftover (a version no reader can take,
    /// on fewer drives than a write needs) before removing it: longer than any client's
    /// request timeout, so no writer still deciding loses its version.
    #[arg(long, default_value = "10m", value_parser = positive_duration)]
    leftover_gc_after: Duration,
    /// Memory one near-data query may use on this node (at most 4 run at once); a query that
    /// needs more fails with an error saying so.
    #[arg(long, default_value = "256MiB", value_parser = crate::size::parse_bytes)]
    query_memory: u64,
    /// How often a near-data query that has found nothing to send yet tells its client it is
    /// alive (a client takes a node silent for 2 minutes for hung). A dropped query stops at
    /// the next heartbeat at the latest.
    #[arg(long, default_value = "5s", value_parser = heartbeat_interval)]
    query_heartbeat: Duration,
    /// Serve batched reads without telling the kernel about their ranges first (read-ahead
    /// hints let the disk work on many small ranges at once): for measuring what they gain.
    #[arg(long)]
    no_read_hints: bool,
    /// Serve Prometheus metrics at http://ADDR/metrics (off unless given).
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
}

fn heartbeat_interval(text: &str) -> Result<Duration, String> {
    let interval = positive_duration(text)?;
    let max = client::QUERY_SILENCE_MAX / 4;
    if interval > max {
        return Err(format!("invalid interval {text:?}: at most {}s (clients wait 4 times that)", max.as_secs()));
    }
    Ok(interval)
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    let duration = humantime::parse_duration(text).map_err(|e| format!("invalid duration {text:?}: {e}"))?;
    if duration.is_zero() {
        return Err(format!("invalid duration {text:?}: it must be above zero"));
    }
    Ok(duration)
}

pub(crate) fn init(args: &InitArgs) -> anyhow::Result<()> {
    let chunk_bytes = u32::try_from(args.chunk_size).context("--chunk-size is too large")?;
    let Some(nodes) = args.nodes else {
        let nodes = match &args.hosts {
            Some(path) => read_hosts(path)?,
            None => args.node.clone(),
        };
        let (path, tls) = init_hosts(&nodes, args.ec, chunk_bytes, &args.data, args.node_tls)?;
        println!("wrote {} for {} nodes", path.display(), nodes.len());
        if tls {
            println!("the node protocol runs over TLS (the cluster CA is in it; --node-tls off for plain TCP)");
        }
        println!("on each node's host, with a copy of it (mode 0600: it holds the cluster secret):");
        println!("  tessera drive format --config {} --node nI   # once: prepares that node's drives", path.display());
        println!("  tessera node --config {} --id nI", path.display());
        println!("(deploy/ has a systemd unit)");
        return Ok(());
    };
    let spec = InitSpec {
        nodes,
        drives_per_node: args.drives_per_node,
        erasure: args.ec,
        base_port: args.base_port,
        chunk_bytes,
    };
    let (path, tls) = init_cluster(&spec, &args.data, args.node_tls)?;
    println!("wrote {}", path.display());
    if tls {
        println!("the node protocol runs over TLS (the cluster CA is in it)");
    }
    println!(
        "start the nodes with `tessera node --config {} --id n1` (and n2...), or run `tessera up --data {}`",
        path.display(),
        args.data.display()
    );
    Ok(())
}

/// Most lines of a `--hosts` file.
const HOSTS_LINES_MAX: usize = 4096;

/// The nodes of a `--hosts` file: one `IP:PORT[=DRIVES]` per line.
pub(crate) fn read_hosts(path: &Path) -> anyhow::Result<Vec<NodeSpec>> {
    let text = fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
    let mut nodes = Vec::new();
    for (line_idx, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        if line.is_empty() {
            continue;
        }
        if nodes.len() == HOSTS_LINES_MAX {
            bail!("{} lists more than {HOSTS_LINES_MAX} nodes", path.display());
        }
        nodes.push(line.parse().with_context(|| format!("{} line {}", path.display(), line_idx + 1))?);
    }
    Ok(nodes)
}

/// Writes a new cluster.toml for nodes on several hosts; formats nothing (the drives are on
/// the nodes' hosts: `tessera drive format` there).
fn init_hosts(
    nodes: &[NodeSpec],
    erasure: ErasureConfig,
    chunk_bytes: u32,
    data: &Path,
    node_tls: NodeTlsMode,
) -> anyhow::Result<(PathBuf, bool)> {
    let path = refuse_existing(data)?;
    let (cluster_id, secret) = new_identity();
    let mut map = ClusterMap::generate_hosts(nodes, erasure, chunk_bytes, &cluster_id, &secret, data)
        .context("plan the cluster")?;
    let tls = set_node_tls(&mut map, node_tls)?;
    fs::create_dir_all(data).with_context(|| format!("create {}", data.display()))?;
    write_map(&path, &map)?;
    Ok((path, tls))
}

/// DIR/cluster.toml, unless it exists already.
fn refuse_existing(data: &Path) -> anyhow::Result<PathBuf> {
    let path = data.join("cluster.toml");
    if path.exists() {
        bail!(
            "{} already exists: this directory holds a cluster (remove it to start over, or pick another --data)",
            path.display()
        );
    }
    Ok(path)
}

/// A new cluster's id and secret.
fn new_identity() -> (String, String) {
    (hex::encode(rand::random::<[u8; 8]>()), hex::encode(rand::random::<[u8; 32]>()))
}

/// Writes cluster.toml (mode 0600: it holds the cluster secret), crash-safe.
pub(crate) fn write_map(path: &Path, map: &ClusterMap) -> anyhow::Result<()> {
    node::write_map_file(path, &map.to_toml()).with_context(|| format!("write {}", path.display()))
}

/// Writes a new cluster.toml and formats the drives.
fn init_cluster(spec: &InitSpec, data: &Path, node_tls: NodeTlsMode) -> anyhow::Result<(PathBuf, bool)> {
    let path = refuse_existing(data)?;
    let (cluster_id, secret) = new_identity();
    let mut map = ClusterMap::generate(spec, &cluster_id, &secret, data).context("plan the cluster")?;
    let tls = set_node_tls(&mut map, node_tls)?;
    fs::create_dir_all(data).with_context(|| format!("create {}", data.display()))?;
    node::format_drives(&map).context("prepare the drives")?;
    write_map(&path, &map)?;
    Ok((path, tls))
}

/// Reads and validates a cluster map; relative drive paths resolve against its directory.
pub(crate) fn load_map(path: &Path) -> anyhow::Result<(ClusterMap, String)> {
    let text = fs::read_to_string(path).with_context(|| format!("read cluster map {}", path.display()))?;
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() { PathBuf::from(".") } else { base_dir };
    let map = ClusterMap::from_toml(&text, &base_dir).with_context(|| format!("load {}", path.display()))?;
    warn_if_readable_by_others(path);
    Ok((map, text))
}

/// cluster.toml holds the secret that authenticates every node connection: say so when other
/// users can read it (as ssh does for private keys), without refusing a working setup.
fn warn_if_readable_by_others(path: &Path) {
    use std::os::unix::fs::PermissionsExt as _;
    if let Ok(meta) = fs::metadata(path)
        && meta.permissions().mode() & 0o077 != 0
    {
        tracing::warn!(
            "{} is readable by other users (mode {:o}) and holds the cluster secret: chmod 600 it",
            path.display(),
            meta.permissions().mode() & 0o777
        );
    }
}

pub(crate) fn node(args: &NodeArgs) -> anyhow::Result<()> {
    crate::init_logging("info");
    let (map, map_text) = load_map(&args.config)?;
    let config = node::NodeConfig {
        map,
        map_text,
        map_path: Some(args.config.clone()),
        node_id: args.id.clone(),
        listen: args.listen,
        retire_grace: args.retire_grace,
        scrub_interval: args.scrub_interval,
        deep_scrub_interval: args.deep_scrub_interval,
        leftover_gc_after: args.leftover_gc_after,
        query_memory_bytes: usize::try_from(args.query_memory).unwrap_or(usize::MAX),
        query_heartbeat: args.query_heartbeat,
        read_hints: !args.no_read_hints,
    };
    let server = node::Server::bind(config).with_context(|| format!("start node {}", args.id))?;
    if let Some(addr) = args.metrics_listen {
        let metrics = server.metrics();
        let local = crate::metrics_http::serve_in_thread(addr, std::sync::Arc::new(move || metrics.render()))?;
        tracing::info!("metrics on http://{local}/metrics");
    }
    server.serve().context("serve")?;
    Ok(())
}

pub(crate) fn up(args: &UpArgs) -> anyhow::Result<()> {
    crate::init_logging("info");
    let config = args.data.join("cluster.toml");
    if !config.exists() {
        let spec = InitSpec {
            nodes: args.nodes,
            drives_per_node: 1,
            erasure: args.ec,
            base_port: args.base_port,
            chunk_bytes: CHUNK_BYTES_DEFAULT,
        };
        let (_, tls) = init_cluster(&spec, &args.data, args.node_tls)?;
        let transport = if tls { " (node protocol over TLS)" } else { "" };
        eprintln!("initialised a new {}-node {} cluster in {}{transport}", args.nodes, args.ec, args.data.display());
    }
    let (map, _) = load_map(&config)?;
    let asked = match args.node_tls {
        NodeTlsMode::Auto => None,
        mode => Some(mode == NodeTlsMode::On),
    };
    if asked.is_some_and(|on| on != map.node_tls.is_some()) {
        eprintln!(
            "warning: --node-tls applies when the cluster is created; {} already runs the node protocol over {} \
             (a cluster keeps its choice)",
            args.data.display(),
            if map.node_tls.is_some() { "TLS" } else { "plain TCP" }
        );
    }
    let credentials = up_credentials()?;
    let tls = match args.tls {
        true => Some(crate::local_ca::gateway_certificate(&args.data.join("tls"), args.s3)?),
        false => None,
    };
    let exe = std::env::current_exe().context("find the tessera binary")?;
    let mut children = Vec::new();
    let extra = UpExtras { metrics: args.metrics_listen, console: (!args.no_console).then_some(args.console) };
    check_up_ports(&map, args.s3, extra)?;
    let result = spawn_all(&exe, &map, &config, args.s3, &credentials, tls.as_ref(), extra, &mut children)
        .and_then(|()| supervise(&map, &config, args.s3, &credentials, tls.as_ref(), extra, &mut children));
    stop_children(&mut children);
    result
}

/// What `up` serves besides nodes and S3.
#[derive(Clone, Copy, Debug)]
struct UpExtras {
    /// `--metrics-listen`: the gateway's metrics there, node i's (0-based, cluster.toml order)
    /// at its port + 1 + i.
    metrics: Option<SocketAddr>,
    /// The web console's address.
    console: Option<SocketAddr>,
}

/// Refuses addresses of `up` that collide (a metrics port on a node's or the S3 port, ...),
/// naming both, before anything starts.
fn check_up_ports(map: &ClusterMap, s3: SocketAddr, extra: UpExtras) -> anyhow::Result<()> {
    let mut taken: Vec<(SocketAddr, String)> =
        map.nodes.iter().map(|node| (node.addr, format!("node {}", node.id))).collect();
    taken.push((s3, "the S3 gateway".into()));
    if let Some(console) = extra.console {
        taken.push((console, "the web console".into()));
    }
    if let Some(base) = extra.metrics {
        taken.push((up_metrics_addr(base, None)?, "the gateway's metrics".into()));
        for (i, node) in map.nodes.iter().enumerate() {
            taken.push((up_metrics_addr(base, Some(i))?, format!("node {}'s metrics", node.id)));
        }
    }
    taken.retain(|(addr, _)| addr.port() != 0); // port 0: the system picks a free one
    for (i, (addr, what)) in taken.iter().enumerate() {
        let same_port = |other: &SocketAddr| {
            other.port() == addr.port()
                && (other.ip() == addr.ip() || other.ip().is_unspecified() || addr.ip().is_unspecified())
        };
        if let Some((_, other)) = taken[..i].iter().find(|(other, _)| same_port(other)) {
            bail!("{what} and {other} would both listen on port {} (choose other addresses)", addr.port());
        }
    }
    Ok(())
}

/// A child process of `up`.
struct Proc {
    /// "node n1", "gateway".
    name: String,
    /// The command that restarts it by hand.
    restart: String,
    child: Child,
}

/// S3 root credentials.
struct Credentials {
    access_key: String,
    secret_key: String,
}

/// The S3 credentials from the environment (both or neither), or fresh random ones.
fn up_credentials() -> anyhow::Result<Credentials> {
    let var = |name| std::env::var(name).ok().filter(|v| !v.is_empty());
    match (var(ACCESS_KEY_ENV), var(SECRET_KEY_ENV)) {
        (Some(access_key), Some(secret_key)) => Ok(Credentials { access_key, secret_key }),
        (None, None) => Ok(Credentials {
            access_key: random_string(ACCESS_KEY_ALPHABET, ACCESS_KEY_CHARS),
            secret_key: random_string(SECRET_KEY_ALPHABET, SECRET_KEY_CHARS),
        }),
        _ => bail!("set both {ACCESS_KEY_ENV} and {SECRET_KEY_ENV}, or neither (then `tessera up` generates them)"),
    }
}

fn random_string(alphabet: &[u8], len: usize) -> String {
    use rand::Rng as _;
    let mut rng = rand::thread_rng();
    (0..len).map(|_| char::from(alphabet[rng.gen_range(0..alphabet.len())])).collect()
}

fn spawn_all(
    exe: &Path,
    map: &ClusterMap,
    config: &Path,
    s3: SocketAddr,
    credentials: &Credentials,
    tls: Option<&crate::local_ca::ServerCertificate>,
    extra: UpExtras,
    children: &mut Vec<Proc>,
) -> anyhow::Result<()> {
    let metrics = extra.metrics;
    for (i, node) in map.nodes.iter().enumerate() {
        let mut command = Command::new(exe);
        command.args(["node", "--config"]).arg(config).args(["--id", &node.id]);
        let mut metrics_args = String::new();
        if let Some(base) = metrics {
            let addr = up_metrics_addr(base, Some(i))?.to_string();
            command.args(["--metrics-listen", &addr]);
            metrics_args = format!(" --metrics-listen {addr}");
        }
        let child = command.spawn().with_context(|| format!("start node {}", node.id))?;
        let restart = format!("tessera node --config {} --id {}{metrics_args}", config.display(), node.id);
        children.push(Proc { name: format!("node {}", node.id), restart, child });
    }
    let mut gateway = Command::new(exe);
    gateway.args(["gateway", "--config"]).arg(config).args(["--listen", &s3.to_string()]);
    let mut extra_args = String::new();
    if let Some(tls) = tls {
        gateway.arg("--tls-cert").arg(&tls.cert).arg("--tls-key").arg(&tls.key);
        extra_args = format!(" --tls-cert {} --tls-key {}", tls.cert.display(), tls.key.display());
    }
    if let Some(base) = metrics {
        gateway.args(["--metrics-listen", &base.to_string()]);
        extra_args.push_str(&format!(" --metrics-listen {base}"));
    }
    if let Some(console) = extra.console {
        gateway.args(["--console-listen", &console.to_string()]);
        extra_args.push_str(&format!(" --console-listen {console}"));
    }
    let child = gateway
        .env(ACCESS_KEY_ENV, &credentials.access_key)
        .env(SECRET_KEY_ENV, &credentials.secret_key)
        .spawn()
        .context("start the S3 gateway")?;
    let restart = format!(
        "{ACCESS_KEY_ENV}=... {SECRET_KEY_ENV}=... tessera gateway --config {} --listen {s3}{extra_args}",
        config.display()
    );
    children.push(Proc { name: "gateway".into(), restart, child });
    Ok(())
}

fn supervise(
    map: &ClusterMap,
    config: &Path,
    s3: SocketAddr,
    credentials: &Credentials,
    tls: Option<&crate::local_ca::ServerCertificate>,
    extra: UpExtras,
    children: &mut [Proc],
) -> anyhow::Result<()> {
    let metrics = extra.metrics;
    let mut endpoints: Vec<(String, SocketAddr)> =
        map.nodes.iter().map(|node| (format!("node {}", node.id), node.addr)).collect();
    endpoints.push(("the S3 gateway".into(), s3));
    wait_ready(&endpoints, children)?;
    let config = fs::canonicalize(config).unwrap_or_else(|_| config.to_owned());
    println!("Tessera is up: {} nodes, erasure {}, {} set(s)", map.nodes.len(), map.erasure, map.sets.len());
    for (i, node) in map.nodes.iter().enumerate() {
        match metrics {
            Some(base) => println!(
                "  node {} on {} (metrics http://{}/metrics)",
                node.id,
                node.addr,
                up_metrics_addr(base, Some(i))?
            ),
            None => println!("  node {} on {}", node.id, node.addr),
        }
    }
    let scheme = if tls.is_some() { "https" } else { "http" };
    println!("S3 endpoint: {scheme}://{s3}");
    if let Some(base) = metrics {
        println!("  metrics: http://{base}/metrics");
    }
    if let Some(console) = extra.console {
        println!("Web console: {scheme}://{console}/ (log in with the access key and secret key below)");
    }
    println!("  access key: {}", credentials.access_key);
    println!("  secret key: {}", credentials.secret_key);
    if let Some(tls) = tls {
        let ca = fs::canonicalize(&tls.ca).unwrap_or_else(|_| tls.ca.clone());
        println!("  CA certificate: {} (trust it in clients)", ca.display());
    }
    println!("Use it from another shell:");
    println!("  export TESSERA_CONFIG={}", config.display());
    println!("  tessera mb demo && tessera put FILE demo/KEY && tessera ls demo");
    println!("  export AWS_ACCESS_KEY_ID={} AWS_SECRET_ACCESS_KEY={}", credentials.access_key, credentials.secret_key);
    if let Some(tls) = tls {
        let ca = fs::canonicalize(&tls.ca).unwrap_or_else(|_| tls.ca.clone());
        println!("  export AWS_CA_BUNDLE={}", ca.display());
    }
    println!("  aws --endpoint-url {scheme}://{s3} s3 cp FILE s3://demo/KEY");
    println!("Press Ctrl-C to stop.");
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let mut poll = tokio::time::interval(Duration::from_millis(500));
        let mut reported = vec![false; children.len()];
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => return Ok(()),
                _ = term.recv() => return Ok(()),
                _ = poll.tick() => {
                    // A dead node is what erasure coding is for: report it and keep serving.
                    for (proc, reported) in children.iter_mut().zip(reported.iter_mut()) {
                        if !*reported && let Some(status) = proc.child.try_wait()? {
                            eprintln!("warning: {} exited ({status}); the others keep serving (restart it with `{}`)", proc.name, proc.restart);
                            *reported = true;
                        }
                    }
                }
            }
        }
    })
}

fn wait_ready(endpoints: &[(String, SocketAddr)], children: &mut [Proc]) -> anyhow::Result<()> {
    let deadline = Instant::now() + NODE_READY_TIMEOUT;
    for (name, addr) in endpoints {
        loop {
            if TcpStream::connect_timeout(addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            for proc in children.iter_mut() {
                if let Some(status) = proc.child.try_wait()? {
                    bail!("{} exited during startup ({status}); see its error above", proc.name);
                }
            }
            if Instant::now() > deadline {
                bail!("{name} did not start listening on {addr} within {NODE_READY_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// SIGTERM to every child, then SIGKILL to any still running after the timeout.
fn stop_children(children: &mut [Proc]) {
    for Proc { child, .. } in children.iter_mut() {
        // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is involved.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + CHILD_STOP_TIMEOUT;
    for Proc { name, child, .. } in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
                _ => {
                    eprintln!("{name} did not stop in time; killing it");
                    // The child may have exited meanwhile; then there is nothing to kill.
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

/// `tessera gateway`: the S3 gateway in the foreground until SIGINT/SIGTERM.
pub(crate) fn gateway(args: &GatewayArgs) -> anyhow::Result<()> {
    // s3s logs every S3 error answer (NoSuchKey included) at ERROR; the gateway logs the
    // failures that need a look itself (node trouble at WARN).
    crate::init_logging_quieting("info", &["s3s"]);
    let var = |name| std::env::var(name).ok().filter(|v: &String| !v.is_empty());
    let (Some(access_key), Some(secret_key)) = (var(ACCESS_KEY_ENV), var(SECRET_KEY_ENV)) else {
        bail!("set {ACCESS_KEY_ENV} and {SECRET_KEY_ENV} (tessera up generates them)");
    };
    let (map, _) = load_map(&args.config)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().context("start the runtime")?;
    runtime.block_on(async {
        let client = client::Client::new(map, client::ClientOptions::default()).context("create the cluster client")?;
        let sigv2 = if args.allow_sigv2 { s3::SigV2::Allowed } else { s3::SigV2::Refused };
        let config = s3::GatewayConfig {
            listen: args.listen,
            access_key,
            secret_key,
            sigv2,
            relayout_rate: args.relayout_rate,
            region: args.region.clone(),
            // Counted only when served: without --metrics-listen the request path does no
            // metrics work (what bench/metrics-overhead.sh compares against).
            // The console's charts read the same counters.
            metrics: args.metrics_listen.is_some() || args.console_listen.is_some(),
            tls: args.tls_cert.clone().zip(args.tls_key.clone()).map(|(cert, key)| s3::TlsFiles { cert, key }),
            domains: args.domain.clone(),
        };
        tokio::spawn(expire_uploads(client.clone(), args.multipart_expiry, args.multipart_check_interval));
        let gateway = s3::Gateway::bind(client.clone(), config.clone()).await.context("start the S3 gateway")?;
        let console = match args.console_listen {
            Some(listen) => {
                let metrics = gateway.metrics();
                let traffic: console::TrafficSource = std::sync::Arc::new(move || {
                    let totals = metrics.totals();
                    console::Traffic {
                        requests: totals.requests,
                        server_errors: totals.server_errors,
                        request_seconds: totals.request_seconds,
                        bytes_received: totals.bytes_received,
                        bytes_sent: totals.bytes_sent,
                    }
                });
                let config = console::ConsoleConfig {
                    listen,
                    root_access_key: config.access_key.clone(),
                    root_secret_key: config.secret_key.clone(),
                    session_ttl: args.console_session_ttl,
                    traffic: Some(traffic),
                    // The gateway's certificate: HTTPS for S3 means HTTPS for the console.
                    tls: match &config.tls {
                        Some(files) => Some(s3::server_config(files).context("the console's TLS")?),
                        None => None,
                    },
                };
                Some(console::Console::bind(client, config).await.context("start the web console")?)
            }
            None => None,
        };
        match gateway.certificate() {
            None => tracing::info!("S3 gateway listening on http://{}", gateway.local_addr()?),
            Some(cert) => {
                let expires = humantime::format_rfc3339_seconds(cert.not_after);
                tracing::info!(
                    "S3 gateway listening on https://{} ({}, expires {expires})",
                    gateway.local_addr()?,
                    cert.subject
                );
                let left = cert.not_after.duration_since(std::time::SystemTime::now()).unwrap_or_default();
                if left < s3::EXPIRY_WARNING {
                    tracing::warn!(
                        "the TLS certificate expires in {}: renew it",
                        humantime::format_duration(Duration::from_secs(left.as_secs()))
                    );
                }
                if let Some(reloader) = gateway.tls_reloader() {
                    let reloading = reload_on_sighup(reloader)?;
                    tokio::spawn(reloading);
                    tracing::info!("send SIGHUP to reload the certificate and key from their files");
                }
            }
        }
        if let Some(addr) = args.metrics_listen {
            let listener = crate::metrics_http::bind(addr).await?;
            tracing::info!("metrics on http://{}/metrics", listener.local_addr()?);
            let metrics = gateway.metrics();
            tokio::spawn(crate::metrics_http::serve(listener, std::sync::Arc::new(move || metrics.render())));
        }
        if let Some(console) = console {
            let addr = console.local_addr()?;
            let https = args.tls_cert.is_some();
            if !addr.ip().is_loopback() && !https {
                tracing::warn!("the web console serves plain HTTP on {addr}: logins cross the network in clear");
            }
            tracing::info!("web console on {}://{addr}/", if https { "https" } else { "http" });
            tokio::spawn(console.serve(std::future::pending()));
        }
        gateway.serve(shutdown_signal()).await;
        Ok(())
    })
}

/// Reloads the gateway's certificate and key on every SIGHUP (a renewal): new connections get
/// the new one. A certificate that does not load is logged and the served one stays. The
/// signal handler is installed before this returns, so a SIGHUP after the start message never
/// kills the gateway.
fn reload_on_sighup(reloader: s3::TlsReloader) -> anyhow::Result<impl std::future::Future<Output = ()>> {
    let mut hangups =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).context("install the SIGHUP handler")?;
    Ok(async move {
        while hangups.recv().await.is_some() {
            match reloader.reload() {
                Ok(cert) => tracing::info!(
                    "TLS certificate reloaded: {}, expires {}",
                    cert.subject,
                    humantime::format_rfc3339_seconds(cert.not_after)
                ),
                Err(e) => tracing::warn!("TLS certificate not reloaded, the served one stays: {e}"),
            }
        }
    })
}

/// Every `interval`, aborts multipart uploads initiated more than `expiry` ago (S3's
/// AbortIncompleteMultipartUpload, for every bucket). Several gateways doing it is harmless:
/// aborts are idempotent.
async fn expire_uploads(client: client::Client, expiry: Duration, interval: Duration) {
    loop {
        tokio::time::sleep(interval).await;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let cutoff = now.saturating_sub(expiry).as_millis() as u64;
        match client.expire_multipart_uploads(cutoff).await {
            Ok(0) => {}
            Ok(aborted) => tracing::info!(aborted, "abandoned multipart uploads aborted"),
            Err(e) => tracing::warn!(error = %e, "could not check for abandoned multipart uploads; will retry"),
        }
    }
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        // Without a SIGTERM handler Ctrl-C still stops the gateway (SIGTERM then kills it).
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

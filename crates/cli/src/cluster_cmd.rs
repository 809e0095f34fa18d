//! `tessera init`, `tessera node` and the `tessera up` supervisor.

use std::fs;
use std::io::Write as _;
use std::net::TcpStream;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use cluster::{CHUNK_BYTES_DEFAULT, ClusterMap, ErasureConfig, InitSpec};

use crate::size::parse_bytes;

/// How long `up` waits for every node to accept connections.
const NODE_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long `up` waits for children to exit after SIGTERM before it kills them.
const CHILD_STOP_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, clap::Args)]
pub(crate) struct InitArgs {
    /// Number of storage nodes.
    #[arg(long)]
    nodes: usize,
    /// Drives (directories) per node.
    #[arg(long, default_value_t = 1)]
    drives_per_node: usize,
    /// Erasure config K+M: K data and M parity chunks per stripe.
    #[arg(long, default_value = "4+2")]
    ec: ErasureConfig,
    /// Directory for cluster.toml and the drives.
    #[arg(long)]
    data: PathBuf,
    /// Node i listens on 127.0.0.1:(base-port + i - 1).
    #[arg(long, default_value_t = 7001)]
    base_port: u16,
    /// Bytes per chunk (a stripe holds K chunks of object data).
    #[arg(long, default_value = "1MiB", value_parser = parse_bytes)]
    chunk_size: u64,
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
}

#[derive(Debug, clap::Args)]
pub(crate) struct NodeArgs {
    /// Path of cluster.toml.
    #[arg(long)]
    config: PathBuf,
    /// Node id from cluster.toml (n1, n2, ...).
    #[arg(long)]
    id: String,
}

pub(crate) fn init(args: &InitArgs) -> anyhow::Result<()> {
    let chunk_bytes = u32::try_from(args.chunk_size).context("--chunk-size is too large")?;
    let spec = InitSpec {
        nodes: args.nodes,
        drives_per_node: args.drives_per_node,
        erasure: args.ec,
        base_port: args.base_port,
        chunk_bytes,
    };
    let path = init_cluster(&spec, &args.data)?;
    println!("wrote {}", path.display());
    println!(
        "start the nodes with `tessera node --config {} --id n1` (and n2...), or run `tessera up --data {}`",
        path.display(),
        args.data.display()
    );
    Ok(())
}

/// Writes a new cluster.toml (mode 0600: it holds the cluster secret) and formats the drives.
fn init_cluster(spec: &InitSpec, data: &Path) -> anyhow::Result<PathBuf> {
    let path = data.join("cluster.toml");
    if path.exists() {
        bail!(
            "{} already exists: this directory holds a cluster (remove it to start over, or pick another --data)",
            path.display()
        );
    }
    let cluster_id = hex::encode(rand::random::<[u8; 8]>());
    let secret = hex::encode(rand::random::<[u8; 32]>());
    let map = ClusterMap::generate(spec, &cluster_id, &secret, data).context("plan the cluster")?;
    fs::create_dir_all(data).with_context(|| format!("create {}", data.display()))?;
    node::format_drives(&map).context("prepare the drives")?;
    let tmp = data.join(".cluster.toml.tmp");
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .with_context(|| format!("create {}", tmp.display()))?;
    file.write_all(map.to_toml().as_bytes())
        .and_then(|()| file.sync_all())
        .context("write cluster.toml")?;
    fs::rename(&tmp, &path)
        .with_context(|| format!("rename {} to {}", tmp.display(), path.display()))?;
    Ok(path)
}

/// Reads and validates a cluster map; relative drive paths resolve against its directory.
pub(crate) fn load_map(path: &Path) -> anyhow::Result<(ClusterMap, String)> {
    let text =
        fs::read_to_string(path).with_context(|| format!("read cluster map {}", path.display()))?;
    let base_dir = path.parent().map(Path::to_path_buf).unwrap_or_default();
    let base_dir = if base_dir.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        base_dir
    };
    let map = ClusterMap::from_toml(&text, &base_dir)
        .with_context(|| format!("load {}", path.display()))?;
    Ok((map, text))
}

pub(crate) fn node(args: &NodeArgs) -> anyhow::Result<()> {
    crate::init_logging("info");
    let (map, map_text) = load_map(&args.config)?;
    let server = node::Server::bind(node::NodeConfig {
        map,
        map_text,
        node_id: args.id.clone(),
    })
    .with_context(|| format!("start node {}", args.id))?;
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
        init_cluster(&spec, &args.data)?;
        eprintln!(
            "initialised a new {}-node {} cluster in {}",
            args.nodes,
            args.ec,
            args.data.display()
        );
    }
    let (map, _) = load_map(&config)?;
    let exe = std::env::current_exe().context("find the tessera binary")?;
    let mut children = Vec::new();
    for node in &map.nodes {
        let child = Command::new(&exe)
            .args(["node", "--config"])
            .arg(&config)
            .args(["--id", &node.id])
            .spawn()
            .with_context(|| format!("start node {}", node.id))?;
        children.push((node.id.clone(), child));
    }
    let result = supervise(&map, &config, &mut children);
    stop_children(&mut children);
    result
}

fn supervise(
    map: &ClusterMap,
    config: &Path,
    children: &mut [(String, Child)],
) -> anyhow::Result<()> {
    wait_ready(map, children)?;
    let config = fs::canonicalize(config).unwrap_or_else(|_| config.to_owned());
    println!(
        "Tessera is up: {} nodes, erasure {}, {} set(s)",
        map.nodes.len(),
        map.erasure,
        map.sets.len()
    );
    for node in &map.nodes {
        println!("  node {} on {}", node.id, node.addr);
    }
    println!("Use it from another shell:");
    println!("  export TESSERA_CONFIG={}", config.display());
    println!("  tessera mb demo && tessera put FILE demo/KEY && tessera ls demo");
    println!("Press Ctrl-C to stop.");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
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
                    for ((id, child), reported) in children.iter_mut().zip(reported.iter_mut()) {
                        if !*reported && let Some(status) = child.try_wait()? {
                            eprintln!("warning: node {id} exited ({status}); the others keep serving (restart it with `tessera node --config {} --id {id}`)", config.display());
                            *reported = true;
                        }
                    }
                }
            }
        }
    })
}

fn wait_ready(map: &ClusterMap, children: &mut [(String, Child)]) -> anyhow::Result<()> {
    let deadline = Instant::now() + NODE_READY_TIMEOUT;
    for node in &map.nodes {
        loop {
            if TcpStream::connect_timeout(&node.addr, Duration::from_millis(200)).is_ok() {
                break;
            }
            for (id, child) in children.iter_mut() {
                if let Some(status) = child.try_wait()? {
                    bail!("node {id} exited during startup ({status}); see its error above");
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "node {} did not start listening on {} within {NODE_READY_TIMEOUT:?}",
                    node.id,
                    node.addr
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok(())
}

/// SIGTERM to every child, then SIGKILL to any still running after the timeout.
fn stop_children(children: &mut [(String, Child)]) {
    for (_, child) in children.iter_mut() {
        // SAFETY: kill(2) with a pid we spawned and have not reaped; no memory is involved.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + CHILD_STOP_TIMEOUT;
    for (id, child) in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(_)) => break,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                _ => {
                    eprintln!("node {id} did not stop in time; killing it");
                    // The child may have exited meanwhile; then there is nothing to kill.
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
            }
        }
    }
}

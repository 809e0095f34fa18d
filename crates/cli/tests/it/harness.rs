//! `Cluster`: real `tessera node` processes on 127.0.0.1 with their own ports and temp dirs.
//! Killed on drop; their logs are printed when the test failed, and any ERROR line fails it.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

pub(crate) const TESSERA: &str = env!("CARGO_BIN_EXE_tessera");
const READY_TIMEOUT: Duration = Duration::from_secs(20);

/// Hands out port ranges per test so tests in one binary do not collide.
static NEXT_PORT: AtomicU16 = AtomicU16::new(0);

/// Options of a test cluster.
pub(crate) struct Shape {
    pub(crate) nodes: usize,
    pub(crate) drives_per_node: usize,
    pub(crate) ec: &'static str,
    pub(crate) chunk_size: &'static str,
    /// `tessera node --retire-grace`: how long replaced versions stay after a newer one is
    /// acknowledged.
    pub(crate) retire_grace: &'static str,
    /// `tessera node --scrub-interval` and `--deep-scrub-interval`.
    pub(crate) scrub_interval: &'static str,
    pub(crate) deep_scrub_interval: &'static str,
    /// `tessera node --leftover-gc-after`: how long the scrubber watches a failed write's
    /// leftover before removing it.
    pub(crate) leftover_gc_after: &'static str,
    /// `tessera init --node-tls on`: the node protocol over TLS.
    pub(crate) node_tls: bool,
}

impl Default for Shape {
    fn default() -> Self {
        Self {
            nodes: 6,
            drives_per_node: 1,
            ec: "4+2",
            chunk_size: "64KiB",
            retire_grace: "10m",
            scrub_interval: "1h",
            deep_scrub_interval: "7d",
            leftover_gc_after: "10m",
            node_tls: false,
        }
    }
}

pub(crate) struct Cluster {
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config: PathBuf,
    pub(crate) addrs: Vec<SocketAddr>,
    nodes: Vec<Option<Child>>,
    /// Per node: its own cluster.toml instead of `config`, and extra `tessera node` arguments.
    node_configs: Vec<Option<PathBuf>>,
    node_args: Vec<Vec<String>>,
    retire_grace: &'static str,
    scrub_interval: &'static str,
    deep_scrub_interval: &'static str,
    leftover_gc_after: &'static str,
    /// ERROR lines containing one of these do not fail the test.
    allowed_errors: Vec<&'static str>,
}

/// Lowest port the harness hands out.
const PORT_FLOOR: u16 = 10_000;

/// First port of the kernel's ephemeral range: ports at or above it are what outgoing
/// connections (from any test or process) take as their local port, so a node restarted on
/// such a port can find it held by somebody's connection ("Address already in use").
fn ephemeral_floor() -> u16 {
    let range = fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    range.split_whitespace().next().and_then(|low| low.parse().ok()).unwrap_or(32_768)
}

/// `count` consecutive free ports on 127.0.0.1, below the ephemeral range so that a node can
/// be restarted on its port.
pub(crate) fn free_ports(count: usize) -> u16 {
    let ceiling = ephemeral_floor();
    assert!(ceiling > PORT_FLOOR + 1024, "ephemeral port range starts at {ceiling}: too low for the tests");
    if NEXT_PORT.load(Ordering::SeqCst) == 0 {
        let span = u32::from(ceiling - PORT_FLOOR) / 2;
        let seed = PORT_FLOOR + (std::process::id() % span) as u16;
        let _ = NEXT_PORT.compare_exchange(0, seed, Ordering::SeqCst, Ordering::SeqCst);
    }
    for _ in 0..200 {
        let base = NEXT_PORT.fetch_add(count as u16 + 1, Ordering::SeqCst);
        if base < PORT_FLOOR || base + count as u16 >= ceiling {
            NEXT_PORT.store(PORT_FLOOR, Ordering::SeqCst);
            continue;
        }
        let all_free = (0..count as u16).all(|i| TcpListener::bind(("127.0.0.1", base + i)).is_ok());
        if all_free {
            return base;
        }
    }
    panic!("no {count} consecutive free ports on 127.0.0.1 below {ceiling}");
}

impl Cluster {
    /// `tessera init` plus every node started and accepting connections.
    pub(crate) fn start(shape: Shape) -> Self {
        let cluster = Self::init(shape);
        let mut cluster = cluster;
        for idx in 0..cluster.addrs.len() {
            cluster.start_node(idx);
        }
        cluster.wait_ready();
        cluster
    }

    /// `tessera init` only; nodes are not started.
    pub(crate) fn init(shape: Shape) -> Self {
        let dir = tempfile::tempdir().expect("create a temp dir");
        let base = free_ports(shape.nodes);
        let data = dir.path().join("data");
        let output = Command::new(TESSERA)
            .args(["init", "--nodes", &shape.nodes.to_string(), "--drives-per-node"])
            .arg(shape.drives_per_node.to_string())
            .args(["--ec", shape.ec, "--chunk-size", shape.chunk_size, "--base-port", &base.to_string()])
            .args(["--node-tls", if shape.node_tls { "on" } else { "off" }, "--data"])
            .arg(&data)
            .output()
            .expect("run tessera init");
        assert!(output.status.success(), "init failed: {}", String::from_utf8_lossy(&output.stderr));
        let addrs = (0..shape.nodes).map(|i| SocketAddr::from(([127, 0, 0, 1], base + i as u16))).collect();
        Self::with_nodes(dir, addrs, &shape)
    }

    /// `tessera init --node ADDR=DRIVES` for nodes on the given addresses ("hosts": any
    /// 127.0.0.0/8 address is this machine's), then `tessera drive format` for each node, as
    /// an operator does on each host; nodes are not started.
    pub(crate) fn init_across(addrs: Vec<SocketAddr>, shape: Shape) -> Self {
        let dir = tempfile::tempdir().expect("create a temp dir");
        let data = dir.path().join("data");
        let mut init = Command::new(TESSERA);
        init.args(["init", "--ec", shape.ec, "--chunk-size", shape.chunk_size, "--data"]).arg(&data);
        init.args(["--node-tls", if shape.node_tls { "on" } else { "off" }]);
        for addr in &addrs {
            init.args(["--node", &format!("{addr}={}", shape.drives_per_node)]);
        }
        let output = init.output().expect("run tessera init");
        assert!(output.status.success(), "init failed: {}", String::from_utf8_lossy(&output.stderr));
        let cluster = Self::with_nodes(dir, addrs, &shape);
        for idx in 0..cluster.addrs.len() {
            cluster.cli_ok(&["drive", "format", "--node", &format!("n{}", idx + 1)]);
        }
        cluster
    }

    fn with_nodes(dir: tempfile::TempDir, addrs: Vec<SocketAddr>, shape: &Shape) -> Self {
        let count = addrs.len();
        Self {
            config: dir.path().join("data").join("cluster.toml"),
            dir,
            addrs,
            nodes: (0..count).map(|_| None).collect(),
            node_configs: vec![None; count],
            node_args: vec![Vec::new(); count],
            retire_grace: shape.retire_grace,
            scrub_interval: shape.scrub_interval,
            deep_scrub_interval: shape.deep_scrub_interval,
            leftover_gc_after: shape.leftover_gc_after,
            allowed_errors: Vec::new(),
        }
    }

    /// Nodes added to the map (by `tessera pool add`) at `addrs`: ids continue after the last
    /// node's; they are not started.
    pub(crate) fn add_nodes(&mut self, addrs: &[SocketAddr]) {
        for &addr in addrs {
            self.addrs.push(addr);
            self.nodes.push(None);
            self.node_configs.push(None);
            self.node_args.push(Vec::new());
        }
    }

    /// Node `idx` starts with its own cluster.toml at `path` from now on (a host of its own).
    pub(crate) fn set_node_config(&mut self, idx: usize, path: PathBuf) {
        self.node_configs[idx] = Some(path);
    }

    /// Node `idx` starts with these extra `tessera node` arguments from now on.
    pub(crate) fn set_node_args(&mut self, idx: usize, args: &[&str]) {
        self.node_args[idx] = args.iter().map(|a| a.to_string()).collect();
    }

    pub(crate) fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// Directory of drive `drive` (0-based) of node `idx` (0-based, node id n{idx+1}).
    pub(crate) fn drive_dir(&self, idx: usize, drive: usize) -> PathBuf {
        self.data_dir().join(format!("n{}/d{}", idx + 1, drive + 1))
    }

    fn log_path(&self, idx: usize) -> PathBuf {
        self.dir.path().join(format!("n{}.log", idx + 1))
    }

    pub(crate) fn start_node(&mut self, idx: usize) {
        assert!(self.nodes[idx].is_none(), "node n{} is already running", idx + 1);
        let log = fs::OpenOptions::new().create(true).append(true).open(self.log_path(idx)).expect("open node log");
        let child = Command::new(TESSERA)
            .args(["node", "--config"])
            .arg(self.node_configs[idx].as_ref().unwrap_or(&self.config))
            .args(&self.node_args[idx])
            .args(["--id", &format!("n{}", idx + 1), "--retire-grace", self.retire_grace])
            .args(["--scrub-interval", self.scrub_interval, "--deep-scrub-interval", self.deep_scrub_interval])
            .args(["--leftover-gc-after", self.leftover_gc_after])
            .env("TESSERA_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(log.try_clone().expect("clone log handle"))
            .stderr(log)
            .spawn()
            .expect("spawn tessera node");
        self.nodes[idx] = Some(child);
    }

    pub(crate) fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        for idx in 0..self.addrs.len() {
            if self.nodes[idx].is_none() {
                continue;
            }
            while TcpStream::connect_timeout(&self.addrs[idx], Duration::from_millis(100)).is_err() {
                if let Some(status) = self.nodes[idx].as_mut().and_then(|c| c.try_wait().expect("poll child")) {
                    panic!("node n{} exited during startup ({status}):\n{}", idx + 1, self.log(idx));
                }
                assert!(Instant::now() < deadline, "node n{} not ready in {READY_TIMEOUT:?}", idx + 1);
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    /// SIGKILL, then reap.
    pub(crate) fn kill_node(&mut self, idx: usize) {
        if let Some(mut child) = self.nodes[idx].take() {
            child.kill().expect("kill node");
            child.wait().expect("reap node");
        }
    }

    pub(crate) fn restart_node(&mut self, idx: usize) {
        self.kill_node(idx);
        self.start_node(idx);
        self.wait_ready();
    }

    pub(crate) fn signal_node(&self, idx: usize, signal: i32) {
        let child = self.nodes[idx].as_ref().expect("node is running");
        // SAFETY: kill(2) on a child we spawned and have not reaped.
        let rc = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "signal node");
    }

    pub(crate) fn pid(&self, idx: usize) -> u32 {
        self.nodes[idx].as_ref().expect("node is running").id()
    }

    /// Lets ERROR log lines containing `text` pass (for tests that provoke them on purpose).
    #[allow(dead_code)]
    pub(crate) fn allow_error(&mut self, text: &'static str) {
        self.allowed_errors.push(text);
    }

    pub(crate) fn is_running(&mut self, idx: usize) -> bool {
        self.nodes[idx].as_mut().is_some_and(|c| c.try_wait().expect("poll child").is_none())
    }

    pub(crate) fn log(&self, idx: usize) -> String {
        fs::read_to_string(self.log_path(idx)).unwrap_or_default()
    }

    /// Node `idx`'s log once it contains `text` (a node may log after it has answered or closed
    /// the connection); fails the test after 10 s.
    pub(crate) fn wait_log(&self, idx: usize, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let log = self.log(idx);
            if log.contains(text) {
                return log;
            }
            assert!(Instant::now() < deadline, "n{} never logged {text:?}:\n{log}", idx + 1);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Runs the CLI against this cluster.
    pub(crate) fn cli(&self, args: &[&str]) -> Output {
        Command::new(TESSERA)
            .args(args)
            .env("TESSERA_CONFIG", &self.config)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .output()
            .expect("run tessera")
    }

    /// Starts the CLI against this cluster without waiting for it; its stdout is piped.
    pub(crate) fn cli_spawn(&self, args: &[&str]) -> Child {
        Command::new(TESSERA)
            .args(args)
            .env("TESSERA_CONFIG", &self.config)
            .env("NO_COLOR", "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera")
    }

    /// Runs the CLI and asserts success; returns stdout.
    pub(crate) fn cli_ok(&self, args: &[&str]) -> String {
        let output = self.cli(args);
        assert!(
            output.status.success(),
            "tessera {args:?} failed: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Runs the CLI, asserts failure, returns stderr.
    pub(crate) fn cli_err(&self, args: &[&str]) -> String {
        let output = self.cli(args);
        assert!(
            !output.status.success(),
            "tessera {args:?} should fail but printed {}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// A smart client of this cluster with short timeouts.
    pub(crate) fn client(&self) -> client::Client {
        self.client_with(true)
    }

    /// A client that sends no repair hints: it observes repair without speeding it up.
    pub(crate) fn observer(&self) -> client::Client {
        self.client_with(false)
    }

    fn client_with(&self, repair_hints: bool) -> client::Client {
        let text = fs::read_to_string(&self.config).expect("read cluster.toml");
        let map = cluster::ClusterMap::from_toml(&text, &self.data_dir()).expect("parse cluster.toml");
        let options = client::ClientOptions {
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(3),
            repair_hints,
            ..client::ClientOptions::default()
        };
        client::Client::new(map, options).expect("client")
    }

    /// Files of every drive's data directory, for corruption tests.
    pub(crate) fn data_files(&self, idx: usize) -> Vec<PathBuf> {
        let mut files = Vec::new();
        let data = self.drive_dir(idx, 0).join("data");
        for shard in fs::read_dir(data).expect("read data dir") {
            for file in fs::read_dir(shard.expect("shard").path()).expect("read shard") {
                files.push(file.expect("file").path());
            }
        }
        files
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for idx in 0..self.nodes.len() {
            if let Some(child) = &self.nodes[idx] {
                // A stopped (SIGSTOP) node must be continued to die cleanly. One that exited
                // and was reaped (a failed start) has no process left to signal.
                // SAFETY: kill(2) on a child we spawned.
                let _ = unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGCONT) };
            }
            self.kill_node(idx);
        }
        let failed = std::thread::panicking();
        let mut unexpected = Vec::new();
        for idx in 0..self.nodes.len() {
            let log = self.log(idx);
            if failed {
                eprintln!("----- log of node n{} -----\n{log}", idx + 1);
            }
            // ERROR means a human must look: no test expects one.
            let allowed = |line: &str| self.allowed_errors.iter().any(|text| line.contains(text));
            let errors = log.lines().filter(|l| l.contains(" ERROR ") && !allowed(l));
            unexpected.extend(errors.map(|l| format!("n{}: {l}", idx + 1)));
        }
        if !failed && !unexpected.is_empty() {
            panic!("unexpected ERROR log lines:\n{}", unexpected.join("\n"));
        }
    }
}

/// Deterministic pseudo-random bytes.
pub(crate) fn payload(size: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..size)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

pub(crate) fn write_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).expect("write test file");
    path
}

/// Runs client calls on one runtime shared by the whole test binary, so pooled connections
/// never outlive the runtime they were made on. Client logs follow `TESSERA_LOG` (default warn).
pub(crate) fn block_on<F: std::future::Future>(future: F) -> F::Output {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_test_writer().try_init();
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime")
    });
    runtime.block_on(future)
}

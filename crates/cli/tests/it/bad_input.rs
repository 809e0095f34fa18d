//! Bad configuration and arguments: one-line errors and non-zero exits.

use std::process::Command;

use crate::harness::{Cluster, Shape, TESSERA, free_ports};

fn run(args: &[&str]) -> (bool, String) {
    let output = Command::new(TESSERA).args(args).env_remove("TESSERA_CONFIG").output().unwrap();
    (output.status.success(), String::from_utf8_lossy(&output.stderr).into_owned())
}

fn assert_one_line_error(args: &[&str], expected: &str) {
    let (ok, stderr) = run(args);
    assert!(!ok, "tessera {args:?} must fail");
    assert!(stderr.starts_with("error: ") && stderr.contains(expected), "tessera {args:?}: {stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr}");
}

#[test]
fn argument_errors_are_one_line_and_help_still_prints() {
    // Before: clap's usage block over three lines and more.
    assert_one_line_error(&["repair", "rate", "garbage"], "invalid size \"garbage\"");
    assert_one_line_error(&["put"], "required");
    assert_one_line_error(&["no-such-command"], "unrecognized subcommand");
    let (ok, stderr) = run(&["get", "--buffer", "1", "b", "k", "-"]);
    assert!(!ok && stderr.trim_end().lines().count() == 1 && stderr.ends_with("(see --help)\n"), "{stderr}");
    let help = Command::new(TESSERA).args(["repair", "--help"]).output().unwrap();
    assert!(help.status.success(), "--help succeeds");
    assert!(String::from_utf8_lossy(&help.stdout).contains("Usage"), "--help prints the usage to stdout");
}

#[test]
fn logs_to_a_file_carry_no_colour_codes() {
    // A node's log written to a file, as `make up > log` writes it (before: every field
    // wrapped in escape codes).
    let cluster = Cluster::init(Shape::default());
    let log_path = cluster.config.with_file_name("n1.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut node = Command::new(TESSERA)
        .args(["node", "--config", cluster.config.to_str().unwrap(), "--id", "n1"])
        .env("TESSERA_LOG", "info")
        .env_remove("NO_COLOR")
        .stderr(log)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let text = loop {
        let text = std::fs::read_to_string(&log_path).unwrap();
        if text.contains("node ready") || std::time::Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let _ = node.kill();
    let _ = node.wait();
    assert!(text.contains("node ready"), "the node logged that it is ready: {text}");
    assert!(!text.contains('\u{1b}'), "no ANSI escape codes in a log file: {text}");
}

#[test]
fn node_with_unknown_id_exits_with_one_line_error() {
    let cluster = Cluster::init(Shape::default());
    assert_one_line_error(
        &["node", "--config", cluster.config.to_str().unwrap(), "--id", "n9"],
        "unknown node id \"n9\"",
    );
}

#[test]
fn node_on_a_port_in_use_exits_with_one_line_error() {
    let cluster = Cluster::init(Shape::default());
    let _taken = std::net::TcpListener::bind(cluster.addrs[0]).unwrap();
    assert_one_line_error(&["node", "--config", cluster.config.to_str().unwrap(), "--id", "n1"], "in use");
}

#[test]
fn node_with_missing_or_unwritable_drive_exits_with_one_line_error() {
    let cluster = Cluster::init(Shape::default());
    std::fs::remove_dir_all(cluster.drive_dir(0, 0)).unwrap();
    assert_one_line_error(&["node", "--config", cluster.config.to_str().unwrap(), "--id", "n1"], "does not exist");
    if unsafe { libc::geteuid() } != 0 {
        let dir = cluster.drive_dir(1, 0);
        let mut perms = std::fs::metadata(&dir).unwrap().permissions();
        std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o500);
        std::fs::set_permissions(&dir, perms).unwrap();
        assert_one_line_error(&["node", "--config", cluster.config.to_str().unwrap(), "--id", "n2"], "not usable");
    }
}

#[test]
fn malformed_cluster_toml_is_refused_with_the_reason() {
    let cluster = Cluster::init(Shape::default());
    let config = cluster.config.to_str().unwrap();
    let text = std::fs::read_to_string(&cluster.config).unwrap();
    std::fs::write(&cluster.config, text.replace("ec = \"4+2\"", "ec = \"four\"")).unwrap();
    assert_one_line_error(&["node", "--config", config, "--id", "n1"], "invalid erasure config");
    std::fs::write(&cluster.config, "this is not [toml").unwrap();
    assert_one_line_error(&["node", "--config", config, "--id", "n1"], "malformed cluster.toml");
    assert_one_line_error(&["ls", "--config", config], "malformed cluster.toml");
}

#[test]
fn init_refuses_impossible_shapes_and_existing_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("d");
    let data = data.to_str().unwrap();
    let base = free_ports(6).to_string();
    assert_one_line_error(&["init", "--nodes", "5", "--ec", "4+2", "--data", data], "needs at least 6 nodes");
    // A value clap rejects gets clap's usage error (error line, blank line, hint), exit 2.
    let (ok, stderr) = run(&["init", "--nodes", "6", "--ec", "40+2", "--data", data]);
    assert!(!ok && stderr.starts_with("error: ") && stderr.contains("invalid erasure config"), "{stderr}");
    let (ok, stderr) = run(&["init", "--nodes", "6", "--ec", "4+2", "--data", data, "--base-port", &base]);
    assert!(ok, "{stderr}");
    assert_one_line_error(&["init", "--nodes", "6", "--ec", "4+2", "--data", data], "already exists");
}

#[test]
fn client_commands_without_config_say_how_to_get_one() {
    assert_one_line_error(&["ls"], "pass --config or set TESSERA_CONFIG");
    assert_one_line_error(&["get", "nokey", "-", "--config", "/nonexistent/cluster.toml"], "expected BUCKET/KEY");
    assert_one_line_error(&["ls", "--config", "/nonexistent/cluster.toml"], "No such file or directory");
}

#[test]
fn a_cluster_toml_readable_by_others_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let cluster = Cluster::init(Shape::default());
    let config = cluster.config.to_str().unwrap();
    let mode = |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&cluster.config), 0o600, "init writes the secret readable by its owner only");
    let (_, quiet) = run(&["ls", "--config", config]);
    assert!(!quiet.contains("readable by other users"), "{quiet}");
    std::fs::set_permissions(&cluster.config, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (_, warned) = run(&["ls", "--config", config]);
    assert!(warned.contains("readable by other users (mode 644)") && warned.contains("chmod 600"), "{warned}");
}

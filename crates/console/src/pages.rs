//! The console's pages, rendered on the server with maud: every interpolated value is escaped,
//! so names and metadata with HTML in them show as text.

use maud::{DOCTYPE, Markup, html};

use crate::query;
use crate::session::Who;

/// What every page of a logged-in session needs.
pub(crate) struct View<'a> {
    pub(crate) who: &'a Who,
    pub(crate) csrf: &'a str,
}

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Usage {
    pub(crate) objects: usize,
    pub(crate) bytes: u64,
    /// More objects than were counted.
    pub(crate) more: bool,
}

pub(crate) struct BucketRow {
    pub(crate) name: String,
    pub(crate) created_ms: u64,
    pub(crate) usage: Option<Usage>,
}

pub(crate) enum Row {
    /// A common prefix ending in `/`.
    Folder(String),
    Object(client::ListEntry),
}

fn time(ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_seconds(at).to_string()
}

/// Bytes in binary units, one decimal.
pub(crate) fn bytes(n: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 { format!("{n} B") } else { format!("{value:.1} {}", UNITS[unit]) }
}

fn shell(title: &str, view: Option<&View<'_>>, body: Markup) -> Markup {
    shell_refreshed(title, view, None, false, body)
}

/// [`shell`], reloading itself every `refresh_s` seconds when given and scripts are off (with
/// scripts, console.js refreshes the page's `data-live` parts in place), with the chart
/// library (uPlot) when `charts`.
fn shell_refreshed(title: &str, view: Option<&View<'_>>, refresh_s: Option<u32>, charts: bool, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                @if let Some(seconds) = refresh_s { noscript { meta http-equiv="refresh" content=(seconds); } }
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · Tessera" }
                link rel="stylesheet" href="/assets/console.css";
                @if charts {
                    link rel="stylesheet" href="/assets/uPlot.min.css";
                    script src="/assets/uPlot.iife.min.js" defer {}
                }
                script src="/assets/console.js" defer {}
            }
            body {
                header {
                    a.brand href="/buckets" { "Tessera" }
                    @if let Some(view) = view {
                        nav {
                            a href="/buckets" { "Buckets" }
                            @if matches!(view.who, Who::Root { .. }) {
                                " " a href="/cluster" { "Cluster" }
                                " " a href="/keys" { "Access keys" }
                            }
                        }
                        span.who { "Logged in as " code { (view.who.access_key()) }
                            @if let Who::Scoped(key) = view.who { " (" (key.permission) " on " (key.buckets) ")" } }
                        form.inline method="post" action="/logout" {
                            input type="hidden" name="csrf" value=(view.csrf);
                            button type="submit" id="logout" { "Log out" }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

pub(crate) fn login(error: Option<&str>) -> Markup {
    shell(
        "Log in",
        None,
        html! {
            h1 { "Log in" }
            p { "With S3 credentials: the root's, or an access key's (`tessera key create`)." }
            @if let Some(error) = error { p.error role="alert" { (error) } }
            form.login method="post" action="/login" {
                label { "Access key" input type="text" name="access_key" autocomplete="username" required; }
                label { "Secret key" input type="password" name="secret_key" autocomplete="current-password" required; }
                button type="submit" { "Log in" }
            }
        },
    )
}

pub(crate) fn error(status: hyper::StatusCode, message: &str) -> Markup {
    shell(
        status.canonical_reason().unwrap_or("Error"),
        None,
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p.error role="alert" { (message) }
            p { a href="/buckets" { "Back to the buckets" } }
        },
    )
}

pub(crate) fn buckets(view: &View<'_>, rows: &[BucketRow]) -> Markup {
    let admin = matches!(view.who, Who::Root { .. });
    shell(
        "Buckets",
        Some(view),
        html! {
            h1 { "Buckets" }
            @if admin {
                form.inline method="post" action="/buckets/create" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    input type="text" name="bucket" placeholder="new-bucket-name" required;
                    button type="submit" id="create-bucket" { "Create bucket" }
                }
            }
            @if rows.is_empty() { p { "No buckets yet." } } @else {
                table id="buckets" {
                    thead { tr { th { "Name" } th { "Objects" } th { "Size" } th { "Created" } @if admin { th { "Delete" } } } }
                    tbody {
                        @for row in rows {
                            tr {
                                td { a href={ "/objects" (query(&[("bucket", &row.name)])) } { (row.name) } }
                                @match row.usage {
                                    Some(usage) => {
                                        td.num { @if usage.more { "≥ " } (usage.objects) }
                                        td.num { @if usage.more { "≥ " } (bytes(usage.bytes)) }
                                    }
                                    None => { td.num { "—" } td.num { "—" } }
                                }
                                td { (time(row.created_ms)) }
                                @if admin {
                                    td {
                                        form.inline.confirm method="post" action="/buckets/delete" {
                                            input type="hidden" name="csrf" value=(view.csrf);
                                            input type="hidden" name="bucket" value=(row.name);
                                            input type="text" name="confirm" placeholder="type the name to confirm" required;
                                            button type="submit" { "Delete" }
                                        }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// The folders above `prefix`, as links: `bucket / a / b /`.
fn breadcrumbs(bucket: &str, prefix: &str) -> Markup {
    let mut parts = Vec::new();
    let mut upto = String::new();
    for segment in prefix.split_inclusive('/') {
        upto.push_str(segment);
        parts.push((segment.to_owned(), upto.clone()));
    }
    html! {
        nav.crumbs {
            a href="/buckets" { "Buckets" } " / "
            a href={ "/objects" (query(&[("bucket", bucket)])) } { (bucket) }
            @for (segment, upto) in &parts {
                " / " a href={ "/objects" (query(&[("bucket", bucket), ("prefix", upto)])) } { (segment) }
            }
        }
    }
}

pub(crate) fn objects(view: &View<'_>, bucket: &str, prefix: &str, rows: &[Row], more: Option<&str>) -> Markup {
    let writable = view.who.allows(Some(bucket), access::Action::Write);
    // Uploads land in the folder shown, not under a search's partial name.
    let folder = prefix.rfind('/').map_or("", |at| &prefix[..=at]);
    // Names relative to that folder: a search for `photos/c` shows `cat.jpg`, not `at.jpg`.
    let name = |key: &str| -> String {
        let shown = key.strip_prefix(folder).unwrap_or(key);
        if shown.is_empty() { key.to_owned() } else { shown.to_owned() }
    };
    shell(
        bucket,
        Some(view),
        html! {
            (breadcrumbs(bucket, prefix))
            form.inline method="get" action="/objects" {
                input type="hidden" name="bucket" value=(bucket);
                input type="search" name="prefix" value=(prefix) placeholder="search by prefix";
                button type="submit" { "Search" }
            }
            @if writable {
                section id="upload" data-bucket=(bucket) data-prefix=(folder) data-csrf=(view.csrf) {
                    p.drop { "Drop files here, or " input id="files" type="file" multiple; }
                    ul id="uploads" {}
                }
            }
            table id="objects" {
                thead { tr { th { "Name" } th { "Size" } th { "Modified" } } }
                tbody {
                    @for row in rows {
                        @match row {
                            Row::Folder(folder) => tr.folder {
                                td { a href={ "/objects" (query(&[("bucket", bucket), ("prefix", folder)])) } { (name(folder)) } }
                                td {} td {}
                            },
                            Row::Object(entry) => tr {
                                td { a href={ "/object" (query(&[("bucket", bucket), ("key", &entry.key)])) } { (name(&entry.key)) } }
                                td.num { (bytes(entry.size)) }
                                td { (time(entry.modified_ms)) }
                            },
                        }
                    }
                }
            }
            @if rows.is_empty() { p { "Nothing here." } }
            @if let Some(after) = more {
                p { a id="next" href={ "/objects" (query(&[("bucket", bucket), ("prefix", prefix), ("after", after)])) } { "Next page →" } }
            }
        },
    )
}

pub(crate) fn object(view: &View<'_>, info: &client::ObjectInfo) -> Markup {
    let meta = &info.meta;
    let writable = view.who.allows(Some(&meta.bucket), access::Action::Write);
    let folder = meta.key.rsplit_once('/').map_or(String::new(), |(folder, _)| format!("{folder}/"));
    let geometry = meta.geometry();
    let k = usize::from(meta.k);
    html! {
        (shell(&meta.key, Some(view), html! {
            (breadcrumbs(&meta.bucket, &folder))
            h1 { (meta.key) }
            p {
                a.button id="download" href={ "/download" (query(&[("bucket", &meta.bucket), ("key", &meta.key)])) } { "Download" }
            }
            dl {
                dt { "Size" } dd { (bytes(meta.size)) " (" (meta.size) " bytes)" }
                dt { "ETag" } dd { code { (meta.etag) } }
                dt { "Content type" } dd { (meta.content_type) }
                dt { "Modified" } dd { (time(meta.modified_ms)) }
                dt { "Version" } dd { code { (meta.version.to_hex()) } }
                dt { "Erasure" } dd { (meta.k) "+" (meta.m) ", " (bytes(u64::from(meta.chunk_bytes))) " chunks, " (geometry.stripes) " stripe(s), set " (meta.set_idx) }
                @for (name, value) in &meta.user_meta { dt { "x-amz-meta-" (name) } dd { (value) } }
            }
            h2 { "Chunk placement" }
            @if !meta.parts.is_empty() {
                p id="parts" { "A multipart object of " (meta.parts.len()) " parts: each part is an erasure-coded piece of its own, placed by its own key (possibly in another erasure set), so no one table describes it." }
            } @else {
            table id="chunks" {
                thead { tr { th { "Position" } th { "Node" } th { "Drive" } th { "Data chunks" } th { "Parity chunks" } th { "Stripe 0" } th { "Metadata" } } }
                tbody {
                    @for (position, (node, drive)) in info.drives.iter().enumerate() {
                        @let (data, parity) = (0..geometry.stripes).fold((0u64, 0u64), |(d, p), stripe| {
                            if info.placement.chunk_at(stripe, position) < k { (d + 1, p) } else { (d, p + 1) }
                        });
                        @let has_meta = info.meta_positions.is_empty() || info.meta_positions.contains(&position);
                        tr.(if has_meta { "present" } else { "missing" }) {
                            td.num { (position) }
                            td { (node) }
                            td.num { (drive) }
                            td.num { (data) }
                            td.num { (parity) }
                            td { @if geometry.stripes > 0 {
                                @let chunk = info.placement.chunk_at(0, position);
                                @if chunk < k { "data " (chunk) } @else { "parity " (chunk - k) }
                            } }
                            td { @if has_meta { "present" } @else { "missing: read around it, repair restores it" } }
                        }
                    }
                }
            }
            }
            @if writable {
                form.inline method="post" action="/object/delete" {
                    input type="hidden" name="csrf" value=(view.csrf);
                    input type="hidden" name="bucket" value=(meta.bucket);
                    input type="hidden" name="key" value=(meta.key);
                    button type="submit" id="delete-object" { "Delete object" }
                }
            }
        }))
    }
}

/// The access keys (root only): each with its scope and a revoke button, records that do not
/// open with their error (gateways refuse them), and the form that makes a new key.
pub(crate) fn keys(view: &View<'_>, listed: &[(String, Result<access::AccessKey, access::Error>)]) -> Markup {
    shell(
        "Access keys",
        Some(view),
        html! {
            h1 { "Access keys" }
            p { "Keys limited to some buckets (or all), read-only or read-write. Every gateway enforces them; a revoked key stops working within 5 seconds." }
            form.key method="post" action="/keys/create" id="create-key" {
                input type="hidden" name="csrf" value=(view.csrf);
                label { "Buckets " input type="text" name="buckets" placeholder="bucket-a, bucket-b"; }
                label { input type="checkbox" name="all_buckets"; " all buckets, present and future" }
                label { "Permission "
                    select name="permission" {
                        option value="read-only" selected { "read-only" }
                        option value="read-write" { "read-write" }
                    }
                }
                label { "Description " input type="text" name="description" maxlength=(access::DESCRIPTION_CHARS_MAX) placeholder="what it is for"; }
                button type="submit" { "Create key" }
            }
            @if listed.is_empty() { p { "No access keys yet." } } @else {
                table id="keys" {
                    thead { tr { th { "Access key" } th { "Permission" } th { "Buckets" } th { "Description" } th { "Created" } th { "Revoke" } } }
                    tbody {
                        @for (id, key) in listed {
                            tr {
                                td { code { (id) } }
                                @match key {
                                    Ok(key) => {
                                        td { (key.permission) }
                                        td { @match &key.buckets { access::Buckets::All => { "all" } access::Buckets::Only(names) => { (names.join(", ")) } } }
                                        td { (key.description) }
                                        td { (time(key.created_ms)) }
                                    }
                                    Err(e) => { td.error colspan="4" { "refused by every gateway: " (e) } }
                                }
                                td {
                                    form.inline method="post" action="/keys/revoke" {
                                        input type="hidden" name="csrf" value=(view.csrf);
                                        input type="hidden" name="id" value=(id);
                                        button type="submit" { "Revoke" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
        },
    )
}

/// A new key's id and secret: the only time the secret is shown.
pub(crate) fn key_created(view: &View<'_>, key: &access::AccessKey, secret: &str) -> Markup {
    shell(
        "Access key created",
        Some(view),
        html! {
            h1 { "Access key created" }
            p.notice role="alert" { "Copy the secret key now: neither the console nor `tessera key` shows it again." }
            dl id="new-key" {
                dt { "Access key" } dd { code id="new-access-key" { (key.id) } }
                dt { "Secret key" } dd { code id="new-secret-key" { (secret) } }
                dt { "Permission" } dd { (key.permission) }
                dt { "Buckets" } dd { @match &key.buckets { access::Buckets::All => { "all" } access::Buckets::Only(names) => { (names.join(", ")) } } }
                @if !key.description.is_empty() { dt { "Description" } dd { (key.description) } }
            }
            p { a href="/keys" { "Back to the access keys" } }
        },
    )
}

/// Seconds between updates of the cluster page.
pub(crate) const CLUSTER_REFRESH_S: u32 = 5;

/// The cluster page: health, nodes, drives (with how full each is), erasure sets, repair;
/// with `charts`, the gateway's live throughput and latency (console.js draws them from
/// `/cluster/traffic`). Every [`CLUSTER_REFRESH_S`] console.js fetches the page again and swaps
/// in its `data-live` parts (the health line and the tables), so the charts keep their state;
/// without scripts the page reloads itself.
pub(crate) fn cluster(view: &View<'_>, status: &client::ClusterStatus, charts: bool) -> Markup {
    let serving: Vec<&client::NodeStatus> = status.nodes.iter().filter(|n| !n.removed).collect();
    let up = serving.iter().filter(|n| n.up).count();
    let repair = &status.repair;
    let or_dash = |v: Option<u64>, f: fn(u64) -> String| v.map_or_else(|| "—".to_owned(), f);
    shell_refreshed(
        "Cluster",
        Some(view),
        Some(CLUSTER_REFRESH_S),
        charts,
        html! {
            h1 { "Cluster" }
            p id="health" data-live class=(if status.health == "ok" { "ok" } else { "error" }) {
                "Cluster " code { (status.cluster_id) } " (map version " (status.map_version) "): "
                strong { (status.health) } ", " (up) " of " (serving.len()) " nodes up; node protocol over "
                (if status.node_tls { "TLS" } else { "plain TCP" }) "."
            }
            p.muted id="refresh" data-refresh-ms=(CLUSTER_REFRESH_S * 1000) { "This page updates every " (CLUSTER_REFRESH_S) " s." }
            @if charts {
                h2 { "This gateway's traffic" }
                section id="charts" data-src="/cluster/traffic" {
                    div id="throughput-chart" {}
                    div id="latency-chart" {}
                    p.muted id="charts-note" { "S3 requests this gateway answered, per 2 s, over the last 10 minutes." }
                }
            }
            div id="cluster-tables" data-live {
                h2 { "Nodes" }
                table id="nodes" {
                    thead { tr { th { "Node" } th { "Address" } th { "State" } th { "Version" } th { "Uptime" } th { "Map" } th { "Connections" } } }
                    tbody {
                        @for node in &status.nodes {
                            tr.(if node.up || node.removed { "present" } else { "missing" }) data-node=(node.id) {
                                td { (node.id) }
                                td { code { (node.addr) } }
                                @if node.removed {
                                    td { "removed" }
                                    td colspan="4" { "in a decommissioned pool: holds nothing, may be shut down" }
                                } @else if node.up {
                                    td { "up" }
                                    td { (node.version.as_deref().unwrap_or("—")) }
                                    td.num { (or_dash(node.uptime_s, |s| humantime::format_duration(std::time::Duration::from_secs(s)).to_string())) }
                                    td.num { (or_dash(node.map_version, |v| v.to_string())) }
                                    td.num { (or_dash(node.connections, |v| v.to_string())) }
                                } @else {
                                    td { "down" }
                                    td colspan="4" { (node.error.as_deref().unwrap_or("no answer")) }
                                }
                            }
                        }
                    }
                }
                h2 { "Drives" }
                table id="drives" {
                    thead { tr { th { "Drive" } th { "Used" } th { "Size" } th { "Versions" } th { "Errors" } th { "State" } th { "Path" } } }
                    tbody {
                        @for node in status.nodes.iter().filter(|n| !n.removed) {
                            @for drive in &node.drives {
                                @let state = if !node.up { "node down".to_owned() } else if let Some(problem) = &drive.problem { format!("error: {problem}") } else if drive.rebuilding { "rebuilding".to_owned() } else { "ok".to_owned() };
                                tr.(if state == "ok" { "present" } else { "missing" }) {
                                    td { (node.id) "/" (drive.drive) }
                                    td {
                                        @if let (Some(used), Some(total)) = (drive.used_bytes, drive.total_bytes) {
                                            meter min="0" max=(total) value=(used) {} " " (bytes(used))
                                            @if total > 0 { " (" (used * 100 / total) "%)" }
                                        } @else { "—" }
                                    }
                                    td.num { (or_dash(drive.total_bytes, bytes)) }
                                    td.num { (or_dash(drive.versions, |v| v.to_string())) }
                                    td.num { (or_dash(drive.errors, |v| v.to_string())) }
                                    td { (state) }
                                    td { code { (drive.path) } }
                                }
                            }
                        }
                    }
                }
                h2 { "Erasure sets" }
                table id="sets" {
                    thead { tr { th { "Set" } th { "Pool" } th { "Erasure" } th { "Drives out" } th { "Health" } } }
                    tbody {
                        @for set in &status.sets {
                            tr.(if set.health == "ok" { "present" } else { "missing" }) {
                                td.num { (set.set) }
                                td.num { (set.pool.map_or_else(|| "—".to_owned(), |p| p.to_string())) }
                                td { (set.erasure) }
                                td { @if set.out.is_empty() { "—" } @else { (set.out.join(", ")) } }
                                td { (set.health) }
                            }
                        }
                    }
                }
                h2 { "Repair" }
                p id="repair" {
                    (repair.queued_entries) " queued (" (bytes(repair.queued_bytes)) "), " (repair.at_risk) " at risk (fewer than k+1 healthy chunks); "
                    (repair.versions_repaired) " versions (" (bytes(repair.bytes_repaired)) ") repaired since the nodes started."
                    @if !repair.paused_nodes.is_empty() { " Paused on " (repair.paused_nodes.join(", ")) "." }
                    @if !repair.unknown_nodes.is_empty() { " Unknown on " (repair.unknown_nodes.join(", ")) " (no answer)." }
                }
            }
        },
    )
}

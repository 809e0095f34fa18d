use super::*;

#[test]
fn folders_are_the_next_segment_and_listing_skips_past_them() {
    assert_eq!(folder_of("a/b/c.txt", ""), Some("a/"));
    assert_eq!(folder_of("a/b/c.txt", "a/"), Some("a/b/"));
    assert_eq!(folder_of("a/b/c.txt", "a/b/"), None);
    assert_eq!(folder_of("top.txt", ""), None);
    let past = past_folder("a/b/");
    assert!(past.as_str() > "a/b/zzzz/\u{10FFFE}" && past.as_str() < "a/c");
}

#[test]
fn downloads_name_the_file_without_letting_it_escape_the_header() {
    assert_eq!(attachment("dir/report 2026.pdf"), "attachment; filename*=UTF-8''report%202026.pdf");
    assert_eq!(attachment("x/\"; evil=1\r\n"), "attachment; filename*=UTF-8''%22%3B%20evil%3D1%0D%0A");
    assert_eq!(attachment("dir/"), "attachment; filename*=UTF-8''download");
}

#[test]
fn queries_encode_every_value() {
    assert_eq!(query(&[("bucket", "b"), ("key", "a&b=c/../d é")]), "?bucket=b&key=a%26b%3Dc%2F..%2Fd+%C3%A9");
}

#[test]
fn pages_escape_names_and_metadata() {
    let who = Who::Root { access_key: "root".into() };
    let view = pages::View { who: &who, csrf: "t0ken" };
    let entry = client::ListEntry {
        key: "<script>alert(1)</script>".into(),
        version: proto::VersionId { unix_ns: 1, writer: 2 },
        deleted: false,
        size: 3,
        etag: "e".into(),
        modified_ms: 0,
    };
    let html = pages::objects(&view, "bkt", "", &[pages::Row::Object(entry)], None).into_string();
    assert!(!html.contains("<script>alert"), "{html}");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{html}");
    let bad = pages::error(StatusCode::BAD_REQUEST, "<img src=x onerror=alert(1)>").into_string();
    assert!(!bad.contains("<img"), "{bad}");
}

#[test]
fn a_key_form_names_buckets_or_all_of_them_never_both_or_neither() {
    assert_eq!(form_buckets(true, " "), Ok(access::Buckets::All));
    assert_eq!(form_buckets(false, "a, b\nc,,"), Ok(access::Buckets::Only(vec!["a".into(), "b".into(), "c".into()])));
    assert!(form_buckets(true, "a").is_err());
    assert!(form_buckets(false, " , ").is_err());
}

#[test]
fn the_cluster_page_updates_its_live_parts_and_reloads_only_without_scripts() {
    let who = Who::Root { access_key: "root".into() };
    let view = pages::View { who: &who, csrf: "t0ken" };
    let status = client::ClusterStatus {
        cluster_id: "c1".into(),
        map_version: 3,
        node_tls: false,
        health: "ok",
        nodes: Vec::new(),
        sets: Vec::new(),
        repair: client::RepairSummary::default(),
    };
    let html = pages::cluster(&view, &status, true).into_string();
    // console.js swaps in these parts by id, and polls at this interval.
    assert!(html.contains(r#"<p id="health" data-live"#), "{html}");
    assert!(html.contains(r#"<div id="cluster-tables" data-live>"#), "{html}");
    assert!(html.contains(&format!(r#"data-refresh-ms="{}""#, pages::CLUSTER_REFRESH_S * 1000)), "{html}");
    // The charts live outside the swapped parts, so an update does not rebuild them.
    let charts = html.find(r#"id="charts""#).expect("charts");
    let tables = html.find(r#"id="cluster-tables""#).expect("tables");
    assert!(charts < tables && !html[tables..].contains(r#"id="charts""#));
    // The page reloads itself only when scripts are off.
    assert!(html.contains(&format!(
        r#"<noscript><meta http-equiv="refresh" content="{}"></noscript>"#,
        pages::CLUSTER_REFRESH_S
    )));
    assert_eq!(html.matches("http-equiv").count(), 1);
}

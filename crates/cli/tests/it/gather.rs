//! Gather: rows of a table object picked by index, byte-exact healthy, around a corrupt chunk
//! and with two nodes down.

use client::{ObjectInfo, RowTable};

use crate::harness::{Cluster, Shape, block_on, payload};

const HEADER: u64 = 128;
/// Rows of 1000 bytes: with 64 KiB chunks, some rows cross a chunk (and a stripe) boundary.
const ROW_BYTES: u64 = 1000;
const ROWS: u64 = 3000;

/// Indices as a sampler draws them: random, some repeated, some runs of neighbours.
fn indices() -> Vec<u64> {
    let mut state = 0x2545f4914f6cdd1du64;
    let mut out = Vec::new();
    for i in 0..1500u64 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let row = state % ROWS;
        out.push(row);
        if i % 10 == 0 && row + 3 < ROWS {
            out.extend([row + 1, row + 2, row + 3]);
        }
        if i % 25 == 0 {
            out.push(row);
        }
    }
    out.push(ROWS - 1);
    out.push(0);
    out
}

fn gathered(cluster: &Cluster, info: &ObjectInfo, indices: &[u64]) -> Vec<u8> {
    let client = cluster.client();
    let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
    let mut out = vec![0u8; indices.len() * ROW_BYTES as usize];
    block_on(async { client.gather(info, &table, indices, &mut out, None).await }).expect("gather");
    out
}

fn expected(object: &[u8], indices: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(indices.len() * ROW_BYTES as usize);
    for &row in indices {
        let start = (HEADER + row * ROW_BYTES) as usize;
        out.extend_from_slice(&object[start..start + ROW_BYTES as usize]);
    }
    out
}

#[test]
fn gathered_rows_are_byte_exact_healthy_around_a_corrupt_chunk_and_with_two_nodes_down() {
    let mut cluster = Cluster::start(Shape::default());
    let object = payload((HEADER + ROWS * ROW_BYTES) as usize, 7);
    let client = cluster.client();
    let info = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "features.npy", &object, &Default::default()).await.unwrap();
        client.head("bkt", "features.npy").await.unwrap()
    });
    let indices = indices();
    assert!(gathered(&cluster, &info, &indices) == expected(&object, &indices), "healthy gather differs");

    // Every stored byte of node n1 flipped: the rows it holds come back rebuilt.
    let on_n1 = indices
        .iter()
        .filter(|&&row| {
            let position = info.position_of(HEADER + row * ROW_BYTES).unwrap();
            info.drives[position].0 == "n1"
        })
        .count();
    assert!(on_n1 > 100, "the gather must read rows held by n1 ({on_n1})");
    let originals: Vec<(std::path::PathBuf, Vec<u8>)> =
        cluster.data_files(0).into_iter().map(|file| (file.clone(), std::fs::read(&file).unwrap())).collect();
    for (file, bytes) in &originals {
        std::fs::write(file, bytes.iter().map(|b| b ^ 0x5a).collect::<Vec<u8>>()).unwrap();
    }
    assert!(gathered(&cluster, &info, &indices) == expected(&object, &indices), "gather around corruption differs");

    // n1 whole again (a repair may have rewritten it meanwhile: the same bytes), two nodes down.
    for (file, bytes) in &originals {
        std::fs::write(file, bytes).unwrap();
    }
    cluster.kill_node(2);
    cluster.kill_node(4);
    let on_down = indices
        .iter()
        .filter(|&&row| {
            let position = info.position_of(HEADER + row * ROW_BYTES).unwrap();
            ["n3", "n5"].contains(&info.drives[position].0.as_str())
        })
        .count();
    assert!(on_down > 100, "the gather must want rows held by the killed nodes ({on_down})");
    assert!(gathered(&cluster, &info, &indices) == expected(&object, &indices), "gather with two nodes down differs");
}

#[test]
fn bad_gathers_are_refused_before_reading() {
    let cluster = Cluster::start(Shape::default());
    let object = payload((HEADER + ROWS * ROW_BYTES) as usize, 8);
    let client = cluster.client();
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "t", &object, &Default::default()).await.unwrap();
        let info = client.head("bkt", "t").await.unwrap();
        let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
        let mut out = vec![0u8; 2 * ROW_BYTES as usize];
        let error = client.gather(&info, &table, &[1, ROWS], &mut out, None).await.unwrap_err().to_string();
        assert!(error.contains(&format!("index {ROWS} (position 1) is out of range")), "{error}");
        let error = client.gather(&info, &table, &[1], &mut out, None).await.unwrap_err().to_string();
        assert!(error.contains("the output has 2000 bytes"), "{error}");
        let too_many = RowTable { rows: ROWS + 1, ..table };
        let error = client.gather(&info, &too_many, &[1, 2], &mut out, None).await.unwrap_err().to_string();
        assert!(error.contains("do not fit"), "{error}");
        assert!(out.iter().all(|&b| b == 0), "nothing was written");
    });
}

#[test]
fn a_row_cache_serves_hot_rows_even_with_the_nodes_gone_and_never_a_replaced_objects() {
    let mut cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
    let (first, second) =
        (payload((HEADER + ROWS * ROW_BYTES) as usize, 1), payload((HEADER + ROWS * ROW_BYTES) as usize, 2));
    let hot: Vec<u64> = (0..50).map(|i| i * 37 % ROWS).collect();
    let cache = client::RowCache::new(1 << 20);
    let gather = |info: &ObjectInfo, indices: &[u64]| {
        let mut out = vec![0u8; indices.len() * ROW_BYTES as usize];
        block_on(async { cluster.client().gather(info, &table, indices, &mut out, Some(&cache)).await }).map(|()| out)
    };
    let put = |bytes: &[u8]| {
        block_on(async {
            client.put_bytes("bkt", "t.npy", bytes, &Default::default()).await.unwrap();
            client.head("bkt", "t.npy").await.unwrap()
        })
    };
    block_on(async { client.make_bucket("bkt").await.unwrap() });
    let info = put(&first);
    assert!(gather(&info, &hot).unwrap() == expected(&first, &hot));
    assert_eq!((cache.stats().hits, cache.stats().misses), (0, 50));
    assert!(gather(&info, &hot).unwrap() == expected(&first, &hot));
    assert_eq!((cache.stats().hits, cache.stats().misses), (50, 50), "the second gather came from the cache");
    // Replaced: the new version's rows, never the cached ones of the old.
    let info = put(&second);
    assert!(gather(&info, &hot).unwrap() == expected(&second, &hot));
    assert_eq!(cache.stats().misses, 100);
    // Three nodes gone (more than m): cached rows still gather, others cannot.
    for idx in [0, 1, 2] {
        cluster.kill_node(idx);
    }
    let mut out = vec![0u8; hot.len() * ROW_BYTES as usize];
    let fresh = cluster.client();
    block_on(async { fresh.gather(&info, &table, &hot, &mut out, Some(&cache)).await }).expect("served from the cache");
    assert!(out == expected(&second, &hot));
    let cold: Vec<u64> = (0..ROWS).filter(|r| !hot.contains(r)).take(50).collect();
    let mut out = vec![0u8; cold.len() * ROW_BYTES as usize];
    let error = block_on(async { fresh.gather(&info, &table, &cold, &mut out, Some(&cache)).await }).unwrap_err();
    assert!(matches!(error, client::Error::Unavailable { .. }), "{error}");
    assert!(cache.stats().bytes <= cache.stats().capacity_bytes);
}

#[test]
fn a_row_cache_stays_within_its_capacity() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let object = payload((HEADER + ROWS * ROW_BYTES) as usize, 3);
    let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
    let cache = client::RowCache::new(256 << 10);
    block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "t", &object, &Default::default()).await.unwrap();
        let info = client.head("bkt", "t").await.unwrap();
        let all: Vec<u64> = (0..ROWS).collect();
        let mut out = vec![0u8; all.len() * ROW_BYTES as usize];
        client.gather(&info, &table, &all, &mut out, Some(&cache)).await.unwrap();
        assert!(out == expected(&object, &all));
    });
    let stats = cache.stats();
    assert!(stats.bytes <= stats.capacity_bytes, "{stats:?}");
    assert!(stats.rows > 0 && stats.rows < ROWS, "{stats:?}");
}

#[test]
fn small_checksum_blocks_and_several_tables_in_one_gather() {
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let (plain, small) =
        (payload((HEADER + ROWS * ROW_BYTES) as usize, 11), payload((HEADER + ROWS * ROW_BYTES) as usize, 12));
    let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
    let (plain_info, small_info) = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        let options = client::PutOptions { block_bytes: Some(4096), ..Default::default() };
        client.put_bytes("bkt", "plain", &plain, &Default::default()).await.unwrap();
        client.put_bytes("bkt", "small", &small, &options).await.unwrap();
        for bad in [3000, 2048, 128 << 10] {
            let options = client::PutOptions { block_bytes: Some(bad), ..Default::default() };
            let error = client.put_bytes("bkt", "bad", &small, &options).await.unwrap_err();
            assert!(matches!(error, client::Error::BadBlockSize(b) if b == bad), "{error}");
        }
        assert!(matches!(client.head("bkt", "bad").await, Err(client::Error::NotFound { .. })), "nothing written");
        (client.head("bkt", "plain").await.unwrap(), client.head("bkt", "small").await.unwrap())
    });
    assert_eq!((plain_info.meta.block_bytes, small_info.meta.block_bytes), (64 << 10, 4096));
    // Every stored byte of n1 flipped: 4 KiB blocks catch it as 64 KiB ones do.
    let indices = indices();
    let on_n1 = indices
        .iter()
        .filter(|&&row| small_info.drives[small_info.position_of(HEADER + row * ROW_BYTES).unwrap()].0 == "n1")
        .count();
    assert!(on_n1 > 100, "the gather must read rows held by n1 ({on_n1})");
    for file in cluster.data_files(0) {
        let bytes = std::fs::read(&file).unwrap();
        std::fs::write(&file, bytes.iter().map(|b| b ^ 0xa5).collect::<Vec<u8>>()).unwrap();
    }
    let reversed: Vec<u64> = indices.iter().rev().copied().collect();
    let mut outs = [
        vec![0u8; indices.len() * ROW_BYTES as usize],
        vec![0u8; indices.len() * ROW_BYTES as usize],
        vec![0u8; reversed.len() * ROW_BYTES as usize],
    ];
    let [a, b, c] = &mut outs;
    let mut items = [
        client::GatherItem { info: &plain_info, table, indices: &indices, out: a },
        client::GatherItem { info: &small_info, table, indices: &indices, out: b },
        client::GatherItem { info: &small_info, table, indices: &reversed, out: c },
    ];
    block_on(client.gather_many(&mut items, None)).expect("gather_many");
    assert!(outs[0] == expected(&plain, &indices), "plain table differs");
    assert!(outs[1] == expected(&small, &indices), "small-block table differs");
    assert!(outs[2] == expected(&small, &reversed), "second list of the same table differs");
    // One bad item fails the call before anything is read.
    let mut out = vec![7u8; 2 * ROW_BYTES as usize];
    let mut other = vec![7u8; ROW_BYTES as usize];
    let mut items = [
        client::GatherItem { info: &plain_info, table, indices: &[1, 2], out: &mut out },
        client::GatherItem { info: &small_info, table, indices: &[ROWS], out: &mut other },
    ];
    let error = block_on(client.gather_many(&mut items, None)).unwrap_err().to_string();
    assert!(error.contains("out of range"), "{error}");
    assert!(out.iter().chain(&other).all(|&b| b == 7), "nothing was written");
}

/// A table read again and again (every mini-batch heads it) costs one round of versions only:
/// the drives leave the block checksums out, the client fills them in from what it read
/// before, and an overwrite is followed at once (its checksums are fetched whole).
#[test]
fn repeated_heads_ask_for_versions_only_and_follow_an_overwrite() {
    use proto::{MetaDetail, MetaKey, Request, Response};
    let cluster = Cluster::start(Shape::default());
    let client = cluster.client();
    let (first, second) =
        (payload((HEADER + ROWS * ROW_BYTES) as usize, 21), payload((HEADER + ROWS * ROW_BYTES) as usize, 22));
    let options = client::PutOptions { block_bytes: Some(4096), ..Default::default() };
    let keys = [("bkt".to_owned(), "t".to_owned())];
    let cached = || block_on(client.head_many_cached(&keys)).pop().unwrap().expect("head_many_cached");
    let rounds = |head: &dyn Fn() -> ObjectInfo| {
        let before = client.metadata_counts().requests;
        let info = head();
        (info, client.metadata_counts().requests - before)
    };
    let whole = block_on(async {
        client.make_bucket("bkt").await.unwrap();
        client.put_bytes("bkt", "t", &first, &options).await.unwrap();
        client.head("bkt", "t").await.unwrap()
    });
    let (info, asked_first) = rounds(&cached);
    assert_eq!(info.meta, whole.meta, "the same record as a whole head, checksums included");
    let (info, asked_again) = rounds(&cached);
    assert_eq!(info.meta, whole.meta);
    assert_eq!(asked_first, 2 * asked_again, "the first head asks twice (versions, then whole), later ones once");
    let indices = indices();
    let table = RowTable { data_offset: HEADER, row_bytes: ROW_BYTES, rows: ROWS };
    let mut out = vec![0u8; indices.len() * ROW_BYTES as usize];
    block_on(client.gather(&info, &table, &indices, &mut out, None)).expect("gather with cached checksums");
    assert!(out == expected(&first, &indices));

    // The drives' brief answers carry no checksums, and say so.
    let map = client.map();
    let placement = map.placement_in(0, "bkt", "t");
    let drive = map.sets[placement.set_idx].drives[0];
    let mut session =
        crate::protocol::RawSession::open(map.nodes[drive.node_idx].addr, &crate::protocol::secret_of(&cluster));
    let item = MetaKey { drive: drive.drive_idx as u32, bucket: "bkt".into(), key: "t".into() };
    for (detail, left_out) in
        [(MetaDetail::VersionsBrief, true), (MetaDetail::WithFloorBrief, true), (MetaDetail::Versions, false)]
    {
        match session.call(&Request::MetaGet { items: vec![item.clone()], detail }) {
            Response::Versions { keys } => {
                let current = keys[0].current.as_ref().expect("the drive holds the table");
                assert_eq!(keys[0].checksums_left_out, left_out, "{detail:?}");
                assert_eq!(current.crcs.is_empty(), left_out, "{detail:?}");
                assert_eq!(keys[0].finalized.is_some(), detail.with_floor(), "{detail:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    // Overwritten (by another client): the next head reads the new version's checksums whole.
    let newer = block_on(async {
        let other = cluster.client();
        other.put_bytes("bkt", "t", &second, &options).await.unwrap();
        other.head("bkt", "t").await.unwrap()
    });
    let (info, asked) = rounds(&cached);
    assert_eq!(info.meta, newer.meta);
    assert_eq!(asked, asked_first, "a version not seen before is asked for whole");
    block_on(client.gather(&info, &table, &indices, &mut out, None)).expect("gather of the new version");
    assert!(out == expected(&second, &indices));
}

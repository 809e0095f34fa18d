use super::*;
use proptest::prelude::*;

fn spec(nodes: usize, drives_per_node: usize, k: usize, m: usize) -> InitSpec {
    InitSpec {
        nodes,
        drives_per_node,
        erasure: ErasureConfig::new(k, m).unwrap(),
        base_port: 7000,
        chunk_bytes: CHUNK_BYTES_DEFAULT,
    }
}

fn generate(nodes: usize, drives_per_node: usize, k: usize, m: usize) -> Result<ClusterMap, Error> {
    ClusterMap::generate(&spec(nodes, drives_per_node, k, m), "cid", "00ff", Path::new("/data"))
}

#[test]
fn erasure_config_parses_and_rejects() {
    assert_eq!("4+2".parse::<ErasureConfig>().unwrap(), ErasureConfig { k: 4, m: 2 });
    for bad in ["4", "0+2", "4+0", "30+3", "a+b", "", "+"] {
        assert!(bad.parse::<ErasureConfig>().is_err(), "{bad} must be rejected");
    }
}

#[test]
fn write_quorum_follows_design() {
    let check = |k, m, expected| assert_eq!(ErasureConfig::new(k, m).unwrap().write_quorum(), expected);
    check(4, 2, 5);
    check(8, 3, 9);
    check(2, 2, 3);
    check(1, 3, 3);
    check(10, 4, 11);
    check(4, 1, 5);
}

#[test]
fn generated_map_round_trips_through_toml() {
    let map = generate(6, 2, 4, 2).unwrap();
    assert_eq!(map.sets.len(), 2);
    let text = map.to_toml();
    assert!(text.contains("[[node]]") && text.contains("id = \"n1\"") && text.contains("127.0.0.1:7000"));
    let parsed = ClusterMap::from_toml(&text, Path::new("/data")).unwrap();
    assert_eq!(parsed, map);
}

#[test]
fn generate_rejects_impossible_shapes() {
    assert_eq!(generate(5, 1, 4, 2).unwrap_err(), Error::TooFewNodes { k: 4, m: 2, nodes: 5 });
    assert_eq!(generate(7, 1, 4, 2).unwrap_err(), Error::DrivesNotMultiple { drives: 7, n: 6 });
    assert!(generate(7, 6, 4, 2).is_ok());
}

#[test]
fn malformed_toml_is_rejected_with_reason() {
    let map = generate(6, 1, 4, 2).unwrap();
    let text = map.to_toml();
    let check = |text: &str| ClusterMap::from_toml(text, Path::new("/d")).unwrap_err();
    assert!(matches!(check("not toml ["), Error::Parse { line: 1, .. }));
    assert!(matches!(check(&text.replace("format = 1", "format = 9")), Error::UnsupportedFormat { found: 9 }));
    assert!(matches!(check(&text.replace("127.0.0.1:7001", "127.0.0.1:7000")), Error::DuplicateAddr { .. }));
    assert!(matches!(check(&text.replace("\"n2:0\"", "\"n1:0\"")), Error::InvalidSet { .. }));
    assert!(matches!(check(&text.replace("\"n2:0\"", "\"n9:0\"")), Error::InvalidSet { .. }));
    assert!(matches!(check(&text.replace("ec = \"4+2\"", "ec = \"4+3\"")), Error::TooFewNodes { .. }));
}

#[test]
fn relative_drives_resolve_against_base_dir() {
    let map = generate(6, 1, 4, 2).unwrap();
    let drive = map.sets[0].drives[0];
    assert_eq!(map.drive_path(drive), PathBuf::from("/data/n1/d1"));
}

proptest! {
    #[test]
    fn sets_have_distinct_nodes_and_use_each_drive_once(
        k in 1usize..8, m in 1usize..4, extra_nodes in 0usize..5, drives_per_node in 1usize..4,
    ) {
        let n = k + m;
        let nodes = n + extra_nodes;
        let Ok(map) = generate(nodes, drives_per_node * n, k, m) else {
            return Err(TestCaseError::fail("a multiple of n drives must always generate"));
        };
        let mut seen = HashSet::new();
        for set in &map.sets {
            let set_nodes: HashSet<_> = set.drives.iter().map(|d| d.node_idx).collect();
            prop_assert_eq!(set_nodes.len(), n);
            for drive in &set.drives {
                prop_assert!(seen.insert(*drive));
            }
        }
        prop_assert_eq!(seen.len(), nodes * drives_per_node * n);
    }

    #[test]
    fn placement_is_a_permutation_per_stripe(key in ".{0,40}", stripe_idx in 0u64..1000) {
        let map = generate(6, 1, 4, 2).unwrap();
        let placement = map.placement("bkt", &key);
        prop_assert_eq!(placement, map.placement("bkt", &key));
        let positions: HashSet<_> = (0..6).map(|i| placement.position(stripe_idx, i)).collect();
        prop_assert_eq!(positions.len(), 6);
        for chunk_idx in 0..6 {
            prop_assert_eq!(placement.chunk_at(stripe_idx, placement.position(stripe_idx, chunk_idx)), chunk_idx);
        }
    }
}

#[test]
fn placement_balances_objects_over_sets() {
    let map = generate(8, 6, 4, 2).unwrap();
    let sets = map.sets.len();
    let mut counts = vec![0usize; sets];
    let objects = 8000;
    for i in 0..objects {
        counts[map.placement("bkt", &format!("obj-{i}")).set_idx] += 1;
    }
    let mean = objects / sets;
    for count in counts {
        assert!(count > mean * 8 / 10 && count < mean * 12 / 10, "unbalanced: {count} vs mean {mean}");
    }
}

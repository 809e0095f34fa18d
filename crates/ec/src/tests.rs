use std::sync::Arc;

use proptest::prelude::*;

use crate::{Codec, DECODE_CACHE_ENTRIES_MAX, Error, N_MAX, reference};

/// The codes Tessera runs, plus the smallest and a parity-heavy one.
const CONFIGS: [(usize, usize); 6] = [(4, 2), (8, 3), (10, 4), (16, 4), (1, 1), (3, 5)];
/// Codes at the `N_MAX` bound.
const CONFIGS_AT_N_MAX: [(usize, usize); 3] = [(31, 1), (1, 31), (16, 16)];
/// Up to this many erasure patterns, a property case tries them all; above it, it samples.
const PATTERNS_ENUMERATED_MAX: u128 = 256;
const PATTERNS_SAMPLED: usize = 48;
/// Odd, so no kernel gets a multiple of its vector width.
const LEN_ODD: usize = 67;

/// Loses the `lost` chunks of an encoded stripe (filling them with garbage), then checks that
/// `reconstruct` returns every original byte and `reconstruct_data` the original data bytes,
/// leaving lost parity chunks untouched.
fn check(codec: &Codec, stripe: &[Vec<u8>], lost: &[usize]) {
    let (k, m) = (codec.k(), codec.m());
    let present: Vec<bool> = (0..codec.n()).map(|i| !lost.contains(&i)).collect();

    let mut chunks = damaged(stripe, lost);
    codec.reconstruct(&mut as_slices(&mut chunks), &present).expect("reconstruct");
    assert_same(&chunks, stripe, &format!("reconstruct {k}+{m} lost {lost:?}"));

    let mut chunks = damaged(stripe, lost);
    let expected: Vec<Vec<u8>> =
        (0..codec.n()).map(|i| if i < k { stripe[i].clone() } else { chunks[i].clone() }).collect();
    codec.reconstruct_data(&mut as_slices(&mut chunks), &present).expect("reconstruct_data");
    assert_same(&chunks, &expected, &format!("reconstruct_data {k}+{m} lost {lost:?}"));
}

/// `k` data chunks of `len` bytes from `seed`, followed by the parity `codec` computes.
fn encoded_stripe(codec: &Codec, len: usize, seed: u64) -> Vec<Vec<u8>> {
    let mut random = SplitMix64(seed);
    let data: Vec<Vec<u8>> = (0..codec.k()).map(|_| random.bytes(len)).collect();
    let mut parity = vec![vec![0u8; len]; codec.m()];
    let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    codec.encode(&data_slices, &mut as_slices(&mut parity)).expect("encode");
    data.into_iter().chain(parity).collect()
}

fn damaged(stripe: &[Vec<u8>], lost: &[usize]) -> Vec<Vec<u8>> {
    let mut chunks = stripe.to_vec();
    for &i in lost {
        chunks[i].iter_mut().enumerate().for_each(|(j, byte)| *byte = 0xa5 ^ j as u8);
    }
    chunks
}

fn as_slices(chunks: &mut [Vec<u8>]) -> Vec<&mut [u8]> {
    chunks.iter_mut().map(Vec::as_mut_slice).collect()
}

fn assert_same(found: &[Vec<u8>], expected: &[Vec<u8>], what: &str) {
    let differing: Vec<usize> = (0..expected.len()).filter(|&i| found[i] != expected[i]).collect();
    assert!(differing.is_empty(), "{what}: chunks {differing:?} differ");
}

/// Every set of at most `m` lost chunks out of `n`, if there are at most `enumerated_max` of
/// them; otherwise `PATTERNS_SAMPLED` random ones, mostly with exactly m lost.
fn erasure_patterns(n: usize, m: usize, enumerated_max: u128, seed: u64) -> Vec<Vec<usize>> {
    let count: u128 = (0..=m).map(|lost| binomial(n, lost)).sum();
    if count <= enumerated_max {
        return (0..=m).flat_map(|lost| combinations(n, lost)).collect();
    }
    let mut random = SplitMix64(seed);
    (0..PATTERNS_SAMPLED)
        .map(|sample| {
            let lost = if sample % 4 == 0 { 1 + random.below(m) } else { m };
            let mut indices: Vec<usize> = (0..n).collect();
            for i in 0..lost {
                let j = i + random.below(n - i);
                indices.swap(i, j);
            }
            indices.truncate(lost);
            indices
        })
        .collect()
}

fn binomial(n: usize, r: usize) -> u128 {
    (0..r).fold(1, |c, i| c * (n - i) as u128 / (i + 1) as u128)
}

fn combinations(n: usize, r: usize) -> Vec<Vec<usize>> {
    if r == 0 {
        return vec![Vec::new()];
    }
    (r - 1..n)
        .flat_map(|last| {
            combinations(last, r - 1).into_iter().map(move |mut c| {
                c.push(last);
                c
            })
        })
        .collect()
}

struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next() as u8).collect()
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn reconstruct_with_any_m_chunks_lost_returns_original_bytes(
        (k, m) in prop::sample::select(&CONFIGS[..]),
        len in 0usize..5000,
        seed in any::<u64>(),
    ) {
        let codec = Codec::new(k, m).expect("valid config");
        let stripe = encoded_stripe(&codec, len, seed);
        for lost in erasure_patterns(k + m, m, PATTERNS_ENUMERATED_MAX, seed) {
            check(&codec, &stripe, &lost);
        }
    }

    #[test]
    fn encode_matches_naive_reference_parity(
        (k, m) in prop::sample::select(&CONFIGS[..]),
        len in 0usize..5000,
        seed in any::<u64>(),
    ) {
        let codec = Codec::new(k, m).expect("valid config");
        let stripe = encoded_stripe(&codec, len, seed);
        let parity = reference::encode(&stripe[..k], m);
        assert_same(&stripe[k..], &parity, &format!("parity {k}+{m} len {len}"));
    }
}

#[test]
fn reconstruct_with_every_erasure_pattern_returns_original_bytes() {
    for (k, m) in CONFIGS {
        let codec = Codec::new(k, m).expect("valid config");
        let stripe = encoded_stripe(&codec, LEN_ODD, 7);
        for lost in erasure_patterns(k + m, m, u128::MAX, 7) {
            check(&codec, &stripe, &lost);
        }
    }
}

#[test]
fn reconstruct_at_n_max_returns_original_bytes() {
    for (k, m) in CONFIGS_AT_N_MAX {
        let codec = Codec::new(k, m).expect("valid config");
        assert_eq!(codec.n(), N_MAX);
        let stripe = encoded_stripe(&codec, LEN_ODD, 11);
        assert_same(&stripe[k..], &reference::encode(&stripe[..k], m), "parity at N_MAX");
        for lost in erasure_patterns(N_MAX, m, 0, 11) {
            check(&codec, &stripe, &lost);
        }
    }
}

#[test]
fn encode_and_reconstruct_with_zero_length_chunks_succeed() {
    for (k, m) in CONFIGS {
        let codec = Codec::new(k, m).expect("valid config");
        let stripe = encoded_stripe(&codec, 0, 0);
        check(&codec, &stripe, &(0..m).collect::<Vec<_>>());
    }
}

#[test]
fn decode_cache_past_its_bound_stays_bounded_and_correct() {
    let codec = Codec::new(16, 4).expect("valid config");
    let stripe = encoded_stripe(&codec, LEN_ODD, 3);
    let patterns = combinations(codec.n(), codec.m());
    assert!(patterns.len() > DECODE_CACHE_ENTRIES_MAX);
    for lost in &patterns[..=DECODE_CACHE_ENTRIES_MAX] {
        check(&codec, &stripe, lost);
        assert!(codec.decode_cache_len() <= DECODE_CACHE_ENTRIES_MAX);
    }
    // A pattern decoded before the cache was cleared decodes again from fresh tables.
    check(&codec, &stripe, &patterns[0]);
}

#[test]
fn reconstruct_from_many_threads_with_shared_codec_returns_original_bytes() {
    let codec = Arc::new(Codec::new(10, 4).expect("valid config"));
    let stripe = encoded_stripe(&codec, 4099, 5);
    let patterns = combinations(codec.n(), codec.m());
    std::thread::scope(|scope| {
        for thread in 0..4 {
            let (codec, stripe, patterns) = (Arc::clone(&codec), &stripe, &patterns);
            scope.spawn(move || {
                for lost in patterns.iter().skip(thread % 2).step_by(7).take(100) {
                    check(&codec, stripe, lost);
                }
            });
        }
    });
}

#[test]
fn reconstruct_with_more_than_m_lost_returns_too_few_chunks_and_writes_nothing() {
    for (k, m) in CONFIGS {
        let codec = Codec::new(k, m).expect("valid config");
        let stripe = encoded_stripe(&codec, LEN_ODD, 1);
        let lost: Vec<usize> = (0..=m).collect();
        let present: Vec<bool> = (0..k + m).map(|i| !lost.contains(&i)).collect();
        let mut chunks = damaged(&stripe, &lost);
        let before = chunks.clone();
        let result = codec.reconstruct(&mut as_slices(&mut chunks), &present);
        assert!(
            matches!(result, Err(Error::TooFewChunks { present, needed }) if present == k - 1 && needed == k),
            "{k}+{m}: {result:?}"
        );
        let result = codec.reconstruct_data(&mut as_slices(&mut chunks), &present);
        assert!(matches!(result, Err(Error::TooFewChunks { .. })), "{k}+{m}: {result:?}");
        assert_same(&chunks, &before, "chunks after TooFewChunks");
    }
}

#[test]
fn encode_with_wrong_chunk_count_returns_chunk_count() {
    let codec = Codec::new(4, 2).expect("valid config");
    let data = vec![vec![0u8; 8]; 5];
    let mut parity = vec![vec![0u8; 8]; 3];
    let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();

    let result = codec.encode(&data_slices[..3], &mut as_slices(&mut parity[..2]));
    assert!(matches!(result, Err(Error::ChunkCount { expected: 4, found: 3 })), "{result:?}");
    let result = codec.encode(&data_slices, &mut as_slices(&mut parity[..2]));
    assert!(matches!(result, Err(Error::ChunkCount { expected: 4, found: 5 })), "{result:?}");
    let result = codec.encode(&data_slices[..4], &mut as_slices(&mut parity));
    assert!(matches!(result, Err(Error::ChunkCount { expected: 2, found: 3 })), "{result:?}");
    let result = codec.encode(&[], &mut []);
    assert!(matches!(result, Err(Error::ChunkCount { expected: 4, found: 0 })), "{result:?}");
}

#[test]
fn reconstruct_with_wrong_chunk_count_returns_chunk_count() {
    let codec = Codec::new(4, 2).expect("valid config");
    let mut chunks = vec![vec![0u8; 8]; 7];
    let present = [true; 7];
    for (chunk_count, present_count, found) in [(5, 6, 5), (7, 6, 7), (6, 5, 5), (6, 7, 7)] {
        let mut slices = as_slices(&mut chunks[..chunk_count]);
        let result = codec.reconstruct(&mut slices, &present[..present_count]);
        assert!(matches!(result, Err(Error::ChunkCount { expected: 6, found: f }) if f == found));
        let result = codec.reconstruct_data(&mut slices, &present[..present_count]);
        assert!(matches!(result, Err(Error::ChunkCount { expected: 6, found: f }) if f == found));
    }
}

#[test]
fn encode_with_unequal_lengths_returns_chunk_length_mismatch() {
    let codec = Codec::new(4, 2).expect("valid config");
    let data = [vec![0u8; 8], vec![0u8; 8], vec![0u8; 9], vec![0u8; 8]];
    let data_slices: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let mut parity = vec![vec![0u8; 8]; 2];
    let result = codec.encode(&data_slices, &mut as_slices(&mut parity));
    let mismatch = Err::<(), _>(Error::ChunkLengthMismatch { expected: 8, found: 9 });
    assert_eq!(format!("{result:?}"), format!("{mismatch:?}"));

    let data_slices = [&data[0][..]; 4];
    let mut parity = [vec![0u8; 8], vec![0u8; 7]];
    let result = codec.encode(&data_slices, &mut as_slices(&mut parity));
    assert!(matches!(result, Err(Error::ChunkLengthMismatch { expected: 8, found: 7 })));
}

#[test]
fn reconstruct_with_unequal_lengths_returns_chunk_length_mismatch() {
    let codec = Codec::new(4, 2).expect("valid config");
    let mut chunks = vec![vec![0u8; 8]; 6];
    chunks[5] = vec![0u8; 16];
    let present = [true, false, true, true, true, true];
    let result = codec.reconstruct(&mut as_slices(&mut chunks), &present);
    assert!(matches!(result, Err(Error::ChunkLengthMismatch { expected: 8, found: 16 })));
    let result = codec.reconstruct_data(&mut as_slices(&mut chunks), &present);
    assert!(matches!(result, Err(Error::ChunkLengthMismatch { expected: 8, found: 16 })));
}

#[test]
fn new_with_invalid_config_returns_invalid_config() {
    for (k, m) in [(0, 0), (0, 1), (1, 0), (31, 2), (2, 31), (16, 17), (usize::MAX, 1), (1, usize::MAX)] {
        let result = Codec::new(k, m);
        assert!(
            matches!(result, Err(Error::InvalidConfig { k: found_k, m: found_m }) if (found_k, found_m) == (k, m)),
            "{k}+{m}: {result:?}"
        );
    }
    for (k, m) in CONFIGS.into_iter().chain(CONFIGS_AT_N_MAX) {
        let codec = Codec::new(k, m).expect("valid config");
        assert_eq!((codec.k(), codec.m(), codec.n()), (k, m, k + m));
    }
}

#[test]
fn error_messages_name_the_numbers() {
    let cases = [
        (Error::InvalidConfig { k: 30, m: 4 }, "invalid erasure code 30+4: need k >= 1, m >= 1 and k + m <= 32"),
        (Error::ChunkCount { expected: 6, found: 5 }, "expected 6 chunks, found 5"),
        (Error::ChunkLengthMismatch { expected: 8, found: 9 }, "chunk lengths differ: expected 8 bytes, found 9"),
        (Error::TooFewChunks { present: 3, needed: 4 }, "3 chunks present, 4 needed to decode"),
    ];
    for (error, message) in cases {
        assert_eq!(error.to_string(), message);
    }
}

#[test]
fn reference_field_matches_isal_field() {
    for a in 0..=255u8 {
        for b in 0..=255u8 {
            assert_eq!(reference::mul(a, b), crate::isal::gf_mul(a, b), "{a} * {b}");
        }
    }
}

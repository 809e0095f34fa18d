//! Single-thread throughput of `ec::Codec` against the ISA-L 2.32 kernels called directly.
//!
//! Cells: encode, decode with 1 lost data chunk, decode with m lost data chunks, for 4+2, 8+3,
//! 10+4 and 16+4 at 64 KiB and 1 MiB chunks. Throughput counts data bytes (k * chunk bytes).
//! Criterion ids are `<k>+<m>/<chunk>/<codec>/<op>` with codec `tessera` or `isal-direct`
//! ("isa-l-2.32 direct": tables built once outside the timed loop, only `ec_encode_data` timed,
//! the floor for our wrapper). bench/ec-compare.sh reads them from target/criterion. Chunks
//! start on 64-byte boundaries, except in the `tessera-unaligned16/encode` cells (64 KiB only).

use std::hint::black_box;
use std::os::raw::c_int;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use ec::Codec;
use erasure_isa_l_sys as sys;

const CONFIGS: [(usize, usize); 4] = [(4, 2), (8, 3), (10, 4), (16, 4)];
const CHUNK_SIZES: [(usize, &str); 2] = [(64 << 10, "64KiB"), (1 << 20, "1MiB")];

fn bench_codec(c: &mut Criterion) {
    for (k, m) in CONFIGS {
        for (chunk_bytes, chunk_name) in CHUNK_SIZES {
            let mut group = c.benchmark_group(format!("{k}+{m}/{chunk_name}"));
            group.throughput(Throughput::Bytes((k * chunk_bytes) as u64));
            bench_tessera(&mut group, k, m, chunk_bytes);
            bench_isal_direct(&mut group, k, m, chunk_bytes);
            group.finish();
        }
    }
}

type Group<'a> = criterion::BenchmarkGroup<'a, criterion::measurement::WallTime>;

fn bench_tessera(group: &mut Group<'_>, k: usize, m: usize, chunk_bytes: usize) {
    let codec = Codec::new(k, m).expect("valid config");
    let mut stripe = Stripe::new(k, m, chunk_bytes, 0);
    let expected: Vec<Vec<u8>> = stripe.chunks().iter().map(|c| c.to_vec()).collect();
    let mut chunks = stripe.chunks();
    group.bench_function("tessera/encode", |b| {
        let (data, parity) = chunks.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
        b.iter(|| codec.encode(black_box(&data), parity).expect("encode"));
    });
    for (op, lost) in [("decode1", 1), ("decodem", m)] {
        let present: Vec<bool> = (0..k + m).map(|i| i >= lost).collect();
        group.bench_function(format!("tessera/{op}"), |b| {
            b.iter(|| codec.reconstruct(black_box(&mut chunks), &present).expect("reconstruct"));
        });
    }
    if chunk_bytes == CHUNK_SIZES[0].0 {
        let mut unaligned = Stripe::new(k, m, chunk_bytes, 16);
        let mut chunks = unaligned.chunks();
        group.bench_function("tessera-unaligned16/encode", |b| {
            let (data, parity) = chunks.split_at_mut(k);
            let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
            b.iter(|| codec.encode(black_box(&data), parity).expect("encode"));
        });
    }
    assert!(chunks.iter().zip(&expected).all(|(c, e)| **c == **e), "{k}+{m} wrong bytes");
}

fn bench_isal_direct(group: &mut Group<'_>, k: usize, m: usize, chunk_bytes: usize) {
    let n = k + m;
    let mut matrix = vec![0u8; n * k];
    // SAFETY: gf_gen_cauchy1_matrix(a, n, k) writes n * k bytes.
    unsafe { sys::gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), n as c_int, k as c_int) };
    let mut stripe = Stripe::new(k, m, chunk_bytes, 0);
    let mut pointers: Vec<*mut u8> = stripe.chunks().iter_mut().map(|c| c.as_mut_ptr()).collect();
    let encode_tables = init_tables(k, &matrix[k * k..]);
    group.bench_function("isal-direct/encode", |b| {
        let (sources, targets) = pointers.split_at_mut(k);
        b.iter(|| encode_data(chunk_bytes, k, &encode_tables, sources, targets));
    });
    for (op, lost) in [("decode1", 1), ("decodem", m)] {
        // Data chunks 0..lost are lost; chunks lost..lost + k are the sources.
        let mut submatrix = matrix[lost * k..(lost + k) * k].to_vec();
        let mut inverse = vec![0u8; k * k];
        // SAFETY: both buffers hold k * k bytes.
        let status = unsafe { sys::gf_invert_matrix(submatrix.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
        assert_eq!(status, 0, "Cauchy submatrix is invertible");
        let decode_tables = init_tables(k, &inverse[..lost * k]);
        group.bench_function(format!("isal-direct/{op}"), |b| {
            let (targets, rest) = pointers.split_at_mut(lost);
            b.iter(|| encode_data(chunk_bytes, k, &decode_tables, &mut rest[..k], targets));
        });
    }
}

/// k random data chunks then m parity chunks, encoded, each starting `misalign` bytes past a
/// 64-byte boundary. Callers should pass 0: on this machine a 16-byte offset (what malloc
/// gives a `Vec<u8>`) costs 25-60% at 64 KiB, as the `tessera-unaligned16` cell shows.
struct Stripe {
    buffer: Vec<u8>,
    offset: usize,
    chunk_bytes: usize,
    n: usize,
}

impl Stripe {
    fn new(k: usize, m: usize, chunk_bytes: usize, misalign: usize) -> Stripe {
        let n = k + m;
        let mut buffer = vec![0u8; n * chunk_bytes + 64 + misalign];
        let offset = buffer.as_ptr().align_offset(64) + misalign;
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        for byte in &mut buffer[offset..offset + k * chunk_bytes] {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            *byte = state as u8;
        }
        let mut stripe = Stripe { buffer, offset, chunk_bytes, n };
        let codec = Codec::new(k, m).expect("valid config");
        let mut chunks = stripe.chunks();
        let (data, parity) = chunks.split_at_mut(k);
        let data: Vec<&[u8]> = data.iter().map(|c| &**c).collect();
        codec.encode(&data, parity).expect("encode");
        stripe
    }

    fn chunks(&mut self) -> Vec<&mut [u8]> {
        let used = &mut self.buffer[self.offset..self.offset + self.n * self.chunk_bytes];
        used.chunks_mut(self.chunk_bytes).collect()
    }
}

fn init_tables(k: usize, coefficients: &[u8]) -> Vec<u8> {
    let rows = coefficients.len() / k;
    let mut tables = vec![0u8; 32 * k * rows];
    // SAFETY: reads k * rows coefficients, writes 32 * k * rows bytes.
    unsafe {
        sys::ec_init_tables(k as c_int, rows as c_int, coefficients.as_ptr().cast_mut(), tables.as_mut_ptr());
    }
    tables
}

fn encode_data(chunk_bytes: usize, k: usize, tables: &[u8], sources: &mut [*mut u8], targets: &mut [*mut u8]) {
    assert!(sources.len() == k && tables.len() == 32 * k * targets.len());
    // SAFETY: every pointer addresses a distinct live chunk of chunk_bytes bytes, sources and
    // targets are disjoint, and the tables match k x targets.len().
    unsafe {
        sys::ec_encode_data(
            chunk_bytes as c_int,
            k as c_int,
            targets.len() as c_int,
            tables.as_ptr().cast_mut(),
            sources.as_mut_ptr(),
            targets.as_mut_ptr(),
        );
    }
}

fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(2)).sample_size(10)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_codec
}
criterion_main!(benches);

//! Safe wrappers over the ISA-L erasure-code functions: the only `unsafe` in the crate.
//!
//! ISA-L picks its kernel (GFNI, AVX-512, AVX2, SSE, base) at run time on the first call.

use std::os::raw::c_int;
use std::ptr;

use erasure_isa_l_sys as sys;

use crate::{ChunkSet, N_MAX};

/// Bytes of expanded table per matrix coefficient that `ec_init_tables` writes (always 32 since
/// ISA-L 2.32, whatever kernel runs).
pub(crate) const TABLE_BYTES_PER_COEFFICIENT: usize = 32;

/// `ec_encode_data` takes an `int` length, so longer chunks are coded in segments of this size.
const SEGMENT_BYTES_MAX: usize = 1 << 30;
const _: () = assert!(SEGMENT_BYTES_MAX <= c_int::MAX as usize);
const _: () = assert!(N_MAX <= c_int::MAX as usize);

/// The n x k encode matrix, row-major: identity in rows 0..k, then Cauchy rows i in k..n with
/// coefficient `1 / (i ^ j)` in column j.
pub(crate) fn cauchy_matrix(k: usize, n: usize) -> Vec<u8> {
    assert!(1 <= k && k < n && n <= N_MAX, "cauchy_matrix({k}, {n})");
    let mut matrix = vec![0u8; n * k];
    // SAFETY: gf_gen_cauchy1_matrix(a, n, k) writes exactly n * k bytes to `a`, which `matrix`
    // holds; n and k fit in c_int (N_MAX does).
    unsafe { sys::gf_gen_cauchy1_matrix(matrix.as_mut_ptr(), n as c_int, k as c_int) };
    matrix
}

/// Inverts a k x k row-major matrix over GF(2^8); `None` if it is singular.
pub(crate) fn invert_matrix(matrix: &[u8], k: usize) -> Option<Vec<u8>> {
    assert!((1..=N_MAX).contains(&k) && matrix.len() == k * k);
    let mut scratch = matrix.to_vec();
    let mut inverse = vec![0u8; k * k];
    // SAFETY: both buffers hold k * k bytes, all gf_invert_matrix reads or writes; it destroys
    // its input, which is our private copy.
    let status = unsafe { sys::gf_invert_matrix(scratch.as_mut_ptr(), inverse.as_mut_ptr(), k as c_int) };
    (status == 0).then_some(inverse)
}

/// Product of two GF(2^8) elements (polynomial 0x11d).
pub(crate) fn gf_mul(a: u8, b: u8) -> u8 {
    // SAFETY: gf_mul is a pure table lookup on its two byte arguments.
    unsafe { sys::gf_mul(a, b) }
}

/// Expands a rows x k coefficient matrix into the tables `encode` and `decode` take.
pub(crate) fn init_tables(k: usize, rows: usize, coefficients: &[u8]) -> Box<[u8]> {
    assert!(1 <= k && 1 <= rows && k + rows <= N_MAX && coefficients.len() == k * rows);
    let mut tables = vec![0u8; TABLE_BYTES_PER_COEFFICIENT * k * rows].into_boxed_slice();
    // SAFETY: ec_init_tables reads k * rows coefficients (it never writes through `a`, so the
    // const-to-mut cast is sound) and writes 32 * k * rows bytes, the size of `tables`.
    unsafe {
        sys::ec_init_tables(k as c_int, rows as c_int, coefficients.as_ptr().cast_mut(), tables.as_mut_ptr());
    }
    tables
}

/// Writes `parity[r] = sum_j coefficient(r, j) * data[j]` with tables from `init_tables`.
pub(crate) fn encode(tables: &[u8], data: &[&[u8]], parity: &mut [&mut [u8]]) {
    let len = data[0].len();
    assert!(data.len() + parity.len() <= N_MAX);
    assert!(data.iter().all(|c| c.len() == len) && parity.iter().all(|c| c.len() == len));
    let mut sources = [ptr::null_mut(); N_MAX];
    for (pointer, chunk) in sources.iter_mut().zip(data) {
        *pointer = chunk.as_ptr().cast_mut();
    }
    let mut targets = [ptr::null_mut(); N_MAX];
    for (pointer, chunk) in targets.iter_mut().zip(parity.iter_mut()) {
        *pointer = chunk.as_mut_ptr();
    }
    // SAFETY: `data` and `parity` are live borrows of `len` bytes each (asserted above); the
    // parity slices are `&mut`, so they alias neither each other nor the shared data slices.
    unsafe { encode_data(len, data.len(), parity.len(), tables, &mut sources, &mut targets) };
}

/// Writes `chunks[t]` for each target t from `chunks[s]` for each source s (both in ascending
/// index order, matching the rows and columns the tables were built with).
pub(crate) fn decode(tables: &[u8], chunks: &mut [&mut [u8]], sources: ChunkSet, targets: ChunkSet) {
    let len = chunks[0].len();
    assert!(chunks.len() <= N_MAX && chunks.iter().all(|c| c.len() == len));
    assert!(sources.is_disjoint(targets) && sources.union(targets).all_below(chunks.len()));
    let mut source_pointers = [ptr::null_mut(); N_MAX];
    for (pointer, i) in source_pointers.iter_mut().zip(sources.iter()) {
        *pointer = chunks[i].as_mut_ptr();
    }
    let mut target_pointers = [ptr::null_mut(); N_MAX];
    for (pointer, i) in target_pointers.iter_mut().zip(targets.iter()) {
        *pointer = chunks[i].as_mut_ptr();
    }
    // SAFETY: every pointer comes from a distinct `&mut [u8]` of `len` bytes borrowed from
    // `chunks` for this call, and sources and targets are disjoint (asserted above).
    unsafe {
        encode_data(len, sources.len(), targets.len(), tables, &mut source_pointers, &mut target_pointers);
    }
}

/// Runs `ec_encode_data` over `len` bytes, in segments that fit its `int` length.
///
/// # Safety
/// `sources[..k]` must be valid for reads and `targets[..rows]` valid for writes of `len`
/// bytes each, for the whole call, and no target may overlap another target or a source.
unsafe fn encode_data(
    len: usize,
    k: usize,
    rows: usize,
    tables: &[u8],
    sources: &mut [*mut u8; N_MAX],
    targets: &mut [*mut u8; N_MAX],
) {
    assert!(1 <= k && 1 <= rows && k + rows <= N_MAX);
    assert_eq!(tables.len(), TABLE_BYTES_PER_COEFFICIENT * k * rows);
    let mut done = 0;
    while done < len {
        let segment = (len - done).min(SEGMENT_BYTES_MAX);
        // SAFETY: the caller's contract covers bytes done..done + segment of every buffer;
        // ec_encode_data only reads `tables` and the sources, so the const-to-mut cast is sound.
        unsafe {
            sys::ec_encode_data(
                segment as c_int,
                k as c_int,
                rows as c_int,
                tables.as_ptr().cast_mut(),
                sources.as_mut_ptr(),
                targets.as_mut_ptr(),
            );
        }
        done += segment;
        if done < len {
            for pointer in sources[..k].iter_mut().chain(&mut targets[..rows]) {
                // SAFETY: done < len, so the advanced pointer stays inside its buffer.
                *pointer = unsafe { pointer.add(segment) };
            }
        }
    }
}

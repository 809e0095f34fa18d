//! Naive GF(2^8) Reed-Solomon encoder, the oracle the ISA-L codec is checked against.
//!
//! It rebuilds ISA-L's `gf_gen_cauchy1_matrix` from first principles: parity row i (k <= i < n)
//! has `1 / (i ^ j)` in column j, over GF(2^8) with polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d).

const POLYNOMIAL: u16 = 0x11d;

/// Carry-less multiply, reduced modulo `POLYNOMIAL`.
pub(crate) fn mul(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut product) = (u16::from(a), b, 0u16);
    while b != 0 {
        if b & 1 == 1 {
            product ^= a;
        }
        a <<= 1;
        if a & 0x100 != 0 {
            a ^= POLYNOMIAL;
        }
        b >>= 1;
    }
    u8::try_from(product).expect("reduced below 0x100")
}

/// The b with `a * b == 1`.
pub(crate) fn inv(a: u8) -> u8 {
    (1..=255).find(|&b| mul(a, b) == 1).expect("nonzero elements have an inverse")
}

/// Parity chunks for `data` (k chunks of equal length) under a k + m Cauchy code.
pub(crate) fn encode(data: &[Vec<u8>], m: usize) -> Vec<Vec<u8>> {
    let k = data.len();
    let len = data[0].len();
    (k..k + m)
        .map(|row| {
            let coefficients: Vec<u8> = (0..k).map(|column| inv((row ^ column) as u8)).collect();
            (0..len)
                .map(|byte| {
                    let terms = coefficients.iter().zip(data);
                    terms.fold(0, |sum, (&c, chunk)| sum ^ mul(c, chunk[byte]))
                })
                .collect()
        })
        .collect()
}

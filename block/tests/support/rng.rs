//! Deterministic pseudo-random numbers and bytes for tests: the same seed
//! always gives the same sequence, so a failure names a seed to replay.

/// xorshift64*: deterministic, dependency-free.
pub struct Rng(u64);

impl Rng {
    /// Starts from `seed` itself (0 becomes 1).
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }

    /// Starts from `seed` spread over all bits first, so that nearby seeds
    /// (0, 1, 2, ...) give unrelated sequences.
    pub fn scrambled(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// Deterministic pseudo-random bytes (xorshift64 over a mixed seed).
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Compares two buffers, reporting the first difference (not the bytes).
pub fn assert_same(got: &[u8], want: &[u8], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths differ");
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!(
            "{what}: first difference at byte {i}: got {:#x}, want {:#x}",
            got[i], want[i]
        );
    }
}

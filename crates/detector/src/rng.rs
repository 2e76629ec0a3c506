//! Counter-based randomness: every random number is a pure function of (key, counter), so a
//! frame's bytes depend only on the seed, the module and the frame number, never on the order
//! in which frames or pixels are generated.

/// The SplitMix64 finaliser: a bijective 64-bit mix with full avalanche.
#[inline(always)]
pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Derives a key from several words (seed, module, frame, purpose...).
pub fn key(parts: &[u64]) -> u64 {
    parts.iter().fold(0x9e37_79b9_7f4a_7c15, |acc, &p| mix64(acc ^ mix64(p)))
}

/// The `i`-th random word of stream `key`.
#[inline(always)]
pub fn at(key: u64, i: u64) -> u64 {
    mix64(key.wrapping_add(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// Uniform in [0, 1) from the top 53 bits of a word.
#[inline(always)]
pub fn unit(w: u64) -> f64 {
    (w >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Approximately standard normal from one word: sum of four 16-bit uniforms (Irwin-Hall),
/// rescaled to unit variance. Good to a few percent in the tails, which is all synthetic
/// noise needs, and branch-free.
#[inline(always)]
pub fn normal(w: u64) -> f32 {
    let s = (w & 0xffff) + ((w >> 16) & 0xffff) + ((w >> 32) & 0xffff) + (w >> 48);
    // mean 4 * 32767.5, variance 4 * (65536^2 - 1) / 12
    (s as f32 - 131_070.0) / 37_837.23
}

/// A small sequential generator for the few places that need many numbers from one key.
pub struct Stream {
    key: u64,
    i: u64,
}

impl Stream {
    pub fn new(key: u64) -> Self {
        Stream { key, i: 0 }
    }
    pub fn next_u64(&mut self) -> u64 {
        self.i += 1;
        at(self.key, self.i)
    }
    pub fn unit(&mut self) -> f64 {
        unit(self.next_u64())
    }
    pub fn normal(&mut self) -> f32 {
        normal(self.next_u64())
    }
    /// Poisson sample by inversion for small means, normal approximation above 30.
    pub fn poisson(&mut self, lambda: f64) -> u32 {
        poisson(lambda, self.next_u64())
    }
}

/// Poisson(lambda) from one random word: exact inversion for lambda <= 30, otherwise the
/// normal approximation (error far below the shot noise it models).
pub fn poisson(lambda: f64, w: u64) -> u32 {
    if lambda <= 0.0 {
        return 0;
    }
    if lambda > 30.0 {
        let z = normal(w) as f64;
        return (lambda + lambda.sqrt() * z).round().max(0.0) as u32;
    }
    let u = unit(w);
    let mut p = (-lambda).exp();
    let mut cdf = p;
    let mut k = 0u32;
    while u >= cdf && k < 200 {
        k += 1;
        p *= lambda / k as f64;
        cdf += p;
    }
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normal_has_unit_moments() {
        let n = 200_000;
        let (mut s, mut s2) = (0f64, 0f64);
        for i in 0..n {
            let x = normal(at(7, i)) as f64;
            s += x;
            s2 += x * x;
        }
        let mean = s / n as f64;
        let var = s2 / n as f64 - mean * mean;
        assert!(mean.abs() < 0.01, "mean {mean}");
        assert!((var - 1.0).abs() < 0.02, "var {var}");
    }

    #[test]
    fn poisson_mean_matches() {
        for &lambda in &[0.05, 1.0, 7.5, 100.0] {
            let n = 100_000;
            let s: u64 = (0..n).map(|i| poisson(lambda, at(11, i)) as u64).sum();
            let mean = s as f64 / n as f64;
            assert!((mean - lambda).abs() < 0.03 * lambda.max(1.0), "lambda {lambda} mean {mean}");
        }
    }
}

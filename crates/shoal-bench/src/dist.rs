//! Key distributions for workloads: uniform, Zipfian (`--zipf THETA`: item `i` of `n` drawn
//! with probability proportional to `1 / i^THETA`, Gray et al. 1994) and self-similar
//! (`--self-similar H`: `1 + floor(n * X^(log H / log(1 - H)))` with `X` uniform in `[0, 1)`,
//! the distribution of the early-lock-release paper; `H = 0.2` sends 80% of the draws to the
//! first 20% of the items, `H = 0.5` is uniform). Items are numbered from 0 here; skewed
//! draws favour the low numbers.

use std::fmt;

use rand::Rng;
use rand_distr::{Distribution, Zipf};

/// A distribution over item numbers, before it is bound to a number of items.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KeyDist {
    /// Every item equally likely.
    Uniform,
    /// Zipfian with exponent theta (0 = uniform).
    Zipf(f64),
    /// Self-similar with parameter h in (0, 0.5].
    SelfSimilar(f64),
}

impl KeyDist {
    /// Binds the distribution to items `0..n` (`n >= 1`).
    pub fn over(self, n: u64) -> Sampler {
        let n = n.max(1);
        match self {
            KeyDist::Uniform => Sampler::Uniform(n),
            KeyDist::Zipf(0.0) => Sampler::Uniform(n),
            KeyDist::Zipf(theta) => match Zipf::new(n, theta) {
                Ok(z) => Sampler::Zipf(z, n),
                Err(_) => Sampler::Uniform(n),
            },
            KeyDist::SelfSimilar(h) => {
                Sampler::SelfSimilar((h.ln() / (1.0 - h).ln()).max(f64::MIN_POSITIVE), n)
            }
        }
    }
}

impl fmt::Display for KeyDist {
    /// The form sweep points, tables and records show: `uniform`, `zipf:THETA`,
    /// `self-similar:H`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KeyDist::Uniform => f.write_str("uniform"),
            KeyDist::Zipf(t) => write!(f, "zipf:{t}"),
            KeyDist::SelfSimilar(h) => write!(f, "self-similar:{h}"),
        }
    }
}

/// A distribution bound to `n` items.
#[derive(Clone, Debug)]
pub enum Sampler {
    /// Uniform over `0..n`.
    Uniform(u64),
    /// Zipfian: rejection-inversion sampler over `1..=n`, shifted to `0..n`.
    Zipf(Zipf<f64>, u64),
    /// Self-similar: the exponent `log h / log(1 - h)` and `n`.
    SelfSimilar(f64, u64),
}

impl Sampler {
    /// Draws an item number in `0..n`.
    pub fn sample(&self, rng: &mut impl Rng) -> u64 {
        match self {
            Sampler::Uniform(n) => rng.gen_range(0..*n),
            Sampler::Zipf(z, n) => {
                let v = z.sample(rng) as u64;
                v.clamp(1, *n) - 1
            }
            Sampler::SelfSimilar(e, n) => {
                let x: f64 = rng.gen();
                let v = (*n as f64 * x.powf(*e)) as u64;
                v.min(*n - 1)
            }
        }
    }
}

/// Parses `--zipf THETA`: a number from 0 (uniform) to 10.
pub fn parse_theta(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v.is_finite() && (0.0..=10.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{}: must be between 0 (uniform) and 10", s.trim()))
    }
}

/// Parses `--self-similar H`: a number in (0, 0.5].
pub fn parse_h(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("{e}"))?;
    if v > 0.0 && v <= 0.5 {
        Ok(v)
    } else {
        Err(format!("{v}: h must be in (0, 0.5]"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn share_of_first_fifth(d: KeyDist) -> f64 {
        let n = 1000;
        let s = d.over(n);
        let mut rng = SmallRng::seed_from_u64(7);
        let draws = 200_000;
        let mut low = 0;
        for _ in 0..draws {
            let v = s.sample(&mut rng);
            assert!(v < n);
            if v < n / 5 {
                low += 1;
            }
        }
        low as f64 / draws as f64
    }

    #[test]
    fn self_similar_h_sends_1_minus_h_to_the_first_h() {
        let f = share_of_first_fifth(KeyDist::SelfSimilar(0.2));
        assert!((f - 0.8).abs() < 0.02, "{f}");
        let u = share_of_first_fifth(KeyDist::SelfSimilar(0.5));
        assert!((u - 0.2).abs() < 0.02, "{u}");
    }

    #[test]
    fn uniform_and_zipf() {
        let u = share_of_first_fifth(KeyDist::Uniform);
        assert!((u - 0.2).abs() < 0.02, "{u}");
        // Zipf(1) over 1000 items: H(200)/H(1000) = 5.878/7.485 ≈ 0.785.
        let z = share_of_first_fifth(KeyDist::Zipf(1.0));
        assert!((z - 0.785).abs() < 0.02, "{z}");
    }

    #[test]
    fn display_names_the_parameters() {
        for (d, s) in [
            (KeyDist::Uniform, "uniform"),
            (KeyDist::Zipf(0.99), "zipf:0.99"),
            (KeyDist::Zipf(1.0), "zipf:1"),
            (KeyDist::SelfSimilar(0.35), "self-similar:0.35"),
        ] {
            assert_eq!(d.to_string(), s);
        }
        assert_eq!(
            parse_theta("-1"),
            Err("-1: must be between 0 (uniform) and 10".into())
        );
        assert!(parse_h("0").is_err() && parse_h("0.6").is_err());
        assert!(matches!(KeyDist::Zipf(0.0).over(9), Sampler::Uniform(9)));
    }
}

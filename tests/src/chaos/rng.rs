//! A small deterministic generator: the seed of a run gives its fault
//! schedule (which replica, which node, how long), so a seed replays a run.

pub fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// A generator of its own for `name`, from one seed: each scenario's
    /// schedule does not depend on which others ran.
    pub fn derive(seed: u64, name: &str) -> Rng {
        let mut x = seed;
        for b in name.bytes() {
            x = splitmix(x ^ b as u64);
        }
        Rng(x)
    }

    pub fn next(&mut self) -> u64 {
        self.0 = splitmix(self.0);
        self.0
    }

    /// Uniform in 0..n (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Uniform in lo..=hi.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_sequence() {
        let a: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::derive(7, "kill-replica");
                move |_| r.next()
            })
            .collect();
        let b: Vec<u64> = (0..5)
            .map({
                let mut r = Rng::derive(7, "kill-replica");
                move |_| r.next()
            })
            .collect();
        assert_eq!(a, b);
        assert_ne!(Rng::derive(8, "kill-replica").next(), a[0]);
        assert_ne!(Rng::derive(7, "kill-engine").next(), a[0]);
    }
}

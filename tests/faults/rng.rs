//! A tiny seeded PRNG (splitmix64): every choice the harness makes is drawn from one of these,
//! so the same seed replays the same schedule of choices (not the same timing).

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// An independent stream for one actor (a client, the nemesis): the choices of one actor do
    /// not depend on how many the others drew, which timing decides.
    pub fn stream(seed: u64, actor: u64) -> Rng {
        let mut mix = Rng(seed ^ actor.wrapping_mul(0xA076_1D64_78BD_642F));
        Rng(mix.next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// An index drawn by weight.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let mut pick = self.next_u64() % weights.iter().sum::<u64>();
        for (i, &w) in weights.iter().enumerate() {
            if pick < w {
                return i;
            }
            pick -= w;
        }
        weights.len() - 1
    }
}

//! peakfinder8's radial sums (of each radial bin: the value, its square and the count of its
//! searched pixels strictly between the bin's thresholds), with each bin's sums formed in
//! the reference's order: its pixels in image order, one f32 addition after the other.
//!
//! Done pixel by pixel in image order, as the reference does, every addition waits for the
//! previous one to the same bin (neighbouring pixels share a bin), through memory. Here the
//! bins are laid out side by side instead: the searched pixels' values are copied once per
//! image into lanes, [`LANES`] bins to a group (bins of similar pixel counts together,
//! padded with NaN, which no threshold test passes), a bin's k-th pixel in step k of its
//! lane. A group's lanes are then summed as vectors, each lane a chain of additions in its
//! bin's order, so the results are the reference's bit for bit while eight bins advance per
//! instruction. An excluded pixel adds +0.0, which leaves a sum that started at +0.0
//! unchanged.

/// Bins summed side by side.
pub(super) const LANES: usize = 8;

/// The slot of a pixel that is not searched.
const NOT_SEARCHED: u32 = u32::MAX;

/// The lane layout of one detector's bins (fixed by its radius map and mask). Bins sorted
/// by pixel count fill each group, so a radius map of rings pads little; the layout holds at
/// most [`LANES`] values per searched pixel (every pixel in one bin: seven lanes of padding).
pub(super) struct RadialLanes {
    /// Per group of [`LANES`] bins: its first slot and its steps (its longest bin's pixels).
    groups: Vec<(usize, usize)>,
    /// The bin of each lane of each group (`None`: padding).
    lane_bins: Vec<Option<u32>>,
    /// Where each pixel's value goes: its slot, or [`NOT_SEARCHED`].
    slots: Vec<u32>,
    /// The values in lanes: slot `first + step * LANES + lane`; padding stays NaN.
    vals: Vec<f32>,
}

impl RadialLanes {
    /// The layout of the searched pixels (`searched`) of `bins` bins (`bin` of each pixel).
    pub(super) fn new(bin: &[u32], searched: &[bool], bins: usize) -> RadialLanes {
        let mut count = vec![0usize; bins];
        for (&b, _) in bin.iter().zip(searched).filter(|(_, &s)| s) {
            count[b as usize] += 1;
        }
        let mut order: Vec<u32> = (0..bins as u32).filter(|&b| count[b as usize] > 0).collect();
        order.sort_by_key(|&b| std::cmp::Reverse(count[b as usize]));
        let (mut groups, mut lane_bins) = (Vec::new(), Vec::new());
        // each bin's first slot (its lane in step 0)
        let mut first_slot = vec![0usize; bins];
        let mut first = 0usize;
        for group in order.chunks(LANES) {
            let steps = count[group[0] as usize];
            for (lane, &b) in group.iter().enumerate() {
                first_slot[b as usize] = first + lane;
            }
            lane_bins.extend(group.iter().map(|&b| Some(b)));
            lane_bins.resize(lane_bins.len() + LANES - group.len(), None);
            groups.push((first, steps));
            first += steps * LANES;
        }
        assert!(first < NOT_SEARCHED as usize, "slots are numbered in 32 bits");
        let mut taken = vec![0usize; bins];
        let slots = bin.iter().zip(searched).map(|(&b, &s)| {
            if !s {
                return NOT_SEARCHED;
            }
            let b = b as usize;
            taken[b] += 1;
            (first_slot[b] + (taken[b] - 1) * LANES) as u32
        });
        RadialLanes { groups, lane_bins, slots: slots.collect(), vals: vec![f32::NAN; first] }
    }

    /// Copies the searched pixels of `data` (of the layout's size) into their lanes (once
    /// per image).
    pub(super) fn load(&mut self, data: &[f32]) {
        assert_eq!(data.len(), self.slots.len(), "an image of the layout's size");
        for (&v, &slot) in data.iter().zip(&self.slots) {
            if slot != NOT_SEARCHED {
                self.vals[slot as usize] = v;
            }
        }
    }

    /// The sums of each bin's loaded pixels with `lo[b] < v < hi[b]`, into `sum`, `sum2`
    /// and `count` (bins without searched pixels are not written).
    pub(super) fn sums(&self, lo: &[f32], hi: &[f32], sum: &mut [f32], sum2: &mut [f32], count: &mut [i32]) {
        if std::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 is present (checked on the line above).
            unsafe { self.sums_avx2(lo, hi, sum, sum2, count) }
        } else {
            self.sums_lanes(lo, hi, sum, sum2, count)
        }
    }

    /// [`RadialLanes::sums`] compiled for AVX2 (the lanes of a group are one vector).
    #[target_feature(enable = "avx2")]
    unsafe fn sums_avx2(&self, lo: &[f32], hi: &[f32], sum: &mut [f32], sum2: &mut [f32], count: &mut [i32]) {
        self.sums_lanes(lo, hi, sum, sum2, count)
    }

    #[inline(always)]
    fn sums_lanes(&self, lo: &[f32], hi: &[f32], sum: &mut [f32], sum2: &mut [f32], count: &mut [i32]) {
        for (&(first, steps), bins) in self.groups.iter().zip(self.lane_bins.chunks_exact(LANES)) {
            let (mut l, mut h) = ([0f32; LANES], [0f32; LANES]);
            for (lane, b) in bins.iter().enumerate() {
                if let Some(b) = b {
                    (l[lane], h[lane]) = (lo[*b as usize], hi[*b as usize]);
                }
            }
            let (mut s, mut s2, mut n) = ([0f32; LANES], [0f32; LANES], [0i32; LANES]);
            for step in self.vals[first..first + steps * LANES].chunks_exact(LANES) {
                for lane in 0..LANES {
                    let v = step[lane];
                    let inside = v < h[lane] && v > l[lane];
                    s[lane] += if inside { v } else { 0.0 };
                    s2[lane] += if inside { v * v } else { 0.0 };
                    n[lane] += inside as i32;
                }
            }
            for (lane, b) in bins.iter().enumerate() {
                if let Some(b) = b {
                    let b = *b as usize;
                    (sum[b], sum2[b], count[b]) = (s[lane], s2[lane], n[lane]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference's loop: every searched pixel in image order, into its bin.
    fn sums_in_image_order(data: &[f32], bin: &[u32], searched: &[bool], lo: &[f32], hi: &[f32]) -> (Vec<f32>, Vec<f32>, Vec<i32>) {
        let bins = lo.len();
        let (mut s, mut s2, mut n) = (vec![0f32; bins], vec![0f32; bins], vec![0i32; bins]);
        for i in 0..data.len() {
            let (b, v) = (bin[i] as usize, data[i]);
            if searched[i] && v < hi[b] && v > lo[b] {
                s[b] += v;
                s2[b] += v * v;
                n[b] += 1;
            }
        }
        (s, s2, n)
    }

    proptest! {
        #[test]
        fn lanes_sum_each_bin_bit_for_bit_as_image_order_does(
            // small integers meet the bounds exactly; wide values make every order of the
            // additions round differently
            pixels in proptest::collection::vec((0u32..40, any::<bool>(), prop_oneof![
                -1e6f32..1e6, (-4i32..4).prop_map(|v| v as f32), Just(f32::NAN), Just(-0.0f32), Just(f32::INFINITY)]), 1..3000),
            bounds in proptest::collection::vec((prop_oneof![-1e3f32..1e3, (-4i32..4).prop_map(|v| v as f32)], prop_oneof![0f32..1e6, (0i32..4).prop_map(|v| v as f32)]), 40),
        ) {
            let bin: Vec<u32> = pixels.iter().map(|p| p.0).collect();
            let searched: Vec<bool> = pixels.iter().map(|p| p.1).collect();
            let data: Vec<f32> = pixels.iter().map(|p| p.2).collect();
            let lo: Vec<f32> = bounds.iter().map(|b| b.0).collect();
            let hi: Vec<f32> = bounds.iter().map(|b| b.0 + b.1).collect();
            let mut lanes = RadialLanes::new(&bin, &searched, 40);
            lanes.load(&data);
            let (mut s, mut s2, mut n) = (vec![0f32; 40], vec![0f32; 40], vec![0i32; 40]);
            lanes.sums(&lo, &hi, &mut s, &mut s2, &mut n);
            let (rs, rs2, rn) = sums_in_image_order(&data, &bin, &searched, &lo, &hi);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&s), bits(&rs));
            prop_assert_eq!(bits(&s2), bits(&rs2));
            prop_assert_eq!(n, rn);
        }
    }
}

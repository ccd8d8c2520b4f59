//! Fixed-bucket histograms of durations, counted per shard and merged when
//! they are read.
//!
//! Recording is one bucket increment and one addition: no allocation and no
//! floating point, so a shard can record every grant and release. The
//! buckets grow by a factor of 4 from 1 ms to 4^14 ms (about 74.6 hours), which
//! covers every wait (at most a day) and lease a client may ask for with
//! 15 counters; a Prometheus exporter writes them as cumulative `le`
//! buckets.

/// Finite buckets; one more counts what is above the last bound.
pub const HISTOGRAM_BOUNDS: usize = 15;

/// The upper bound of each finite bucket, in milliseconds: 4^i ms.
pub const HISTOGRAM_BOUNDS_MS: [u64; HISTOGRAM_BOUNDS] = {
    let mut bounds = [0u64; HISTOGRAM_BOUNDS];
    let mut index = 0;
    while index < HISTOGRAM_BOUNDS {
        bounds[index] = 1 << (2 * index);
        index += 1;
    }
    bounds
};

/// Counts of durations per bucket (not cumulative), and their sum.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// `buckets[i]` counts durations in `(bound[i-1], bound[i]]`; the last
    /// one counts those above the last bound.
    pub buckets: [u64; HISTOGRAM_BOUNDS + 1],
    /// Sum of every recorded duration, in milliseconds.
    pub sum_ms: u64,
}

impl Histogram {
    /// Counts one duration of `ms` milliseconds.
    #[inline(always)]
    pub fn record(&mut self, ms: u64) {
        self.buckets[bucket_of(ms)] += 1;
        self.sum_ms = self.sum_ms.wrapping_add(ms);
    }

    /// Durations recorded.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// Adds another histogram's counts to these.
    pub fn add(&mut self, other: &Histogram) {
        for (sum, count) in self.buckets.iter_mut().zip(other.buckets) {
            *sum += count;
        }
        self.sum_ms = self.sum_ms.wrapping_add(other.sum_ms);
    }
}

/// The bucket of `ms`: the smallest `i` with `ms <= 4^i`, or the overflow bucket.
#[inline(always)]
fn bucket_of(ms: u64) -> usize {
    if ms <= 1 {
        return 0;
    }
    // ceil(log2(ms)), then halved rounding up: ceil(log4(ms)).
    let log2 = (u64::BITS - (ms - 1).leading_zeros()) as usize;
    log2.div_ceil(2).min(HISTOGRAM_BOUNDS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_duration_lands_in_the_first_bucket_whose_bound_holds_it() {
        for ms in (0..70_000u64).chain([1 << 29, 1 << 30, (1 << 30) + 1, u64::MAX]) {
            let bucket = bucket_of(ms);
            let fits = |index: usize| index < HISTOGRAM_BOUNDS && ms <= HISTOGRAM_BOUNDS_MS[index];
            if bucket < HISTOGRAM_BOUNDS {
                assert!(fits(bucket), "{ms} ms is above bucket {bucket}");
            }
            assert!(bucket == 0 || !fits(bucket - 1), "{ms} ms fits an earlier bucket than {bucket}");
        }
        assert_eq!(HISTOGRAM_BOUNDS_MS[HISTOGRAM_BOUNDS - 1], 1 << 28);
    }

    #[test]
    fn counts_and_sums_add_up() {
        let mut one = Histogram::default();
        one.record(0);
        one.record(3);
        let mut two = Histogram::default();
        two.record(5000);
        one.add(&two);
        assert_eq!(one.count(), 3);
        assert_eq!(one.sum_ms, 5003);
        assert_eq!(one.buckets[0], 1);
        assert_eq!(one.buckets[1], 1);
        assert_eq!(one.buckets[7], 1, "5 s is above 4.096 s and at most 16.384 s");
    }
}

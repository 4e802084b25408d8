//! A cost bucket per caller (a token bucket, as Shopify's leaky bucket is
//! usually drawn): it holds at most `maximumAvailable` points and refills at
//! `restoreRate` points per second. An operation takes its requested cost
//! before it runs, or is refused with how long until that much is back; it
//! gives back what it did not use when it ends.
//!
//! Memory is bounded by `max_buckets`. A bucket that has refilled to the
//! brim is the same as no bucket, so it is forgotten whenever the map is
//! looked over. When the map is full, first every full bucket goes; if that
//! frees less than a quarter, the half that was touched longest ago goes
//! too (their callers start again with a full bucket, which is what a
//! forgotten bucket means). Both are O(n) once per n/4 new callers at
//! least, so a flood of distinct addresses costs O(1) per request and never
//! more than `max_buckets` entries.
//!
//! The buckets are per process (see docs/operations.md, "Fair share"): a
//! shared store would put a round trip on every request's path.

use std::{
    collections::HashMap,
    sync::{Mutex, MutexGuard, PoisonError},
    time::{Duration, Instant},
};

use super::callers::CallerKey;

/// The size and refill rate of one kind of caller's bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Tier {
    /// Most points a bucket holds (`maximumAvailable`).
    pub size: f64,
    /// Points per second a bucket refills (`restoreRate`).
    pub rate: f64,
}

/// A bucket's state as a response reports it (`throttleStatus`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Status {
    /// `maximumAvailable`.
    pub maximum: f64,
    /// `currentlyAvailable`.
    pub available: f64,
    /// `restoreRate`.
    pub rate: f64,
}

/// One caller's bucket.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Points in it at `updated`.
    level: f64,
    /// When `level` was last brought up to date.
    updated: Instant,
}

impl Bucket {
    /// The level at `now`, refilled at `tier`'s rate up to its size.
    fn level_at(&self, tier: Tier, now: Instant) -> f64 {
        let refilled = now.saturating_duration_since(self.updated).as_secs_f64() * tier.rate;
        (self.level + refilled).min(tier.size)
    }
}

/// Every caller's bucket in this process.
pub struct Buckets {
    /// Buckets by caller. A std Mutex, not a tokio one: nothing awaits
    /// while it is held, and each hold is a few map operations.
    map: Mutex<HashMap<CallerKey, Bucket>>,
    /// Most buckets kept.
    max_buckets: usize,
}

impl Buckets {
    /// Buckets for at most `max_buckets` callers at once.
    pub fn new(max_buckets: usize) -> Self {
        Self { map: Mutex::default(), max_buckets: max_buckets.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<CallerKey, Bucket>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many buckets are kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// Takes `cost` points from `key`'s bucket, or says how long until it
    /// holds that many. A cost larger than the bucket can ever hold is
    /// refused with the time to fill it (it will still be refused then, as
    /// the complexity limit would refuse it anyway when set at or below the size).
    pub fn take(&self, key: &CallerKey, tier: Tier, cost: f64, now: Instant) -> Result<Status, Duration> {
        let mut map = self.lock();
        let level = match map.get(key) {
            Some(bucket) => bucket.level_at(tier, now),
            None => tier.size,
        };
        if level < cost {
            let missing = cost.min(tier.size) - level;
            let wait = if tier.rate > 0.0 { missing.max(0.0) / tier.rate } else { f64::from(u32::MAX) };
            // At least a millisecond, so a client never retries at once.
            return Err(Duration::from_secs_f64(wait).max(Duration::from_millis(1)));
        }
        let bucket = Bucket { level: level - cost, updated: now };
        if map.len() >= self.max_buckets && !map.contains_key(key) {
            self.make_room(&mut map, tier, now);
        }
        map.insert(key.clone(), bucket);
        Ok(Status { maximum: tier.size, available: bucket.level, rate: tier.rate })
    }

    /// Gives `points` back to `key`'s bucket (what an operation took and
    /// did not use), and reports the bucket after it.
    pub fn give_back(&self, key: &CallerKey, tier: Tier, points: f64, now: Instant) -> Status {
        let mut map = self.lock();
        let Some(bucket) = map.get_mut(key) else {
            // Forgotten meanwhile: it counts as full.
            return Status { maximum: tier.size, available: tier.size, rate: tier.rate };
        };
        let level = (bucket.level_at(tier, now) + points.max(0.0)).min(tier.size);
        *bucket = Bucket { level, updated: now };
        Status { maximum: tier.size, available: level, rate: tier.rate }
    }

    /// `key`'s bucket as it is now.
    pub fn status(&self, key: &CallerKey, tier: Tier, now: Instant) -> Status {
        let available = self.lock().get(key).map_or(tier.size, |bucket| bucket.level_at(tier, now));
        Status { maximum: tier.size, available, rate: tier.rate }
    }

    /// Frees room in a full map: the buckets that are full by now, and, if
    /// that is less than a quarter of them, the half touched longest ago.
    ///
    /// Every bucket is judged by the tier of the caller being admitted: the
    /// map does not keep tiers, and a bucket judged full too early only
    /// hands its caller a fresh bucket a little sooner.
    fn make_room(&self, map: &mut HashMap<CallerKey, Bucket>, tier: Tier, now: Instant) {
        map.retain(|_, bucket| bucket.level_at(tier, now) < tier.size);
        if map.len() > self.max_buckets - self.max_buckets / 4 {
            let mut touched: Vec<Instant> = map.values().map(|bucket| bucket.updated).collect();
            let middle = touched.len() / 2;
            let (_, cut, _) = touched.select_nth_unstable(middle);
            let cut = *cut;
            map.retain(|_, bucket| bucket.updated > cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;

    const TIER: Tier = Tier { size: 100.0, rate: 10.0 };

    fn user(name: &str) -> CallerKey {
        CallerKey::User(name.into())
    }

    #[test]
    fn a_bucket_refuses_past_its_level_says_when_to_retry_and_refills() {
        let buckets = Buckets::new(10);
        let start = Instant::now();
        let alice = user("alice");
        assert_eq!(buckets.take(&alice, TIER, 80.0, start).map(|s| s.available), Ok(20.0));
        // 30 points are 10 missing at 10 per second: a second.
        assert_eq!(buckets.take(&alice, TIER, 30.0, start), Err(Duration::from_secs(1)));
        let later = start + Duration::from_secs(1);
        assert_eq!(buckets.take(&alice, TIER, 30.0, later).map(|s| s.available), Ok(0.0));
        // Never above the size, however long it rests.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!(buckets.status(&alice, TIER, much_later).available, 100.0);
        // Another caller's bucket is untouched by alice's.
        assert_eq!(buckets.status(&user("bob"), TIER, later).available, 100.0);
    }

    #[test]
    fn what_an_operation_did_not_use_comes_back_up_to_the_size() {
        let buckets = Buckets::new(10);
        let now = Instant::now();
        let alice = user("alice");
        buckets.take(&alice, TIER, 90.0, now).expect("taken");
        assert_eq!(buckets.give_back(&alice, TIER, 87.0, now).available, 97.0);
        assert_eq!(buckets.give_back(&alice, TIER, 50.0, now).available, 100.0);
    }

    #[test]
    fn a_flood_of_distinct_addresses_never_keeps_more_than_the_cap() {
        let cap = 1000;
        let buckets = Buckets::new(cap);
        let start = Instant::now();
        let mut most = 0;
        for n in 0..50_000u32 {
            let address = CallerKey::Address(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)));
            // Each new caller spends a little, so no bucket is full again
            // soon: only the eviction of the oldest can make room.
            let now = start + Duration::from_micros(u64::from(n));
            buckets.take(&address, TIER, 5.0, now).expect("a new caller has a full bucket");
            most = most.max(buckets.len());
        }
        assert!(most <= cap, "{most} buckets kept, the cap is {cap}");
        assert!(most >= cap / 2, "room is made only when the map is full: at most {most}");
    }

    #[test]
    fn full_buckets_are_forgotten_first_when_room_is_needed() {
        let buckets = Buckets::new(4);
        let start = Instant::now();
        let keys: Vec<CallerKey> = (0..4).map(|n| user(&format!("u{n}"))).collect();
        for key in &keys {
            buckets.take(key, TIER, 1.0, start).expect("taken");
        }
        // A second later every bucket is full again: all are forgotten, the newcomer kept.
        let later = start + Duration::from_secs(1);
        buckets.take(&user("newcomer"), TIER, 50.0, later).expect("taken");
        assert_eq!(buckets.len(), 1);
    }
}

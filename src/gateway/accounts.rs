//! A caller's account: its cost bucket and its share of the operations in
//! flight, found once per operation (`Fair::meter`) and then used without
//! the map: each request used to look its caller up four times (the share
//! taken and given back, the cost taken and the rest given back).
//!
//! The bucket is a token bucket, as Shopify's leaky bucket is usually
//! drawn: it holds at most `maximumAvailable` points and refills at
//! `restoreRate` points per second. An operation takes its requested cost
//! before it runs, or is refused with how long until that much is back; it
//! gives back what it did not use when it ends.
//!
//! Memory is bounded by `max_buckets`. An account that no operation holds
//! and whose bucket has refilled to the brim is the same as no account, so
//! it is forgotten whenever the map is looked over. When the map is full,
//! first every such account goes; if that frees less than a quarter, the
//! idle half that was touched longest ago goes too (their callers start
//! again with a full bucket, which is what a forgotten bucket means). Both
//! are O(n) once per n/4 new callers at least, so a flood of distinct
//! addresses costs O(1) per request and never more than `max_buckets`
//! accounts beside those of operations in flight (which the in-flight
//! limit and the websocket caps bound).
//!
//! A caller that was refused for its budget is told when to come back, and
//! until then it is *known to be short*: its next requests are refused
//! before their bodies are read ([`Account::short_for`]), so a client that
//! ignores `retryAfterMs` costs a lookup per request, not a parse and a
//! validation.
//!
//! A caller's operations also take turns: `running` of them may always run
//! at once, the rest wait for a turn behind that caller's own (a FIFO
//! semaphore per account), never behind another caller's. A caller whose
//! bucket is not being drained may also borrow one of the process's spare
//! turns (the pool's connections beyond the live listener's one and
//! two callers' own turns), so a backend with a burst of cheap writes on one token is not
//! held to four at a time on an idle pool, while a caller that spends
//! faster than it refills (a flooder) never borrows.
//!
//! The accounts are per process (see docs/operations.md, "Fair share"): a
//! shared store would put a round trip on every request's path.

use std::{
    collections::HashMap,
    sync::{
        Arc, Mutex, MutexGuard, PoisonError,
        atomic::{AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::callers::CallerKey;

/// The size and refill rate of one kind of caller's bucket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tier {
    /// Most points a bucket holds (`maximumAvailable`).
    pub size: f64,
    /// Points per second a bucket refills (`restoreRate`).
    pub rate: f64,
}

/// A bucket's state as a response reports it (`throttleStatus`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Status {
    /// `maximumAvailable`.
    pub maximum: f64,
    /// `currentlyAvailable`.
    pub available: f64,
    /// `restoreRate`.
    pub rate: f64,
}

/// A bucket that has been drawn from.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    /// Points in it at `updated`.
    level: f64,
    /// When `level` was last brought up to date.
    updated: Instant,
    /// Until when the caller is known to be short: the time its last
    /// refusal told it to wait.
    short_until: Option<Instant>,
}

impl Bucket {
    /// The level at `now`, refilled at `tier`'s rate up to its size.
    fn level_at(&self, tier: Tier, now: Instant) -> f64 {
        let refilled = now.saturating_duration_since(self.updated).as_secs_f64() * tier.rate;
        (self.level + refilled).min(tier.size)
    }
}

/// One caller's bucket, operations in flight and turns to run.
pub(super) struct Account {
    /// The bucket, `None` while it has never been drawn from (full). Its
    /// own lock: two operations of one caller meet only here, and nothing
    /// else waits for it.
    bucket: Mutex<Option<Bucket>>,
    /// Operations of this caller in flight (running or waiting for a
    /// turn), each holding a [`Share`].
    in_flight: AtomicUsize,
    /// One permit per operation of this caller that may run at once;
    /// tokio's semaphore serves its waiters first come, first served.
    running: Arc<Semaphore>,
}

impl Account {
    /// An account whose caller may run `running` operations at once.
    fn new(running: usize) -> Self {
        Self { bucket: Mutex::default(), in_flight: AtomicUsize::new(0), running: Arc::new(Semaphore::new(running)) }
    }

    fn bucket(&self) -> MutexGuard<'_, Option<Bucket>> {
        self.bucket.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The level at `now` of a bucket that may never have been drawn from.
    fn level(bucket: Option<&Bucket>, tier: Tier, now: Instant) -> f64 {
        bucket.map_or(tier.size, |bucket| bucket.level_at(tier, now))
    }

    /// Takes `cost` points from the bucket, or says how long until it holds
    /// that many. A cost larger than the bucket can ever hold is refused
    /// with the time to fill it (it will still be refused then, as the
    /// complexity limit would refuse it anyway when set at or below the size).
    pub(super) fn take(&self, tier: Tier, cost: f64, now: Instant) -> Result<Status, Duration> {
        let mut bucket = self.bucket();
        let level = Self::level(bucket.as_ref(), tier, now);
        if level < cost {
            let missing = cost.min(tier.size) - level;
            let wait = if tier.rate > 0.0 { missing.max(0.0) / tier.rate } else { f64::from(u32::MAX) };
            // At least a millisecond, so a client never retries at once.
            let wait = Duration::from_secs_f64(wait).max(Duration::from_millis(1));
            *bucket = Some(Bucket { level, updated: now, short_until: now.checked_add(wait) });
            return Err(wait);
        }
        *bucket = Some(Bucket { level: level - cost, updated: now, short_until: None });
        Ok(Status { maximum: tier.size, available: level - cost, rate: tier.rate })
    }

    /// Gives `points` back (what an operation took and did not use), and
    /// reports the bucket after it.
    pub(super) fn give_back(&self, tier: Tier, points: f64, now: Instant) -> Status {
        let mut bucket = self.bucket();
        let level = (Self::level(bucket.as_ref(), tier, now) + points.max(0.0)).min(tier.size);
        if let Some(drawn) = bucket.as_mut() {
            (drawn.level, drawn.updated) = (level, now);
        }
        Status { maximum: tier.size, available: level, rate: tier.rate }
    }

    /// How long the caller is still known to be short at `now`: it was
    /// refused for its budget and told to wait past `now`.
    pub(super) fn short_for(&self, now: Instant) -> Option<Duration> {
        let until = self.bucket().as_ref()?.short_until?;
        (until > now).then(|| until - now)
    }

    /// Whether the bucket holds less than half its size at `now`: the
    /// caller spends faster than it refills.
    pub(super) fn spending(&self, tier: Tier, now: Instant) -> bool {
        Self::level(self.bucket().as_ref(), tier, now) < tier.size / 2.0
    }

    /// Waits for a turn to run among the caller's operations: one of its
    /// own, or one of `spare` if given and free first.
    pub(super) async fn turn(&self, spare: Option<&Arc<Semaphore>>) -> Turn {
        // The semaphores are never closed, so acquiring only ends with a
        // permit. An own turn free now is taken before a spare one.
        let own = self.running.clone();
        if let Ok(permit) = own.clone().try_acquire_owned() {
            return Turn(Some(permit));
        }
        let Some(spare) = spare else { return Turn(own.acquire_owned().await.ok()) };
        tokio::select! {
            biased;
            permit = own.acquire_owned() => Turn(permit.ok()),
            permit = spare.clone().acquire_owned() => Turn(permit.ok()),
        }
    }

    /// The bucket as it is now.
    pub(super) fn status(&self, tier: Tier, now: Instant) -> Status {
        let available = Self::level(self.bucket().as_ref(), tier, now);
        Status { maximum: tier.size, available, rate: tier.rate }
    }
}

/// One of a caller's turns to run (or a spare one it borrowed), given
/// back (to the next waiting operation) when dropped.
pub(super) struct Turn(#[expect(dead_code, reason = "held for its drop")] Option<OwnedSemaphorePermit>);

/// One place in a caller's share of the operations in flight, given back
/// when dropped.
pub(super) struct Share {
    account: Arc<Account>,
    /// Whether the caller had as many operations in flight as it may run
    /// at once when this one took its place: it asks for more than its
    /// share, and this one will wait for a turn or follow one that did.
    crowded: bool,
}

impl Share {
    /// A place among `account`'s at most `per_caller` operations in
    /// flight, or none when it holds them all; crowded when it already
    /// held `running` or more.
    pub(super) fn take(account: &Arc<Account>, per_caller: usize, running: usize) -> Option<Self> {
        let more = |held: usize| (held < per_caller).then_some(held + 1);
        let held = account.in_flight.fetch_update(Ordering::AcqRel, Ordering::Acquire, more).ok()?;
        Some(Self { account: account.clone(), crowded: held >= running })
    }

    /// Whether the caller's share is full now: its next operation would be refused.
    pub(super) fn is_full(account: &Account, per_caller: usize) -> bool {
        account.in_flight.load(Ordering::Acquire) >= per_caller
    }

    /// Whether the caller held as many operations in flight as it may run
    /// when this one was admitted.
    pub(super) fn crowded(&self) -> bool {
        self.crowded
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.account.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Every caller's account in this process.
pub(super) struct Accounts {
    /// Accounts by caller. A std Mutex, not a tokio one: nothing awaits
    /// while it is held, and each hold is one lookup.
    map: Mutex<HashMap<CallerKey, Arc<Account>>>,
    /// Most idle accounts kept.
    max_buckets: usize,
    /// Most operations of one caller running at once.
    running: usize,
}

impl Accounts {
    /// Accounts for at most `max_buckets` idle callers at once, each
    /// caller running at most `running` operations at once.
    pub(super) fn new(max_buckets: usize, running: usize) -> Self {
        Self { map: Mutex::default(), max_buckets: max_buckets.max(1), running: running.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<CallerKey, Arc<Account>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many accounts are kept now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }

    /// `key`'s account, opened with a full bucket if it has none.
    pub(super) fn account(&self, key: &CallerKey, tier: Tier, now: Instant) -> Arc<Account> {
        let mut map = self.lock();
        if let Some(account) = map.get(key) {
            return account.clone();
        }
        if map.len() >= self.max_buckets {
            self.make_room(&mut map, tier, now);
        }
        let account = Arc::new(Account::new(self.running));
        map.insert(key.clone(), account.clone());
        account
    }

    /// Frees room in a full map: the idle accounts whose buckets are full
    /// by now, and, if that is less than a quarter of them, the idle half
    /// touched longest ago. An account an operation holds (its meter or
    /// share) is never forgotten, so a caller's operations share one count.
    ///
    /// Every bucket is judged by the tier of the caller being admitted: the
    /// map does not keep tiers, and a bucket judged full too early only
    /// hands its caller a fresh bucket a little sooner.
    fn make_room(&self, map: &mut HashMap<CallerKey, Arc<Account>>, tier: Tier, now: Instant) {
        // Only the map clones an idle account (under this lock), so an
        // account seen idle here stays idle while the lock is held.
        let idle = |account: &Arc<Account>| Arc::strong_count(account) == 1;
        let touched =
            |account: &Arc<Account>| account.bucket().map(|bucket| (bucket.updated, bucket.level_at(tier, now)));
        map.retain(|_, account| !idle(account) || touched(account).is_some_and(|(_, level)| level < tier.size));
        if map.len() > self.max_buckets - self.max_buckets / 4 {
            let mut times: Vec<Instant> =
                map.values().filter(|account| idle(account)).filter_map(&touched).map(|(at, _)| at).collect();
            if times.is_empty() {
                return;
            }
            let middle = times.len() / 2;
            let (_, cut, _) = times.select_nth_unstable(middle);
            let cut = *cut;
            map.retain(|_, account| !idle(account) || touched(account).is_some_and(|(at, _)| at > cut));
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
        let accounts = Accounts::new(10, 4);
        let start = Instant::now();
        let alice = accounts.account(&user("alice"), TIER, start);
        assert_eq!(alice.take(TIER, 80.0, start).map(|s| s.available), Ok(20.0));
        // 30 points are 10 missing at 10 per second: a second.
        assert_eq!(alice.take(TIER, 30.0, start), Err(Duration::from_secs(1)));
        let later = start + Duration::from_secs(1);
        assert_eq!(alice.take(TIER, 30.0, later).map(|s| s.available), Ok(0.0));
        // Never above the size, however long it rests.
        let much_later = later + Duration::from_secs(3600);
        assert_eq!(alice.status(TIER, much_later).available, 100.0);
        // Another caller's bucket is untouched by alice's; alice's is found again.
        assert_eq!(accounts.account(&user("bob"), TIER, later).status(TIER, later).available, 100.0);
        assert_eq!(accounts.account(&user("alice"), TIER, later).status(TIER, later).available, 0.0);
    }

    #[test]
    fn what_an_operation_did_not_use_comes_back_up_to_the_size() {
        let now = Instant::now();
        let alice = Accounts::new(10, 4).account(&user("alice"), TIER, now);
        alice.take(TIER, 90.0, now).expect("taken");
        assert_eq!(alice.give_back(TIER, 87.0, now).available, 97.0);
        assert_eq!(alice.give_back(TIER, 50.0, now).available, 100.0);
    }

    #[test]
    fn a_flood_of_distinct_addresses_never_keeps_more_than_the_cap() {
        let cap = 1000;
        let accounts = Accounts::new(cap, 4);
        let start = Instant::now();
        let mut most = 0;
        for n in 0..50_000u32 {
            let address = CallerKey::Address(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + n)));
            // Each new caller spends a little, so no bucket is full again
            // soon: only the eviction of the oldest can make room.
            let now = start + Duration::from_micros(u64::from(n));
            let account = accounts.account(&address, TIER, now);
            account.take(TIER, 5.0, now).expect("a new caller has a full bucket");
            most = most.max(accounts.len());
        }
        assert!(most <= cap, "{most} accounts kept, the cap is {cap}");
        assert!(most >= cap / 2, "room is made only when the map is full: at most {most}");
    }

    #[test]
    fn full_buckets_are_forgotten_first_when_room_is_needed() {
        let accounts = Accounts::new(4, 4);
        let start = Instant::now();
        for n in 0..4 {
            accounts.account(&user(&format!("u{n}")), TIER, start).take(TIER, 1.0, start).expect("taken");
        }
        // A second later every bucket is full again: all are forgotten, the newcomer kept.
        let later = start + Duration::from_secs(1);
        accounts.account(&user("newcomer"), TIER, later).take(TIER, 50.0, later).expect("taken");
        assert_eq!(accounts.len(), 1);
    }

    /// An account an operation holds is kept however full the map is, so
    /// the caller's next operation counts against the same share.
    #[test]
    fn an_account_in_use_is_never_forgotten() {
        let accounts = Accounts::new(2, 4);
        let start = Instant::now();
        let held = accounts.account(&user("busy"), TIER, start);
        let _share = Share::take(&held, 5, 4).expect("a place");
        let later = start + Duration::from_secs(60);
        for n in 0..10 {
            accounts.account(&user(&format!("u{n}")), TIER, later).take(TIER, 1.0, later).expect("taken");
        }
        assert!(Arc::ptr_eq(&held, &accounts.account(&user("busy"), TIER, later)), "the same account");
        assert!(accounts.len() <= 3, "the cap and the one in use: {}", accounts.len());
    }

    #[test]
    fn a_refused_caller_is_known_to_be_short_until_the_wait_it_was_told() {
        let now = Instant::now();
        let alice = Accounts::new(10, 4).account(&user("alice"), TIER, now);
        assert_eq!(alice.short_for(now), None, "a fresh caller is not short");
        alice.take(TIER, 100.0, now).expect("the whole bucket");
        assert_eq!(alice.take(TIER, 20.0, now), Err(Duration::from_secs(2)));
        assert_eq!(alice.short_for(now + Duration::from_millis(500)), Some(Duration::from_millis(1500)));
        assert_eq!(alice.short_for(now + Duration::from_secs(2)), None, "the wait is over");
        alice.take(TIER, 20.0, now + Duration::from_secs(2)).expect("served as told");
        assert_eq!(alice.short_for(now + Duration::from_secs(2)), None);
    }

    /// A caller's operations past its running share wait for a turn in the
    /// order they came, and another caller's first operation runs at once
    /// however many of the first caller's wait.
    #[tokio::test]
    async fn turns_are_first_come_first_served_per_caller_and_never_behind_another_caller() {
        let accounts = Accounts::new(10, 2);
        let now = Instant::now();
        let (alice, bob) = (accounts.account(&user("alice"), TIER, now), accounts.account(&user("bob"), TIER, now));
        let running = [alice.turn(None).await, alice.turn(None).await];
        let (order, mut ended) = tokio::sync::mpsc::unbounded_channel();
        let waiting: Vec<_> = (0..5)
            .map(|n| {
                let (alice, order) = (alice.clone(), order.clone());
                tokio::spawn(async move {
                    let turn = alice.turn(None).await;
                    order.send(n).expect("sent");
                    turn
                })
            })
            .collect();
        // Each waiter is queued before the next is spawned.
        for _ in 0..5 {
            tokio::task::yield_now().await;
        }
        let bobs = tokio::time::timeout(Duration::from_millis(100), bob.turn(None)).await;
        assert!(bobs.is_ok(), "bob runs at once while five of alice's wait");
        assert!(ended.try_recv().is_err(), "none of alice's ran past her two");
        drop(running);
        let mut served = Vec::new();
        for task in waiting {
            drop(task.await.expect("a turn"));
            served.push(ended.recv().await.expect("an order"));
        }
        assert_eq!(served, [0, 1, 2, 3, 4], "in the order they came");
    }

    /// Past its own turns a caller runs on a spare one while one is free,
    /// and waits for whichever comes first when none is; without spare
    /// turns (it spends faster than it refills) it waits for its own.
    #[tokio::test]
    async fn a_caller_borrows_a_spare_turn_while_one_is_free() {
        let accounts = Accounts::new(10, 1);
        let alice = accounts.account(&user("alice"), TIER, Instant::now());
        let spare = Arc::new(Semaphore::new(1));
        let soon = Duration::from_millis(100);
        let own = alice.turn(Some(&spare)).await;
        assert_eq!(spare.available_permits(), 1, "her own turn first");
        let borrowed = tokio::time::timeout(soon, alice.turn(Some(&spare))).await.expect("a spare turn at once");
        assert_eq!(spare.available_permits(), 0);
        assert!(tokio::time::timeout(soon, alice.turn(Some(&spare))).await.is_err(), "none left");
        drop(borrowed);
        assert_eq!(spare.available_permits(), 1, "given back");
        assert!(tokio::time::timeout(soon, alice.turn(None)).await.is_err(), "not borrowing: her own only");
        drop(own);
        let again = tokio::time::timeout(soon, alice.turn(None)).await.expect("her own is back");
        drop(again);
    }

    #[test]
    fn a_caller_past_its_share_is_refused_while_others_are_not() {
        let accounts = Accounts::new(10, 4);
        let now = Instant::now();
        let (alice, bob) = (accounts.account(&user("alice"), TIER, now), accounts.account(&user("bob"), TIER, now));
        let first = Share::take(&alice, 2, 1).expect("1 of 2");
        assert!(!first.crowded(), "alone in flight, within what she may run");
        let second = Share::take(&alice, 2, 1).expect("2 of 2");
        assert!(second.crowded(), "beside her first, past what she may run");
        assert!(Share::is_full(&alice, 2) && !Share::is_full(&bob, 2));
        assert!(Share::take(&alice, 2, 1).is_none(), "alice holds her whole share");
        let bobs = Share::take(&bob, 2, 1).expect("bob has his own share");
        drop(first);
        assert!(Share::take(&alice, 2, 1).is_some(), "a place given back is free again");
        drop(bobs);
        assert_eq!(bob.in_flight.load(Ordering::Acquire), 0, "bob's place is back");
    }
}

//! The embedded store: sharded maps under short mutexes, bounded by entry count and bytes,
//! expiring by TTL. In-flight claims are never evicted. When a bound is reached, expired
//! records go first; a live record is evicted (earliest expiry first) only with
//! `when_full: evict`, and every such eviction is counted by route and logged, since it
//! drops a promise; `when_full: reject` answers 503 instead. The bounds are totals over all
//! shards (kept in atomics), so one large answer can use the whole byte budget.
//!
//! Every byte of a record is paid a million times in a full store, so the layout is
//! chosen for size: a done record is a 32-byte map value (an in-flight claim, of which
//! there are only as many as requests running, is boxed, as are the rare settled records),
//! and the expiry index is one FIFO per TTL (see [`shard`]).

mod shard;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use tokio::sync::watch;

use super::response::ENTRY_OVERHEAD;
use super::{
    mismatched, CallerTag, Claim, ClaimArgs, ClaimMode, KeyInfo, Lapse, Liveness, NotStored,
    OwnerToken, Ownership, RawClaim, RouteTag, Settled, Settlement, StoreError, StoreStats,
    Unknown, Waiter,
};
use crate::key::{Digest, DigestMap};
use crate::sync::lock;
use shard::{Entry, InFlight, Outcome, SettledRecord, Shard, Ticks, Totals};

/// What the memory store does when a bound is reached and no expired record is left.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WhenFull {
    /// Evict the live record closest to expiry (counted and logged).
    #[default]
    Evict,
    /// Refuse the new claim (503); an answer that finds no room is recorded as "executed,
    /// answer not stored".
    Reject,
}

impl WhenFull {
    /// The config spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Evict => "evict",
            Self::Reject => "reject",
        }
    }
}

/// Bounds of the memory store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryLimits {
    /// Most records held (in flight and done).
    pub max_entries: usize,
    /// Most bytes of records (bodies, headers and a fixed overhead each).
    pub max_bytes: usize,
    /// What a full store does.
    pub when_full: WhenFull,
    /// The most of `max_entries` and of `max_bytes`, in percent, that the records of one
    /// caller (one scope) may hold; 100: no limit per caller.
    pub caller_share: u8,
}

impl Default for MemoryLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 256 << 20,
            when_full: WhenFull::Evict,
            caller_share: 100,
        }
    }
}

impl MemoryLimits {
    /// Whether records are counted per caller (a share below 100%).
    pub fn counts_callers(&self) -> bool {
        self.caller_share < 100
    }
}

/// The in-process store.
#[derive(Debug)]
pub struct MemoryStore {
    shards: Box<[Mutex<Shard>]>,
    /// Expiry times are kept as nanoseconds since this instant: 8 bytes instead of 16.
    epoch: Instant,
    limits: MemoryLimits,
    totals: Totals,
    /// Fixed-window counters for rate limits: key → (window end, hits).
    counters: Mutex<DigestMap<(Instant, u64)>>,
    /// Live records evicted, by route.
    evictions: Mutex<BTreeMap<RouteTag, u64>>,
    /// When an eviction was last logged (ms since `epoch`), so a full store logs once in a
    /// while, not once per request.
    eviction_logged: AtomicU64,
}

/// Below this many entries per shard, sharding buys nothing: eviction would mostly reach
/// into other shards.
const MIN_ENTRIES_PER_SHARD: usize = 1024;
/// A shard's table grows by doubling, rehashed at once under its lock in the proxy's
/// thread: the more shards, the shorter each pause, but each costs memory per key
/// (`benches/load/growth.sh` measures both).
const MAX_SHARDS: usize = 64;
/// Expired records swept per write, so expiry costs O(1) amortized and needs no timer.
const SWEEP_PER_WRITE: usize = 4;
/// Rate counters are pruned of finished windows once this many exist.
const COUNTER_SWEEP_AT: usize = 4096;
/// At most one eviction warning per this many milliseconds.
const EVICTION_LOG_EVERY_MS: u64 = 10_000;

/// What a claim decided under the shard lock.
enum Decision {
    /// The key is this claim's.
    Take,
    /// The claim's answer.
    Answer(Claim),
    /// The owner vanished without settling, and its claim is held as unknown for `ttl`:
    /// the record becomes an unknown outcome, and the claim gets that.
    Lapsed { ttl: Duration },
}

impl MemoryStore {
    /// An empty store with these bounds.
    pub fn new(limits: MemoryLimits) -> Self {
        let shards = (limits.max_entries / MIN_ENTRIES_PER_SHARD).clamp(1, MAX_SHARDS);
        let shards = if shards.is_power_of_two() {
            shards
        } else {
            shards.next_power_of_two() / 2
        };
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            epoch: Instant::now(),
            limits,
            totals: Totals::default(),
            counters: Mutex::default(),
            evictions: Mutex::default(),
            eviction_logged: AtomicU64::new(0),
        }
    }

    /// The bounds it was made with.
    pub fn limits(&self) -> MemoryLimits {
        self.limits
    }

    /// Now, and `now` as [`Ticks`].
    fn now(&self) -> (Instant, Ticks) {
        let now = Instant::now();
        (now, self.ticks(now))
    }

    fn ticks(&self, at: Instant) -> Ticks {
        at.saturating_duration_since(self.epoch).as_nanos() as Ticks
    }

    fn instant(&self, ticks: Ticks) -> Instant {
        self.epoch + Duration::from_nanos(ticks)
    }

    /// `ticks` as wall-clock time, relative to `now` (`wall` being `now` on the wall clock).
    fn wall(&self, ticks: Ticks, now: Instant, wall: SystemTime) -> SystemTime {
        let at = self.instant(ticks);
        match at.checked_duration_since(now) {
            Some(ahead) => wall + ahead,
            None => wall
                .checked_sub(now.saturating_duration_since(at))
                .unwrap_or(wall),
        }
    }

    fn shard_index(&self, key: &Digest) -> usize {
        key.0[31] as usize & (self.shards.len() - 1)
    }

    fn shard(&self, key: &Digest) -> MutexGuard<'_, Shard> {
        // A poisoned shard only means another thread panicked mid-operation; every
        // operation leaves the shard consistent before it can panic, so keep serving.
        lock(&self.shards[self.shard_index(key)])
    }

    /// Frees room until `over` is false: expired records first, in the caller's shard (its
    /// lock is held) and every other shard it can lock without waiting (never blocking on
    /// a second lock, so no lock-order deadlock); then, with `when_full: evict`, live
    /// records closest to expiry, each counted. Returns whether `over` is false.
    fn make_room(
        &self,
        own: &mut Shard,
        own_index: usize,
        now: Ticks,
        over: impl Fn(&Totals) -> bool,
    ) -> bool {
        if !over(&self.totals) {
            return true;
        }
        let totals = &self.totals;
        own.sweep(now, usize::MAX, totals);
        for (i, other) in self.shards.iter().enumerate() {
            if !over(totals) {
                return true;
            }
            if i != own_index {
                if let Ok(mut other) = other.try_lock() {
                    other.sweep(now, usize::MAX, totals);
                }
            }
        }
        if !over(totals) {
            return true;
        }
        if self.limits.when_full == WhenFull::Reject {
            return false;
        }
        while over(totals) {
            match own.evict_one(totals) {
                Some(route) => self.count_eviction(route, now),
                None => break,
            }
        }
        for (i, other) in self.shards.iter().enumerate() {
            if !over(totals) {
                return true;
            }
            if i == own_index {
                continue;
            }
            if let Ok(mut other) = other.try_lock() {
                while over(totals) {
                    match other.evict_one(totals) {
                        Some(route) => self.count_eviction(route, now),
                        None => break,
                    }
                }
            }
        }
        !over(totals)
    }

    fn count_eviction(&self, route: RouteTag, now: Ticks) {
        let total = {
            let mut evictions = lock(&self.evictions);
            let count = evictions.entry(route).or_default();
            *count += 1;
            evictions.values().sum::<u64>()
        };
        let now_ms = now / 1_000_000;
        let last = self.eviction_logged.load(Ordering::Relaxed);
        if (last == 0 || now_ms >= last + EVICTION_LOG_EVERY_MS)
            && self
                .eviction_logged
                .compare_exchange(last, now_ms.max(1), Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                evicted_so_far = total,
                max_entries = self.limits.max_entries,
                max_bytes = self.limits.max_bytes,
                "memory store full: evicting live records (their repeats would execute again); \
                 raise max_entries/max_bytes, or set when_full: reject"
            );
        }
    }

    /// See [`super::Store::claim_with`].
    pub fn claim(&self, args: &ClaimArgs) -> Result<RawClaim, StoreError> {
        let key = args.key;
        let index = self.shard_index(&key);
        let mut shard = self.shard(&key);
        let (now, ticks) = self.now();
        shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        match self.decide(&mut shard, args, now, ticks) {
            Decision::Answer(claim) => return Ok(RawClaim::Other(claim)),
            Decision::Lapsed { ttl } => return Ok(self.hold_lapsed(&mut shard, args, ticks, ttl)),
            Decision::Take => {}
        }
        shard.remove(&key, &self.totals);
        shard.forget_seen(&key);
        if self.over_caller_share(args.caller, ENTRY_OVERHEAD, 1) {
            return Err(StoreError::CallerFull);
        }
        let limits = self.limits;
        if !self.make_room(&mut shard, index, ticks, |t| {
            t.entries.load(Ordering::Relaxed) >= limits.max_entries
                || t.bytes.load(Ordering::Relaxed) + ENTRY_OVERHEAD > limits.max_bytes
        }) {
            return Err(StoreError::Full);
        }
        let token = OwnerToken::random();
        let (liveness, alive) = Liveness::new();
        shard.insert(
            key,
            Entry::InFlight(Box::new(InFlight {
                token,
                fingerprint: args.fingerprint,
                lease_until: now + args.lease,
                lease: args.lease,
                lapse: args.lapse,
                alive,
                created: ticks,
                route: args.route,
                caller: args.caller,
                done: None,
            })),
            ENTRY_OVERHEAD,
            &self.totals,
        );
        Ok(RawClaim::Owner {
            token,
            liveness: Some(liveness),
        })
    }

    /// What a claim finds at `args.key`; converts a lapsed claim held as unknown on the way.
    fn decide(&self, shard: &mut Shard, args: &ClaimArgs, now: Instant, ticks: Ticks) -> Decision {
        use Decision::{Answer, Take};
        let issued_only = args.mode == ClaimMode::IssuedOnly;
        // A waiter never takes a turn of its own from a key that was settled meanwhile,
        // unless the route lets a lapsed claim be taken over (its owner may have died).
        let releases = matches!(args.lapse, Lapse::Release { .. });
        let free = || match (args.after, issued_only) {
            (_, true) => Answer(Claim::NotIssued),
            (Some(_), false) if !releases => Answer(Claim::Failed(None)),
            (_, false) => Take,
        };
        let fp = &args.fingerprint;
        let unless_mismatched = |stored: &Digest, claim: Claim| {
            if mismatched(stored, fp) {
                Answer(Claim::Mismatch)
            } else {
                Answer(claim)
            }
        };
        let Some(entry) = shard.map.get_mut(&args.key) else {
            return free();
        };
        match entry {
            Entry::Issued { expires_at } if *expires_at > ticks => match args.after {
                Some(_) => Answer(Claim::Failed(None)),
                None => Take,
            },
            Entry::Issued { .. } => free(),
            Entry::Done {
                response,
                expires_at,
                ..
            } if *expires_at > ticks => {
                unless_mismatched(&response.fingerprint(), Claim::Done(response.clone()))
            }
            Entry::Done { .. } => free(),
            Entry::Settled(record) if record.expires_at > ticks => {
                let until = self.wall(record.expires_at, now, SystemTime::now());
                match &record.outcome {
                    Outcome::NotStored { status } => unless_mismatched(
                        &record.fingerprint,
                        Claim::NotStored(NotStored {
                            status: *status,
                            at: record.at,
                        }),
                    ),
                    Outcome::Unknown => unless_mismatched(
                        &record.fingerprint,
                        Claim::OutcomeUnknown(Unknown { until }),
                    ),
                    Outcome::Failed { response, .. } if args.after == Some(record.token) => {
                        unless_mismatched(
                            &record.fingerprint,
                            Claim::Failed(Some(response.clone())),
                        )
                    }
                    Outcome::Failed { .. } if args.after.is_some() => Answer(Claim::Failed(None)),
                    Outcome::Failed { issued, .. } if !issued && issued_only => {
                        Answer(Claim::NotIssued)
                    }
                    Outcome::Failed { .. } => Take,
                }
            }
            Entry::Settled(_) => free(),
            Entry::InFlight(record)
                if record.lease_until > now || record.alive.strong_count() > 0 =>
            {
                // A live owner's claim is extended lazily, by whoever finds it past due.
                if record.lease_until <= now {
                    record.lease_until = now + record.lease;
                }
                if mismatched(&record.fingerprint, fp) {
                    return Answer(Claim::Mismatch);
                }
                let done = record.done.get_or_insert_with(|| watch::channel(()).0);
                Answer(Claim::InFlight(Waiter::new(
                    done.subscribe(),
                    record.lease_until,
                    record.token,
                )))
            }
            // The owner vanished without settling: its request may have gone out.
            Entry::InFlight(record) => match record.lapse {
                Lapse::Hold { ttl } => Decision::Lapsed { ttl },
                Lapse::Release { grace } if now < record.lease_until + grace => {
                    if mismatched(&record.fingerprint, fp) {
                        return Answer(Claim::Mismatch);
                    }
                    let done = record.done.get_or_insert_with(|| watch::channel(()).0);
                    Answer(Claim::InFlight(Waiter::new(
                        done.subscribe(),
                        record.lease_until + grace,
                        record.token,
                    )))
                }
                // A token whose owner vanished is spent (as on Redis, where its records
                // are gone by then); the client asks for a new one.
                Lapse::Release { .. } if issued_only => Answer(Claim::NotIssued),
                Lapse::Release { .. } => Take,
            },
        }
    }

    /// Turns the lapsed claim at `args.key` into an unknown outcome for `ttl` (keeping its
    /// owner's token and fingerprint) and answers the claim with it.
    fn hold_lapsed(
        &self,
        shard: &mut Shard,
        args: &ClaimArgs,
        ticks: Ticks,
        ttl: Duration,
    ) -> RawClaim {
        let Some(Entry::InFlight(record)) = shard.map.get(&args.key) else {
            unreachable!("decided on a claim in flight");
        };
        let (token, fingerprint) = (record.token, record.fingerprint);
        let (route, caller) = (record.route, record.caller);
        shard.remove(&args.key, &self.totals);
        let (entry, cost) = SettledRecord {
            outcome: Outcome::Unknown,
            token,
            fingerprint,
            at: SystemTime::now(),
            expires_at: 0,
            route,
            caller,
        }
        .into_entry();
        shard.put(args.key, entry, ticks, ttl, cost, &self.totals);
        RawClaim::Other(if mismatched(&fingerprint, &args.fingerprint) {
            Claim::Mismatch
        } else {
            Claim::OutcomeUnknown(Unknown {
                until: SystemTime::now() + ttl,
            })
        })
    }

    /// Whether `caller` adding `entries` records and `bytes` bytes would hold more than
    /// its share of the store.
    fn over_caller_share(&self, caller: CallerTag, bytes: usize, entries: usize) -> bool {
        if caller == CallerTag::NONE || !self.limits.counts_callers() {
            return false;
        }
        let share = usize::from(self.limits.caller_share);
        let (held, held_bytes) = self.totals.callers.held(caller);
        held + entries > (self.limits.max_entries * share / 100).max(1)
            || held_bytes + bytes > self.limits.max_bytes / 100 * share
    }

    /// See [`super::Store::issue`].
    pub fn issue(&self, key: Digest, ttl: Duration) -> Result<(), StoreError> {
        let index = self.shard_index(&key);
        let mut shard = self.shard(&key);
        let (_, now) = self.now();
        shard.remove(&key, &self.totals);
        let limits = self.limits;
        if !self.make_room(&mut shard, index, now, |t| {
            t.entries.load(Ordering::Relaxed) >= limits.max_entries
                || t.bytes.load(Ordering::Relaxed) + ENTRY_OVERHEAD > limits.max_bytes
        }) {
            return Err(StoreError::Full);
        }
        shard.put(
            key,
            Entry::Issued { expires_at: 0 },
            now,
            ttl,
            ENTRY_OVERHEAD,
            &self.totals,
        );
        Ok(())
    }

    /// See [`super::Store::hit`].
    pub fn hit(&self, key: Digest, window: Duration) -> u64 {
        let now = Instant::now();
        let mut counters = lock(&self.counters);
        if counters.len() >= COUNTER_SWEEP_AT {
            counters.retain(|_, (end, _)| *end > now);
        }
        let slot = counters.entry(key).or_insert((now + window, 0));
        if slot.0 <= now {
            *slot = (now + window, 0);
        }
        slot.1 += 1;
        slot.1
    }

    /// See [`super::Store::renew`].
    pub fn renew(&self, key: Digest, token: OwnerToken, lease: Duration) -> bool {
        let mut shard = self.shard(&key);
        match shard.map.get_mut(&key) {
            Some(Entry::InFlight(record)) if record.token == token => {
                record.lease_until = Instant::now() + lease;
                true
            }
            _ => false,
        }
    }

    /// See [`super::Store::settle`].
    pub fn settle(&self, owned: &Ownership, settlement: Settlement) -> Settled {
        let Ownership {
            key,
            token,
            fingerprint,
            ..
        } = *owned;
        let index = self.shard_index(&key);
        let mut shard = self.shard(&key);
        let (_, ticks) = self.now();
        let (route, caller, written) = match shard.map.get(&key) {
            Some(Entry::InFlight(record)) if record.token == token => {
                (record.route, record.caller, Settled::Written)
            }
            // A late outcome of a claim held as unknown: the owner was alive after all.
            Some(Entry::Settled(record))
                if record.token == token && matches!(record.outcome, Outcome::Unknown) =>
            {
                (record.route, record.caller, Settled::Written)
            }
            Some(entry) if !entry.is_expired(ticks) => return Settled::NotWritten,
            // Gone (purged): nothing to free, but what says the request ran goes back.
            _ if !settlement.writes_back() => {
                shard.remove(&key, &self.totals);
                return Settled::Written;
            }
            _ => (RouteTag::default(), CallerTag::NONE, Settled::WrittenBack),
        };
        // Removed (its waiters wake as the record's channel closes) before the new record
        // asks for room, so the claim's own bytes count as free.
        shard.remove(&key, &self.totals);
        let record = |outcome| {
            SettledRecord {
                outcome,
                token,
                fingerprint,
                at: SystemTime::now(),
                expires_at: 0,
                route,
                caller,
            }
            .into_entry()
        };
        let max = self.limits.max_bytes;
        let (entry, ttl, cost) = match settlement {
            Settlement::Release { reissue: None } => return written,
            Settlement::Release { reissue: Some(ttl) } => {
                (Entry::Issued { expires_at: 0 }, ttl, ENTRY_OVERHEAD)
            }
            Settlement::Done { ttl, .. } if ttl.is_zero() => return written,
            Settlement::Done { response, ttl } => {
                let cost = response.cost();
                let fits = cost <= max
                    && !self.over_caller_share(caller, cost, 0)
                    && self.make_room(&mut shard, index, ticks, |t| {
                        t.bytes.load(Ordering::Relaxed) + cost > max
                    });
                if !fits {
                    // The claim's own slot is free again, so this small record has room.
                    let status = response.status();
                    let (entry, cost) = record(Outcome::NotStored { status });
                    shard.put(key, entry, ticks, ttl, cost, &self.totals);
                    return Settled::AnswerNotKept;
                }
                let response = response.with_fingerprint(fingerprint);
                let entry = Entry::Done {
                    response,
                    expires_at: 0,
                    route,
                    caller,
                };
                (entry, ttl, cost)
            }
            Settlement::NotStored { status, ttl } => {
                let (entry, cost) = record(Outcome::NotStored { status });
                (entry, ttl, cost)
            }
            Settlement::Unknown { ttl } => {
                let (entry, cost) = record(Outcome::Unknown);
                (entry, ttl, cost)
            }
            Settlement::Failed {
                response,
                linger,
                reissue,
            } => {
                let cost = response.cost();
                let fits = cost <= max
                    && self.make_room(&mut shard, index, ticks, |t| {
                        t.bytes.load(Ordering::Relaxed) + cost > max
                    });
                if !fits {
                    // No room to share the failure: waiters are told their owner failed,
                    // without its answer; a one-time token is still given back.
                    if let Some(ttl) = reissue {
                        let issued = Entry::Issued { expires_at: 0 };
                        shard.put(key, issued, ticks, ttl, ENTRY_OVERHEAD, &self.totals);
                    }
                    return written;
                }
                let ttl = linger.max(reissue.unwrap_or_default());
                let issued = reissue.is_some();
                let (entry, cost) = record(Outcome::Failed { response, issued });
                (entry, ttl, cost)
            }
        };
        if !ttl.is_zero() {
            shard.put(key, entry, ticks, ttl, cost, &self.totals);
            shard.sweep(ticks, SWEEP_PER_WRITE, &self.totals);
        }
        written
    }

    /// See [`super::Store::inspect`].
    pub fn inspect(&self, key: Digest) -> Option<KeyInfo> {
        let now = Instant::now();
        let wall = SystemTime::now();
        let ticks = self.ticks(now);
        let shard = self.shard(&key);
        let entry = shard.map.get(&key)?;
        if entry.is_expired(ticks) {
            return None;
        }
        let until = |at: Ticks| self.wall(at, now, wall);
        let seen = shard
            .seen
            .get(&key)
            .map(|&(times, last)| super::Seen { times, last });
        Some(match entry {
            Entry::InFlight(record) => {
                let created = self.wall(record.created, now, wall);
                let alive = record.alive.strong_count() > 0;
                match record.lapse {
                    // A lapsed claim held as unknown: what its next claim will say.
                    Lapse::Hold { ttl } if !alive && record.lease_until <= now => KeyInfo {
                        state: "outcome_unknown",
                        created,
                        expires: wall + ttl,
                        response: None,
                        status: None,
                        waiters: None,
                        seen,
                    },
                    _ => KeyInfo {
                        state: "in_flight",
                        created,
                        // A live owner's claim does not lapse at a lease_until no one has
                        // renewed since: show when it would, were the owner to vanish now.
                        expires: wall
                            + if alive {
                                record.lease_until.max(now + record.lease)
                            } else {
                                record.lease_until
                            }
                            .saturating_duration_since(now),
                        response: None,
                        status: None,
                        waiters: Some(record.done.as_ref().map_or(0, |d| d.receiver_count())),
                        seen,
                    },
                }
            }
            Entry::Done {
                response,
                expires_at,
                ..
            } => KeyInfo {
                state: "done",
                created: response.stored_at(),
                expires: until(*expires_at),
                response: Some(response.clone()),
                status: Some(response.status()),
                waiters: None,
                seen,
            },
            Entry::Settled(record) => {
                let (state, response, status) = match &record.outcome {
                    Outcome::NotStored { status } => ("not_stored", None, Some(*status)),
                    Outcome::Unknown => ("outcome_unknown", None, None),
                    Outcome::Failed { response, .. } => {
                        ("failed", Some(response.clone()), Some(response.status()))
                    }
                };
                KeyInfo {
                    state,
                    created: record.at,
                    expires: until(record.expires_at),
                    response,
                    status,
                    waiters: None,
                    seen,
                }
            }
            Entry::Issued { expires_at } => KeyInfo {
                state: "issued",
                created: wall,
                expires: until(*expires_at),
                response: None,
                status: None,
                waiters: None,
                seen,
            },
        })
    }

    /// See [`super::Store::saw_duplicate`].
    pub fn saw_duplicate(&self, key: Digest) -> Option<SystemTime> {
        let (now, ticks) = self.now();
        let wall = SystemTime::now();
        let mut shard = self.shard(&key);
        let made = match shard.map.get(&key)? {
            entry if entry.is_expired(ticks) => return None,
            Entry::Done { response, .. } => Some(response.stored_at()),
            Entry::InFlight(record) => Some(self.wall(record.created, now, wall)),
            Entry::Settled(record) => Some(record.at),
            Entry::Issued { .. } => None,
        };
        let seen = shard.seen.entry(key).or_insert((1, wall));
        seen.0 += 1;
        seen.1 = wall;
        made
    }

    /// See [`super::Store::remove`].
    pub fn remove(&self, key: Digest) -> bool {
        let (_, ticks) = self.now();
        let mut shard = self.shard(&key);
        shard.forget_seen(&key);
        let live = shard.map.get(&key).is_some_and(|e| !e.is_expired(ticks));
        shard.remove(&key, &self.totals) && live
    }

    /// Current gauges, summed over shards.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            entries: self.totals.entries.load(Ordering::Relaxed),
            in_flight: self.shards.iter().map(|s| lock(s).in_flight).sum(),
            bytes: self.totals.bytes.load(Ordering::Relaxed),
            evictions: lock(&self.evictions)
                .iter()
                .map(|(route, n)| (*route, *n))
                .collect(),
            reaped: 0,
        }
    }
}

#[cfg(test)]
mod tests;

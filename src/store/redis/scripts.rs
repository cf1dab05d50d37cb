//! The Redis store's Lua scripts: each an atomic read-and-write on one record (so it works
//! on a cluster, the record's hash tag naming the slot). Record layouts are in
//! [`super::records`].

use redis::Script;

/// Claims a key: takes a free key (unless only an issued one may be taken, or the caller
/// is a waiter, which never takes a turn of its own unless it saw its owner's claim lapse
/// on a route that lets lapsed claims be taken over), an issued token, or a failure record
/// left for another owner's waiters;
/// marks another owner's unmarked in-flight record as waited on when asked to; otherwise
/// returns the record and its remaining TTL. A record taken over loses what observe mode
/// counted of it: the new claim's count starts afresh, as memory's does.
///
/// `KEYS[1]` record, `KEYS[2]` its seen counter. ARGV: `[1]` the claim's in-flight value,
/// `[2]` its PX, `[3]` `1` for issued-only, `[4]` `1` to mark, `[5]` the token a waiter
/// waited on (16 bytes) or empty, `[6]` `1` when a waiter may take a free key (it saw its
/// owner's claim lapse). Returns 0 (claimed), 1 (free, and not taken), or `{value, pttl}`.
const CLAIM: &str = r"
local v = redis.call('GET', KEYS[1])
local waiter = ARGV[5] ~= ''
if not v then
  if ARGV[3] == '1' or (waiter and ARGV[6] ~= '1') then return 1 end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 0
end
local kind = string.sub(v, 1, 1)
if not waiter and (kind == 'T' or (kind == 'F' and (ARGV[3] ~= '1' or string.sub(v, 50, 50) == '1'))) then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  redis.call('DEL', KEYS[2])
  return 0
end
if ARGV[4] == '1' and kind == 'I' and #v == #ARGV[1]
    and string.sub(v, 2, 17) ~= string.sub(ARGV[1], 2, 17) then
  redis.call('APPEND', KEYS[1], 'w')
end
return {v, redis.call('PTTL', KEYS[1])}
";

/// Ends a claim: fenced by the owner token (an in-flight record of that owner, or its own
/// unknown outcome, which a late answer may still settle), writing the settlement (or
/// deleting the record) and waking its waiters. A record that is gone is written back
/// when asked to, since the request ran and a retry must not run it again. A record that
/// already is the settlement's value is this owner's own write whose reply was lost (a
/// swap, or this script, done before the connection dropped and then retried): settled.
/// What observe mode counted of the claim goes with it: its counter lives as long as the
/// outcome written (a claim it counted is marked, so its completion comes here, never by
/// swap), and is deleted with a record deleted.
///
/// `KEYS[1]` record, `KEYS[2]` its seen counter. ARGV: `[1]` owner token (16 bytes), `[2]`
/// new value (empty: delete), `[3]` its PX, `[4]` channel, `[5]` `1` to write back. Returns
/// 1 (settled, already settled so, or gone and nothing to write), 2 (written back), 0
/// (another owner's record).
const SETTLE: &str = r"
local v = redis.call('GET', KEYS[1])
if v then
  if v == ARGV[2] then return 1 end
  local kind = string.sub(v, 1, 1)
  if (kind == 'I' or kind == 'U') and string.sub(v, 2, 17) == ARGV[1] then
    if ARGV[2] == '' then
      redis.call('DEL', KEYS[1], KEYS[2])
    else
      redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
      redis.call('PEXPIRE', KEYS[2], ARGV[3])
    end
    redis.call('PUBLISH', ARGV[4], '1')
    return 1
  end
  return 0
end
if ARGV[5] == '1' then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 2
end
return 1
";

/// `SET … IFEQ` for servers without it: the owner's own unmarked in-flight record swapped
/// for the done record it comes ready-made with, so the script builds no strings. It
/// publishes nothing: a record it matches carries no waiter's mark, so no one waits on it.
const SWAP: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
  return 1
end
return 0
";

/// Renews a live claim, or restores it if the record is gone (a Redis restarted empty or
/// failed over without it), so duplicates keep finding it in flight. A marked record's seen
/// counter, if observe mode counted it, is renewed with it.
///
/// `KEYS[1]` record, `KEYS[2]` its seen counter. ARGV: `[1]` `I` and the owner token (17
/// bytes), `[2]` PX, `[3]` the claim's unmarked in-flight value. Returns 1 (renewed),
/// 2 (restored), 0 (another's record).
const RENEW: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[2])
  return 2
end
if string.sub(v, 1, 17) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  if #v > #ARGV[3] then redis.call('PEXPIRE', KEYS[2], ARGV[2]) end
  return 1
end
return 0
";

/// Issues a one-time token. `KEYS[1]` record; ARGV: `[1]` its PX, `[2]` the issued record
/// (`T` and its tag).
const ISSUE: &str = r"
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[1])
return 1
";

const HIT: &str = r"
local n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end
return n
";

/// A record, its remaining TTL, and how often it was seen in observe mode (`n`, `last`
/// ms; nil when never). `KEYS[1]` record, `KEYS[2]` its seen counter.
const INSPECT: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
return {v, redis.call('PTTL', KEYS[1]), redis.call('HMGET', KEYS[2], 'n', 'last')}
";

/// An operator's purge: deletes a record and its seen counter and wakes its waiters,
/// unless the record is a claim in flight, or another record than the one the operator
/// named. An in-flight record (layout in [`super::records`]: the lapse span is bytes 58..65
/// in Lua's count, the lapse kind byte 66) stands while its remaining TTL is over the span
/// (its lease runs), and after that too on a route that releases lapsed claims (the
/// takeover waits for the record to expire); lapsed and held, it is an unknown outcome and
/// is purged. A named record is compared as [`super::records::purge_tag`] builds it: the
/// state's letter (a lapsed claim shows as `U`), the ms it was made (zeros for an issued
/// token) and the owner token where its kind keeps one (an issued token's tag).
///
/// `KEYS[1]` record, `KEYS[2]` its seen counter; ARGV: `[1]` channel, `[2]` the record's
/// tag, or empty for whichever it is. Returns 1 (deleted), 2 (a claim in flight, left
/// alone), 3 (another record, left alone), 0 (no record).
const PURGE: &str = r"
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local kind = string.sub(v, 1, 1)
if kind == 'I' then
  if #v < 66 or string.sub(v, 66, 66) ~= 'H' then return 2 end
  local span = 0
  for i = 58, 65 do span = span * 256 + string.byte(v, i) end
  if redis.call('PTTL', KEYS[1]) > span then return 2 end
end
if ARGV[2] ~= '' then
  local at, token = string.rep('\0', 8), string.sub(v, 2, 17)
  if kind == 'I' or kind == 'U' then at = string.sub(v, 50, 57)
  elseif kind == 'F' then at = string.sub(v, 54, 61)
  elseif kind == 'D' then at, token = string.sub(v, 37, 44), ''
  elseif kind == 'N' then at, token = string.sub(v, 36, 43), ''
  end
  if kind == 'I' then kind = 'U' end
  if kind .. at .. token ~= ARGV[2] then return 3 end
end
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('PUBLISH', ARGV[1], '1')
return 1
";

/// Deletes a record and its seen counter whatever the record is, and wakes its waiters:
/// a store that lost the record, for tests (`Store::forget`).
const FORGET: &str = r"
local n = redis.call('DEL', KEYS[1])
redis.call('DEL', KEYS[2])
redis.call('PUBLISH', ARGV[1], '1')
return n
";

/// Counts a duplicate seen in observe mode while the key has a record; the counter lives
/// as long as the record. An unmarked claim in flight is marked (`s`, see
/// [`super::records`]), so its owner settles it by the settle script, which carries the
/// counter over to the outcome, and renewals renew the counter too: a swap would leave the
/// counter to expire with the claim. Returns the record's first 64 bytes (which hold when
/// it was made, whatever its kind), or 0. `KEYS[1]` record, `KEYS[2]` its counter;
/// `ARGV[1]` now in ms.
const SEEN: &str = r"
local t = redis.call('PTTL', KEYS[1])
if t <= 0 then return 0 end
local head = redis.call('GETRANGE', KEYS[1], 0, 63)
if redis.call('HINCRBY', KEYS[2], 'n', 1) == 1 then
  redis.call('HINCRBY', KEYS[2], 'n', 1)
end
redis.call('HSET', KEYS[2], 'last', ARGV[1])
redis.call('PEXPIRE', KEYS[2], t)
if string.sub(head, 1, 1) == 'I' and redis.call('STRLEN', KEYS[1]) == 66 then
  redis.call('APPEND', KEYS[1], 's')
end
return head
";

/// The scripts, hashed once (redis-rs sends `EVALSHA`, and the source after `NOSCRIPT`).
pub(super) struct Scripts {
    pub claim: Script,
    pub settle: Script,
    pub swap: Script,
    pub renew: Script,
    pub issue: Script,
    pub hit: Script,
    pub inspect: Script,
    pub purge: Script,
    pub forget: Script,
    pub seen: Script,
}

impl Default for Scripts {
    fn default() -> Self {
        Self {
            claim: Script::new(CLAIM),
            settle: Script::new(SETTLE),
            swap: Script::new(SWAP),
            renew: Script::new(RENEW),
            issue: Script::new(ISSUE),
            hit: Script::new(HIT),
            inspect: Script::new(INSPECT),
            purge: Script::new(PURGE),
            forget: Script::new(FORGET),
            seen: Script::new(SEEN),
        }
    }
}

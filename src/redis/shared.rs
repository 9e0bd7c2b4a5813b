//! The Lua scripts of `--shared`: any number of shared holders at once, never beside an
//! exclusive one, as `flock -s` and Redisson's read-write lock give. Keys (one Cluster hash
//! slot, thanks to the `{NAME}` tag):
//!
//! - `holders:{NAME}`, `holders-meta:{NAME}`: the shared holders, as a semaphore's are kept
//!   (each token scored by the end of its lease on the server's clock; its host, pid, command,
//!   since and fence packed in the hash), with `limit` = `shared`;
//! - `lock:{NAME}`: while any shared holder holds, the marker `shared`, with an expiry no earlier
//!   than the last shared lease. A run without `--shared`, and a program using the plain
//!   `SET lock:{NAME} token NX PX` protocol, find the lock taken; a plain holder's key keeps
//!   shared runs out in turn. The last shared holder to go takes the marker with it;
//! - `fence:{NAME}`: every shared acquisition takes `INCR`, so fences strictly increase across
//!   both modes;
//! - the queue of fair waiting, where a shared waiter's place is `^` and its token: the shared
//!   waiters at the head are admitted together, and a shared waiter never passes an exclusive
//!   one that came first (a stream of readers cannot starve a writer).

use super::scripts::{Script, lua_helpers};

/// KEYS: as the one-holder `scripts::ACQUIRE`'s (lock, fence, holder, holders, holders-meta,
/// queue, queue-alive, gone). ARGV: token, ttl ms, host, pid, command, since ms, mode
/// (`queue`: a waiter keeps a place; `peek`: `-n`, taken only when no exclusive run holds or
/// waits), keep-alive ms.
///
/// Replies as the one-holder acquire's: `{1, fence}` when taken (or already ours: an earlier
/// attempt whose reply was lost); `{0, pttl, host, pid, command, since, fence, queued}` of an
/// exclusive holder, or of the first shared holder while an exclusive waiter comes first;
/// `{2, ms, k, queued}` when it is free but k waiters come first (ms: until the first one's
/// keep-alive ends); `{-1, N}` while a semaphore of N holds;
/// `{3}` when the token was given back.
pub const ACQUIRE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
if buried(KEYS[8], ARGV[1]) then
  return {3}
end
local now = clock()
local ttl = tonumber(ARGV[2])
local mode = ARGV[7]
local m = '^' .. ARGV[1]
drop_lapsed(KEYS[4], KEYS[5], now)
local limit = redis.call('HGET', KEYS[5], 'limit')
if limit ~= SHARED and redis.call('ZCARD', KEYS[4]) > 0 then
  return {-1, tonumber(limit) or 0}
end
local plain, value = pcall(redis.call, 'GET', KEYS[1])
if not plain then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' holds no lock')
end
local open = not value or value == SHARED
if not open and redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  -- An exclusive holder where ours should be (the marker was deleted by hand): not ours.
  redis.call('ZREM', KEYS[4], ARGV[1])
  redis.call('HDEL', KEYS[5], ARGV[1])
end
if open and redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  redis.call('ZADD', KEYS[4], 'XX', now + ttl, ARGV[1])
  outlive({KEYS[4], KEYS[5]}, ttl)
  keep_marker(KEYS[1], value, ttl)
  dequeue(KEYS[6], KEYS[7], m)
  local _, _, _, _, fence = fields(redis.call('HGET', KEYS[5], ARGV[1]))
  return {1, tonumber(fence) or tonumber(redis.call('GET', KEYS[2]))}
end
local allowed = open
if redis.call('EXISTS', KEYS[6]) == 1 then
  prune(KEYS[6], KEYS[7], now)
  local ahead = redis.call('ZRANK', KEYS[6], m) or redis.call('ZCARD', KEYS[6])
  local before = {}
  if mode == 'peek' then
    before = redis.call('ZRANGE', KEYS[6], 0, -1)
  elseif ahead > 0 then
    before = redis.call('ZRANGE', KEYS[6], 0, ahead - 1)
  end
  -- Only shared waiters may come first: an exclusive one (fair or racer) goes before.
  for _, other in ipairs(before) do
    if not is_shared(other) then
      allowed = false
      break
    end
  end
end
if allowed then
  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
  if not ok then
    return not_a_fence(KEYS[2])
  end
  redis.call('ZADD', KEYS[4], now + ttl, ARGV[1])
  redis.call('HSET', KEYS[5], 'limit', SHARED,
             ARGV[1], ARGV[3] .. '\t' .. ARGV[4] .. '\t' .. ARGV[5] .. '\t' .. ARGV[6] .. '\t' .. fence)
  outlive({KEYS[4], KEYS[5]}, ttl)
  keep_marker(KEYS[1], value, ttl)
  dequeue(KEYS[6], KEYS[7], m)
  return {1, fence}
end
local queued = 0
if mode == 'queue' then
  enqueue(KEYS[6], KEYS[7], m, now, tonumber(ARGV[8]))
  queued = 1
end
if not value then
  local ahead = redis.call('ZRANK', KEYS[6], m) or redis.call('ZCARD', KEYS[6])
  local head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
  local alive = head and tonumber(redis.call('ZSCORE', KEYS[7], head)) or now
  return {2, math.max(alive - now, 0), ahead, queued}
end
local meta
if value == SHARED then
  -- Held shared, with an exclusive waiter before us: the first shared holder stands for all.
  local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  local h, p, c, s, f = fields(first and redis.call('HGET', KEYS[5], first))
  meta = {value, h or false, p or false, c or false, s or false, f or false}
else
  meta = redis.call('HMGET', KEYS[3], 'token', 'host', 'pid', 'command', 'since', 'fence')
  if meta[1] ~= value then
    meta = {false, false, false, false, false, false}
  end
end
return {0, redis.call('PTTL', KEYS[1]), meta[2], meta[3], meta[4], meta[5], meta[6], queued}
"#
    ),
    sha1: "92a9970d8ac5daea3547a70b33d08d932cb3c500",
};

/// KEYS: holders, holders-meta, lock. ARGV: token, ttl ms. Extends our shared lease to a full
/// TTL while it is ours and not yet over, and the marker with it: 1. Else 0, also when an
/// exclusive holder has the lock (its marker was deleted by hand): a shared lease beside an
/// exclusive holder is no lease, and the run stops its command as for any lost lease.
pub const RENEW: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local now = clock()
local ok, score = pcall(redis.call, 'ZSCORE', KEYS[1], ARGV[1])
if not ok or not score or tonumber(score) <= now then
  return 0
end
local plain, value = pcall(redis.call, 'GET', KEYS[3])
if not plain or (value and value ~= SHARED) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
outlive({KEYS[1], KEYS[2]}, ttl)
keep_marker(KEYS[3], value, ttl)
return 1
"#
    ),
    sha1: "5166655ef58598e6c4a689a8e3d741b0028780f7",
};

/// KEYS: holders, holders-meta, queue, queue-alive, gone, lock, history. ARGV: token, keep ms
/// (0: let go now), channel, publish command, bury ms, N, and the history record, how many to
/// keep and for how long (as the one-holder release's). Lets our shared
/// lease go (or with keep > 0 keeps it, and the marker, until then: `--min-hold`). The last
/// shared holder deletes the marker and wakes whoever's turn it is; otherwise the marker is
/// cut to the longest lease left, and shared waiters at the head of the queue (behind an
/// exclusive waiter that gave up) are told. 1 when the lease was ours, else 0.
pub const RELEASE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local now = clock()
remember(KEYS[7], ARGV[7], ARGV[8], ARGV[9])
if tonumber(ARGV[5]) > 0 then
  bury(KEYS[5], ARGV[1], now, tonumber(ARGV[5]))
end
local ok, score = pcall(redis.call, 'ZSCORE', KEYS[1], ARGV[1])
if not ok or not score or tonumber(score) <= now then
  return 0
end
local plain, value = pcall(redis.call, 'GET', KEYS[6])
local marked = plain and value == SHARED
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('ZADD', KEYS[1], 'XX', now + keep, ARGV[1])
  outlive({KEYS[1], KEYS[2]}, keep)
  if marked then
    -- The marker lasts as long as the longest share left, ours to the end of the hold
    -- included: no longer (exclusive runs would wait on a lock nobody holds).
    drop_lapsed(KEYS[1], KEYS[2], now)
    fit_marker(KEYS[6], KEYS[1], now)
  end
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
drop_lapsed(KEYS[1], KEYS[2], now)
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if #last == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
  if marked then
    redis.call('DEL', KEYS[6])
  end
elseif marked then
  fit_marker(KEYS[6], KEYS[1], now)
end
-- Let go whatever follows: a queue key of the wrong type (another program's) must not make
-- the release look failed.
pcall(function()
  if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 then
    prune(KEYS[3], KEYS[4], now)
  end
  if #last == 0 and plain and (marked or not value) then
    wake(ARGV[4], ARGV[3], KEYS[3], 1)
  elseif #last > 0 and marked then
    wake_shared(ARGV[4], ARGV[3], KEYS[3])
  end
end)
return 1
"#
    ),
    sha1: "352d8cb717e3d435f5165d51e138ffaffb2e559d",
};

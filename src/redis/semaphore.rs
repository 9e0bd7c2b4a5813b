//! The Lua scripts of `--holders N` (N > 1): a counting semaphore whose every slot is a lease of
//! its own. Keys (one Cluster hash slot, thanks to the `{NAME}` tag):
//!
//! - `holders:{NAME}`       a sorted set: each holder's token, scored by the end of its lease
//!   in milliseconds on the server's clock (`TIME`); members past their score are dropped by
//!   the scripts themselves;
//! - `holders-meta:{NAME}`  a hash: `limit` (the N of the current holders), and for each token
//!   its holder's `host`, `pid`, `command`, `since` and `fence`, tab-separated;
//! - `fence:{NAME}`         the same fence counter as one holder's, so that fences strictly
//!   increase across every holder;
//! - `lock:{NAME}`          one holder's key: while it exists (a run with N = 1, or a program
//!   using the plain protocol), a semaphore run is refused, and the other way round.
//!
//! Both keys are given an expiry no shorter than any member's lease, so a semaphore whose
//! holders all crashed leaves nothing behind.

use super::scripts::{Script, lua_helpers};

/// KEYS: lock, fence, holders, meta, queue, queue-alive, gone. ARGV: token, ttl ms, N, host,
/// pid, command, since ms, mode, keep-alive ms (the mode and the queue as for one holder's
/// `scripts::ACQUIRE`: of k free slots, a fair waiter may take one when fewer than k waiters
/// came before it, a racer when fewer than k fair waiters did). Lapsed places in the queue are
/// dropped at every attempt, also while every slot is taken.
///
/// `{1, fence}` when a slot is taken (or already ours: an earlier attempt whose reply was
/// lost); `{0, ms until the soonest lease ends, host, pid, command, since, fence, queued}` of
/// that holder when all N are held; `{2, ms, k, queued}` when a slot is free but k waiters
/// come first; `{-1, M}` when the current holders use another N (M; 1 for a one-holder lock,
/// `shared` for shared holders);
/// `{3}` when the token was given back.
pub const ACQUIRE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
if buried(KEYS[7], ARGV[1]) then
  return {3}
end
local plain, value = pcall(redis.call, 'GET', KEYS[1])
if not plain or value then
  if value == SHARED then
    return {-1, SHARED}
  end
  return {-1, 1}
end
local now = clock()
local ttl = tonumber(ARGV[2])
local mode = ARGV[8]
local m = member(ARGV[1], mode == 'race')
drop_lapsed(KEYS[3], KEYS[4], now)
local count = redis.call('ZCARD', KEYS[3])
local given = redis.call('HGET', KEYS[4], 'limit')
if count > 0 and given == SHARED then
  return {-1, SHARED}
end
local limit = tonumber(given)
if count > 0 and limit and limit ~= tonumber(ARGV[3]) then
  return {-1, limit}
end
if redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call('ZADD', KEYS[3], 'XX', now + ttl, ARGV[1])
  outlive({KEYS[3], KEYS[4]}, ttl)
  dequeue(KEYS[5], KEYS[6], m)
  local _, _, _, _, fence = fields(redis.call('HGET', KEYS[4], ARGV[1]))
  return {1, tonumber(fence) or tonumber(redis.call('GET', KEYS[2]))}
end
local free = tonumber(ARGV[3]) - count
local allowed = free > 0
if mode ~= 'any' and redis.call('EXISTS', KEYS[5]) == 1 then
  prune(KEYS[5], KEYS[6], now)
  if allowed and mode == 'peek' then
    allowed = redis.call('ZCARD', KEYS[5]) == 0
  elseif allowed then
    allowed = may_take(KEYS[5], m, free)
  end
end
if not allowed then
  local queued = 0
  if mode == 'queue' or mode == 'race' then
    enqueue(KEYS[5], KEYS[6], m, now, tonumber(ARGV[9]))
    queued = 1
  end
  if free > 0 then
    local ahead = redis.call('ZRANK', KEYS[5], m) or redis.call('ZCARD', KEYS[5])
    local head = redis.call('ZRANGE', KEYS[5], 0, 0)[1]
    local alive = tonumber(head and redis.call('ZSCORE', KEYS[6], head)) or now
    return {2, math.max(alive - now, 0), ahead, queued}
  end
  local first = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  local h, p, c, s, f = fields(redis.call('HGET', KEYS[4], first[1]))
  return {0, math.max(tonumber(first[2]) - now, 0), h or false, p or false, c or false, s or false, f or false, queued}
end
local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
if not ok then
  return not_a_fence(KEYS[2])
end
redis.call('ZADD', KEYS[3], now + ttl, ARGV[1])
redis.call('HSET', KEYS[4], 'limit', ARGV[3],
           ARGV[1], ARGV[4] .. '\t' .. ARGV[5] .. '\t' .. ARGV[6] .. '\t' .. ARGV[7] .. '\t' .. fence)
outlive({KEYS[3], KEYS[4]}, ttl)
dequeue(KEYS[5], KEYS[6], m)
return {1, fence}
"#
    ),
    sha1: "67ac031d60b32c72aa63e5f608db185e7cca2c0c",
};

/// KEYS: holders, meta. ARGV: token, ttl ms. Extends our slot's lease to a full TTL while it
/// is ours and not yet over: 1; else 0.
pub const RENEW: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local now = clock()
local ok, score = pcall(redis.call, 'ZSCORE', KEYS[1], ARGV[1])
if not ok or not score or tonumber(score) <= now then
  return 0
end
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], 'XX', now + ttl, ARGV[1])
outlive(KEYS, ttl)
return 1
"#
    ),
    sha1: "5be31b469cf30b6b91b306d44576f12bd01cbf74",
};

/// KEYS: holders, meta, queue, queue-alive, gone, lock, history. ARGV: token, keep ms (0: free
/// the slot now), channel, publish command, bury ms, N, and the history record, how many to
/// keep and for how long (as the one-holder release's). Frees our slot
/// and wakes the waiters whose turn it is, as many as places are free (`wake`), or with
/// keep > 0 leaves it taken until then (`--min-hold`). 1 when the slot was ours, else 0.
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
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('ZADD', KEYS[1], 'XX', now + keep, ARGV[1])
  outlive({KEYS[1], KEYS[2]}, keep)
  return 1
end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1], KEYS[2])
end
-- The slot is let go whatever follows (a queue key of the wrong type: another program's).
pcall(function()
  if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 then
    prune(KEYS[3], KEYS[4], now)
  end
  wake(ARGV[4], ARGV[3], KEYS[3], tonumber(ARGV[6]) - redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf'))
end)
return 1
"#
    ),
    sha1: "f23775e035c8cec336f565f18faadad07836d370",
};

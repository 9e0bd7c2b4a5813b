//! The Lua scripts of the lease protocol. Each runs atomically on the server, so a lock, its
//! fence counter and its holder metadata never disagree.
//!
//! Keys (one Cluster hash slot, thanks to the `{NAME}` tag):
//! - `lock:{NAME}`   the owner's token, with the lease as its expiry (the plain `SET NX PX`
//!   layout, so programs using that protocol interoperate);
//! - `fence:{NAME}`  the fencing counter, never deleted;
//! - `holder:{NAME}` a hash: token, host, pid, command, since (ms), fence; same expiry as the lock;
//! - `holders:{NAME}`, `holders-meta:{NAME}`: the holders of a semaphore (`--holders N`, see
//!   `super::semaphore`).
//!
//! Releases are published on `released:{NAME}` (a sharded channel on a Cluster).

/// A script with its SHA1, sent with EVALSHA and, on NOSCRIPT, with EVAL (which also caches it
/// on the server, so a restarted server costs one extra round trip once). The SHA1s are
/// written out rather than computed at every start; a test checks them against the server's.
pub struct Script {
    pub source: &'static str,
    pub sha1: &'static str,
}

pub(crate) use super::lua::lua_helpers;

/// KEYS: lock, fence, holder, holders, holders-meta, queue, queue-alive, gone. ARGV: token,
/// ttl ms, host, pid, command, since ms, mode, keep-alive ms. The mode: `queue` (a fair waiter:
/// the lock is taken only when nobody waits before us, else we join or keep our place), `peek`
/// (`-n`: taken only when nobody waits at all; never queues), `race` (`--no-fair`: taken
/// whenever free and no fair waiter came first; a racer that finds it busy queues too, so that
/// it is never served after a fair waiter that came later), `any` (Redlock's servers: taken
/// whenever free; the queue is neither read nor joined).
///
/// Returns `{1, fence}` when acquired (or when the lock already holds our token: an earlier
/// attempt whose reply was lost), else `{0, pttl, host, pid, command, since, fence, queued}`
/// describing the holder (metadata fields are nil when the holder is not a `locked-run`;
/// queued is 1 when this attempt holds a place in the queue), `{2, ms, k, queued}` when it is
/// free but k waiters come first (ms: until the first one's keep-alive ends), `{-1, N}` while
/// runs with `--holders N` hold it (see `semaphore`), or `{3}` when the token was given back
/// (an attempt that arrived after its run gave up on it).
pub const ACQUIRE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
if buried(KEYS[8], ARGV[1]) then
  return {3}
end
if redis.call('EXISTS', KEYS[4]) == 1 then
  local limit = redis.call('HGET', KEYS[5], 'limit')
  local now = clock()
  if redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf') > 0 then
    if limit ~= SHARED then
      return {-1, tonumber(limit) or 0}
    end
    -- Shared holders hold: their marker must be there (a hand DEL took it), or SET NX
    -- below would take the lock beside them.
    if redis.call('EXISTS', KEYS[1]) == 0 then
      fit_marker(KEYS[1], KEYS[4], now)
    end
  end
end
local mode = ARGV[7]
local m = member(ARGV[1], mode == 'race')
local now = 0
local allowed = true
if mode ~= 'any' and redis.call('EXISTS', KEYS[6]) == 1 then
  now = clock()
  prune(KEYS[6], KEYS[7], now)
  if mode == 'peek' then
    allowed = redis.call('ZCARD', KEYS[6]) == 0
  else
    allowed = may_take(KEYS[6], m, 1)
  end
end
if allowed and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
  if not ok then
    redis.call('DEL', KEYS[1])
    return not_a_fence(KEYS[2])
  end
  -- Every field is written: an earlier holder's hash needs no DEL first, unless the key
  -- holds something else.
  local meta = {'token', ARGV[1], 'host', ARGV[3], 'pid', ARGV[4], 'command', ARGV[5],
                'since', ARGV[6], 'fence', fence}
  if not pcall(redis.call, 'HSET', KEYS[3], unpack(meta)) then
    redis.call('DEL', KEYS[3])
    redis.call('HSET', KEYS[3], unpack(meta))
  end
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  if now > 0 then
    dequeue(KEYS[6], KEYS[7], m)
  end
  return {1, fence}
end
local value = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[3], 'token', 'host', 'pid', 'command', 'since', 'fence')
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  dequeue(KEYS[6], KEYS[7], m)
  return {1, tonumber(meta[6] or redis.call('GET', KEYS[2]))}
end
local queued = 0
if mode == 'queue' or mode == 'race' then
  if now == 0 then
    now = clock()
  end
  enqueue(KEYS[6], KEYS[7], m, now, tonumber(ARGV[8]))
  queued = 1
end
if not value then
  local ahead = redis.call('ZRANK', KEYS[6], m) or redis.call('ZCARD', KEYS[6])
  local head = redis.call('ZRANGE', KEYS[6], 0, 0)[1]
  local alive = head and tonumber(redis.call('ZSCORE', KEYS[7], head)) or now
  return {2, math.max(alive - now, 0), ahead, queued}
end
if value == SHARED then
  -- Held by shared runs: the first of them stands for them all.
  local first = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  local h, p, c, s, f = fields(first and redis.call('HGET', KEYS[5], first))
  meta = {value, h or false, p or false, c or false, s or false, f or false}
elseif meta[1] ~= value then
  meta = {false, false, false, false, false, false}
end
return {0, redis.call('PTTL', KEYS[1]), meta[2], meta[3], meta[4], meta[5], meta[6], queued}
"#
    ),
    sha1: "f26c58634e8ff74a45cf32c53b66e4d44177bb56",
};

/// KEYS: lock, holder. ARGV: token, ttl ms. Compare-and-PEXPIRE: 1 while ours, else 0.
pub const RENEW: Script = Script {
    source: r#"
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if ok and value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
return 0
"#,
    sha1: "2bdc75995a5151a3ccefab4cb5ada82a0ff7584a",
};

/// KEYS: lock, holder, fence, gone. ARGV: token, ttl ms, fence, host, pid, command, since ms,
/// retake. (A buried token is never taken again: a retake that lands after the release.)
/// Redlock's renewal on one server: compare-and-PEXPIRE as [`RENEW`] (1); held by another, 0;
/// absent (the server restarted empty, or the key lapsed there), -1, or with retake = 1 taken
/// again as an acquisition would, the fence counter raised to the holder's fence so that a
/// later holder's INCR there still exceeds it (2). Redlock re-takes only servers where a round
/// has just confirmed that it still holds a quorum: then no one else can hold the lock, and
/// the run does not erode, server by server, to an exact quorum that one slow server breaks.
pub const RENEW_OR_RETAKE: Script = Script {
    source: r#"
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if not ok then
  return 0
end
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[2], ARGV[2])
  return 1
end
if value then
  return 0
end
if ARGV[8] ~= '1' or (redis.call('EXISTS', KEYS[4]) == 1 and redis.call('ZSCORE', KEYS[4], ARGV[1])) then
  return -1
end
local counted, counter = pcall(redis.call, 'GET', KEYS[3])
if not counted then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])
if (tonumber(counter) or 0) < tonumber(ARGV[3]) then
  redis.call('SET', KEYS[3], ARGV[3])
end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[2], 'token', ARGV[1], 'host', ARGV[4], 'pid', ARGV[5],
           'command', ARGV[6], 'since', ARGV[7], 'fence', ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 2
"#,
    sha1: "e2ab450947311af3625b486da4e4569cea0d05d2",
};

/// KEYS: lock, holder, queue, queue-alive, gone, (lock again, for the shared release's sake),
/// history. ARGV: token, keep ms (0: delete now), channel, the publish command (PUBLISH;
/// SPUBLISH on a Cluster, where only a sharded channel lives in the lock's slot; empty for a
/// Redlock grant given back without waking anyone), ms to bury the token for (0: not buried;
/// see `bury`: a run some of whose attempts went unanswered buries its token as it lets go, so
/// that one landing later takes nothing), N, and the run's history record (empty: none), how
/// many records to keep, and how long the history outlives its last run (`remember`): written
/// first, whether or not the lock is still ours, so that a lost run is in it too.
/// Compare-and-DEL plus the publish that wakes the waiter whose turn it is (`wake`); or, with
/// keep > 0, compare-and-PEXPIRE to the rest of `--min-hold`. 1 when the lock was ours, else 0.
pub const RELEASE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
remember(KEYS[7], ARGV[7], ARGV[8], ARGV[9])
if tonumber(ARGV[5]) > 0 then
  bury(KEYS[5], ARGV[1], clock(), tonumber(ARGV[5]))
end
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if not ok or value ~= ARGV[1] then
  return 0
end
local keep = tonumber(ARGV[2])
if keep > 0 then
  redis.call('PEXPIRE', KEYS[1], keep)
  redis.call('PEXPIRE', KEYS[2], keep)
  return 1
end
redis.call('DEL', KEYS[1], KEYS[2])
-- Let go whatever follows: a queue key another program made something else must not make
-- the release look failed.
pcall(function()
  if ARGV[4] ~= '' and redis.call('EXISTS', KEYS[3]) == 1 then
    prune(KEYS[3], KEYS[4], clock())
  end
  wake(ARGV[4], ARGV[3], KEYS[3], 1)
end)
return 1
"#
    ),
    sha1: "f0b10a5cc361c3e8bba05c51327df6641c369b22",
};

/// KEYS: lock, fence, holder. ARGV: token, fence. Redlock's second phase: raises the fence
/// counter to `ARGV[2]` (never lowers it) only while the lock holds our token; 1 when done, 0
/// when the lock is not ours here.
pub const RAISE_FENCE: Script = Script {
    source: r#"
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if not ok or value ~= ARGV[1] then
  return 0
end
local fence = tonumber(ARGV[2])
if (tonumber(redis.call('GET', KEYS[2])) or 0) < fence then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('HSET', KEYS[3], 'fence', ARGV[2])
return 1
"#,
    sha1: "65ba9bd590982ebe216521ad885e20d104c0d8b9",
};

/// KEYS: lock, holder, fence, holders, holders-meta, queue, queue-alive. ARGV: channel,
/// publish command, token (empty: every holder). `release --force`, for one holder, a semaphore
/// and shared holders alike (the last shared holder's going takes the marker): deletes
/// the holder whose token it is given (or every one whose lease has not ended: those that
/// have are dropped unreported), never the fence counter, and wakes the
/// waiters whose turn it is (`wake`). Returns `{last fence, {{token, host, pid, command, since, fence}, ...}}` of what it
/// released (fields false where the holder is not a `locked-run`).
pub const FORCE_RELEASE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if not ok then
  return redis.error_reply('WRONGTYPE ' .. KEYS[1] .. ' is not a lock')
end
local released = {}
local limit = tonumber(redis.call('HGET', KEYS[5], 'limit')) or 1
-- The shared holders' marker is no holder: they are, each in the holders' set.
if value and value ~= SHARED and (ARGV[3] == '' or ARGV[3] == value) then
  local meta = redis.call('HMGET', KEYS[2], 'token', 'host', 'pid', 'command', 'since', 'fence')
  if meta[1] ~= value then
    meta = {false, false, false, false, false, false}
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  table.insert(released, {value, meta[2], meta[3], meta[4], meta[5], meta[6]})
end
local now = clock()
drop_lapsed(KEYS[4], KEYS[5], now)
local members
if ARGV[3] == '' then
  members = redis.call('ZRANGE', KEYS[4], 0, -1)
elseif redis.call('ZSCORE', KEYS[4], ARGV[3]) then
  members = {ARGV[3]}
else
  members = {}
end
for _, member in ipairs(members) do
  local h, p, c, s, f = fields(redis.call('HGET', KEYS[5], member))
  redis.call('ZREM', KEYS[4], member)
  redis.call('HDEL', KEYS[5], member)
  table.insert(released, {member, h or false, p or false, c or false, s or false, f or false})
end
local unmarked = false
if redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[5])
  -- The last shared holder gone, the marker goes too.
  if value == SHARED then
    redis.call('DEL', KEYS[1])
    unmarked = true
  end
end
if #released > 0 or unmarked then
  local still = redis.call('GET', KEYS[1])
  if redis.call('EXISTS', KEYS[6]) == 1 then
    prune(KEYS[6], KEYS[7], now)
  end
  if not still then
    wake(ARGV[2], ARGV[1], KEYS[6], limit - redis.call('ZCARD', KEYS[4]))
  elseif still == SHARED then
    wake_shared(ARGV[2], ARGV[1], KEYS[6])
  end
end
return {redis.call('GET', KEYS[3]), released}
"#
    ),
    sha1: "557aeacf969924be9182147a77e6b0f1cb7cf289",
};

/// KEYS: as `ACQUIRE`'s (lock, fence, holder, holders, holders-meta, queue, queue-alive, gone;
/// the fence is not touched). ARGV: token, channel, publish command (empty: wake nobody, for a
/// Redlock grant that made no quorum), ms to keep the token buried, the run's `--holders` N
/// (how many waiters a freed place may wake). A waiter that ends without the lock (or a grant it cannot use) gives back
/// everything its token may hold, in one step: its place in the queue, the lock or its
/// semaphore slot, and buries the token so that an attempt of it still on its way is refused
/// when it lands (the run goes on, if it does, with a fresh token). If the lock is then free,
/// the waiters whose turn it is are told (`wake`). 1 when the lock or a slot was ours, else 0.
pub const GIVE_BACK: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local now = clock()
local token = ARGV[1]
bury(KEYS[8], token, now, tonumber(ARGV[4]))
-- Whether its place was among the first N (N: the run's --holders), or it was a racer that
-- may take a place: those a release may have woken, whose wake-up now goes to others.
local was_first = false
if redis.call('EXISTS', KEYS[6]) == 1 then
  local first = math.max(tonumber(ARGV[5]), 1)
  for _, m in ipairs({token, member(token, true), '^' .. token}) do
    local rank = redis.call('ZRANK', KEYS[6], m)
    if rank and (rank < first or (is_racer(m) and rank < RACE_SCAN and may_take(KEYS[6], m, first))) then
      was_first = true
    end
    dequeue(KEYS[6], KEYS[7], m)
  end
end
local released = 0
local ok, value = pcall(redis.call, 'GET', KEYS[1])
if ok and value == token then
  redis.call('DEL', KEYS[1], KEYS[3])
  released = 1
end
local counted, score = pcall(redis.call, 'ZSCORE', KEYS[4], token)
if counted and score then
  redis.call('ZREM', KEYS[4], token)
  redis.call('HDEL', KEYS[5], token)
  drop_lapsed(KEYS[4], KEYS[5], now)
  if redis.call('ZCARD', KEYS[4]) == 0 then
    redis.call('DEL', KEYS[4], KEYS[5])
    -- The last shared holder takes the marker with it.
    if ok and value == SHARED then
      redis.call('DEL', KEYS[1])
      value = false
    end
  end
  released = 1
end
if ARGV[3] ~= '' and (released == 1 or was_first) and ok and (not value or value == SHARED) then
  if redis.call('EXISTS', KEYS[6]) == 1 then
    prune(KEYS[6], KEYS[7], now)
  end
  if value then
    -- Still held by shared runs: only shared waiters at the head may go.
    wake_shared(ARGV[3], ARGV[2], KEYS[6])
  else
    local free = 1
    if tonumber(ARGV[5]) > 1 then
      local held, live = pcall(redis.call, 'ZCOUNT', KEYS[4], '(' .. now, '+inf')
      free = tonumber(ARGV[5]) - (held and live or 0)
    end
    wake(ARGV[3], ARGV[2], KEYS[6], free)
  end
end
return released
"#
    ),
    sha1: "fdf5936d22d211a409f1f73066e1062573a262ce",
};

/// KEYS: history. ARGV: limit, how many records to look at, the largest record's bytes.
/// `history` (and `status`'s last run): the NAME's newest records, as many as `limit`, of the
/// first so many of `history:{NAME}`, leaving out, on the server, every one larger than a
/// record may be or that is not JSON (any user of the lock can push onto the list: twenty
/// records of 1 MB would otherwise make a reply past the client's limit). Returns `{skipped,
/// {record, ...}}`, newest first.
pub const HISTORY: Script = Script {
    source: r#"
local limit, scanned, largest = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local kept, skipped, at = {}, 0, 0
while #kept < limit and at < scanned do
  local chunk = redis.call('LRANGE', KEYS[1], at, math.min(at + 15, scanned - 1))
  if #chunk == 0 then
    break
  end
  for _, record in ipairs(chunk) do
    if #kept < limit then
      if #record <= largest and pcall(cjson.decode, record) then
        kept[#kept + 1] = record
      else
        skipped = skipped + 1
      end
    end
  end
  at = at + #chunk
end
return {skipped, kept}
"#,
    sha1: "f3e77bd59144cef8faaae29b1c30c9d9b2f60653",
};

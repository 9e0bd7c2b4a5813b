//! The Lua scripts of the lease protocol. Each runs atomically on the server, so a lock, its
//! fence counter and its holder metadata never disagree.
//!
//! Keys (one Cluster hash slot, thanks to the `{NAME}` tag):
//! - `lock:{NAME}`   the owner's token, with the lease as its expiry (the seed's layout);
//! - `fence:{NAME}`  the fencing counter, never deleted;
//! - `holder:{NAME}` a hash: token, host, pid, command, since (ms), fence; same expiry as the lock;
//! - `holders:{NAME}`, `holders-meta:{NAME}`: the holders of a semaphore (`--holders N`, see
//!   [`super::semaphore`]).
//!
//! Releases are published on `released:{NAME}` (a sharded channel on a Cluster).

/// A script with its SHA1, sent with EVALSHA and, on NOSCRIPT, with EVAL (which also caches it
/// on the server, so a restarted server costs one extra round trip once). The SHA1s are
/// written out rather than computed at every start; a test checks them against the server's.
pub struct Script {
    pub source: &'static str,
    pub sha1: &'static str,
}

/// Lua functions the scripts that touch the queue of fair waiting share, prepended to them:
///
/// - `clock()`: the server's time in ms (`TIME`; the scripts replicate their effects, not
///   themselves, as Redis 5 and later do by default);
/// - `prune(queue, alive, now)`: drops the waiters whose keep-alive ended (a SIGKILLed
///   waiter), from both keys;
/// - `outlive(keys, ms)`: makes each key live at least `ms` longer;
/// - `enqueue(queue, alive, token, now, ms)`: joins the queue at its end (or keeps its place),
///   alive `ms` longer; both keys outlive every member;
/// - `drop_lapsed(holders, meta, now)`: drops the semaphore holders whose lease ended (a
///   SIGKILLed holder), from both keys;
/// - `fields(meta)`: a semaphore holder's packed metadata, `host pid command since fence`;
/// - `dequeue(queue, alive, token)`: leaves it (deleting both keys once empty);
/// - `announce(command, channel, message)`: publishes a release, falling back to PUBLISH on a
///   Redis 6 Cluster (no SPUBLISH there; its PUBLISH reaches every node); a user that may not
///   publish still releases (its waiters poll).
///
/// The queue is `queue:{NAME}`, tokens scored by arrival, and `queue-alive:{NAME}`, the same
/// tokens scored by the end of their keep-alive on the server's clock.
macro_rules! lua_helpers {
    () => {
        r#"
if redis.replicate_commands then
  -- Before Redis 5, a script that reads TIME may write only once it asked for this.
  redis.replicate_commands()
end
local function clock()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function prune(queue, alive, now)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now)
  if #dead > 0 then
    redis.call('ZREMRANGEBYSCORE', alive, '-inf', now)
    redis.call('ZREM', queue, unpack(dead))
  end
end
local function outlive(keys, ms)
  for _, key in ipairs(keys) do
    if redis.call('PTTL', key) < ms then
      redis.call('PEXPIRE', key, ms)
    end
  end
end
local function enqueue(queue, alive, token, now, ms)
  if not redis.call('ZSCORE', queue, token) then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
    redis.call('ZADD', queue, (tonumber(last[2]) or 0) + 1, token)
  end
  redis.call('ZADD', alive, now + ms, token)
  outlive({queue, alive}, ms)
end
local function drop_lapsed(holders, meta, now)
  local gone = redis.call('ZRANGEBYSCORE', holders, '-inf', now)
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', holders, '-inf', now)
    redis.call('HDEL', meta, unpack(gone))
  end
end
local function fields(meta)
  return string.match(meta or '', '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
end
local function dequeue(queue, alive, token)
  redis.call('ZREM', queue, token)
  redis.call('ZREM', alive, token)
  if redis.call('ZCARD', queue) == 0 then
    redis.call('DEL', queue, alive)
  end
end
local function announce(command, channel, message)
  if command ~= '' and not pcall(redis.call, command, channel, message) and command == 'SPUBLISH' then
    pcall(redis.call, 'PUBLISH', channel, message)
  end
end
"#
    };
}
pub(crate) use lua_helpers;

/// KEYS: lock, fence, holder, holders, holders-meta, queue, queue-alive. ARGV: token, ttl ms,
/// host, pid, command, since ms, mode, keep-alive ms. The mode: `queue` (a fair waiter: the
/// lock is taken only when nobody waits before us, else we join or keep our place), `peek`
/// (`-n`: taken only when nobody waits at all; never queues), `race` (`--no-fair`: taken
/// whenever free).
///
/// Returns `{1, fence}` when acquired (or when the lock already holds our token: an earlier
/// attempt whose reply was lost), else `{0, pttl, host, pid, command, since, fence}` describing
/// the holder (metadata fields are nil when the holder is not a `locked-run`), `{2, ms, k}` when
/// it is free but k waiters come first (ms: until the first one's keep-alive ends), or `{-1, N}`
/// while runs with `--holders N` hold it (see `semaphore`).
pub const ACQUIRE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
if redis.call('EXISTS', KEYS[4]) == 1 then
  if redis.call('ZCOUNT', KEYS[4], '(' .. clock(), '+inf') > 0 then
    return {-1, tonumber(redis.call('HGET', KEYS[5], 'limit')) or 0}
  end
end
local fence_type = redis.call('TYPE', KEYS[2])['ok']
if fence_type ~= 'none' and fence_type ~= 'string' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. fence_type .. ', not a fence counter')
end
local mode = ARGV[7]
local now = 0
local head = false
if mode ~= 'race' and redis.call('EXISTS', KEYS[6]) == 1 then
  now = clock()
  prune(KEYS[6], KEYS[7], now)
  head = redis.call('ZRANGE', KEYS[6], 0, 0)[1] or false
end
if (not head or head == ARGV[1]) and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
  if not ok then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' does not hold an integer fence counter')
  end
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'token', ARGV[1], 'host', ARGV[3], 'pid', ARGV[4],
             'command', ARGV[5], 'since', ARGV[6], 'fence', fence)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  if head then
    dequeue(KEYS[6], KEYS[7], ARGV[1])
  end
  return {1, fence}
end
local value = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[3], 'token', 'host', 'pid', 'command', 'since', 'fence')
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  dequeue(KEYS[6], KEYS[7], ARGV[1])
  return {1, tonumber(meta[6] or redis.call('GET', KEYS[2]))}
end
if mode == 'queue' then
  if now == 0 then
    now = clock()
  end
  enqueue(KEYS[6], KEYS[7], ARGV[1], now, tonumber(ARGV[8]))
end
if not value then
  local ahead = redis.call('ZRANK', KEYS[6], ARGV[1]) or redis.call('ZCARD', KEYS[6])
  local alive = head and tonumber(redis.call('ZSCORE', KEYS[7], head)) or now
  return {2, math.max(alive - now, 0), ahead}
end
if meta[1] ~= value then
  meta = {false, false, false, false, false, false}
end
return {0, redis.call('PTTL', KEYS[1]), meta[2], meta[3], meta[4], meta[5], meta[6]}
"#
    ),
    sha1: "e416d95ba3e2c7352d10c5131c036d47cee8c0e1",
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

/// KEYS: lock, holder, fence. ARGV: token, ttl ms, fence, host, pid, command, since ms, retake.
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
if ARGV[8] ~= '1' then
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
    sha1: "d8ba8a7703782c87daaa628b49a31d02bcf5d92e",
};

/// KEYS: lock, holder, queue, queue-alive. ARGV: token, keep ms (0: delete now), channel, and
/// the publish command (PUBLISH; SPUBLISH on a Cluster, where only a sharded channel lives in
/// the lock's slot; empty for a Redlock grant given back without waking anyone).
/// Compare-and-DEL plus a publish that wakes waiters: the message is the token of the first
/// fair waiter (only it need ask), or `released` for anyone; or, with keep > 0,
/// compare-and-PEXPIRE to the rest of `--min-hold`. 1 when the lock was ours, else 0.
pub const RELEASE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
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
if ARGV[4] ~= '' then
  local message = 'released'
  if redis.call('EXISTS', KEYS[3]) == 1 then
    prune(KEYS[3], KEYS[4], clock())
    message = redis.call('ZRANGE', KEYS[3], 0, 0)[1] or 'released'
  end
  announce(ARGV[4], ARGV[3], message)
end
return 1
"#
    ),
    sha1: "a4c70feca3f6b075fe64d2c842ffc14cbfaabcbc",
};

/// KEYS: lock, fence, holder. ARGV: token, fence. Redlock's second phase: raises the fence
/// counter to ARGV[2] (never lowers it) only while the lock holds our token; 1 when done, 0
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

/// KEYS: lock, holder, fence, holders, holders-meta. ARGV: channel, publish command, token
/// (empty: every holder). `release --force`, for one holder and for a semaphore alike: deletes
/// the holder whose token it is given (or every one whose lease has not ended: those that
/// have are dropped unreported), never the fence counter, and wakes the
/// waiters. Returns `{last fence, {{token, host, pid, command, since, fence}, ...}}` of what it
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
if value and (ARGV[3] == '' or ARGV[3] == value) then
  local meta = redis.call('HMGET', KEYS[2], 'token', 'host', 'pid', 'command', 'since', 'fence')
  if meta[1] ~= value then
    meta = {false, false, false, false, false, false}
  end
  redis.call('DEL', KEYS[1], KEYS[2])
  table.insert(released, {value, meta[2], meta[3], meta[4], meta[5], meta[6]})
end
drop_lapsed(KEYS[4], KEYS[5], clock())
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
if redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[5])
end
if #released > 0 then
  announce(ARGV[2], ARGV[1], 'released')
end
return {redis.call('GET', KEYS[3]), released}
"#
    ),
    sha1: "e8910d2e6df38473155c8a61a6b9ee3273ce495e",
};

/// KEYS: queue, queue-alive, lock. ARGV: token, channel, publish command. A fair waiter that
/// gives up (`-w` ran out, a signal) leaves the queue at once; if the lock is free, the next
/// waiter is told its turn has come, rather than wait for our keep-alive to end.
pub const LEAVE: Script = Script {
    source: concat!(
        lua_helpers!(),
        r#"
local was_head = redis.call('ZRANGE', KEYS[1], 0, 0)[1] == ARGV[1]
dequeue(KEYS[1], KEYS[2], ARGV[1])
if was_head and redis.call('EXISTS', KEYS[3]) == 0 and redis.call('EXISTS', KEYS[1]) == 1 then
  prune(KEYS[1], KEYS[2], clock())
  local head = redis.call('ZRANGE', KEYS[1], 0, 0)[1]
  if head then
    announce(ARGV[3], ARGV[2], head)
  end
end
return 1
"#
    ),
    sha1: "d69e84bc289670a510b759e11c69847821990a8b",
};

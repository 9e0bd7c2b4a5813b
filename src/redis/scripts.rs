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

/// KEYS: lock, fence, holder, holders, holders-meta. ARGV: token, ttl ms, host, pid, command,
/// since ms.
///
/// Returns `{1, fence}` when acquired (or when the lock already holds our token: an earlier
/// attempt whose reply was lost), else `{0, pttl, host, pid, command, since, fence}` describing
/// the holder (metadata fields are nil when the holder is not a `locked-run`), or `{-1, N}`
/// while runs with `--holders N` hold it (see `semaphore`).
pub const ACQUIRE: Script = Script {
    source: r#"
if redis.call('EXISTS', KEYS[4]) == 1 then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf') > 0 then
    return {-1, tonumber(redis.call('HGET', KEYS[5], 'limit')) or 0}
  end
end
local fence_type = redis.call('TYPE', KEYS[2])['ok']
if fence_type ~= 'none' and fence_type ~= 'string' then
  return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' holds a ' .. fence_type .. ', not a fence counter')
end
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local ok, fence = pcall(redis.call, 'INCR', KEYS[2])
  if not ok then
    redis.call('DEL', KEYS[1])
    return redis.error_reply('WRONGTYPE ' .. KEYS[2] .. ' does not hold an integer fence counter')
  end
  redis.call('DEL', KEYS[3])
  redis.call('HSET', KEYS[3], 'token', ARGV[1], 'host', ARGV[3], 'pid', ARGV[4],
             'command', ARGV[5], 'since', ARGV[6], 'fence', fence)
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, fence}
end
local value = redis.call('GET', KEYS[1])
local meta = redis.call('HMGET', KEYS[3], 'token', 'host', 'pid', 'command', 'since', 'fence')
if value == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('PEXPIRE', KEYS[3], ARGV[2])
  return {1, tonumber(meta[6] or redis.call('GET', KEYS[2]))}
end
if meta[1] ~= value then
  meta = {false, false, false, false, false, false}
end
return {0, redis.call('PTTL', KEYS[1]), meta[2], meta[3], meta[4], meta[5], meta[6]}
"#,
    sha1: "a3f77f89b67688c723d857abd6cf317c990e3fc7",
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

/// KEYS: lock, holder. ARGV: token, keep ms (0: delete now), channel, and the publish command
/// (PUBLISH; SPUBLISH on a Cluster, where only a sharded channel lives in the lock's slot, with
/// PUBLISH as the fallback on a Redis 6 Cluster, which has no SPUBLISH; empty
/// for a Redlock grant given back without waking anyone).
/// Compare-and-DEL plus a publish that wakes waiters; or, with keep > 0, compare-and-PEXPIRE to
/// the rest of `--min-hold`. 1 when the lock was ours, else 0.
pub const RELEASE: Script = Script {
    source: r#"
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
  -- A user that may not publish still releases (its waiters poll). A Redis 6 Cluster has no
  -- SPUBLISH; its PUBLISH reaches every node.
  if not pcall(redis.call, ARGV[4], ARGV[3], 'released') and ARGV[4] == 'SPUBLISH' then
    pcall(redis.call, 'PUBLISH', ARGV[3], 'released')
  end
end
return 1
"#,
    sha1: "e34eeee763d118c132bb921724642c4a369e1c8f",
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
/// the holder whose token it is given (or every one), never the fence counter, and wakes the
/// waiters. Returns `{last fence, {{token, host, pid, command, since, fence}, ...}}` of what it
/// released (fields false where the holder is not a `locked-run`).
pub const FORCE_RELEASE: Script = Script {
    source: r#"
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
local members
if ARGV[3] == '' then
  members = redis.call('ZRANGE', KEYS[4], 0, -1)
elseif redis.call('ZSCORE', KEYS[4], ARGV[3]) then
  members = {ARGV[3]}
else
  members = {}
end
for _, member in ipairs(members) do
  local meta = redis.call('HGET', KEYS[5], member) or ''
  local h, p, c, s, f = string.match(meta, '^([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)\t([^\t]*)$')
  redis.call('ZREM', KEYS[4], member)
  redis.call('HDEL', KEYS[5], member)
  table.insert(released, {member, h or false, p or false, c or false, s or false, f or false})
end
if redis.call('ZCARD', KEYS[4]) == 0 then
  redis.call('DEL', KEYS[4], KEYS[5])
end
if #released > 0 then
  if not pcall(redis.call, ARGV[2], ARGV[1], 'released') and ARGV[2] == 'SPUBLISH' then
    pcall(redis.call, 'PUBLISH', ARGV[1], 'released')
  end
end
return {redis.call('GET', KEYS[3]), released}
"#,
    sha1: "6d10c4649de119a074cf4b36f60e183ee5d8a195",
};

/// Every script, for the test that checks their SHA1s against the server's.
pub const ALL: [&Script; 9] = [
    &ACQUIRE,
    &RENEW,
    &RENEW_OR_RETAKE,
    &RELEASE,
    &RAISE_FENCE,
    &FORCE_RELEASE,
    &super::semaphore::ACQUIRE,
    &super::semaphore::RENEW,
    &super::semaphore::RELEASE,
];

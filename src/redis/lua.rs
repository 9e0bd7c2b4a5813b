//! The Lua functions the protocol's scripts share (the queue of fair waiting, the semaphore's
//! holders, the shared holders' marker, the wake-ups), prepended to each script that needs
//! them, so every script stays one atomic call on the server.

/// Lua functions the scripts that touch the queue of fair waiting share, prepended to them:
///
/// - `clock()`: the server's time in ms (`TIME`; the scripts replicate their effects, not
///   themselves, as Redis 5 and later do by default);
/// - `prune(queue, alive, now)`: drops the waiters whose keep-alive ended (a SIGKILLed
///   waiter), from both keys;
/// - `outlive(keys, ms)`: makes each key live at least `ms` longer;
/// - `member(token, racer)`, `is_racer(member)`: a waiter's place in the queue is its token, or
///   `~` and its token for a `--no-fair` waiter (a racer);
/// - `enqueue(queue, alive, member, now, ms)`: joins the queue at its end (or keeps its place),
///   alive `ms` longer; both keys live as long as the last member's keep-alive;
/// - `may_take(queue, member, free)`: whether a waiter may take one of `free` free places: a
///   fair waiter when fewer than `free` waiters (of either kind) came before it, a racer when
///   fewer than `free` fair waiters did (racers race among themselves, never past a fair waiter
///   that came first);
/// - `SHARED`, `is_shared(member)`: while shared holders (`--shared`) hold, `lock:{NAME}` holds
///   this marker, with an expiry no earlier than the last shared lease; a shared waiter's place
///   in the queue is `^` and its token (see [`super::shared`]);
/// - `keep_marker(lock, value, ms)`: the marker in `lock` (its `value`, false when absent:
///   then set) lasts at least `ms` more; `fit_marker(lock, holders, now)`: it lasts exactly as long as
///   the longest live share in `holders`;
/// - `wake(command, channel, queue, free)`: announces a release to those whose turn it is, one
///   message each, on each one's own channel, `channel:TOKEN`, with its token as the message (so
///   a release wakes a waiter process or two, not every waiter of the NAME): of the first `free`
///   waiters, each fair one; of the racers that may take a place (fewer than `free` fair
///   waiters came before them; looked for among the first `RACE_SCAN` of the queue), as many
///   as places are left, and `RACE_SPARE` more, chosen at random (`pick`), not by arrival;
///   `released` on `channel` when nobody is queued (for waiters that keep no place:
///   Redlock's); the shared waiters at the head of the queue together, when the first is one
///   (`wake_shared`); nothing when `free` is 0 or `command` empty;
/// - `drop_lapsed(holders, meta, now)`: drops the semaphore holders whose lease ended (a
///   SIGKILLed holder), from both keys;
/// - `fields(meta)`: a semaphore holder's packed metadata, `host pid command since fence`;
/// - `dequeue(queue, alive, member)`: leaves it (Redis deletes a sorted set it empties);
/// - `not_a_fence(fence)`: the error for a fence key that holds no integer counter;
/// - `bury(gone, token, now, ms)`, `buried(gone, token)`: a token given back is kept in
///   `gone:{NAME}` for `ms`, and an attempt that carries it is refused: a request still on its
///   way when its run gave up must not take the lock (or a place in the queue) for a run that
///   has gone on without it;
/// - `remember(history, record, keep, ms)`: adds a run's record (none when empty) to the head of
///   `history:{NAME}`, and once the list is twice `keep` long cuts it to the newest `keep`
///   records, in the list's own order (so a release between two cuts costs one LPUSH, not a
///   read of what is kept), and lets the list expire `ms` after the last run; what is not a
///   record (anyone who may write the key may push anything: shaped as no JSON object of at
///   most 4096 bytes is) counts for nothing and goes when the list is cut, and no more than
///   `keep * 10` entries are looked at; a key
///   of another type, or one the ACL refuses inside the script, is let go silently: history
///   never makes a release fail;
/// - `announce(command, channel, message)`: publishes a release, falling back to PUBLISH on a
///   Redis 6 Cluster (no SPUBLISH there; its PUBLISH reaches every node); a user that may not
///   publish still releases (its waiters poll).
///
/// The queue is `queue:{NAME}`, members scored by arrival, and `queue-alive:{NAME}`, the same
/// members scored by the end of their keep-alive on the server's clock.
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
local function member(token, racer)
  if racer then
    return '~' .. token
  end
  return token
end
local function is_racer(m)
  return string.sub(m, 1, 1) == '~'
end
local SHARED = 'shared'
local function is_shared(m)
  return string.sub(m, 1, 1) == '^'
end
local function keep_marker(lock, value, ms)
  if not value then
    redis.call('SET', lock, SHARED, 'PX', ms)
  elseif redis.call('PTTL', lock) < ms then
    redis.call('PEXPIRE', lock, ms)
  end
end
local function fit_marker(lock, holders, now)
  local last = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
  redis.call('SET', lock, SHARED, 'PX', math.max(tonumber(last[2]) - now, 1))
end
local function enqueue(queue, alive, m, now, ms)
  if not redis.call('ZSCORE', queue, m) then
    local last = redis.call('ZRANGE', queue, -1, -1, 'WITHSCORES')
    redis.call('ZADD', queue, (tonumber(last[2]) or 0) + 1, m)
  end
  redis.call('ZADD', alive, now + ms, m)
  -- Every waiter asks with the same keep-alive, so the member just refreshed is the one whose
  -- place lasts longest: both keys live exactly as long as it.
  redis.call('PEXPIRE', queue, ms)
  redis.call('PEXPIRE', alive, ms)
end
local function may_take(queue, m, free)
  local ahead = redis.call('ZRANK', queue, m) or redis.call('ZCARD', queue)
  if ahead < free then
    return true
  end
  if not is_racer(m) then
    return false
  end
  local fair = 0
  for _, other in ipairs(redis.call('ZRANGE', queue, 0, ahead - 1)) do
    if not is_racer(other) then
      fair = fair + 1
      if fair >= free then
        return false
      end
    end
  end
  return true
end
local function bury(gone, token, now, ms)
  redis.call('ZREMRANGEBYSCORE', gone, '-inf', now)
  redis.call('ZADD', gone, now + ms, token)
  outlive({gone}, ms)
end
local function buried(gone, token)
  return redis.call('EXISTS', gone) == 1 and redis.call('ZSCORE', gone, token) ~= false
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
local function dequeue(queue, alive, m)
  redis.call('ZREM', queue, m)
  redis.call('ZREM', alive, m)
end
local function not_a_fence(fence)
  local kind = redis.call('TYPE', fence)['ok']
  if kind ~= 'string' then
    return redis.error_reply('WRONGTYPE ' .. fence .. ' holds a ' .. kind .. ', not a fence counter')
  end
  return redis.error_reply('WRONGTYPE ' .. fence .. ' does not hold an integer fence counter')
end
local function a_record(entry)
  return #entry <= 4096 and string.sub(entry, 1, 1) == '{' and string.sub(entry, -1) == '}'
end
local function remember(history, record, keep, ms)
  if not record or record == '' then
    return
  end
  pcall(function()
    keep = tonumber(keep)
    if redis.call('LPUSH', history, record) > 2 * keep then
      local kept, junk, at = {}, false, 0
      while #kept < keep and at < keep * 10 do
        local chunk = redis.call('LRANGE', history, at, at + 15)
        if #chunk == 0 then
          break
        end
        for _, entry in ipairs(chunk) do
          if #kept < keep then
            if a_record(entry) then
              kept[#kept + 1] = entry
            else
              junk = true
            end
          end
        end
        at = at + #chunk
      end
      if junk then
        redis.call('DEL', history)
        redis.call('RPUSH', history, unpack(kept))
      else
        redis.call('LTRIM', history, 0, #kept - 1)
      end
    end
    redis.call('PEXPIRE', history, tonumber(ms))
  end)
end
local function announce(command, channel, message)
  if command ~= '' and not pcall(redis.call, command, channel, message) and command == 'SPUBLISH' then
    pcall(redis.call, 'PUBLISH', channel, message)
  end
end
local function wake_shared(command, channel, queue)
  if command == '' then
    return
  end
  local from = 0
  while true do
    local page = redis.call('ZRANGE', queue, from, from + 99)
    for _, m in ipairs(page) do
      if not is_shared(m) then
        return
      end
      local token = string.sub(m, 2)
      announce(command, channel .. ':' .. token, token)
    end
    if #page < 100 then
      return
    end
    from = from + 100
  end
end
-- A few of `racers` at random: `n` of them, or all when fewer. The server's clock seeds the
-- choice (a script's own `math.random` repeats itself call after call).
local function pick(racers, n)
  if n >= #racers then
    return racers
  end
  local t = redis.call('TIME')
  local x = (tonumber(t[1]) % 2147 * 1000000 + tonumber(t[2])) % 2147483646 + 1
  for i = 1, n do
    x = x * 16807 % 2147483647
    local j = i + x % (#racers - i + 1)
    racers[i], racers[j] = racers[j], racers[i]
  end
  return {unpack(racers, 1, n)}
end
local RACE_SCAN = 100
local RACE_SPARE = 1
local function wake(command, channel, queue, free)
  if command == '' or free < 1 then
    return
  end
  local first = redis.call('ZRANGE', queue, 0, free - 1)
  if #first == 0 then
    announce(command, channel, 'released')
    return
  end
  if is_shared(first[1]) then
    wake_shared(command, channel, queue)
    return
  end
  -- Racers further back may take a place only when one is among the first `free`.
  for _, m in ipairs(first) do
    if is_racer(m) then
      if #first == free and free < RACE_SCAN then
        first = redis.call('ZRANGE', queue, 0, RACE_SCAN - 1)
      end
      break
    end
  end
  -- The fair waiters among the first `free` are told, each on its own channel; the racers
  -- that may take a place (fewer than `free` others came before them) race for what is left,
  -- RACE_SPARE more of them than places, so that one that died after its wake-up costs
  -- nothing: racers chosen at random, not by arrival.
  local others, told, racers = 0, 0, {}
  for i, m in ipairs(first) do
    if is_racer(m) then
      table.insert(racers, m)
    else
      if i <= free then
        told = told + 1
        if not is_shared(m) then
          announce(command, channel .. ':' .. m, m)
        end
      end
      others = others + 1
      if others >= free then
        break
      end
    end
  end
  if #racers == 0 then
    return
  end
  for _, m in ipairs(pick(racers, free - told + RACE_SPARE)) do
    local token = string.sub(m, 2)
    announce(command, channel .. ':' .. token, token)
  end
end
"#
    };
}
pub(crate) use lua_helpers;

#[cfg(test)]
mod tests {
    /// The release scripts' own bound on a record is the one every reader keeps.
    #[test]
    fn a_record_is_as_large_as_a_reader_takes() {
        let bound = format!("#entry <= {}", crate::backend::MAX_RECORD);
        assert!(lua_helpers!().contains(&bound), "{bound}");
    }
}

-- Take a lock if it is free, or claim a hand-over no waiter took, and hand out its next
-- fencing token. A caller that is refused and will wait raises the "someone waits" flag, so
-- that releases hand the lock over or wake a waiter (lock_release.lua) instead of just
-- deleting it. A call retried with the caller's identifier (its reply was lost) answers the
-- lock the caller already holds.
-- KEYS[1]  owner key (STRING: the holder's identifier, with a TTL)
-- KEYS[2]  fence key (STRING counter: the last fencing token granted for this name)
-- KEYS[3]  signal key (LIST: at most one wake-up, a hand-over "<token>:<ttl ms>:<identifier>"
--          or a plain 1)
-- KEYS[4]  waiting key (STRING flag with a TTL: someone may be blocked on the signal list;
--          its value: until when, in server ms, a plain wake-up is out whose waiter has not
--          asked yet, see lock_release.lua; 1: none is). Releases read it; the last waiter
--          of the line served takes it down.
-- KEYS[5]  waiters key (ZSET: the line, each waiter's identifier -> until when, in server
--          ms, it counts as waiting: its block's end and a second)
-- KEYS[6]  granted key (STRING with the grant lease: the identifier of a hand-over not
--          confirmed yet, see lock_release.lua)
-- ARGV[1]  identifier to hold the lock under: the caller's, or the hand-over's it confirms
-- ARGV[2]  lock TTL in milliseconds
-- ARGV[3]  how long the caller may block for a wake-up if refused, ms (0: it will not wait)
-- ARGV[4]  1 when the caller asks because a plain wake-up woke it, else 0
-- ARGV[5]  (optional) the caller's own identifier, in the line, when ARGV[1] is a hand-over's
-- Returns  the fencing token (> 0) when the lock was taken (or was already the caller's);
--          otherwise minus the holder's remaining TTL in milliseconds (<= 0; 0 when it has none).

--! include _fence

local waiter = ARGV[5] or ARGV[1]

local function server_ms()
    local time = redis.call('TIME')
    return tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
end

-- The caller holds the lock: a grant in flight is over, and the caller leaves the line. The
-- flag lasts as long as the waiters left in the line, and goes with the last (a release
-- would otherwise hand the lock over to nobody). A grant to a caller that was not in the
-- line leaves the flag alone (raised by a waiter of an earlier release, which keeps none).
local function granted()
    redis.call('DEL', KEYS[6])
    if redis.call('ZREM', KEYS[5], waiter) == 1 then
        redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', server_ms())
        local last = redis.call('ZRANGE', KEYS[5], -1, -1, 'WITHSCORES')
        if last[2] then
            redis.call('PEXPIREAT', KEYS[4], last[2])
        else
            redis.call('DEL', KEYS[4])
        end
    end
end

-- The plain wake-up the flag says is out was answered (its waiter asks now) or is gone (the
-- list was cleared): the next release wakes a waiter again.
local function wake_up_answered()
    local waiting = redis.call('GET', KEYS[4])
    if waiting and waiting ~= '1' then
        redis.call('SET', KEYS[4], 1, 'KEEPTTL')
    end
end

if ARGV[4] == '1' then
    wake_up_answered()
end

if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
    -- A wake-up still on the list is stale now that the lock is held (a hand-over there
    -- expired with its lock): the next release pushes a fresh one for whoever waits.
    if redis.call('DEL', KEYS[3]) == 1 then
        wake_up_answered()
    end
    granted()
    return next_fencing_token(KEYS[2], ARGV[2])
end

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
    -- The caller's own grant, asked for again (a reply lost on the way and the call resent),
    -- or a hand-over its waiter confirms.
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
    granted()
    local token = redis.call('GET', KEYS[2])
    if token then
        return tonumber(token)
    end
    return next_fencing_token(KEYS[2], ARGV[2])
end

-- A hand-over nobody took (its waiter gave up, or is between two waits) goes to this caller.
local handover = redis.call('LINDEX', KEYS[3], 0)
if handover then
    local token, identifier = string.match(handover, '^(%d+):%d+:(.+)$')
    if identifier and identifier == holder then
        redis.call('DEL', KEYS[3])
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
        granted()
        return tonumber(token)
    end
end

local remaining = redis.call('PTTL', KEYS[1])
local block = tonumber(ARGV[3])
if block > 0 then
    -- A refused caller blocks at most until the holder's TTL ends (or its own wait does); the
    -- flag outlives that by a second, for the reply's and the next request's way.
    if remaining > 0 and remaining < block then
        block = remaining
    end
    block = block + 1000
    local raised = redis.call('PTTL', KEYS[4])
    if raised == -2 then
        redis.call('SET', KEYS[4], 1, 'PX', block)
    elseif raised < block then
        -- Longer, and as it was: a wake-up that is out stays out until its waiter asks.
        redis.call('PEXPIRE', KEYS[4], block)
    end
    -- In the line until the flag it raised would end (a waiter that died or gave up drops
    -- out then); the line lives as long as its last waiter.
    local now = server_ms()
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
    redis.call('ZADD', KEYS[5], now + block, waiter)
    if redis.call('PTTL', KEYS[5]) < block then
        redis.call('PEXPIRE', KEYS[5], block)
    end
end
if remaining < 0 then
    return 0
end
return -remaining

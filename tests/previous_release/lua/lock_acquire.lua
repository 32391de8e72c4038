-- Take a lock if it is free, or claim a hand-over no waiter took, and hand out its next
-- fencing token. A caller that is refused and will wait raises the "someone waits" flag, so
-- that releases hand the lock over or wake a waiter (lock_release.lua) instead of just
-- deleting it.
-- KEYS[1]  owner key (STRING: the holder's identifier, with a TTL)
-- KEYS[2]  fence key (STRING counter: the last fencing token granted for this name)
-- KEYS[3]  signal key (LIST: at most one wake-up, a hand-over "<token>:<ttl ms>:<identifier>"
--          or a plain 1)
-- KEYS[4]  waiting key (STRING flag with a TTL: someone may be blocked on the signal list;
--          its value: until when, in server ms, a plain wake-up is out whose waiter has not
--          asked yet, see lock_release.lua; 1: none is)
-- ARGV[1]  identifier of the caller
-- ARGV[2]  lock TTL in milliseconds
-- ARGV[3]  how long the caller may block for a wake-up if refused, ms (0: it will not wait)
-- ARGV[4]  1 when the caller asks because a plain wake-up woke it, else 0
-- Returns  the fencing token (> 0) when the lock was taken;
--          otherwise minus the holder's remaining TTL in milliseconds (<= 0; 0 when it has none).

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
    return redis.call('INCR', KEYS[2])
end

-- A hand-over nobody took (its waiter gave up, or is between two waits) goes to this caller.
local handover = redis.call('LINDEX', KEYS[3], 0)
if handover then
    local token, identifier = string.match(handover, '^(%d+):%d+:(.+)$')
    if identifier and identifier == redis.call('GET', KEYS[1]) then
        redis.call('DEL', KEYS[3])
        redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
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
end
if remaining < 0 then
    return 0
end
return -remaining

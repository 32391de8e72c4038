-- Take a semaphore permit, by the Redis server's clock, in one step.
-- KEYS[1]  holders ZSET (identifier -> lease expiry, ms of server time)
-- KEYS[2]  waiters ZSET (identifier -> ticket: the order callers started waiting in)
-- KEYS[3]  waiter leases ZSET (identifier -> expiry of the waiter's place in line, ms)
-- KEYS[4]  ticket counter STRING
-- KEYS[5]  signal LIST (wake-up tokens for blocked waiters)
-- ARGV[1]  identifier   ARGV[2] limit   ARGV[3] permit lease, ms
-- ARGV[4]  fair: 1 = first come, first served among waiters; 0 = whoever asks when a permit is free
-- ARGV[5]  queue: 1 = take (or keep) a place in line when no permit is free; 0 = do not wait
-- ARGV[6]  waiter lease, ms (a waiter that stops asking loses its place after this)
-- ARGV[7]  woken: 1 when the caller consumed a wake-up token before this call
-- ARGV[8]  in line: 1 when an earlier call of this acquire may have put the caller in line
-- Returns  1 when the permit is granted (or the caller held it already: a resent call);
--          {0, ms, ticket} when not, ms = time until the earliest holder's lease ends (-1: none),
--          ticket = the caller's place in line (-1: not in line).
-- Every key written keeps a TTL past the last lease written to it (_idle.lua).

--! include _idle
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local identifier, limit = ARGV[1], tonumber(ARGV[2])
local fair, queue = ARGV[4] == '1', ARGV[5] == '1'

-- A call resent with the caller's identifier (its reply was lost) answers the permit the
-- caller already holds, with a fresh lease, instead of queueing the caller behind itself.
local held = redis.call('ZSCORE', KEYS[1], identifier)
if held and tonumber(held) > now then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), identifier)
    keep_for_at_least(KEYS[1], tonumber(ARGV[3]) + IDLE_MS)
    return 1
end

local in_line = ARGV[8] == '1'
local waiting = redis.call('ZCARD', KEYS[2])
if waiting > 0 then
    -- Waiters that stopped asking lose their place, a bounded number per call.
    local gone = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 100)
    if #gone > 0 then
        redis.call('ZREM', KEYS[2], unpack(gone))
        redis.call('ZREM', KEYS[3], unpack(gone))
        waiting = redis.call('ZCARD', KEYS[2])
    end
end

local ahead = 0
if fair and waiting > 0 then
    local rank = in_line and redis.call('ZRANK', KEYS[2], identifier)
    ahead = rank or waiting
end
-- Ended leases count until the set looks full: only then are they dropped and the holders
-- counted again (a free permit is found without the purge; a refusal never counts one).
local free = limit - redis.call('ZCARD', KEYS[1])
if free <= ahead then
    redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
    free = limit - redis.call('ZCARD', KEYS[1])
end

if free > ahead then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), identifier)
    keep_for_at_least(KEYS[1], tonumber(ARGV[3]) + IDLE_MS)
    if in_line then
        redis.call('ZREM', KEYS[2], identifier)
        redis.call('ZREM', KEYS[3], identifier)
    end
    return 1
end

-- Waiters of both kinds are counted, so that releases wake only when someone waits;
-- only a fair semaphore makes them take turns.
local ticket = -1
if queue then
    ticket = tonumber(redis.call('ZSCORE', KEYS[2], identifier))
    if not ticket then
        ticket = redis.call('INCR', KEYS[4])
        redis.call('ZADD', KEYS[2], ticket, identifier)
    end
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[6]), identifier)
    -- The line, its leases and its ticket counter expire together, once nobody asks.
    for index = 2, 4 do
        keep_for_at_least(KEYS[index], tonumber(ARGV[6]) + IDLE_MS)
    end
end
-- A wake-up token this caller took was meant for a waiter ahead of it: pass it on.
if ARGV[7] == '1' and free > 0 and redis.call('ZCARD', KEYS[2]) > 1 then
    redis.call('RPUSH', KEYS[5], 1)
    redis.call('PEXPIRE', KEYS[5], ARGV[6])
end

local earliest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
if #earliest == 0 then
    return {0, -1, ticket}
end
return {0, tonumber(earliest[2]) - now, ticket}
